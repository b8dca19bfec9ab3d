"""ratedeck engine."""
