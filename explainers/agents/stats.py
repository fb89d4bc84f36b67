"""Comparing two training arms over seeds, as rliable (Agarwal et al. 2021) defines it.

Scores are matrices runs x tasks (one row per training seed, one column per scenario; a run's score is the mean
over its held-out episodes). Stratified bootstrap: resample the runs with replacement within every task
(rliable's `StratifiedBootstrap`, runs only); two arms are resampled independently
(`StratifiedIndependentBootstrap`); percentile intervals. Probability of improvement P(X > Y): per task the
Mann-Whitney U statistic over all run pairs divided by their number (ties count one half), averaged over tasks.
tests/test_agents_stats.py checks these against rliable itself; bench/agents_results.py uses rliable when it is
installed and these otherwise (the record says which).
"""
from __future__ import annotations

import numpy as np

REPS = 50_000  # rliable's default
LEVEL = 0.95


def _as_matrix(scores) -> np.ndarray:
    scores = np.asarray(scores, dtype=np.float64)
    return scores[:, None] if scores.ndim == 1 else scores


def probability_of_improvement(x, y) -> float:
    x, y = _as_matrix(x), _as_matrix(y)
    per_task = []
    for task in range(x.shape[1]):
        a, b = x[:, task][:, None], y[:, task][None, :]
        per_task.append(float(((a > b) + 0.5 * (a == b)).mean()))
    return float(np.mean(per_task))


def _resample(scores: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    runs, tasks = scores.shape
    rows = rng.integers(0, runs, size=(runs, tasks))
    return scores[rows, np.arange(tasks)[None, :]]


def stratified_interval(func, *arms, reps: int = REPS, level: float = LEVEL, seed: int = 0) -> tuple:
    """(point estimate, (low, high)) of func(*arms), each arm's runs resampled independently within tasks."""
    arms = [_as_matrix(arm) for arm in arms]
    rng = np.random.default_rng(seed)
    draws = np.array([func(*[_resample(arm, rng) for arm in arms]) for _ in range(reps)])
    tail = 100 * (1 - level) / 2
    return float(func(*arms)), (float(np.percentile(draws, tail)), float(np.percentile(draws, 100 - tail)))


def mean_score(scores) -> float:
    return float(np.mean(scores))


def compare_arms(x, y, *, reps: int = REPS, seed: int = 0) -> dict:
    """Arm X (e.g. CAMAL) against arm Y (vanilla): each mean with its interval, the difference of means with its
    interval, and the probability of improvement with its interval."""
    mean_x, interval_x = stratified_interval(mean_score, x, reps=reps, seed=seed)
    mean_y, interval_y = stratified_interval(mean_score, y, reps=reps, seed=seed + 1)
    difference, interval_d = stratified_interval(lambda a, b: mean_score(a) - mean_score(b), x, y, reps=reps,
                                                 seed=seed + 2)
    poi, interval_p = stratified_interval(probability_of_improvement, x, y, reps=reps, seed=seed + 3)
    return {"x_mean": mean_x, "x_ci": interval_x, "y_mean": mean_y, "y_ci": interval_y,
            "difference": difference, "difference_ci": interval_d, "poi": poi, "poi_ci": interval_p,
            "runs": [int(_as_matrix(x).shape[0]), int(_as_matrix(y).shape[0])], "reps": reps,
            "implementation": "explainers.agents.stats (rliable's definitions)"}


def import_rliable():
    """rliable's (library, metrics). rliable needs arch < 8, and arch 7 calls pandas' `deprecate_kwarg` in the
    pandas-2 form (no warning class first) that pandas 3 refuses: the import is given a compatible form."""
    import functools

    import pandas.util._decorators as decorators

    original = decorators.deprecate_kwarg

    @functools.wraps(original)
    def compatible(*args, **kwargs):
        if args and isinstance(args[0], str):
            args = (FutureWarning, *args)
        return original(*args, **kwargs)

    decorators.deprecate_kwarg = compatible
    try:
        from rliable import library, metrics
    finally:
        decorators.deprecate_kwarg = original
    return library, metrics


def compare_arms_rliable(x, y, *, reps: int = REPS, seed: int = 0) -> dict:
    """The same comparison computed by rliable itself."""
    library, metrics = import_rliable()

    x, y = _as_matrix(x), _as_matrix(y)
    state = np.random.RandomState(seed)
    points, intervals = library.get_interval_estimates(
        {"x": x, "y": y}, lambda s: np.array([np.mean(s)]), reps=reps, random_state=state)
    d_point, d_interval = library.get_interval_estimates(
        {"d": [x, y]}, lambda a, b: np.array([np.mean(a) - np.mean(b)]), reps=reps, random_state=state)
    p_point, p_interval = library.get_interval_estimates(
        {"p": [x, y]}, lambda a, b: np.array([metrics.probability_of_improvement(a, b)]), reps=reps,
        random_state=state)

    def pair(interval):
        return float(interval[0, 0]), float(interval[1, 0])

    return {"x_mean": float(points["x"][0]), "x_ci": pair(intervals["x"]), "y_mean": float(points["y"][0]),
            "y_ci": pair(intervals["y"]), "difference": float(d_point["d"][0]), "difference_ci": pair(d_interval["d"]),
            "poi": float(p_point["p"][0]), "poi_ci": pair(p_interval["p"]), "runs": [int(x.shape[0]), int(y.shape[0])],
            "reps": reps, "implementation": "rliable"}
