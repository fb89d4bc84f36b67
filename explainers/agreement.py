"""Agreement between raters: Cohen's kappa (unweighted, linearly or quadratically weighted), Fleiss' kappa, and
percentile bootstrap intervals that resample the rated units (images), seeded.

    cohen_kappa(["yes", "no", "yes"], ["yes", "no", "no"])                 # two raters, categorical
    cohen_kappa([1, 4, 5, 2], [2, 4, 4, 2], weights="quadratic", categories=range(1, 6))   # Likert
    fleiss_kappa(counts)                                     # items x categories table of rater counts
    fleiss_kappa_from_labels([["a", "a", "b"], ["b", "b", "b"]])        # items x raters labels
    bootstrap_interval(lambda idx: my_statistic(idx), n_units=30, seed=0)  # (low, high) or (nan, nan)

Kappa is undefined when chance agreement is 1 (both raters always gave the same single category): the
functions return nan then, and the bootstrap drops resamples whose statistic is nan.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

__all__ = ["cohen_kappa", "fleiss_kappa", "fleiss_kappa_from_labels", "bootstrap_interval",
           "percent_agreement", "WEIGHTS"]

WEIGHTS = (None, "linear", "quadratic")


def _categories(a, b, categories) -> list:
    if categories is not None:
        found = list(categories)
        unknown = (set(a) | set(b)) - set(found)
        if unknown:
            raise ValueError(f"Ratings outside the categories given: {sorted(map(str, unknown))}")
        return found
    try:
        return sorted(set(a) | set(b))
    except TypeError:
        return sorted(set(a) | set(b), key=str)


def cohen_kappa(a: Sequence, b: Sequence, *, weights: str | None = None, categories=None) -> float:
    """Cohen's kappa of two raters' labels of the same units (paired by position).

    weights: None (every disagreement counts alike), "linear" (|i - j|) or "quadratic" ((i - j)^2), where i, j
    are positions in `categories` (default: the sorted labels seen; give the full scale, e.g. 1..5, for
    Likert ratings, so weights do not depend on which ratings happened to be used).
    kappa = 1 - sum(w * observed) / sum(w * expected); nan when the expected disagreement is 0."""
    a, b = list(a), list(b)
    if len(a) != len(b):
        raise ValueError(f"The two raters rated different numbers of units ({len(a)} and {len(b)}).")
    if weights not in WEIGHTS:
        raise ValueError(f"Unknown weights {weights!r}: use None, 'linear' or 'quadratic'.")
    if not a:
        return math.nan
    cats = _categories(a, b, categories)
    index = {c: i for i, c in enumerate(cats)}
    k = len(cats)
    observed = np.zeros((k, k))
    for x, y in zip(a, b):
        observed[index[x], index[y]] += 1
    observed /= observed.sum()
    expected = np.outer(observed.sum(axis=1), observed.sum(axis=0))
    i, j = np.meshgrid(np.arange(k), np.arange(k), indexing="ij")
    if weights is None:
        w = (i != j).astype(float)
    elif weights == "linear":
        w = np.abs(i - j).astype(float)
    else:
        w = ((i - j) ** 2).astype(float)
    disagreement_expected = float((w * expected).sum())
    if disagreement_expected <= 1e-15:
        return math.nan
    return 1.0 - float((w * observed).sum()) / disagreement_expected


def percent_agreement(a: Sequence, b: Sequence) -> float:
    """The fraction of units on which two raters gave the same label (nan for no units)."""
    a, b = list(a), list(b)
    if len(a) != len(b):
        raise ValueError(f"The two raters rated different numbers of units ({len(a)} and {len(b)}).")
    return sum(x == y for x, y in zip(a, b)) / len(a) if a else math.nan


def fleiss_kappa(counts) -> float:
    """Fleiss' kappa (1971) of an items x categories table: counts[i, j] = how many raters put item i in
    category j; every item must have the same number of raters (at least 2). nan when chance agreement is 1."""
    table = np.asarray(counts, dtype=float)
    if table.ndim != 2 or table.shape[0] == 0:
        raise ValueError("Fleiss' kappa needs an items x categories table with at least one item.")
    raters = table.sum(axis=1)
    if not np.allclose(raters, raters[0]):
        raise ValueError("Fleiss' kappa needs the same number of raters for every item.")
    n = raters[0]
    if n < 2:
        raise ValueError("Fleiss' kappa needs at least two raters per item.")
    p_category = table.sum(axis=0) / table.sum()
    p_item = ((table * table).sum(axis=1) - n) / (n * (n - 1))
    p_bar = float(p_item.mean())
    p_expected = float((p_category ** 2).sum())
    if p_expected >= 1 - 1e-15:
        return math.nan
    return (p_bar - p_expected) / (1 - p_expected)


def fleiss_kappa_from_labels(labels, categories=None) -> float:
    """Fleiss' kappa of an items x raters matrix of labels (each row: every rater's label of one item)."""
    rows = [list(r) for r in labels]
    if not rows:
        raise ValueError("Fleiss' kappa needs at least one item.")
    flat = [x for r in rows for x in r]
    cats = _categories(flat, [], categories)
    index = {c: i for i, c in enumerate(cats)}
    table = np.zeros((len(rows), len(cats)))
    for i, row in enumerate(rows):
        for label in row:
            table[i, index[label]] += 1
    return fleiss_kappa(table)


def bootstrap_interval(statistic: Callable[[np.ndarray], float], n_units: int, *, n_boot: int = 1000,
                       seed: int = 0, level: float = 0.95) -> tuple:
    """Percentile bootstrap interval of `statistic(indices)` over resamples (with replacement) of the unit
    indices 0..n_units-1, seeded: the same call gives the same interval. Resamples where the statistic is nan
    are dropped; (nan, nan) when fewer than half of them are usable or there are fewer than 2 units."""
    if n_units < 2:
        return (math.nan, math.nan)
    generator = np.random.default_rng(seed)
    values = []
    for _ in range(int(n_boot)):
        value = statistic(generator.integers(0, n_units, size=n_units))
        if value is not None and not math.isnan(value):
            values.append(float(value))
    if len(values) < n_boot / 2:
        return (math.nan, math.nan)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return (float(low), float(high))
