"""The explanation engine: what an interactive caller (the app, the CLI, a notebook) runs between "this image,
this model, these methods" and a record it can show: prepared inputs, a shared thread-safe explanation cache,
a pool of model replicas for the curves, one method's map with its deletion/insertion curves, and exports.

    bundle = load_model("bloodmnist-cnn")
    prepared = prepare_input(load_image("cell.png"), bundle)
    cache = ExplanationCache()
    record = run_method(bundle, prepared, "gradcam", target=3, options={}, cache=cache)   # map + curves
    record["map"], record["deletion_auc"], record["insertion_auc"]

    batch = explain_batch(bundle, "gradcam", images, targets)   # B maps: what evaluate, gridpg, sanity use
    batch.maps, batch.seconds, batch.resolved, batch.caveat

`explain_batch` is the one path from a method to its maps: the bundle's lock, the seed, the applicability and
target checks, what the method resolved (AHA's mode) and its caveat. `run_method` (one image, cached, with
curves) runs it; so do the evaluation over a data set, the grid pointing game, the sanity checks and the CLI.
A target is a class index or any `explainers.targets.Target` (a segmentation model's region): the map, the cache
key and the curves (`Target.curve_score`) all follow it.

Methods with a `prepare` hook and live options (GradSkip's alpha) are prepared once per (image, target) and
recombined for every value (`recombine`), without a model pass.
"""
from __future__ import annotations

import copy
import csv
import dataclasses
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

from .images import Geometry, crop_region, image_digest, map_array, map_to_original, overlay, prepare_for_model
from .methods import METHODS, Method, as_targets, check_targets, get_method
from .metrics import Curves, curve_note, deletion_insertion
from .targets import Target, target_key

CURVE_NOTE = curve_note()
DISPLAY_MIN, DISPLAY_MAX = 256, 512
SEED = 0


def method_label(name: str) -> str:
    cls = METHODS.get(name)
    return (cls.label or name) if cls else name


def method_options(method: str, values: dict | None = None, bundle=None) -> dict:
    """The options an interactive caller passes to a method: its user options (from `values`, else their
    defaults) and its `interactive_options(bundle)` (e.g. RISE: 1,000 masks on a CPU, 4,000 on a GPU)."""
    cls = METHODS.get(method)
    if cls is None:
        return {}
    values = values or {}
    options = {o.name: o.cast(values.get(o.name)) for o in cls.user_options}
    if bundle is not None:
        options.update(cls.interactive_options(bundle))
    return options


# ------------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------------
@dataclass
class PreparedInput:
    """One image ready for a model, with what it takes to draw on it (not masks.SegmenterImage: SAM's)."""
    original: Image.Image
    display: Image.Image  # what the UI shows: the original scaled to DISPLAY_MIN..DISPLAY_MAX px
    tensor: torch.Tensor  # 1 x 3 x H x W in [0, 1], on the bundle's device
    geometry: Geometry  # model input -> original
    display_geometry: Geometry  # model input -> display image
    digest: str  # content hash of the original (cache key)


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


def prepare_input(image: Image.Image, bundle) -> PreparedInput:
    tensor, geometry = prepare_for_model(image, bundle)
    size = display_size(image.size)
    display = image if size == image.size else image.resize(size, Image.Resampling.LANCZOS)
    return PreparedInput(original=image, display=display, tensor=tensor.to(bundle.device), geometry=geometry,
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


@torch.no_grad()
def predict(bundle, images: torch.Tensor, top_k: int = 5) -> list:
    """Top-k (class index, class name, probability) per image."""
    return top_classes(bundle, bundle(images), top_k)


def top_classes(bundle, logits: torch.Tensor, top_k: int = 5) -> list:
    """Top-k (class index, class name, probability) per row of logits (from a pass already made)."""
    probabilities = logits.softmax(dim=1)
    values, indices = probabilities.topk(min(top_k, probabilities.shape[1]), dim=1)
    return [[(int(i), bundle.class_name(int(i)), float(v)) for v, i in zip(vs, ix)]
            for vs, ix in zip(values, indices)]


def predict_top(bundle, prepared: PreparedInput, top_k: int = 5) -> list:
    """[(class index, class name, probability)] for one prepared image."""
    with bundle.lock, torch.no_grad():
        return predict(bundle, prepared.tensor, top_k)[0]


def predict_and_check(bundle, prepared: PreparedInput, top_k: int = 5) -> tuple:
    """(the top-k prediction, the familiarity verdict): whether the image looks like the model's training images
    (`familiarity.verdict`; None where the model has no statistics), read from the same forward pass."""
    from . import familiarity

    logits, verdicts = familiarity.forward_and_check(bundle, prepared.tensor)
    return top_classes(bundle, logits, top_k)[0], (verdicts[0] if verdicts else None)


@dataclass
class BatchMaps:
    """One method's maps for a batch: B x H x W (detached), the seconds they took, what the method resolved for
    this model (AHA's mode, a trained explainer's blur; {} for most methods) and its caveat on this model."""
    maps: torch.Tensor
    seconds: float
    resolved: dict
    caveat: str | None


def explain_batch(bundle, method, images: torch.Tensor, targets, *, seed: int | None = SEED,
                  progress=None) -> BatchMaps:
    """The one run path from a method to its maps. `method`: a registered name or a Method; `targets`: an int,
    B class indices, any `Target` (a region: methods with `any_target`) or a function of the logits (methods with
    `score_targets`). Checks that the method can
    explain the model (MethodNotApplicable, in words a user can act on) and the targets, holds the bundle's
    lock (no other caller's hooks see the passes), and reseeds the global generator with `seed` first (a method
    that draws from it gives the same maps every run; RISE and the random map carry generators of their own);
    `seed=None` leaves the generator to the caller, who seeded once for a whole data set."""
    method_obj = method if isinstance(method, Method) else get_method(method)
    method_obj.check(bundle)
    check_targets(method_obj, targets)
    targets = as_targets(targets, images.shape[0], images.device)
    extra = {"progress": progress} if progress is not None and _accepts_progress(method_obj) else {}
    with bundle.lock:
        if seed is not None:
            torch.manual_seed(seed)
        started = time.perf_counter()
        maps = method_obj.attribute(bundle, images, targets, **extra).detach()
        seconds = time.perf_counter() - started
    resolved = dict(getattr(method_obj, "resolved_options", None) or {})
    caveat = type(method_obj).caveat(bundle, {**method_obj.options, **resolved})
    return BatchMaps(maps=maps, seconds=seconds, resolved=resolved, caveat=caveat)


def explain(bundle, images: torch.Tensor, targets, method: str, *, seed: int | None = None, **options) -> torch.Tensor:
    """B x H x W maps of one method with these options (`explain_batch`'s maps). `targets`: an int, B class
    indices, or a function of the logits returning B scores (methods with `score_targets`, e.g. Grad-CAM).
    `seed=None`: the global generator is left as the caller set it."""
    return explain_batch(bundle, get_method(method, **options), images, targets, seed=seed).maps


def as_map(maps) -> np.ndarray:
    """One map (the first of a batch) as a float32 H x W array."""
    if isinstance(maps, torch.Tensor):
        while maps.dim() > 2:
            maps = maps[0]
    return map_array(maps)


def _live(method: str) -> tuple:
    cls = METHODS.get(method)
    return cls.live_options() if cls is not None and cls.has_prepare() else ()


def method_state(bundle, prepared: PreparedInput, method: str, target, options: dict | None,
                 cache: ExplanationCache | None):
    """The prepared state of a method with a `prepare` hook for this image and target (the options other than
    its live ones fixed): one model pass, then cached; `state.map(**live options)` costs no model pass."""
    fixed = {k: v for k, v in (options or {}).items() if k not in _live(method)}
    key = ExplanationCache.key("state", method, bundle.name, id(bundle.network), prepared.digest, target_key(target),
                               fixed)
    state = cache.get_state(key) if cache else None
    if state is None:
        method_obj = get_method(method, **fixed)
        method_obj.check(bundle)
        check_targets(method_obj, target)
        targets = target if isinstance(target, Target) else int(target)
        with bundle.lock:
            state = method_obj.prepare(bundle, prepared.tensor, as_targets(targets, 1, prepared.tensor.device))
        if cache:
            cache.put_state(key, state)
    return state


def _live_values(method: str, options: dict) -> dict:
    return {k: options[k] for k in _live(method) if k in options}


def compute_curves(bundle, prepared: PreparedInput, maps: np.ndarray, target, *, steps: int = 20,
                   reference: str = "mean", replicas: ReplicaPool | None = None) -> Curves:
    """The curves of one map for one image's target (a class index or a `Target`: its `curve_score`)."""
    tensor = torch.as_tensor(maps, dtype=torch.float32, device=prepared.tensor.device).unsqueeze(0)
    targets = target if isinstance(target, Target) else [int(target)]
    with (replicas or ReplicaPool(1)).lease(bundle) as model:
        return deletion_insertion(model, prepared.tensor, tensor, targets, steps=steps, reference=reference)


def _target_fields(target, bundle) -> tuple:
    """(the record's target, its name): a class index as an int with its class name; another `Target` as itself
    (its curves read it again) with its description."""
    if isinstance(target, Target):
        return target, (target.describe(bundle.class_names) if bundle is not None else target.key())
    return int(target), (bundle.class_name(int(target)) if bundle is not None else str(target))


def result_record(method: str, target, options: dict, maps: np.ndarray, seconds: float,
                  curves: Curves | None, bundle=None) -> dict:
    """A plain, copyable record of one method's explanation (what the app keeps in per-session state)."""
    target, target_name = _target_fields(target, bundle)
    record = {"method": method, "label": method_label(method), "target": target, "target_name": target_name,
              "options": dict(options), "map": maps.astype(np.float32), "seconds": float(seconds),
              "fractions": None, "deletion": None, "insertion": None, "deletion_auc": None, "insertion_auc": None,
              "caveat": None}
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
    return ExplanationCache.key("map", bundle.name, id(bundle.network), prepared.digest, target_key(target), method,
                                dict(options), steps, reference)


def cached_result(cache, bundle, prepared: PreparedInput, method: str, target, options: dict, *,
                  steps: int = 20, reference: str = "mean") -> dict | None:
    """The cached record (with curves) of an earlier `run_method` call with the same arguments, or None."""
    if cache is None:
        return None
    found = cache.get(_result_key(bundle, prepared, method, target, options, steps, reference))
    return copy.deepcopy(found) if found is not None else None


def run_method(bundle, prepared: PreparedInput, method: str, target, options: dict | None = None, *,
               cache: ExplanationCache | None = None, curves: bool = True, steps: int = 20,
               reference: str = "mean", progress=None) -> dict:
    """One method's map (and curves) for one image and target (a class index or a `Target` of one row), as a
    `result_record`.

    The map and the curves are cached separately (a map shown first, its curves added later, is computed once).
    A method with a `prepare` hook and live options (GradSkip) is prepared once per (image, target) and
    recombined for any value of them; any other method runs through `explain_batch`. The app and the CLI's
    `explain` call it.
    Raises MethodNotApplicable / ValueError with user-facing messages."""
    options = dict(options or {})
    target = target if isinstance(target, Target) else int(target)
    if curves:
        found = cached_result(cache, bundle, prepared, method, target, options, steps=steps, reference=reference)
        if found is not None:
            return found
    map_key = _result_key(bundle, prepared, method, target, options, None, reference)
    result = copy.deepcopy(cache.get(map_key)) if cache and cache.get(map_key) is not None else None
    if result is None:
        if _live(method):
            started = time.perf_counter()
            state = method_state(bundle, prepared, method, target, options, cache)
            maps = as_map(state.map(**_live_values(method, options)))
            result = result_record(method, target, options, maps, time.perf_counter() - started, None, bundle)
            result["caveat"] = METHODS[method].caveat(bundle, result["options"])
        else:
            batch = explain_batch(bundle, get_method(method, **options), prepared.tensor, target, progress=progress)
            result = result_record(method, target, options, as_map(batch.maps), batch.seconds, None, bundle)
            result["options"].update(batch.resolved)  # what the method resolved (AHA's mode) travels with it
            result["caveat"] = batch.caveat
        if cache:
            cache.put(map_key, copy.deepcopy(result))
    if curves:
        result = add_curves(bundle, prepared, result, cache, steps=steps, reference=reference)
    return result


def _accepts_progress(method_obj) -> bool:
    import inspect

    return "progress" in inspect.signature(method_obj.attribute).parameters


def add_curves(bundle, prepared: PreparedInput, record: dict, cache: ExplanationCache | None = None, *,
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


def recombine(bundle, prepared: PreparedInput, record: dict, values: dict,
              cache: ExplanationCache | None) -> dict:
    """A method's map for new values of its live options, from its cached prepared state: no model pass; curves
    left empty (stale)."""
    method = record["method"]
    state = method_state(bundle, prepared, method, record["target"], record["options"], cache)
    options = {**record["options"], **{k: METHODS[method].user_options_by_name()[k].cast(v)
                                       for k, v in values.items()}}
    started = time.perf_counter()
    maps = as_map(state.map(**_live_values(method, options)))
    return result_record(method, record["target"], options, maps, time.perf_counter() - started, None, bundle)


def diagnostics(bundle, prepared: PreparedInput, record: dict, cache, values: dict | None = None) -> dict | None:
    """The prepared state's diagnostics (GradSkip: head weights) for a record's method, or None without any."""
    method = record["method"]
    if not _live(method) or not METHODS[method].details:
        return None
    state = method_state(bundle, prepared, method, record["target"], record["options"], cache)
    options = {**record["options"], **(values or {})}
    return state.diagnostics(**_live_values(method, options))


# ------------------------------------------------------------------------------------------------
# Exports
# ------------------------------------------------------------------------------------------------
def versions() -> dict:
    import timm

    result = {"python": platform.python_version(), "torch": torch.__version__, "timm": timm.__version__,
              "numpy": np.__version__}
    from importlib import metadata

    try:  # the installed version, read from package metadata: the library never imports the UI stack
        result["gradio"] = metadata.version("gradio")
    except metadata.PackageNotFoundError:
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
                writer.writerow([record["method"], options, target_key(record["target"]), record["target_name"],
                                 f"{f:.4f}", f"{d:.6f}", f"{i:.6f}"])
    return path


def report(bundle_name: str, results: list, *, image_name: str = "", prediction=None, steps: int = 20,
           reference: str = "mean", extra: dict | None = None) -> dict:
    """The JSON report: model, each method with options, target and AUCs, protocol, versions, seed."""
    return {
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": bundle_name,
        "image": image_name,
        "prediction": [{"class_index": i, "class_name": n, "probability": round(p, 6)} for i, n, p in (prediction or [])],
        "methods": [{"method": r["method"], "label": r["label"], "options": r["options"],
                     "target": target_key(r["target"]), "target_name": r["target_name"],
                     "deletion_auc": r["deletion_auc"], "insertion_auc": r["insertion_auc"], "map_seconds": r["seconds"],
                     **({"caveat": r["caveat"]} if r.get("caveat") else {})} for r in results],
        "protocol": {"steps": steps, "reference": reference, "score": "softmax probability of the target",
                     "auc": "trapezoid over p in [0, 1]", "note": CURVE_NOTE},
        "seed": SEED,
        "versions": versions(),
        **(extra or {}),
    }


ENLARGED = 1024  # the longest side of an enlarged download (for small images such as BloodMNIST's 64 px)


def download_size(original_size: tuple, size: str = "original") -> tuple:
    """(width, height) of a downloaded overlay: "original" (the uploaded image's own size), or "enlarged" (the
    longest side at least ENLARGED px, aspect kept; an image that large already keeps its size)."""
    width, height = original_size
    if size == "original":
        return int(width), int(height)
    if size != "enlarged":
        raise ValueError(f"Unknown download size {size!r}: 'original' or 'enlarged'.")
    scale = max(1.0, ENLARGED / max(width, height))
    return max(1, round(width * scale)), max(1, round(height * scale))


def overlay_at(prepared: PreparedInput, record: dict, size: tuple, *, opacity: float, colormap: str) -> Image.Image:
    """The record's map over the original image at `size` (width, height): the image resized (Lanczos) when the
    size differs, the map pasted back bilinearly; a centre crop's margin is left uncoloured (`crop_region`)."""
    size = (int(size[0]), int(size[1]))
    if size == tuple(prepared.original.size):
        base, geometry = prepared.original, prepared.geometry
    else:
        base, geometry = prepared.original.resize(size, Image.Resampling.LANCZOS), scale_geometry(prepared.geometry, size)
    full = map_to_original(record["map"], geometry)
    return overlay(base, full, opacity=float(opacity), colormap=colormap, region=crop_region(geometry))


def write_downloads(folder, bundle_name: str, prepared: PreparedInput, results: list, *, opacity: float,
                    colormap: str, prediction=None, image_name: str = "", steps: int = 20,
                    reference: str = "mean", size: str = "original", familiarity: dict | None = None) -> list:
    """Overlay PNGs (one per method, at the original image's size, or enlarged: `download_size`), curves.csv
    and report.json (with the familiarity verdict of `predict_and_check`; null: not checked); returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    pixels = download_size(prepared.original.size, size)
    for record in results:
        picture = overlay_at(prepared, record, pixels, opacity=opacity, colormap=colormap)
        suffix = "" if size == "original" else f"-{pixels[0]}x{pixels[1]}"
        path = folder / f"overlay-{record['method']}{suffix}.png"
        picture.save(path, format="PNG")
        paths.append(path)
    paths.append(curves_csv(results, folder / "curves.csv"))
    data = report(bundle_name, results, image_name=image_name, prediction=prediction, steps=steps,
                  reference=reference, extra={"familiarity": familiarity,
                                              "overlay": {"opacity": float(opacity), "colormap": colormap,
                                                          "size": list(pixels),
                                                          "original_size": list(prepared.original.size)}})
    report_path = folder / "report.json"
    report_path.write_text(json.dumps(data, indent=2))
    paths.append(report_path)
    return paths



def item_name(dataset, index: int) -> str:
    if hasattr(dataset, "items"):
        return str(dataset.items[index][0])
    return f"{index:06d}"


@torch.no_grad()
def predict_dataset(bundle, dataset, indices=None, batch_size: int = 64, progress=None,
                    verdicts: list | None = None) -> list:
    """[(item name, position, label, predicted class, confidence)] for the given indices. `verdicts`: a list that
    receives each row's familiarity verdict (`familiarity.forward_and_check`, read in the same forward pass) where
    the model has statistics."""
    from . import familiarity
    from .data import model_batches

    indices = list(range(len(dataset))) if indices is None else list(indices)
    rows = []
    for chunk, images in model_batches(dataset, bundle, indices, batch_size):
        logits, checked = familiarity.forward_and_check(bundle, images)
        if verdicts is not None:
            verdicts.extend(checked or [])
        confidence, predicted = logits.softmax(dim=1).max(dim=1)
        for i, p, c in zip(chunk, predicted.tolist(), confidence.tolist()):
            rows.append((item_name(dataset, i), i, int(dataset.labels[i]), int(p), float(c)))
        if progress is not None:
            progress(len(rows), len(indices))
    return rows


