"""ratedeck console."""
