"""Uncertainty for per-image scores: percentile bootstrap intervals of a mean, and the paired bootstrap
interval of the difference between two methods scored on the same images.

Seeded (the same data and seed give the same interval) and chunked over resamples, so 100k images cost
memory for one chunk only. No app code: the CLI, the bench scripts and the app's score table call these.
"""
from __future__ import annotations

import numpy as np

N_RESAMPLES = 2000
LEVEL = 0.95
SEED = 0
_CHUNK_ELEMENTS = 4_000_000  # resample indices held at once (32 MB of int64)


def bootstrap_means(values, *, n_resamples: int = N_RESAMPLES, seed: int = SEED) -> np.ndarray:
    """The mean of each of `n_resamples` resamples (with replacement, same size) of `values`."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    n = len(values)
    if n == 0:
        raise ValueError("bootstrap needs at least one value")
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK_ELEMENTS // n)
    means = np.empty(n_resamples)
    for start in range(0, n_resamples, chunk):
        stop = min(start + chunk, n_resamples)
        indices = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = values[indices].mean(axis=1)
    return means


def bootstrap_ci(values, *, level: float = LEVEL, n_resamples: int = N_RESAMPLES, seed: int = SEED):
    """Percentile bootstrap interval [low, high] of the mean of `values`; None with fewer than 2 values
    (one image has no spread to resample) or where a value is missing (NaN)."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if len(values) < 2 or not np.all(np.isfinite(values)):
        return None
    means = bootstrap_means(values, n_resamples=n_resamples, seed=seed)
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(means, [tail, 100.0 - tail])
    return [float(low), float(high)]


def mean_with_ci(values, *, digits: int | None = None, **options) -> dict:
    """{"mean", "ci95", "n"} of the finite values (None and NaN left out, as an episode or image with no score);
    `digits` rounds the mean and the interval for a results file. An empty list has mean None."""
    kept = [float(v) for v in values if v is not None and np.isfinite(v)]
    mean = float(np.mean(kept)) if kept else None
    interval = bootstrap_ci(kept, **options)
    if digits is not None:
        mean = None if mean is None else round(mean, digits)
        interval = None if interval is None else [round(v, digits) for v in interval]
    return {"mean": mean, "ci95": interval, "n": len(kept)}


def paired_difference(a, b, *, level: float = LEVEL, n_resamples: int = N_RESAMPLES, seed: int = SEED) -> dict:
    """Mean of a - b over the same images and its paired bootstrap interval (the images are resampled,
    both scores of an image travel together). `significant`: the interval excludes 0."""
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"paired scores need the same images: {len(a)} vs {len(b)} values")
    difference = a - b
    interval = bootstrap_ci(difference, level=level, n_resamples=n_resamples, seed=seed)
    return {"mean": float(difference.mean()) if len(difference) else float("nan"), "ci95": interval,
            "significant": excludes_zero(interval), "n": int(len(difference))}


def excludes_zero(interval) -> bool:
    """True when an interval lies entirely above or below 0 (None: not enough data, so False)."""
    return interval is not None and (interval[0] > 0 or interval[1] < 0)


def compare_methods(report: dict, first: str, second: str, **options) -> dict:
    """Paired differences first - second of every declared metric both methods carry per image, on the report's
    images, keyed by metric name (which sign favours `first`: the metric's declaration, `METRICS[name].better`)."""
    from .metrics import per_image

    methods = report["methods"]
    for name in (first, second):
        if name not in methods:
            raise KeyError(f"--compare: '{name}' is not among the evaluated methods ({', '.join(methods)})")
        if "per_image" not in methods[name]:
            raise ValueError(f"the report has no per-image scores for '{name}' (written by an older version?)")
    a, b = per_image(methods[first]["per_image"]), per_image(methods[second]["per_image"])
    return {"a": first, "b": second, **{metric: paired_difference(a[metric], b[metric], **options)
                                        for metric in a if metric in b}}


def format_interval(mean: float, interval, digits: int = 4) -> str:
    """'0.1987 [0.1902, 0.2071]', or just the mean where there is no interval."""
    if interval is None:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"


def format_comparison(comparison: dict) -> str:
    from .metrics import METRICS

    names = [name for name in METRICS if name in comparison]
    lines = [f"paired bootstrap, {comparison['a']} - {comparison['b']} "
             f"(n = {comparison[names[0]]['n'] if names else 0}, 95% percentile interval):"]
    for name in names:
        result = comparison[name]
        verdict = "excludes 0: significant" if result["significant"] else "includes 0: not significant"
        if result["ci95"] is None:
            verdict = "too few images for an interval"
        lines.append(f"  {METRICS[name].short or name:<14}{format_interval(result['mean'], result['ci95']):>32}  "
                     f"{verdict} ({METRICS[name].better_text})")
    return "\n".join(lines)


def score_table(methods: dict, *, digits: int = 3, **options) -> list:
    """Rows for a score table (the app's Review and batch views): per method and declared metric its mean as
    'mean [low, high]' and whether it differs significantly (paired interval excludes 0) from the best method on
    that metric (best by the metric's declared direction). `methods`: {name: per-image block} on the same images
    (an evaluate report's `per_image` blocks, read by `metrics.per_image`); the metrics every method carries, in
    declaration order. One image: means only, nothing marked."""
    from .metrics import METRICS, per_image

    scores = {name: per_image(block) for name, block in methods.items()}
    names = [m for m in METRICS if scores and all(m in value for value in scores.values())]
    best = {metric: METRICS[metric].best(scores, key=lambda m: scores[m][metric].mean()) for metric in names}
    rows = []
    for name, value in scores.items():
        row = {"method": name}
        for metric in names:
            mean = float(value[metric].mean())
            row[metric] = format_interval(mean, bootstrap_ci(value[metric], **options), digits)
            row[f"{metric}_best"] = best[metric] == name
            row[f"{metric}_worse_than_best"] = (best[metric] != name and len(value[metric]) > 1 and
                                                paired_difference(value[metric], scores[best[metric]][metric],
                                                                  **options)["significant"])
        rows.append(row)
    return rows


def wilson_interval(successes: int, total: int, *, level: float = LEVEL) -> tuple:
    """The Wilson score interval of a proportion (successes / total): unlike the bootstrap it stays inside [0, 1]
    and is not degenerate when every image (or none) is counted. (0, 1) for total 0."""
    from statistics import NormalDist

    if total <= 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p = successes / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * np.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))


def rounded(value, digits: int = 4):
    """Floats rounded to `digits` through nested lists, tuples and dicts (figures written to JSON)."""
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, (list, tuple)):
        return [rounded(v, digits) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    return value
