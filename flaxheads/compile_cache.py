"""jax's persistent compilation cache, on by default for the command line.

A compiled train or eval step is written to a folder under the user's cache
(`$XDG_CACHE_HOME/flaxheads/jax`, else `~/.cache/flaxheads/jax`), so the second run of the same
command (same model, shapes, devices and jax version) loads its executables instead of compiling
them again. The environment variable `FLAXHEADS_COMPILATION_CACHE` chooses: unset, the default
folder; a path, that folder; "off" (or "0", "false", "no", "none"), no persistent cache. The CLI
flag `flaxheads --compilation_cache ...` takes the same values and wins over the variable.
`FLAXHEADS_COMPILATION_CACHE_MAX_BYTES` sets the size beyond which the least recently used
entries are deleted (default `MAX_BYTES`; -1: no limit). jax re-reads the whole folder on every
write to enforce it, so a folder of many small entries (a test suite's) is faster without one.

Multi-process runs share the folder safely: jax writes entries from process 0 only and every
process reads them (a process that misses compiles for itself).

`forward_jit` and `train_jit` compile evaluation/prediction programs and train steps with the XLA:CPU
options measured faster for each (`CPU_OPTIONS`); on other backends they are `jax.jit`. The pmap
training path (`--parallel pmap`) keeps XLA's compiler defaults.

Every one of those programs (`precise`, the pmap step's too) computes float32 matrix products in
float32 on GPUs and TPUs, as PyTorch does by default, so float32 logits match transformers' there
as on a CPU. XLA's own default is lower: TF32 tensor cores on GPUs, one bfloat16 pass on TPUs
(measured on an H100: 456 TFLOP/s for a float32 8192^3 product, 6.8x the data sheet's float32
peak). `FLAXHEADS_MATMUL_PRECISION` chooses another of jax's `default_matmul_precision` values
("tensorfloat32" for TF32, "default" for XLA's choice); half-precision products are the same
either way. On CPUs XLA computes float32 products in float32 whatever the setting, and the
programs are left untouched.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

# jax is imported by the functions that use it: `flaxheads --help` shows ENV_VAR and
# default_directory() without it.

ENV_VAR = "FLAXHEADS_COMPILATION_CACHE"
PRECISION_ENV_VAR = "FLAXHEADS_MATMUL_PRECISION"
PRECISIONS = ("highest", "float32", "high", "tensorfloat32", "bfloat16", "default")
"""`FLAXHEADS_MATMUL_PRECISION`'s values: jax's names for `jax.default_matmul_precision`."""
MAX_BYTES_ENV_VAR = "FLAXHEADS_COMPILATION_CACHE_MAX_BYTES"
OFF = ("off", "0", "false", "no", "none")
MAX_BYTES = 4 * 1024**3
"""Least recently used entries are deleted beyond this size (a MiniLM step is ~10 MB on CPU)."""


def default_directory() -> Path:
    """`$XDG_CACHE_HOME/flaxheads/jax`, or `~/.cache/flaxheads/jax` without XDG_CACHE_HOME."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "flaxheads" / "jax"


def cache_directory(setting: str | None = None) -> Path | None:
    """The folder `setting` names (default: the environment variable's value): None when it says
    off, the default folder when it is unset or empty, else the path it holds."""
    if setting is None:
        setting = os.environ.get(ENV_VAR, "")
    setting = setting.strip()
    if setting.lower() in OFF:
        return None
    return Path(setting).expanduser() if setting else default_directory()


def max_bytes() -> int:
    """The cache's size limit in bytes: the environment variable `MAX_BYTES_ENV_VAR`, else
    `MAX_BYTES`; -1 means none. ValueError for a value that is not an integer >= -1."""
    setting = os.environ.get(MAX_BYTES_ENV_VAR, "").strip()
    if not setting:
        return MAX_BYTES
    try:
        value = int(setting)
    except ValueError:
        value = -2
    if value < -1:
        raise ValueError(f"{MAX_BYTES_ENV_VAR}={setting!r}: give a size in bytes, or -1 for no limit")
    return value


_YNN_FUSIONS = "xla_cpu_experimental_ynn_fusion_type"
CPU_OPTIONS = {
    ("forward", "float32"): {_YNN_FUSIONS: ""},
    ("train", "float32"): {_YNN_FUSIONS: "LIBRARY_FUSION_TYPE_REDUCE"},
    ("forward", "bfloat16"): {_YNN_FUSIONS: "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"},
    ("train", "bfloat16"): {_YNN_FUSIONS: "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE"},
}
"""XLA:CPU options per kind of program and compute dtype (`compute_dtype`). jax 0.10's XLA:CPU
hands a layer's matmuls, with their element-wise neighbours and reductions, to YNNPACK (its
default is YNNPACK matmuls and reductions). On this project's 2-core AVX-512 CPU, MiniLM shapes,
same process, alternating (2026-11-26), float32:
- "forward" (evaluation, prediction): no YNNPACK fusions. The forward pass on 64 packed rows of
  80 tokens took 0.51-0.69 s against 0.60-0.85 s by default, three runs (YNNPACK reductions
  alone: 0.69 s where the default took 0.74 s).
- "train" (the train step): YNNPACK reductions, XLA's own matmuls: 446-477 ms a step against
  464-493 ms by default, three runs of 24-56 steps each (no YNNPACK at all: 504-538 ms); a
  BERT-base-sized step (8 x 128) 3.41 s against 3.52 s; DeBERTa-v3 and Llama (MiniLM size,
  16 x 128) 11-17% faster to train, DeBERTa-v3 27-30% faster to evaluate, Llama level.
A bfloat16 model's programs hand their matmuls to YNNPACK as well: its bfloat16 x bfloat16 ->
float32 kernels (`layers.dot_general`) run at 2.9x XLA's float32 matmul rate on this CPU's
AVX512-BF16, where float32 programs are slower with YNNPACK matmuls (MiniLM, 32 x 80, same
process, 2026-11-27: train 1613 against 1547 ms, eval 416 against 354 ms).
Values are float32-rounding equal either way. A `--xla_cpu_experimental_ynn_fusion_type` in
XLA_FLAGS wins: these are then not applied."""


@functools.cache
def compiler_options(kind: str, compute: str = "float32") -> dict[str, str] | None:
    """`CPU_OPTIONS[kind, compute]` where the default backend is the CPU, XLA_FLAGS does not set
    them and this XLA knows them; else None (XLA's defaults)."""
    import jax

    options = CPU_OPTIONS[kind, compute]
    if jax.default_backend() != "cpu" or _YNN_FUSIONS in os.environ.get("XLA_FLAGS", ""):
        return None
    try:
        jax.jit(lambda x: x + 1).lower(1.0).compile(compiler_options=options)
    except Exception:  # an XLA without these options: nothing to change  # noqa: BLE001
        return None
    return options


def _backend() -> str:
    """The platform programs run on; tests replace it."""
    import jax

    return jax.default_backend()


def matmul_precision() -> str | None:
    """The precision `precise` traces under: `FLAXHEADS_MATMUL_PRECISION` (default "highest"), or
    None on a CPU (nothing to change). ValueError naming the choices for another value."""
    if _backend() == "cpu":
        return None
    setting = os.environ.get(PRECISION_ENV_VAR, "").strip().lower() or "highest"
    if setting not in PRECISIONS:
        raise ValueError(f"{PRECISION_ENV_VAR}={setting!r} is not one of {PRECISIONS}")
    return None if setting == "default" else setting


def precise(fun):
    """`fun` traced under `matmul_precision()` (decided now, when the program is built): its
    float32 products, and their gradients, in float32 on GPUs and TPUs."""
    import jax

    precision = matmul_precision()
    if precision is None:
        return fun

    @functools.wraps(fun)
    def traced(*args, **kwargs):
        with jax.default_matmul_precision(precision):
            return fun(*args, **kwargs)

    return traced


def compute_dtype(graphdef) -> str:
    """"bfloat16" when a layer of the model `graphdef` describes (`nnx.split`'s first half)
    computes in bfloat16, else "float32": which `CPU_OPTIONS` its programs compile with."""
    import jax.numpy as jnp

    for name, attribute in getattr(graphdef, "attributes", ()):
        value = getattr(attribute, "value", None)
        if name == "dtype" and value is not None and jnp.dtype(value) == jnp.bfloat16:
            return "bfloat16"
    return "float32"


def forward_jit(fun, *, graphdef=None, **jit_kwargs):
    """`jax.jit(fun, **jit_kwargs)` for a forward-only program of the model `graphdef` describes
    (`compiler_options("forward", compute_dtype(graphdef))`; float32's without one)."""
    import jax

    return jax.jit(precise(fun), compiler_options=compiler_options("forward", _compute(graphdef)), **jit_kwargs)


def train_jit(fun, *, graphdef=None, **jit_kwargs):
    """`jax.jit(fun, **jit_kwargs)` for a train step of the model `graphdef` describes
    (`compiler_options("train", compute_dtype(graphdef))`; float32's without one)."""
    import jax

    return jax.jit(precise(fun), compiler_options=compiler_options("train", _compute(graphdef)), **jit_kwargs)


def _compute(graphdef) -> str:
    return "float32" if graphdef is None else compute_dtype(graphdef)


def enable(setting: str | None = None) -> Path | None:
    """Turns jax's persistent compilation cache on in the folder `cache_directory(setting)` names
    (or leaves it off); returns that folder. Every compiled program is cached, however quick its
    compilation, so that a repeated run compiles nothing. Call it before the first compilation."""
    directory = cache_directory(setting)
    if directory is None:
        return None
    import jax

    directory.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    jax.config.update("jax_compilation_cache_max_size", max_bytes())
    return directory


class CompileTimer:
    """Sums what jax reports of compilation while it is installed (`start()` .. `stop()`):
    `compile_seconds` in XLA's backend compilations (a persistent-cache hit counts only its load),
    `trace_seconds` tracing and lowering to MLIR (a cache hit still does both), `compilations`
    backend compilations or cache loads, `cache_hits` of those loaded from the cache."""

    _TRACE = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration")
    _COMPILE = "/jax/core/compile/backend_compile_duration"

    def __init__(self):
        self.compile_seconds, self.trace_seconds, self.compilations, self.cache_hits = 0.0, 0.0, 0, 0
        self._active = False

    def start(self) -> CompileTimer:
        import jax

        self._active = True
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        jax.monitoring.register_event_listener(self._on_event)
        return self

    def stop(self) -> None:
        self._active = False  # jax has no public way to unregister; an inactive listener ignores events

    def _on_duration(self, event: str, seconds: float, **_) -> None:
        if not self._active:
            return
        if event == self._COMPILE:
            self.compile_seconds += seconds
            self.compilations += 1
        elif event in self._TRACE:
            self.trace_seconds += seconds

    def _on_event(self, event: str, **_) -> None:
        if self._active and event == "/jax/compilation_cache/cache_hits":
            self.cache_hits += 1

    def as_dict(self) -> dict[str, float | int]:
        return {"compile_s": round(self.compile_seconds, 2), "trace_lower_s": round(self.trace_seconds, 2),
                "compilations": self.compilations, "cache_hits": self.cache_hits}
