"""The app's menus: models (bundled, fine-tuned, hub, in memory) and methods, built from the model zoo and the
method registry (each method class declares its label, order, defaults and menu note: adding a method is one
file in `explainers/methods/`).

    model_choices(list_models())       # [(label, name)] for a dropdown
    method_choices(bundle)             # [(label, name)] of the methods that can explain this model
    default_methods(bundle)            # the two ticked at first
    sliders()                          # [(method name, Option)] of every method's user options, in slider order
"""
from __future__ import annotations

from dataclasses import dataclass

from explainers import models as models_module
from explainers.engine import method_label
from explainers.methods import METHODS, available_methods, get_method, ordered
from explainers.models import model_available, model_kind  # the zoo's facts, re-exported for the menus

__all__ = ["model_kind", "model_available", "model_label", "model_choices", "default_model", "method_order",
           "method_label", "method_choices", "method_ready", "default_methods", "method_descriptions", "sliders",
           "methods_with_option"]


# ------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------
def model_label(name: str) -> str:
    kind = model_kind(name)
    if kind == "bundled":
        return f"{name} · bundled" if model_available(name) else f"{name} · bundled (not trained yet)"
    if kind == "fine-tuned":  # a card shipped in the code's weights/ (the grid ViT, the decoy models) is bundled
        return f"{name} · bundled" if shipped(name) else f"{name} · fine-tuned"
    if kind == "imported":
        return f"{name} · imported"
    if kind == "memory":
        return f"{name} · in memory"
    return f"{name} · hub (cached)" if model_available(name) else f"{name} · hub (downloads on first use)"


def shipped(name: str) -> bool:
    """Whether the model's card comes with the code (weights/), not from a fine-tune run on this machine."""
    try:
        return models_module.card_path(name).parent == models_module.WEIGHTS_DIR
    except ValueError:
        return False


def model_choices(names=None) -> list:
    """[(label, name)] for a dropdown: bundled first, then fine-tuned, then hub (the order of list_models)."""
    names = list(names) if names is not None else models_module.list_models()
    return [(model_label(n), n) for n in names]


def default_model(names) -> str | None:
    """The first available of bloodmnist-vit, bloodmnist-cnn, efficientnet-lite0, else the first name."""
    names = list(names)
    for preferred in ("bloodmnist-vit", "bloodmnist-cnn", "efficientnet-lite0"):
        if preferred in names and model_available(preferred):
            return preferred
    for name in names:
        if model_available(name):
            return name
    return names[0] if names else None


# ------------------------------------------------------------------------------------------------
# Methods
# ------------------------------------------------------------------------------------------------
def method_order(names) -> list:
    """Names in menu order (each method class's `order`; unknown names last, alphabetically)."""
    return ordered(names)


def method_choices(bundle, include_random: bool = False) -> list:
    """[(label, name)] of the methods that can explain this model, in the UI's order (baselines such as the
    random map only with include_random); each label carries its class's `menu_note` for this model."""
    names = [n for n in available_methods(bundle) if include_random or not METHODS[n].baseline]
    choices = []
    for name in method_order(names):
        label = method_label(name)
        note = METHODS[name].menu_note(bundle)
        if note:
            label += f" · {note}"
        choices.append((label, name))
    return choices


def method_ready(bundle, name: str) -> bool:
    """Whether the method can explain this model now (AHA also needs a trained explainer for it)."""
    try:
        get_method(name).check(bundle)
        return True
    except Exception:  # noqa: BLE001 - MethodNotApplicable and friends: not ready
        return False


def default_methods(bundle) -> list:
    """Two methods to start with: the ones whose class says `default_for(bundle)` (AHA, GradSkip on ViTs,
    Grad-CAM elsewhere) where they are quick on this model (`quick_on`: AHA only with a trained explainer), then
    others in menu order that are quick on this model (RISE only on small inputs); baselines never."""
    names = [n for n in available_methods(bundle) if not METHODS[n].baseline]
    chosen = [m for m in method_order(names) if METHODS[m].default_for(bundle) and METHODS[m].quick_on(bundle)
              and method_ready(bundle, m)]
    for name in method_order(names):
        if len(chosen) >= 2:
            break
        if name not in chosen and METHODS[name].quick_on(bundle) and method_ready(bundle, name):
            chosen.append(name)
    return chosen


def method_descriptions() -> list:
    """[(label, description)] of every registered method, in the UI's order."""
    return [(method_label(n), METHODS[n].description) for n in method_order(list(METHODS))]


def sliders() -> list:
    """[(method name, Option)] of every registered method's user options, in slider order (`Option.rank`)."""
    found = [(name, option) for name in method_order(list(METHODS)) for option in METHODS[name].user_options]
    return sorted(found, key=lambda item: item[1].rank)


# The ids the page and its API published for the sliders before the library stopped naming them (the browser
# tests and scripts call them): kept. Any other method option is '<method>-<option>' (`slider_ids`).
PUBLISHED_SLIDER_IDS = {("aha", "refine_steps"): "refine", ("occlusion", "window_fraction"): "occlusion-window",
                        ("gradskip", "alpha"): "alpha", ("gradskip", "gate_power"): "class-focus"}


@dataclass(frozen=True)
class SliderIds:
    """A method option's slider in the page: its element id, the endpoint of a release and, for a live option,
    the endpoint of its moves (None otherwise)."""
    elem_id: str
    api_name: str
    preview_api_name: str | None


def slider_ids(method: str, option) -> SliderIds:
    """The slider's ids, derived here from (method, option): the library's options carry no Gradio names. A live
    option's release gives its curves ('<id>_curves') and its moves a preview ('<id>_preview')."""
    elem_id = PUBLISHED_SLIDER_IDS.get((method, option.name)) or f"{method}-{option.name}".replace("_", "-")
    api = elem_id.replace("-", "_")
    return SliderIds(elem_id, f"{api}_curves", f"{api}_preview") if option.live else SliderIds(elem_id, api, None)


def api_parameter(method: str, option) -> str:
    """The name a script calls a slider by in the app's API (gradio_client keywords): the slider's id as a Python
    name (alpha, class_focus, occlusion_window), or the method's keyword where that only extends the id
    (refine -> refine_steps)."""
    ident = slider_ids(method, option).elem_id.replace("-", "_")
    return option.name if option.name.startswith(ident) else ident


def methods_with_option(name: str) -> list:
    """The methods that declare a user option of this name."""
    return [m for m, option in sliders() if option.name == name]
