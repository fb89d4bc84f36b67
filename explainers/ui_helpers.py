"""Library-side helpers for the app (and the CLI): model and method menus, cached multi-method
explanations, overlays, plotly figures of deletion/insertion curves, CSV/JSON exports, data-set
browsing, and the live sanity check. Nothing here imports gradio.

    bundle = load_model("bloodmnist-cnn")
    prepared = prepare_input(load_image("cell.png"), bundle)
    cache = ExplanationCache()
    results = [run_method(bundle, prepared, m, target=None, options={}, cache=cache) for m in ("gradcam", "aha")]
    figure = curves_figure(results)                    # plotly, every method on the same axes
    overlays = render_overlays(prepared, results, opacity=0.5, colormap="cividis")
"""
from __future__ import annotations

import copy
import csv
import dataclasses
import hashlib
import io
import json
import platform
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from . import models as models_module
from .images import Geometry, map_to_original, overlay, prepare_for_model
from .methods import METHODS, as_targets, available_methods, get_method
from .metrics import Curves, deletion_insertion, spearman

# The order methods are offered in (the rest follow alphabetically); the ones ticked by default.
METHOD_ORDER = ("aha", "gradskip", "gradcam", "chefer", "rollout", "rise", "random")
DEFAULT_METHODS = {"vit": ("aha", "gradskip"), "other": ("aha", "gradcam")}
# Plotly colours from the Okabe-Ito palette (colour-blind safe), one per method, stable across runs.
METHOD_COLORS = {"aha": "#0072B2", "gradskip": "#D55E00", "gradcam": "#009E73", "chefer": "#CC79A7",
                 "rollout": "#E69F00", "rise": "#56B4E9", "random": "#999999"}
FALLBACK_COLORS = ("#000000", "#F0E442", "#882255", "#44AA99")
CURVE_NOTE = "Lower deletion AUC is better (the score falls fast when the top pixels go); " \
             "higher insertion AUC is better (the score rises fast when they come back)."
DISPLAY_MIN, DISPLAY_MAX = 256, 512
SEED = 0

# What the scores mean (Markdown: the Learn tab, and anywhere else the scores are explained).
METRICS_TEXT = """
**Deletion** removes the pixels the map calls most important first (they take the data set's mean colour)
and plots the model's probability for the target class. A faithful map makes it fall fast: **lower deletion
AUC is better.**

**Insertion** starts from a blank (mean-colour) image and puts the most important pixels back first: a faithful
map makes the probability rise fast: **higher insertion AUC is better.** *Insertion − deletion* sums both up.

**AUC** is the area under each curve (trapezoid rule over 0-100 % of the pixels, 21 points).
**Pointing game**: does the map's peak fall inside the expert's mask (15 px tolerance)? **IoU**: overlap of
the map's top pixels (as many as the mask has) with the mask.

**Sanity check** (Adebayo et al. 2018): re-initialise the model's layers from the top down. A map that barely
changes did not depend on what the model learned; a faithful method's map must change (its rank correlation
with the original falls well below 1).
"""


# ------------------------------------------------------------------------------------------------
# Models and methods
# ------------------------------------------------------------------------------------------------
def model_kind(name: str) -> str:
    """'bundled', 'fine-tuned', 'hub' or 'memory' (a registered in-memory model, e.g. in tests)."""
    if name in models_module.BUNDLED_MODELS:
        return "bundled"
    if name in models_module.HUB_MODELS:
        return "hub"
    try:
        if models_module.card_path(name).exists():
            return "fine-tuned"
    except ValueError:
        pass
    with models_module._CACHE_LOCK:
        if any(key[0] == name for key in models_module._CACHE):
            return "memory"
    return "hub"


def model_available(name: str) -> bool:
    """Whether `load_model(name)` can succeed offline without a download (hub models: cached?)."""
    with models_module._CACHE_LOCK:
        if any(key[0] == name for key in models_module._CACHE):
            return True
    if name == "efficientnet-lite0":
        return True
    kind = model_kind(name)
    if kind in ("bundled", "fine-tuned"):
        try:
            card_file = models_module.card_path(name)
            card = json.loads(card_file.read_text())
            return (models_module.WEIGHTS_DIR / card.get("weights_file", f"{name}.safetensors")).exists()
        except (OSError, ValueError):
            return False
    cache = models_module.HUB_CACHE_DIR
    return cache.exists() and any(cache.glob(f"models--timm--{name}*"))


def model_label(name: str) -> str:
    kind = model_kind(name)
    if kind == "bundled":
        return f"{name} · bundled" if model_available(name) else f"{name} · bundled (not trained yet)"
    if kind == "fine-tuned":
        return f"{name} · fine-tuned"
    if kind == "memory":
        return f"{name} · in memory"
    return f"{name} · hub (cached)" if model_available(name) else f"{name} · hub (downloads on first use)"


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


def method_order(names) -> list:
    ranked = [m for m in METHOD_ORDER if m in names]
    return ranked + sorted(n for n in names if n not in ranked)


def method_label(name: str) -> str:
    cls = METHODS.get(name)
    return (cls.label or name) if cls else name


def method_choices(bundle, include_random: bool = False) -> list:
    """[(label, name)] of the methods that can explain this model, in the UI's order."""
    names = available_methods(bundle)
    if not include_random:
        names = [n for n in names if n != "random"]
    choices = []
    for name in method_order(names):
        label = method_label(name)
        if name == "aha" and not method_ready(bundle, name):
            label += " · not trained for this model"
        elif name == "rise" and bundle.device.type == "cpu" and bundle.input_size[0] * bundle.input_size[1] > 96 * 96:
            label += " · slow on a CPU"
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
    """Two methods to start with: AHA (when trained for this model) and GradSkip (ViTs) or Grad-CAM; RISE is
    never a default (slow on a CPU)."""
    names = [n for n in available_methods(bundle) if n not in ("random", "rise")]
    wanted = DEFAULT_METHODS["vit" if bundle.is_vit else "other"]
    chosen = [m for m in wanted if m in names and method_ready(bundle, m)]
    small = bundle.input_size[0] * bundle.input_size[1] <= 96 * 96
    for name in method_order(names + (["rise"] if small else [])):  # RISE only where it is quick
        if len(chosen) >= 2:
            break
        if name not in chosen and method_ready(bundle, name):
            chosen.append(name)
    return chosen


def method_descriptions() -> list:
    """[(label, description)] of every registered method, in the UI's order."""
    return [(method_label(n), METHODS[n].description) for n in method_order(list(METHODS))]


# ------------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------------
@dataclass
class PreparedImage:
    original: Image.Image
    display: Image.Image  # what the UI shows: the original scaled to DISPLAY_MIN..DISPLAY_MAX px
    tensor: torch.Tensor  # 1 x 3 x H x W in [0, 1], on the bundle's device
    geometry: Geometry  # model input -> original
    display_geometry: Geometry  # model input -> display image
    digest: str  # content hash of the original (cache key)


def image_digest(image: Image.Image) -> str:
    digest = hashlib.sha1(f"{image.size}{image.mode}".encode())
    digest.update(image.tobytes())
    return digest.hexdigest()[:20]


def display_size(size: tuple) -> tuple:
    width, height = size
    longest = max(width, height)
    scale = 1.0
    if longest > DISPLAY_MAX:
        scale = DISPLAY_MAX / longest
    elif longest < DISPLAY_MIN:
        scale = DISPLAY_MIN / longest
    return max(1, round(width * scale)), max(1, round(height * scale))


def scale_geometry(geometry: Geometry, size: tuple) -> Geometry:
    """The same crop expressed in the pixel grid of the original resized to `size` (width, height)."""
    sx = size[0] / geometry.original_size[0]
    sy = size[1] / geometry.original_size[1]
    left, top, right, bottom = geometry.crop_box
    return dataclasses.replace(geometry, original_size=tuple(size), crop_box=(left * sx, top * sy, right * sx, bottom * sy))


def prepare_input(image: Image.Image, bundle) -> PreparedImage:
    tensor, geometry = prepare_for_model(image, bundle)
    size = display_size(image.size)
    display = image if size == image.size else image.resize(size, Image.Resampling.LANCZOS)
    return PreparedImage(original=image, display=display, tensor=tensor.to(bundle.device), geometry=geometry,
                         display_geometry=scale_geometry(geometry, size), digest=image_digest(image))


# ------------------------------------------------------------------------------------------------
# Explanations, cached
# ------------------------------------------------------------------------------------------------
class ReplicaPool:
    """Private copies of a model (own weights, own lock) for plain forward passes, so that `size` requests compute
    deletion/insertion curves in parallel (curves are ~90% of an explanation's cost) while the shared model
    stays free for the methods, whose hooks must not see anyone else's forward pass."""

    def __init__(self, size: int = 1, max_models: int = 3):
        self.size, self.max_models = max(1, int(size)), max_models
        self._pools: OrderedDict = OrderedDict()  # model key -> [queue of idle replicas, number created]
        self._lock = threading.Lock()

    @staticmethod
    def _key(bundle) -> tuple:
        return bundle.name, id(bundle.network), str(bundle.device)

    def _replica(self, bundle):
        with bundle.lock:  # no method's hooks are registered while the lock is held
            replica = copy.copy(bundle)
            replica.network = copy.deepcopy(bundle.network).eval()
        replica.lock = threading.RLock()
        return replica

    class _Lease:
        def __init__(self, pool, bundle):
            self.pool, self.bundle, self.replica = pool, bundle, None

        def __enter__(self):
            import queue

            if self.pool.size <= 1:
                self.bundle.lock.acquire()
                return self.bundle
            key = self.pool._key(self.bundle)
            with self.pool._lock:
                entry = self.pool._pools.get(key)
                if entry is None:
                    entry = self.pool._pools[key] = [queue.Queue(), 0]
                    while len(self.pool._pools) > self.pool.max_models:
                        self.pool._pools.popitem(last=False)
                self.pool._pools.move_to_end(key)
                idle, created = entry
                make = idle.empty() and created < self.pool.size
                if make:
                    entry[1] += 1
            self.queue = idle
            self.replica = self.pool._replica(self.bundle) if make else idle.get()
            return self.replica

        def __exit__(self, *exc):
            if self.replica is None:
                self.bundle.lock.release()
            else:
                self.queue.put(self.replica)
            return False

    def lease(self, bundle):
        """`with pool.lease(bundle) as model:` a model for plain forward passes, for the block's duration."""
        return self._Lease(self, bundle)


class ExplanationCache:
    """A small thread-safe LRU shared by all sessions, keyed by content (model, image hash, target,
    method, options): two users explaining the same picture share the work; no per-user state here.
    `parallel` > 1 gives it a ReplicaPool, so that curves for different requests run side by side."""

    def __init__(self, max_items: int = 256, max_states: int = 64, state_bytes: int = 768 * 2 ** 20,
                 parallel: int = 1):
        self._items: OrderedDict = OrderedDict()
        self._states: OrderedDict = OrderedDict()
        self._state_sizes: dict = {}
        self.max_items, self.max_states, self.state_bytes = max_items, max_states, state_bytes
        self._lock = threading.Lock()
        self.replicas = ReplicaPool(parallel)

    @staticmethod
    def key(*parts) -> str:
        return json.dumps(parts, sort_keys=True, default=str)

    def _get(self, store, key):
        with self._lock:
            if key in store:
                store.move_to_end(key)
                return store[key]
        return None

    def _put(self, store, key, value, limit):
        with self._lock:
            store[key] = value
            store.move_to_end(key)
            while len(store) > limit:
                store.popitem(last=False)
        return value

    def get(self, key):
        return self._get(self._items, key)

    def put(self, key, value):
        return self._put(self._items, key, value, self.max_items)

    def get_state(self, key):
        return self._get(self._states, key)

    def put_state(self, key, value):
        """Per-image method statistics (GradSkip's capture: ~0.3 MB for a 64 px ViT, ~22 MB for ViT-B/16),
        bounded by count and by bytes."""
        size = sum(t.numel() * t.element_size() for t in vars(value).values() if isinstance(t, torch.Tensor))
        with self._lock:
            self._states[key] = value
            self._state_sizes[key] = size
            self._states.move_to_end(key)
            while len(self._states) > 1 and (len(self._states) > self.max_states
                                             or sum(self._state_sizes.values()) > self.state_bytes):
                old, _ = self._states.popitem(last=False)
                self._state_sizes.pop(old, None)
        return value

    def clear(self):
        with self._lock:
            self._items.clear()
            self._states.clear()
            self._state_sizes.clear()


def predict_top(bundle, prepared: PreparedImage, top_k: int = 5) -> list:
    """[(class index, class name, probability)] for one prepared image."""
    from .evaluate import predict

    with bundle.lock, torch.no_grad():
        return predict(bundle, prepared.tensor, top_k)[0]


def method_options(method: str, alpha: float = 0.5, refine_steps: int = 0, bundle=None) -> dict:
    """The UI's options for a method: alpha for GradSkip, refine_steps for AHA; RISE uses 1,000 masks on a
    CPU (4,000 on a GPU) so that it stays interactive."""
    if method == "gradskip":
        return {"alpha": float(alpha)}
    if method == "aha":
        return {"refine_steps": int(refine_steps)}
    if method == "rise":
        on_gpu = bundle is not None and bundle.device.type == "cuda"
        small = bundle is not None and bundle.input_size[0] * bundle.input_size[1] <= 96 * 96
        return {"n_masks": 4000 if on_gpu else (1000 if small else 300), "batch_size": 100}
    return {}


def _as_map(maps) -> np.ndarray:
    array = maps.detach().float().cpu().numpy() if isinstance(maps, torch.Tensor) else np.asarray(maps, np.float32)
    while array.ndim > 2:
        array = array[0]
    return np.nan_to_num(array.astype(np.float32))


def gradskip_state(bundle, prepared: PreparedImage, target: int, cache: ExplanationCache | None):
    """The alpha-independent GradSkip statistics for this image and target (one capture, then cached)."""
    key = ExplanationCache.key("gradskip-state", bundle.name, id(bundle.network), prepared.digest, target)
    state = cache.get_state(key) if cache else None
    if state is None:
        method = get_method("gradskip")
        with bundle.lock:
            state = method.prepare(bundle, prepared.tensor, as_targets(int(target), 1, prepared.tensor.device))
        if cache:
            cache.put_state(key, state)
    return state


def compute_curves(bundle, prepared: PreparedImage, maps: np.ndarray, target: int, *, steps: int = 20,
                   reference: str = "mean", replicas: ReplicaPool | None = None) -> Curves:
    tensor = torch.as_tensor(maps, dtype=torch.float32, device=prepared.tensor.device).unsqueeze(0)
    with (replicas or ReplicaPool(1)).lease(bundle) as model:
        return deletion_insertion(model, prepared.tensor, tensor, [int(target)], steps=steps, reference=reference)


def result_record(method: str, target: int, options: dict, maps: np.ndarray, seconds: float,
                  curves: Curves | None, bundle=None) -> dict:
    """A plain, copyable record of one method's explanation (what the app keeps in per-session state)."""
    record = {"method": method, "label": method_label(method), "target": int(target),
              "target_name": bundle.class_name(int(target)) if bundle is not None else str(target),
              "options": dict(options), "map": maps.astype(np.float32), "seconds": float(seconds),
              "fractions": None, "deletion": None, "insertion": None, "deletion_auc": None, "insertion_auc": None}
    if curves is not None:
        set_curves(record, curves)
    return record


def set_curves(record: dict, curves: Curves) -> dict:
    record["fractions"] = [float(v) for v in curves.fractions]
    record["deletion"] = [float(v) for v in curves.deletion[0]]
    record["insertion"] = [float(v) for v in curves.insertion[0]]
    record["deletion_auc"] = float(curves.deletion_auc[0])
    record["insertion_auc"] = float(curves.insertion_auc[0])
    return record


def _result_key(bundle, prepared, method, target, options, steps, reference) -> str:
    return ExplanationCache.key("map", bundle.name, id(bundle.network), prepared.digest, int(target), method,
                                dict(options), steps, reference)


def cached_result(cache, bundle, prepared: PreparedImage, method: str, target: int, options: dict, *,
                  steps: int = 20, reference: str = "mean") -> dict | None:
    """The cached record (with curves) of an earlier `run_method` call with the same arguments, or None."""
    if cache is None:
        return None
    found = cache.get(_result_key(bundle, prepared, method, target, options, steps, reference))
    return copy.deepcopy(found) if found is not None else None


def run_method(bundle, prepared: PreparedImage, method: str, target: int, options: dict | None = None, *,
               cache: ExplanationCache | None = None, curves: bool = True, steps: int = 20,
               reference: str = "mean") -> dict:
    """One method's map (and curves) for one image and target, as a `result_record`.

    The map and the curves are cached separately (a map shown first, its curves added later, is computed once).
    GradSkip captures its statistics once per (image, target) and recombines them for any alpha.
    Raises MethodNotApplicable / ValueError with user-facing messages."""
    options = dict(options or {})
    target = int(target)
    if curves:
        found = cached_result(cache, bundle, prepared, method, target, options, steps=steps, reference=reference)
        if found is not None:
            return found
    map_key = _result_key(bundle, prepared, method, target, options, None, reference)
    result = copy.deepcopy(cache.get(map_key)) if cache and cache.get(map_key) is not None else None
    if result is None:
        started = time.perf_counter()
        if method == "gradskip":
            state = gradskip_state(bundle, prepared, target, cache)
            maps = _as_map(state.map(options.get("alpha")))
        else:
            method_obj = get_method(method, **options)
            method_obj.check(bundle)
            torch.manual_seed(SEED)
            with bundle.lock:
                maps = _as_map(method_obj.attribute(bundle, prepared.tensor,
                                                    as_targets(target, 1, prepared.tensor.device)))
        result = result_record(method, target, options, maps, time.perf_counter() - started, None, bundle)
        if cache:
            cache.put(map_key, copy.deepcopy(result))
    if curves:
        result = add_curves(bundle, prepared, result, cache, steps=steps, reference=reference)
    return result


def add_curves(bundle, prepared: PreparedImage, record: dict, cache: ExplanationCache | None = None, *,
               steps: int = 20, reference: str = "mean") -> dict:
    """The record with its deletion/insertion curves (computed once per map, then cached)."""
    if record.get("fractions") is not None:
        return record
    found = cached_result(cache, bundle, prepared, record["method"], record["target"], record["options"],
                          steps=steps, reference=reference)
    if found is not None:
        return found
    record = copy.deepcopy(record)
    set_curves(record, compute_curves(bundle, prepared, record["map"], record["target"], steps=steps,
                                      reference=reference, replicas=cache.replicas if cache else None))
    if cache:
        cache.put(_result_key(bundle, prepared, record["method"], record["target"], record["options"], steps,
                              reference), copy.deepcopy(record))
    return record


def gradskip_recombine(bundle, prepared: PreparedImage, record: dict, alpha: float,
                       cache: ExplanationCache | None) -> dict:
    """GradSkip for a new alpha from the cached statistics: no model pass; curves left empty (stale)."""
    state = gradskip_state(bundle, prepared, record["target"], cache)
    started = time.perf_counter()
    maps = _as_map(state.map(float(alpha)))
    return result_record("gradskip", record["target"], {**record["options"], "alpha": float(alpha)}, maps,
                         time.perf_counter() - started, None, bundle)


def gradskip_diagnostics(bundle, prepared: PreparedImage, target: int, alpha: float, cache) -> dict:
    return gradskip_state(bundle, prepared, target, cache).diagnostics(float(alpha))


# ------------------------------------------------------------------------------------------------
# Pictures
# ------------------------------------------------------------------------------------------------
def map_to_display(record: dict, prepared: PreparedImage) -> np.ndarray:
    return map_to_original(record["map"], prepared.display_geometry)


def render_overlays(prepared: PreparedImage, results: list, opacity: float = 0.5, colormap: str = "cividis") -> list:
    """[(PIL overlay, caption)] in the display image's size, one per result."""
    items = []
    for record in results:
        picture = overlay(prepared.display, map_to_display(record, prepared), opacity=float(opacity), colormap=colormap)
        items.append((picture, caption(record)))
    return items


def caption(record: dict) -> str:
    text = f"{record['label']} · {record['target_name']}"
    option_text = ", ".join(f"{k}={v}" for k, v in record["options"].items())
    if option_text:
        text += f" ({option_text})"
    if record.get("deletion_auc") is not None:
        text += f" · del {record['deletion_auc']:.3f} ↓ · ins {record['insertion_auc']:.3f} ↑"
    return text


def color_for(method: str, index: int = 0) -> str:
    return METHOD_COLORS.get(method, FALLBACK_COLORS[index % len(FALLBACK_COLORS)])


class FigureSpec:
    """A plotly figure as plain JSON-ready dicts: `to_json()` is what a browser's Plotly.react needs (gr.Plot
    accepts this object as it accepts a plotly Figure), `to_plotly()` builds a real `plotly.graph_objects.Figure`.
    Plain dicts because building a validated plotly Figure costs ~80 ms per redraw on a small CPU."""

    def __init__(self, data=None, layout=None):
        self.data = list(data or [])
        self.layout = dict(layout or {})

    def to_dict(self) -> dict:
        return {"data": self.data, "layout": self.layout}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=_json_default)

    def to_plotly(self):
        import plotly.graph_objects as go

        return go.Figure(self.to_dict())

    def show(self):  # pragma: no cover - interactive use
        return self.to_plotly().show()


def _json_default(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


GRID = "#E5ECF6"


def _axis(**kwargs) -> dict:
    return {"gridcolor": GRID, "linecolor": "#BCCCDC", "zerolinecolor": GRID, "automargin": True, **kwargs}


def _layout(title: str, height: int, **kwargs) -> dict:
    return {"title": {"text": title, "font": {"size": 15}}, "height": height, "paper_bgcolor": "white",
            "plot_bgcolor": "white", "font": {"color": "#2a3f5f", "family": "system-ui, sans-serif"},
            "margin": {"l": 60, "r": 20, "t": 50, "b": 40}, **kwargs}


def curves_figure(results: list, title: str | None = None) -> FigureSpec:
    """Deletion (solid) and insertion (dashed) curves of every method on the same axes; AUCs in the legend."""
    data = []
    for index, record in enumerate(results):
        if record.get("fractions") is None:
            continue
        colour = color_for(record["method"], index)
        x = [100 * f for f in record["fractions"]]
        data.append({"type": "scatter", "x": x, "y": record["deletion"], "mode": "lines+markers",
                     "line": {"color": colour, "width": 2.5}, "marker": {"size": 5},
                     "name": f"{record['label']} deletion · AUC {record['deletion_auc']:.3f} (lower is better)",
                     "legendgroup": record["method"], "hovertemplate": "%{x:.0f}% deleted: p=%{y:.3f}<extra></extra>"})
        data.append({"type": "scatter", "x": x, "y": record["insertion"], "mode": "lines+markers",
                     "line": {"color": colour, "width": 2.5, "dash": "dash"}, "marker": {"size": 5, "symbol": "diamond"},
                     "name": f"{record['label']} insertion · AUC {record['insertion_auc']:.3f} (higher is better)",
                     "legendgroup": record["method"], "hovertemplate": "%{x:.0f}% inserted: p=%{y:.3f}<extra></extra>"})
    target = results[0]["target_name"] if results else ""
    layout = _layout(title or (f"Deletion and insertion for '{target}'" if target else "Deletion and insertion"), 520,
                     xaxis=_axis(title={"text": "pixels deleted (solid) / inserted (dashed), most important first (%)"},
                                 range=[0, 100]),
                     yaxis=_axis(title={"text": "probability of the target class"}, range=[0, 1.02]),
                     legend={"orientation": "h", "yanchor": "top", "y": -0.2, "xanchor": "left", "x": 0,
                             "font": {"size": 11}},
                     hovermode="x unified", margin={"l": 60, "r": 20, "t": 50, "b": 130})
    return FigureSpec(data, layout)


def empty_figure(message: str) -> FigureSpec:
    layout = _layout("", 300, xaxis={"visible": False}, yaxis={"visible": False},
                     annotations=[{"text": message, "showarrow": False, "font": {"size": 14, "color": "#555"},
                                   "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}],
                     margin={"l": 20, "r": 20, "t": 20, "b": 20})
    return FigureSpec([], layout)


def head_weights_figure(diagnostics: dict) -> FigureSpec:
    """GradSkip's head weights (layers x heads) as a heatmap."""
    weights = np.asarray(diagnostics["head_weights"], dtype=float)
    data = [{"type": "heatmap", "z": weights.round(4).tolist(), "colorscale": "Cividis",
             "colorbar": {"title": {"text": "weight"}},
             "x": [f"h{h}" for h in range(weights.shape[1])], "y": [f"block {b}" for b in range(weights.shape[0])],
             "hovertemplate": "%{y}, %{x}: %{z:.3f}<extra></extra>"}]
    layout = _layout(f"GradSkip head weights (alpha = {diagnostics['alpha']:.2f})", 320,
                     margin={"l": 70, "r": 20, "t": 45, "b": 30})
    return FigureSpec(data, layout)


def auc_table(results: list) -> list:
    """Rows [method, options, deletion AUC, insertion AUC, ins - del, ms] for a table."""
    rows = []
    for record in results:
        dele, ins = record.get("deletion_auc"), record.get("insertion_auc")
        rows.append([record["label"], ", ".join(f"{k}={v}" for k, v in record["options"].items()) or "-",
                     None if dele is None else round(dele, 4), None if ins is None else round(ins, 4),
                     None if dele is None else round(ins - dele, 4), round(1000 * record["seconds"], 1)])
    return rows


AUC_HEADERS = ["method", "options", "deletion AUC (lower is better)", "insertion AUC (higher is better)",
               "insertion − deletion", "map time (ms)"]


# ------------------------------------------------------------------------------------------------
# Exports
# ------------------------------------------------------------------------------------------------
def versions() -> dict:
    import timm

    result = {"python": platform.python_version(), "torch": torch.__version__, "timm": timm.__version__,
              "numpy": np.__version__}
    try:
        import gradio

        result["gradio"] = gradio.__version__
    except ImportError:
        pass
    return result


def curves_csv(results: list, path) -> Path:
    """One row per (method, fraction): method, options, target, fraction, deletion, insertion."""
    path = Path(path)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["method", "options", "target", "target_name", "fraction", "deletion_score", "insertion_score"])
        for record in results:
            if record.get("fractions") is None:
                continue
            options = json.dumps(record["options"], sort_keys=True)
            for f, d, i in zip(record["fractions"], record["deletion"], record["insertion"]):
                writer.writerow([record["method"], options, record["target"], record["target_name"], f"{f:.4f}",
                                 f"{d:.6f}", f"{i:.6f}"])
    return path


def report(bundle_name: str, results: list, *, image_name: str = "", prediction=None, steps: int = 20,
           reference: str = "mean", extra: dict | None = None) -> dict:
    """The JSON report: model, each method with options, target and AUCs, protocol, versions, seed."""
    return {
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": bundle_name,
        "image": image_name,
        "prediction": [{"class_index": i, "class_name": n, "probability": round(p, 6)} for i, n, p in (prediction or [])],
        "methods": [{"method": r["method"], "label": r["label"], "options": r["options"], "target": r["target"],
                     "target_name": r["target_name"], "deletion_auc": r["deletion_auc"],
                     "insertion_auc": r["insertion_auc"], "map_seconds": r["seconds"]} for r in results],
        "protocol": {"steps": steps, "reference": reference, "score": "softmax probability of the target",
                     "auc": "trapezoid over p in [0, 1]", "note": CURVE_NOTE},
        "seed": SEED,
        "versions": versions(),
        **(extra or {}),
    }


def write_downloads(folder, bundle_name: str, prepared: PreparedImage, results: list, *, opacity: float,
                    colormap: str, prediction=None, image_name: str = "", steps: int = 20,
                    reference: str = "mean") -> list:
    """Overlay PNGs (one per method, at the original size), curves.csv and report.json; returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for record in results:
        full = map_to_original(record["map"], prepared.geometry)
        picture = overlay(prepared.original, full, opacity=float(opacity), colormap=colormap)
        path = folder / f"overlay-{record['method']}.png"
        picture.save(path, format="PNG")
        paths.append(path)
    paths.append(curves_csv(results, folder / "curves.csv"))
    data = report(bundle_name, results, image_name=image_name, prediction=prediction, steps=steps,
                  reference=reference, extra={"overlay": {"opacity": float(opacity), "colormap": colormap}})
    report_path = folder / "report.json"
    report_path.write_text(json.dumps(data, indent=2))
    paths.append(report_path)
    return paths


# ------------------------------------------------------------------------------------------------
# Data sets (the BloodMNIST browser and the review gallery)
# ------------------------------------------------------------------------------------------------
def class_names_for(folder) -> list | None:
    folder = Path(folder)
    for candidate in (folder / "classes.txt", folder.parent / "classes.txt", folder.parent.parent / "classes.txt"):
        if candidate.exists():
            return [line.strip() for line in candidate.read_text().splitlines() if line.strip()]
    return None


def dataset_key(folder) -> str:
    """A stable name for a data folder (its resolved path)."""
    return str(Path(folder).expanduser().resolve())


def item_name(dataset, index: int) -> str:
    if hasattr(dataset, "items"):
        return str(dataset.items[index][0])
    return f"{index:06d}"


def dataset_image(dataset, index: int) -> Image.Image:
    return dataset.image(index)


@torch.no_grad()
def predict_dataset(bundle, dataset, indices=None, batch_size: int = 64, progress=None) -> list:
    """[(item name, position, label, predicted class, confidence)] for the given indices."""
    from .images import prepare_image

    indices = list(range(len(dataset))) if indices is None else list(indices)
    rows = []
    for start in range(0, len(indices), batch_size):
        chunk = indices[start:start + batch_size]
        tensors = [prepare_image(dataset.image(i), bundle.input_size, bundle.crop_pct, bundle.interpolation)[0][0]
                   for i in chunk]
        images = torch.stack(tensors).to(bundle.device)
        with bundle.lock:
            probabilities = bundle(images).softmax(dim=1)
        confidence, predicted = probabilities.max(dim=1)
        for i, p, c in zip(chunk, predicted.tolist(), confidence.tolist()):
            rows.append((item_name(dataset, i), i, int(dataset.labels[i]), int(p), float(c)))
        if progress is not None:
            progress(min(start + batch_size, len(indices)), len(indices))
    return rows


def filter_rows(rows: list, class_index=None, correctness: str = "all") -> list:
    """Rows (dicts with label/prediction) filtered by true class and by correct/incorrect."""
    out = []
    for row in rows:
        if class_index is not None and int(row["label"]) != int(class_index):
            continue
        correct = int(row["label"]) == int(row["prediction"])
        if correctness == "correct" and not correct:
            continue
        if correctness == "incorrect" and correct:
            continue
        out.append(row)
    return out


# ------------------------------------------------------------------------------------------------
# Masks (pictures for the mask editor and SAM clicks)
# ------------------------------------------------------------------------------------------------
def mask_overlay(image: np.ndarray, mask: np.ndarray, points=None, box=None) -> Image.Image:
    """The image with the mask tinted blue (Okabe-Ito), clicked points (green: object, orange: background) and a box."""
    base = Image.fromarray(np.asarray(image, dtype=np.uint8)).convert("RGB")
    tint = np.asarray(base, dtype=np.float32).copy()
    colour = np.array([0, 114, 178], dtype=np.float32)  # Okabe-Ito blue
    tint[mask] = 0.45 * tint[mask] + 0.55 * colour
    picture = Image.fromarray(tint.astype(np.uint8))
    if points or box:
        from PIL import ImageDraw

        draw = ImageDraw.Draw(picture)
        radius = max(3, round(0.015 * max(picture.size)))
        for (x, y), lab in zip(*(points or ([], []))):
            fill = (0, 158, 115) if lab else (213, 94, 0)
            draw.ellipse([x - radius, y - radius, x + radius, y + radius], fill=fill, outline=(255, 255, 255), width=2)
        if box:
            draw.rectangle(box, outline=(230, 159, 0), width=max(2, radius // 2))
    return picture


def display_rgb(rgb, minimum: int = 320) -> np.ndarray:
    """Small images (BloodMNIST's 64 px) enlarged so that points can be clicked precisely (H x W x 3 uint8)."""
    rgb = np.asarray(rgb, dtype=np.uint8)
    longest = max(rgb.shape[:2])
    if longest >= minimum:
        return rgb
    scale = minimum / longest
    size = (round(rgb.shape[1] * scale), round(rgb.shape[0] * scale))
    return np.asarray(Image.fromarray(rgb).resize(size, Image.Resampling.LANCZOS))


def editor_background(value):
    """The uploaded picture inside a gr.ImageEditor / gr.ImageMask value (or the value itself), or None."""
    if value is None:
        return None
    if isinstance(value, dict):
        background = value.get("background")
        if background is None:
            background = value.get("composite")
        return None if background is None else np.asarray(background)
    return np.asarray(value)


def as_rgb(array) -> np.ndarray:
    """H x W, H x W x 3 or H x W x 4 (alpha over white) -> H x W x 3 uint8."""
    array = np.asarray(array)
    if array.ndim == 2:
        array = np.repeat(array[..., None], 3, axis=2)
    if array.shape[-1] == 4:
        rgb = array[..., :3].astype(np.float32)
        alpha = array[..., 3:4].astype(np.float32) / 255.0
        array = (rgb * alpha + 255.0 * (1 - alpha)).round().astype(np.uint8)
    return np.ascontiguousarray(array[..., :3].astype(np.uint8))


# ------------------------------------------------------------------------------------------------
# Sanity check (Adebayo et al. 2018), one stage at a time so the UI can show it live
# ------------------------------------------------------------------------------------------------
def parameter_layers(network) -> list:
    """[(name, module)] of modules that own parameters, from the output layer down."""
    layers = [(name, module) for name, module in network.named_modules()
              if name and any(True for _ in module.parameters(recurse=False))]
    layers.reverse()
    return layers


def sanity_check_stages(bundle, method: str, prepared: PreparedImage, target: int, *, stages: int = 4,
                        layers_per_stage: int | None = None, options: dict | None = None, seed: int = SEED):
    """Cascading randomisation: yield (stage name, map, Spearman rho with the original map) for the
    original model and then after re-initialising more and more of its top layers. A faithful method's
    map changes (rho drops well below 1). Works on a copy: the shared model is never touched."""
    method_obj = get_method(method, **(options or {}))
    method_obj.check(bundle)
    targets = as_targets(int(target), 1, prepared.tensor.device)
    torch.manual_seed(seed)
    with bundle.lock:
        original = method_obj.attribute(bundle, prepared.tensor, targets).detach()
        randomized = copy.copy(bundle)
        randomized.network = copy.deepcopy(bundle.network)
    randomized.lock = threading.RLock()
    yield "original model", _as_map(original), 1.0
    layers = parameter_layers(randomized.network)
    per_stage = layers_per_stage or max(1, len(layers) // (2 * stages))
    generator = torch.Generator().manual_seed(seed)
    done = 0
    for stage in range(stages):
        chunk = layers[done:done + per_stage * (1 if stage == 0 else 2 ** stage)]
        if not chunk:
            break
        done += len(chunk)
        with torch.no_grad():
            for name, module in chunk:
                for parameter in module.parameters(recurse=False):
                    if parameter.dim() > 1:
                        fan_in = parameter[0].numel()
                        parameter.copy_(torch.randn(parameter.shape, generator=generator) * (2.0 / fan_in) ** 0.5)
                    elif "norm" in name or "bn" in name:
                        parameter.copy_(torch.rand(parameter.shape, generator=generator) + 0.5)
                    else:
                        parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
        torch.manual_seed(seed)
        maps = method_obj.attribute(randomized, prepared.tensor, targets).detach()
        rho = spearman(original[0], maps[0])
        yield f"top {done} layers randomised (down to {chunk[-1][0]})", _as_map(maps), float(rho)


def sanity_figure(stages: list, title: str = "Sanity check") -> FigureSpec:
    """Spearman rho of each stage's map with the original map, per method: [(method label, [(stage, rho)])]."""
    palette = list(METHOD_COLORS.values())
    data = []
    for index, (label, points) in enumerate(stages):
        data.append({"type": "scatter", "x": list(range(len(points))), "y": [rho for _, rho in points],
                     "mode": "lines+markers", "name": label, "text": [name for name, _ in points],
                     "line": {"color": palette[index % len(palette)], "width": 2.5},
                     "hovertemplate": "%{text}: rho=%{y:.3f}<extra></extra>"})
    layout = _layout(title, 340, xaxis=_axis(title={"text": "randomisation stage (0 = trained model)"}, dtick=1),
                     yaxis=_axis(title={"text": "rank correlation with the original map"}, range=[-0.2, 1.05]),
                     legend={"orientation": "h", "y": -0.25},
                     shapes=[{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": 0, "y1": 0,
                              "line": {"color": "#999", "dash": "dot"}}])
    return FigureSpec(data, layout)


# ------------------------------------------------------------------------------------------------
# Fine-tune jobs
# ------------------------------------------------------------------------------------------------
JOB_SERIES = {"loss": ("loss (total)", "y"), "ce": ("cross-entropy", "y"), "reg": ("mask loss (outside − inside)", "y"),
              "alpha": ("mean CAM inside mask", "y2"), "beta": ("mean CAM outside mask", "y2"),
              "iou": ("IoU", "y2"), "accuracy": ("accuracy", "y2")}


def job_figure(history: list, title: str = "Fine-tune progress") -> FigureSpec:
    """Loss terms (left axis) and the CAM inside/outside the masks, IoU, accuracy (right axis) against the step,
    from JobRunner.history(); `before_iou` (if reported) is drawn as a dotted reference line."""
    palette = list(METHOD_COLORS.values())
    data, shapes, annotations = [], [], []
    for index, (key, (label, axis)) in enumerate(JOB_SERIES.items()):
        points = [(p.get("step"), p[key]) for p in history if isinstance(p.get(key), (int, float))]
        if not points:
            continue
        data.append({"type": "scatter", "x": [s for s, _ in points], "y": [v for _, v in points],
                     "mode": "lines+markers", "name": label, "yaxis": axis, "marker": {"size": 4},
                     "line": {"color": palette[index % len(palette)], "width": 2,
                              "dash": "dot" if axis == "y2" else "solid"}})
    for point in history:
        if isinstance(point.get("before_iou"), (int, float)):
            shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y2", "y0": point["before_iou"],
                           "y1": point["before_iou"], "line": {"color": "#999", "dash": "dot"}})
            annotations.append({"text": f"IoU before {point['before_iou']:.2f}", "xref": "paper", "x": 1,
                                "yref": "y2", "y": point["before_iou"], "showarrow": False, "xanchor": "right"})
            break
    layout = _layout(title, 340, xaxis=_axis(title={"text": "step"}), yaxis=_axis(title={"text": "loss"}),
                     yaxis2={"title": {"text": "CAM share / IoU"}, "overlaying": "y", "side": "right",
                             "range": [0, 1], "showgrid": False},
                     margin={"l": 60, "r": 60, "t": 45, "b": 40}, legend={"orientation": "h", "y": -0.25},
                     shapes=shapes, annotations=annotations)
    return FigureSpec(data, layout)


CAMAL_ROWS = {"accuracy": "accuracy", "iou": "IoU of CAM with mask", "pointing_game": "pointing game",
              "cam_inside": "mean CAM inside mask", "cam_outside": "mean CAM outside mask",
              "deletion_auc": "deletion AUC (lower is better)", "insertion_auc": "insertion AUC (higher is better)"}


def camal_comparison_rows(result: dict) -> list:
    """[label, before, after] rows from `camal.run_camal`'s summary (every evaluated mask set)."""
    before_sets, after_sets = result.get("before") or {}, result.get("after") or {}
    rows = []
    for set_name in before_sets:
        before, after = before_sets.get(set_name) or {}, after_sets.get(set_name) or {}
        for key, label in CAMAL_ROWS.items():
            b, a = before.get(key), after.get(key)
            if b is None and a is None:
                continue
            rows.append([f"{label} [{set_name}]", None if b is None else round(float(b), 4),
                         None if a is None else round(float(a), 4)])
    return rows


def camal_figures(result: dict, weights_dir) -> list:
    """[(path, caption)] of the before/after figures a CAMAL run wrote beside its card."""
    card = result.get("card")
    folder = Path(card).parent if card else Path(weights_dir)
    return [(str(folder / name), "before / after") for name in (result.get("figures") or {}).values()
            if (folder / name).exists()]


def decoy_model_cards(folders) -> tuple:
    """(before, after) model cards among `*decoy*.json` in the folders (earlier folders first): a classifier
    trained on decoy BloodMNIST and a CAMAL fine-tune (a card with a 'camal' record); None where missing.
    A fine-tune whose `camal.base_model` (a name or a card path) is one of the decoy classifiers is paired
    with it (e.g. decoy-bloodmnist-cnn and decoy-bloodmnist-cnn-camal)."""
    befores, afters = [], []
    for folder in folders:
        folder = Path(folder)
        if not folder.is_dir():
            continue
        for card_file in sorted(folder.glob("*decoy*.json")):
            if card_file.name.startswith("aha-"):
                continue
            try:
                card = json.loads(card_file.read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(card, dict) or card.get("kind") not in (None, "classifier"):
                continue
            if card.get("camal"):
                afters.append((card_file, card))
            else:
                befores.append((card_file, card))
    for after_file, card in afters:
        base = str((card.get("camal") or {}).get("base_model") or card.get("base_model") or "")
        base_name = Path(base).stem if base.endswith(".json") else Path(base).name
        pair = next((before_file for before_file, _ in befores if before_file.stem == base_name), None)
        if pair is not None:
            return pair, after_file
    return (befores[0][0] if befores else None), (afters[0][0] if afters else None)


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
