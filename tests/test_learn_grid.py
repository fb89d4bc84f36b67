"""The Learn tab's grid pointing game ("why this class and not that one") through its service functions:
known answers (an oracle that points at the right quadrant scores 1, at the wrong one 0), the same numbers as
the `gridpg` library run on the shipped cells, and drawing another class without a model pass."""
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import tiny_cnn
from explainers.data import open_dataset
from explainers.gridpg import plan_mosaics, quadrant_masks, run_gridpg
from explainers.methods import METHODS
from explainers.methods.base import Method
from saliency_lab import learn

CELLS = Path(__file__).resolve().parent.parent / "assets" / "bloodmnist"


class Oracle(Method):
    """Puts all of a class's map in a chosen quadrant: `where[class]` (+ `shift`, mod 4). Counts its calls."""

    name = "test-oracle"
    label = "Oracle (test)"
    where: dict = {}
    shift = 0
    calls = 0

    def attribute(self, bundle, images, targets):
        Oracle.calls += 1  # both oracles count here
        masks = quadrant_masks(*images.shape[-2:], device=images.device)
        return torch.stack([masks[(self.where[int(t)] + self.shift) % 4] for t in targets]).float()


class WrongOracle(Oracle):
    name = "test-wrong-oracle"
    label = "Wrong oracle (test)"
    shift = 1


@pytest.fixture
def services(tmp_path, monkeypatch):
    from saliency_lab.services import Services

    torch.set_num_threads(1)
    bundle = tiny_cnn(name="grid-cnn", size=64, num_classes=8)  # cells at 64 px, mosaics of 128 px
    monkeypatch.setitem(METHODS, Oracle.name, Oracle)
    monkeypatch.setitem(METHODS, WrongOracle.name, WrongOracle)
    return Services(lambda name: bundle, ["grid-cnn"], tmp_path / "state")


def aim(seed):
    cells, classes = plan_mosaics(open_dataset(str(CELLS)).labels, 1, seed)[0]
    Oracle.where = {c: q for q, c in enumerate(classes)}
    return classes


@pytest.mark.parametrize("seed", [0, 5])
def test_known_answers_and_the_four_quadrants(services, seed):
    classes = aim(seed)
    result = learn.grid_mosaic(services, "grid-cnn", seed, ["test-oracle", "test-wrong-oracle", "random", "gradcam"])
    assert result["classes"] == classes and len(set(classes)) == 4
    assert result["quadrants"] == ["top-left", "top-right", "bottom-left", "bottom-right"]
    assert result["scores"]["test-oracle"] == [1.0, 1.0, 1.0, 1.0]
    assert result["scores"]["test-wrong-oracle"] == [0.0, 0.0, 0.0, 0.0]
    for method in ("random", "gradcam"):
        assert len(result["scores"][method]) == 4 and all(0.0 <= v <= 1.0 for v in result["scores"][method])
        assert result["maps"][method].shape == (4, 128, 128)
    assert abs(np.mean(result["scores"]["random"]) - 0.25) < 0.05  # uniform noise: about the chance level
    assert len(result["sensitivity"]) == 4 and np.isfinite(result["sensitivity"]).all()
    assert result["picture"].size == (128, 128)
    # the four cells sit in their quadrants: the top-left quadrant of the mosaic is the first cell (resized)
    first = np.asarray(open_dataset(str(CELLS)).image(plan_mosaics(open_dataset(str(CELLS)).labels, 1, seed)[0][0][0])
                       .convert("RGB"))
    assert np.abs(np.asarray(result["picture"])[:64, :64].astype(int) - first.astype(int)).mean() < 2


def test_the_view_is_the_first_mosaic_of_the_gridpg_run(services):
    """The app computes what `python -m explainers gridpg --data assets/bloodmnist --seed S` does."""
    result = learn.grid_mosaic(services, "grid-cnn", 3, ["gradcam", "random"])
    report = run_gridpg(services.bundle("grid-cnn"), str(CELLS), ["gradcam", "random"], n_mosaics=1, seed=3,
                        progress=False)
    for method in ("gradcam", "random"):
        assert result["scores"][method] == pytest.approx(report["methods"][method]["per_class"][0], abs=1e-6)
    assert result["sensitivity"] == pytest.approx(report["model_quadrant_sensitivity"]["per_mosaic"][0], abs=1e-6)
    assert result["files"] == report["mosaics"][0]["files"]


def test_changing_the_displayed_class_does_not_recompute(services):
    aim(1)
    Oracle.calls = 0
    result = learn.grid_mosaic(services, "grid-cnn", 1, ["test-oracle", "random"])
    assert Oracle.calls == 1  # the four maps in one batch
    items, text = learn.grid_view(services, result, "all")
    assert len(items) == 1 + 4 * 2  # the mosaic, then 2 methods x 4 classes
    assert "| **1.00** |" in text and "quadrant sensitivity" in text
    for shown in ("0", "1", "2", "3", "all"):
        items, text = learn.grid_view(services, result, shown)
        assert len(items) == (9 if shown == "all" else 3)
    q = 2
    items, _ = learn.grid_view(services, result, str(q))
    assert f"why {result['class_names'][q]} ({result['quadrants'][q]})" in items[1][1] and "GridPG 1.00" in items[1][1]
    assert Oracle.calls == 1  # drawing only
    again = learn.grid_mosaic(services, "grid-cnn", 1, ["test-oracle", "random", "test-wrong-oracle"])
    assert Oracle.calls == 2  # only the added method ran
    assert again["scores"]["test-oracle"] == result["scores"]["test-oracle"]
    aim(2)
    assert learn.grid_mosaic(services, "grid-cnn", 2, ["test-oracle"])["scores"]["test-oracle"] == [1.0] * 4
    assert Oracle.calls == 3  # another mosaic: computed


def test_a_method_that_cannot_explain_the_model_is_skipped_with_a_note(services):
    result = learn.grid_mosaic(services, "grid-cnn", 0, ["chefer", "random"])
    assert result["methods"] == ["random"] and "chefer" in result["skipped"]
    _, text = learn.grid_view(services, result, "all")
    assert "Skipped Gradient rollout (Chefer)" in text
    with pytest.raises(ValueError):
        learn.grid_mosaic(services, "grid-cnn", 0, [])
    with pytest.raises(ValueError):
        learn.grid_view(services, None, "all")


@pytest.mark.parametrize("model", learn.GRID_MODELS)
def test_the_shipped_grid_models(tmp_path, model):
    """bloodmnist-vit-grid takes 128 px mosaics of 64 px cells as they are (its card's grid_cell_size); the CNN
    takes them through global pooling. Both give four scores in [0, 1] per method."""
    from explainers.models import card_path, load_model
    from saliency_lab.services import Services

    if not card_path(model).exists():
        pytest.skip(f"{model} is not shipped in this checkout")
    torch.set_num_threads(1)
    services = Services(lambda name: load_model(name), list(learn.GRID_MODELS), tmp_path / "state")
    methods = learn.grid_default_methods(model)
    result = learn.grid_mosaic(services, model, 4, methods)
    assert result["methods"] == methods and not result["skipped"]
    assert result["mosaic_size"] == [128, 128]
    bundle, mosaic_bundle, cell_size = learn._grid_model(services, model)
    assert cell_size == (64, 64) and tuple(mosaic_bundle.input_size) == (128, 128)
    assert (mosaic_bundle is bundle) == (model == "bloodmnist-vit-grid")
    for method in methods:
        assert len(result["scores"][method]) == 4 and all(0.0 <= v <= 1.0 for v in result["scores"][method])
