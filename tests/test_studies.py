"""Review studies: the study code, blinding, uploads and their limits, results against hand computations, the
CLI report, and no verdict lost when a writer is killed with SIGKILL."""
import csv
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import tiny_vit, verdict_stats
from explainers.methods import METHODS
from explainers.review_report import EXPORT_COLUMNS, study_report, study_rows
from saliency_lab import datasets, review_data, studies
from saliency_lab.review_store import ReviewError, ReviewStore

ROOT = Path(__file__).resolve().parent.parent
CELLS = ROOT / "assets" / "bloodmnist"
METHODS3 = ["gradcam", "rollout", "chefer"]


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    folder = tmp_path / "user-data"
    monkeypatch.setenv("SALIENCY_DATA_DIR", str(folder))
    return folder


@pytest.fixture
def services(tmp_path, data_dir):
    import torch

    from saliency_lab.services import Services

    torch.set_num_threads(1)
    bundle = tiny_vit(num_classes=8)
    return Services(lambda name: bundle, ["tiny-vit"], tmp_path / "state")


def png(size=(16, 16), colour=(200, 30, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


# ------------------------------------------------------------------------------------------------ study code
def test_study_code_opens_and_a_wrong_code_shows_nothing(tmp_path):
    store = ReviewStore(tmp_path / "r.sqlite")
    code = store.create_study("s1", protocol="open", dataset="d", dataset_path="/x", model="m", methods=["gradcam"],
                              reviewers=["a"], class_names=["x"], items=[("i.png", 0, 0, 0, 0.9)])
    assert len(code) >= 16
    assert store.open_study("s1", code)["methods"] == ["gradcam"]
    for name, guess in (("s1", "wrong"), ("s1", ""), ("s1", code[:-1]), ("nope", code)):
        with pytest.raises(ReviewError) as refused:
            store.open_study(name, guess)
        assert str(refused.value) == "No study with this name and code."  # the same for name and code
    raw = (tmp_path / "r.sqlite").read_bytes() + (tmp_path / "r.sqlite-wal").read_bytes()
    assert code.encode() not in raw  # only a salted hash is stored
    with pytest.raises(ReviewError, match="exists already"):
        store.create_study("s1", protocol="open", dataset="d", dataset_path="/x", model="m", methods=["gradcam"],
                           reviewers=[], class_names=["x"], items=[("i.png", 0, 0, 0, 0.9)])


def test_wrong_code_gives_no_results_or_export(services):
    code, owner, _ = studies.create_study(services, "s2", "bloodmnist-cells", "tiny-vit", METHODS3[:2], ["a"], "blinded",
                                   count=3, seed=0)
    for call in (lambda: studies.study_results(services, "s2", code + "x"),
                 lambda: studies.export_study(services, "s2", "guess", "csv"),
                 lambda: studies.open_study(services, "s2", "guess", "a")):
        with pytest.raises(ReviewError, match="No study with this name and code"):
            call()
    with pytest.raises(ReviewError, match="not a reviewer"):
        studies.open_study(services, "s2", code, "intruder")


def test_only_the_owner_sees_results_until_the_owner_closes_the_study(services):
    code, owner, created = studies.create_study(services, "own", "bloodmnist-cells", "tiny-vit", METHODS3[:2],
                                                ["a"], "blinded", count=3, seed=0)
    assert owner != code and f"`{owner}`" in created and f"`{code}`" in created
    for call in (lambda: studies.study_results(services, "own", code, faithfulness=False, n_boot=20),
                 lambda: studies.export_study(services, "own", code, "csv")):
        with pytest.raises(ReviewError, match="only with its owner code"):
            call()  # the reviewers' code cannot unblind the study mid-way
    assert studies.study_results(services, "own", owner, faithfulness=False, n_boot=20).report["study"]["name"] == "own"
    with pytest.raises(ReviewError, match="No study with this name and code"):
        studies.open_study(services, "own", owner, "a")  # the owner code does not open it for reviewing
    state, _ = studies.open_study(services, "own", code, "a")
    assert studies.rate(services, studies.show_item(services, state, 0, "a").state, "a", "A", 4)
    with pytest.raises(ReviewError, match="Only the study's owner code"):
        studies.close_study(services, "own", code)
    assert "closed" in studies.close_study(services, "own", owner)
    with pytest.raises(ReviewError, match="is closed"):
        studies.rate(services, state, "a", "B", 2)  # responses are final
    # closed: the reviewers' code now shows the results, with the rating given before closing
    report = studies.study_results(services, "own", code, faithfulness=False, n_boot=20).report
    assert report["counts"]["per_reviewer"]["a"]["ratings"] == 1
    raw = services.store.path.read_bytes() + Path(str(services.store.path) + "-wal").read_bytes()
    assert owner.encode() not in raw  # the owner code is kept as a salted hash only


# ------------------------------------------------------------------------------------------------ blinding
def names_in(text: str) -> list:
    text = text.lower()
    found = []
    for name, cls in METHODS.items():
        for word in {name, getattr(cls, "label", name)}:
            if word and word.lower() in text:
                found.append(word)
    return found


def test_blinded_pages_carry_no_method_name_and_the_order_is_stored(services):
    code, owner, created = studies.create_study(services, "blind", "bloodmnist-cells", "tiny-vit", METHODS3, ["a", "b"],
                                         "blinded", count=8, seed=3)
    orders = [row["order"] for row in services.store.study_items("blind")]
    assert all(sorted(o) == sorted(METHODS3) for o in orders) and len({tuple(o) for o in orders}) > 1
    state, progress = studies.open_study(services, "blind", code, "a")
    seen = [progress]
    for position in range(8):
        shown = studies.show_item(services, state, position, "a")
        state = shown.state
        assert [c for _, c in shown.items] == ["Image %d" % (position + 1), "Map A", "Map B", "Map C"]
        seen += [shown.info, shown.progress, json.dumps(shown.response), *[f"{p} {c}" for p, c in shown.items]]
        for slot in shown.slots:
            seen += list(studies.rate(services, state, "a", slot, 3))
        seen += list(studies.pick_best(services, state, "a", "B"))
    assert names_in(" ".join(seen)) == []
    report = studies.study_results(services, "blind", owner, n_boot=50).report  # the reveal
    best = {m["method"]: m["best_picks"] for m in report["methods"]}
    assert best == {m: sum(1 for o in orders if o[1] == m) for m in METHODS3}  # slot B translated per image


# ------------------------------------------------------------------------------------------------ results
def open_study_with(tmp_path, verdicts_a, verdicts_b):
    store = ReviewStore(tmp_path / "r.sqlite")
    items = [(f"{i}.png", i, i % 2, i % 2, 0.8) for i in range(len(verdicts_a))]
    store.create_study("open", protocol="open", dataset="d", dataset_path="/x", model="m", methods=["gradcam"],
                       reviewers=["a", "b"], class_names=["x", "y"], items=items)
    for i, (va, vb) in enumerate(zip(verdicts_a, verdicts_b)):
        store.set_study_verdict("open", i, "a", va)
        store.set_study_verdict("open", i, "b", vb)
    return store


def test_open_study_agreement_matches_a_hand_computation(tmp_path):
    # both plausible 20, a plausible / b implausible 5, a implausible / b plausible 10, both implausible 15:
    # p_o = 0.7, p_e = 0.5 * 0.6 + 0.5 * 0.4 = 0.5 -> Cohen 0.4; Fleiss with 2 raters (Scott's pi):
    # p(plausible) = (25 + 30) / 100 = 0.55 -> p_e = 0.55^2 + 0.45^2 = 0.505 -> (0.7 - 0.505) / 0.495 = 0.3939
    a = ["plausible"] * 25 + ["implausible"] * 25
    b = ["plausible"] * 20 + ["implausible"] * 5 + ["plausible"] * 10 + ["implausible"] * 15
    store = open_study_with(tmp_path, a, b)
    report = study_report(store.path, "open", n_boot=200)
    pair = report["agreement"]["pairs"][0]
    assert (pair["a"], pair["b"], pair["images"]) == ("a", "b", 50)
    assert pair["kappa"] == pytest.approx(0.4, abs=1e-4) and pair["percent_agreement"] == pytest.approx(0.7)
    assert pair["ci95"][0] < 0.4 < pair["ci95"][1]
    assert report["agreement"]["fleiss"]["kappa"] == pytest.approx(0.3939, abs=1e-4)
    assert report["counts"]["per_reviewer"]["a"] == {"done": 50, "total": 50, "plausible": 25, "implausible": 25,
                                                      "unsure": 0, "notes": 0}
    assert study_report(store.path, "open", n_boot=200) == report  # seeded bootstrap: reproducible
    classes = {c["class"]: c for c in report["per_class"]}
    assert classes["x"]["images"] == 25 and sum(classes["x"]["verdicts"].values()) == 50


def test_blinded_report_by_hand(tmp_path):
    store = ReviewStore(tmp_path / "r.sqlite")
    items = [(f"{i}.png", i, 0, 0, 0.8) for i in range(3)]
    store.create_study("b", protocol="blinded", dataset="d", dataset_path="/x", model="m", methods=["m1", "m2"],
                       reviewers=["a", "b"], class_names=["x"], items=items, seed=0)
    orders = [row["order"] for row in store.study_items("b")]
    # ratings by method (translated to the stored slot of each image)
    given = {"a": {"m1": [5, 4, 3], "m2": [1, 2, 2]}, "b": {"m1": [4, 4, 3], "m2": [2, 2, 1]}}
    for reviewer, by_method in given.items():
        for i, order in enumerate(orders):
            for method, values in by_method.items():
                store.set_study_rating("b", i, reviewer, "AB"[order.index(method)], values[i])
            store.set_study_best("b", i, reviewer, "AB"[order.index("m1")])
    for i, ins in enumerate([(0.6, 0.5), (0.4, 0.7), (0.9, 0.1)]):
        store.save_faithfulness("b", i, "m1", 0.2, ins[0])
        store.save_faithfulness("b", i, "m2", 0.3, ins[1])
    report = study_report(store.path, "b", n_boot=200)
    methods = {m["method"]: m for m in report["methods"]}
    assert methods["m1"]["mean_rating"] == pytest.approx(23 / 6, abs=1e-3)
    assert methods["m2"]["mean_rating"] == pytest.approx(10 / 6, abs=1e-3)
    assert methods["m1"]["best_picks"] == 6 and methods["m2"]["best_picks"] == 0
    assert methods["m1"]["insertion_auc"] == pytest.approx((0.6 + 0.4 + 0.9) / 3, abs=1e-4)
    faith = report["faithfulness"]
    assert [e["match"] for e in faith["images"]] == [True, False, True] and faith["fraction"] == pytest.approx(0.667)
    # the pair's quadratically weighted kappa over the 6 maps, against scikit-learn
    sklearn = pytest.importorskip("sklearn.metrics")
    flat_a = [v for i in range(3) for v in (given["a"]["m1"][i], given["a"]["m2"][i])]
    flat_b = [v for i in range(3) for v in (given["b"]["m1"][i], given["b"]["m2"][i])]
    expected = sklearn.cohen_kappa_score(flat_a, flat_b, weights="quadratic", labels=[1, 2, 3, 4, 5])
    assert report["agreement"]["pairs"][0]["kappa"] == pytest.approx(expected, abs=1e-4)
    rows = study_rows(store.path, "b")
    assert len(rows) == 12 and {r["method"] for r in rows} == {"m1", "m2"}
    assert all(r["picked_best"] == ("yes" if r["method"] == "m1" else "") for r in rows)


def test_cli_review_report(tmp_path):
    store = open_study_with(tmp_path, ["plausible", "unsure", "implausible"], ["plausible", "unsure", "plausible"])
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "explainers", "review-report", "--db", str(store.path), "--study",
                           "open", "--out", str(out), "--bootstrap", "100", "--csv", str(tmp_path / "r.csv")],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text()) == study_report(store.path, "open", n_boot=100)
    with open(tmp_path / "r.csv", newline="", encoding="utf-8-sig") as handle:
        assert [r["verdict"] for r in csv.DictReader(handle)] == [r["verdict"] for r in study_rows(store.path, "open")]
    missing = subprocess.run([sys.executable, "-m", "explainers", "review-report", "--db", str(store.path),
                              "--study", "nope", "--out", str(out)], capture_output=True, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert missing.returncode == 2 and "No study named 'nope'" in missing.stderr


def test_open_protocol_end_to_end_and_exports(services):
    code, owner, _ = studies.create_study(services, "o", "bloodmnist-cells", "tiny-vit", ["gradcam"], "a, b", "open",
                                   count=4)
    for reviewer, verdicts in (("a", ["plausible", "implausible", "plausible", "unsure"]),
                               ("b", ["plausible", "plausible", "plausible", "unsure"])):
        state, progress = studies.open_study(services, "o", code, reviewer)
        assert progress.startswith("**0 of 4 done**")
        for position, verdict in enumerate(verdicts):
            state = studies.show_item(services, state, position, reviewer).state
            saved, progress = studies.record_verdict(services, state, reviewer, verdict, note=f"n{position}")
        assert progress.startswith("**4 of 4 done**")
    results = studies.study_results(services, "o", owner, n_boot=100)
    assert results.report["agreement"]["pairs"][0]["percent_agreement"] == pytest.approx(0.75)
    assert results.report["methods"][0]["faithfulness_images"] == 4
    assert "a – b" in results.summary and results.kappa_figure is not None
    path = studies.export_study(services, "o", owner, "csv")
    with open(path, newline="", encoding="utf-8-sig") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 8 and rows[0]["note"] == "n0"
    assert json.loads(Path(studies.export_study(services, "o", owner, "json")).read_text())["study"]["name"] == "o"


def test_csv_export_opens_cleanly_in_a_spreadsheet(services):
    """The CSV: a UTF-8 byte-order mark, one header row, RFC 4180 quoting with CRLF, ISO timestamps, no Python
    reprs; a note that is a formula is neutralised, one with a comma, quotes and a newline comes back whole."""
    import re

    code, owner, _ = studies.create_study(services, "sheet", "bloodmnist-cells", "tiny-vit", ["gradcam", "rollout"],
                                   "Dr. Müller, -b", "blinded", count=2, seed=3)
    tricky = 'nucleus, not "membrane"\nsecond line'
    for reviewer, note in (("Dr. Müller", "=SUM(A1)"), ("-b", tricky)):
        state, _ = studies.open_study(services, "sheet", code, reviewer)
        for position in range(2):
            state = studies.show_item(services, state, position, reviewer).state
            studies.rate(services, state, reviewer, "A", 4)
            studies.rate(services, state, reviewer, "B", 2)
            studies.pick_best(services, state, reviewer, "A")
            studies.save_note(services, state, reviewer, note)
    raw = Path(studies.export_study(services, "sheet", owner, "csv")).read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf") and raw.count(b"\xef\xbb\xbf") == 1
    assert raw.split(b"\r\n")[0].decode("utf-8-sig").split(",") == list(EXPORT_COLUMNS)
    text = raw.decode("utf-8-sig")
    assert "None" not in text and "{" not in text and "[" not in text and "nan" not in text.lower()
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    assert len(rows) == 2 * 2 * 2  # reviewers x images x maps
    by = {r["reviewer"]: r for r in rows}
    assert set(by) == {"Dr. Müller", "'-b"}  # a name that starts like a formula is neutralised too
    assert by["Dr. Müller"]["note"] == "'=SUM(A1)" and by["'-b"]["note"] == tricky
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", r["updated_utc"]) for r in rows)
    assert {r["rating"] for r in rows} == {"4", "2"} and {r["method"] for r in rows} == {"gradcam", "rollout"}
    assert sorted(r["picked_best"] for r in rows) == [""] * 4 + ["yes"] * 4
    pandas = pytest.importorskip("pandas")
    frame = pandas.read_csv(io.BytesIO(raw))
    assert list(frame.columns) == list(EXPORT_COLUMNS) and len(frame) == 8  # pandas strips the BOM itself
    assert sorted(frame["note"].unique()) == sorted(["'=SUM(A1)", tricky])
    assert frame["rating"].dtype.kind == "i" and frame["confidence"].between(0, 1).all()


def test_spreadsheet_cell_neutralises_formulas_only():
    from explainers.review_report import spreadsheet_cell

    assert [spreadsheet_cell(v) for v in ("=1+1", "+1", "-x", "@SUM(A1)", "\tx", "plain", "a=b")] == \
        ["'=1+1", "'+1", "'-x", "'@SUM(A1)", "'\tx", "plain", "a=b"]
    assert spreadsheet_cell(None) == "" and spreadsheet_cell(-0.5) == -0.5 and spreadsheet_cell(3) == 3


# ------------------------------------------------------------------------------------------------ uploads
def test_a_picked_folder_uses_its_labels_and_class_names_and_ignores_hidden_files(tmp_path, data_dir):
    """What a browser sends for a picked folder: every file in it, labels.csv, classes.txt and .DS_Store too."""
    folder = tmp_path / "picked"
    folder.mkdir()
    (folder / "a.png").write_bytes(png(colour=(10, 20, 30)))
    (folder / "b.png").write_bytes(png(colour=(200, 20, 30)))
    (folder / ".DS_Store").write_bytes(b"\x00\x01binary")
    (folder / "labels.csv").write_text("file,class_index\na.png,1\nb.png,0\n")
    (folder / "classes.txt").write_text("red cell\nblue cell\n")
    result = review_data.import_upload(sorted(folder.iterdir()), "picked-folder")
    assert (result.loaded, result.skipped, result.labelled) == (2, [], True)
    assert (result.folder / "classes.txt").read_text().split("\n")[:2] == ["red cell", "blue cell"]
    with open(result.folder / "labels.csv") as handle:
        assert sorted(r["class_index"] for r in csv.DictReader(handle)) == ["0", "1"]


def test_zip_upload_skips_bad_files_and_lands_in_the_data_folder(tmp_path, data_dir):
    archive = tmp_path / "cells.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("set/labels.csv", "file,class_index\na.png,0\nb.png,1\nbad.png,0\nmissing.png,1\nc.png,x\n")
        z.writestr("set/a.png", png())
        z.writestr("set/b.png", png(colour=(0, 0, 255)))
        z.writestr("set/bad.png", b"not an image at all")
        z.writestr("set/c.png", png())
        z.writestr("set/classes.txt", "neutrophil\nplatelet\n")
    result = review_data.import_upload([str(archive)], "ward-7")
    assert result.loaded == 2 and result.folder == data_dir / "datasets" / "ward-7"
    skipped = dict(result.skipped)
    assert set(skipped) == {"bad.png", "missing.png", "c.png"} and "not in the zip" in skipped["missing.png"]
    assert "2 images loaded" in result.message() and "3 skipped" in result.message()
    assert (result.folder / "classes.txt").read_text().split() == ["neutrophil", "platelet"]
    assert ("ward-7 (2 images)", "ward-7") in datasets.choices()  # the one catalogue lists the upload
    assert datasets.resolve("ward-7") == result.folder
    with pytest.raises(ReviewError, match="exists already"):
        review_data.import_upload([str(archive)], "ward-7")
    assert not [p for p in (data_dir / "datasets").iterdir() if p.name.startswith(".")]  # no leftovers


def test_upload_limits_and_names(tmp_path, data_dir):
    images = []
    for i in range(4):
        path = tmp_path / f"img{i}.png"
        path.write_bytes(png((64, 64) if i else (4, 4)))  # the first is below the minimum size
        images.append(str(path))
    with pytest.raises(ReviewError, match="4 images is over the limit of 3"):
        review_data.import_upload(images, "too-many", review_data.UploadLimits(max_files=3))
    result = review_data.import_upload(images, "unlabelled", review_data.UploadLimits(max_files=4))
    assert result.loaded == 3 and not result.labelled
    assert list(dict(result.skipped)) == ["img0.png"] and "too small" in dict(result.skipped)["img0.png"]
    with open(result.folder / "labels.csv") as handle:
        assert [r["class_index"] for r in csv.DictReader(handle)] == ["-1", "-1", "-1"]
    assert "predictions only" in result.message()
    small = review_data.UploadLimits(max_image_bytes=100)
    with pytest.raises(ReviewError, match="No usable image"):
        review_data.import_upload(images[1:2], "too-big", small)
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("labels.csv", "file,class_index\nz.png,0\n")
        z.writestr("z.png", b"\0" * 5_000_000)
    with pytest.raises(ReviewError, match="unpacks to"):
        review_data.import_upload([str(bomb)], "bomb", review_data.UploadLimits(max_total_bytes=1_000_000))
    for bad in ("../escape", "a/b", "", ".hidden"):
        with pytest.raises(ReviewError, match="use 1-64 letters"):
            review_data.import_upload(images, bad)
    with pytest.raises(ValueError, match="Pick a data set"):
        datasets.resolve("../../etc")
    nolabels = tmp_path / "nolabels.zip"
    with zipfile.ZipFile(nolabels, "w") as z:
        z.writestr("a.png", png())
    with pytest.raises(ReviewError, match="no labels.csv"):
        review_data.import_upload([str(nolabels)], "nolabels")
    assert sorted(p.name for p in (data_dir / "datasets").iterdir()) == ["unlabelled"]


def test_npz_upload(tmp_path, data_dir):
    path = tmp_path / "bloodmnist.npz"
    images = np.random.default_rng(0).integers(0, 255, size=(5, 28, 28, 3), dtype=np.uint8)
    np.savez(path, test_images=images, test_labels=np.arange(5).reshape(-1, 1) % 3)
    result = review_data.import_upload([str(path)], "npz-cells")
    assert result.loaded == 5
    stored = np.asarray(Image.open(result.folder / "test_00002.png"))
    assert np.array_equal(stored, images[2])
    np.savez(tmp_path / "odd.npz", something=images)
    with pytest.raises(ReviewError, match="MedMNIST layout"):
        review_data.import_upload([str(tmp_path / "odd.npz")], "odd")


# ------------------------------------------------------------------------------------------------ kill -9
WRITER = """
import sys
from saliency_lab.review_store import ReviewStore
store = ReviewStore(sys.argv[1])
i = 0
while True:
    store.set_study_rating("k", i % 200, "dr-%d" % (i // 200), "AB"[i % 2], 1 + i % 5)
    print(i, flush=True)   # acknowledged only after the commit returned
    i += 1
"""


def test_no_acknowledged_verdict_is_lost_on_sigkill(tmp_path):
    db = tmp_path / "r.sqlite"
    store = ReviewStore(db)
    store.create_study("k", protocol="blinded", dataset="d", dataset_path="/x", model="m", methods=["m1", "m2"],
                       reviewers=[], class_names=["x"], items=[(f"{i}.png", i, 0, 0, 0.5) for i in range(200)])
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    acknowledged = -1
    for line in writer.stdout:
        acknowledged = int(line)
        if acknowledged >= 300:
            break
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    assert writer.returncode == -signal.SIGKILL
    con = sqlite3.connect(db)
    stored = con.execute("SELECT COUNT(*) FROM study_ratings WHERE study='k'").fetchone()[0]
    assert stored >= acknowledged + 1  # every acknowledged write is there (one more may have committed)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


# ------------------------------------------------------------------------------------------------ score table
def blinded_with_scores(services, name, deletion, insertion):
    """A blinded study of len(deletion["m1"]) images whose stored deletion/insertion AUCs are the given ones."""
    n = len(next(iter(deletion.values())))
    code = services.store.create_study(name, protocol="blinded", dataset="d", dataset_path="/x", model="m",
                                       methods=list(deletion), reviewers=["a"], class_names=["x"],
                                       items=[(f"{i}.png", i, 0, 0, 0.9) for i in range(n)], seed=0)
    for method in deletion:
        for i in range(n):
            if deletion[method][i] is not None:
                services.store.save_faithfulness(name, i, method, deletion[method][i], insertion[method][i])
    return code


def test_study_score_table_intervals_and_significance_from_known_scores(services):
    from explainers.statistics import bootstrap_ci, format_interval
    from saliency_lab.figures import BEST_MARK, WORSE_MARK

    base = [0.10, 0.14, 0.11, 0.18, 0.12, 0.16, 0.13, 0.17]
    deletion = {"m1": base, "m2": [v + 0.05 for v in base]}  # m2 deletes worse on every image: significant
    ins = [0.6, 0.4, 0.7, 0.5, 0.65, 0.45, 0.55, 0.62]
    insertion = {"m1": ins, "m2": [v + (0.1 if i % 2 else -0.1) for i, v in enumerate(ins)]}  # mean gap 0: noise
    code = blinded_with_scores(services, "scored", deletion, insertion)
    results = studies.study_results(services, "scored", code, faithfulness=False, n_boot=500)
    rows = {row[0]: row[1:] for row in results.scores}
    expected = format_interval(float(np.mean(base)), bootstrap_ci(base, n_resamples=500, seed=0), 3)
    assert rows["m1"][0] == f"{expected} {BEST_MARK}"  # mean [low, high] of the stored per-image scores
    assert rows["m2"][0].endswith(f" {WORSE_MARK}")  # the paired difference is -0.05 on every image
    low, high = (float(x) for x in rows["m2"][0].split("[")[1].split("]")[0].split(","))
    assert low <= np.mean(deletion["m2"]) <= high and low < high
    assert not rows["m1"][1].endswith(WORSE_MARK) and not rows["m2"][1].endswith(WORSE_MARK)  # insertion: a tie
    summary = results.summary
    assert "**Faithfulness per method**" in summary and "8 images" in summary and expected in summary
    assert "excludes 0" in summary  # the legend says what the marks mean


def test_study_score_table_pairs_images_and_one_image_has_no_interval(services):
    deletion = {"m1": [0.1, 0.2, 0.3], "m2": [0.2, None, 0.4]}  # m2 has no map of image 1: left out for both
    insertion = {"m1": [0.5, 0.6, 0.7], "m2": [0.4, None, 0.6]}
    code = blinded_with_scores(services, "paired", deletion, insertion)
    results = studies.study_results(services, "paired", code, faithfulness=False, n_boot=200)
    per_image, images = studies.faithfulness_scores(results.report)
    assert images == 2 and per_image["m1"]["deletion_auc"] == [0.1, 0.3] and per_image["m2"]["deletion_auc"] == [0.2, 0.4]
    assert "2 images (of 3" in results.summary
    code = blinded_with_scores(services, "single", {"m1": [0.1], "m2": [0.3]}, {"m1": [0.5], "m2": [0.6]})
    results = studies.study_results(services, "single", code, faithfulness=False, n_boot=200)
    assert [row[1] for row in results.scores] == ["0.100", "0.300"]  # one image: the means, nothing marked
    assert "[" not in "".join(row[1] for row in results.scores) and "excludes 0" not in results.summary


def test_a_study_of_images_unlike_the_models_training_images_says_so(services):
    """Creating a study predicts its images once; where the model has familiarity statistics the same pass counts
    the unfamiliar images and the creation message names them; without statistics nothing is said."""
    from explainers import familiarity

    bundle = services.bundle("tiny-vit")
    _, _, plain = studies.create_study(services, "plain", "bloodmnist-cells", "tiny-vit", ["gradcam"], ["a"], "open",
                                    count=6)
    assert "do not look like" not in plain
    try:
        familiarity.register_stats(bundle, verdict_stats(bundle, flag_all=True))
        _, _, flagged = studies.create_study(services, "odd", "bloodmnist-cells", "tiny-vit", ["gradcam"], ["a"], "open",
                                          count=6)
    finally:
        familiarity.register_stats(bundle, None)
    assert "**6 of 6 images do not look like the images tiny-vit learned from**" in flagged
    assert ", ..." in flagged and flagged.count(".jpg") == 5  # the first five named
    rows = services.store.study_items("odd")
    assert len(rows) == 6  # the study itself is created as before


def test_agreement_on_too_few_images_says_so(tmp_path):
    """Below MIN_AGREEMENT_IMAGES the report keeps kappa for the record but gives no interval, and the summary
    says "too few images" instead of figures that read as a finding ("kappa 0.65 [0.57, 0.65]")."""
    from explainers.review_report import MIN_AGREEMENT_IMAGES
    from saliency_lab.studies import summary_markdown

    few = MIN_AGREEMENT_IMAGES - 1
    store = open_study_with(tmp_path, ["plausible", "implausible"] * 5, ["plausible", "plausible"] * 5)
    enough = study_report(store.path, "open", n_boot=50)
    pair = enough["agreement"]["pairs"][0]
    assert pair["images"] == 10 >= MIN_AGREEMENT_IMAGES and not pair["too_few"] and pair["ci95"][0] is not None
    assert "too few images" not in summary_markdown(enough)

    store = open_study_with(tmp_path / "few", ["plausible", "implausible"] * 4 + ["unsure"],
                            ["plausible", "plausible"] * 4 + ["unsure"])
    report = study_report(store.path, "open", n_boot=50)
    pair, fleiss = report["agreement"]["pairs"][0], report["agreement"]["fleiss"]
    assert pair["images"] == few and pair["too_few"] and pair["ci95"] == [None, None]
    assert pair["kappa"] is not None  # kept in the JSON for the record
    assert fleiss["too_few"] and fleiss["ci95"] == [None, None]
    text = summary_markdown(report)
    assert text.count(f"too few images (fewer than {MIN_AGREEMENT_IMAGES})") == 2  # the pair and Fleiss
    assert f"{pair['kappa']:.2f}" not in text.split("**Agreement**")[1].split("\n\n")[1]
