"""Statistics of a head study, numpy only: per cell the mean, standard deviation and a 95%
bootstrap confidence interval over seeds; per head the paired difference from the default head
(same data set, mode and seeds) with its bootstrap interval, and a plain verdict.

The bootstrap is the percentile method with a fixed seed, so the same numbers give the same
intervals on every machine. With 5 seeds an interval is rough; it says how far the seeds alone
move a result, which is what "within noise" means here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

BOOTSTRAP_SEED = 0
BOOTSTRAP_SAMPLES = 10_000
CONFIDENCE = 0.95

WITHIN_NOISE = "within noise"
BETTER = "better"
WORSE = "worse"


@dataclasses.dataclass(frozen=True)
class Summary:
    """Mean, sample standard deviation (ddof=1; 0 for one value) and 95% bootstrap CI of `n` values."""

    n: int
    mean: float
    std: float
    low: float
    high: float


def bootstrap_ci(values: Sequence[float], *, samples: int = BOOTSTRAP_SAMPLES, confidence: float = CONFIDENCE,
                 seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values`: resample with replacement `samples`
    times (generator seeded with `seed`), take the (1-confidence)/2 and (1+confidence)/2
    quantiles of the resampled means. One value gives (value, value)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(samples, values.size))].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


def summarize(values: Sequence[float]) -> Summary:
    """Summary of `values` (at least one)."""
    values = np.asarray(values, dtype=np.float64)
    low, high = bootstrap_ci(values)
    std = float(values.std(ddof=1)) if values.size > 1 else 0.0
    return Summary(int(values.size), float(values.mean()), std, low, high)


@dataclasses.dataclass(frozen=True)
class Comparison:
    """A head against the default head on the seeds both have: mean of the paired differences
    (head minus default, in the metric's units), its bootstrap CI and the verdict."""

    n: int
    difference: float
    low: float
    high: float
    verdict: str
    """"better" / "worse" when the interval excludes 0 (in the direction where the metric
    improves), else "within noise"."""


def paired_comparison(values: dict[int, float], default: dict[int, float], *,
                      higher_is_better: bool = True) -> Comparison | None:
    """Compares {seed: metric} of a head with that of the default head on their common seeds;
    None when they share no seed."""
    seeds = sorted(set(values) & set(default))
    if not seeds:
        return None
    differences = np.array([values[s] - default[s] for s in seeds], dtype=np.float64)
    low, high = bootstrap_ci(differences)
    return Comparison(len(seeds), float(differences.mean()), low, high, verdict(low, high, higher_is_better))


def verdict(low: float, high: float, higher_is_better: bool = True) -> str:
    """"within noise" when [low, high] contains 0, else "better" or "worse"."""
    if low <= 0.0 <= high:
        return WITHIN_NOISE
    above = low > 0.0
    return BETTER if above == higher_is_better else WORSE
