"""ratedeck bench."""
