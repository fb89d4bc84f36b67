"""Adding a metric is one declaration: a toy metric registered here (with its scorer and its direction) appears in
evaluate's report and table, in the statistics' comparisons and score table, and in the scoreboard, with no other
change; and its direction decides which way each of them reads it."""
import json

import numpy as np
import pytest

from explainers import models
from explainers.cli import main
from explainers.metrics import METRICS, Metric, register, unregister
from explainers.scoreboard import comparisons, scoreboard_markdown
from explainers.statistics import compare_methods, format_comparison, score_table

from conftest import tiny_cnn


def peak_share(batch) -> np.ndarray:
    """The toy metric: the share of each map's total held by its largest pixel (lower: a spread-out map)."""
    maps = batch.maps.detach().abs().flatten(1).double()
    return (maps.max(dim=1).values / maps.sum(dim=1).clamp_min(1e-12)).cpu().numpy()


@pytest.fixture
def toy_metric():
    metric = register(Metric("peak_share", "Peak share", "lower", 0.0, 1.0, short="peak", score=peak_share,
                             what="the share of the map's total in its largest pixel"))
    yield metric
    unregister(metric.name)
    assert "peak_share" not in METRICS


def test_a_registered_metric_appears_in_evaluate_statistics_and_the_scoreboard(toy_metric, tiny_folder, tmp_path,
                                                                              capsys):
    models.register_bundle(tiny_cnn(name="toy-metric-cnn"))
    out = tmp_path / "report.json"
    assert main(["evaluate", "--model", "toy-metric-cnn", "--methods", "gradcam,random", "--data", str(tiny_folder),
                 "--limit", "4", "--steps", "4", "--compare", "gradcam,random", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert toy_metric.heading() == "peak (lower better)" and toy_metric.heading() in printed
    report = json.loads(out.read_text())
    for row in report["methods"].values():
        assert len(row["per_image"]["peak_share"]) == 4
        assert row["peak_share"] == pytest.approx(np.mean(row["per_image"]["peak_share"]))
        low, high = row["peak_share_ci95"]
        assert low <= row["peak_share"] <= high
    gradcam, random = (np.asarray(report["methods"][m]["per_image"]["peak_share"]) for m in ("gradcam", "random"))
    assert report["comparisons"][0]["peak_share"]["mean"] == pytest.approx(np.mean(gradcam - random))

    # the statistics: the paired comparison, its printout and the app's score table (best by the declared direction)
    comparison = compare_methods(report, "gradcam", "random")
    assert "peak_share" in comparison and "lower is better" in format_comparison(comparison)
    rows = {row["method"]: row for row in score_table({m: r["per_image"] for m, r in report["methods"].items()})}
    best = "gradcam" if gradcam.mean() < random.mean() else "random"
    assert rows[best]["peak_share_best"] and "peak_share" in rows["random"]

    # the scoreboard: a row per baseline on the new metric, its improvement signed by its direction
    board = {"model": "toy-metric-cnn", "n_images": 4, "protocol": {},
             "references": {ref: {"files": report["files"],
                                  "methods": {"aha": report["methods"]["gradcam"], "random": report["methods"]["random"]}}
                            for ref in ("mean", "blur", "road")}}
    rows = {row["metric"]: row for row in comparisons(board, "aha")}
    assert rows["peak_share"]["cells"]["mean"]["mean"] == pytest.approx(np.mean(random - gradcam))
    text = scoreboard_markdown([board])
    assert "mean colour: peak \u2193" in text and "| peak (lower better) |" in text


def test_every_comparison_reads_the_declared_direction():
    lower, higher = METRICS["deletion_auc"], METRICS["insertion_auc"]
    assert lower.best([0.3, 0.1, 0.2]) == 0.1 and higher.best([0.3, 0.1, 0.2]) == 0.3
    assert lower.ranked(["b", "a"], key={"a": 0.1, "b": 0.2}.get) == ["a", "b"]
    assert higher.ranked(["a", "b"], key={"a": 0.1, "b": 0.2}.get) == ["b", "a"]
    assert lower.gain(0.1, 0.3) == pytest.approx(0.2) and higher.gain(0.1, 0.3) == pytest.approx(-0.2)
    assert lower.meets(0.2, 0.2) and lower.meets(0.1, 0.2) and not lower.meets(0.3, 0.2)  # a ceiling
    assert higher.meets(0.3, 0.2) and not higher.meets(0.1, 0.2)  # a floor
    assert (lower.title(), higher.title()) == ("deletion \u2193", "insertion \u2191")
