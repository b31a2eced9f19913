"""Benchmarks that print the figures the README quotes."""
