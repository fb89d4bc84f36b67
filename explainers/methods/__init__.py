"""Explanation methods behind one contract (see `base.py`). One module per method."""
from __future__ import annotations

from .base import Method, MethodNotApplicable, as_targets

METHODS: dict = {}


def register(cls):
    METHODS[cls.name] = cls
    return cls


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


def explain(bundle, images, targets, method: str, **options):
    method_obj = get_method(method, **options)
    method_obj.check(bundle)
    return method_obj.attribute(bundle, images, as_targets(targets, images.shape[0], images.device))


from . import gradcam, rollout, chefer, rise, random_map  # noqa: E402,F401  (registration)

for _optional in ("gradskip", "aha"):
    try:
        __import__(f"{__name__}.{_optional}")
    except ModuleNotFoundError as _error:
        if _error.name != f"{__name__}.{_optional}":
            raise
