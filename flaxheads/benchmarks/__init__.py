"""Benchmarks behind `flaxheads bench` and `scripts/bench.py`. Tests check their plumbing, never their timings."""
