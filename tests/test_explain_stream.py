"""The Explain tab's streamed explanation (issue 36): each map and its curves as soon as computed, the quickest
first; the expected times priced as the work runs (batched passes) and checked against measured runs; the curve
step viewer (what deletion and insertion feed the model at step k, no model pass); download names; one message of
ours for a model that cannot be loaded. Tiny models built here, the cells shipped in assets/."""
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import tiny_cnn
from saliency_lab import explain, figures

torch.set_num_threads(1)
CELLS = Path(__file__).resolve().parent.parent / "assets" / "bloodmnist"
CELL = str(CELLS / "test_00000.jpg")


def services_for(tmp_path, *bundles):
    from saliency_lab.services import Services

    table = {b.name: b for b in bundles}
    return Services(table.__getitem__, list(table), tmp_path)


def test_the_stream_shows_each_map_and_its_curves_before_a_slow_method_runs(tmp_path, monkeypatch):
    """RISE (slow) ticked before Grad-CAM: Grad-CAM's map, then its curves, come while RISE is still pending;
    every yield adds one thing; the results stay in menu order and end with both curves. (No method counts as
    quick here: the path of methods shown one by one.)"""
    monkeypatch.setattr(explain, "QUICK_SECONDS", 0.0)
    bundle = tiny_cnn("stream-cnn", num_classes=8)
    services = services_for(tmp_path, bundle)
    steps = list(explain.explain_stream(services, CELL, bundle.name, ["rise", "gradcam"]))
    states = [state for state, _ in steps]
    assert states[0]["results"] == [] and [label for label, _ in states[0]["pending"]] == ["Grad-CAM", "RISE"]
    first_map = next(s for s in states if s["results"])
    assert [r["method"] for r in first_map["results"]] == ["gradcam"] and first_map["results"][0]["fractions"] is None
    assert [label for label, _ in first_map["pending"]] == ["RISE"]
    assert "RISE" in explain.still_running_text(first_map) and "curves of Grad-CAM" in explain.status_text(first_map)
    first_curves = next(s for s in states if explain.curve_methods(s))
    assert explain.curve_methods(first_curves) == [("Grad-CAM", "gradcam")]
    assert [label for label, _ in first_curves["pending"]] == ["RISE"]  # RISE has not run yet
    final = states[-1]
    assert "pending" not in final and explain.still_running_text(final) == ""
    assert [r["method"] for r in final["results"]] == ["gradcam", "rise"]  # menu order (Grad-CAM before RISE)
    assert all(r["fractions"] is not None for r in final["results"])
    assert len(states) == 5  # prediction, Grad-CAM's map, its curves, RISE's map, done (with RISE's curves)
    # the same maps and curves as the two-step path
    maps, _ = explain.explain_maps(services, CELL, bundle.name, ["gradcam"])
    assert np.allclose(maps["results"][0]["map"], final["results"][0]["map"])


def test_quick_methods_come_in_one_update_with_the_prediction(tmp_path, monkeypatch):
    """Each update costs the page a round trip: the maps of the methods expected to take QUICK_SECONDS together
    come with the prediction, their curves in one more update, then the slow method's map; the last update is the
    whole explanation (4 updates for 3 methods, 8 when each came alone)."""
    expected = {"gradcam": 0.01, "random": 0.02, "rise": 5.0}
    monkeypatch.setattr(explain, "expected_seconds", lambda services, bundle, method, values=None: expected[method])
    bundle = tiny_cnn("stream-quick", num_classes=8)
    services = services_for(tmp_path, bundle)
    states = [s for s, _ in explain.explain_stream(services, CELL, bundle.name, ["rise", "gradcam", "random"])]
    assert explain.quick_methods(["gradcam", "random", "rise"], expected) == ["gradcam", "random"]
    first = states[0]
    assert [r["method"] for r in first["results"]] == ["gradcam", "random"]  # the prediction comes with them
    assert [label for label, _ in first["pending"]] == ["RISE"]
    assert "curves of Grad-CAM, Random (baseline)" in explain.still_running_text(first)
    assert explain.curve_methods(states[1]) == [("Grad-CAM", "gradcam"), ("Random (baseline)", "random")]
    assert [label for label, _ in states[1]["pending"]] == ["RISE"]
    assert [r["method"] for r in states[2]["results"]] == ["gradcam", "rise", "random"]  # menu order
    assert states[2]["results"][1]["fractions"] is None and "curves of RISE" in explain.still_running_text(states[2])
    assert len(states) == 4 and "pending" not in states[3]
    assert all(r["fractions"] is not None for r in states[3]["results"])
    # a first method expected to take longer than QUICK_SECONDS: the prediction is shown before it runs
    assert explain.quick_methods(["rise"], expected) == []
    alone = [s for s, _ in explain.explain_stream(services, CELL, bundle.name, ["rise"])]
    assert alone[0]["results"] == [] and len(alone) == 3  # prediction, RISE's map, done


def test_a_method_that_cannot_run_is_skipped_in_the_stream(tmp_path):
    bundle = tiny_cnn("stream-skip", num_classes=8)
    warnings = []
    states = [s for s, _ in explain.explain_stream(services_for(tmp_path, bundle), CELL, bundle.name,
                                                   ["gradcam", "rollout"], warn=warnings.append)]
    assert [r["method"] for r in states[-1]["results"]] == ["gradcam"]
    assert any("Attention rollout" in note for note in states[-1]["skipped"]) and warnings


class CallCostNet(torch.nn.Module):
    """A model whose every call costs 20 ms whatever its batch (as a real model's per-call overhead, larger than
    its per-image cost at small sizes), plus a tiny convolution per image."""

    def __init__(self, classes=8):
        super().__init__()
        torch.manual_seed(0)
        self.layer4 = torch.nn.Conv2d(3, classes, 3, padding=1)
        self.calls = []  # (batch size, seconds) of every call

    def forward(self, x):
        started = time.perf_counter()
        time.sleep(0.02)
        out = self.layer4(x).mean(dim=(2, 3))
        self.calls.append((x.shape[0], time.perf_counter() - started))
        return out


def call_cost_bundle(name="call-cost"):
    from explainers.models import ModelBundle

    return ModelBundle(name=name, network=CallCostNet().eval(), mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5),
                       input_size=(32, 32), class_names=[f"class {i}" for i in range(8)], family="cnn",
                       reference_color=(0.5, 0.5, 0.5), cam_layer_name="layer4")


def test_the_expected_times_agree_with_measured_runs(tmp_path):
    """The estimate before any run, checked against the run: RISE (300 masks in batches of 100) and the curves
    (42 images in one batch) priced as the calls and images they are, within a factor of 2 of the model time they
    take (RISE's mask making, outside the model, is not priced: on the bundled ViT the model is most of it).
    Priced at the per-image time of a batch of 8 (the estimate before 2026-12-04) they were over-counted 4-10
    times (RISE "about 23 s" for 6-7 s on the bundled ViT)."""
    from explainers import engine

    bundle = call_cost_bundle()
    services = services_for(tmp_path, bundle)
    expected_rise = explain.expected_seconds(services, bundle, "rise")
    expected_curves = explain.expected_curves_seconds(services, bundle)
    per_call, per_image = services.pass_costs(bundle)
    assert 0.015 <= per_call <= 0.1 and per_image < per_call
    _, image = explain.prepared(services, bundle.name, CELL)
    options = engine.method_options("rise", None, bundle)
    passes = explain.method_passes(bundle, "rise")
    assert options["n_masks"] == passes
    network = bundle.network
    network.calls.clear()
    record = engine.run_method(bundle, image, "rise", 0, options, curves=False)
    rise_calls, network.calls[:] = list(network.calls), []
    engine.add_curves(bundle, image, record)
    curve_calls = list(network.calls)
    # what the estimate counts is what runs: RISE's masks in batches of METHOD_BATCH, the curves in one call
    assert [b for b, _ in rise_calls] == [explain.METHOD_BATCH] * (passes // explain.METHOD_BATCH)
    assert [b for b, _ in curve_calls] == [explain.CURVE_PASSES]
    # and the model time it prices is the model time measured
    rise, curves = sum(t for _, t in rise_calls), sum(t for _, t in curve_calls)
    assert 0.5 <= expected_rise / rise <= 2, (expected_rise, rise)
    assert 0.5 <= expected_curves / curves <= 2, (expected_curves, curves)
    old_price = services.image_seconds(bundle, 8)  # the estimate before 2026-12-04: per image at batch 8
    assert passes * old_price / rise > 2 and explain.CURVE_PASSES * old_price / curves > 2  # over-counted
    # a measured run is what is expected next
    states = [s for s, _ in explain.explain_stream(services, CELL, bundle.name, ["gradcam"])]
    assert states and explain.expected_curves_seconds(services, bundle) == services.measured_seconds(
        bundle.name, explain.CURVES_KEY)
    assert "then the curves" in explain.expected_text(services, bundle.name, ["gradcam"])


def test_the_step_viewer_shows_what_the_model_saw_at_each_step(tmp_path):
    """The pictures of step k are the images the curves fed the model: the model's probability of the target on
    them is the curve's value at k (no model pass was needed to show it); step 0 of deletion and the last step of
    insertion are the image itself."""
    bundle = tiny_cnn("steps-cnn", num_classes=8)
    services = services_for(tmp_path, bundle)
    state = [s for s, _ in explain.explain_stream(services, CELL, bundle.name, ["gradcam"])][-1]
    record = state["results"][0]
    _, image = explain.prepared(services, bundle.name, CELL)
    h, w = image.tensor.shape[-2:]
    for step in (0, 4, 20):
        (deleted, del_text), (inserted, ins_text) = explain.curve_step(services, state, "gradcam", step, image)
        assert deleted.size[0] >= 256 and f"step {step}/20" in del_text
        for picture, values in ((deleted, record["deletion"]), (inserted, record["insertion"])):
            small = np.asarray(picture.resize((w, h), 0), dtype=np.float32) / 255.0
            tensor = torch.as_tensor(small).permute(2, 0, 1)[None]
            with torch.no_grad():
                p = bundle(tensor).softmax(1)[0, record["target"]].item()
            assert abs(p - values[step]) < 0.02, (step, p, values[step])  # 8-bit pictures of the same pixels
        assert f"{record['deletion'][step]:.3f}" in del_text and f"{record['insertion'][step]:.3f}" in ins_text
    original = np.asarray(explain.curve_step(services, state, "gradcam", 0, image)[0][0].resize((w, h), 0))
    restored = np.asarray(explain.curve_step(services, state, "gradcam", 20, image)[1][0].resize((w, h), 0))
    assert np.array_equal(original, restored)
    with pytest.raises(ValueError, match="not computed"):
        explain.curve_step(services, {**state, "results": [{**record, "fractions": None}]}, "gradcam", 3)


def test_downloads_are_named_after_the_image_and_the_model(tmp_path):
    bundle = tiny_cnn("named-cnn", num_classes=8)
    services = services_for(tmp_path, bundle)
    names = set()
    for cell in ("test_00000.jpg", "test_00001.jpg"):
        state = [s for s, _ in explain.explain_stream(services, str(CELLS / cell), bundle.name, ["gradcam"])][-1]
        paths = explain.write_downloads(services, state, 0.5, "cividis")
        stem = f"{Path(cell).stem}-named-cnn-{explain.safe_part(state['target_name'], 'class')}"  # the class too
        assert sorted(p.name for p in paths) == sorted(f"{stem}-{n}" for n in (
            "overlay-gradcam.png", "curves.csv", "report.json"))
        assert all(p.exists() for p in paths)
        names |= {p.name for p in paths}
        shown = explain.overlay_pictures(services, state, 0.5, "cividis")
        assert Path(shown[0][0]).name == f"{stem}-gradcam.jpg"  # the gallery's download button
    assert len(names) == 6  # the second image's files do not replace the first's
    assert explain.download_prefix({"image_name": "../../etc/pass wd.png", "model": "hub:org/model"}) == \
        "pass-wd-hub-org-model"
    assert explain.download_prefix({"image_name": "c.png", "model": "m", "target_name": "immature granulocytes (ig)"}) \
        == "c-m-immature-granulocytes-ig"
    assert explain.safe_part("...", "image") == "image"


def test_curves_are_small_multiples_one_panel_per_method():
    rng = np.random.default_rng(0)
    methods = ["aha", "gradskip", "gradcam", "chefer", "rollout", "occlusion", "rise"]
    fractions = list(np.linspace(0, 1, 21))
    records = [{"method": m, "label": m.upper(), "target_name": "cell", "fractions": fractions,
                "deletion": list(np.sort(rng.random(21))[::-1]), "insertion": list(np.sort(rng.random(21))),
                "deletion_auc": 0.2, "insertion_auc": 0.6} for m in methods]
    figure = figures.curves_figure(records).to_dict()
    axes = {(t["xaxis"], t["yaxis"]) for t in figure["data"]}
    assert len(figure["data"]) == 14 and len(axes) == 7  # each method's pair on its own axes
    titles = [a["text"] for a in figure["layout"]["annotations"]]
    assert len(titles) == 7 and all("del 0.200" in t and "ins 0.600" in t for t in titles)
    domains = [figure["layout"][f"yaxis{'' if i == 0 else i + 1}"]["domain"] for i in range(7)]
    assert all(0 <= low < high <= 1 for low, high in domains)
    xdomains = [tuple(figure["layout"][f"xaxis{'' if i == 0 else i + 1}"]["domain"]) for i in range(7)]
    for i in range(7):  # panels never overlap
        for j in range(i + 1, 7):
            x_overlap = min(xdomains[i][1], xdomains[j][1]) > max(xdomains[i][0], xdomains[j][0])
            y_overlap = min(domains[i][1], domains[j][1]) > max(domains[i][0], domains[j][0])
            assert not (x_overlap and y_overlap), (i, j)
    step = figures.step_figure(records[0], 5).to_dict()
    marks = step["data"][-1]
    assert marks["y"] == [records[0]["deletion"][5], records[0]["insertion"][5]] and marks["x"] == [25.0, 25.0]


def test_a_model_that_cannot_be_loaded_is_one_message_of_ours(tmp_path):
    """A hub model offline: the info line says so in our words; the methods and sliders are left as they were
    (no error badge on them) and the expected-time line is empty rather than a second error."""
    import gradio as gr

    from explainers.models import ModelUnavailableError
    from saliency_lab.services import Services
    from saliency_lab.ui import explain as tab

    def loader(name):
        raise ModelUnavailableError(f"{name} is not downloaded yet and this machine is offline.")

    services = Services(loader, ["hub:org/vit"], tmp_path)
    outputs = tab.model_change_handler(services)("hub:org/vit", ["gradcam"])
    # (methods, each slider, the info line, the classifier view, the segmentation view)
    info_at = 1 + len(tab.SLIDERS)
    assert all(isinstance(o, type(gr.skip())) or o == gr.skip() for o in outputs[:info_at])
    info = outputs[info_at]
    assert outputs[info_at + 1]["visible"] is True and outputs[info_at + 2]["visible"] is False
    assert "hub:org/vit could not be loaded" in info and "offline" in info and "Error" not in info
    assert tab.expected_handler(services)("hub:org/vit", ["gradcam"]) == ""

    def broken(name):
        raise OSError("LocalEntryNotFoundError: Cannot find the requested files in the disk cache")

    info = tab.model_change_handler(Services(broken, ["x"], tmp_path / "b"))("x", ["gradcam"])[info_at]
    assert "LocalEntryNotFound" not in info and "server log" in info


def test_after_a_failed_load_the_menu_goes_back_to_the_model_that_loaded(tmp_path):
    """The menu does not keep the model that failed beside the previous model's methods: it goes back to that
    model, and the failure stays said on the info line until another pick."""
    import gradio as gr

    from explainers.models import ModelUnavailableError
    from saliency_lab.services import Services
    from saliency_lab.ui import explain as tab
    from conftest import tiny_cnn

    good = tiny_cnn("tiny-good")

    def loader(name):
        if name == "tiny-good":
            return good
        raise ModelUnavailableError(f"{name} is not downloaded yet and this machine is offline.")

    on_model = tab.model_change_handler(Services(loader, ["tiny-good", "resnet50"], tmp_path))
    info_at = 1 + len(tab.SLIDERS)

    def pick(name, memory):
        return tab.after_model(name, on_model(name, ["gradcam"])[info_at], memory)

    menu, info, memory = pick("tiny-good", {})
    assert menu == gr.skip() and info == gr.skip() and memory["good"] == "tiny-good"
    menu, note, memory = pick("resnet50", memory)
    assert menu["value"] == "tiny-good"  # the menu goes back
    assert "resnet50 could not be loaded" in note and "offline" in note and "back on tiny-good" in note
    menu, info, memory = pick("tiny-good", memory)  # the menu's change when it is put back
    assert menu == gr.skip() and info == note  # the failure stays said
    assert pick("tiny-good", memory)[1] == gr.skip()  # said once: the next pick shows its own line
