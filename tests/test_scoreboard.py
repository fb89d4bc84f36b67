"""The generated scoreboard: paired verdicts under three references, and the runner behind it (tiny models)."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from explainers import models
from explainers.scoreboard import comparisons, display_name, scoreboard_markdown, verdict
from explainers.statistics import paired_difference

from conftest import tiny_cnn, tiny_vit


def bench_script(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parent.parent / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_report(shifts: dict, n: int = 60, seed: int = 0) -> dict:
    """A report whose 'aha' improves on 'gradcam' by `shifts[ref]` in both curves, per image with noise; 'random'
    is far worse everywhere. ROAD on the first half of the images (a named subset)."""
    rng = np.random.default_rng(seed)
    files = [f"cell_{i}.jpg" for i in range(n)]
    references = {}
    for ref, shift in shifts.items():
        count = n if ref != "road" else n // 2
        base_del, base_ins = rng.uniform(0.2, 0.4, count), rng.uniform(0.5, 0.7, count)
        noise = lambda: rng.normal(0, 0.02, count)  # noqa: E731
        methods = {
            "aha": {"per_image": {"deletion": list(base_del - shift + noise()), "insertion": list(base_ins + shift + noise())}},
            "gradcam": {"per_image": {"deletion": list(base_del), "insertion": list(base_ins)}},
            "rise:n_masks=4000,batch_size=1000": {"options": {"n_masks": 4000},
                                                   "per_image": {"deletion": list(base_del), "insertion": list(base_ins)}},
            "random": {"per_image": {"deletion": list(base_del + 0.2), "insertion": list(base_ins - 0.2)}},
        }
        references[ref] = {"files": files[:count], "methods": methods}
    return {"model": "tiny", "n_images": n, "protocol": {"data": "cells", "steps": 20, "road_limit": n // 2,
                                                          "road_images": n // 2}, "references": references}


def test_a_win_needs_all_three_references():
    report = fake_report({"mean": 0.05, "blur": 0.05, "road": 0.0})
    rows = {(r["baseline"], r["metric"]): r for r in comparisons(report, "aha")}
    assert set(b for b, _ in rows) == {"gradcam", "rise", "random"}
    gradcam = rows[("gradcam", "ins_minus_del")]
    assert gradcam["cells"]["mean"]["ci95"][0] > 0 and gradcam["cells"]["blur"]["ci95"][0] > 0
    assert gradcam["verdict"] == "no: ahead under mean colour, blur; level under ROAD"
    assert rows[("random", "deletion_auc")]["verdict"] == "**wins**"  # far better under all three
    # the ROAD cell is paired on ROAD's own subset: n is half the images
    assert gradcam["cells"]["road"]["n"] == 30 and gradcam["cells"]["mean"]["n"] == 60
    everywhere = {(r["baseline"], r["metric"]): r for r in comparisons(fake_report({"mean": .05, "blur": .05, "road": .05}), "aha")}
    assert all(everywhere[("gradcam", m)]["verdict"] == "**wins**" for m in ("deletion_auc", "insertion_auc", "ins_minus_del"))


def test_refinement_steps_are_compared_with_the_one_pass_only():
    report = fake_report({"mean": 0.05, "blur": 0.05, "road": 0.05})
    for block in report["references"].values():
        one_pass = block["methods"]["aha"]["per_image"]
        block["methods"]["aha:refine_steps=3"] = {"per_image": {"deletion": [v - 0.03 for v in one_pass["deletion"]],
                                                                "insertion": list(one_pass["insertion"])}}
    refined = comparisons(report, "aha:T3")
    assert {row["baseline"] for row in refined} == {"aha"}
    verdicts = {row["metric"]: row["verdict"] for row in refined}
    assert verdicts["deletion_auc"] == "**wins**" and verdicts["insertion_auc"] == "no: level under mean colour, blur, ROAD"
    assert "aha:T3" not in {row["baseline"] for row in comparisons(report, "aha")}
    assert display_name("aha:refine_steps=3") == "AHA T=3"


def test_improvement_signs_follow_each_curve():
    """Lower deletion is better, so AHA's improvement in deletion is gradcam's minus AHA's (positive here)."""
    report = fake_report({"mean": 0.05, "blur": 0.05, "road": 0.05})
    rows = {(r["baseline"], r["metric"]): r for r in comparisons(report, "aha")}
    aha = report["references"]["mean"]["methods"]["aha"]["per_image"]
    gradcam = report["references"]["mean"]["methods"]["gradcam"]["per_image"]
    expected = paired_difference(gradcam["deletion"], aha["deletion"])
    assert rows[("gradcam", "deletion_auc")]["cells"]["mean"]["mean"] == pytest.approx(expected["mean"])
    assert expected["mean"] > 0
    assert rows[("gradcam", "insertion_auc")]["cells"]["mean"]["mean"] > 0


def test_verdict_wording():
    def cell(low, high):
        return {"mean": (low + high) / 2, "ci95": [low, high], "n": 10}
    refs = ("mean", "blur", "road")
    assert verdict({r: cell(0.1, 0.2) for r in refs}, refs) == "**wins**"
    assert verdict({r: cell(-0.2, -0.1) for r in refs}, refs) == "loses"
    mixed = {"mean": cell(0.1, 0.2), "blur": cell(-0.1, 0.1), "road": cell(-0.3, -0.2)}
    assert verdict(mixed, refs) == "no: ahead under mean colour; level under blur; behind under ROAD"
    assert verdict({"mean": cell(0.1, 0.2), "blur": cell(0.1, 0.2)}, refs) == "not measured under ROAD"


def test_markdown_has_every_baseline_and_the_rule():
    text = scoreboard_markdown([fake_report({"mean": 0.05, "blur": 0.05, "road": 0.0})], sources=["tiny.json"])
    assert "under all three references" in text and "`tiny.json`" in text
    assert "| RISE (4,000 masks) |" in text and "| Grad-CAM |" in text and "| random |" in text
    assert "level under ROAD" in text
    assert "Not a win against Grad-CAM" in text
    assert display_name("aha:refine_steps=3") == "AHA T=3"


@pytest.fixture
def registered():
    models.register_bundle(tiny_vit(name="board-tiny-vit", num_classes=4))
    models.register_bundle(tiny_cnn(name="board-tiny-cnn"))


def test_runner_shards_merge_to_the_single_process_result(tiny_folder, tmp_path, registered):
    pytest.importorskip("pytorch_grad_cam")
    runner = bench_script("scoreboard_run")
    common = ["--model", "board-tiny-vit", "--data", str(tiny_folder), "--methods",
              "gradcam,rollout,rise:n_masks=20,random", "--steps", "4", "--batch-size", "2", "--road-limit", "3"]
    runner.main(["run", *common, "--shard", "0/1", "--out", str(tmp_path / "whole.json")])
    for r in range(2):
        runner.main(["run", *common, "--shard", f"{r}/2", "--out", str(tmp_path / f"part-{r}.json")])
    runner.main(["merge", "--out", str(tmp_path / "merged.json"), str(tmp_path / "part-0.json"),
                 str(tmp_path / "part-1.json")])
    runner.main(["merge", "--out", str(tmp_path / "single.json"), str(tmp_path / "whole.json")])
    merged, single = (json.loads((tmp_path / f).read_text()) for f in ("merged.json", "single.json"))
    # `replace` takes `run` outputs as they are: the same run against itself gains nothing under every reference
    runner.main(["replace", "--base", str(tmp_path / "whole.json"), "--rows", str(tmp_path / "whole.json"),
                 "--method", "gradcam", "--as", "gradcam-again", "--out", str(tmp_path / "again.json")])
    again = json.loads((tmp_path / "again.json").read_text())
    assert set(again["pairs"]) == {"mean", "blur", "road"}
    assert all(cell["mean"] == 0 for ref in again["pairs"].values() for cell in ref.values())
    assert merged["n_images"] == 6 and len(merged["references"]["road"]["files"]) == 3
    for ref in ("mean", "blur", "road"):
        assert merged["references"][ref]["files"] == single["references"][ref]["files"]
        for label, row in single["references"][ref]["methods"].items():
            assert np.allclose(merged["references"][ref]["methods"][label]["per_image"]["deletion_auc"],
                               row["per_image"]["deletion_auc"], atol=1e-6)
    # the CNN cannot use rollout: listed as skipped, not silently dropped
    runner.main(["run", *[c.replace("board-tiny-vit", "board-tiny-cnn") for c in common], "--references", "mean",
                 "--out", str(tmp_path / "cnn.json")])
    cnn = json.loads((tmp_path / "cnn.json").read_text())
    assert "rollout" in cnn["skipped"] and "rollout" not in cnn["scores"]["mean"]
    text = scoreboard_markdown([single])
    assert "board-tiny-vit" in text


def test_merge_of_a_run_cut_short_names_the_images_done():
    runner = bench_script("scoreboard_run")

    def part(indices, stopped):
        scores = {"mean": {"gradcam": {"index": indices, "deletion": [0.1 * i for i in indices],
                                       "insertion": [0.5] * len(indices)}}}
        return {"model": "m", "files": [f"f{i}" for i in range(6)], "indices": indices, "correct": 0, "labelled": 0,
                "scores": scores, "seconds": {"gradcam": 0.0}, "curve_seconds": {"mean": 0.0}, "skipped": {},
                "options": {"gradcam": {}}, "protocol": {}, "stopped": stopped}

    merged = runner.merge([part([0, 1, 4], None), part([2], "stopped at the 10 s deadline after 1 images")])
    assert merged["files"] == ["f0", "f1", "f2", "f4"] and merged["planned_images"] == 6 and merged["stopped"]
    assert merged["references"]["mean"]["files"] == ["f0", "f1", "f2", "f4"]
    assert merged["references"]["mean"]["methods"]["gradcam"]["per_image"]["deletion"] == pytest.approx([0, .1, .2, .4])
    with pytest.raises(SystemExit, match="a shard is missing"):
        runner.merge([part([0, 1, 4], None)])


def test_replace_puts_a_new_run_beside_the_stored_rows_and_pairs_it():
    """A retrained method's rows from a new run of the same images replace the stored ones (the other methods'
    stored rows kept, so the new row is paired with them), or sit beside them with the paired improvement; a run
    on other images is refused."""
    runner = bench_script("scoreboard_run")

    def report(files, rows):
        methods = {label: {"options": {}, "per_image": {"ins_minus_del": values}} for label, values in rows.items()}
        return {"model": "m", "protocol": {"run": len(rows)}, "files": files,
                "references": {"mean": {"files": files, "methods": methods}}}

    files = [f"f{i}" for i in range(8)]
    stored = report(files, {"aha": [0.3] * 8, "rise:n_masks=4000": [0.35] * 8})
    new = report(files, {"aha": [0.4, 0.42, 0.38, 0.41, 0.4, 0.39, 0.41, 0.4]})
    replaced = runner.replace_rows(stored, new, "aha")
    rows = replaced["references"]["mean"]["methods"]
    assert rows["aha"]["per_image"]["ins_minus_del"][1] == 0.42 and list(rows) == ["aha", "rise:n_masks=4000"]
    assert stored["references"]["mean"]["methods"]["aha"]["per_image"]["ins_minus_del"][1] == 0.3  # not modified
    beside = runner.replace_rows(stored, new, "aha", "aha-student")
    assert set(beside["references"]["mean"]["methods"]) == {"aha", "aha-student", "rise:n_masks=4000"}
    gain = beside["pairs"]["mean"]["ins_minus_del"]
    assert gain["mean"] == pytest.approx(0.10125) and gain["ci95"][0] > 0.09
    with pytest.raises(SystemExit, match="other images"):
        runner.replace_rows(stored, report(files[::-1], {"aha": [0.4] * 8}), "aha")
    # AHA's refined row is another row than its one pass: replacing the one pass leaves T=3 as stored
    with_t3 = report(files, {"aha": [0.3] * 8, "aha:refine_steps=3": [0.5] * 8})
    rows = runner.replace_rows(with_t3, new, "aha")["references"]["mean"]["methods"]
    assert list(rows) == ["aha", "aha:refine_steps=3"] and rows["aha:refine_steps=3"]["per_image"]["ins_minus_del"][0] == 0.5
    assert rows["aha"]["per_image"]["ins_minus_del"][1] == 0.42
