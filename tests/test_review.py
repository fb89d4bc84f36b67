"""ReviewStore: verdicts, notes, progress, CSV export, cached predictions and mask sets in SQLite."""
import csv
import threading

import numpy as np
import pytest
from PIL import Image

from saliency_lab.review_store import ReviewError, ReviewStore


@pytest.fixture
def store(tmp_path):
    return ReviewStore(tmp_path / "review.sqlite")


def test_verdict_and_note_are_independent_and_persist(tmp_path, store):
    store.set_note("ds", "a.png", "first thoughts", reviewer="dr-a")
    store.set_verdict("ds", "a.png", "plausible", reviewer="dr-a", model="m", label="x", prediction="y",
                      confidence=0.9, methods=["gradcam", "aha"])
    store.set_note("ds", "a.png", "nucleus highlighted", reviewer="dr-a")
    row = store.get("ds", "a.png", "dr-a")
    assert row["verdict"] == "plausible" and row["note"] == "nucleus highlighted" and row["methods"] == "gradcam,aha"
    store.set_verdict("ds", "a.png", "unsure", reviewer="dr-a")
    assert store.get("ds", "a.png", "dr-a")["note"] == "nucleus highlighted"  # a verdict keeps the note
    reopened = ReviewStore(tmp_path / "review.sqlite")  # a restart (or a crash) loses nothing
    assert reopened.get("ds", "a.png", "dr-a")["verdict"] == "unsure"
    assert reopened.get("ds", "a.png", "dr-b") is None  # reviewers are separate


def test_bad_input_is_refused_with_a_message(store):
    with pytest.raises(ReviewError, match="Unknown verdict"):
        store.set_verdict("ds", "a.png", "maybe")
    with pytest.raises(ReviewError, match="image id"):
        store.set_verdict("ds", "", "plausible")
    with pytest.raises(ReviewError, match="too long"):
        store.set_note("ds", "a.png", "x" * 20_001)


def test_progress_and_export(tmp_path, store):
    store.save_predictions("ds", "m", [(f"{i}.png", i, i % 2, 0, 0.5 + i / 100) for i in range(10)])
    assert store.progress("ds", "dr-a") == (0, 10)
    store.set_verdict("ds", "1.png", "implausible", reviewer="dr-a")
    store.set_note("ds", "2.png", "note only", reviewer="dr-a")  # a note alone is not a review
    assert store.progress("ds", "dr-a") == (1, 10)
    path = store.export_csv(tmp_path / "out" / "verdicts.csv", dataset="ds")
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["item"] for r in rows] == ["1.png", "2.png"]
    assert rows[0]["verdict"] == "implausible" and rows[1]["note"] == "note only" and rows[1]["verdict"] == ""
    assert [p["item"] for p in store.predictions("ds", "m")][:3] == ["0.png", "1.png", "2.png"]


def test_concurrent_writers(store):
    def work(k):
        for i in range(20):
            store.set_note("ds", f"{k}-{i}.png", f"note {i}", reviewer=f"r{k}")
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(store.verdicts("ds")) == 80


def test_mask_sets(tmp_path, store):
    image = Image.new("RGB", (16, 12), (200, 100, 50))
    mask = np.zeros((12, 16), bool)
    mask[2:8, 3:9] = True
    first = store.add_mask("my-set", image, mask, "3", source="SAM ViT-B")
    store.add_mask("my-set", np.asarray(image), mask, -1)
    assert store.mask_sets() == [("my-set", 2)]
    picture, loaded, label = store.mask_item(first)
    assert picture.size == (16, 12) and (loaded == mask).all() and label == "3"
    with pytest.raises(ReviewError, match="empty"):
        store.add_mask("my-set", image, np.zeros((12, 16), bool), 1)
    with pytest.raises(ReviewError, match="whole image"):
        store.add_mask("my-set", image, np.ones((12, 16), bool), 1)
    with pytest.raises(ReviewError, match="16 x 12"):
        store.add_mask("my-set", image, np.ones((8, 8), bool), 1)
    with pytest.raises(ReviewError, match="class label"):
        store.add_mask("my-set", image, mask, "")
    with pytest.raises(ReviewError, match="name"):
        store.add_mask("../evil", image, mask, 1)

    from explainers.masks import load_mask_set

    folder = store.export_mask_set("my-set", tmp_path / "exported")
    data = load_mask_set(folder)
    assert len(data) == 2 and data.labels.tolist() == [3, -1]
    assert data.masks[0].numpy().sum() == mask.sum()
    store.delete_mask(first)
    assert store.mask_sets() == [("my-set", 1)]


def test_an_old_database_gains_the_familiarity_column_and_keeps_its_rows(tmp_path):
    """A review database made before the familiarity check opens: the new column is added, old rows read None."""
    import sqlite3

    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE predictions (dataset TEXT NOT NULL, model TEXT NOT NULL, item TEXT NOT NULL, "
                    "position INTEGER NOT NULL, label INTEGER, prediction INTEGER NOT NULL, confidence REAL NOT NULL, "
                    "updated REAL NOT NULL, PRIMARY KEY (dataset, model, item))")
        con.execute("INSERT INTO predictions VALUES ('ds', 'm', 'a.png', 0, 1, 1, 0.9, 0)")
    store = ReviewStore(path)
    assert store.predictions("ds", "m") == [{"item": "a.png", "position": 0, "label": 1, "prediction": 1,
                                              "confidence": 0.9, "unfamiliar": None}]
    store.save_predictions("ds", "m", [("b.png", 1, 0, 0, 0.5)], unfamiliar=[True])
    assert [p["unfamiliar"] for p in store.predictions("ds", "m")] == [None, 1]
    ReviewStore(path)  # opening again changes nothing


def test_the_review_gallery_marks_images_unlike_the_models_training_images(tmp_path, monkeypatch):
    """Loading a data set for review reads each image's familiarity in its one prediction pass: the warning counts
    them, their thumbnails carry ⚠, and rows cached before the check (unfamiliar unknown) are predicted again."""
    from conftest import tiny_vit, verdict_stats
    from explainers import familiarity
    from saliency_lab import review
    from saliency_lab.services import Services

    monkeypatch.setenv("SALIENCY_DATA_DIR", str(tmp_path / "data"))
    bundle = tiny_vit(num_classes=8)
    services = Services(lambda name: bundle, ["tiny-vit"], tmp_path / "state")
    state, warning = review.load_review(services, "bloodmnist-cells", "tiny-vit", 6)
    assert warning is None and all(r["unfamiliar"] is None for r in state["rows"])  # no statistics: not checked
    try:
        familiarity.register_stats(bundle, verdict_stats(bundle, flag_all=True))
        state, warning = review.load_review(services, "bloodmnist-cells", "tiny-vit", 6)
        page = review.filter_page(services, state)
    finally:
        familiarity.register_stats(bundle, None)
    assert "6 of these 6 images do not look like the images tiny-vit learned from" in warning
    assert all(r["unfamiliar"] == 1 for r in state["rows"])  # the cached rows were predicted again
    assert all(caption.startswith("⚠ ") for _, caption in page.items)
