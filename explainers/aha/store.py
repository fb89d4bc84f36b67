"""Trained explainers on disk (`weights/aha-<model>.safetensors` + `.json` card) and the per-model cache."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import torch

from .network import AHAExplainer


class ExplainerUnavailable(RuntimeError):
    """No trained AHA explainer for this model (the message says how to train one)."""


_CACHE: dict = {}
_LOCK = threading.Lock()


def explainer_stem(model_name: str, weights_dir=None) -> Path:
    """Where a model's explainer lives: next to the model's card (weights/ for shipped models, the data folder
    for imported ones), unless `weights_dir` is given."""
    from ..models import WEIGHTS_DIR, card_path, safe_name

    if weights_dir is None:
        weights_dir = card_path(model_name).parent if card_path(model_name).exists() else WEIGHTS_DIR
    return Path(weights_dir) / f"aha-{safe_name(model_name)}"


def stem_from_out(out) -> Path:
    """Accept weights/aha-x, weights/aha-x.safetensors or weights/aha-x.json."""
    out = Path(out)
    return out.with_suffix("") if out.suffix in (".safetensors", ".json") else out


def save_explainer(explainer: AHAExplainer, stem, card: dict) -> dict:
    from safetensors.torch import save_file

    from ..training import atomic_write_text

    stem = stem_from_out(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().float().cpu().contiguous() for k, v in explainer.state_dict().items()}
    weights_file = stem.name + ".safetensors"
    tmp = stem.parent / (weights_file + ".tmp")
    save_file(state, str(tmp))
    tmp.chmod(0o644)
    tmp.replace(stem.parent / weights_file)
    card = dict(card, kind="aha-explainer", weights_file=weights_file, architecture=explainer.arch,
                parameters=explainer.num_parameters())
    atomic_write_text(json.dumps(card, indent=2), stem.parent / (stem.name + ".json"))
    return card


def training_hint(model_name: str) -> str:
    try:
        out = explainer_stem(model_name)
    except ValueError:
        out = f"weights/aha-{model_name}"
    return (f"no trained AHA explainer for '{model_name}'; train one with: python -m explainers train-aha "
            f"--model {model_name} --data PATH/TO/TRAIN/IMAGES --out {out}")


def load_explainer(bundle, stem=None) -> AHAExplainer:
    """Build the explainer for `bundle` from its card and weights (strict). Raises ExplainerUnavailable."""
    from safetensors.torch import load_file

    stem = stem_from_out(stem) if stem is not None else explainer_stem(bundle.name)
    card_file, weights_file = Path(str(stem) + ".json"), Path(str(stem) + ".safetensors")
    if not card_file.exists() or not weights_file.exists():
        raise ExplainerUnavailable(training_hint(bundle.name))
    card = json.loads(card_file.read_text())
    base = card.get("base_model")
    if base and base != bundle.name:
        raise ExplainerUnavailable(f"{card_file} explains '{base}', not '{bundle.name}'. " + training_hint(bundle.name))
    arch = dict(card["architecture"])
    explainer = AHAExplainer(bundle, **{k: arch[k] for k in ("width", "embed_dim", "gain_init", "class_embedding",
                                                             "use_cam", "indices", "scales", "fusion_units", "prior") if k in arch}
                             | ({} if "prior" in arch else {"prior": "cam" if arch.get("use_cam", True) else "none"}))
    try:
        explainer.load_state_dict(load_file(str(weights_file)))
    except RuntimeError as error:
        raise ExplainerUnavailable(f"{weights_file} does not fit '{bundle.name}' ({str(error)[:200]}). "
                                   + training_hint(bundle.name)) from error
    explainer.card = card
    return explainer.to(bundle.device).eval()


def _key(bundle) -> tuple:
    return bundle.name, id(bundle.network), str(bundle.device)


def get_explainer(bundle) -> AHAExplainer:
    """The cached explainer for this model instance (loaded once, shared by all threads: read-only use)."""
    key = _key(bundle)
    with _LOCK:
        cached = _CACHE.get(key)
        if cached is not None:
            return cached
        explainer = load_explainer(bundle)
        _CACHE[key] = explainer
        return explainer


def register_explainer(bundle, explainer: AHAExplainer) -> AHAExplainer:
    """Use an in-memory explainer for this model instance (tests, freshly trained explainers)."""
    with _LOCK:
        _CACHE[_key(bundle)] = explainer
    return explainer


def forget_explainers() -> None:
    with _LOCK:
        _CACHE.clear()
