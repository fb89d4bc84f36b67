"""Explanation methods behind one contract (see `base.py`). One module per method."""
from __future__ import annotations

from .base import Method, MethodNotApplicable, Option, as_targets, check_targets

METHODS: dict = {}


def register(cls):
    """Class decorator: add a Method subclass to the registry under its `name` (the app and the CLI list it)."""
    METHODS[cls.name] = cls
    return cls


register_method = register


def list_methods() -> list:
    """Every registered method's name, in menu order."""
    return ordered(METHODS)


def get_method(name: str, **options) -> Method:
    if name not in METHODS:
        raise KeyError(f"Unknown method '{name}'. Available: {', '.join(sorted(METHODS))}")
    return METHODS[name](**options)


def available_methods(bundle=None) -> list:
    """Names of the methods that can explain this model (all when bundle is None)."""
    names = []
    for name, cls in METHODS.items():
        if bundle is None or bundle.family in cls.families:
            names.append(name)
    return names


def ordered(names) -> list:
    """Method names in menu order (each class's `order`, then by name); unknown names last, by name."""
    return sorted(names, key=lambda n: (METHODS[n].order, n) if n in METHODS else (10 ** 6, n))


def explain(bundle, images, targets, method: str, **options):
    """B x H x W maps of one method. `targets`: an int, B class indices, or a function of the logits returning B
    scores (methods with `score_targets`, e.g. Grad-CAM)."""
    method_obj = get_method(method, **options)
    method_obj.check(bundle)
    check_targets(method_obj, targets)
    return method_obj.attribute(bundle, images, as_targets(targets, images.shape[0], images.device))


from . import gradcam, rollout, chefer, occlusion, rise, random_map  # noqa: E402,F401  (registration)

for _optional in ("gradskip", "aha"):
    try:
        __import__(f"{__name__}.{_optional}")
    except ModuleNotFoundError as _error:
        if _error.name != f"{__name__}.{_optional}":
            raise
