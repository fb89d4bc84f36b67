"""The command line, end to end, on a tiny model registered in-process and on tiny data the test writes."""
import json

import numpy as np
import pytest
from PIL import Image

from explainers import models
from explainers.cli import main
from explainers.methods import METHODS

from conftest import DATA_DIR, same, tiny_cnn, tiny_vit


@pytest.fixture
def registered():
    vit = models.register_bundle(tiny_vit(name="cli-tiny-vit", num_classes=4))
    cnn = models.register_bundle(tiny_cnn(name="cli-tiny-cnn"))
    return vit, cnn


def test_evaluate_writes_the_documented_json(tiny_folder, tmp_path, registered, capsys):
    out = tmp_path / "report.json"
    code = main(["evaluate", "--model", "cli-tiny-vit", "--methods", "gradcam,rollout,chefer,rise,random",
                 "--data", str(tiny_folder), "--limit", "5", "--steps", "10", "--rise-masks", "50",
                 "--out", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["model"] == "cli-tiny-vit" and report["n_images"] == 5
    assert 0 <= report["accuracy"] <= 1
    assert report["protocol"]["steps"] == 10 and report["protocol"]["reference"] == "mean"
    for method in ("gradcam", "rollout", "chefer", "rise", "random"):
        row = report["methods"][method]
        assert set(row) >= {"deletion_auc", "insertion_auc", "ins_minus_del", "pointing_game", "ms_per_image"}
        assert 0 <= row["deletion_auc"] <= 1 and 0 <= row["insertion_auc"] <= 1
        assert row["ins_minus_del"] == pytest.approx(row["insertion_auc"] - row["deletion_auc"])
        assert row["pointing_game"] is None and row["ms_per_image"] > 0
        assert len(row["per_image"]["deletion_auc"]) == 5 and len(row["per_image"]["insertion_auc"]) == 5
        assert row["deletion_auc"] == pytest.approx(np.mean(row["per_image"]["deletion_auc"]))
        for key, mean in (("deletion_auc_ci95", "deletion_auc"), ("insertion_auc_ci95", "insertion_auc"),
                          ("ins_minus_del_ci95", "ins_minus_del")):
            low, high = row[key]
            assert low <= row[mean] <= high
    # the five images of an even spread over six (labels.csv order), by name
    assert report["files"] == ["cell_0.jpg", "cell_1.jpg", "cell_2.jpg", "cell_4.jpg", "cell_5.jpg"]
    table = capsys.readouterr().out
    assert "deletion (lower better)" in table and "chefer" in table and "[" in table


def test_evaluate_compare_prints_and_stores_the_paired_interval(tiny_folder, tmp_path, registered, capsys):
    out = tmp_path / "report.json"
    assert main(["evaluate", "--model", "cli-tiny-cnn", "--methods", "gradcam,random", "--data", str(tiny_folder),
                 "--steps", "5", "--compare", "gradcam,random", "--compare", "random,random", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    first, same = report["comparisons"]
    assert (first["a"], first["b"]) == ("gradcam", "random")
    a, b = (report["methods"][m]["per_image"] for m in ("gradcam", "random"))
    assert first["deletion_auc"]["mean"] == pytest.approx(np.mean(np.subtract(a["deletion_auc"], b["deletion_auc"])))
    low, high = first["insertion_auc"]["ci95"]
    assert low <= first["insertion_auc"]["mean"] <= high
    assert same["deletion_auc"]["ci95"] == [0.0, 0.0] and not same["deletion_auc"]["significant"]
    printed = capsys.readouterr().out
    assert "gradcam - random" in printed and "random - random" in printed
    assert main(["evaluate", "--model", "cli-tiny-cnn", "--methods", "gradcam", "--data", str(tiny_folder),
                 "--limit", "2", "--steps", "2", "--compare", "gradcam,rise"]) == 2
    assert "not among the evaluated methods" in capsys.readouterr().err


def test_evaluate_takes_a_folder_without_labels_and_reads_files_as_uploads(tiny_folder, tmp_path, registered,
                                                                           capsys):
    """Targets are the predictions, so a plain folder of images is evaluated (accuracy: none) with the same scores as
    the labelled folder of the same files; an EXIF-rotated photo is read upright, as the app reads its upload."""
    import shutil

    from explainers.data import UNLABELLED, open_dataset
    from explainers.images import load_image

    plain = tmp_path / "plain"
    plain.mkdir()
    for c in range(6):
        shutil.copy(tiny_folder / f"cell_{c}.jpg", plain / f"cell_{c}.jpg")
    (plain / "notes.txt").write_text("not an image")
    reports = []
    for folder in (tiny_folder, plain):
        out = tmp_path / f"{folder.name}.json"
        assert main(["evaluate", "--model", "cli-tiny-cnn", "--methods", "gradcam", "--data", str(folder),
                     "--steps", "4", "--out", str(out)]) == 0
        reports.append(json.loads(out.read_text()))
    labelled, unlabelled = reports
    assert labelled["labelled_images"] == 6 and 0 <= labelled["accuracy"] <= 1
    assert labelled["protocol"]["split"] is None  # a folder given itself: no split named that was not read
    assert unlabelled["accuracy"] is None and unlabelled["labelled_images"] == 0
    assert unlabelled["files"] == [f"cell_{c}.jpg" for c in range(6)]  # the images only, in name order
    assert unlabelled["methods"]["gradcam"]["per_image"] == labelled["methods"]["gradcam"]["per_image"]
    assert "no labels" in capsys.readouterr().out
    # EXIF orientation 6 (turn 90 degrees): the data set gives the upright picture load_image gives the app
    wide = Image.fromarray(np.arange(24 * 40 * 3, dtype=np.uint8).reshape(24, 40, 3))
    exif = Image.Exif()
    exif[274] = 6
    wide.save(plain / "turned.jpg", exif=exif.tobytes())
    dataset = open_dataset(plain, require_labels=False)
    index = [name for name, _ in dataset.items].index("turned.jpg")
    assert dataset.labels[index] == UNLABELLED and dataset.image(index).size == (24, 40)
    assert np.array_equal(np.asarray(dataset.image(index)), np.asarray(load_image(plain / "turned.jpg")))
    with pytest.raises(FileNotFoundError, match="no labels.csv"):
        open_dataset(plain)  # training needs labels: still refused there
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["evaluate", "--model", "cli-tiny-cnn", "--methods", "gradcam", "--data", str(empty)]) == 2
    assert "no labels.csv and no images" in capsys.readouterr().err


def test_evaluate_reads_medmnist_npz(tmp_path, registered):
    images = np.stack([np.asarray(Image.open(f"{DATA_DIR}/cell_{c}.jpg").resize((32, 32))) for c in range(4)])
    np.savez(tmp_path / "blood.npz", test_images=images, test_labels=np.arange(4).reshape(4, 1))
    out = tmp_path / "npz.json"
    assert main(["evaluate", "--model", "cli-tiny-cnn", "--methods", "gradcam,random", "--data",
                 str(tmp_path / "blood.npz"), "--split", "test", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["n_images"] == 4 and report["files"] == [f"test_images[{i}]" for i in range(4)]


def test_explain_writes_overlay_and_npy(tmp_path, registered, capsys):
    png, npy = tmp_path / "overlay.png", tmp_path / "map.npy"
    assert main(["explain", "--model", "cli-tiny-cnn", "--method", "gradcam", "--image",
                 f"{DATA_DIR}/cell_3.jpg", "--out", str(png)]) == 0
    assert Image.open(png).size == (64, 64)
    assert main(["explain", "--model", "cli-tiny-vit", "--method", "chefer", "--image",
                 f"{DATA_DIR}/cell_3.jpg", "--target", "2", "--out", str(npy)]) == 0
    attribution = np.load(npy)
    assert attribution.shape == (64, 64) and np.isfinite(attribution).all() and attribution.max() > 0
    printed = capsys.readouterr().out
    assert "deletion AUC" in printed and "note:" not in printed  # a plain JPEG: nothing to say
    cell = Image.open(f"{DATA_DIR}/cell_3.jpg").convert("RGB")
    cell.save(tmp_path / "two.gif", save_all=True, append_images=[cell.rotate(90)])
    assert main(["explain", "--model", "cli-tiny-cnn", "--method", "gradcam", "--image", str(tmp_path / "two.gif"),
                 "--out", str(png)]) == 0
    assert "note: This file has 2 frames" in capsys.readouterr().out  # an animation: only its first frame


def test_explain_several_methods_into_a_folder_writes_the_apps_download(tmp_path, registered, capsys):
    """--out FOLDER: an overlay per method, curves.csv and report.json, the same files as the app's download (one
    engine.write_downloads), with the options given per method; one file for several methods is refused."""
    out = tmp_path / "explained"
    assert main(["explain", "--model", "cli-tiny-vit", "--method", "gradcam,gradskip:alpha=0.2,rollout", "--image",
                 f"{DATA_DIR}/cell_3.jpg", "--out", str(out), "--colormap", "gray"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["curves.csv", "overlay-gradcam.png", "overlay-gradskip.png",
                                                     "overlay-rollout.png", "report.json"]
    report = json.loads((out / "report.json").read_text())
    assert [m["method"] for m in report["methods"]] == ["gradcam", "gradskip", "rollout"]
    assert report["methods"][1]["options"]["alpha"] == 0.2 and report["overlay"]["colormap"] == "gray"
    assert report["image"] == "cell_3.jpg" and report["familiarity"] is None  # no statistics for this model
    assert Image.open(out / "overlay-gradcam.png").size == Image.open(f"{DATA_DIR}/cell_3.jpg").size
    rows = (out / "curves.csv").read_text().splitlines()
    assert rows[0].startswith("method,options,target") and len(rows) == 1 + 3 * 21
    capsys.readouterr()
    assert main(["explain", "--model", "cli-tiny-vit", "--method", "gradcam,rollout", "--image",
                 f"{DATA_DIR}/cell_3.jpg", "--out", str(tmp_path / "one.png")]) == 2
    assert "give a folder" in capsys.readouterr().err
    assert main(["explain", "--model", "cli-tiny-vit", "--method", "gradcam,gradcam:x=1", "--image",
                 f"{DATA_DIR}/cell_3.jpg", "--out", str(out)]) == 2
    assert "names a method twice" in capsys.readouterr().err
    assert main(["explain", "--model", "cli-tiny-vit", "--method", "gradcam", "--image", f"{DATA_DIR}/cell_3.jpg",
                 "--out", str(tmp_path / "overlay.jpg")]) == 2  # not silently a folder named overlay.jpg
    assert "give FILE.png (overlay), FILE.npy (map) or a folder" in capsys.readouterr().err
    assert not (tmp_path / "overlay.jpg").exists()


def test_clear_errors_not_tracebacks(tmp_path, registered, capsys):
    bad = tmp_path / "not-an-image.png"
    bad.write_text("hello")
    assert main(["explain", "--model", "cli-tiny-cnn", "--method", "gradcam", "--image", str(bad),
                 "--out", str(tmp_path / "x.png")]) == 2
    assert "error:" in capsys.readouterr().err
    assert main(["explain", "--model", "cli-tiny-cnn", "--method", "rollout", "--image",
                 f"{DATA_DIR}/cell_0.jpg", "--out", str(tmp_path / "x.png")]) == 2
    assert "cannot explain" in capsys.readouterr().err
    assert main(["evaluate", "--model", "cli-tiny-cnn", "--methods", "gradcam", "--data",
                 str(tmp_path / "missing")]) == 2
    capsys.readouterr()
    assert main(["aha-output-blur", "--model", "cli-tiny-cnn", "--val-data", str(tmp_path), "--dry-run"]) == 2
    assert "no trained AHA explainer for 'cli-tiny-cnn'" in capsys.readouterr().err  # not a traceback


def test_torchrun_two_processes_write_the_report_of_one(tiny_folder, tmp_path):
    """`torchrun --nproc-per-node 2 -m explainers evaluate` (gloo) gathers the same per-image results."""
    from conftest import cli_in_one_and_two_processes

    a, b = cli_in_one_and_two_processes(
        tmp_path, "ddp-tiny-vit", ["evaluate", "--model", "ddp-tiny-vit", "--methods", "gradcam,rollout,random",
                                   "--data", str(tiny_folder), "--steps", "4", "--batch-size", "2", "--threads", "1"],
        "ms_per_image")
    assert a["files"] == b["files"] and len(a["files"]) == 6
    for method in ("gradcam", "rollout", "random"):  # random too: whole batches go to a process
        for key in ("deletion_auc", "insertion_auc"):
            assert np.allclose(a["methods"][method]["per_image"][key], b["methods"][method]["per_image"][key],
                               atol=1e-6)
    same(a, b)  # everything else: the same report (floats to 1e-6: summation order within a batch)


def test_evaluate_with_the_road_reference(tiny_folder, tmp_path, registered):
    pytest.importorskip("pytorch_grad_cam")
    out = tmp_path / "road.json"
    assert main(["evaluate", "--model", "cli-tiny-cnn", "--methods", "gradcam", "--data", str(tiny_folder),
                 "--limit", "2", "--steps", "4", "--reference", "road", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["protocol"]["reference"] == "road" and len(report["methods"]["gradcam"]["per_image"]["deletion_auc"]) == 2


def test_method_specs_keep_several_options_of_one_method_together():
    from explainers.methods import parse_method_spec, split_method_specs

    specs = split_method_specs("gradskip:attention_weighting=gradient,alpha=1,rollout, aha:refine_steps=3,gradcam")
    assert specs == ["gradskip:attention_weighting=gradient,alpha=1", "rollout", "aha:refine_steps=3", "gradcam"]
    assert parse_method_spec(specs[0])[1] == {"attention_weighting": "gradient", "alpha": 1}
    assert split_method_specs("random,,chefer") == ["random", "chefer"]


def test_every_declared_method_option_is_a_flag_and_its_range_is_the_methods():
    """The flags are made from the methods' declared options: each one parses into {method: {option: value}}, and
    a value outside the declared range is refused by the method itself, in words, with exit code 2."""
    from explainers.cli import _method_options, _option_flags, build_parser

    flags = _option_flags()
    declared = {(name, option.name) for name, cls in METHODS.items() for option in cls.declared_options()}
    assert {(name, option.name) for name, option, _, _ in flags} == declared
    assert {"refine-steps", "alpha", "rise-masks"} <= {flag for _, _, flag, _ in flags}  # the documented names
    parser = build_parser()
    for name, option, flag, _ in flags:
        args = parser.parse_args(["evaluate", "--model", "m", "--methods", name, "--data", "d",
                                  f"--{flag}", str(option.kind(option.maximum))])
        assert _method_options(args) == {name: {option.name: option.kind(option.maximum)}}


def test_a_flag_outside_its_declared_range_is_refused_in_words(tiny_folder, registered, capsys):
    assert main(["evaluate", "--model", "cli-tiny-cnn", "--methods", "rise", "--data", str(tiny_folder),
                 "--limit", "1", "--rise-masks", "0"]) == 2
    error = capsys.readouterr().err
    assert "n_masks must be between 1 and 100000, got 0" in error and "Traceback" not in error


def test_the_tables_take_their_headings_from_the_metric_declarations():
    from explainers.evaluate import format_table
    from explainers.gridpg import format_gridpg
    from explainers.metrics import METRICS

    row = {"deletion_auc": 0.2, "insertion_auc": 0.6, "ins_minus_del": 0.4, "pointing_game": None,
           "ms_per_image": 1.0}
    table = format_table({"model": "m", "n_images": 1, "accuracy": None, "methods": {"gradcam": row},
                          "protocol": {"reference": "mean", "steps": 4}})
    for key in ("deletion_auc", "insertion_auc", "ins_minus_del", "pointing_game"):
        assert METRICS[key].heading() in table
    assert "deletion (lower better)" in table and "insertion (higher better)" in table
    grid = format_gridpg({"model": "m", "n_mosaics": 1, "mosaic_size": [8, 8], "model_top4_recall": 1.0,
                          "model_quadrant_sensitivity": {"mean": 0.1, "ci95": None, "share_positive": 1.0},
                          "methods": {"gradcam": {"gridpg": 0.5, "gridpg_ci95": None, "top_quarter": 0.5,
                                                  "top_quarter_ci95": None, "ms_per_map": 1.0}}})
    assert "GridPG (higher better)" in grid and METRICS["top_quarter"].heading() in grid


def test_split_read_names_only_a_split_that_was_read(tmp_path):
    """A report names the split only where `open_dataset` read one: a .npz's, or a `split` sub-folder's."""
    from explainers.data import split_read

    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "labels.csv").write_text("file,label\n")
    assert split_read(tmp_path, "test") == "test"
    assert split_read(tmp_path / "test", "val") is None
    assert split_read(tmp_path / "cells.npz", "val") == "val"
