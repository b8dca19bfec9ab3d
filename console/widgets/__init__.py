"""ratedeck console/widgets."""
