#!/usr/bin/env python
"""The benchmarks; the same program as `flaxheads bench` (see flaxheads/benchmarks/cli.py)."""

import sys

from flaxheads.benchmarks.cli import main

if __name__ == "__main__":
    sys.exit(main())
