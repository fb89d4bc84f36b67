"""The segmentation view inside the Explain tab (issue 38 item 5): the Explain menu also lists segmentation models,
labelled as such; picking one hides the classifier view and shows the segmentation view (driven by that same
menu), picking a classifier brings the classifier view back; the classifier endpoints refuse a segmentation model
in plain words, and the segmentation view's endpoints work on the model picked there.

The real app on loopback with a tiny in-memory classifier and a tiny SegFormer built here (no bundled weights)."""
from pathlib import Path

import pytest

pytest.importorskip("transformers")
gradio_client = pytest.importorskip("gradio_client")

from conftest import launch_for_test, tiny_cnn, tiny_segformer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CELLS = ROOT / "assets" / "bloodmnist"
SEG = "tiny-seg-explain"


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    import torch

    torch.set_num_threads(1)
    from explainers.models import register_bundle

    import app

    register_bundle(tiny_cnn(num_classes=8))
    register_bundle(tiny_segformer(SEG, size=(32, 64)))
    state = tmp_path_factory.mktemp("state")
    demo = app.build_app(model_names=["tiny-cnn"], segmentation_names=[SEG], default_model="tiny-cnn",
                         data_dir=str(CELLS), state_dir=state, weights_dir=state / "weights", sam_variant="vit_b",
                         decoy_roots=[])
    url = launch_for_test(demo)
    client = gradio_client.Client(url, verbose=False)
    # one that also returns layout outputs (the two views' visibility), which gradio_client leaves out by default
    # (gr.load's client keeps them the same way); it must then pass session states too: only /select_model here
    raw = gradio_client.Client(url, verbose=False, _skip_components=False)
    yield demo, client, raw
    client.close()
    raw.close()
    demo.close()


def block(demo, elem_id):
    found = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == elem_id]
    assert len(found) == 1, elem_id
    return found[0]


def select(client, model):
    """(methods, slider updates, info line, classifier view update, segmentation view update) of /select_model."""
    methods, *rest = client.predict(model, ["gradcam"], api_name="/select_model")
    *sliders, info, classifier_view, segment_view = rest
    return methods, sliders, info, classifier_view, segment_view


def test_the_explain_menu_lists_segmentation_models_labelled_and_no_segment_tab(running):
    demo, _, _ = running
    from saliency_lab.ui import TAB_MODULES

    assert "segment" not in TAB_MODULES and "explain" in TAB_MODULES
    choices = block(demo, "model").choices
    assert [value for _, value in choices] == ["tiny-cnn", SEG]
    assert dict((value, label) for label, value in choices)[SEG] == f"{SEG} · segmentation (yours)"
    # the refresh every tab change runs keeps them
    refreshed = demo.refresh_models()
    assert any([value for _, value in update["choices"]] == ["tiny-cnn", SEG] for update in refreshed)
    # one view shown at start (the first model is a classifier), one model menu
    assert block(demo, "classifier-view").visible is True and block(demo, "segment-view").visible is False
    assert not [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "seg-model"]


def test_picking_a_segmentation_model_switches_the_view_and_back(running):
    _, client, raw = running
    methods, sliders, info, classifier_view, segment_view = select(raw, SEG)
    assert classifier_view["visible"] is False and segment_view["visible"] is True
    assert SEG in info and "segments" in info
    # the classifier controls are left as they are (no methods computed for a segmentation model)
    assert "choices" not in methods and all("visible" not in update for update in sliders)
    # the default client sees the same methods, sliders and info line, without the two layout updates
    assert len(client.predict(SEG, ["gradcam"], api_name="/select_model")) == len(sliders) + 2

    methods, sliders, info, classifier_view, segment_view = select(raw, "tiny-cnn")
    assert classifier_view["visible"] is True and segment_view["visible"] is False
    assert "gradcam" in [value for _, value in methods["choices"]] and "tiny-cnn" in info
    assert len(sliders) and all("visible" in update for update in sliders)


def test_the_classifier_endpoints_refuse_a_segmentation_model(running):
    _, client, _ = running
    from gradio_client.exceptions import AppError

    from saliency_lab.ui.explain import SLIDERS

    assert client.predict(SEG, ["gradcam"], *[o.default for _, o in SLIDERS], api_name="/expected_time") == ""
    for endpoint in ("/explain_maps", "/explain"):
        with pytest.raises(AppError, match="segmentation model"):
            client.predict(gradio_client.handle_file(str(CELLS / "test_00000.jpg")), SEG, ["gradcam"], "auto",
                           *[o.default for _, o in SLIDERS], 0.5, "cividis", 0, api_name=endpoint)


def test_the_segmentation_endpoints_work_on_the_menus_model(running):
    _, client, _ = running
    from saliency_lab.segmentation import examples

    client.predict(SEG, ["gradcam"], api_name="/select_model")
    image_path, _ = examples()[0]
    _, legend, _, classes, _, unfamiliar, target_line, *_ = client.predict(SEG, gradio_client.handle_file(image_path),
                                                                           api_name="/segment")
    assert target_line == ""  # a new picture: the previous explanation is cleared
    assert not unfamiliar["visible"]  # the tiny model has no familiarity statistics: no warning
    assert "background" in legend and "round" in legend  # the legend names the model's classes
    present = [value for _, value in classes["choices"]]
    if not present:  # a random tiny model may predict background everywhere: nothing to explain then
        pytest.skip("the tiny model predicted no object")
    text, maps, table, curves, _, context_curves, caption = client.predict(SEG, present[0], ["gradcam"], False,
                                                                           api_name="/segment_explain")
    assert present[0] in text and len(maps) == 1 and "IoU" in maps[0]["caption"]
    assert "deletion outside the region" in maps[0]["caption"]
    assert "IoU" in table and "Out del." in table and curves is not None
    assert context_curves is not None and "copies the region" in caption


def test_a_refused_explanation_is_said_on_the_target_line_not_raised(running):
    _, client, _ = running
    # no class picked (or, in a new session, nothing segmented): our sentence on the target line, no error event
    # (no red badges)
    text, *_ = client.predict(SEG, None, ["gradcam"], False, api_name="/segment_explain")
    assert text.startswith("⚠") and ("Segment an image first" in text or "Pick a class" in text)
