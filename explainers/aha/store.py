"""Trained explainers on disk (`weights/aha-<model>.safetensors` + `.json` card) and the per-model cache."""
from __future__ import annotations

import json
import threading
from pathlib import Path

from .network import AHAExplainer


class ExplainerUnavailable(RuntimeError):
    """No trained AHA explainer for this model (the message says how to train one)."""


_CACHE: dict = {}
_LOCK = threading.Lock()


def explainer_locations(model_name: str) -> list:
    """Where the loader looks for a model's explainer, in order: beside the model's card (weights/ for shipped
    models, the data folder for imported and fine-tuned ones), the code's weights/ (the shipped explainers),
    the user's models folder (explainers trained in the app for shipped or hub models): the one card store's
    folders (`models.card_folders`), the model's own first."""
    from ..models import card_folders, card_path, safe_name

    name = f"aha-{safe_name(model_name)}"
    card = card_path(model_name)
    folders = ([card.parent] if card.exists() else []) + card_folders()
    stems = []
    for folder in folders:
        if Path(folder) / name not in stems:
            stems.append(Path(folder) / name)
    return stems


def explainer_stem(model_name: str, weights_dir=None) -> Path:
    """A model's explainer: the first of `explainer_locations` that holds one; where a new one goes when none
    exists: the user's models folder (beside an imported model's card; never the code's weights/), unless
    `weights_dir` is given."""
    from ..models import card_folders, find, safe_name

    if weights_dir is not None:
        return Path(weights_dir) / f"aha-{safe_name(model_name)}"
    found = find("aha-explainer", f"aha-{safe_name(model_name)}",
                 folders=[stem.parent for stem in explainer_locations(model_name)])
    return found.path.with_suffix("") if found is not None else card_folders()[1] / f"aha-{safe_name(model_name)}"


def shipped_explainer(model_name: str):
    """The stem of the explainer shipped in the code's weights/ for this model, or None."""
    from ..models import card_folders, find, safe_name

    found = find("aha-explainer", f"aha-{safe_name(model_name)}", folders=card_folders()[:1])
    return found.path.with_suffix("") if found is not None else None


def user_explainer_stem(model_name: str) -> Path:
    """Where an explainer trained by a job goes: the user's models folder (beside an imported or fine-tuned
    model's card). ValueError for a model that ships its explainer in weights/ (the loader takes the shipped one
    first, so a new one there would never be used; the code's weights/ is never written by a job)."""
    from ..models import card_folders, safe_name

    shipped = shipped_explainer(model_name)
    if shipped is not None:
        raise ValueError(f"'{model_name}' ships a trained AHA explainer ({shipped.name} in the code's weights "
                         "folder), which AHA uses; a job never replaces it. To train your own, import the model "
                         "under another name (Models tab or import-model) and train for that one.")
    return card_folders()[1] / f"aha-{safe_name(model_name)}"


def stem_from_out(out) -> Path:
    """Accept weights/aha-x, weights/aha-x.safetensors or weights/aha-x.json."""
    out = Path(out)
    return out.with_suffix("") if out.suffix in (".safetensors", ".json") else out


def save_explainer(explainer: AHAExplainer, stem, card: dict) -> dict:
    from safetensors.torch import save_file

    from ..atomic import atomic_write_text

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
    atomic_write_text(stem.parent / (stem.name + ".json"), json.dumps(card, indent=2))
    return card


def store_class_dependence(bundle, specs: list, results: dict, *, data: str, images: int, command: str) -> Path:
    """Write the class dependence of the trained explainer's maps (`explainers.sanity.class_dependence`: one row per
    'aha' spec, the one pass and refinement steps T) into its card as "class_dependence", where AHA's `caveat` reads
    it, with each row's paired difference to Grad-CAM's on the same images (the class-sensitive reference: where
    the two top classes' evidence lies in the same place, as for two dog breeds, every method's two maps agree, and
    only a rho well above Grad-CAM's says the map ignores the class). `specs`: the measured methods as parsed
    (name, options, label) (`methods.parse_method_spec`), `results` by label. Only plain trained-mode specs count
    ('aha', 'aha:refine_steps=3'); ValueError when there is none, without 'gradcam', or without a trained
    explainer. Returns the card's path."""
    import numpy as np

    from ..atomic import atomic_write_text
    from ..metrics import CLASS_BLIND_MARGIN, CLASS_BLIND_RHO
    from ..statistics import bootstrap_ci

    parsed = list(specs)
    reference = next((results[label] for name, options, label in parsed if name == "gradcam" and not options), None)
    if reference is None:
        raise ValueError("--into-card needs plain 'gradcam' among --methods: the class-sensitive reference the "
                         "AHA rows are compared with")
    rows = {}
    for name, options, label in parsed:
        if name != "aha" or set(options) - {"refine_steps", "mode"} or options.get("mode", "trained") not in (
                "trained", "auto"):
            continue
        row = results[label]
        pairs = [(a, b) for a, b in zip(row["per_image"], reference["per_image"]) if np.isfinite(a) and np.isfinite(b)]
        difference = [a - b for a, b in pairs]
        rows[str(int(options.get("refine_steps", 0)))] = {
            "spearman_top1_top2": row["spearman_top1_top2"], "ci95": row["ci95"],
            "minus_gradcam": {"mean": float(np.mean(difference)) if difference else None,
                              "ci95": bootstrap_ci(difference) if len(difference) > 1 else None,
                              "images": len(difference)}}
    if not rows:
        raise ValueError("--into-card stores the rows of 'aha' (e.g. --methods aha,aha:refine_steps=3,gradcam): "
                         "none given")
    stem = explainer_stem(bundle.name)
    card_file = Path(str(stem) + ".json")
    if not card_file.exists():
        raise ValueError(f"'{bundle.name}' has no trained AHA explainer card to store the results in")
    card = json.loads(card_file.read_text())
    card["class_dependence"] = {
        "what": "per image, Spearman rho between the map for the predicted class and for the runner-up class "
                "(mean, 95% bootstrap interval), by refinement steps T, and its paired difference to Grad-CAM's",
        "data": data, "images": int(images), "command": command, "class_blind_rho": CLASS_BLIND_RHO,
        "class_blind_margin": CLASS_BLIND_MARGIN,
        "gradcam": {"spearman_top1_top2": reference["spearman_top1_top2"], "ci95": reference["ci95"]},
        "by_refine_steps": rows}
    atomic_write_text(card_file, json.dumps(card, indent=2))
    forget_explainers(bundle.name)  # the next use reads the new card
    return card_file


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
    keys = ("width", "embed_dim", "gain_init", "class_embedding", "use_cam", "indices", "scales", "fusion_units",
            "prior", "output_blur", "class_input", "class_boost", "class_contrast")
    explainer = AHAExplainer(bundle, **{k: arch[k] for k in keys if k in arch}
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


def forget_explainers(model_name: str | None = None) -> None:
    """Drop the cached explainers (of one model only when a name is given: e.g. after a job trained a new one)."""
    with _LOCK:
        for key in [k for k in _CACHE if model_name is None or k[0] == model_name]:
            del _CACHE[key]
