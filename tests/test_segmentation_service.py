"""The segmentation view's service layer and tab: prediction overlay and legend, regions from a class, a click or
a drawing, each method's IoU / PA and curves, and bad input answered in plain words."""
import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from explainers.images import ImageError  # noqa: E402
from explainers.segmentation.targets import RegionError  # noqa: E402
from saliency_lab.segmentation import (SegmentationView, copy_caption, example_mask, examples,  # noqa: E402
                                       scores_markdown)
from conftest import tiny_segformer  # noqa: E402


@pytest.fixture(scope="module")
def view():
    return SegmentationView(tiny_segformer("tiny-seg-view", size=(32, 64)))


def photo(height=120, width=240, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def shown_with_region(view, seed=0, class_name="square", box=(8, 24, 16, 48), **predict):
    """A smear shown with its prediction set by hand: one class over `box` (rows, rows, cols, cols), the rest
    background; and that class's region target."""
    shown = view.predict(photo(seed=seed), **predict)
    shown.prediction = torch.zeros(32, 64, dtype=torch.long)
    top, bottom, left, right = box
    shown.prediction[top:bottom, left:right] = view.bundle.class_names.index(class_name)
    return shown, view.region(shown, class_name=class_name)


def test_prediction_overlay_and_legend(view):
    shown = view.predict(photo())
    assert shown.image.shape == (1, 3, 32, 64) and shown.overlay.shape == (32, 64, 3)
    assert [name for name, _, _ in shown.legend] == ["background", "round", "square"]
    assert abs(sum(share for _, _, share in shown.legend) - 1) < 1e-6
    assert "round" in view.legend_markdown(shown)


def test_a_huge_photo_is_reduced_with_a_note_and_a_giant_one_refused(view):
    shown = view.predict(photo(1200, 2400))
    assert any("reduced to 64 x 32" in note for note in shown.notes)
    with pytest.raises(ImageError, match="too large"):
        view.predict(np.zeros((7000, 7000, 3), np.uint8))  # 49 MP: over the loader's limit


def test_regions_from_a_class_a_click_and_a_drawing(view):
    shown = view.predict(photo())
    shown.prediction = torch.zeros(32, 64, dtype=torch.long)
    shown.prediction[4:12, 8:20] = 2
    target = view.region(shown, class_name="square")
    assert int(target.classes[0]) == 2 and int(target.areas[0]) == 96
    clicked = view.region(shown, click=(10, 6))  # (x, y)
    assert int(clicked.areas[0]) == 96
    with pytest.raises(RegionError, match="background"):
        view.region(shown, click=(50, 30))
    with pytest.raises(RegionError, match="predicts no round"):
        view.region(shown, class_name="round")  # an empty predicted region
    drawing = np.zeros((32, 64), np.uint8)
    drawing[20:30, 40:60] = 255
    assert int(view.region(shown, class_name="round", drawing=drawing).areas[0]) == 200
    with pytest.raises(RegionError, match="empty"):
        view.region(shown, class_name="round", drawing=np.zeros((32, 64)))


def test_explain_gives_maps_scores_and_curves(view):
    shown, target = shown_with_region(view, truth=np.full((32, 64), 2, np.uint8))
    records = view.explain(shown, target, ["gradskip", "gradcam", "intgrad", "random"], curve_steps=4)
    assert [r["method"] for r in records] == ["gradskip", "gradcam", "intgrad", "random"]
    for record in records:
        assert record["overlay"].shape == (32, 64, 3) and record["map"].shape == (32, 64)
        assert 0 <= record["iou_predicted"] <= 1 and 0 <= record["pa_predicted"] <= 1
        assert 0 <= record["iou_truth"] <= 1 and len(record["deletion"]) == 5
    table = scores_markdown(records)
    assert "| IoU truth |" in table and "against the predicted region" in table
    assert "| Grad\u2011CAM |" in table  # the method's name is never broken at its hyphen
    assert len([line for line in table.splitlines() if line.startswith("|")]) == 6  # header, rule, 4 methods
    reference = view.context(shown, target, records, steps=3)
    region = target.masks[0]
    for record in records:
        assert len(record["outside_deletion"]) == 4 and 0 <= record["outside_auc"] <= 1
        assert 0 <= record["mass_outside"] <= 1
        # context only: nothing of the map is left inside the region; the region's outline is drawn in black
        assert (record["overlay_context"][region.numpy()] != record["overlay"][region.numpy()]).any()
    # white edges: the above-mean pixels' outline, drawn for every map but the pixel-level ones' (integrated
    # gradients', GradSkip's with its pixel step: their above-mean pixels are scattered), whose overlay is the blend
    white = {r["method"]: int((r["overlay"] == 255).all(axis=-1).sum()) for r in records}
    assert white["intgrad"] == 0 and white["gradskip"] == 0 and white["gradcam"] > 0
    assert reference["copy_iou"] > 0.8  # a copy of the region matches the region: the IoU column cannot tell
    assert set(reference["auc"]) == {"a copy of the region", "random order", "nearest first"}
    assert "copies the region" in copy_caption(reference) and "| Out del. ↓ |" in scores_markdown(records)
    with pytest.raises(ValueError, match="at least one"):
        view.explain(shown, target, [])


def test_curves_on_model_copies_match_and_never_touch_the_shared_model(view):
    """With the app's pool of model copies the curves run beside the next map, on a copy: the same records as
    under the model's lock, and not one curve pass on the shared model (another request's hooks would see it)."""
    from explainers.engine import ReplicaPool

    shown, target = shown_with_region(view, seed=3)
    methods = ["gradskip", "gradcam", "rollout", "random"]
    passes = []
    encoder = view.bundle.network.segformer.segformer  # every pass goes through it (the curves skip the head)
    # (a copy made while the hook is on carries it too: counted on the shared encoder only)
    hook = encoder.register_forward_pre_hook(lambda module, args: passes.append(1) if module is encoder else None)
    try:
        locked = view.explain(shown, target, methods, curve_steps=4)
        shared_with_curves = len(passes)
        del passes[:]
        view.explain(shown, target, methods, curve_steps=0)
        maps_only = len(passes)
        del passes[:]
        copies = SegmentationView(view.bundle, replicas=ReplicaPool(2))
        streamed = list(copies.explain_stream(shown, target, methods, curve_steps=4))
        on_copies = len(passes)
        reference = copies.context(shown, target, streamed[-1], steps=3)
    finally:
        hook.remove()
    assert shared_with_curves > maps_only  # under the lock the curves ran on the shared model
    assert on_copies == maps_only and len(passes) == maps_only  # with copies: the maps' passes only, context too
    final = streamed[-1]
    assert [r["method"] for r in final] == methods
    for mine, theirs in zip(final, locked):
        for key in ("deletion", "insertion"):
            assert np.allclose(mine[key], theirs[key], atol=1e-5), (mine["method"], key)
    assert all("deletion" in r for r in final)  # the stream ends with every curve in
    assert 0 <= reference["auc"]["random order"] <= 1
    # the out-of-region curves split over the copies: the numbers made under the lock in one piece
    alone = view.context(shown, target, locked, steps=3)
    for name, auc in alone["auc"].items():
        assert reference["auc"][name] == pytest.approx(auc, abs=1e-5), name
    assert reference["copy_deletion_auc"] == pytest.approx(alone["copy_deletion_auc"], abs=1e-5)
    for mine, theirs in zip(final, locked):
        assert mine["outside_auc"] == pytest.approx(theirs["outside_auc"], abs=1e-5), mine["method"]


def test_gradskip_and_the_rollouts_share_one_pass_and_draw_the_same_maps(view):
    """Prepare once, query many: GradSkip and both rollouts read one forward and backward pass of the region (Grad-
    CAM its own), and each map is the one the method draws alone."""
    from explainers.segmentation.capture import CaptureCache
    from explainers.segmentation.methods import explain_region

    shown, target = shown_with_region(view, seed=5, class_name="round", box=(6, 20, 10, 40))
    methods = ["gradskip", "gradrollout", "rollout", "gradcam"]
    passes = []
    encoder = view.bundle.network.segformer.segformer
    hook = encoder.register_forward_pre_hook(lambda module, args: passes.append(1))
    try:
        records = view.explain(shown, target, methods, curve_steps=0)
        shared = len(passes)
        del passes[:]
        alone = {name: explain_region(view.bundle, shown.image, target, name).maps[0].float() for name in methods}
        separate = len(passes)
    finally:
        hook.remove()
    assert (shared, separate) == (2, 4)
    for record in records:
        assert torch.equal(torch.from_numpy(record["map"]), alone[record["method"]]), record["method"]
    cache = CaptureCache()
    cache.get(view.bundle, shown.image, target, keep_shares=False)
    with pytest.raises(ValueError, match="one image and one region"):
        cache.get(view.bundle, shown.image.clone(), target, keep_shares=False)


def test_the_stream_gathers_its_updates_and_shows_quick_curves_before_a_slow_map(view):
    """The first map comes alone; what comes within a second of the last update is gathered (every update costs
    the page a redraw), no update repeats the last one, and the quick methods' curves are shown before a slow
    method's map starts."""
    from explainers.engine import ReplicaPool

    shown, target = shown_with_region(view, seed=7)
    copies = SegmentationView(view.bundle, replicas=ReplicaPool(2))
    quick = ["gradskip", "gradcam", "gradrollout", "rollout"]
    updates = [[(r["method"], "deletion" in r) for r in records]
               for records in copies.explain_stream(shown, target, quick, curve_steps=3)]
    assert len(updates[0]) == 1 and not updates[0][0][1]  # the first map, alone, at once
    progress = [(len(u), sum(curved for _, curved in u)) for u in updates]
    assert progress == sorted(set(progress))  # every update shows something new
    assert progress[-1] == (4, 4) and len(updates) < 8  # not one update per map and per curve
    with_slow = [[(r["method"], "deletion" in r) for r in records]
                 for records in copies.explain_stream(shown, target, ["gradcam", "occlusion"], curve_steps=3)]
    before_slow = [u for u in with_slow if len(u) == 1]
    assert before_slow[-1] == [("gradcam", True)]  # Grad-CAM's curves shown before occlusion's map is made
    assert with_slow[-1] == [("gradcam", True), ("occlusion", True)]


def test_a_classifier_only_method_is_refused(view):
    from explainers.methods import MethodNotApplicable

    shown = view.predict(photo())
    shown.prediction[:] = 1
    with pytest.raises(MethodNotApplicable, match="classifiers only"):
        view.explain(shown, view.region(shown, class_name="round"), ["chefer"])


def test_a_classifier_is_not_a_segmentation_view():
    from conftest import tiny_vit

    with pytest.raises(ValueError, match="classifier"):
        SegmentationView(tiny_vit())


def test_examples_ship_with_their_masks():
    found = examples()
    assert len(found) >= 3
    for image_path, mask_path in found:
        mask = example_mask(image_path)
        assert mask_path is not None and mask.shape == (240, 320)
        assert set(np.unique(mask)) <= {0, 1, 2, 3, 255}


def test_the_view_builds_and_segments_through_the_api(tmp_path):
    gr = pytest.importorskip("gradio")
    gradio_client = pytest.importorskip("gradio_client")
    from saliency_lab.ui import TAB_MODULES, TabContext
    from explainers.engine import ExplanationCache
    from saliency_lab.ui import segment as view_module

    assert "segment" not in TAB_MODULES  # the view lives in the Explain tab (test_segment_view.py)
    bundle = tiny_segformer("tiny-seg-tab", size=(32, 64))

    class Services:
        cache = ExplanationCache(parallel=2)  # its model copies run the curves

        @staticmethod
        def loader(name):
            return bundle

    ctx = TabContext(services=Services(), names=[], first_model="", heavy={"concurrency_id": "heavy"},
                     light={"concurrency_id": "light"})
    with gr.Blocks() as demo:
        with gr.Column():
            parts = view_module.build(ctx)  # on its own: with its own model menu
    assert {"segment_model", "segment_maps", "segment_curves"} <= set(parts)
    _, url, _ = demo.launch(prevent_thread_lock=True, quiet=True)
    try:
        client = gradio_client.Client(url, verbose=False)
        image_path, _ = examples()[0]
        result = client.predict("tiny-seg-tab", gradio_client.handle_file(image_path), api_name="/segment")
        assert "background" in result[1]  # the legend (session states are not API values)
    finally:
        demo.close()


def test_a_newer_ask_replaces_a_streaming_explanation(view):
    """A click (or Explain) while an explanation streams replaces it: the page's newest ticket is the one wanted,
    pages do not replace each other's, an API call (no ticket) is always wanted; and a stream whose ticket is no
    longer wanted stops before its next update (the new one gets the cores)."""
    from saliency_lab.ui.segment import Asks, explain_region_stream

    asks = Asks(keep=2)
    first = asks.ask("page-a")
    assert asks.wanted("page-a", first) and asks.wanted("page-a", None)
    other = asks.ask("page-b")
    second = asks.ask("page-a")
    assert not asks.wanted("page-a", first) and asks.wanted("page-a", second) and asks.wanted("page-b", other)
    asks.ask("page-c")  # three pages, two remembered: page-b forgotten first, so its stream runs on
    assert asks.wanted("page-b", other) and not asks.wanted("page-a", first)

    shown, _ = shown_with_region(view, seed=3)
    args = (lambda name: view.bundle, "tiny-seg-view", shown, ["gradcam", "gradrollout"], False, "predicted")
    whole = list(explain_region_stream(*args, class_name="square"))
    assert "copies the region" in str(whole[-1][6])  # the full answer ends with the copy's caption
    ticket = asks.ask("page-a")
    updates = []
    for update in explain_region_stream(*args, wanted=lambda: asks.wanted("page-a", ticket), class_name="square"):
        updates.append(update)
        asks.ask("page-a")  # the page clicks again after the first update
    assert len(updates) == 1 and len(whole) > 1
