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
