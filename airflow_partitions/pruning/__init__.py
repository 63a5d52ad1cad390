"""pruning."""
