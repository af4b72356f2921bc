"""Benchmarks behind `scripts/bench.py` and `flaxheads bench`. Never run by the tests."""
