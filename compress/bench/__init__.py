"""Benchmarks that run the `compress` CLI from outside, as a user would (see each module's docstring)."""
