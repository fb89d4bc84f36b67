"""Agreement statistics against textbook answers and scikit-learn."""
import math

import numpy as np
import pytest

from explainers.agreement import (bootstrap_interval, cohen_kappa, fleiss_kappa, fleiss_kappa_from_labels,
                                  percent_agreement)

# Wikipedia's worked example of Fleiss' kappa: 10 subjects, 14 raters each, 5 categories.
# P-bar = 0.378, P-bar_e = 0.213, kappa = 0.210.
FLEISS_TABLE = [
    [0, 0, 0, 0, 14],
    [0, 2, 6, 4, 2],
    [0, 0, 3, 5, 6],
    [0, 3, 9, 2, 0],
    [2, 2, 8, 1, 1],
    [7, 7, 0, 0, 0],
    [3, 2, 6, 3, 0],
    [2, 5, 3, 2, 2],
    [6, 5, 2, 1, 0],
    [0, 2, 2, 3, 7],
]


def test_fleiss_textbook_example():
    assert fleiss_kappa(FLEISS_TABLE) == pytest.approx(0.2099, abs=5e-4)


def test_fleiss_from_labels_matches_the_table_and_perfect_agreement_is_one():
    labels = [[c for c, n in enumerate(row) for _ in range(n)] for row in FLEISS_TABLE]
    assert fleiss_kappa_from_labels(labels, categories=range(5)) == pytest.approx(fleiss_kappa(FLEISS_TABLE))
    assert fleiss_kappa_from_labels([["a", "a"], ["b", "b"], ["a", "a"]]) == pytest.approx(1.0)
    assert math.isnan(fleiss_kappa_from_labels([["a", "a"], ["a", "a"]]))  # chance agreement is 1


def test_fleiss_refuses_unequal_raters():
    with pytest.raises(ValueError, match="same number of raters"):
        fleiss_kappa([[1, 1], [2, 1]])


def test_cohen_by_hand():
    # 50 units: both yes 20, A yes / B no 5, A no / B yes 10, both no 15.
    # p_o = 35/50 = 0.7; p_e = 0.5 * 0.6 + 0.5 * 0.4 = 0.5; kappa = (0.7 - 0.5) / 0.5 = 0.4
    a = ["yes"] * 25 + ["no"] * 25
    b = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15
    assert cohen_kappa(a, b) == pytest.approx(0.4)
    assert percent_agreement(a, b) == pytest.approx(0.7)


def test_weighted_cohen_by_hand():
    # two units on a 1..3 scale: (1, 2) and (3, 3). Observed: half the mass at distance 1 -> 0.5 (both weights).
    # Marginals A = (1/2, 0, 1/2), B = (0, 1/2, 1/2): expected cells (1,2), (1,3), (3,2), (3,3) each 1/4 at
    # distances 1, 2, 1, 0 -> linear 1/4 + 2/4 + 1/4 = 1.0, quadratic 1/4 + 4/4 + 1/4 = 1.5.
    a, b = [1, 3], [2, 3]
    assert cohen_kappa(a, b, weights="linear", categories=[1, 2, 3]) == pytest.approx(1 - 0.5 / 1.0)
    assert cohen_kappa(a, b, weights="quadratic", categories=[1, 2, 3]) == pytest.approx(1 - 0.5 / 1.5)


@pytest.mark.parametrize("weights", [None, "linear", "quadratic"])
def test_cohen_matches_scikit_learn(weights):
    sklearn = pytest.importorskip("sklearn.metrics")
    generator = np.random.default_rng(3)
    for _ in range(20):
        a = generator.integers(1, 6, size=40)
        b = np.clip(a + generator.integers(-2, 3, size=40), 1, 5)
        expected = sklearn.cohen_kappa_score(a, b, weights=weights, labels=[1, 2, 3, 4, 5])
        assert cohen_kappa(a.tolist(), b.tolist(), weights=weights, categories=range(1, 6)) == pytest.approx(expected)


def test_cohen_undefined_and_bad_input():
    assert math.isnan(cohen_kappa(["a", "a"], ["a", "a"]))
    with pytest.raises(ValueError, match="different numbers"):
        cohen_kappa([1, 2], [1])
    with pytest.raises(ValueError, match="outside the categories"):
        cohen_kappa([1, 7], [1, 2], categories=range(1, 6))
    with pytest.raises(ValueError, match="Unknown weights"):
        cohen_kappa([1], [1], weights="cubic")


def test_bootstrap_is_seeded_and_covers_the_estimate():
    generator = np.random.default_rng(0)
    a = generator.integers(0, 3, size=60)
    b = np.where(generator.random(60) < 0.7, a, generator.integers(0, 3, size=60))
    estimate = cohen_kappa(a.tolist(), b.tolist())

    def statistic(idx):
        return cohen_kappa(a[idx].tolist(), b[idx].tolist())

    first = bootstrap_interval(statistic, 60, n_boot=300, seed=7)
    assert first == bootstrap_interval(statistic, 60, n_boot=300, seed=7)
    assert first != bootstrap_interval(statistic, 60, n_boot=300, seed=8)
    assert first[0] < estimate < first[1] and first[1] - first[0] < 0.6
    assert all(math.isnan(v) for v in bootstrap_interval(statistic, 1))
