"""The flaxheads version (one place; `flaxheads.__version__` re-exports it)."""

__version__ = "0.1.0"
