"""Importing a user's own model: a timm architecture (by name, no user code is ever run), a safetensors state
dict (never a pickle), class names and the preprocessing. The imported model lives in the data folder
(`explainers.paths.user_models_dir()`: NAME.safetensors + NAME.json card), never in the code's `weights/`, and is
then listed by `list_models()` and loaded by `load_model(name)` like a shipped model.

    card = import_model(arch="resnet18", weights="my.safetensors", classes="classes.txt", name="my-resnet")
    remove_imported_model("my-resnet")
    card = import_model(arch="hf-hub:org/name", name="their-model")      # weights and config from the Hub

What is checked, before anything is written under the model's name:
- the file's extension (.pt/.pth/.bin/.ckpt/.pkl are refused with the line that converts them) and its size,
  from the file system, before it is read (`max_import_bytes()`, SALIENCY_IMPORT_MAX_MB);
- the safetensors header against the architecture built for the class list: the first missing key, unexpected
  key or wrong shape is named; a classifier head of another size says how many classes the checkpoint has;
- one forward pass on a test image gives finite logits of the right width;
- the name (letters, digits, '.', '-', '_'; not a shipped model, a timm architecture or an existing import).
"""
from __future__ import annotations

import csv
import getpass
import hashlib
import io
import json
import os
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

import timm

from .models import BUNDLED_MODELS, HUB_MODELS, ModelUnavailableError, architecture_family, forget, safe_name

PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle", ".tar")
CONVERT_HINT = ("convert it once, where you trust the file, with: python -c \"import torch, safetensors.torch; "
                "safetensors.torch.save_file(torch.load('IN.pt', weights_only=True), 'OUT.safetensors')\" "
                "(for a checkpoint that wraps the weights, save its 'state_dict' or 'model' entry)")
MAX_CLASS_FILE_BYTES = 2 * 1024 * 1024
MAX_CLASSES = 100_000
# timm keyword arguments a card may carry (data only: numbers, short words, lists of numbers); never these:
FORBIDDEN_MODEL_ARGS = {"pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "pretrained_strict", "checkpoint_path",
                        "cache_dir", "features_only", "out_indices", "feature_cfg", "num_classes", "scriptable",
                        "exportable", "no_jit", "device", "dtype"}


class ImportRefused(ValueError):
    """The model cannot be imported; the message says why and what to do."""


def max_import_bytes() -> int:
    """The size limit on an imported weights file (SALIENCY_IMPORT_MAX_MB, default 1024 MB)."""
    return int(float(os.environ.get("SALIENCY_IMPORT_MAX_MB", "1024")) * 1024 * 1024)


def _user_dir() -> Path:
    from .paths import user_models_dir

    return user_models_dir()


# --------------------------------------------------------------------------------------------- names
def check_name(name: str, *, replace: bool = False) -> str:
    """A valid, free name for an imported model (ValueError / ImportRefused otherwise)."""
    from .models import WEIGHTS_DIR

    name = safe_name((name or "").strip())
    if name.startswith("aha-"):
        raise ImportRefused(f"Model names starting with 'aha-' are reserved for AHA explainers: pick another than {name!r}.")
    if name in BUNDLED_MODELS or name in HUB_MODELS or (WEIGHTS_DIR / f"{name}.json").exists():
        raise ImportRefused(f"'{name}' is the name of a shipped model: pick another name.")
    if timm.is_model(name) or name in timm.list_pretrained(name):
        raise ImportRefused(f"'{name}' is a timm architecture name (it would hide the hub model): pick another name.")
    existing = _user_dir() / f"{name}.json"
    if existing.exists() and not replace:
        raise ImportRefused(f"A model named '{name}' is already imported: remove it first or pick another name.")
    return name


# --------------------------------------------------------------------------------------------- classes
def read_class_names(source) -> list:
    """Class names from a text file (one per line) or a CSV (a header with 'name'/'class_name'/'label' and
    optionally 'index'/'class_index'; or rows 'index,name'; or one name per row). `source` may also be a list."""
    if isinstance(source, (list, tuple)):
        names = [str(n).strip() for n in source]
    else:
        path = Path(source)
        if not path.is_file():
            raise ImportRefused(f"Class file {path.name} not found.")
        if path.stat().st_size > MAX_CLASS_FILE_BYTES:
            raise ImportRefused(f"Class file {path.name} is over {MAX_CLASS_FILE_BYTES // 1024 // 1024} MB: "
                                "it should hold one class name per line.")
        try:
            text = path.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as error:
            raise ImportRefused(f"Class file {path.name} is not UTF-8 text.") from error
        names = _names_from_csv(text) if path.suffix.lower() == ".csv" else [line.strip() for line in text.splitlines()]
    names = [n for n in names if n]
    if not names:
        raise ImportRefused("The class file lists no class names (one per line, or a CSV).")
    if len(names) > MAX_CLASSES:
        raise ImportRefused(f"The class file lists {len(names)} classes: at most {MAX_CLASSES}.")
    too_long = next((n for n in names if len(n) > 200), None)
    if too_long:
        raise ImportRefused(f"Class name {too_long[:40]!r}... is over 200 characters.")
    return names


def _names_from_csv(text: str) -> list:
    rows = [row for row in csv.reader(io.StringIO(text)) if row and any(cell.strip() for cell in row)]
    if not rows:
        return []
    header = [cell.strip().lower() for cell in rows[0]]
    name_col = next((header.index(h) for h in ("class_name", "name", "label", "class") if h in header), None)
    index_col = next((header.index(h) for h in ("class_index", "index", "id", "idx") if h in header), None)
    if name_col is not None:
        body = rows[1:]
        if index_col is None:
            return [row[name_col].strip() if name_col < len(row) else "" for row in body]
        indexed = []
        for row in body:
            try:
                indexed.append((int(row[index_col]), row[name_col].strip()))
            except (ValueError, IndexError) as error:
                raise ImportRefused(f"Class CSV row {row!r}: the index column must hold whole numbers.") from error
        indices = sorted(i for i, _ in indexed)
        if indices != list(range(len(indexed))):
            raise ImportRefused("Class CSV: the indices must be 0, 1, ..., N-1, each once.")
        return [n for _, n in sorted(indexed)]
    if all(len(row) >= 2 and row[0].strip().isdigit() for row in rows):  # index,name without a header
        indexed = sorted((int(row[0]), row[1].strip()) for row in rows)
        if [i for i, _ in indexed] != list(range(len(indexed))):
            raise ImportRefused("Class CSV: the indices must be 0, 1, ..., N-1, each once.")
        return [n for _, n in indexed]
    return [row[0].strip() for row in rows]


# --------------------------------------------------------------------------------------------- model args
def check_model_args(model_args) -> dict:
    """timm keyword arguments for the architecture (e.g. {"depth": 2, "embed_dim": 64}): data only."""
    if model_args in (None, "", {}):
        return {}
    if isinstance(model_args, str):
        try:
            model_args = json.loads(model_args)
        except ValueError as error:
            raise ImportRefused(f"Model arguments must be a JSON object, e.g. {{\"depth\": 2}} ({error}).") from error
    if not isinstance(model_args, dict):
        raise ImportRefused("Model arguments must be a JSON object, e.g. {\"depth\": 2}.")
    checked = {}
    for key, value in model_args.items():
        if not isinstance(key, str) or not key.isidentifier() or key in FORBIDDEN_MODEL_ARGS:
            raise ImportRefused(f"Model argument {key!r} is not allowed.")
        if isinstance(value, list):
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value) or len(value) > 64:
                raise ImportRefused(f"Model argument {key!r}: lists may hold numbers only.")
        elif isinstance(value, str):
            if len(value) > 64 or any(c in value for c in "/\\:"):
                raise ImportRefused(f"Model argument {key!r}: text values must be short words.")
        elif value is not None and not isinstance(value, (bool, int, float)):
            raise ImportRefused(f"Model argument {key!r}: only numbers, words and lists of numbers.")
        checked[key] = value
    return checked


# --------------------------------------------------------------------------------------------- weights
def check_weights_file(path) -> Path:
    """Extension and size, from the file system only (nothing is read)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in PICKLE_SUFFIXES:
        raise ImportRefused(f"{path.name} is a pickle checkpoint ({suffix}): only safetensors files are imported, "
                            f"because loading a pickle can run code. {CONVERT_HINT[0].upper() + CONVERT_HINT[1:]}.")
    if suffix != ".safetensors":
        raise ImportRefused(f"{path.name}: expected a .safetensors file (a state dict saved with safetensors).")
    if not path.is_file():
        raise ImportRefused(f"Weights file {path.name} not found.")
    size, limit = path.stat().st_size, max_import_bytes()
    if size > limit:
        raise ImportRefused(f"{path.name} is {size / 2 ** 20:.0f} MB, over the import limit of {limit / 2 ** 20:.0f} MB "
                            "(SALIENCY_IMPORT_MAX_MB sets it).")
    return path


def _copy_hashing(source: Path, folder: Path, limit: int) -> tuple:
    """Copy into a temp file in `folder` in chunks (never over `limit` bytes), hashing as it goes."""
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".import-", suffix=".safetensors.tmp")
    written = 0
    try:
        with open(source, "rb") as src, os.fdopen(fd, "wb") as dst:
            while True:
                chunk = src.read(1 << 20)
                if not chunk:
                    break
                written += len(chunk)
                if written > limit:
                    raise ImportRefused(f"{source.name} grew over the import limit of {limit / 2 ** 20:.0f} MB while it was read.")
                digest.update(chunk)
                dst.write(chunk)
            dst.flush()
            os.fsync(dst.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp), digest.hexdigest(), written


def checkpoint_shapes(path) -> dict:
    """{key: shape} from the safetensors header only (no tensor is read)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}
    except Exception as error:  # noqa: BLE001 - safetensors raises several types for a bad header
        with open(path, "rb") as handle:  # the first bytes only: the file may be hundreds of MB
            head = handle.read(2)
        kind = (" It looks like a pickled PyTorch checkpoint renamed to .safetensors (a zip archive)."
                if head == b"PK" else " Its header cannot be read (an empty, cut or foreign file).")
        raise ImportRefused(f"The weights file is not a safetensors file.{kind} To make one: {CONVERT_HINT}.") \
            from error


def _classifier_keys(network) -> set:
    head = network.get_classifier() if hasattr(network, "get_classifier") else None
    if not isinstance(head, torch.nn.Module):
        return set()
    names = [n for n, m in network.named_modules() if m is head]
    return {f"{names[0]}.{p}" for p, _ in head.named_parameters()} if names and names[0] else set()


def compare_state(network, shapes: dict, n_classes: int) -> None:
    """Refuse a checkpoint that does not fit the architecture exactly, naming the first mismatching key."""
    expected = {k: tuple(v.shape) for k, v in network.state_dict().items()}
    head_keys = _classifier_keys(network)
    for key, shape in expected.items():
        if key not in shapes:
            if key.endswith("num_batches_tracked"):
                continue  # a BatchNorm counter, unused in evaluation: older exports omit it
            raise ImportRefused(f"The checkpoint does not fit this architecture: key '{key}' is missing "
                                f"(expected shape {list(shape)}). Is it the right architecture and model arguments?")
        if shapes[key] != shape:
            if key in head_keys and len(shapes[key]) >= 1 and shape[:1] != shapes[key][:1]:
                raise ImportRefused(f"The class file lists {n_classes} classes but the checkpoint's classifier "
                                    f"'{key}' has {shapes[key][0]} outputs.")
            raise ImportRefused(f"The checkpoint does not fit this architecture: '{key}' has shape "
                                f"{list(shapes[key])}, the architecture expects {list(shape)}.")
    for key in shapes:
        if key not in expected:
            raise ImportRefused(f"The checkpoint does not fit this architecture: unexpected key '{key}' "
                                f"(shape {list(shapes[key])}).")


# --------------------------------------------------------------------------------------------- build
def _build(arch: str, n_classes: int, model_args: dict, input_size):
    if not timm.is_model(arch):
        raise ImportRefused(f"Unknown timm architecture '{arch}' (a name from timm.list_models(), e.g. resnet50, "
                            "vit_small_patch16_224, convnext_tiny).")
    kwargs = dict(model_args, num_classes=n_classes)
    network = timm.create_model(arch, pretrained=False, **kwargs)
    if input_size and hasattr(network, "patch_embed") and "img_size" not in kwargs:
        kwargs["img_size"] = [int(v) for v in input_size]  # a ViT's position embedding is built for its input size
        network = timm.create_model(arch, pretrained=False, **kwargs)
    try:
        family, cam_layer = architecture_family(network)
    except ModelUnavailableError as error:
        raise ImportRefused(str(error)) from error
    return network.eval(), kwargs, family, cam_layer


def _preprocessing(network, input_size, mean, std, crop_pct=None, interpolation=None) -> dict:
    cfg = dict(timm.data.resolve_data_config({}, model=network))
    img_size = getattr(getattr(network, "patch_embed", None), "img_size", None)
    if img_size is not None:
        cfg["input_size"] = (3, *img_size) if isinstance(img_size, (tuple, list)) else (3, img_size, img_size)
    size = [int(v) for v in (input_size or cfg["input_size"][1:])]
    mean = [float(v) for v in (mean or cfg["mean"])]
    std = [float(v) for v in (std or cfg["std"])]
    if len(size) != 2 or not all(8 <= v <= 4096 for v in size):
        raise ImportRefused(f"Input size {size}: give height and width between 8 and 4096.")
    if len(mean) != 3 or len(std) != 3 or not all(s > 0 for s in std):
        raise ImportRefused("Mean and std need three values each (R G B), std above 0.")
    crop_pct = float(crop_pct if crop_pct is not None else cfg.get("crop_pct", 1.0))
    interpolation = str(interpolation or cfg.get("interpolation", "bicubic"))
    if not 0.05 <= crop_pct <= 1.0:
        raise ImportRefused(f"Crop fraction {crop_pct}: give a value in (0, 1] (1 = no centre crop).")
    if interpolation not in ("bicubic", "bilinear", "nearest"):
        raise ImportRefused(f"Interpolation {interpolation!r}: bicubic, bilinear or nearest.")
    return {"input_size": size, "mean": mean, "std": std, "crop_pct": crop_pct, "interpolation": interpolation}


def _test_forward(network, prep: dict, n_classes: int, test_image=None) -> dict:
    from .images import load_image

    h, w = prep["input_size"]
    if test_image is not None:
        picture = load_image(test_image).convert("RGB").resize((w, h))
        image = torch.from_numpy(__import__("numpy").asarray(picture).copy()).permute(2, 0, 1).float()[None] / 255
    else:  # a smooth colour gradient: a plausible input for any domain
        ys, xs = torch.meshgrid(torch.linspace(0, 1, h), torch.linspace(0, 1, w), indexing="ij")
        image = torch.stack([ys, xs, 0.5 * torch.ones_like(ys)])[None]
    mean = torch.tensor(prep["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(prep["std"]).view(1, 3, 1, 1)
    started = time.perf_counter()
    try:
        with torch.no_grad():
            logits = network((image - mean) / std)
    except Exception as error:  # noqa: BLE001 - any failure of the forward pass refuses the import
        raise ImportRefused(f"A forward pass at input size {h}x{w} failed ({type(error).__name__}: "
                            f"{str(error)[:200]}): check --input-size and the model arguments.") from error
    if tuple(logits.shape) != (1, n_classes):
        raise ImportRefused(f"The model returns {tuple(logits.shape)} for one image, expected (1, {n_classes}).")
    if not bool(torch.isfinite(logits).all()):
        raise ImportRefused("The model's output on a test image is not finite (NaN or inf): the weights look broken.")
    top = int(logits.argmax(1))
    return {"seconds": round(time.perf_counter() - started, 4), "top_class": top,
            "image": Path(test_image).name if test_image is not None else "colour gradient"}


# --------------------------------------------------------------------------------------------- import
def import_model(*, arch: str, name: str, weights=None, classes=None, input_size=None, mean=None, std=None,
                 crop_pct=None, interpolation=None, model_args=None, test_image=None, imported_by: str | None = None, replace: bool = False) -> dict:
    """Import a model into the data folder; returns its card. Raises ImportRefused (a ValueError) with a message
    for the user. `arch` is a timm architecture name, or `hf-hub:org/name` (weights and config from the Hub)."""
    from safetensors.torch import load_file

    from .atomic import atomic_write_text

    name = check_name(name, replace=replace)
    model_args = check_model_args(model_args)
    arch = (arch or "").strip()
    folder = _user_dir()
    if arch.startswith("hf-hub:"):
        source = {"source_repo": arch_repo(arch)}
        network, arch, kwargs, class_names, tmp, sha, size = _from_hub(arch, classes, model_args, folder)
    else:
        if weights is None:
            raise ImportRefused("Give the weights: a .safetensors file.")
        if classes is None:
            raise ImportRefused("Give the class names: a text file (one per line) or a CSV.")
        weights = check_weights_file(weights)
        class_names = read_class_names(classes)
        network, kwargs, _, _ = _build(arch, len(class_names), model_args, input_size)
        tmp, sha, size = _copy_hashing(weights, folder, max_import_bytes())  # what is checked is what is kept
        source = {"original_file": weights.name}
    try:
        if "original_file" in source:
            compare_state(network, checkpoint_shapes(tmp), len(class_names))
            missing, unexpected = network.load_state_dict(load_file(str(tmp)), strict=False)
            missing = [k for k in missing if not k.endswith("num_batches_tracked")]
            if missing or unexpected:  # compare_state has seen to it; a second line of defence
                raise ImportRefused(f"The checkpoint does not fit: first mismatching key "
                                    f"'{(missing or unexpected)[0]}'.")
        family, cam_layer = architecture_family(network)
        prep = _preprocessing(network, input_size, mean, std, crop_pct, interpolation)
        check = _test_forward(network.eval(), prep, len(class_names), test_image)
        weights_file = folder / f"{name}.safetensors"
        card = {
            "kind": "classifier", "source": "import", "name": name, "timm_name": arch, "timm_kwargs": kwargs,
            "weights_file": weights_file.name, "weights_sha256": sha, "weights_bytes": size, **source,
            "family": family, "cam_layer": cam_layer, "class_names": class_names, **prep,
            "reference_color": reference_color(prep["mean"], prep["std"]),
            "imported_by": imported_by or _who(), "imported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "import_check": check,
            "software": {"torch": torch.__version__, "timm": timm.__version__},
        }
        os.replace(tmp, weights_file)
        weights_file.chmod(0o644)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    atomic_write_text(folder / f"{name}.json", json.dumps(card, indent=2))
    forget(name)
    return card


def reference_color(mean, std) -> list:
    """The default deletion/insertion reference colour: the normalisation mean (the training data's mean colour
    for data-set statistics, ImageNet's for ImageNet statistics, mid-grey for 0.5/0.5)."""
    return [min(1.0, max(0.0, float(m))) for m in mean]


def _who() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name in some containers
        return "unknown"


def arch_repo(arch: str) -> str:
    return arch.split(":", 1)[1]


def _from_hub(arch, classes, model_args, folder):
    """`hf-hub:org/name`: timm downloads its config and weights (offline: the local cache only, or a clear
    refusal at once); the weights are stored as safetensors in the data folder, so the import works offline."""
    from huggingface_hub import constants
    from safetensors.torch import save_file

    from .models import HUB_CACHE_DIR

    repo = arch_repo(arch)
    if not repo or repo.count("/") != 1 or not all(safe_name_part(p) for p in repo.split("/")):
        raise ImportRefused(f"'{arch}': a Hub id looks like hf-hub:org/name.")
    offline = bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    try:
        from timm.models import load_model_config_from_hf

        pretrained_cfg, model_name, hub_args = load_model_config_from_hf(repo, cache_dir=str(HUB_CACHE_DIR))
    except Exception as error:  # noqa: BLE001 - hub errors come in many types
        raise ImportRefused(
            f"Could not fetch {arch} from the HuggingFace Hub"
            f"{' (offline: HF_HUB_OFFLINE is set and it is not in the local cache)' if offline else ''}. "
            f"Connect to the internet, or import a local .safetensors file instead.") from error
    hub_classes = pretrained_cfg.get("label_names")
    if classes is not None:
        class_names = read_class_names(classes)
    elif hub_classes:
        class_names = [str(n) for n in hub_classes]
    elif int(pretrained_cfg.get("num_classes", 0) or 0) == 1000:
        from .models import imagenet_class_names

        class_names = imagenet_class_names()
    else:
        raise ImportRefused(f"{arch} does not name its classes: give a class file.")
    hub_count = int(pretrained_cfg.get("num_classes", 0) or 0)
    if hub_count and hub_count != len(class_names):  # timm would silently put a random head on it
        raise ImportRefused(f"The class file lists {len(class_names)} classes but {arch} has {hub_count} outputs.")
    kwargs = dict(check_model_args({k: v for k, v in (hub_args or {}).items() if k not in FORBIDDEN_MODEL_ARGS}),
                  **model_args, num_classes=len(class_names))
    try:
        network = timm.create_model(arch, pretrained=True, cache_dir=str(HUB_CACHE_DIR), **kwargs)
    except Exception as error:  # noqa: BLE001
        raise ImportRefused(f"Could not build {arch} with {len(class_names)} classes from the Hub "
                            f"({type(error).__name__}: {str(error)[:200]}).") from error
    state = {k: v.detach().contiguous() for k, v in network.state_dict().items()}
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".import-", suffix=".safetensors.tmp")
    os.close(fd)
    save_file(state, tmp)
    digest = hashlib.sha256(Path(tmp).read_bytes()).hexdigest()
    return network.eval(), model_name, kwargs, class_names, Path(tmp), digest, Path(tmp).stat().st_size


def safe_name_part(part: str) -> bool:
    import re

    return bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}", part)) and ".." not in part


# --------------------------------------------------------------------------------------------- list / remove
def imported_models() -> list:
    """Cards of the imported models in the data folder, by name."""
    from .models import cards

    return [card.data for card in cards("classifier", folders=[_user_dir()]) if card.data.get("source") == "import"]


def remove_imported_model(name: str) -> list:
    """Delete an imported model (card, weights, its AHA explainer and familiarity statistics where they exist);
    returns the removed files. Shipped models and fine-tuned models are never touched."""
    name = safe_name(name)
    folder = _user_dir()
    card_file = folder / f"{name}.json"
    if not card_file.exists():
        raise ImportRefused(f"No imported model named '{name}'.")
    card = json.loads(card_file.read_text())
    if card.get("source") != "import":
        raise ImportRefused(f"'{name}' was not imported (it is a {card.get('kind', 'model')} from elsewhere): not removed.")
    removed = []
    weights_name = Path(card.get("weights_file", f"{name}.safetensors")).name
    for path in (folder / weights_name, folder / f"aha-{name}.safetensors", folder / f"aha-{name}.json",
                 folder / f"aha-{name}.ckpt", folder / f"{name}.familiarity.safetensors",
                 folder / f"{name}.familiarity.json", card_file):
        if path.exists():
            path.unlink()
            removed.append(str(path))
    forget(name)
    try:
        from .aha.store import forget_explainers

        forget_explainers()
    except ImportError:
        pass
    return removed
