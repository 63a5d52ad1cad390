"""refresh."""
