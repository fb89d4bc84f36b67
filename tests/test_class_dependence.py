"""Does a method's map change with the class asked about? The measurement (`explainers.sanity.class_dependence`),
its record in an AHA explainer's card, and the caveat the app, the report and the CLI show for a class-blind one pass."""
import json

import numpy as np
import pytest
import torch

from conftest import tiny_cnn
from explainers import engine
from explainers.aha.network import AHAExplainer
from explainers.aha.store import explainer_stem, forget_explainers, save_explainer, store_class_dependence
from explainers.methods import METHODS, parse_method_spec
from explainers.methods.base import ALL_FAMILIES, Method
from explainers.metrics import CLASS_BLIND_RHO
from explainers.sanity import class_dependence


class RampByClass(Method):
    """A known answer: a raster-order ramp for even classes, the same ramp reversed for odd ones (rho -1 between
    any even and odd class), or the same ramp for every class (`blind`: rho 1)."""
    name = "ramp-by-class"
    families = ALL_FAMILIES

    def __init__(self, blind=False):
        super().__init__(blind=blind)
        self.blind = blind

    def attribute(self, bundle, images, targets):
        h, w = images.shape[-2:]
        ramp = torch.arange(h * w, dtype=torch.float32).reshape(h, w)  # every pixel a rank of its own
        odd = torch.zeros_like(targets) if self.blind else targets % 2
        return torch.stack([ramp.flip((-2, -1)) if int(o) else ramp for o in odd])


def parity_bundle():
    """A tiny CNN whose two top classes have different parity for every image (class 0 first, class 1 second)."""
    bundle = tiny_cnn()
    with torch.no_grad():
        bundle.network.get_classifier().weight.zero_()
        bundle.network.get_classifier().bias.copy_(torch.tensor([3.0, 2.0, 1.0, 0.0]))
    return bundle


def test_class_dependence_known_answers():
    bundle = parity_bundle()
    images = torch.rand(5, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    following = class_dependence(bundle, RampByClass(), images, batch_size=2)
    assert following["images"] == 5 and len(following["per_image"]) == 5
    assert following["spearman_top1_top2"] == pytest.approx(-1.0)
    assert not following["maps_agree"]
    blind = class_dependence(bundle, RampByClass(blind=True), images)
    assert blind["spearman_top1_top2"] == pytest.approx(1.0) and blind["maps_agree"]
    assert blind["ci95"] == pytest.approx([1.0, 1.0])
    assert CLASS_BLIND_RHO < 1.0


def store_rows(bundle, one_pass, refined, gradcam):
    """The card rows from hand-made per-image rhos (one pass, T=3, Grad-CAM), through the CLI's own store."""
    def row(values):
        return {"spearman_top1_top2": float(np.mean(values)), "ci95": [min(values), max(values)], "per_image": values}

    results = {"aha": row(one_pass), "aha:refine_steps=3": row(refined), "gradcam": row(gradcam)}
    return store_class_dependence(bundle, [parse_method_spec(label) for label in results], results,
                                  data="val-cells", images=len(one_pass),
                                  command="python -m explainers class-dependence ...")


@pytest.fixture
def explained_cnn(tmp_path, monkeypatch):
    monkeypatch.setenv("SALIENCY_DATA_DIR", str(tmp_path))
    bundle = tiny_cnn(name="caveat-cnn")
    forget_explainers("caveat-cnn")
    save_explainer(AHAExplainer(bundle, width=8, embed_dim=8), explainer_stem("caveat-cnn"), {"base_model": "caveat-cnn"})
    yield bundle
    forget_explainers("caveat-cnn")


def test_class_blind_one_pass_gets_a_caveat_naming_the_steps_that_follow_the_class(explained_cnn):
    bundle = explained_cnn
    card_file = store_rows(bundle, [0.95, 0.9, 0.93, 0.97], [0.5, 0.6, 0.55, 0.52], [-0.2, 0.1, 0.0, -0.1])
    card = json.loads(card_file.read_text())["class_dependence"]
    assert card["by_refine_steps"]["0"]["minus_gradcam"]["mean"] == pytest.approx(0.9875)
    assert card["gradcam"]["spearman_top1_top2"] == pytest.approx(-0.05)
    text = METHODS["aha"].caveat(bundle, {"refine_steps": 0, "mode": "trained"})
    assert "nearly the same map whatever the class" in text and "Spearman 0.94" in text
    assert "T = 3" in text and "(Spearman 0.54)" in text and "Grad-CAM -0.05" in text
    assert METHODS["aha"].caveat(bundle, {"refine_steps": 3, "mode": "trained"}) is None  # the steps follow the class
    assert METHODS["aha"].caveat(bundle, {"mode": "per-image"}) is None
    assert METHODS["gradcam"].caveat(bundle, {}) is None  # the contract's default

    # the one path from a request to a method carries it into the result, the report and the app's status line
    from saliency_lab import explain

    from PIL import Image

    picture = Image.fromarray(np.random.default_rng(2).integers(0, 255, (32, 32, 3), dtype=np.uint8))
    prepared = engine.prepare_input(picture, bundle)
    record = engine.run_method(bundle, prepared, "aha", 0, {"refine_steps": 0})
    assert record["caveat"] == text
    assert engine.report(bundle.name, [record])["methods"][0]["caveat"] == text
    state = {"model": bundle.name, "target": 0, "target_name": "x", "results": [record, dict(record)]}
    status = explain.status_text(state)
    assert status.count("**Note:** On caveat-cnn AHA's one pass") == 1  # once, however many results share it
    refined = engine.run_method(bundle, prepared, "aha", 0, {"refine_steps": 1})
    assert refined["caveat"] is None
    assert "**Note:**" not in explain.status_text({**state, "results": [refined]})


def test_no_caveat_where_gradcam_agrees_as_much_or_without_a_measurement(explained_cnn):
    bundle = explained_cnn
    assert METHODS["aha"].caveat(bundle, {"refine_steps": 0}) is None  # nothing measured yet
    # two dog breeds: the two top classes' evidence lies in one place, Grad-CAM's maps agree as much as AHA's
    store_rows(bundle, [0.9, 0.88, 0.86, 0.9], [0.8, 0.85, 0.84, 0.82], [0.87, 0.9, 0.86, 0.89])
    assert METHODS["aha"].caveat(bundle, {"refine_steps": 0}) is None
    store_rows(bundle, [0.5, 0.4, 0.6, 0.5], [0.3, 0.2, 0.3, 0.2], [0.0, 0.1, 0.0, 0.1])  # below the threshold
    assert METHODS["aha"].caveat(bundle, {"refine_steps": 0}) is None


def test_store_refuses_rows_without_their_reference_or_without_aha(explained_cnn):
    bundle = explained_cnn
    rows = {"aha": {"spearman_top1_top2": 0.9, "ci95": None, "per_image": [0.9]}}
    with pytest.raises(ValueError, match="gradcam"):
        store_class_dependence(bundle, [parse_method_spec("aha")], rows, data="d", images=1, command="c")
    rows = {"gradcam": {"spearman_top1_top2": 0.1, "ci95": None, "per_image": [0.1]}}
    with pytest.raises(ValueError, match="'aha'"):
        store_class_dependence(bundle, [parse_method_spec("gradcam")], rows, data="d", images=1, command="c")


def test_cli_measures_and_stores(explained_cnn, tmp_path, capsys):
    from PIL import Image

    from explainers.cli import main

    folder = tmp_path / "cells"
    folder.mkdir()
    generator = np.random.default_rng(0)
    for i in range(4):
        Image.fromarray(generator.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(folder / f"c{i}.png")
    out = tmp_path / "dependence.json"
    from explainers.models import register_bundle

    register_bundle(explained_cnn)  # load_model("caveat-cnn") finds the in-memory model
    assert main(["class-dependence", "--model", "caveat-cnn", "--methods", "aha,random,gradcam", "--data",
                 str(folder), "--limit", "4", "--out", str(out), "--into-card"]) == 0
    report = json.loads(out.read_text())
    assert report["images"] == 4 and report["files"] == [f"c{i}.png" for i in range(4)]
    assert report["methods"]["random"]["spearman_top1_top2"] == pytest.approx(1.0)  # one seed: the same noise
    card = json.loads((explainer_stem("caveat-cnn").parent / "aha-caveat-cnn.json").read_text())
    assert set(card["class_dependence"]["by_refine_steps"]) == {"0"}
    assert "the two maps agree" in capsys.readouterr().out


def test_an_in_memory_explainer_without_a_card_has_no_caveat():
    from explainers.aha.store import register_explainer

    bundle = tiny_cnn(name="cardless-cnn")
    register_explainer(bundle, AHAExplainer(bundle, width=8, embed_dim=8))
    try:
        assert METHODS["aha"].caveat(bundle, {"refine_steps": 0, "mode": "trained"}) is None
    finally:
        forget_explainers("cardless-cnn")


def test_a_class_following_one_pass_that_is_not_faithful_to_other_classes_says_so(explained_cnn):
    """Past the class-blind check (the card's rho is low): where the card measured the runner-up's one-pass map
    below a random map for "this class rather than the prediction", the caveat says so with the figures, and
    recommends the refinement steps only where they were above random; no caveat where the map beat random."""
    bundle = explained_cnn
    card_file = store_rows(bundle, [0.3, 0.35, 0.4, 0.3], [0.2, 0.3, 0.25, 0.3], [-0.2, 0.1, 0.0, -0.1])
    card = json.loads(card_file.read_text())
    reading = {"images": 100, "one_pass": -0.16, "random": 0.0,
               "one_pass_minus_random": {"mean": -0.16, "ci95": [-0.21, -0.12]},
               "refined": {"steps": 3, "ins_minus_del": 0.05, "minus_random": {"mean": 0.05, "ci95": [0.02, 0.08]}}}
    card["class_contrast"] = {"test": {"other_classes": reading}}
    card_file.write_text(json.dumps(card))
    forget_explainers("caveat-cnn")
    text = METHODS["aha"].caveat(bundle, {"refine_steps": 0, "mode": "trained"})
    assert "not shown faithful to that class" in text
    assert "-0.160 ins-del on 100 held-out images" in text and "(+0.000)" in text
    assert "T = 3 it scored +0.050: use them" in text
    assert METHODS["aha"].caveat(bundle, {"refine_steps": 3, "mode": "trained"}) is None

    reading["refined"]["minus_random"]["ci95"] = [-0.01, 0.03]  # the steps not above random either: no advice
    card["class_contrast"] = {"test": {"other_classes": reading}}
    card_file.write_text(json.dumps(card))
    forget_explainers("caveat-cnn")
    text = METHODS["aha"].caveat(bundle, {"refine_steps": 0, "mode": "trained"})
    assert "not above a random map either" in text and "use them" not in text

    reading["one_pass_minus_random"]["ci95"] = [0.01, 0.05]  # the one pass beat random: nothing to say
    card["class_contrast"] = {"test": {"other_classes": reading}}
    card_file.write_text(json.dumps(card))
    forget_explainers("caveat-cnn")
    assert METHODS["aha"].caveat(bundle, {"refine_steps": 0, "mode": "trained"}) is None
