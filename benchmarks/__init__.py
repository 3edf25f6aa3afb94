"""Benchmarks that print figures; each writes its result to benchmarks/results/."""
