"""Importing a user's model: a tiny timm resnet18 and a tiny ViT the test builds and saves as safetensors, imported
into a temporary data folder (SALIENCY_DATA_DIR), loaded, explained and evaluated; and every refusal."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import save_file

from conftest import preload_hf_cache

from explainers import models
from explainers.cli import main as cli_main
from explainers.import_model import (ImportRefused, check_weights_file, import_model, imported_models,
                                     read_class_names, remove_imported_model)

ROOT = Path(__file__).resolve().parent.parent
VIT_ARGS = {"patch_size": 8, "depth": 2, "num_heads": 2, "embed_dim": 32}


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    folder = tmp_path / "saliency-data"
    monkeypatch.setenv("SALIENCY_DATA_DIR", str(folder))
    yield folder
    for card in (folder / "models").glob("*.json"):
        models.forget(card.stem)


def resnet18_files(folder: Path, n_classes=3, seed=0):
    torch.manual_seed(seed)
    network = timm.create_model("resnet18", pretrained=False, num_classes=n_classes)
    weights = folder / "resnet18-cells.safetensors"
    save_file(network.state_dict(), str(weights))
    classes = folder / "classes.txt"
    classes.write_text("".join(f"cell type {i}\n" for i in range(n_classes)))
    return network, weights, classes


def vit_files(folder: Path, n_classes=3, seed=1):
    torch.manual_seed(seed)
    network = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=n_classes, img_size=32, **VIT_ARGS)
    weights = folder / "tiny-vit.safetensors"
    save_file(network.state_dict(), str(weights))
    classes = folder / "classes.csv"
    classes.write_text("class_index,name\n" + "".join(f"{i},kind {i}\n" for i in range(n_classes)))
    return network, weights, classes


def labelled_folder(folder: Path, n=6, size=32, n_classes=3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = ["file,class_index"]
    for i in range(n):
        Image.fromarray((rng.random((size, size, 3)) * 255).astype(np.uint8)).save(folder / f"{i}.png")
        rows.append(f"{i}.png,{i % n_classes}")
    (folder / "labels.csv").write_text("\n".join(rows) + "\n")
    return folder


def first_heatmap(name: str, method: str = "gradcam") -> dict:
    from explainers.engine import prepare_input, run_method

    bundle = models.load_model(name)
    prepared = prepare_input(Image.open(ROOT / "tests" / "data" / "cell_0.jpg").convert("RGB"), bundle)
    return run_method(bundle, prepared, method, 0, {}, steps=8)


def test_import_resnet18_with_the_cli_then_load_explain_and_list(data_dir, tmp_path, capsys):
    network, weights, classes = resnet18_files(tmp_path)
    started = time.perf_counter()
    assert cli_main(["import-model", "--arch", "resnet18", "--weights", str(weights), "--classes", str(classes),
                     "--name", "my-resnet", "--input-size", "32", "32", "--by", "tester"]) == 0
    record = first_heatmap("my-resnet")
    seconds = time.perf_counter() - started
    assert "imported 'my-resnet'" in capsys.readouterr().out
    with capsys.disabled():
        print(f"\nimport to first Grad-CAM heatmap (resnet18, 3 classes, 32x32): {seconds:.2f} s")
    card_file = data_dir / "models" / "my-resnet.json"
    card = json.loads(card_file.read_text())
    assert card["source"] == "import" and card["timm_name"] == "resnet18" and card["imported_by"] == "tester"
    assert card["class_names"] == ["cell type 0", "cell type 1", "cell type 2"]
    assert card["input_size"] == [32, 32]
    # preprocessing from timm's pretrained config for resnet18 (ImageNet statistics)
    assert card["mean"] == pytest.approx([0.485, 0.456, 0.406]) and card["std"] == pytest.approx([0.229, 0.224, 0.225])
    import hashlib

    assert card["weights_sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert card["imported_at"].endswith("+00:00") and card["import_check"]["image"] == "colour gradient"
    assert not (ROOT / "weights" / "my-resnet.json").exists()  # never in the code's weights/
    bundle = models.load_model("my-resnet")
    for key, value in network.state_dict().items():
        assert torch.equal(bundle.network.state_dict()[key], value), key
    assert bundle.family == "resnet" and bundle.num_classes == 3 and bundle.input_size == (32, 32)
    assert record["map"].shape == (32, 32) and np.isfinite(record["map"]).all()
    assert 0 <= record["deletion_auc"] <= 1 and 0 <= record["insertion_auc"] <= 1
    assert "my-resnet" in models.list_models()
    from saliency_lab import menus

    assert menus.model_label("my-resnet") == "my-resnet · imported" and menus.model_available("my-resnet")
    assert [c["name"] for c in imported_models()] == ["my-resnet"]
    from explainers.aha.store import explainer_stem

    assert explainer_stem("my-resnet") == data_dir / "models" / "aha-my-resnet"  # the explainer goes next to it
    assert explainer_stem("bloodmnist-cnn").parent == models.WEIGHTS_DIR


def test_evaluate_cli_on_an_imported_model(data_dir, tmp_path):
    _, weights, classes = resnet18_files(tmp_path)
    import_model(arch="resnet18", weights=weights, classes=classes, name="eval-resnet", input_size=(32, 32))
    folder = labelled_folder(tmp_path / "test-set")
    out = tmp_path / "report.json"
    env = dict(os.environ, SALIENCY_DATA_DIR=str(data_dir), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-m", "explainers", "evaluate", "--model", "eval-resnet", "--methods",
                             "gradcam,random", "--data", str(folder), "--steps", "8", "--out", str(out)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text())
    assert "gradcam" in json.dumps(report) and "deletion" in result.stdout.lower()


def test_tiny_vit_import_explains_with_vit_methods(data_dir, tmp_path):
    network, weights, classes = vit_files(tmp_path)
    started = time.perf_counter()
    card = import_model(arch="vit_tiny_patch16_224", weights=weights, classes=classes, name="my-vit",
                        input_size=(32, 32), model_args=json.dumps(VIT_ARGS))
    record = first_heatmap("my-vit", "rollout")
    print(f"\nimport to first rollout heatmap (tiny ViT, 32x32): {time.perf_counter() - started:.2f} s")
    assert card["timm_kwargs"]["img_size"] == [32, 32] and card["class_names"] == ["kind 0", "kind 1", "kind 2"]
    assert card["mean"] == pytest.approx([0.5, 0.5, 0.5])  # timm's config for this ViT
    bundle = models.load_model("my-vit")
    assert bundle.is_vit and bundle.patch_grid() == (4, 4) and bundle.num_prefix_tokens == 1
    for key, value in network.state_dict().items():
        assert torch.equal(bundle.network.state_dict()[key], value), key
    assert record["map"].shape == (32, 32)
    for method in ("gradcam", "chefer"):
        other = first_heatmap("my-vit", method)
        assert np.isfinite(other["map"]).all() and 0 <= other["deletion_auc"] <= 1


def test_pickle_checkpoints_are_refused_with_the_conversion_line(tmp_path):
    for suffix in (".pt", ".pth", ".bin"):
        path = tmp_path / f"model{suffix}"
        path.write_bytes(b"not read")
        with pytest.raises(ImportRefused, match="safetensors.torch.save_file\\(torch.load") as error:
            check_weights_file(path)
        assert "pickle" in str(error.value)
    fake = tmp_path / "pickle-inside.safetensors"
    torch.save({"x": torch.zeros(2)}, fake)  # a pickle under a safetensors name: the header check refuses it
    from explainers.import_model import checkpoint_shapes

    with pytest.raises(ImportRefused, match="not a safetensors file") as error:
        checkpoint_shapes(fake)
    message = str(error.value)
    assert "pickled PyTorch checkpoint renamed" in message and "safetensors.torch.save_file" in message
    assert "Error" not in message and "header too large" not in message  # our words only, not the library's


def test_wrong_keys_and_shapes_are_refused_naming_the_first(data_dir, tmp_path):
    network, _, classes = resnet18_files(tmp_path)
    state = network.state_dict()
    cases = {
        "missing": ({k: v for k, v in state.items() if k != "layer2.0.conv1.weight"}, "key 'layer2.0.conv1.weight' is missing"),
        "unexpected": ({**state, "extra.weight": torch.zeros(3)}, "unexpected key 'extra.weight'"),
        "shape": ({**state, "layer3.1.bn2.weight": torch.zeros(7)}, "'layer3.1.bn2.weight' has shape \\[7\\]"),
    }
    for label, (bad_state, message) in cases.items():
        path = tmp_path / f"{label}.safetensors"
        save_file(bad_state, str(path))
        with pytest.raises(ImportRefused, match=message):
            import_model(arch="resnet18", weights=path, classes=classes, name=f"bad-{label}", input_size=(32, 32))
    with pytest.raises(ImportRefused, match="key 'layer1.2.conv1.weight' is missing"):  # another architecture
        import_model(arch="resnet34", weights=tmp_path / "resnet18-cells.safetensors", classes=classes, name="bad-arch")
    assert not list((data_dir / "models").glob("*.safetensors*"))  # nothing left behind
    assert not list((data_dir / "models").glob(".import-*"))


def test_wrong_class_count_is_refused(data_dir, tmp_path):
    _, weights, _ = resnet18_files(tmp_path)
    four = tmp_path / "four.txt"
    four.write_text("a\nb\nc\nd\n")
    with pytest.raises(ImportRefused, match="lists 4 classes but the checkpoint's classifier 'fc.weight' has 3 outputs"):
        import_model(arch="resnet18", weights=weights, classes=four, name="four")


def test_oversize_is_refused_before_reading(data_dir, tmp_path, monkeypatch):
    import explainers.import_model as module

    big = tmp_path / "big.safetensors"
    with open(big, "wb") as handle:  # sparse: 3 MB on paper, nothing on disk
        handle.truncate(3 * 1024 * 1024)
    monkeypatch.setenv("SALIENCY_IMPORT_MAX_MB", "2")

    def must_not_read(*args, **kwargs):
        raise AssertionError("the file was read")

    monkeypatch.setattr(module, "_copy_hashing", must_not_read)
    monkeypatch.setattr(module, "checkpoint_shapes", must_not_read)
    classes = tmp_path / "c.txt"
    classes.write_text("a\nb\nc\n")
    with pytest.raises(ImportRefused, match="over the import limit of 2 MB"):
        import_model(arch="resnet18", weights=big, classes=classes, name="big")


@pytest.mark.parametrize("bad", ["../escape", "a/b", "", ".hidden", "a..b", "bloodmnist-cnn", "resnet50",
                                 "vit_base_patch16_224", "aha-mine", "x" * 200])
def test_bad_names_are_refused(data_dir, tmp_path, bad):
    _, weights, classes = resnet18_files(tmp_path)
    with pytest.raises(ValueError):
        import_model(arch="resnet18", weights=weights, classes=classes, name=bad)


def test_existing_name_forbidden_args_and_unknown_arch(data_dir, tmp_path):
    _, weights, classes = resnet18_files(tmp_path)
    import_model(arch="resnet18", weights=weights, classes=classes, name="twice", input_size=(32, 32))
    with pytest.raises(ImportRefused, match="already imported"):
        import_model(arch="resnet18", weights=weights, classes=classes, name="twice")
    card = import_model(arch="resnet18", weights=weights, classes=classes, name="twice", input_size=(40, 40),
                        crop_pct=1.0, interpolation="bilinear", mean=(0.7, 0.6, 0.5), std=(0.2, 0.2, 0.1), replace=True)
    assert card["input_size"] == [40, 40] and card["crop_pct"] == 1.0 and card["interpolation"] == "bilinear"
    bundle = models.load_model("twice")  # the replaced import is what loads
    assert bundle.input_size == (40, 40) and bundle.crop_pct == 1.0 and bundle.mean == pytest.approx((0.7, 0.6, 0.5))
    assert bundle.reference_color == pytest.approx((0.7, 0.6, 0.5))
    with pytest.raises(ImportRefused, match="Crop fraction 0.0"):
        import_model(arch="resnet18", weights=weights, classes=classes, name="crop", crop_pct=0.0)
    with pytest.raises(ImportRefused, match="'checkpoint_path' is not allowed"):
        import_model(arch="resnet18", weights=weights, classes=classes, name="args",
                     model_args={"checkpoint_path": "/tmp/x.pth"})
    with pytest.raises(ImportRefused, match="Unknown timm architecture 'not_a_net'"):
        import_model(arch="not_a_net", weights=weights, classes=classes, name="arch")


def test_class_files(tmp_path):
    text = tmp_path / "c.txt"
    text.write_text("alpha\n\n beta \ngamma\n")
    assert read_class_names(text) == ["alpha", "beta", "gamma"]
    unordered = tmp_path / "u.csv"
    unordered.write_text("index,class_name\n2,c\n0,a\n1,b\n")
    assert read_class_names(unordered) == ["a", "b", "c"]
    bare = tmp_path / "bare.csv"
    bare.write_text("1,dog\n0,cat\n")
    assert read_class_names(bare) == ["cat", "dog"]
    gaps = tmp_path / "gaps.csv"
    gaps.write_text("index,name\n0,a\n2,c\n")
    with pytest.raises(ImportRefused, match="0, 1, ..., N-1"):
        read_class_names(gaps)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(ImportRefused, match="no class names"):
        read_class_names(empty)


def test_remove_an_imported_model(data_dir, tmp_path, capsys):
    _, weights, classes = resnet18_files(tmp_path)
    import_model(arch="resnet18", weights=weights, classes=classes, name="to-remove", input_size=(32, 32))
    models.load_model("to-remove")
    (data_dir / "models" / "aha-to-remove.json").write_text("{}")  # its explainer goes with it
    assert cli_main(["remove-model", "--name", "to-remove"]) == 0
    assert "to-remove" not in models.list_models() and not models.is_loaded("to-remove")
    assert not list((data_dir / "models").iterdir())
    with pytest.raises(models.ModelUnavailableError):
        models.load_model("to-remove")
    assert cli_main(["remove-model", "--name", "bloodmnist-cnn"]) == 2  # shipped models are never removed
    assert "No imported model named 'bloodmnist-cnn'" in capsys.readouterr().err
    assert (ROOT / "weights" / "bloodmnist-cnn.json").exists()


def test_hub_import_offline_fails_at_once_and_works_from_the_cache(data_dir, tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(models, "HUB_CACHE_DIR", tmp_path / "hub")
    started = time.perf_counter()
    with pytest.raises(ImportRefused, match="offline: HF_HUB_OFFLINE is set") as error:
        import_model(arch="hf-hub:someone/their-net", name="from-hub")
    assert time.perf_counter() - started < 20
    assert "import a local .safetensors file" in str(error.value)
    # a repository already in the cache (e.g. a Space's preload_from_hub) imports offline
    torch.manual_seed(4)
    source = timm.create_model("resnet18", pretrained=False, num_classes=2)
    config = {"architecture": "resnet18", "num_classes": 2, "label_names": ["benign", "malignant"],
              "pretrained_cfg": {"input_size": [3, 48, 48], "mean": [0.5, 0.4, 0.3], "std": [0.2, 0.2, 0.2],
                                 "crop_pct": 1.0, "interpolation": "bilinear", "num_classes": 2,
                                 "label_names": ["benign", "malignant"]}}
    preload_hf_cache(tmp_path / "hub", "someone/their-net", source.state_dict(), config)
    card = import_model(arch="hf-hub:someone/their-net", name="from-hub")
    assert card["source_repo"] == "someone/their-net" and card["timm_name"] == "resnet18"
    assert card["class_names"] == ["benign", "malignant"] and card["input_size"] == [48, 48]
    assert card["mean"] == pytest.approx([0.5, 0.4, 0.3])
    bundle = models.load_model("from-hub")
    for key, value in source.state_dict().items():
        assert torch.equal(bundle.network.state_dict()[key], value), key


def test_models_tab_service_imports_lists_and_removes(data_dir, tmp_path):
    from saliency_lab import models_tab
    from saliency_lab.services import Services

    services = Services(models.load_model, models.list_models, tmp_path / "state")
    _, weights, classes = vit_files(tmp_path)
    with pytest.raises(ValueError, match="Input size: give 2 numbers"):
        models_tab.import_upload(services, str(weights), str(classes), "vit_tiny_patch16_224", "tab-vit", "32")
    message = models_tab.import_upload(services, {"path": str(weights)}, str(classes), "vit_tiny_patch16_224",
                                       "tab-vit", "32 32", "", "", json.dumps(VIT_ARGS), "Dr. Test")
    assert "Imported **tab-vit**" in message and "3 classes" in message
    rows = models_tab.imported_rows()
    assert len(rows) == 1 and rows[0][0] == "tab-vit" and rows[0][2] == 3 and rows[0][3] == "32x32"
    assert rows[0][6] == "Dr. Test"
    assert "tab-vit" in services.names() and services.bundle("tab-vit").is_vit
    assert models_tab.removable_choices() == ["tab-vit"]
    assert "Removed **tab-vit**" in models_tab.remove(services, "tab-vit")
    assert models_tab.imported_rows() == [] and "tab-vit" not in services.names()


def test_train_aha_for_an_imported_model_stores_it_next_to_the_model(data_dir, tmp_path):
    """A short train-aha run on an imported model: the explainer lands in the data folder beside the model's card
    and AHA then runs in one pass for it (the app's job form for this is not built yet)."""
    from explainers.aha.store import forget_explainers
    from explainers.aha_training.loop import train_aha
    from explainers.methods import get_method

    torch.manual_seed(0)
    args = {"channels": [8, 16, 16, 16]}
    network = timm.create_model("resnet18", pretrained=False, num_classes=3, **args)
    weights = tmp_path / "aha-base.safetensors"
    save_file(network.state_dict(), str(weights))
    (tmp_path / "c.txt").write_text("a\nb\nc\n")
    import_model(arch="resnet18", weights=weights, classes=tmp_path / "c.txt", name="base-model",
                 input_size=(32, 32), model_args=args)
    folder = labelled_folder(tmp_path / "train", n=8)
    card = train_aha(model="base-model", data=str(folder), val_data=str(folder), val_limit=4, steps=2,
                     batch_size=4, checkpoint_every=1, log_every=1, progress=False, compare=())
    assert (data_dir / "models" / "aha-base-model.json").exists()
    assert (data_dir / "models" / "aha-base-model.safetensors").exists()
    assert card["base_model"] == "base-model"
    forget_explainers()
    bundle = models.load_model("base-model")
    get_method("aha").check(bundle)  # trained: no MethodNotApplicable
    record = first_heatmap("base-model", "aha")
    assert record["map"].shape == (32, 32) and np.isfinite(record["map"]).all()
    assert "base-model" in models.list_models() and "aha-base-model" not in models.list_models()
    remove_imported_model("base-model")
    assert not list((data_dir / "models").glob("aha-base-model*"))


def test_an_imported_models_familiarity_statistics_live_beside_it_and_leave_with_it(data_dir, tmp_path):
    """`familiarity` without --out stores the statistics in the data folder beside the imported model (never in
    weights/); a fresh load of the model finds them; `remove-model` removes them with the model."""
    from explainers import familiarity
    from explainers.cli import main
    from explainers.import_model import remove_imported_model
    from explainers.models import WEIGHTS_DIR, forget, load_model

    _, weights, classes = resnet18_files(tmp_path)
    import_model(arch="resnet18", weights=weights, classes=classes, name="fam-resnet", input_size=(32, 32))
    folder = labelled_folder(tmp_path / "cells")
    assert main(["familiarity", "--model", "fam-resnet", "--train", str(folder), "--val", str(folder)]) == 0
    stored = familiarity.stats_path("fam-resnet")
    assert stored is not None and Path(WEIGHTS_DIR) not in stored.parents and data_dir in stored.parents
    assert stored.with_suffix(".json").exists()
    forget("fam-resnet")
    assert familiarity.get_stats(load_model("fam-resnet")) is not None
    removed = remove_imported_model("fam-resnet")
    assert str(stored) in removed and not stored.exists() and familiarity.stats_path("fam-resnet") is None
