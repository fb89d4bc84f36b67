"""Saliency Lab's library: faithful visual explanations of image classifiers (no UI here; the app's service layer
is the separate package `saliency_lab`, which imports this one and never the reverse).

    import explainers
    bundle = explainers.load_model("bloodmnist-vit")          # network + preprocessing + classes + adapter facts
    image, geometry = explainers.prepare_for_model(explainers.load_image("cell.jpg"), bundle)
    maps = explainers.explain(bundle, image, targets=[3], method="chefer")   # B x H x W, higher = more important
    curves = explainers.deletion_insertion(bundle, image, maps, [3])        # .deletion_auc, .insertion_auc

The names below are imported on first use (module `__getattr__`), so `import explainers` stays light.
"""
from __future__ import annotations

import importlib

_API = {
    # models
    "load_model": "models", "list_models": "models", "register_bundle": "models", "bundle_from_timm": "models",
    "ModelBundle": "models", "ModelUnavailableError": "models",
    # images
    "load_image": "images", "prepare_for_model": "images", "map_to_original": "images", "overlay": "images",
    "ImageError": "images", "Geometry": "images",
    # methods
    "get_method": "methods", "list_methods": "methods", "register_method": "methods",
    "available_methods": "methods", "Method": "methods", "MethodNotApplicable": "methods", "Option": "methods",
    # metrics and their declarations
    "deletion_insertion": "metrics", "Curves": "metrics", "METRICS": "metrics", "better_arrow": "metrics",
    "better_text": "metrics",
    # the engine: the one run path (`explain_batch`), cached explanations as the app and the CLI run them
    "explain": "engine", "explain_batch": "engine", "run_method": "engine", "prepare_input": "engine", "ExplanationCache": "engine", "PreparedInput": "engine",
    "predict_and_check": "engine",
}

__all__ = sorted(_API)


def __getattr__(name: str):
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'explainers' has no attribute '{name}'")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
