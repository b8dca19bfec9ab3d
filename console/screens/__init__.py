"""ratedeck console/screens."""
