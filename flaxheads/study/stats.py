"""Statistics of a head study (numpy and scipy): per cell a mean with a t interval over seeds; per
head a paired comparison with the default head (same data set, mode and seeds) by an exact
sign-flip permutation test, Holm-corrected over all the comparisons of a study; a paired bootstrap
over seeds and test examples (so that the test set's own sampling noise counts); the Friedman
test over data-set x seed blocks with the Nemenyi critical difference of the average ranks.

Why these (issue 28): a percentile bootstrap over 5 seeds covers ~83%, not 95%; a t interval of
the mean of paired differences covers at the nominal rate for normal-ish seed noise (checked by
simulation in tests/test_study.py). The sign-flip test makes no normality assumption, but its
smallest two-sided p-value is 2 / 2**n: with n seeds and m comparisons nothing can pass Holm's
first step unless 2 / 2**n < alpha / m (n = 10 allows m <= 25, n = 12 allows m <= 102).

A verdict is "better" / "worse" only when the Holm-adjusted p-value is below ALPHA and, where
the records hold per-example test predictions, the paired bootstrap interval over seeds and test
examples excludes 0 too; otherwise "within noise". Every random draw is seeded: the same records
give the same numbers on every machine.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from scipy import stats as scipy_stats

ALPHA = 0.05
CONFIDENCE = 1.0 - ALPHA
BOOTSTRAP_SEED = 0
BOOTSTRAP_SAMPLES = 4_000
EXACT_SIGN_FLIPS_UP_TO = 16
"""Seeds up to which the sign-flip test enumerates all 2**n flips; above, a seeded Monte Carlo."""
MONTE_CARLO_FLIPS = 100_000

WITHIN_NOISE = "within noise"
BETTER = "better"
WORSE = "worse"


# -- one cell -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Summary:
    """Mean, sample standard deviation (ddof=1; 0 for one value) and 95% t interval of `n` values."""

    n: int
    mean: float
    std: float
    low: float
    high: float


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Student t interval of the mean of `values`: mean +- t_{n-1} * sd / sqrt(n). One value (or
    values all equal) gives (mean, mean). ValueError for none."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("t_interval needs at least one value")
    mean = float(values.mean())
    if values.size == 1:
        return mean, mean
    half = scipy_stats.t.ppf((1.0 + confidence) / 2.0, values.size - 1) * values.std(ddof=1) / np.sqrt(values.size)
    return mean - float(half), mean + float(half)


def summarize(values: Sequence[float]) -> Summary:
    """Summary of `values` (at least one)."""
    values = np.asarray(values, dtype=np.float64)
    low, high = t_interval(values)
    std = float(values.std(ddof=1)) if values.size > 1 else 0.0
    return Summary(int(values.size), float(values.mean()), std, low, high)


# -- paired tests -------------------------------------------------------------------------------


def sign_flip_p(differences: Sequence[float], *, exact_up_to: int = EXACT_SIGN_FLIPS_UP_TO,
                samples: int = MONTE_CARLO_FLIPS, seed: int = BOOTSTRAP_SEED) -> float:
    """Two-sided p-value of the paired sign-flip permutation test of mean(differences) = 0: the
    share of sign assignments whose |mean| is at least the observed one. Exact (all 2**n flips)
    for n <= `exact_up_to`, else (1 + hits) / (1 + samples) over seeded random flips."""
    d = np.asarray(differences, dtype=np.float64)
    if d.size == 0:
        raise ValueError("sign_flip_p needs at least one difference")
    observed = abs(d.mean())
    if d.size <= exact_up_to:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))
        flipped = np.abs(signs @ d) / d.size
        return float(np.mean(flipped >= observed - 1e-12 * max(1.0, observed)))
    signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(samples, d.size))
    hits = np.sum(np.abs(signs @ d) / d.size >= observed - 1e-12 * max(1.0, observed))
    return float((1 + hits) / (1 + samples))


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values, in the input's order: sorted ascending, the i-th
    (from 0) is max over j <= i of min(1, (m - j) * p_(j))."""
    p = np.asarray(p_values, dtype=np.float64)
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (p.size - np.arange(p.size)) * p[order])
    adjusted = np.empty_like(p)
    adjusted[order] = np.maximum.accumulate(scaled)
    return adjusted


# -- paired bootstrap over seeds and test examples ------------------------------------------------


def _accuracy(predictions_SM: np.ndarray, labels_M: np.ndarray, weights_BM: np.ndarray) -> np.ndarray:
    """(B, S) accuracy of each seed's predictions on each resample of the examples."""
    correct_SM = (predictions_SM == labels_M).astype(np.float64)
    return np.einsum("SM,BM->BS", correct_SM, weights_BM) / weights_BM.sum(axis=1, keepdims=True)


def _pearson(predictions_SM: np.ndarray, labels_M: np.ndarray, weights_BM: np.ndarray) -> np.ndarray:
    """(B, S) Pearson correlation of each seed's scores with the labels on each resample (the
    weighted formula: a resample's multiplicities are its weights)."""
    total_B1 = weights_BM.sum(axis=1, keepdims=True)
    mean_y_B1 = weights_BM @ labels_M[:, None] / total_B1
    mean_p_BS = weights_BM @ predictions_SM.T / total_B1
    cov_BS = weights_BM @ (predictions_SM * labels_M).T / total_B1 - mean_p_BS * mean_y_B1
    var_p_BS = weights_BM @ (predictions_SM ** 2).T / total_B1 - mean_p_BS ** 2
    var_y_B1 = weights_BM @ (labels_M ** 2)[:, None] / total_B1 - mean_y_B1 ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        return cov_BS / np.sqrt(np.maximum(var_p_BS, 0.0) * np.maximum(var_y_B1, 0.0))


EXAMPLE_METRICS: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]] = {
    "accuracy": _accuracy,
    "pearson": _pearson,
}
"""Metrics the seed x example bootstrap recomputes from per-example predictions: f(predictions
(seeds, examples), labels (examples,), resample weights (B, examples)) -> (B, seeds)."""


def paired_bootstrap_ci(predictions_a: np.ndarray, predictions_b: np.ndarray, labels: np.ndarray, metric: str, *,
                        samples: int = BOOTSTRAP_SAMPLES, confidence: float = CONFIDENCE,
                        seed: int = BOOTSTRAP_SEED) -> tuple[float, float] | None:
    """Percentile interval of mean over seeds of metric(a) - metric(b), resampling seeds and test
    examples with replacement (the same examples for both: paired). `predictions_*`: (seeds,
    examples), row s of both from seed s; None for a metric EXAMPLE_METRICS lacks."""
    if metric not in EXAMPLE_METRICS:
        return None
    a, b = np.asarray(predictions_a, np.float64), np.asarray(predictions_b, np.float64)
    labels = np.asarray(labels, np.float64)
    if a.shape != b.shape or a.shape[1] != labels.size:
        raise ValueError(f"predictions {a.shape} and {b.shape} must both be (seeds, {labels.size} examples)")
    rng = np.random.default_rng(seed)
    example_weights_BM = rng.multinomial(labels.size, np.full(labels.size, 1.0 / labels.size), size=samples)
    seed_weights_BS = rng.multinomial(a.shape[0], np.full(a.shape[0], 1.0 / a.shape[0]), size=samples)
    compute = EXAMPLE_METRICS[metric]
    differences_BS = compute(a, labels, example_weights_BM) - compute(b, labels, example_weights_BM)
    means_B = np.nansum(differences_BS * seed_weights_BS, axis=1) / a.shape[0]
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means_B, [tail, 1.0 - tail])
    return float(low), float(high)


# -- one head against the default ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Comparison:
    """A head against the default head on the seeds both have: mean of the paired differences
    (head minus default, in the metric's units), its t interval, the sign-flip p-value and, once
    `with_holm` has run over the study's comparisons, the Holm-adjusted p-value and the verdict."""

    n: int
    difference: float
    low: float
    high: float
    p: float
    p_holm: float | None = None
    """The Holm-adjusted p-value within its family of comparisons; None until adjusted."""
    example_low: float | None = None
    """Paired bootstrap interval over seeds and test examples; None without per-example predictions."""
    example_high: float | None = None
    higher_is_better: bool = True

    @property
    def verdict(self) -> str:
        """"better" / "worse" when the Holm-adjusted p < ALPHA (and the seed x example interval,
        where there is one, excludes 0) in the direction where the metric improves; else "within
        noise". Unadjusted comparisons use their raw p (a single comparison is its own family)."""
        p = self.p if self.p_holm is None else self.p_holm
        spans_zero = self.example_low is not None and self.example_low <= 0.0 <= self.example_high
        if p >= ALPHA or spans_zero or self.difference == 0.0:
            return WITHIN_NOISE
        return BETTER if (self.difference > 0) == self.higher_is_better else WORSE


def paired_comparison(values: Mapping[int, float], default: Mapping[int, float], *, higher_is_better: bool = True,
                      examples: tuple[np.ndarray, np.ndarray, np.ndarray, str] | None = None) -> Comparison | None:
    """Compares {seed: metric} of a head with that of the default head on their common seeds;
    None when they share no seed. `examples`: (head's predictions, default's predictions (seeds,
    examples) on the common seeds in sorted order, labels, metric) for the seed x example bootstrap."""
    seeds = sorted(set(values) & set(default))
    if not seeds:
        return None
    differences = np.array([values[s] - default[s] for s in seeds], dtype=np.float64)
    low, high = t_interval(differences)
    interval = paired_bootstrap_ci(*examples) if examples is not None else None
    return Comparison(len(seeds), float(differences.mean()), low, high, sign_flip_p(differences),
                      example_low=interval[0] if interval else None, example_high=interval[1] if interval else None,
                      higher_is_better=higher_is_better)


def with_holm(comparisons: Mapping[object, Comparison]) -> dict[object, Comparison]:
    """The same comparisons with their Holm-adjusted p-values, the family being all of them."""
    keys = list(comparisons)
    adjusted = holm([comparisons[key].p for key in keys]) if keys else []
    return {key: dataclasses.replace(comparisons[key], p_holm=float(p)) for key, p in zip(keys, adjusted)}


# -- ranks over data sets ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RankAnalysis:
    """Friedman test over blocks (rows: data set x seed) of k heads, and the Nemenyi critical
    difference: two heads whose average ranks differ by more than `critical_difference` differ
    at level ALPHA (all pairs at once)."""

    heads: tuple[str, ...]
    average_ranks: tuple[float, ...]
    """Rank 1 is the best head of a block (ties share their average rank)."""
    blocks: int
    statistic: float
    p: float
    critical_difference: float


def nemenyi_critical_difference(k: int, blocks: int, alpha: float = ALPHA) -> float:
    """q_alpha * sqrt(k (k + 1) / (6 N)), q_alpha the studentized range quantile (infinite degrees
    of freedom) over sqrt(2) (Demsar 2006)."""
    q_alpha = scipy_stats.studentized_range.ppf(1.0 - alpha, k, np.inf) / np.sqrt(2.0)
    return float(q_alpha * np.sqrt(k * (k + 1) / (6.0 * blocks)))


def rank_analysis(heads: Sequence[str], scores_NK: np.ndarray) -> RankAnalysis | None:
    """Friedman / Nemenyi of `scores_NK` (blocks x heads, larger is better; flip the sign of a
    lower-is-better metric first). None for fewer than 3 heads or 2 blocks (Friedman's minimum)."""
    scores_NK = np.asarray(scores_NK, dtype=np.float64)
    blocks, k = scores_NK.shape
    if k < 3 or blocks < 2:
        return None
    ranks_NK = scipy_stats.rankdata(-scores_NK, axis=1)
    statistic, p = scipy_stats.friedmanchisquare(*scores_NK.T)
    return RankAnalysis(tuple(heads), tuple(float(r) for r in ranks_NK.mean(axis=0)), blocks, float(statistic),
                        float(p), nemenyi_critical_difference(k, blocks))
