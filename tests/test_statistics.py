"""Bootstrap intervals: known answers, not re-implementations."""
import numpy as np
import pytest

from explainers.statistics import (bootstrap_ci, bootstrap_means, compare_methods, excludes_zero, format_comparison,
                                   format_interval, paired_difference, score_table)


def test_constant_data_gives_a_zero_width_interval():
    assert bootstrap_ci(np.full(50, 0.3)) == pytest.approx([0.3, 0.3])


def test_two_values_known_distribution():
    # resample means of [0, 1] (size 2) are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4: the 2.5% and 97.5%
    # percentiles of that distribution are 0 and 1, the 25% and 75% ones 0.5 and 0.5
    means = bootstrap_means([0.0, 1.0], n_resamples=20000, seed=3)
    assert set(np.unique(means)) == {0.0, 0.5, 1.0}
    assert np.mean(means == 0.5) == pytest.approx(0.5, abs=0.02)
    assert bootstrap_ci([0.0, 1.0], n_resamples=20000) == [0.0, 1.0]
    assert bootstrap_ci([0.0, 1.0], level=0.5, n_resamples=20000) == [0.5, 0.5]


def test_interval_contains_the_mean_and_shrinks_with_n():
    rng = np.random.default_rng(0)
    small, large = rng.normal(0.2, 0.1, 30), rng.normal(0.2, 0.1, 3000)
    for values in (small, large):
        low, high = bootstrap_ci(values)
        assert low < values.mean() < high
    width = lambda v: np.diff(bootstrap_ci(v))[0]  # noqa: E731
    assert width(large) < width(small) / 5  # about sqrt(100) = 10 times narrower
    # the standard error is 0.1 / sqrt(3000): the 95% interval is about +-1.96 of it
    assert width(large) == pytest.approx(2 * 1.96 * 0.1 / np.sqrt(3000), rel=0.15)


def test_seeded_and_chunking_does_not_change_the_answer(monkeypatch):
    values = np.random.default_rng(1).random(40)
    first = bootstrap_ci(values, seed=7)
    assert bootstrap_ci(values, seed=7) == first and bootstrap_ci(values, seed=8) != first
    import explainers.statistics as statistics

    monkeypatch.setattr(statistics, "_CHUNK_ELEMENTS", 40 * 3)  # 3 resamples per chunk
    assert bootstrap_ci(values, seed=7) == pytest.approx(first)


def test_hand_computed_percentiles_with_a_fixed_seed():
    values = np.array([0.1, 0.4, 0.2, 0.9, 0.5])
    rng = np.random.default_rng(11)
    draws = rng.integers(0, 5, size=(9, 5))
    means = values[draws].mean(axis=1)
    expected = np.percentile(means, [2.5, 97.5])
    assert bootstrap_ci(values, n_resamples=9, seed=11) == pytest.approx(expected.tolist())


def test_paired_difference_with_a_constant_offset_is_exact():
    rng = np.random.default_rng(2)
    b = rng.random(100)  # widely spread scores ...
    a = b + 0.01  # ... but a is always 0.01 better: unpaired intervals overlap, the paired one does not
    result = paired_difference(a, b)
    assert result["mean"] == pytest.approx(0.01) and result["ci95"] == pytest.approx([0.01, 0.01])
    assert result["significant"] and result["n"] == 100
    ci_a, ci_b = bootstrap_ci(a), bootstrap_ci(b)
    assert ci_a[0] < ci_b[1]  # the unpaired intervals overlap
    noise = paired_difference(b + rng.normal(0, 0.05, 100), b)
    assert noise["ci95"][0] < 0 < noise["ci95"][1] and not noise["significant"]
    with pytest.raises(ValueError, match="same images"):
        paired_difference(a, b[:50])


def test_too_few_values_and_missing_values_have_no_interval():
    assert bootstrap_ci([0.5]) is None and bootstrap_ci([0.5, np.nan]) is None
    assert not excludes_zero(None) and excludes_zero([0.1, 0.2]) and excludes_zero([-0.2, -0.1])
    assert not excludes_zero([-0.1, 0.1])
    assert format_interval(0.5, None) == "0.5000"
    assert format_interval(0.19871, [0.19, 0.2071]) == "0.1987 [0.1900, 0.2071]"


def test_compare_methods_on_a_report():
    deletion_a, deletion_b = [0.1, 0.2, 0.3, 0.2], [0.3, 0.4, 0.5, 0.4]
    insertion = [0.6, 0.7, 0.8, 0.7]
    report = {"methods": {"a": {"per_image": {"deletion": deletion_a, "insertion": insertion}},
                          "b": {"per_image": {"deletion": deletion_b, "insertion": insertion}}}}
    comparison = compare_methods(report, "a", "b")  # a report written with the older keys ('deletion') is read
    assert comparison["deletion_auc"]["mean"] == pytest.approx(-0.2)
    assert comparison["deletion_auc"]["ci95"] == pytest.approx([-0.2, -0.2]) and comparison["deletion_auc"]["significant"]
    assert comparison["insertion_auc"]["ci95"] == pytest.approx([0.0, 0.0]) and not comparison["insertion_auc"]["significant"]
    assert comparison["ins_minus_del"]["mean"] == pytest.approx(0.2)
    text = format_comparison(comparison)
    assert "a - b" in text and "excludes 0: significant" in text and "includes 0" in text
    with pytest.raises(KeyError, match="not among"):
        compare_methods(report, "a", "c")
    from explainers.evaluate import score_summary

    found = score_summary({"deletion_auc": deletion_a, "insertion_auc": insertion})
    assert {"deletion_auc_ci95", "insertion_auc_ci95", "ins_minus_del_ci95"} <= set(found)
    assert found["ins_minus_del_ci95"] == pytest.approx([0.5, 0.5]) and found["pointing_game_ci95"] is None


def test_score_table_marks_significant_differences_from_the_best():
    rng = np.random.default_rng(5)
    base = rng.random(60)
    methods = {"good": {"deletion": base * 0.5, "insertion": base * 0.5 + 0.4},
               "tied": {"deletion": base * 0.5 + 0.05 + rng.normal(0, 0.01, 60), "insertion": base * 0.5 + 0.4},
               "bad": {"deletion": base * 0.5 + 0.2, "insertion": base * 0.5 + 0.1}}
    rows = {row["method"]: row for row in score_table(methods)}
    assert rows["good"]["ins_minus_del_best"] and not rows["good"]["ins_minus_del_worse_than_best"]
    assert rows["bad"]["deletion_auc_worse_than_best"] and rows["bad"]["ins_minus_del_worse_than_best"]
    assert "[" in rows["bad"]["deletion_auc"]
    assert rows["tied"]["deletion_auc_worse_than_best"] and not rows["tied"]["insertion_auc_worse_than_best"]
    single = score_table({"a": {"deletion_auc": [0.2], "insertion_auc": [0.6]},
                          "b": {"deletion_auc": [0.3], "insertion_auc": [0.5]}})
    assert single[0]["deletion_auc"] == "0.200" and not single[1]["deletion_auc_worse_than_best"]


def bench_script(name: str):
    """A script of bench/ (not a package; 'studies/NAME' for a study) loaded as a module, so its main() can be called
    with arguments."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(Path(name).name, Path(__file__).parent.parent / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compare_reports_pairs_methods_across_reports_of_the_same_images(tmp_path):
    import json

    tool = bench_script("compare_reports")
    rng = np.random.default_rng(0)
    deletion, insertion = rng.uniform(0.1, 0.3, 30), rng.uniform(0.5, 0.8, 30)

    def report(methods, files):
        return {"model": "m", "n_images": len(files), "files": files, "protocol": {"reference": "mean", "steps": 20},
                "methods": {name: {"deletion_auc": float(np.mean(d)), "insertion_auc": float(np.mean(i)),
                                   "ins_minus_del": float(np.mean(i - d)), "deletion_ci95": None,
                                   "insertion_ci95": None, "ins_minus_del_ci95": None,
                                   "per_image": {"deletion": list(d), "insertion": list(i)}}
                            for name, (d, i) in methods.items()}}

    files = [f"f{i}.png" for i in range(30)]
    new = tmp_path / "new.json"
    old = tmp_path / "old.json"
    new.write_text(json.dumps(report({"aha": (deletion - 0.01, insertion + 0.02)}, files)))
    old.write_text(json.dumps({"tiers": report({"aha": (deletion, insertion)}, files)}))
    out = tmp_path / "pairs.json"
    assert tool.main(["--merge", str(new), f"{old}@tiers", "--pairs", "1:aha,2:aha", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    row = result["comparisons"][0]
    assert result["files_checked"] and row["a"] == "1:aha" and row["b"] == "2:aha"
    assert row["deletion_auc"]["mean"] == pytest.approx(-0.01) and row["ins_minus_del"]["mean"] == pytest.approx(0.03)
    assert row["ins_minus_del"]["significant"]
    old.write_text(json.dumps(report({"aha": (deletion, insertion)}, files[::-1])))  # other order: refused
    with pytest.raises(SystemExit, match="same images"):
        tool.main(["--merge", str(new), str(old), "--pairs", "1:aha,2:aha"])


def test_compare_reports_pools_reports_of_different_images(tmp_path):
    """--concat: the per-image scores of chunks joined (means and intervals from all images), a part made of two
    reports of the same images merged by method name, a method picked with FILE#name; repeated images, another
    protocol or a clash of method names refused."""
    import json

    tool = bench_script("compare_reports")
    rng = np.random.default_rng(2)
    deletion, insertion = rng.uniform(0.1, 0.3, 24), rng.uniform(0.5, 0.8, 24)

    def report(methods, files, reference="mean"):
        return {"model": "m", "n_images": len(files), "files": files,
                "protocol": {"reference": reference, "steps": 20, "seed": 0},
                "methods": {name: {"deletion_auc": float(np.mean(d)), "insertion_auc": float(np.mean(i)),
                                   "ins_minus_del": float(np.mean(i - d)), "ms_per_image": 2.0,
                                   "per_image": {"deletion": list(d), "insertion": list(i)}}
                            for name, (d, i) in methods.items()}}

    files = [f"f{i}.png" for i in range(24)]
    first, stored, rest = tmp_path / "first.json", tmp_path / "stored.json", tmp_path / "rest.json"
    first.write_text(json.dumps(report({"aha": (deletion[:8], insertion[:8])}, files[:8])))
    # a stored run of the same 8 images: its "aha" would clash, so only "rise" is taken from it
    stored.write_text(json.dumps({"rise": report({"aha": (deletion[:8], insertion[:8]),
                                                  "rise": (deletion[:8] + 0.02, insertion[:8] - 0.01)}, files[:8])}))
    rest.write_text(json.dumps(report({"aha": (deletion[8:], insertion[8:]),
                                       "rise": (deletion[8:] + 0.02, insertion[8:] - 0.01),
                                       "gradcam": (deletion[8:], insertion[8:])}, files[8:])))
    pooled, out = tmp_path / "pooled.json", tmp_path / "pairs.json"
    assert tool.main(["--concat", f"{first}+{stored}@rise#rise", str(rest), "--pairs", "aha,rise",
                      "--report-out", str(pooled), "--out", str(out)]) == 0
    joined = json.loads(pooled.read_text())
    assert joined["n_images"] == 24 and joined["files"] == files and set(joined["methods"]) == {"aha", "rise"}
    assert joined["methods"]["aha"]["deletion_auc"] == pytest.approx(float(np.mean(deletion)))
    low, high = joined["methods"]["aha"]["insertion_auc_ci95"]
    assert low < float(np.mean(insertion)) < high
    row = json.loads(out.read_text())["comparisons"][0]
    assert row["deletion_auc"]["mean"] == pytest.approx(-0.02) and row["ins_minus_del"]["mean"] == pytest.approx(0.03)
    with pytest.raises(SystemExit, match="in two reports"):
        tool.main(["--concat", f"{first}+{stored}@rise", str(rest)])
    with pytest.raises(SystemExit, match="more than one part"):
        tool.main(["--concat", str(first), str(first)])
    other = tmp_path / "other.json"
    other.write_text(json.dumps(report({"aha": (deletion[8:], insertion[8:])}, files[8:], reference="black")))
    with pytest.raises(SystemExit, match="protocol 'reference'"):
        tool.main(["--concat", str(first), str(other)])


def test_compare_reports_pairs_grid_pointing_game_reports_on_the_same_mosaics(tmp_path):
    import json

    tool = bench_script("compare_reports")
    share = np.random.default_rng(1).uniform(0.5, 0.9, 40)
    mosaics = [{"files": [f"c{i}-{q}.png" for q in range(4)], "classes": [0, 1, 2, 3]} for i in range(40)]

    def report(methods, mosaics):
        return {"model": "m", "n_mosaics": len(mosaics), "mosaics": mosaics,
                "methods": {name: {"gridpg": float(np.mean(s)), "gridpg_ci95": None, "per_mosaic": list(s)}
                            for name, s in methods.items()}}

    new, old, out = tmp_path / "new.json", tmp_path / "old.json", tmp_path / "pairs.json"
    new.write_text(json.dumps(report({"aha": share + 0.02, "gradcam": share - 0.05}, mosaics)))
    old.write_text(json.dumps(report({"aha": share}, mosaics)))
    assert tool.main(["--merge", str(new), str(old), "--pairs", "1:aha,2:aha", "1:aha,1:gradcam",
                      "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["comparisons"]
    assert rows[0]["gridpg"]["mean"] == pytest.approx(0.02) and rows[0]["gridpg"]["significant"]
    assert rows[1]["gridpg"]["mean"] == pytest.approx(0.07)
    old.write_text(json.dumps(report({"aha": share}, mosaics[::-1])))  # other mosaics: refused
    with pytest.raises(SystemExit, match="same mosaics"):
        tool.main(["--merge", str(new), str(old), "--pairs", "1:aha,2:aha"])


def test_distillation_ship_follows_the_validation_rule_and_records_the_round(tmp_path):
    import json

    tool = bench_script("aha_distill")
    weights, student = tmp_path / "weights", tmp_path / "run" / "aha-m"
    weights.mkdir()
    student.parent.mkdir()
    (weights / "aha-m.json").write_text(json.dumps({"distillation": {"validation_metric": "val ins-del"}}))
    (weights / "aha-m.safetensors").write_bytes(b"old")
    (student.parent / "aha-m.safetensors").write_bytes(b"new")
    (student.parent / "aha-m.json").write_text(json.dumps({"distilled": {"step": 250}}))
    trace = [{"step": s, "deletion_auc": 0.2 - s / 1e4, "insertion_auc": 0.6, "ins_minus_del": 0.4 + s / 1e4}
             for s in (0, 250)]
    (student.parent / "aha-m.history.json").write_text(json.dumps(
        {"history": trace, "best_step": 250, "steps_done": 300,
         "args": {"lr": 1e-4, "batch_size": 32, "flip": True, "mosaic_every": 2, "steps": 300, "minutes": 5}}))

    def ship(gain_ci):
        compare = tmp_path / "compare.json"
        row = {"mean": sum(gain_ci) / 2, "ci95": gain_ci, "significant": gain_ci[0] > 0, "n": 256}
        compare.write_text(json.dumps({"B_minus_A": {"deletion": row, "insertion": row, "ins_minus_del": row}}))
        return tool.main(["ship", "--model", "m", "--student", str(student), "--compare", str(compare), "--round", "2",
                          "--what", "test", "--teacher-json", "{}", "--commands", "x", "--weights-dir", str(weights)])

    with pytest.raises(SystemExit, match="not shipped"):  # the interval includes 0: the shipped explainer stays
        ship([-0.001, 0.004])
    assert (weights / "aha-m.safetensors").read_bytes() == b"old"
    assert ship([0.002, 0.006]) == 0
    card = json.loads((weights / "aha-m.json").read_text())
    assert (weights / "aha-m.safetensors").read_bytes() == b"new"
    assert card["distillation_round_2"]["exported_step"] == 250
    assert card["distillation_round_2"]["validation"] == trace
    assert card["distillation_round_2"]["versus_round_1_val256"]["ins_minus_del"]["ci95"] == [0.002, 0.006]
    assert (weights / card["distillation_round_2"]["validation_plot"]).stat().st_size > 0


def test_teacher_files_resume_where_they_stopped_and_keep_every_field(tmp_path):
    """bench/aha_distill.py write_in_chunks (both teacher scripts use it): a rerun with more cells computes only the new
    ones, and every per-cell field stays aligned with `indices`."""
    import torch
    from safetensors.torch import load_file

    tool = bench_script("aha_distill")
    calls = []

    def teach(cells, cells_done):
        calls.append((list(cells), cells_done))
        return {"maps": torch.tensor(cells, dtype=torch.float32).view(-1, 1) * 10,
                "seeds": torch.full((len(cells),), 100 + cells_done, dtype=torch.long)}

    out = tmp_path / "teachers.safetensors"
    tool.write_in_chunks(out, [5, 1, 9], 2, teach)
    tool.write_in_chunks(out, [5, 1, 9, 7, 3], 2, teach)
    assert calls == [([5, 1], 0), ([9], 2), ([7, 3], 3)]  # the second run skipped the three cells it had
    saved = load_file(str(out))
    assert saved["indices"].tolist() == [5, 1, 9, 7, 3]
    assert saved["maps"].view(-1).tolist() == [50.0, 10.0, 90.0, 70.0, 30.0]
    assert saved["seeds"].tolist() == [100, 100, 102, 103, 103]


def test_head_signals_are_linear_in_the_row_and_pearson_knows_its_answers():
    """bench/studies/aha_head_sensitivity.py signals: the logit attribution and gradient x activation of a head row are linear in
    that row (a sign flip flips them, a scale scales them), <token, row> uses the row's direction only, and the
    per-cell Pearson r is 1 / -1 for a map against itself / its negation."""
    import torch

    from conftest import tiny_vit
    from explainers.aha.network import AHAExplainer

    tool = bench_script("studies/aha_head_sensitivity")
    vit = tiny_vit()
    explainer = AHAExplainer(vit, width=8, embed_dim=8).eval()
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    rows = torch.randn(2, vit.network.get_classifier().weight.shape[1], generator=torch.Generator().manual_seed(4))
    encoded = explainer.encode(images)
    base, flipped, doubled = tool.row_signals(explainer, images, encoded, [rows, -rows, 2 * rows])
    alone = tool.row_signals(explainer, images, encoded, [rows])[0]  # a set's signals do not depend on the others
    assert all(torch.allclose(alone[name], base[name], atol=1e-6) for name in base)
    for name in ("logit_attribution_last", "logit_attribution_all", "gradient_x_activation"):
        assert base[name].shape == (2, 32, 32) and base[name].abs().max() > 0
        assert torch.allclose(flipped[name], -base[name], atol=1e-5), name
        assert torch.allclose(doubled[name], 2 * base[name], atol=1e-5), name
    assert torch.allclose(doubled["row_dot_token_level0"], base["row_dot_token_level0"], atol=1e-5)
    assert all(p.grad is None for p in vit.network.parameters())  # the shared model's gradients are left alone
    m = base["gradient_x_activation"]
    assert np.allclose(tool.pearson(m, m), 1.0) and np.allclose(tool.pearson(m, -m), -1.0)

def test_photo_teachers_never_read_the_held_out_validation_images(monkeypatch):
    """bench/aha_distill.py --holdout: the teacher images avoid exactly the images `train-aha --val-holdout` kept out
    (the student is selected on those), and the parts split the chosen images without overlap."""
    import argparse

    import explainers.data
    from explainers.aha_training.data import holdout_indices

    tool = bench_script("aha_distill")
    monkeypatch.setattr(explainers.data, "open_dataset", lambda data, split=None, limit=None: range(400))
    held = set(holdout_indices(400, 0.1)[1])
    parts = [tool.chosen_cells(argparse.Namespace(data="x", holdout=0.1, limit=180, offset=0, part=f"{p}/2"))[0]
             for p in (0, 1)]
    assert len(held) == 40 and len(parts[0]) == len(parts[1]) == 90
    assert not set(parts[0]) & set(parts[1]) and not (set(parts[0]) | set(parts[1])) & held
    everything = tool.chosen_cells(argparse.Namespace(data="x", holdout=None, limit=400, offset=0, part="0/1"))[0]
    assert everything == list(range(400))  # without --holdout: the whole file, as for the cells


def test_more_teachers_skip_the_images_earlier_teacher_files_hold(monkeypatch, tmp_path):
    """bench/aha_distill.py --skip: a second teacher run over all trainable images writes only the ones the first
    run's files do not hold, never a held-out image, and its parts still split them without overlap."""
    import argparse

    import torch
    from safetensors.torch import save_file

    import explainers.data
    from explainers.aha_training.data import holdout_indices

    tool = bench_script("aha_distill")
    monkeypatch.setattr(explainers.data, "open_dataset", lambda data, split=None, limit=None: range(400))
    first = [tool.chosen_cells(argparse.Namespace(data="x", holdout=0.1, limit=180, offset=0, part=f"{p}/2"))[0]
             for p in (0, 1)]
    files = []
    for p, cells in enumerate(first):
        files.append(tmp_path / f"teacher-{p}.safetensors")
        save_file({"indices": torch.tensor(cells), "maps": torch.zeros(len(cells), 2, 2)}, str(files[-1]))
    second = [tool.chosen_cells(argparse.Namespace(data="x", holdout=0.1, limit=360, offset=0, part=f"{p}/2",
                                                   skip=files))[0] for p in (0, 1)]
    trainable = set(holdout_indices(400, 0.1)[0])
    assert len(second[0]) == len(second[1]) == 90 and not set(second[0]) & set(second[1])
    assert set(first[0]) | set(first[1]) | set(second[0]) | set(second[1]) == trainable  # together: every image once
    assert not (set(second[0]) | set(second[1])) & (set(first[0]) | set(first[1]))


def test_encoded_cache_is_the_per_batch_encoding_concatenated():
    import torch

    from explainers.aha.network import Encoded

    tool = bench_script("aha_distill")

    class Fake:
        def encode(self, x):
            return Encoded(x.sum((1, 2, 3))[:, None], [x, x[:, :1] * 2], None, tuple(x.shape[-2:]))

    images = torch.randn(37, 3, 4, 4)
    cached = tool.encode_all(Fake(), images, batch=8)
    pick = torch.tensor([36, 0, 9, 9])
    chosen, direct = cached.select(pick), Fake().encode(images[pick])
    assert torch.equal(chosen.logits, direct.logits) and chosen.final_grid is None and chosen.image_hw == (4, 4)
    assert all(torch.equal(a, b) for a, b in zip(chosen.levels, direct.levels))


def test_the_grid_teacher_points_each_class_to_its_own_evidence(quadrant):
    """bench/aha_grid_distill.py: one set of occlusion passes gives each asked class its own map, in the order asked.
    The quadrant model's class 0 is the top-left quadrant's brightness above grey (class 1 its negative): on mosaics
    with a bright top-left quadrant class 0's map puts its positive mass there, class 1's is its mirror image, and a class asked twice gets the same map."""
    import torch

    from explainers.gridpg import quadrant_share

    tool = bench_script("aha_grid_distill")
    generator = torch.Generator().manual_seed(0)
    mosaics = 0.2 + 0.3 * torch.rand(2, 3, 32, 32, generator=generator)
    mosaics[:, :, :16, :16] += 0.4  # a bright top-left quadrant: class 0's evidence, which painting it grey removes
    classes = torch.tensor([[0, 1, 0, 1], [1, 0, 1, 0]])
    maps = tool.occlusion_teacher(quadrant, mosaics, classes)
    assert maps.shape == (2, 4, tool.TEACHER_SIZE, tool.TEACHER_SIZE)
    class_0 = torch.stack([maps[0, 0], maps[1, 1]])
    assert (quadrant_share(class_0, [0, 0]) > 0.9).all()
    assert torch.allclose(maps[0, 1], -maps[0, 0], atol=1e-3) and torch.equal(maps[0, 0], maps[0, 2])
    assert torch.allclose(maps.flatten(2).mean(-1), torch.zeros(2, 4), atol=1e-4)  # standardised


def test_the_grid_students_checkpoint_rule_puts_the_floor_first():
    tool = bench_script("aha_grid_distill")
    faithful, sharper_unfaithful = {"faithful": True, "gridpg": 0.40}, {"faithful": False, "gridpg": 0.60}
    assert tool.better(faithful, None) and tool.better(faithful, sharper_unfaithful)
    assert not tool.better(sharper_unfaithful, faithful)
    assert tool.better({"faithful": True, "gridpg": 0.41}, faithful)


def test_the_grid_students_command_line_spells_flags_as_given():
    import argparse

    tool = bench_script("aha_grid_distill")
    line = tool.command_line(argparse.Namespace(command="train", teacher=["a", "b"], cache_encoded=True,
                                                cells_per_step=8, hflip=False))
    assert line.endswith("train --teacher a b --cache-encoded --cells-per-step 8")


def test_a_stopped_grid_segment_is_recorded_when_the_run_resumes():
    tool = bench_script("aha_grid_distill")
    state = {"step": 300, "segments": [{"from": 0, "to": 100, "seconds": 60.0}],
             "history": [{"step": 100, "seconds": 60.0}, {"step": 200, "seconds": 50.0}, {"step": 300, "seconds": 95.5}]}
    tool.record_stopped_segment(state)
    assert state["segments"][-1]["from"] == 100 and state["segments"][-1]["to"] == 300
    assert state["segments"][-1]["seconds"] == 95.5 and "stopped" in state["segments"][-1]
    tool.record_stopped_segment(state)  # already recorded: nothing added
    assert len(state["segments"]) == 2
    fresh = {"step": 0, "segments": [], "history": [{"step": 0, "seconds": 1.0}]}
    tool.record_stopped_segment(fresh)
    assert fresh["segments"] == []


def test_the_grid_students_single_cells_keep_the_warm_starts_maps(tmp_path):
    """bench/aha_grid_distill.py --cells-per-step: the goal of a single training cell is the warm start's own
    standardised map of the class the model predicts for it, from a frozen copy: the student starts at zero loss on
    them, and training the student does not move the goals."""
    import argparse

    import torch

    from conftest import tiny_vit
    from explainers.aha.network import AHAExplainer, standardise
    from explainers.aha.store import save_explainer
    from explainers.aha_training.loop import warm_start

    tool = bench_script("aha_grid_distill")
    bundle = tiny_vit("tiny-grid", seed=0)
    torch.manual_seed(0)
    start = AHAExplainer(bundle, width=8, embed_dim=8)
    with torch.no_grad():
        start.head.conv2.weight.normal_()  # a map that is not flat
    save_explainer(start, tmp_path / "aha-cell", {"base_model": "tiny-cell"})
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "cells.npz", train_images=rng.integers(0, 255, (6, 28, 28, 3), dtype=np.uint8),
             train_labels=rng.integers(0, 3, (6, 1)))
    args = argparse.Namespace(init=str(tmp_path / "aha-cell"), data=str(tmp_path / "cells.npz"), cells=6)
    student, _ = warm_start(bundle, args.init)
    encoded, predicted, goals = tool.kept_cell_maps(bundle, args, student)
    assert len(predicted) == 6 and goals.shape[0] == 6 and goals.std() > 0
    assert torch.equal(predicted, encoded.logits.argmax(1))
    with torch.no_grad():
        assert torch.allclose(standardise(student(encoded, predicted)), goals, atol=1e-5)
        student.head.conv2.weight.mul_(-1.0)  # the student moves; the goals, from the frozen copy, do not
        assert not torch.allclose(standardise(student(encoded, predicted)), goals, atol=1e-3)
    _, _, again = tool.kept_cell_maps(bundle, args, student)
    assert torch.allclose(again, goals, atol=1e-5)


def test_the_grid_student_ships_only_when_the_rule_is_met(tmp_path):
    import json

    tool = bench_script("aha_grid_distill")
    run, weights = tmp_path / "run", tmp_path / "weights"
    run.mkdir()
    weights.mkdir()
    student = run / "aha-grid-model"

    def write(gridpg, faithful):
        trace = [{"step": 0, "gridpg": 0.25, "faithful": True, "ins_minus_del": 0.43},
                 {"step": 800, "gridpg": gridpg, "faithful": faithful, "ins_minus_del": 0.42 if faithful else 0.2}]
        card = {"base_model": "grid-model", "architecture": {}, "distillation": {
            "floor": {"ins_minus_del": 0.35}, "exported_step": 800, "trace": trace,
            "command": f"python bench/aha_grid_distill.py train --data /data/root/bloodmnist/64 --out {run}/aha-grid-model",
            "segments": [{"from": 0, "to": 900, "seconds": 600.0}]}}
        (run / "aha-grid-model.json").write_text(json.dumps(card))
        (run / "aha-grid-model.safetensors").write_bytes(b"weights")

    def ship():
        return tool.main(["ship", "--student", str(student), "--weights-dir", str(weights), "--data-root", "/data/root",
                          "--run-dir", str(run)])

    write(0.50, True)
    with pytest.raises(SystemExit, match="not shipped"):  # below the bar
        ship()
    write(0.60, False)
    with pytest.raises(SystemExit, match="not shipped"):  # under the floor
        ship()
    assert not list(weights.iterdir())
    write(0.54, True)
    assert ship() == 0
    card = json.loads((weights / "aha-grid-model.json").read_text())
    assert (weights / "aha-grid-model.safetensors").read_bytes() == b"weights"
    assert card["distillation"]["command"].endswith("--data DATA/bloodmnist/64 --out RUN/aha-grid-model")
    assert str(tmp_path) not in json.dumps(card)
    assert card["distillation"]["shipped"]["steps"] == 900 and card["distillation"]["shipped"]["train_seconds"] == 600.0
    assert card["distillation"]["shipped"]["validation_at_export"]["gridpg"] == 0.54


def test_mean_with_ci_leaves_out_missing_scores_and_rounds_for_a_file():
    from explainers.statistics import mean_with_ci

    scores = mean_with_ci([1.0, None, 3.0, float("nan"), 2.0])
    assert scores["mean"] == 2.0 and scores["n"] == 3
    assert scores["ci95"] == bootstrap_ci([1.0, 3.0, 2.0])  # the same interval as the kept values' own
    rounded_scores = mean_with_ci([1 / 3, 2 / 3], digits=2)
    assert rounded_scores["mean"] == 0.5 and all(v == round(v, 2) for v in rounded_scores["ci95"])
    assert mean_with_ci([None]) == {"mean": None, "ci95": None, "n": 0}
    assert mean_with_ci([4.0])["ci95"] is None  # one value has no spread to resample
