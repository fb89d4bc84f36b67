"""Model kinds as registered loaders with one card store (`explainers.models`: `find`, `cards`, `names`,
`kind_of`; `explainers.bundle.register_kind`)."""
import json
import re
from pathlib import Path

import pytest
import torch

from explainers import models
from explainers.bundle import MODEL_KINDS, ModelBundle, ModelKind, ModelUnavailableError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SALIENCY_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def test_one_store_lists_every_kind_shipped():
    assert models.names("classifier") == models.list_models()
    assert models.names("classifier")[:3] == list(models.BUNDLED_MODELS)
    assert models.names("segmentation")[0] == "bccd-segformer"
    assert "nvidia/segformer-b0-finetuned-ade-512-512" in models.names("segmentation")
    assert "aha-bloodmnist-cnn" in models.names("aha-explainer")
    assert "defend_the_center-camal" in models.names("agent")  # in the agents' subfolder of the store
    assert not set(models.names("classifier")) & set(models.names("segmentation"))


def test_find_is_one_card_of_one_kind(data_dir):
    card = models.find("classifier", "bloodmnist-cnn")
    assert card.kind == "classifier" and card.path == Path(models.WEIGHTS_DIR) / "bloodmnist-cnn.json"
    assert card.weights.exists()
    assert models.find("segmentation", "bloodmnist-cnn") is None  # another kind: not found
    assert models.find("classifier", "no-such-model") is None
    with pytest.raises(ValueError):
        models.find("classifier", "../weights/bloodmnist-cnn")  # a name is never a path
    user = models.card_folders()[1]
    (user / "mine.json").write_text(json.dumps({"kind": "segmentation"}))
    (user / "bloodmnist-cnn.json").write_text(json.dumps({"kind": "segmentation"}))
    assert models.find("segmentation", "mine").path == user / "mine.json"
    assert models.find(None, "bloodmnist-cnn").kind == "classifier"  # the shipped card wins
    assert "mine" in models.names("segmentation") and models.names("segmentation").count("bloodmnist-cnn") == 0


def test_kind_of_a_name_without_loading():
    assert models.kind_of("bloodmnist-vit") == "classifier"
    assert models.kind_of("bccd-segformer") == "segmentation"
    assert models.kind_of("nvidia/segformer-b0-finetuned-ade-512-512") == "segmentation"  # a hub repository
    assert models.kind_of("someone/any-repository") == "segmentation"  # by its form, not by a word in it
    assert models.kind_of("resnet50") == "classifier"  # a timm name: the default kind


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Conv2d(3, 2, 1)

    def forward(self, x):
        return self.layer(x).mean(dim=(2, 3))


def test_a_new_kind_is_its_loader_alone(data_dir, monkeypatch):
    """A kind registered by its loader is found, listed and loaded with no line of the model zoo changed."""
    built = []

    def from_card(name, card, weights):
        built.append((name, card["kind"], weights.name))
        return ModelBundle(name=name, network=Tiny(), mean=(0.5,) * 3, std=(0.5,) * 3, input_size=(8, 8),
                           class_names=card["class_names"], family="cnn", reference_color=(0.5,) * 3,
                           cam_layer_name="layer", card=card)

    monkeypatch.setitem(MODEL_KINDS, "toy", ModelKind("toy", from_card=from_card, hub=("toy-hub",)))
    folder = models.card_folders()[1]
    (folder / "my-toy.json").write_text(json.dumps({"kind": "toy", "class_names": ["a", "b"]}))
    assert models.names("toy") == ["my-toy", "toy-hub"]
    assert models.kind_of("my-toy") == "toy" and models.kind_of("toy-hub") == "toy"
    bundle = models.load_model("my-toy")
    try:
        assert built == [("my-toy", "toy", "my-toy.safetensors")] and bundle.class_names == ["a", "b"]
        assert models.load_card(folder / "my-toy.json").name == "my-toy"
    finally:
        models.forget("my-toy")
    assert "my-toy" not in models.list_models()


def test_a_card_of_no_model_kind_is_refused_in_words():
    with pytest.raises(ModelUnavailableError, match="not of a model kind"):
        models.load_card(Path(models.WEIGHTS_DIR) / "aha-bloodmnist-cnn.json")


def test_no_kind_is_told_by_a_word_in_its_name_and_services_list_without_a_tab():
    for path in (ROOT / "explainers" / "models.py", ROOT / "saliency_lab" / "segmentation.py",
                 ROOT / "saliency_lab" / "services.py"):
        assert not re.search(r"""["']segformer["']\s+in\s+""", path.read_text()), path.name
    services = (ROOT / "saliency_lab" / "services.py").read_text()
    tabs = ("segmentation", "agents", "explain", "learn", "review", "studies", "masks", "browse", "models_tab")
    imported = re.findall(r"^\s*(?:from|import)\s+(\S+)", services, flags=re.MULTILINE)
    ours = [name for name in imported if name.startswith((".", "saliency_lab"))]
    assert not [name for name in ours if name.split(".")[-1] in tabs], ours
