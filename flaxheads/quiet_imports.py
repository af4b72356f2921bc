"""Third-party packages imported without the optional packages they load for features flaxheads
does not use. Where torch or IPython is installed, transformers' tokenizer classes import torch
(for tensor types and dtypes), tensorboardX's writer imports torch (to accept torch tensors) and
flax imports IPython (to ask whether a notebook runs it): 1.3-2.5 s (torch) and 0.5 s (IPython)
of every `flaxheads train` start, measured 2026-11-27. Each of those packages takes an
ImportError as "not installed", and `sys.modules[name] = None` is how Python spells that."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

_torch_free_transformers = False


@contextlib.contextmanager
def hidden(*names: str) -> Iterator[None]:
    """`import name` raises ImportError inside the block for each of `names` not imported yet
    (one already imported stays as it is); afterwards they import as usual."""
    added = [name for name in names if name not in sys.modules]
    for name in added:
        sys.modules[name] = None
    try:
        yield
    finally:
        for name in added:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def flax() -> None:
    """Imports flax.nnx without IPython when IPython is not imported yet: flax asks
    `IPython.get_ipython()` whether it runs in a notebook, and without an IPython module loaded
    no IPython shell runs this process, so the answer (no) is the same."""
    with hidden("IPython"):
        import flax.nnx  # noqa: F401


def use_torch_free_transformers() -> None:
    """From now on this process imports transformers' tokenizers without torch (`transformers`).
    transformers then takes torch for not installed for the rest of the process (it remembers),
    so this is for a process that never runs a transformers PyTorch model: the `flaxheads`
    command's own process (`cli.main`), not a caller's."""
    global _torch_free_transformers
    _torch_free_transformers = True


def transformers():
    """The transformers package with `AutoTokenizer` imported: without torch after
    `use_torch_free_transformers`, unless torch is imported already or transformers has looked
    for it before (then as usual: a module that looked would import it)."""
    if _torch_free_transformers and "torch" not in sys.modules and not _transformers_looked_for_torch():
        with hidden("torch"), _no_advisory_warnings():  # not "PyTorch was not found. Models won't be available"
            import transformers

            transformers.AutoTokenizer  # noqa: B018 (the lazy import of the tokenizer classes)
    import transformers

    return transformers


@contextlib.contextmanager
def _no_advisory_warnings() -> Iterator[None]:
    name = "TRANSFORMERS_NO_ADVISORY_WARNINGS"  # transformers' `logger.warning_advice` reads it when called
    before = os.environ.get(name)
    os.environ[name] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def _transformers_looked_for_torch() -> bool:
    if "transformers" not in sys.modules:
        return False
    from transformers.utils import import_utils

    cache_info = getattr(import_utils.is_torch_available, "cache_info", None)  # an lru_cache
    return cache_info is None or cache_info().currsize > 0


__all__ = ["flax", "hidden", "transformers", "use_torch_free_transformers"]
