"""Console themes as TOML data files; loaded by ratedeck.console.themes."""
