"""App-level tests: the real Gradio app on loopback, driven through every public endpoint with gradio_client.

Tiny in-memory models (registered in the model zoo's cache) and the 24 cells shipped in assets/: nothing
from ../shared, no network. Click logic is reached through explicit-coordinate endpoints."""
import csv
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import forward_passes, launch_for_test, png_header_only, tiny_cnn, tiny_vit

ROOT = Path(__file__).resolve().parent.parent

CELLS = ROOT / "assets" / "bloodmnist"
CELL = str(CELLS / "test_00000.jpg")


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    import torch

    torch.set_num_threads(1)
    from explainers.models import register_bundle

    import app

    cnn, vit = register_bundle(tiny_cnn(num_classes=8)), register_bundle(tiny_vit(num_classes=8))
    try:
        from explainers.aha.network import AHAExplainer
        from explainers.aha.store import register_explainer

        for bundle in (cnn, vit):  # untrained explainers: the wiring is what is tested here
            register_explainer(bundle, AHAExplainer(bundle))
    except ImportError:
        pass
    state = tmp_path_factory.mktemp("state")
    demo = app.build_app(model_names=["tiny-cnn", "tiny-vit"], default_model="tiny-cnn", data_dir=str(CELLS),
                         state_dir=state, weights_dir=state / "weights", sam_variant="vit_b",
                         decoy_roots=[])  # decoy data and models only from the test's own weights folder
    url = launch_for_test(demo)
    from gradio_client import Client

    client = Client(url, verbose=False)
    yield demo, client, state
    runner = demo.services._runner
    if runner is not None:
        runner.shutdown()
    demo.close()


def sliders(**values) -> list:
    """Every method slider's value in the endpoints' order (the registry's), defaults unless given by option name:
    a method added to the registry adds its slider here without touching the tests."""
    from saliency_lab.menus import sliders as registry_sliders

    return [values.get(option.name, option.default) for _, option in registry_sliders()]


def live_sliders(**values) -> list:
    """The live sliders' values (the ones `/explain_curves` takes), in the registry's order, defaults unless given."""
    from saliency_lab.menus import sliders as registry_sliders

    return [values.get(option.name, option.default) for _, option in registry_sliders() if option.live]


def explain(client, model="tiny-cnn", methods=("gradcam", "aha"), target="auto", alpha=0.5, steps=0, image=CELL):
    from gradio_client import handle_file

    return client.predict(handle_file(image), model, list(methods), target, *sliders(alpha=alpha, refine_steps=steps),
                          0.5, "cividis", api_name="/explain")


def plot_traces(plot) -> list:
    assert plot["type"] == "plotly"
    return json.loads(plot["plot"])["data"]


def assert_scores_are_the_curves(plot, table):
    """Each row's deletion and insertion AUC (the score table) is the trapezoid area under its curves in the plot
    (x in % of pixels), and ins − del is their difference: the numbers a person reads agree with the curves."""
    traces = plot_traces(plot)
    assert table["data"], "no scores"
    for method, _, deletion, insertion, difference, _ms in table["data"]:
        curves = {}
        for trace in traces:
            if trace["name"].startswith(f"{method}: deletion"):
                curves["deletion"] = trace
            elif trace["name"].startswith(f"{method} insertion"):
                curves["insertion"] = trace
        assert set(curves) == {"deletion", "insertion"}, (method, [t["name"] for t in traces])
        for name, value in (("deletion", deletion), ("insertion", insertion)):
            x, y = np.asarray(curves[name]["x"]) / 100, np.asarray(curves[name]["y"])
            assert x[0] == 0 and x[-1] == 1 and ((0 <= y) & (y <= 1)).all()
            assert value == pytest.approx(float(np.trapezoid(y, x)), abs=1e-4), (method, name)
        assert difference == pytest.approx(insertion - deletion, abs=2e-4)


def test_every_public_endpoint_is_listed(running):
    _, client, _ = running
    endpoints = set(client.view_api(print_info=False, return_format="dict")["named_endpoints"])
    for name in ("/explain", "/explain_maps", "/explain_curves", "/explain_target", "/explain_new_image", "/alpha_preview", "/alpha_curves", "/class_focus_preview", "/class_focus_curves", "/refine",
                 "/redraw", "/downloads", "/select_model", "/browse", "/browse_pick", "/mask_from_drawing",
                 "/mask_use_explain_image", "/sam_click", "/sam_box", "/sam_box_from_stroke", "/sam_clear", "/add_mask", "/start_finetune",
                 "/finetune_status", "/cancel_finetune", "/review_load", "/review_open", "/review_note",
                 "/review_page", "/verdict_plausible", "/verdict_implausible", "/verdict_unsure", "/review_export",
                 "/sanity_check", "/decoy", "/gridpg"):
        assert name in endpoints, name


def test_explain_two_methods_side_by_side(running):
    _, client, _ = running
    label, target, overlays, plot, table, status, heads = explain(client)
    assert len(label["confidences"]) == 5
    assert abs(sum(c["confidence"] for c in label["confidences"])) <= 1.0 + 1e-6
    assert [o["caption"].split(" · ")[0] for o in overlays] == ["AHA (amortized)", "Grad-CAM"]
    for item in overlays:
        with Image.open(item["image"]) as picture:
            assert min(picture.size) >= 256  # the 64 px cell is shown enlarged
    traces = plot_traces(plot)
    assert len(traces) == 4  # deletion + insertion per method, a panel per method (small multiples)
    assert all("AUC" in t["name"] for t in traces)
    assert [t["xaxis"] for t in traces] == ["x", "x", "x2", "x2"]  # each method's pair on its own axes
    assert any("↓" in t["name"] and "↑" in t["name"] for t in traces)
    assert any("higher is better" in t["name"] for t in traces)
    titles = [note["text"] for note in json.loads(plot["plot"])["layout"]["annotations"]]
    assert any("AHA" in t for t in titles) and any("Grad-CAM" in t for t in titles)
    assert [row[0] for row in table["data"]] == ["AHA (amortized)", "Grad-CAM"]
    assert "tiny-cnn" in status


def test_ui_path_maps_first_then_curves(running):
    """The button's two events: maps (fast, no curves yet), then the curves for the session's state."""
    _, client, _ = running
    from gradio_client import handle_file

    label, target, overlays, plot, table, status = client.predict(
        handle_file(CELL), "tiny-cnn", ["gradcam", "aha"], "auto", *sliders(), 0.5, "cividis", api_name="/explain_maps")
    assert len(overlays) == 2 and all("del" not in o["caption"] for o in overlays)
    assert plot_traces(plot) == [] and all(row[2] is None for row in table["data"])
    overlays, plot, table, status, heads = client.predict(*live_sliders(), 0.5, "cividis", api_name="/explain_curves")
    assert len(plot_traces(plot)) == 4 and all("ins" in o["caption"] for o in overlays)
    assert_scores_are_the_curves(plot, table)


def test_target_can_be_any_top5_class(running):
    _, client, _ = running
    from gradio_client import handle_file

    label, *_ = explain(client, methods=("gradcam",))
    names = [c["label"] for c in label["confidences"]]
    runner_up = int(names[1].split()[-1])  # "class k"
    out = client.predict(handle_file(CELL), "tiny-cnn", ["gradcam"], str(runner_up), *sliders(), 0.5, "cividis",
                         api_name="/explain_target")
    overlays, table = out[2], out[4]
    assert f"class {runner_up}" in overlays[0]["caption"]
    assert table["data"][0][0] == "Grad-CAM"


def test_gradskip_alpha_recombines_without_a_model_pass(running):
    demo, client, _ = running
    out = explain(client, model="tiny-vit", methods=("gradskip", "gradcam"), alpha=0.5)
    before = Image.open(out[2][0]["image"]).copy()
    bundle = demo.services.bundle("tiny-vit")
    with forward_passes(bundle.network) as calls:
        started = time.perf_counter()
        overlays, heads = client.predict(0.0, 0.5, "cividis", api_name="/alpha_preview")
        elapsed = time.perf_counter() - started
    assert not calls, "moving alpha must not run the model"
    assert elapsed < 5.0
    assert "alpha=0.0" in overlays[0]["caption"]
    after = Image.open(overlays[0]["image"])
    assert np.abs(np.asarray(after, dtype=int) - np.asarray(before, dtype=int)).max() > 0
    assert heads["type"] == "plotly"
    # on release the curves follow
    overlays, plot, table, status = client.predict(0.0, 0.5, "cividis", api_name="/alpha_curves")
    rows = {row[0]: row for row in table["data"]}
    from explainers.methods.gradskip import DEFAULT_GATE_POWER

    assert rows["GradSkip"][1] == f"alpha=0.0, focus={DEFAULT_GATE_POWER:g}"  # the focus slider's value is kept
    assert len(plot_traces(plot)) == 4
    assert_scores_are_the_curves(plot, table)  # the rerun's curves are the scores shown


def test_gradskip_class_focus_recombines_without_a_model_pass(running):
    """The class gate's power is a second live GradSkip slider: moving it redraws from the cached state; 0 gives
    plain attention's map (the gate switched off)."""
    demo, client, _ = running
    out = explain(client, model="tiny-vit", methods=("gradskip",))
    before = np.asarray(Image.open(out[2][0]["image"]), dtype=int)
    bundle = demo.services.bundle("tiny-vit")
    with forward_passes(bundle.network) as calls:
        overlays, _heads = client.predict(0.0, 0.5, "cividis", api_name="/class_focus_preview")
    assert not calls, "moving the class focus must not run the model"
    assert "focus=0.0" in overlays[0]["caption"]
    assert np.abs(np.asarray(Image.open(overlays[0]["image"]), dtype=int) - before).max() > 0
    overlays, plot, table, status = client.predict(0.0, 0.5, "cividis", api_name="/class_focus_curves")
    row = {r[0]: r for r in table["data"]}["GradSkip"]
    assert "focus=0.0" in row[1]
    assert_scores_are_the_curves(plot, table)
    # releasing one slider keeps the other's value: alpha 0.2, then the class focus 2 -> both in the result
    client.predict(0.2, 0.5, "cividis", api_name="/alpha_curves")
    overlays, plot, table, status = client.predict(2.0, 0.5, "cividis", api_name="/class_focus_curves")
    row = {r[0]: r for r in table["data"]}["GradSkip"]
    assert "alpha=0.2" in row[1] and "focus=2.0" in row[1], row[1]


def test_refine_steps_rerun_aha_only(running):
    _, client, _ = running
    explain(client, methods=("aha", "gradcam"))
    overlays, plot, table, status = client.predict(2, 0.5, "cividis", api_name="/refine")
    rows = {row[0]: row for row in table["data"]}
    assert rows["AHA (amortized)"][1] == "refine_steps=2, mode=trained"  # the mode AHA ran in is shown
    assert rows["Grad-CAM"][1] == "-"


def test_option_text_names_declared_options_and_leaves_grouped_settings_to_the_report():
    from saliency_lab.pictures import options_text

    record = {"method": "aha", "options": {"refine_steps": 3, "mode": "trained",
                                           "refinement": {"lr": 0.3, "grid": 16, "deletion_weight": 1.0}}}
    assert options_text(record) == "refine_steps=3, mode=trained"
    assert options_text({"method": "not-registered", "options": {"a": 1}}) == "a=1"


def test_redraw_and_downloads(running):
    _, client, _ = running
    explain(client)
    overlays = client.predict(0.9, "viridis", api_name="/redraw")
    assert len(overlays) == 2
    files = client.predict(0.5, "cividis", api_name="/downloads")
    if isinstance(files, dict):  # the file list is revealed with gr.update(value=..., visible=True)
        assert files.get("visible") is True
        files = files["value"]
    files = [f if isinstance(f, str) else f["path"] for f in files]
    names = sorted(Path(f).name for f in files)
    # the image's, the model's and the explained class's names: a second download keeps the first
    assert explained_names(names) == ["curves.csv", "overlay-aha.png", "overlay-gradcam.png", "report.json"]
    report = json.loads(Path(next(f for f in files if f.endswith("report.json"))).read_text())
    assert report["model"] == "tiny-cnn" and report["seed"] == 0 and "torch" in report["versions"]
    assert {m["method"] for m in report["methods"]} == {"aha", "gradcam"}
    with open(next(f for f in files if f.endswith("curves.csv"))) as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 * 21
    for entry in report["methods"]:  # the report's AUCs are the areas under the curves of curves.csv
        own = [row for row in rows if row["method"] == entry["method"]]
        fractions = np.array([float(row["fraction"]) for row in own])
        for curve in ("deletion", "insertion"):
            area = float(np.trapezoid([float(row[f"{curve}_score"]) for row in own], fractions))
            assert entry[f"{curve}_auc"] == pytest.approx(area, abs=1e-5), (entry["method"], curve)
    with Image.open(next(f for f in files if f.endswith("overlay-aha.png"))) as picture:
        assert picture.size == (64, 64)  # the original's size


EXPLAIN_PARAMETERS = ["image_path", "model_name", "methods", "target_choice", "alpha", "class_focus", "refine_steps",
                      "occlusion_window", "intgrad_steps", "opacity", "colour_map", "outline_percent"]


def test_every_endpoint_names_its_parameters_and_explain_takes_keywords(running):
    """A script calls the app by keyword through gradio_client: no endpoint shows a placeholder (param_4) or a
    one-letter name (but a click's x and y), the explain endpoints name every slider, and each keyword reaches its own place (alpha and
    the class focus the map, the opacity the overlay)."""
    import re

    demo, client, _ = running
    from gradio_client import handle_file

    from explainers.images import load_image

    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    for endpoint, info in api.items():
        for parameter in info["parameters"]:
            name = parameter["parameter_name"]
            assert not re.fullmatch(r"param_\d+", name) and (len(name) > 1 or name in "xy"), (endpoint, name)
    for endpoint in ("/explain", "/explain_maps", "/explain_target", "/explain_new_image"):
        assert [p["parameter_name"] for p in api[endpoint]["parameters"]] == EXPLAIN_PARAMETERS, endpoint
    assert [p["parameter_name"] for p in api["/redraw"]["parameters"]] == ["opacity", "colour_map"]
    assert [p["parameter_name"] for p in api["/import_model"]["parameters"]][:4] == ["weights", "classes", "arch",
                                                                                    "name"]
    out = client.predict(image_path=handle_file(CELL), model_name="tiny-vit", methods=["gradskip"],
                         target_choice="auto", alpha=0.2, class_focus=0.0, refine_steps=0, occlusion_window=0.125,
                         opacity=0.5, colour_map="viridis", outline_percent=0, api_name="/explain")
    caption = out[2][0]["caption"]
    assert "alpha=0.2" in caption and "focus=0.0" in caption, caption
    bundle = demo.services.bundle("tiny-vit")
    from explainers import engine

    shown = np.asarray(engine.prepare_input(load_image(CELL), bundle).display.convert("RGB"), dtype=float)
    plain, covered = (np.asarray(Image.open(client.predict(opacity=value, colour_map="viridis",
                                                           api_name="/redraw")[0]["image"]).convert("RGB"), dtype=float)
                      for value in (0.0, 1.0))
    assert plain.shape == shown.shape
    assert np.abs(plain - shown).mean() < 4  # opacity 0: the picture itself (JPEG noise aside)
    assert np.abs(covered - shown).mean() > 20  # opacity 1: the colour map covers it


def test_an_upload_is_decoded_once_and_prepared_once_per_model(running, tmp_path, monkeypatch):
    """Prepare once, query many: through the upload check, the maps, the curves, a rerun, redraws, the outline,
    the downloads and a second model, each uploaded file is decoded once and prepared once per model."""
    demo, client, _ = running
    from gradio_client import handle_file

    import saliency_lab.services as services_module
    from explainers import engine

    path = tmp_path / "fresh-upload.png"
    Image.fromarray(np.random.default_rng(7).integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(path)
    decoded, prepared = [], []
    load, prepare = services_module.load_image, engine.prepare_input

    def counting_load(source, *args, **kwargs):
        decoded.append(str(source))
        return load(source, *args, **kwargs)

    def counting_prepare(picture, bundle):
        prepared.append((id(picture), bundle.name))
        return prepare(picture, bundle)

    monkeypatch.setattr(services_module, "load_image", counting_load)
    monkeypatch.setattr(engine, "prepare_input", counting_prepare)
    upload = handle_file(str(path))
    explain(client, methods=("gradcam", "aha"), image=str(path))
    client.predict(2, 0.5, "cividis", api_name="/refine")  # AHA again, on the prepared input
    client.predict(0.9, "viridis", api_name="/redraw")
    client.predict(20, 0.5, "cividis", api_name="/outline")
    client.predict(0.5, "cividis", "original", api_name="/downloads")
    client.predict(upload, "tiny-cnn", ["gradcam"], "auto", *sliders(), 0.5, "cividis", 0,
                   api_name="/explain_new_image")
    explain(client, model="tiny-vit", methods=("gradcam",), image=str(path))
    assert len(decoded) == 1, decoded  # once, though the client uploaded the same file three times
    assert sorted(name for _, name in prepared) == ["tiny-cnn", "tiny-vit"], prepared  # once per model


def test_model_change_offers_the_right_methods(running):
    _, client, _ = running
    from saliency_lab.menus import sliders as registry_sliders

    # (the two views' visibility, also returned, are layout updates gradio_client leaves out: test_segment_view.py)
    methods, *slider_updates, info = client.predict("tiny-vit", ["gradcam"], api_name="/select_model")
    assert "gradskip" in [c[1] for c in methods["choices"]]
    assert len(slider_updates) == len(registry_sliders())  # one visibility update per method slider
    methods, *slider_updates, info = client.predict("tiny-cnn", ["gradskip"], api_name="/select_model")
    offered = [c[1] for c in methods["choices"]]
    assert "gradskip" not in offered and "rollout" not in offered and "gradcam" in offered
    visible = {option.name: update["visible"] for (_, option), update in zip(registry_sliders(), slider_updates)}
    assert visible["alpha"] is False and "tiny-cnn" in info


def test_errors_are_clear_messages(running, tmp_path):
    _, client, _ = running
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    bad = tmp_path / "not-an-image.png"
    bad.write_bytes(b"this is text, not a PNG")
    with pytest.raises(AppError, match="not a readable image"):
        explain(client, image=str(bad))
    tiny = tmp_path / "tiny.png"
    Image.new("RGB", (4, 4)).save(tiny)
    with pytest.raises(AppError, match="too small"):
        explain(client, image=str(tiny))
    with pytest.raises(AppError, match="at least one"):
        client.predict(handle_file(CELL), "tiny-cnn", [], "auto", *sliders(), 0.5, "cividis", api_name="/explain")
    with pytest.raises(AppError, match="outside the data folders"):
        client.predict("/etc", "all", 1, api_name="/browse")  # a public app must not browse the server's disk
    with pytest.raises(AppError, match="(?i)nothing to download|explain an image"):
        fresh = type(client)(client.src, verbose=False)
        fresh.predict(0.5, "cividis", api_name="/downloads")


def test_method_that_cannot_explain_is_skipped_with_a_warning(running):
    _, client, _ = running
    client = type(client)(client.src, verbose=False)  # a fresh session: its method menu is not narrowed yet
    label, _, overlays, plot, table, status, _ = explain(client, methods=("gradcam", "rollout"))
    assert [o["caption"].split(" · ")[0] for o in overlays] == ["Grad-CAM"]
    assert "Attention rollout" in status


def test_browse_and_pick_by_index(running):
    _, client, _ = running
    gallery, info, classes, page = client.predict(str(CELLS), "all", 1, api_name="/browse")
    assert len(gallery) == 24 and "24 images" in info
    gallery, info, classes, page = client.predict(str(CELLS), "3", 1, api_name="/browse")
    assert len(gallery) == 3
    picked = client.predict(str(CELLS), 5, api_name="/browse_pick")
    with Image.open(picked) as picture:
        assert picture.size == (64, 64)


def test_review_flow_saves_at_once_and_exports(running):
    demo, client, _ = running
    gallery, progress, page, classes = client.predict(str(CELLS), "tiny-cnn", 24, "all", "all", "dr-test",
                                                      api_name="/review_load")
    assert len(gallery) == 24 and "Reviewed 0 of 24" in progress
    maps, info, note, saved, position = client.predict(2, "dr-test", api_name="/review_open")
    assert len(maps) >= 3  # the image and two or three methods' maps
    assert "confidence" in info
    saved, progress = client.predict("dr-test", "", api_name="/verdict_implausible")
    assert "implausible" in saved and "Reviewed 1 of 24" in progress
    note_line = client.predict("dr-test", "nucleus ignored", api_name="/review_note")
    assert "Note saved" in note_line and "implausible" in note_line  # the verdict stays in view
    store = demo.services.store
    rows = store.verdicts(reviewer="dr-test")
    assert len(rows) == 1 and rows[0]["verdict"] == "implausible" and rows[0]["note"] == "nucleus ignored"
    # a new session (a refresh) finds the verdict and the note
    fresh = type(client)(client.src, verbose=False)
    fresh.predict(str(CELLS), "tiny-cnn", 24, "all", "all", "dr-test", api_name="/review_load")
    maps, info, note, saved, position = fresh.predict(2, "dr-test", api_name="/review_open")
    assert note == "nucleus ignored" and "implausible" in saved
    exported = client.predict("dr-test", api_name="/review_export")
    with open(exported) as handle:
        rows = list(csv.DictReader(handle))
    assert rows[0]["verdict"] == "implausible" and rows[0]["reviewer"] == "dr-test"
    # the filters
    gallery, *_ = client.predict("3", "all", 1, "dr-test", api_name="/review_page")
    assert 0 < len(gallery) <= 24


def test_review_next_after_a_filter_change_stays_in_the_new_list(running):
    """Issue 11.9: an image open, the filter narrowed: Next opens an image of the new list (no 'No image 5 in the
    current list'), and a note keeps the saved verdict in view."""
    _, client, _ = running
    client.predict(str(CELLS), "tiny-cnn", 24, "all", "all", "dr-next", api_name="/review_load")
    client.predict(20, "dr-next", api_name="/review_open")  # far down the full list
    gallery, *_ = client.predict("3", "all", 1, "dr-next", api_name="/review_page")  # one class only
    shown = len(gallery)
    assert 0 < shown < 20
    for endpoint in ("/review_next", "/review_next", "/review_previous"):
        maps, info, note, saved, position = client.predict("dr-next", api_name=endpoint)
        assert 0 <= int(position) < shown and len(maps) >= 2
    client.predict("dr-next", "", api_name="/verdict_plausible")
    line = client.predict("dr-next", "looks right", api_name="/review_note")
    assert "Saved verdict: **plausible**" in line and "Note saved" in line


def test_masks_sam_clicks_and_mask_set(running):
    demo, client, _ = running
    from gradio_client import handle_file

    client.predict(handle_file(CELL), api_name="/mask_use_explain_image")
    view, preview, info = client.predict("object", 160, 160, api_name="/sam_click")  # the 64 px cell is shown at 320 px
    assert "Mask by" in info  # SAM when its weights are cached, else the labelled GrabCut fallback
    if "GrabCut" in info:
        assert "offline fallback" in info
    view, preview, info = client.predict("background", 2, 2, api_name="/sam_click")
    gallery, set_info = client.predict("test-set", "3", api_name="/add_mask")
    assert len(gallery) == 1 and "test-set" in set_info
    assert demo.services.store.mask_sets() == [("test-set", 1)]
    client.predict(api_name="/sam_clear")


def preview_mask(preview, image=CELL) -> np.ndarray:
    """The mask shown in the preview: the pixels the blue tint changed in the SAM view (a PNG, so exact)."""
    from saliency_lab import pictures
    from explainers.images import load_image

    view = pictures.display_rgb(np.asarray(load_image(image)))
    with Image.open(preview) as picture:
        shown = np.asarray(picture.convert("RGB"), dtype=int)
    assert shown.shape == view.shape
    return np.abs(shown - view.astype(int)).max(axis=-1) > 0


def test_sam_box_by_drag(running):
    """A dragged box in the SAM view's pixels (the 64 px cell is shown at 320 px): the mask stays in the box."""
    _, client, _ = running
    from gradio_client import handle_file

    client.predict(handle_file(CELL), api_name="/mask_use_explain_image")
    view, preview, info = client.predict(260, 250, 70, 60, api_name="/sam_box")  # corners in any order
    assert "Mask by" in info and "a box" in info
    mask = preview_mask(preview)
    inside = np.zeros_like(mask)
    inside[60:250, 70:260] = True
    assert mask.sum() > 0.02 * mask.size and (mask & inside).sum() / mask.sum() > 0.9
    # the clicked points are kept with the box
    client.predict("object", 160, 160, api_name="/sam_click")
    view, preview, info = client.predict(70, 60, 260, 250, api_name="/sam_box")
    assert "1 object point and a box" in info
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="no area"):
        client.predict(10, 10, 10, 300, api_name="/sam_box")
    client.predict(api_name="/sam_clear")


def test_sam_box_from_a_painted_stroke(running, tmp_path):
    """A rough stroke around the cell in the editor (its own 64 px grid) -> its bounding box in the SAM view."""
    _, client, _ = running
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    client.predict(handle_file(CELL), api_name="/mask_use_explain_image")
    rgba = np.zeros((64, 64, 4), dtype=np.uint8)
    rgba[12:52, 12:52] = (0, 114, 178, 255)
    rgba[15:49, 15:49] = 0  # only the outline: a stroke around the object
    layer = tmp_path / "stroke.png"
    Image.fromarray(rgba).save(layer)
    value = {"background": handle_file(CELL), "layers": [handle_file(str(layer))], "composite": handle_file(CELL)}
    view, preview, info = client.predict(value, api_name="/sam_box_from_stroke")
    assert "Mask by" in info and "a box" in info
    mask = preview_mask(preview)
    inside = np.zeros_like(mask)
    inside[60:260, 60:260] = True  # rows/columns 12..51 of the cell, 5x
    assert mask.any() and (mask & inside).sum() / mask.sum() > 0.9
    with Image.open(view) as picture:  # the box is drawn on the SAM view (orange outline)
        drawn = np.asarray(picture.convert("RGB"))
    assert tuple(drawn[160, 60]) == (230, 159, 0)
    empty = {"background": handle_file(CELL), "layers": [], "composite": handle_file(CELL)}
    with pytest.raises(AppError, match="Paint a rough stroke"):
        client.predict(empty, api_name="/sam_box_from_stroke")
    client.predict(api_name="/sam_clear")


def test_drawn_mask(running):
    _, client, _ = running
    from gradio_client import handle_file

    rgba = np.zeros((64, 64, 4), dtype=np.uint8)
    rgba[20:40, 20:40] = (0, 114, 178, 255)
    layer = Path(os.environ.get("TMPDIR", "/tmp")) / "saliency-layer.png"
    Image.fromarray(rgba).save(layer)
    value = {"background": handle_file(CELL), "layers": [handle_file(str(layer))], "composite": handle_file(CELL)}
    preview, info = client.predict(value, api_name="/mask_from_drawing")
    assert "Drawn mask" in info and "10%" in info


def test_sanity_check_streams_stages(running):
    _, client, _ = running
    from gradio_client import handle_file

    gallery, plot = client.predict("tiny-cnn", ["gradcam", "random"], 2, handle_file(CELL), api_name="/sanity_check")
    assert len(gallery) == 2 * 3  # original + 2 stages, per method
    traces = plot_traces(plot)
    assert len(traces) == 2 and traces[0]["y"][0] == 1.0


def test_decoy_examples(running):
    _, client, _ = running
    gallery, info = client.predict(api_name="/decoy")
    assert len(gallery) >= 4 and info


def test_decoy_before_after_with_tiny_models(running):
    """Two tiny 'decoy' models written as cards (a classifier and its CAMAL fine-tune): the decoy view makes
    decoy test images from the shipped cells and shows both models' Grad-CAM, predictions and card numbers."""
    demo, client, state = running
    import timm
    import torch

    from explainers.decoy import PALETTE
    from explainers.training import export_classifier

    weights = state / "weights"
    weights.mkdir(exist_ok=True)
    kwargs = {"layers": [1, 1, 1, 1], "channels": [8, 8, 16, 16], "output_stride": 8, "num_classes": 8}
    names = (CELLS / "classes.txt").read_text().split("\n")[:8]
    extras = {"decoy-tiny": {"decoy": {"test": {"test": {"count": 40, "accuracy": 0.25, "iou": 0.3}}}},
              "decoy-tiny-camal": {"camal": {"base_model": "decoy-tiny", "before": {"test": {"accuracy": 0.25}},
                                             "after": {"test": {"count": 40, "accuracy": 0.75}}}}}
    written = []
    try:
        for seed, (name, extra) in enumerate(extras.items()):
            torch.manual_seed(seed)
            network = timm.create_model("resnet18", pretrained=False, **kwargs)
            export_classifier(network, name=name, out_dir=weights, timm_name="resnet18", timm_kwargs=kwargs,
                              mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), class_names=names, data="synthetic",
                              val_accuracy=None, test_data=None, seed=seed, history=[], epochs=0,
                              train_seconds=0.0, input_size=64, extra=extra)
            written += [weights / f"{name}.json", weights / f"{name}.safetensors"]
        gallery, info = client.predict(api_name="/decoy")
    finally:
        for path in written:
            path.unlink(missing_ok=True)
    captions = [item["caption"] for item in gallery]
    assert len(gallery) == 4 * 3  # per image: the decoy image, before, after
    for index in range(4):
        image, before, after = captions[3 * index: 3 * index + 3]
        assert image.startswith("true: ") and "square:" in image and image.endswith("(decoy test image)")
        assert before[:2] in ("✓ ", "✗ ") and before[2:].startswith("before: ")
        assert after[:2] in ("✓ ", "✗ ") and after[2:].startswith("after CAMAL: ")
    with Image.open(gallery[0]["image"]) as picture:  # a palette square in one corner of the decoy image
        rgb = np.asarray(picture.convert("RGB"))
    corners = [rgb[6:24, 6:24], rgb[6:24, -24:-6], rgb[-24:-6, 6:24], rgb[-24:-6, -24:-6]]  # 6 px at 2 px, 3x
    assert sum(tuple(c[0, 0]) in PALETTE and (c == c[0, 0]).all() for c in corners) == 1
    assert "made here from the shipped cells" in info
    assert "**decoy-tiny**" in info and "**decoy-tiny-camal**" in info
    assert "accuracy 25.0%" in info and "accuracy 25.0% → 75.0%" in info  # the numbers of each card
    assert "Before (decoy test acc. 25%)" in info and "After CAMAL (decoy test acc. 75%)" in info
    for item in gallery[1:3]:  # the maps are drawn (not blank)
        with Image.open(item["image"]) as picture:
            assert np.asarray(picture).std() > 0


def test_finetune_errors_without_masks(running):
    _, client, _ = running
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="training masks"):
        client.predict("tiny-cnn", None, 1, 1.0, "local", api_name="/start_finetune")
    with pytest.raises(AppError, match="HF_TOKEN"):
        client.predict("tiny-cnn", "path:/nowhere", 1, 1.0, "hf-jobs", api_name="/start_finetune")


@pytest.mark.slow
def test_camal_finetune_job_end_to_end(running):
    """A tiny exported classifier, fine-tuned for one epoch in a real job process; progress, then before/after."""
    demo, client, state = running
    import timm
    import torch

    from explainers.masks import write_mask_set
    from explainers.training import export_classifier

    weights = state / "weights"
    weights.mkdir(exist_ok=True)
    torch.manual_seed(0)
    kwargs = {"layers": [1, 1, 1, 1], "channels": [8, 8, 16, 16], "output_stride": 8, "num_classes": 3}
    network = timm.create_model("resnet18", pretrained=False, **kwargs)
    export_classifier(network, name="job-cnn", out_dir=weights, timm_name="resnet18", timm_kwargs=kwargs,
                      mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), class_names=["a", "b", "c"], data="synthetic",
                      val_accuracy=None, test_data=None, seed=0, history=[], epochs=0, train_seconds=0.0,
                      input_size=32)
    rng = np.random.default_rng(0)
    items = []
    for i in range(12):
        image = rng.integers(0, 255, (32, 32, 3)).astype(np.uint8)
        mask = np.zeros((32, 32), bool)
        mask[8:24, 8:24] = True
        items.append((f"{i}", image, mask, i % 3))
    masks = write_mask_set(state / "job-masks", items)
    status, timer, progress = client.predict("job-cnn", f"path:{masks}", 1, 1.0, "local", api_name="/start_finetune")
    assert "queued" in status  # the job id lives in the session's state
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        outputs = client.predict(api_name="/finetune_status")
        text, percent, gallery, table = outputs[0], outputs[1], outputs[-3], outputs[-2]
        if any(word in text for word in ("done", "failed", "cancelled", "interrupted")):
            break
        time.sleep(1.0)
    assert "done" in text, text
    assert percent == 100
    assert table["data"] and any("IoU" in row[0] for row in table["data"])
    assert gallery


def test_figures_are_valid_plotly():
    """The app sends plain-dict figures (fast); plotly itself must accept every one of them."""
    from saliency_lab import figures as figs

    record = {"method": "gradcam", "label": "Grad-CAM", "target_name": "x", "fractions": [0.0, 0.5, 1.0],
              "deletion": [0.9, 0.2, 0.1], "insertion": [0.1, 0.6, 0.9], "deletion_auc": 0.35, "insertion_auc": 0.55}
    figures = [figs.curves_figure([record]), figs.empty_figure("nothing"),
               figs.head_weights_figure({"alpha": 0.5, "head_weights": [[0.5, 0.5], [0.9, 0.1]]}),
               figs.sanity_figure([("Grad-CAM", [("original", 1.0), ("top 2", 0.3)])]),
               figs.job_figure([{"t": 0, "step": 0, "before_iou": 0.2},
                              {"t": 1, "step": 1, "loss": 1.2, "ce": 1.0, "reg": 0.2, "alpha": 0.4, "beta": 0.3}])]
    for figure in figures:
        figure.to_plotly()  # raises on any invalid property
        json.loads(figure.to_json())
    assert len(figures[0].data) == 2 and "deletion AUC 0.350 ↓" in figures[0].data[0]["name"]
    assert "higher is better" in figures[0].data[1]["name"] and figures[0].data[1]["showlegend"] is False


# ------------------------------------------------------------------------------------------------ uploads
def _upload_kinds(folder: Path) -> dict:
    """{kind: (path, expected)}: expected is a regex of the refusal, or None (accepted: load_image's picture)."""
    rng = np.random.default_rng(0)
    cell = Image.open(CELL).convert("RGB").resize((40, 48))
    pixels = np.asarray(cell)
    kinds = {}

    def put(name, expected):
        kinds[name.split(".")[0]] = (folder / name, expected)
        return folder / name

    jpeg = (folder / "ok.jpg")
    cell.save(jpeg, quality=95)
    data = jpeg.read_bytes()
    put("corrupt-jpeg.jpg", r"not a readable image").write_bytes(data[:4] + rng.bytes(len(data) - 4))
    png = folder / "ok.png"
    cell.save(png)
    put("truncated-png.png", r"not a readable image").write_bytes(png.read_bytes()[: len(png.read_bytes()) // 2])
    put("text.png", r"not a readable image: its content is not an image format").write_text("hello, not a PNG\n")
    Image.new("RGB", (1, 1), (200, 10, 10)).save(put("one-pixel.png", r"too small"))
    put("bomb.png", r"too large \(400 MP\): the limit is 40 MP").write_bytes(png_header_only(20000, 20000))
    Image.fromarray((pixels[..., 1].astype(np.uint16) * 257 + 100), "I;16").save(put("gray16.tif", None))
    cell.convert("CMYK").save(put("cmyk.jpg", None), quality=95)
    rgba = np.dstack([pixels, np.where(np.arange(40)[None, :] < 20, 0, 255).repeat(48, 0).astype(np.uint8)])
    Image.fromarray(rgba, "RGBA").save(put("rgba.png", None))
    cell.convert("L").save(put("gray.png", None))
    frames = [cell, Image.fromarray(255 - pixels)]
    frames[0].save(put("animated.gif", None), save_all=True, append_images=frames[1:], duration=100, loop=0)
    exif = Image.Exif()
    exif[274] = 6
    cell.save(put("exif6.jpg", None), exif=exif, quality=95)
    put("drawing.svg", r"SVG drawing").write_text('<svg xmlns="http://www.w3.org/2000/svg" width="40" height="40">'
                                                  '<circle cx="20" cy="20" r="10"/></svg>')
    return kinds


KINDS = ["corrupt-jpeg", "truncated-png", "text", "one-pixel", "bomb", "gray16", "cmyk", "rgba", "gray", "animated",
         "exif6", "drawing"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_of_upload_is_refused_clearly_or_explained_as_load_image_reads_it(running, tmp_path, kind):
    """Through the real endpoints (the Explain tab's upload event and the API's explain): a clear refusal in our
    words (no Python internals, our 40 MP limit), or the prediction of load_image + the model, with the preview
    showing exactly the picture the model gets."""
    demo, client, _ = running
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    from explainers import engine
    from explainers.images import load_image

    path, expected = _upload_kinds(tmp_path)[kind]
    if expected is not None:
        with pytest.raises(AppError) as caught:  # the API: an error in our words
            client.predict(handle_file(str(path)), "tiny-cnn", ["gradcam"], "auto", *sliders(), 0.5, "cividis",
                           api_name="/explain")
        # the upload event: the refused picture leaves the image box and a note beside it says why (no toast)
        out = client.predict(handle_file(str(path)), "tiny-cnn", ["gradcam"], "auto", *sliders(), 0.5, "cividis",
                             api_name="/explain_new_image")
        assert out[0] is None and out[1]["visible"] is True and "not explained" in out[1]["value"]
        for message in (str(caught.value), out[1]["value"]):
            assert __import__("re").search(expected, message), message
            assert " at 0x" not in message and "178" not in message and "Traceback" not in message
        return
    bundle = demo.services.bundle("tiny-cnn")
    picture = load_image(path)
    wanted = engine.predict_top(bundle, engine.prepare_input(picture, bundle), 5)
    label = explain(client, methods=("gradcam",), image=str(path))[0]
    got = [(c["label"], c["confidence"]) for c in label["confidences"]]
    assert [name for name, _ in got] == [name for _, name, _ in wanted]
    assert np.allclose([p for _, p in got], [p for _, _, p in wanted], atol=1e-5)
    # the UI's upload event: the preview is the picture the model gets (a normalised copy when a browser would
    # show the file differently), then that picture is explained with the same prediction
    out = client.predict(handle_file(str(path)), "tiny-cnn", ["gradcam"], "auto", *sliders(), 0.5, "cividis",
                         api_name="/explain_new_image")
    shown = out[0]
    if shown is None:  # shown as is: a plain RGB PNG/JPEG, explained at once
        assert kind not in ("gray16", "cmyk", "rgba", "gray", "animated", "exif6")
        assert [c["label"] for c in out[2]["confidences"]] == [name for _, name, _ in wanted]
        return
    shown_path = shown if isinstance(shown, str) else shown["path"]
    with Image.open(shown_path) as preview:
        assert preview.format == "PNG" and preview.mode == "RGB"
        assert np.array_equal(np.asarray(preview), np.asarray(picture))
    label = client.predict(handle_file(shown_path), "tiny-cnn", ["gradcam"], "auto", *sliders(), 0.5, "cividis",
                           api_name="/explain_new_image")[2]
    assert [c["label"] for c in label["confidences"]] == [name for _, name, _ in wanted]


def test_jobs_are_reconciled_at_start_up_listed_resumed_and_opened(tmp_path):
    """A job left 'running' by a killed server and a dead job process is 'interrupted' as soon as the app starts;
    the job list shows state, progress, model, times and error; resume requeues it, open follows a job."""
    import sqlite3

    from gradio_client import Client

    import app
    from saliency_lab.jobs import JobRunner

    state = tmp_path / "state"
    old = JobRunner(state / "jobs", poll_s=0.05)
    old.shutdown()  # no scheduler: the records are only what a crashed server left behind
    lost = old.submit("sleep-steps", {"steps": 2, "dt": 0.01, "model": "tiny-cnn"})
    finished = old.submit("sleep-steps", {"steps": 1})
    with sqlite3.connect(state / "jobs" / "jobs.sqlite") as con:
        con.execute("UPDATE jobs SET status='running', pid=999999, started=? WHERE id=?", (time.time() - 60, lost))
        con.execute("UPDATE jobs SET status='done', started=?, finished=?, step=1, total=1, result='{}' WHERE id=?",
                    (time.time() - 50, time.time() - 40, finished))
    demo = app.build_app(model_names=["tiny-cnn"], default_model="tiny-cnn", data_dir=str(CELLS), state_dir=state,
                         weights_dir=state / "weights", sam_variant="vit_b", decoy_roots=[])
    try:
        assert demo.services.runner().get(lost)["status"] == "interrupted"  # at start-up, before any new job
        url = launch_for_test(demo)
        client = Client(url, verbose=False)
        table, picker = client.predict(api_name="/jobs_list")
        assert table["headers"] == ["job", "kind", "state", "progress", "model", "started", "finished", "error"]
        rows = {row[0]: dict(zip(table["headers"], row)) for row in table["data"]}
        assert rows[lost]["kind"] == "sleep-steps" and rows[lost]["model"] == "tiny-cnn"
        assert rows[lost]["state"] == "interrupted" and "gone" in rows[lost]["error"] and rows[lost]["started"]
        assert rows[finished]["state"] == "done" and rows[finished]["progress"] == "1/1" and rows[finished]["finished"]
        status = client.predict(finished, api_name="/open_job")
        assert "done" in str(status)
        text = client.predict(api_name="/finetune_status")[0]
        assert "done" in text
        from gradio_client.exceptions import AppError

        with pytest.raises(AppError, match="only interrupted, failed or cancelled"):
            client.predict(finished, api_name="/resume_job")
        assert "queued again" in str(client.predict(lost, api_name="/resume_job"))
        assert demo.services.runner().wait(lost, timeout=60)["status"] == "done"
    finally:
        demo.services.runner().shutdown()
        demo.close()


def test_data_sets_by_name_and_enlarged_downloads(running):
    """Issue 11.14: the browser and the review take a named data set (no server path); the overlays download at
    the image's own size or enlarged."""
    _, client, _ = running
    gallery, info, classes, page = client.predict("bloodmnist-cells", "all", 1, api_name="/browse")
    assert len(gallery) == 24 and "24 images" in info
    picked = client.predict("bloodmnist-cells", 5, api_name="/browse_pick")
    with Image.open(picked) as picture:
        assert picture.size == (64, 64)
    gallery, progress, page, classes = client.predict("bloodmnist-cells", "tiny-cnn", 24, "all", "all", "dr-named",
                                                      api_name="/review_load")
    assert len(gallery) == 24 and "Reviewed 0 of 24" in progress
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="no data set named"):
        client.predict("nowhere", "all", 1, api_name="/browse")
    explain(client)
    files = client.predict(0.5, "cividis", "enlarged", api_name="/downloads")
    files = files["value"] if isinstance(files, dict) else files
    files = [f if isinstance(f, str) else f["path"] for f in files]
    assert explained_names(Path(f).name for f in files) == ["curves.csv", "overlay-aha-1024x1024.png",
                                                           "overlay-gradcam-1024x1024.png", "report.json"]
    with Image.open(next(f for f in files if "overlay-aha" in f)) as picture:
        assert picture.size == (1024, 1024)


def test_outline_of_the_top_share_redraws_without_a_model_pass(running):
    """Issue 11.11 (optional part): moving the top-% outline redraws the overlays from the cached maps."""
    demo, client, _ = running
    explain(client)
    with forward_passes(demo.services.bundle("tiny-cnn").network) as calls:
        outlined = client.predict(20, 0.5, "cividis", api_name="/outline")
        plain = client.predict(0, 0.5, "cividis", api_name="/outline")
    assert calls == []  # no model pass
    assert len(outlined) == len(plain) == 2
    for with_line, without in zip(outlined, plain):
        a, b = (np.asarray(Image.open(item["image"]).convert("RGB")) for item in (with_line, without))
        line = np.abs(a.astype(int) - b.astype(int)).max(axis=2) > 60  # beyond the JPEG noise of the gallery
        assert 0 < line.mean() < 0.3  # a line, not a fill
        assert (np.abs(np.median(a[line], axis=0) - (213, 94, 0)) < 30).all()  # in vermillion


def explained_names(names) -> list:
    """The downloads' names after "<image>-tiny-cnn-<explained class>-", each checked to start so."""
    import re

    names = list(names)
    prefix = f"{Path(CELL).stem}-tiny-cnn-class-"
    assert all(re.match(re.escape(prefix) + r"\d+-", n) for n in names), names
    return sorted(re.sub(re.escape(prefix) + r"\d+-", "", n) for n in names)


def test_explain_without_an_image_is_said_in_the_status_line(running):
    """The page's Explain button with no image: our sentence in the status line and every other panel left as it
    was (no error event, so no red "Error" badge on each panel); the API's /explain still answers with an error."""
    import gradio as gr
    from gradio_client.exceptions import AppError

    from saliency_lab.explain import NO_IMAGE
    from saliency_lab.ui.explain import explain_stream_handler

    demo, client, _ = running
    page = explain_stream_handler(demo.services, refusals_in_status=True)
    answers = list(page(None, "tiny-cnn", ["gradcam"], "auto", *sliders(), 0.5, "cividis", 10))
    assert len(answers) == 1 and len(answers[0]) == 8
    assert answers[0][5] == "⚠ " + NO_IMAGE
    assert all(isinstance(part, type(gr.skip())) and part == gr.skip()
               for i, part in enumerate(answers[0]) if i != 5)
    with pytest.raises(AppError, match="Upload an image"):
        client.predict(None, "tiny-cnn", ["gradcam"], "auto", *sliders(), 0.5, "cividis", 10, api_name="/explain")
