"""ratedeck server."""
