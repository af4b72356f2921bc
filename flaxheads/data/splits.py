"""Deterministic train / validation / test splits of a single labelled data set."""

from __future__ import annotations

import datasets
import numpy as np


def split_dataset(
    dataset: datasets.Dataset,
    *,
    seed: int,
    validation_fraction: float = 0.1,
    test_fraction: float = 0.1,
) -> datasets.DatasetDict:
    """Splits `dataset` into disjoint `train`, `validation` and `test` splits.

    The split is a function of `(len(dataset), seed, fractions)` only: the same seed gives the
    same rows in the same splits, in the same order, on every machine; a different seed a
    different split. The validation and test sizes are `round(n * fraction)`; train takes the
    rest. Within each split the rows come in the seeded random order, not the source file's: a
    file sorted by label (movie_snippets is sorted by sentiment) would otherwise make
    `split.select(range(800))` nearly one class.

    Raises ValueError if the fractions leave no training rows.
    """
    if validation_fraction < 0 or test_fraction < 0 or validation_fraction + test_fraction >= 1:
        raise ValueError(
            f"validation_fraction={validation_fraction} and test_fraction={test_fraction} must be "
            "non-negative and sum to less than 1"
        )
    num_rows = len(dataset)
    order = np.random.default_rng(seed).permutation(num_rows)
    num_test = round(num_rows * test_fraction)
    num_validation = round(num_rows * validation_fraction)
    parts = {
        "train": order[num_test + num_validation :],
        "validation": order[num_test : num_test + num_validation],
        "test": order[:num_test],
    }
    if len(parts["train"]) == 0:
        raise ValueError(f"a data set of {num_rows} rows leaves no rows for training")
    return datasets.DatasetDict(
        {name: dataset.select(rows) for name, rows in parts.items()}
    )
