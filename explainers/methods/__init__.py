"""Explanation methods behind one contract (see `base.py`). One module per method: every module of this package
is imported at start (`_register_all`) and registers its class with `@register`."""
from __future__ import annotations

import json

from .base import Method, MethodNotApplicable, Option, as_targets, check_targets

__all__ = ["METHODS", "Method", "MethodNotApplicable", "Option", "as_targets", "available_methods", "build_methods",
           "check_targets", "get_method", "list_methods", "ordered", "parse_method_spec", "register",
           "register_method", "split_method_specs"]

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
    return ordered(name for name, cls in METHODS.items() if bundle is None or bundle.family in cls.families)


def ordered(names) -> list:
    """Method names in menu order (each class's `order`, then by name); unknown names last, by name."""
    return sorted(names, key=lambda n: (METHODS[n].order, n) if n in METHODS else (10 ** 6, n))


def parse_method_spec(spec: str) -> tuple:
    """'aha:refine_steps=3' -> ('aha', {'refine_steps': 3}, 'aha:refine_steps=3')."""
    name, _, rest = spec.partition(":")
    options = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return name, options, spec


def split_method_specs(text: str) -> list:
    """'gradskip:alpha=1,value_norm=false,rollout' -> ['gradskip:alpha=1,value_norm=false', 'rollout']: a
    comma starts a new method unless what follows is another key=value of the method before it."""
    specs = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if specs and "=" in item and ":" not in item.split("=", 1)[0]:
            specs[-1] += "," + item
        else:
            specs.append(item)
    return specs


def build_methods(bundle, specs, method_options: dict | None = None) -> list:
    """[(label, method)] for 'name:key=value' specs, each checked against the bundle (MethodNotApplicable with
    its message otherwise); `method_options` {name: {...}} are defaults a spec's own options override."""
    built = []
    for spec in specs:
        name, options, label = parse_method_spec(spec)
        method = get_method(name, **{**(method_options or {}).get(name, {}), **options})
        method.check(bundle)
        built.append((label, method))
    return built


def _register_all() -> None:
    """Import every module of this package (each registers its method): adding a method is adding its file."""
    import importlib
    import pkgutil

    for module in sorted(info.name for info in pkgutil.iter_modules(__path__) if info.name != "base"):
        importlib.import_module(f"{__name__}.{module}")


_register_all()
