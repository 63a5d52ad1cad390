"""Standalone benchmarks: `python -m benchmarks.<name>`; each compares against an anchor in the same run."""
