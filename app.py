"""Saliency Lab: faithful visual explanations of image classifiers (the Gradio 6 front end).

    python app.py                  # http://127.0.0.1:7860, offline, on the bundled models

Thin on purpose: every computation is a call into `explainers` (the library the CLI uses too); this file
only wires components to those calls and turns errors into messages. Per-user state lives in gr.State /
gr.BrowserState and per-session keys; models, explanation statistics and SAM embeddings live in shared,
thread-safe caches keyed by content or by session. Heavy work shares one concurrency id, so it never
starves the sliders, which only recombine cached statistics.
"""
from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("MPLBACKEND", "Agg")  # Gradio switches matplotlib to Agg around every event: start there

try:  # ZeroGPU: `spaces` must be imported before torch; elsewhere the decorator is a no-op
    import spaces  # type: ignore
except ImportError:  # pragma: no cover - not on a Space
    spaces = None

import functools
import json
import logging
import tempfile
import threading
import time
import traceback
from pathlib import Path

import gradio as gr
import numpy as np
import torch
from PIL import Image

from explainers import ui_helpers as ui
from explainers.data import open_dataset
from explainers.images import COLORMAPS, ImageError, load_image
from explainers.methods import METHODS, MethodNotApplicable
from explainers.models import ModelUnavailableError, load_model
from explainers.review import ReviewError, ReviewStore


class _AggAlready:
    """Gradio wraps every event in `MatplotlibBackendMananger`, which calls `matplotlib.use("agg")` twice (~4-10 ms
    of CPU per event, 15% of a slider redraw on 2 vCPUs). With MPLBACKEND=Agg set before matplotlib loads, the
    switch changes nothing, so it is skipped."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if os.environ.get("MPLBACKEND", "").lower() == "agg":
    import gradio.utils as _gradio_utils

    _gradio_utils.MatplotlibBackendMananger = _AggAlready

ROOT = Path(__file__).resolve().parent
ASSETS = ROOT / "assets"
SHARED_BLOODMNIST = (ROOT / ".." / "shared" / "data" / "bloodmnist" / "64" / "test").resolve()
STATE_DIR = Path(os.environ.get("SALIENCY_LAB_STATE_DIR", ROOT / "runs" / "app"))
log = logging.getLogger("saliency_lab")

# Errors whose message is written for the user: shown as is.
USER_ERRORS = (ImageError, ModelUnavailableError, MethodNotApplicable, ReviewError, FileNotFoundError, ValueError,
               KeyError)


def gpu(duration: int = 60):
    """@spaces.GPU(duration=...) where the `spaces` package is installed (a no-op outside ZeroGPU), else nothing."""
    if spaces is not None:
        return spaces.GPU(duration=duration)
    return lambda fn: fn


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # ZeroGPU: CUDA is available (lazily attached)


def configure_torch(parallel: int) -> None:
    """On a CPU, `parallel` explanations run side by side, each single-threaded: on a shared 2-vCPU box two
    threads per op are many times slower than one (measured), and requests, not ops, are what is parallel here.
    SALIENCY_LAB_TORCH_THREADS overrides."""
    threads = os.environ.get("SALIENCY_LAB_TORCH_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    elif DEVICE == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, parallel)))


def default_loader(name):
    """The model zoo's cached, thread-safe factory, on the GPU when there is one."""
    return load_model(name, device=DEVICE)


def default_data_dir() -> str:
    """BloodMNIST's test split in ../shared when it exists, else the 24 cells shipped in assets/."""
    if (SHARED_BLOODMNIST / "labels.csv").exists():
        return str(SHARED_BLOODMNIST)
    return str(ASSETS / "bloodmnist")


def user_message(error: BaseException) -> str:
    text = str(error).strip().strip("'\"") or type(error).__name__
    return text[:1].upper() + text[1:]


def friendly(fn):
    """Turn every exception into a gr.Error with a clear message (never a stack trace in the UI)."""

    def convert(error):
        if isinstance(error, gr.Error):
            return error
        if isinstance(error, USER_ERRORS) or type(error).__name__ in ("MaskError", "SamUnavailableError",
                                                                     "ExplainerUnavailable", "JobError"):
            return gr.Error(user_message(error))
        if isinstance(error, torch.cuda.OutOfMemoryError if hasattr(torch.cuda, "OutOfMemoryError") else MemoryError):
            return gr.Error("Out of memory: try a smaller image, fewer methods or a smaller model.")
        log.error("unexpected error in %s:\n%s", fn.__name__, traceback.format_exc())
        return gr.Error(f"Something went wrong ({type(error).__name__}: {str(error)[:200]}). "
                        "The details are in the server log.")

    if _is_generator(fn):
        @functools.wraps(fn)
        def generator_wrapper(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except Exception as error:  # noqa: BLE001 - every error becomes a message
                raise convert(error) from error
        return generator_wrapper

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - every error becomes a message
            raise convert(error) from error
    return wrapper


def _is_generator(fn) -> bool:
    import inspect

    return inspect.isgeneratorfunction(fn)


def checked_image(**kwargs) -> gr.Image:
    """A gr.Image that refuses unreadable, too large or too small uploads with a clear message, before any
    handler runs (explainers.images.load_image's checks: header-first size limits, allowed decoders).
    (Wrapped per instance: a gr.Image subclass would make Gradio write a .pyi stub next to this file.)"""
    component = gr.Image(**kwargs)
    original = component.preprocess

    def preprocess(payload):
        if payload is not None and getattr(payload, "path", None):
            try:
                load_image(payload.path)
            except ImageError as error:
                raise gr.Error(user_message(error)) from error
        return original(payload)

    component.preprocess = preprocess
    return component


def examples_list() -> tuple:
    """(blood cell examples, photo examples) shipped in assets/."""
    cells = []
    labels = ASSETS / "bloodmnist" / "labels.csv"
    if labels.exists():
        import csv

        seen = set()
        with labels.open(newline="") as handle:
            for row in csv.DictReader(handle):
                if row["class_index"] not in seen:  # one per class
                    seen.add(row["class_index"])
                    cells.append(str(ASSETS / "bloodmnist" / row["file"]))
    photos = sorted(str(p) for p in (ASSETS / "photos").glob("*.jpg"))
    return cells, photos


THEME = gr.themes.Soft(
    primary_hue="teal", secondary_hue="blue", neutral_hue="slate",
    font=["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "Helvetica Neue", "Arial", "sans-serif"],
    font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"],
).set(block_title_text_weight="600", button_large_radius="10px")

CSS = """
#app-title h1 { margin-bottom: 0; }
#app-title p { margin-top: 4px; color: var(--body-text-color-subdued); }
.help { color: var(--body-text-color-subdued); font-size: 0.92em; }
.note { background: var(--background-fill-secondary); border-left: 4px solid var(--color-accent);
        padding: 6px 12px; border-radius: 6px; }
.verdict-row button { min-width: 120px; }
footer { display: none !important; }
#input-image img, #sam-view img { width: 100%; height: 100%; object-fit: contain; }
#input-image img { image-rendering: auto; }
"""

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

INTRO = """# Saliency Lab
Which pixels made the classifier decide, and can we trust that answer? Pick an image and a model, compare
explanation methods side by side, and check them with deletion/insertion curves.
"""


class Services:
    """What the whole app shares (thread-safe): model loader, explanation cache, review store, jobs, SAM."""

    def __init__(self, loader, model_names, state_dir, jobs_root=None, sam_variant="auto", hf_token=None,
                 weights_dir=None, parallel=1):
        from explainers.models import WEIGHTS_DIR

        self.loader = loader
        self.weights_dir = Path(weights_dir or WEIGHTS_DIR)
        self.model_names = model_names
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.cache = ui.ExplanationCache(parallel=parallel)
        self.store = ReviewStore(self.state_dir / "review.sqlite")
        self.downloads = Path(tempfile.mkdtemp(prefix="saliency-lab-"))
        self.jobs_root = Path(jobs_root or self.state_dir / "jobs")
        self.sam_variant = sam_variant
        self.hf_token = hf_token if hf_token is not None else os.environ.get("HF_TOKEN")
        self._runner = None
        self._segmenter_cache = None
        self._lock = threading.Lock()

    def pictures(self, items, fmt: str = "jpeg") -> list:
        """[(PIL, caption)] -> [(file path, caption)], named by content, so Gradio only copies files instead of
        encoding every overlay as a default-level PNG on each slider move (the largest CPU cost of a redraw on
        2 vCPUs). JPEG quality 92 without chroma subsampling for overlays; downloads are PNG."""
        import hashlib
        import io

        folder = self.downloads / "pictures"
        folder.mkdir(exist_ok=True)
        out = []
        for picture, text in items:
            buffer = io.BytesIO()
            if fmt == "png":
                picture.save(buffer, format="PNG", compress_level=1)
            else:
                picture.convert("RGB").save(buffer, format="JPEG", quality=92, subsampling=0)
            data = buffer.getvalue()
            path = folder / f"{hashlib.sha1(data).hexdigest()[:24]}.{'png' if fmt == 'png' else 'jpg'}"
            if not path.exists():
                path.write_bytes(data)
            out.append((str(path), text))
        self._written = getattr(self, "_written", 0) + len(items)
        if self._written > 500:  # keep the folder bounded: drop pictures older than an hour
            self._written = 0
            cutoff = time.time() - 3600
            for old in folder.iterdir():
                try:
                    if old.stat().st_mtime < cutoff:
                        old.unlink()
                except OSError:
                    pass
        return out

    def cached(self, key, build):
        """A shared object built once (e.g. a model loaded from a card outside the zoo)."""
        with self._lock:
            if not hasattr(self, "_objects"):
                self._objects = {}
            if key not in self._objects:
                self._objects[key] = build()
            return self._objects[key]

    def names(self) -> list:
        return list(self.model_names()) if callable(self.model_names) else list(self.model_names)

    @gpu(120)
    def bundle(self, name):
        if not name:
            raise ModelUnavailableError("Pick a model first.")
        return self.loader(name)

    def runner(self):
        with self._lock:
            if self._runner is None:
                from explainers.jobs import JobRunner

                try:
                    import explainers.camal  # noqa: F401  (registers the 'camal' job kind)
                except ImportError:
                    pass
                self._runner = JobRunner(self.jobs_root, hf_token=self.hf_token)
            return self._runner

    def segmenters(self):
        with self._lock:
            if self._segmenter_cache is None:
                from explainers.masks import SegmenterCache, get_segmenter

                self._segmenter_cache = SegmenterCache(get_segmenter(self.sam_variant), max_sessions=8)
            return self._segmenter_cache

    def forget_session(self, session: str):
        if self._segmenter_cache is not None:
            self._segmenter_cache.discard(session)


# ================================================================================================
# Explain
# ================================================================================================
def _prepared(services, model_name, image_path):
    if not image_path:
        raise gr.Error("Upload an image, pick an example or choose one from the BloodMNIST browser first.")
    bundle = services.bundle(model_name)
    image = load_image(image_path)
    return bundle, ui.prepare_input(image, bundle)


def _target_choices(prediction) -> list:
    return [("Predicted class (top-1)", "auto")] + [(f"{name} · {p:.1%}", str(i)) for i, name, p in prediction]


def _label_value(prediction) -> dict:
    out = {}
    for i, name, p in prediction:
        out[name if name not in out else f"{name} ({i})"] = float(p)
    return out


def _status(state) -> str:
    if not state:
        return ""
    skipped = ("\n\n**Skipped:** " + "; ".join(state["skipped"])) if state.get("skipped") else ""
    if not state.get("results"):
        return skipped.strip()
    parts = [f"**{r['label']}** {1000 * r['seconds']:.0f} ms" for r in state["results"]]
    return (f"Model **{state['model']}**, target **{state['target_name']}** (class {state['target']}). "
            f"Map times: {', '.join(parts)}.") + skipped


def _outputs_from_state(services, state, opacity, colormap, prepared=None, figure=True):
    """(overlays, figure, table) from a session's state."""
    if prepared is None:
        bundle, prepared = _prepared(services, state["model"], state["image"])
    overlays = services.pictures(ui.render_overlays(prepared, state["results"], opacity, colormap))
    fig = ui.curves_figure(state["results"]) if figure else gr.skip()
    return overlays, fig, ui.auc_table(state["results"])


def explain_maps_handler(services):
    @friendly
    def explain_maps(image_path, model_name, methods, target_choice, alpha, refine_steps, opacity, colormap):
        """Step 1 of an explanation: the top-5 prediction and each chosen method's map (fast; the curves follow
        in `explain_curves`, a separate event, so that under load everyone's maps come first)."""
        methods = list(methods or [])
        if not methods:
            raise gr.Error("Pick at least one explanation method.")
        bundle, prepared = _prepared(services, model_name, image_path)
        prediction = ui.predict_top(bundle, prepared, 5)
        top_indices = [i for i, _, _ in prediction]
        target_choice = "auto" if target_choice in (None, "", "auto") else str(target_choice)
        if target_choice != "auto" and int(target_choice) not in top_indices:
            target_choice = "auto"
        target = top_indices[0] if target_choice == "auto" else int(target_choice)
        state = {"model": model_name, "image": image_path, "image_name": Path(str(image_path)).name,
                 "target": target, "target_name": bundle.class_name(target), "prediction": prediction,
                 "alpha": float(alpha), "refine_steps": int(refine_steps), "results": [], "skipped": []}
        for method in ui.method_order(methods):
            options = ui.method_options(method, alpha, refine_steps, bundle)
            try:
                record = gpu_run_method(bundle, prepared, method, target, options, services.cache, curves=False)
            except (MethodNotApplicable, ValueError, RuntimeError) as error:
                if not _user_facing(error):
                    raise
                state["skipped"].append(f"{ui.method_label(method)}: {user_message(error)}")
                gr.Warning(f"{ui.method_label(method)} skipped: {user_message(error)}")
                continue
            state["results"].append(record)
        target_update = gr.update(choices=_target_choices(prediction), value=target_choice)
        message = ("Computing the deletion and insertion curves…" if state["results"]
                   else "No method could explain this model: see the warnings.")
        return (_label_value(prediction), target_update, _overlays(services, state, opacity, colormap, prepared),
                ui.empty_figure(message), ui.auc_table(state["results"]), _status(state), state)

    return explain_maps


def explain_curves_handler(services):
    @friendly
    def explain_curves(state, alpha, opacity, colormap):
        """Step 2: deletion and insertion curves of every map (2 x 21 model passes each), on one set of axes."""
        if not state or not state.get("results"):
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        bundle, prepared = _prepared(services, state["model"], state["image"])
        state = {**state, "results": [gpu_add_curves(bundle, prepared, record, services.cache)
                                      for record in state["results"]]}
        heads = gr.skip()
        if any(r["method"] == "gradskip" for r in state["results"]):
            heads = ui.head_weights_figure(ui.gradskip_diagnostics(bundle, prepared, state["target"], alpha,
                                                                   services.cache))
        return (_overlays(services, state, opacity, colormap, prepared),  # the captions now carry the AUCs
                ui.curves_figure(state["results"]), ui.auc_table(state["results"]), _status(state), state, heads)

    return explain_curves


def explain_handler(services):
    maps_fn, curves_fn = explain_maps_handler(services), explain_curves_handler(services)

    @friendly
    def explain(image_path, model_name, methods, target_choice, alpha, refine_steps, opacity, colormap):
        """Both steps in one call (the API form): maps first, then curves."""
        label, target_update, overlays, figure, table, status, state = maps_fn(
            image_path, model_name, methods, target_choice, alpha, refine_steps, opacity, colormap)
        yield label, target_update, overlays, figure, table, status, state, gr.skip()
        if state["results"]:
            overlays, figure, table, status, state, heads = curves_fn(state, alpha, opacity, colormap)
            yield label, gr.skip(), overlays, figure, table, status, state, heads

    return explain


def _user_facing(error) -> bool:
    return isinstance(error, (MethodNotApplicable, ValueError)) or type(error).__name__ in (
        "ExplainerUnavailable", "ModelUnavailableError")


@gpu(60)
def gpu_run_method(bundle, prepared, method, target, options, cache, curves=True):
    return ui.run_method(bundle, prepared, method, target, options, cache=cache, curves=curves)


@gpu(60)
def gpu_add_curves(bundle, prepared, record, cache):
    return ui.add_curves(bundle, prepared, record, cache)


def _overlays(services, state, opacity, colormap, prepared):
    return services.pictures(ui.render_overlays(prepared, state["results"], opacity, colormap))


def alpha_change_handler(services):
    @friendly
    def on_alpha(alpha, state, opacity, colormap):
        """Alpha moved: recombine GradSkip's cached statistics (no model pass) and redraw the overlays."""
        if not state or not any(r["method"] == "gradskip" for r in state.get("results", [])):
            return gr.skip(), gr.skip(), gr.skip()
        bundle, prepared = _prepared(services, state["model"], state["image"])
        results = []
        for record in state["results"]:
            if record["method"] == "gradskip":
                cached = ui.cached_result(services.cache, bundle, prepared, "gradskip", record["target"],
                                          {"alpha": float(alpha)})
                record = cached or ui.gradskip_recombine(bundle, prepared, record, alpha, services.cache)
            results.append(record)
        state = {**state, "results": results, "alpha": float(alpha)}
        overlays = services.pictures(ui.render_overlays(prepared, results, opacity, colormap))
        heads = ui.head_weights_figure(ui.gradskip_diagnostics(bundle, prepared, state["target"], alpha, services.cache))
        return overlays, heads, state

    return on_alpha


def alpha_release_handler(services):
    @friendly
    def on_alpha_release(alpha, state, opacity, colormap):
        """Alpha released: GradSkip's curves for this alpha (the statistics are cached; only curves run)."""
        if not state or not any(r["method"] == "gradskip" for r in state.get("results", [])):
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        bundle, prepared = _prepared(services, state["model"], state["image"])
        results = [gpu_run_method(bundle, prepared, "gradskip", r["target"], {"alpha": float(alpha)}, services.cache)
                   if r["method"] == "gradskip" else r for r in state["results"]]
        state = {**state, "results": results, "alpha": float(alpha)}
        overlays, fig, table = _outputs_from_state(services, state, opacity, colormap, prepared)
        return overlays, fig, table, _status(state), state

    return on_alpha_release


def refine_handler(services):
    @friendly
    def on_refine(refine_steps, state, opacity, colormap):
        """T changed: re-run AHA with T refinement steps (the other methods are kept)."""
        if not state or not any(r["method"] == "aha" for r in state.get("results", [])):
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        bundle, prepared = _prepared(services, state["model"], state["image"])
        results = [gpu_run_method(bundle, prepared, "aha", r["target"], {"refine_steps": int(refine_steps)},
                                  services.cache) if r["method"] == "aha" else r for r in state["results"]]
        state = {**state, "results": results, "refine_steps": int(refine_steps)}
        overlays, fig, table = _outputs_from_state(services, state, opacity, colormap, prepared)
        return overlays, fig, table, _status(state), state

    return on_refine


def redraw_handler(services):
    @friendly
    def redraw(opacity, colormap, state):
        """Opacity or colour map changed: re-blend the cached maps (no model)."""
        if not state or not state.get("results"):
            return gr.skip()
        _, prepared = _prepared(services, state["model"], state["image"])
        return services.pictures(ui.render_overlays(prepared, state["results"], opacity, colormap))

    return redraw


def downloads_handler(services):
    @friendly
    def downloads(state, opacity, colormap):
        """Overlay PNGs (original size), curves.csv and report.json for the current explanation."""
        if not state or not state.get("results"):
            raise gr.Error("Explain an image first: there is nothing to download yet.")
        _, prepared = _prepared(services, state["model"], state["image"])
        folder = Path(tempfile.mkdtemp(prefix="explain-", dir=services.downloads))
        paths = ui.write_downloads(folder, state["model"], prepared, state["results"], opacity=opacity,
                                   colormap=colormap, prediction=state["prediction"], image_name=state["image_name"])
        return gr.update(value=[str(p) for p in paths], visible=True)

    return downloads


def model_change_handler(services):
    @friendly
    def on_model(model_name, methods, progress=gr.Progress()):
        """Load the model (hub models download once), then offer the methods that can explain it."""
        if not model_name:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        progress(0.1, desc=f"Loading {model_name} (hub models download on first use)…")
        bundle = services.bundle(model_name)
        choices = ui.method_choices(bundle)
        names = [value for _, value in choices]
        kept = [m for m in (methods or []) if m in names] or ui.default_methods(bundle)
        info = (f"**{bundle.name}**: {bundle.family}, {bundle.num_classes} classes, input "
                f"{bundle.input_size[0]}×{bundle.input_size[1]} px ({ui.model_kind(model_name)}).")
        return (gr.update(choices=choices, value=kept), gr.update(visible="gradskip" in kept),
                gr.update(visible="aha" in kept), info)

    return on_model


def methods_change(methods):
    methods = methods or []
    return gr.update(visible="gradskip" in methods), gr.update(visible="aha" in methods), \
        gr.update(visible="gradskip" in methods)


# ---------------------------------------------------------------- data-set browsing (Explain + Review)
def data_roots() -> list:
    """Folders whose data sets the app may open (a public Space must not browse the whole disk):
    SALIENCY_LAB_DATA_ROOTS (os.pathsep-separated), else assets/, data/ and ../shared/data."""
    configured = [Path(p) for p in os.environ.get("SALIENCY_LAB_DATA_ROOTS", "").split(os.pathsep) if p]
    roots = configured or [ASSETS, ROOT / "data", ROOT / ".." / "shared" / "data"]
    roots += [Path(p) for p in os.environ.get("SALIENCY_LAB_DECOY_DIR", "").split(os.pathsep) if p]
    return [root.expanduser().resolve() for root in roots]


def _open_folder(folder):
    path = _resolve_folder(folder)
    try:
        return open_dataset(path)
    except (FileNotFoundError, KeyError, ValueError) as error:
        raise gr.Error(user_message(error)) from error


def _inside(path: Path, roots) -> bool:
    path = path.expanduser().resolve()
    return any(path == Path(r).resolve() or Path(r).resolve() in path.parents for r in roots)


def _resolve_folder(folder) -> Path:
    """The data folder (or .npz) as an absolute path inside the allowed data roots, or a gr.Error."""
    folder = (folder or "").strip()
    if not folder:
        raise gr.Error("Type the path of a labelled folder (with labels.csv) or a MedMNIST .npz file.")
    path = Path(folder).expanduser()
    if not path.is_absolute():
        path = ROOT / path
    path = path.resolve()
    roots = data_roots()
    if not _inside(path, roots):
        raise gr.Error(f"{folder} is outside the data folders this app may open: "
                       f"{', '.join(str(r) for r in roots)} (set SALIENCY_LAB_DATA_ROOTS to allow others).")
    if not path.exists():
        raise gr.Error(f"{folder} does not exist on the server.")
    return path


def _class_names(folder, dataset) -> list:
    names = ui.class_names_for(folder) if Path(folder).is_dir() else None
    count = max(dataset.labels) + 1 if len(dataset) else 0
    return names if names and len(names) >= count else [str(i) for i in range(count)]


def _class_filter_choices(names) -> list:
    return [("All classes", "all")] + [(f"{i}: {n}", str(i)) for i, n in enumerate(names)]


PAGE = 48


@friendly
def browse(folder, class_filter, page):
    """Thumbnails of one page of a labelled folder, filtered by class; returns (gallery, indices, info)."""
    dataset = _open_folder(folder)
    names = _class_names(_resolve_folder(folder), dataset)
    indices = [i for i, label in enumerate(dataset.labels)
               if class_filter in (None, "", "all") or int(label) == int(class_filter)]
    pages = max(1, (len(indices) + PAGE - 1) // PAGE)
    page = min(max(1, int(page or 1)), pages)
    shown = indices[(page - 1) * PAGE: page * PAGE]
    items = [(dataset.image(i), f"{names[int(dataset.labels[i])]}") for i in shown]
    info = f"{len(indices)} images{'' if class_filter in (None, '', 'all') else ' in this class'}; page {page} of {pages}."
    return items, shown, info, gr.update(choices=_class_filter_choices(names)), gr.update(maximum=pages, value=page)


@friendly
def browse_pick(folder, index):
    """The image at data-set position `index` (explicit coordinates: the API form of a gallery click)."""
    dataset = _open_folder(folder)
    index = int(index)
    if not 0 <= index < len(dataset):
        raise gr.Error(f"No image {index} in this folder (it has {len(dataset)}).")
    return dataset.image(index)


# ================================================================================================
# Masks and fine-tune
# ================================================================================================
def segment_prompts(services, image, points, labels, box, session="api"):
    """SAM (or the labelled GrabCut fallback) mask for explicit prompts: the logic behind every click."""
    from explainers.masks import MaskError

    if image is None:
        raise gr.Error("Load an image into the mask editor first.")
    rgb = ui.as_rgb(image)
    try:
        cache = services.segmenters()
        prepared = cache.get(rgb, session)
        result = prepared.segment(points or None, labels or None, box)
    except MaskError as error:
        raise gr.Error(user_message(error)) from error
    return result


# ================================================================================================
# The app
# ================================================================================================
def build_app(model_names=None, loader=None, *, default_model=None, data_dir=None, state_dir=None,
              jobs_root=None, weights_dir=None, heavy_concurrency=None, sam_variant="auto") -> gr.Blocks:
    """Build the Blocks app. Everything is injectable so tests can use a tiny in-memory model:
    `model_names` (list or callable; default: explainers.models.list_models), `loader` (name -> ModelBundle;
    default: load_model, cached and thread-safe), `data_dir` (a labelled folder for the browser and the review),
    `state_dir` (SQLite files), `jobs_root` (fine-tune jobs)."""
    from explainers.models import list_models

    if heavy_concurrency is None:  # one explanation per core (each torch op single-threaded, see configure_torch)
        heavy_concurrency = 2 if DEVICE == "cuda" else max(1, min(4, os.cpu_count() or 1))
    services = Services(loader or default_loader, model_names if model_names is not None else list_models,
                        state_dir or STATE_DIR, jobs_root, sam_variant, weights_dir=weights_dir,
                        parallel=heavy_concurrency)
    configure_torch(heavy_concurrency)
    names = services.names()
    first_model = default_model or ui.default_model(names)
    data_dir = data_dir or default_data_dir()
    heavy = dict(concurrency_id="heavy", concurrency_limit=heavy_concurrency)
    light = dict(concurrency_id="light", concurrency_limit=16, show_progress="hidden")
    cell_examples, photo_examples = examples_list()
    all_methods = [(ui.method_label(n), n) for n in ui.method_order(list(METHODS)) if n != "random"]
    first_methods = ["aha", "gradcam"]
    try:  # the first model's defaults (its load is shared with every session: load_model caches); the menu
        # itself narrows to the model's methods on page load, while the API accepts any registered method
        first_bundle = services.bundle(first_model)
        first_methods = ui.default_methods(first_bundle)
    except Exception as error:  # noqa: BLE001 - the UI says so when the user picks it
        log.warning("could not load %s at start-up: %s", first_model, error)

    with gr.Blocks(title="Saliency Lab", analytics_enabled=False) as demo:
        demo.services = services
        gr.Markdown(INTRO, elem_id="app-title")
        explain_state = gr.State(None)

        with gr.Tabs() as tabs:
            # ---------------------------------------------------------------------------- Explain
            with gr.Tab("Explain", id="explain") as explain_tab:
                with gr.Row(equal_height=False):
                    with gr.Column(scale=4, min_width=320):
                        image = checked_image(type="filepath", label="Image", sources=["upload", "clipboard"],
                                         height=300, elem_id="input-image", buttons=["fullscreen"])
                        with gr.Accordion("Examples", open=True):
                            gr.Examples(cell_examples, inputs=image, label="Blood cells (BloodMNIST test split)",
                                        examples_per_page=8, cache_examples=False, elem_id="cell-examples")
                            gr.Examples(photo_examples, inputs=image,
                                        label="Photos (for the ImageNet model efficientnet-lite0)",
                                        examples_per_page=4, cache_examples=False, elem_id="photo-examples")
                        with gr.Accordion("BloodMNIST browser", open=False):
                            browse_folder = gr.Textbox(data_dir, label="Labelled folder (labels.csv) or .npz",
                                                       elem_id="browse-folder")
                            with gr.Row():
                                browse_class = gr.Dropdown([("All classes", "all")], value="all", label="Class",
                                                           scale=2)
                                browse_page = gr.Number(1, minimum=1, precision=0, label="Page", scale=1)
                                browse_button = gr.Button("Show", scale=1)
                            browse_info = gr.Markdown(elem_classes="help")
                            browse_gallery = gr.Gallery(label="Click an image to explain it", columns=8, height=260,
                                                        allow_preview=False, format="png", elem_id="browse-gallery")
                            browse_indices = gr.State([])
                            browse_index = gr.Number(visible=False, precision=0)
                            browse_open = gr.Button(visible=False)
                    with gr.Column(scale=5, min_width=360):
                        model = gr.Dropdown(ui.model_choices(names), value=first_model, allow_custom_value=True, label="Model",
                                            info="Bundled models first; hub models download once, on first use; "
                                                 "fine-tuned models appear here when a fine-tune finishes.",
                                            elem_id="model")
                        model_info = gr.Markdown(elem_classes="help")
                        methods = gr.CheckboxGroup(all_methods, value=first_methods,
                                                   label="Methods (pick several to compare them side by side)",
                                                   elem_id="methods")
                        with gr.Row():
                            alpha = gr.Slider(0, 1, value=0.5, step=0.05, label="GradSkip alpha",
                                              info="Head weights: alpha × gradient flow + (1 − alpha) × sparsity. "
                                                   "Instant: no model pass.", elem_id="alpha",
                                              visible="gradskip" in first_methods)
                            refine_steps = gr.Slider(0, 10, value=0, step=1, label="AHA refinement steps T",
                                                     info="0 = one pass (fastest); each step optimises the map "
                                                          "for this image.", elem_id="refine",
                                                     visible="aha" in first_methods)
                        explain_button = gr.Button("Explain", variant="primary", size="lg", elem_id="explain-button")
                        top5 = gr.Label(num_top_classes=5, label="Prediction (top 5)", elem_id="top5")
                        target = gr.Radio([("Predicted class (top-1)", "auto")], value="auto",
                                          label="Explain which class? (why this class and not that one)",
                                          elem_id="target")
                with gr.Row(equal_height=False):
                    with gr.Column(scale=5, min_width=340):
                        overlays = gr.Gallery(label="Heatmaps (bright = important)", columns=2, height="auto",
                                              format="png", object_fit="contain", elem_id="overlays",
                                              buttons=["download", "fullscreen"])
                        with gr.Row():
                            opacity = gr.Slider(0, 1, value=0.55, step=0.05, label="Overlay opacity", scale=3,
                                                elem_id="opacity")
                            colormap = gr.Radio(list(COLORMAPS), value="cividis",
                                                label="Colour map (colour-blind safe)", scale=2)
                        status = gr.Markdown(elem_classes="help", elem_id="explain-status")
                    with gr.Column(scale=6, min_width=360):
                        gr.Markdown("**How to read the curves:** " + ui.CURVE_NOTE, elem_classes="note")
                        curves = gr.Plot(label="Deletion and insertion curves", elem_id="curves")
                        aucs = gr.Dataframe(headers=ui.AUC_HEADERS, label="Scores", interactive=False,
                                            elem_id="aucs")
                with gr.Accordion("GradSkip details: head weights", open=False, visible=False) as heads_box:
                    heads = gr.Plot(label="Head weights")
                with gr.Row():
                    download_button = gr.Button("Prepare downloads (PNG overlays, curves CSV, JSON report)",
                                                elem_id="download-button")
                    files = gr.File(label="Downloads", file_count="multiple", elem_id="downloads", visible=False)

            # ---------------------------------------------------------------------------- Masks & fine-tune
            with gr.Tab("Masks & fine-tune", id="masks") as masks_tab:
                masks_parts = build_masks_tab(services, names, first_model, image, heavy, light)

            # ---------------------------------------------------------------------------- Review
            with gr.Tab("Review", id="review") as review_tab:
                reviewer_saved, reviewer, review_model = build_review_tab(services, names, first_model, data_dir, heavy, light)

            # ---------------------------------------------------------------------------- Learn
            with gr.Tab("Learn", id="learn") as learn_tab:
                sanity_model = build_learn_tab(services, names, first_model, image, heavy)

        # ------------------------------------------------------------------ Explain wiring
        explain_inputs = [image, model, methods, target, alpha, refine_steps, opacity, colormap]
        maps_outputs = [top5, target, overlays, curves, aucs, status, explain_state]
        curves_inputs = [explain_state, alpha, opacity, colormap]
        curves_outputs = [overlays, curves, aucs, status, explain_state, heads]
        maps_fn, curves_fn = explain_maps_handler(services), explain_curves_handler(services)
        curves_group = dict(concurrency_id="curves", concurrency_limit=heavy_concurrency)
        # the API form: both steps in one call (a hidden trigger, same inputs as the Explain button)
        explain_all = gr.Button(visible=False)
        explain_all.click(explain_handler(services), explain_inputs, maps_outputs + [heads], api_name="explain",
                          **heavy)
        explain_button.click(maps_fn, explain_inputs, maps_outputs, api_name="explain_maps", **heavy).success(
            curves_fn, curves_inputs, curves_outputs, api_name="explain_curves", **curves_group)
        target.input(maps_fn, explain_inputs, maps_outputs, api_name="explain_target", **heavy).success(
            curves_fn, curves_inputs, curves_outputs, api_visibility="private", **curves_group)

        def new_image(image_path, model_name, chosen, _target, *rest):
            """A new image: reset the target to the top-1 class and explain at once."""
            if not image_path:
                return None, gr.update(choices=[("Predicted class (top-1)", "auto")], value="auto"), [], \
                    ui.empty_figure("Pick an image to see its curves."), [], "", None
            return maps_fn(image_path, model_name, chosen, "auto", *rest)

        image.change(new_image, explain_inputs, maps_outputs, api_name="explain_new_image", **heavy).success(
            curves_fn, curves_inputs, curves_outputs, api_visibility="private", **curves_group)

        model.change(model_change_handler(services), [model, methods], [methods, alpha, refine_steps, model_info],
                     api_name="select_model", **heavy)
        methods.change(methods_change, methods, [alpha, refine_steps, heads_box], api_visibility="private",
                       show_progress="hidden", queue=False)
        alpha.change(alpha_change_handler(services), [alpha, explain_state, opacity, colormap],
                     [overlays, heads, explain_state], api_name="alpha_preview", **light)
        alpha.release(alpha_release_handler(services), [alpha, explain_state, opacity, colormap],
                      [overlays, curves, aucs, status, explain_state], api_name="alpha_curves",
                      trigger_mode="always_last", **heavy)
        refine_steps.release(refine_handler(services), [refine_steps, explain_state, opacity, colormap],
                             [overlays, curves, aucs, status, explain_state], api_name="refine",
                             trigger_mode="always_last", **heavy)
        gr.on([opacity.change, colormap.change], redraw_handler(services), [opacity, colormap, explain_state],
              overlays, api_name="redraw", **light)
        download_button.click(downloads_handler(services), [explain_state, opacity, colormap], files,
                              api_name="downloads", **light)

        # browser
        browse_outputs = [browse_gallery, browse_indices, browse_info, browse_class, browse_page]
        browse_button.click(browse, [browse_folder, browse_class, browse_page], browse_outputs, api_name="browse",
                            **light)
        browse_class.input(lambda f, c: browse(f, c, 1), [browse_folder, browse_class], browse_outputs,
                           api_visibility="private", **light)
        browse_page.submit(browse, [browse_folder, browse_class, browse_page], browse_outputs, api_visibility="private",
                            **light)

        def on_browse_select(indices, evt: gr.SelectData):
            return int(indices[evt.index])

        browse_gallery.select(on_browse_select, browse_indices, browse_index, api_visibility="private", queue=False).then(
            browse_pick, [browse_folder, browse_index], image, api_name="browse_select", api_visibility="private")
        browse_open.click(browse_pick, [browse_folder, browse_index], image, api_name="browse_pick")

        demo.load(model_change_handler(services), [model, methods], [methods, alpha, refine_steps, model_info],
                  api_visibility="private")
        demo.load(lambda saved: saved or "", reviewer_saved, reviewer, api_visibility="private", queue=False)
        demo.load(masks_parts["labels_for"], masks_parts["base_model"], masks_parts["mask_label"],
                  api_visibility="private", **light)
        demo.load(masks_parts["data_choices"], None, masks_parts["train_data"], api_visibility="private", queue=False)

        model_dropdowns = [model, masks_parts["base_model"], review_model, sanity_model]

        def refresh_models():
            """Fine-tuned models appear in every model picker (the current choices are kept)."""
            choices = ui.model_choices(services.names())
            return [gr.update(choices=choices) for _ in model_dropdowns] + [masks_parts["data_choices"]()]

        for tab in (explain_tab, masks_tab, review_tab, learn_tab):
            tab.select(refresh_models, None, [*model_dropdowns, masks_parts["train_data"]], api_visibility="private",
                       queue=False)
        demo.refresh_models = refresh_models

        def on_unload(request: gr.Request):
            services.forget_session(request.session_hash)

        demo.unload(on_unload)
    return demo


# ------------------------------------------------------------------------------------------------ Masks tab
def build_masks_tab(services, names, first_model, explain_image, heavy, light):
    gr.Markdown("### 1 · Mark where the model *should* look\n"
                "Paint over the relevant region, **or** click points for SAM (object / background) or two "
                "corners of a box. Then add the image, its mask and its class to a mask set.",
                elem_classes="help")
    sam_points = gr.State({"points": [], "labels": [], "box_corner": None, "box": None})
    current_mask = gr.State(None)
    with gr.Row(equal_height=False):
        with gr.Column(scale=1):
            editor = gr.ImageMask(label="Draw the mask (brush)", type="numpy", sources=["upload", "clipboard"],
                                  format="png", height=340, elem_id="mask-editor", layers=False,
                                  brush=gr.Brush(colors=["#0072B2"], color_mode="fixed", default_size=12))
            with gr.Row():
                use_explain = gr.Button("Use the image from the Explain tab", size="sm")
                draw_preview = gr.Button("Use my drawing", variant="secondary", size="sm", elem_id="use-drawing")
        with gr.Column(scale=1):
            sam_view = gr.Image(label="Click for SAM: points or box corners", type="numpy", interactive=False,
                                format="png", height=340, elem_id="sam-view")
            with gr.Row():
                click_mode = gr.Radio([("Object point", "object"), ("Background point", "background"),
                                       ("Box corner", "box")], value="object", label="A click adds", scale=3)
                clear_points = gr.Button("Clear clicks", size="sm", scale=1)
            segmenter_info = gr.Markdown(elem_classes="help", elem_id="segmenter-info")
    mask_preview = gr.Image(label="Mask preview", type="pil", interactive=False, format="png", height=260,
                            elem_id="mask-preview")
    with gr.Row():
        set_name = gr.Textbox("my-masks", label="Mask set name", scale=2, elem_id="set-name")
        mask_label = gr.Dropdown(_label_choices(services, first_model), label="Class label of this image", scale=2,
                                 elem_id="mask-label", allow_custom_value=True)
        add_button = gr.Button("Add to mask set", variant="primary", scale=1, elem_id="add-mask")
    set_info = gr.Markdown(elem_classes="help", elem_id="set-info")
    set_gallery = gr.Gallery(label="Mask set (image with mask)", columns=10, height=170, format="png",
                             allow_preview=False, object_fit="contain", fit_columns=False)

    gr.Markdown("### 2 · Fine-tune with CAMAL\nCAMAL fine-tunes the classifier so its class activation map stays "
                "inside the masks (loss = cross-entropy + λ × (mean CAM outside − mean CAM inside)).",
                elem_classes="help")
    with gr.Row():
        base_model = gr.Dropdown(ui.model_choices(names), value=first_model, allow_custom_value=True, label="Model to fine-tune", scale=2)
        train_data = gr.Dropdown([], label="Training masks", scale=2, elem_id="train-data", allow_custom_value=True,
                                 info="Your mask sets, the decoy BloodMNIST set, or BCCD boxes when present.")
        refresh_data = gr.Button("↻", size="sm", scale=0, min_width=40)
    with gr.Row():
        epochs = gr.Slider(1, 30, value=3, step=1, label="Epochs")
        lam = gr.Slider(0, 10, value=1.0, step=0.1, label="λ (weight of the mask loss)")
        backend = gr.Radio([("This machine", "local"), ("HuggingFace Jobs (needs HF_TOKEN)", "hf-jobs")],
                           value="local", label="Run on")
    with gr.Row():
        launch = gr.Button("Start fine-tune", variant="primary", elem_id="start-finetune")
        cancel = gr.Button("Cancel", variant="stop", elem_id="cancel-finetune")
    job_id = gr.State(None)
    job_status = gr.Markdown(elem_id="job-status")
    job_progress = gr.Slider(0, 100, value=0, label="Progress (%)", interactive=False)
    job_plot = gr.Plot(label="Loss and IoU")
    before_after = gr.Gallery(label="Before / after (CAM over the image)", columns=4, format="png", height=240)
    compare_table = gr.Dataframe(headers=["", "before", "after"], label="Before / after", interactive=False)
    timer = gr.Timer(1.0, active=False)

    # ---- handlers
    def load_from_explain(path):
        if not path:
            raise gr.Error("The Explain tab has no image yet.")
        picture = np.asarray(load_image(path))
        view = ui.display_rgb(picture)
        return picture, view, {"points": [], "labels": [], "box_corner": None, "box": None}, None, None, view, picture

    # the clean image is kept beside the clicks (the view shows the tinted mask)
    sam_clean = gr.State(None)  # the image SAM sees (small images enlarged so they can be clicked)
    sam_original = gr.State(None)  # the image as loaded: masks are stored at this size
    use_explain.click(friendly(load_from_explain), explain_image, [editor, sam_view, sam_points, current_mask,
                                                                 mask_preview, sam_clean, sam_original],
                      api_name="mask_use_explain_image", **light)

    def editor_upload(value):
        background = ui.editor_background(value)
        if background is None:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        rgb = ui.as_rgb(background)
        view = ui.display_rgb(rgb)
        return view, {"points": [], "labels": [], "box_corner": None, "box": None}, None, view, rgb

    editor.upload(friendly(editor_upload), editor, [sam_view, sam_points, current_mask, sam_clean, sam_original],
                  api_name="mask_editor_upload", **light)

    @friendly
    def use_drawing(value):
        from explainers.masks import mask_from_drawing

        background = ui.editor_background(value)
        if background is None:
            raise gr.Error("Upload an image into the editor first, then paint over the region.")
        rgb = ui.as_rgb(background)
        result = mask_from_drawing(value, rgb.shape[:2])
        return ui.mask_overlay(rgb, result.mask), {"mask": result.mask, "source": "drawn", "image": rgb}, \
            f"Drawn mask: {result.area_fraction:.0%} of the image."

    draw_preview.click(use_drawing, editor, [mask_preview, current_mask, segmenter_info], api_name="mask_from_drawing",
                       **light)

    def click_logic(picture, prompts, mode, x, y, session, original=None):
        prompts = json.loads(json.dumps(prompts or {"points": [], "labels": [], "box_corner": None, "box": None}))
        if mode == "box":
            if prompts.get("box_corner") is None:
                prompts["box_corner"] = [x, y]
                prompts["box"] = None
                rgb = ui.as_rgb(picture)
                return ui.mask_overlay(rgb, np.zeros(rgb.shape[:2], bool), (prompts["points"], prompts["labels"])), \
                    prompts, gr.skip(), gr.skip(), "First corner set: click the opposite corner."
            x0, y0 = prompts.pop("box_corner")
            prompts["box_corner"] = None
            prompts["box"] = [min(x0, x), min(y0, y), max(x0, x), max(y0, y)]
        else:
            prompts["points"].append([x, y])
            prompts["labels"].append(1 if mode == "object" else 0)
        result = segment_prompts(services, picture, prompts["points"], prompts["labels"], prompts["box"], session)
        rgb = ui.as_rgb(picture)
        view = ui.mask_overlay(rgb, result.mask, (prompts["points"], prompts["labels"]), prompts["box"])
        note = f"Mask by **{result.source}**: {result.area_fraction:.0%} of the image."
        if result.is_fallback:
            note += " SAM's weights are not available offline here, so OpenCV GrabCut stands in for it."
        return view, prompts, ui.mask_overlay(rgb, result.mask), {"mask": result.mask, "source": result.source,
                                                                 "image": rgb, "original": original}, note

    @friendly
    def on_sam_select(clean, original, prompts, mode, request: gr.Request, evt: gr.SelectData):
        if clean is None:
            raise gr.Error("Load an image first (upload it in the editor or use the Explain tab's image).")
        x, y = evt.index
        return click_logic(clean, prompts, mode, float(x), float(y), request.session_hash, original)

    sam_outputs = [sam_view, sam_points, mask_preview, current_mask, segmenter_info]
    sam_view.select(on_sam_select, [sam_clean, sam_original, sam_points, click_mode], sam_outputs, api_visibility="private", **heavy)

    # explicit-coordinate endpoint: the same logic as a click, callable from gradio_client
    click_x = gr.Number(visible=False)
    click_y = gr.Number(visible=False)
    click_button = gr.Button(visible=False)

    @friendly
    def on_click_api(clean, original, prompts, mode, x, y, request: gr.Request):
        """A click at (x, y) in the pixel grid of the image shown for SAM (the API form of a click)."""
        if clean is None:
            raise gr.Error("Load an image first (upload it in the editor or use the Explain tab's image).")
        return click_logic(clean, prompts, mode, float(x), float(y), request.session_hash, original)

    click_button.click(on_click_api, [sam_clean, sam_original, sam_points, click_mode, click_x, click_y], sam_outputs,
                       api_name="sam_click", **heavy)


    def clear(clean):
        empty = {"points": [], "labels": [], "box_corner": None, "box": None}
        return (None if clean is None else clean), empty, None, None, ""

    clear_points.click(clear, sam_clean, [sam_view, sam_points, mask_preview, current_mask, segmenter_info],
                       api_name="sam_clear", queue=False)

    @friendly
    def add_to_set(name, label, mask_state):
        if not mask_state:
            raise gr.Error("Make a mask first: paint and press 'Use my drawing', or click for SAM.")
        if label in (None, ""):
            raise gr.Error("Pick the class label of this image.")
        try:
            int(str(label).split(":")[0])
        except ValueError as error:
            raise gr.Error(f"The class label must be a class index, got {label!r}.") from error
        label = str(label).split(":")[0].strip()
        picture, mask = mask_state["image"], mask_state["mask"]
        original = mask_state.get("original")
        if original is not None and np.asarray(original).shape[:2] != np.asarray(mask).shape:
            from explainers.masks import resize_mask

            picture = np.asarray(original)
            mask = resize_mask(mask, picture.shape[:2])  # back to the image's own size
        entry = services.store.add_mask(name, picture, mask, label, source=mask_state["source"])
        gr.Info(f"Added to '{name}' (entry {entry}).", duration=3)
        return set_view(name)

    def set_view(name):
        try:
            entries = services.store.masks(name)
        except Exception:  # noqa: BLE001
            entries = []
        items = []
        for entry in entries[-24:]:
            picture, mask, label = services.store.mask_item(entry["id"])
            items.append((ui.mask_overlay(np.asarray(picture), mask), f"class {label} · {entry['source']}"))
        sets = services.store.mask_sets()
        summary = ", ".join(f"**{n}** ({c})" for n, c in sets) or "none yet"
        return items, f"Mask sets: {summary}."

    add_button.click(add_to_set, [set_name, mask_label, current_mask], [set_gallery, set_info], api_name="add_mask",
                     **light)
    set_name.submit(friendly(set_view), set_name, [set_gallery, set_info], api_visibility="private", **light)

    @friendly
    def labels_for(model_name):
        if not model_name:
            return gr.skip()
        return gr.update(choices=_label_choices(services, model_name), value=None)

    base_model.change(labels_for, base_model, mask_label, api_visibility="private", **light)

    def data_choices():
        choices = [(f"Mask set: {n} ({c} images)", f"set:{n}") for n, c in services.store.mask_sets()]
        for label, path in finetune_datasets():
            choices.append((label, f"path:{path}"))
        return gr.update(choices=choices, value=choices[0][1] if choices else None)

    refresh_data.click(data_choices, None, train_data, api_visibility="private", queue=False)

    @friendly
    def start(model_name, data_choice, n_epochs, lam_value, backend_name):
        if not data_choice:
            raise gr.Error("Pick the training masks: add images to a mask set first, or build the decoy set.")
        if backend_name == "hf-jobs" and not services.hf_token:
            raise gr.Error("HuggingFace Jobs needs a token: set HF_TOKEN in the environment (or the Space's secrets).")
        kind, _, value = data_choice.partition(":")
        if kind == "build":
            gr.Info("Building the mask set first (about a minute)…")
            value, kind = build_mask_dataset(value), "path"
        if kind == "set":
            folder = services.state_dir / "masksets" / f"{value}-{time.strftime('%Y%m%d-%H%M%S')}"
            services.store.export_mask_set(value, folder)
            masks = str(folder)
        elif kind == "path":
            masks = str(_resolve_folder(value)) if not _inside(Path(value), [services.state_dir]) else value
            if not (Path(masks) / "masks.csv").exists():
                raise gr.Error(f"{value} has no masks.csv: pick one of the listed mask sets.")
        else:
            raise gr.Error(f"Unknown training data {data_choice!r}: pick one of the listed mask sets.")
        from explainers.models import safe_name

        out_name = safe_name(f"{model_name}-camal-{time.strftime('%m%d-%H%M%S')}")
        card = services.weights_dir / f"{model_name}.json"
        spec = str(card) if backend_name == "local" and card.exists() else model_name
        params = {"model": spec, "data": masks, "epochs": int(n_epochs), "lambda": float(lam_value),
                  "out": str(services.weights_dir / out_name) if backend_name == "local" else f"weights/{out_name}"}
        runner = services.runner()
        try:
            new_id = runner.submit("camal", params, backend=backend_name)
        except KeyError as error:
            raise gr.Error("CAMAL fine-tuning is not available in this build (no 'camal' job kind).") from error
        return new_id, f"Job **{new_id}** queued: fine-tuning **{model_name}** → **{out_name}**.", \
            gr.update(active=True), 0

    launch.click(start, [base_model, train_data, epochs, lam, backend], [job_id, job_status, timer, job_progress],
                 api_name="start_finetune", **light)

    @friendly
    def poll(current):
        if not current:
            return gr.skip(), gr.skip(), gr.skip(), gr.update(active=False), gr.skip(), gr.skip(), gr.skip()
        runner = services.runner()
        job = runner.get(current)
        progress = job["progress"]
        percent = 100.0 * (progress["step"] or 0) / progress["total"] if progress.get("total") else 0.0
        history = runner.history(current)
        figure = ui.job_figure(history) if history else ui.empty_figure("Waiting for the first step…")
        text = f"Job **{current}**: {job['status']}"
        if job.get("error"):
            text += f" — {job['error'][:300]}"
        if job["status"] in ("done", "failed", "cancelled", "interrupted"):
            gallery, table = finetune_comparison(services, job)
            models = gr.skip()
            if job["status"] == "done":
                text += ". The new model is now in the model pickers."
                models = gr.update(choices=ui.model_choices(services.names()))
            return text, percent if job["status"] != "done" else 100, figure, gr.update(active=False), gallery, \
                table, models
        return text, percent, figure, gr.skip(), gr.skip(), gr.skip(), gr.skip()

    timer.tick(poll, job_id, [job_status, job_progress, job_plot, timer, before_after, compare_table, base_model],
               api_name="finetune_status", concurrency_id="poll", concurrency_limit=32, show_progress="hidden")

    @friendly
    def cancel_job(current):
        if not current:
            raise gr.Error("No fine-tune is running.")
        job = services.runner().cancel(current)
        return f"Job **{current}**: {job['status']} (cancel requested)."

    cancel.click(cancel_job, job_id, job_status, api_name="cancel_finetune", queue=False)
    return {"data_choices": data_choices, "train_data": train_data, "base_model": base_model,
            "labels_for": labels_for, "mask_label": mask_label}


def _label_choices(services, model_name) -> list:
    try:
        bundle = services.bundle(model_name)
    except Exception:  # noqa: BLE001 - no model yet: the menu fills when one loads
        return [("unlabelled (use the model's prediction)", "-1")]
    choices = [(f"{i}: {n}", str(i)) for i, n in enumerate(bundle.class_names[:1000])]
    return choices + [("unlabelled (use the model's prediction)", "-1")]


BLOODMNIST_SOURCE = ROOT / ".." / "shared" / "data" / "bloodmnist" / "64"
BCCD_SOURCE = ROOT / ".." / "shared" / "data" / "bccd"


def finetune_datasets() -> list:
    """[(label, value)] of mask sets with masks: ready on disk ('path:...'), or buildable from the raw data
    here ('build:decoy', 'build:bccd')."""
    found = []
    for label, relative, kind, source in (
            ("Decoy BloodMNIST, train (cell masks)", "decoy-bloodmnist/train", "decoy", BLOODMNIST_SOURCE / "train"),
            ("BCCD white-cell boxes", "bccd-masks", "bccd", BCCD_SOURCE)):
        ready = next((root / relative for root in decoy_locations() if (root / relative / "masks.csv").exists()), None)
        if ready is not None:
            found.append((label, f"path:{ready.resolve()}"))
        elif source.exists():
            found.append((f"{label}: build it now (takes a minute)", f"build:{kind}"))
    return found


def build_mask_dataset(kind: str) -> str:
    """Build decoy BloodMNIST (2,000 train images) or the BCCD box mask set under data/; returns the train folder."""
    if kind == "decoy":
        from explainers.decoy import build_decoy_bloodmnist

        out = ROOT / "data" / "decoy-bloodmnist"
        build_decoy_bloodmnist(BLOODMNIST_SOURCE, out, train_limit=2000, val_limit=400, test_limit=400)
        return str(out / "train")
    if kind == "bccd":
        from explainers.masks import build_bccd_mask_set

        out = ROOT / "data" / "bccd-masks"
        build_bccd_mask_set(BCCD_SOURCE, out, split="trainval")
        return str(out)
    raise ValueError(f"Unknown data set {kind!r}.")


def finetune_comparison(services, job) -> tuple:
    """Before/after gallery and table of a finished CAMAL job."""
    result = job.get("result") or {}
    return ui.camal_figures(result, services.weights_dir), ui.camal_comparison_rows(result)


# ------------------------------------------------------------------------------------------------ Review tab
REVIEW_METHODS = ("gradcam", "aha", "gradskip")


def build_review_tab(services, names, first_model, data_dir, heavy, light):
    gr.Markdown("Review explanations image by image. Verdicts and notes are saved **the moment you make them** "
                "(SQLite on the server): a refresh or a crash loses nothing.", elem_classes="help")
    reviewer_saved = gr.BrowserState("", storage_key="saliency-lab-reviewer")
    review_state = gr.State(None)
    with gr.Row():
        folder = gr.Textbox(data_dir, label="Labelled folder (labels.csv) or .npz", scale=4, elem_id="review-folder")
        review_model = gr.Dropdown(ui.model_choices(names), value=first_model, allow_custom_value=True, label="Model", scale=2)
        reviewer = gr.Textbox("", label="Your name (reviewer)", placeholder="e.g. dr-lee", scale=2,
                              elem_id="reviewer")
        load_button = gr.Button("Load", variant="primary", scale=1, elem_id="review-load")
    with gr.Row():
        class_filter = gr.Dropdown([("All classes", "all")], value="all", label="True class", scale=2)
        correctness = gr.Radio([("All", "all"), ("Correct", "correct"), ("Incorrect", "incorrect")], value="all",
                               label="Prediction", scale=2)
        limit = gr.Slider(24, 2000, value=400, step=8, label="Images to load (first N)", scale=2,
                          elem_id="review-limit")
        page = gr.Number(1, minimum=1, precision=0, label="Page", scale=1)
    progress_md = gr.Markdown(elem_id="review-progress")
    gallery = gr.Gallery(label="Click an image to review it", columns=10, height=320, allow_preview=False,
                         format="png", elem_id="review-gallery")
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            maps = gr.Gallery(label="Image and explanations", columns=4, height=260, format="png",
                              elem_id="review-maps")
            item_info = gr.Markdown(elem_id="review-item")
        with gr.Column(scale=2):
            with gr.Row(elem_classes="verdict-row"):
                plausible = gr.Button("Plausible", elem_id="verdict-plausible")
                implausible = gr.Button("Implausible", elem_id="verdict-implausible")
                unsure = gr.Button("Unsure", elem_id="verdict-unsure")
            note = gr.Textbox(label="Note (saved as you type)", lines=4, elem_id="review-note")
            saved = gr.Markdown(elem_classes="help", elem_id="review-saved")
            with gr.Row():
                previous = gr.Button("← Previous")
                following = gr.Button("Next →")
            export = gr.Button("Export verdicts (CSV)")
            export_file = gr.File(label="Verdicts CSV")
    position = gr.Number(visible=False, precision=0)
    open_button = gr.Button(visible=False)

    def _who(name):
        return (name or "").strip() or "anonymous"

    @friendly
    def load(folder_path, model_name, n_images, class_value, correct_value, name, progress=gr.Progress()):
        folder_path = str(_resolve_folder(folder_path))
        dataset = _open_folder(folder_path)
        bundle = services.bundle(model_name)
        key = ui.dataset_key(folder_path)
        count = min(int(n_images), len(dataset))
        cached = {row["item"]: row for row in services.store.predictions(key, model_name)}
        missing = [i for i in range(count) if ui.item_name(dataset, i) not in cached]
        if missing:
            progress(0, desc=f"Predicting {len(missing)} images…")
            rows = ui.predict_dataset(bundle, dataset, missing,
                                      progress=lambda done, total: progress(done / total, desc="Predicting…"))
            services.store.save_predictions(key, model_name, rows)
        rows = [r for r in services.store.predictions(key, model_name) if r["position"] < count]
        names_ = _class_names(folder_path, dataset)
        if bundle.num_classes != len(names_):
            gr.Warning(f"{model_name} has {bundle.num_classes} classes but this data set has {len(names_)}: "
                       "'correct' and 'incorrect' compare class indices that do not match.")
        state = {"folder": folder_path, "key": key, "model": model_name, "rows": rows, "names": names_,
                 "model_names": list(bundle.class_names),
                 "filtered": [], "current": None}
        return (*_filtered(state, class_value, correct_value, 1, name), gr.update(choices=_class_filter_choices(names_)))

    def _filtered(state, class_value, correct_value, page_value, name):
        class_index = None if class_value in (None, "", "all") else int(class_value)
        filtered = ui.filter_rows(state["rows"], class_index, correct_value or "all")
        state = {**state, "filtered": filtered}
        pages = max(1, (len(filtered) + PAGE - 1) // PAGE)
        page_value = min(max(1, int(page_value or 1)), pages)
        dataset = open_dataset(state["folder"])
        verdicts = {v["item"]: v["verdict"] for v in services.store.verdicts(state["key"], _who(name))}
        marks = {"plausible": "· plausible", "implausible": "· implausible", "unsure": "· unsure"}
        items = []
        for row in filtered[(page_value - 1) * PAGE: page_value * PAGE]:
            ok = "✓" if row["label"] == row["prediction"] else "✗"
            mark = marks.get(verdicts.get(row["item"]), "")
            items.append((dataset.image(row["position"]),
                          f"{ok} {state['model_names'][row['prediction']]} {row['confidence']:.0%} {mark}".strip()))
        state["page_start"] = (page_value - 1) * PAGE
        return items, state, _progress(state, name), gr.update(maximum=pages, value=page_value)

    def _progress(state, name):
        reviewed, _ = services.store.progress(state["key"], _who(name))
        in_view = {r["item"] for r in state["filtered"]}
        done_here = sum(1 for v in services.store.verdicts(state["key"], _who(name))
                        if v["verdict"] and v["item"] in in_view)
        wrong = sum(1 for r in state["rows"] if r["label"] != r["prediction"])
        return (f"**Reviewed {reviewed} of {len(state['rows'])}** images as *{_who(name)}* "
                f"({done_here} of the {len(state['filtered'])} shown by the filters). "
                f"Model accuracy on these images: {1 - wrong / max(1, len(state['rows'])):.1%}.")

    gallery_outputs = [gallery, review_state, progress_md, page]
    load_button.click(load, [folder, review_model, limit, class_filter, correctness, reviewer],
                      [*gallery_outputs, class_filter], api_name="review_load", **heavy)

    @friendly
    def refilter(state, class_value, correct_value, page_value, name):
        if not state:
            raise gr.Error("Load a data set first.")
        return _filtered(state, class_value, correct_value, page_value, name)

    gr.on([class_filter.input, correctness.input], lambda s, c, k, n: refilter(s, c, k, 1, n),
          [review_state, class_filter, correctness, reviewer], gallery_outputs, api_visibility="private", **light)
    page.submit(refilter, [review_state, class_filter, correctness, page, reviewer], gallery_outputs,
                 api_name="review_page", **light)

    @friendly
    def open_item(state, index, name):
        """Open the image at position `index` of the filtered list (explicit coordinates)."""
        if not state:
            raise gr.Error("Load a data set first.")
        index = int(index)
        if not 0 <= index < len(state["filtered"]):
            raise gr.Error(f"No image {index} in the current list ({len(state['filtered'])} images).")
        row = state["filtered"][index]
        bundle = services.bundle(state["model"])
        dataset = open_dataset(state["folder"])
        picture = dataset.image(row["position"])
        prepared = ui.prepare_input(picture, bundle)
        items = [(prepared.display, f"image · true: {state['names'][row['label']]}")]
        used = []
        for method in [m for m in REVIEW_METHODS if m in {v for _, v in ui.method_choices(bundle)}][:3]:
            try:
                record = gpu_run_method(bundle, prepared, method, row["prediction"],
                                        ui.method_options(method, bundle=bundle), services.cache, curves=False)
            except (MethodNotApplicable, ValueError, RuntimeError) as error:
                if not _user_facing(error):
                    raise
                continue
            used.append(method)
            items.append((ui.render_overlays(prepared, [record], 0.55, "cividis")[0][0], record["label"]))
        saved_row = services.store.get(state["key"], row["item"], _who(name)) or {}
        correct = row["label"] == row["prediction"]
        info = (f"**{row['item']}** — true class **{state['names'][row['label']]}**, predicted "
                f"**{state['model_names'][row['prediction']]}** with confidence **{row['confidence']:.1%}** "
                f"({'correct' if correct else 'incorrect'}). Maps explain the predicted class.")
        state = {**state, "current": index, "current_methods": used}
        verdict = saved_row.get("verdict")
        return services.pictures(items), info, saved_row.get("note", ""), \
            (f"Saved verdict: **{verdict}**." if verdict else "No verdict yet."), state, index

    open_outputs = [maps, item_info, note, saved, review_state, position]

    def on_select(state, name, evt: gr.SelectData):
        return open_item(state, (state or {}).get("page_start", 0) + evt.index, name)

    gallery.select(on_select, [review_state, reviewer], open_outputs, api_visibility="private", **heavy)
    open_button.click(open_item, [review_state, position, reviewer], open_outputs, api_name="review_open", **heavy)
    previous.click(lambda s, n: open_item(s, max(0, (s or {}).get("current") or 0) - 1, n), [review_state, reviewer],
                   open_outputs, api_visibility="private", **heavy)
    following.click(lambda s, n: open_item(s, ((s or {}).get("current") or 0) + 1, n), [review_state, reviewer],
                    open_outputs, api_visibility="private", **heavy)

    def verdict_fn(verdict):
        @friendly
        def record(state, name, text):
            if not state or state.get("current") is None:
                raise gr.Error("Open an image first (click it in the gallery).")
            row = state["filtered"][state["current"]]
            services.store.set_verdict(state["key"], row["item"], verdict, reviewer=_who(name), model=state["model"],
                                       label=state["names"][row["label"]],
                                       prediction=state["model_names"][row["prediction"]],
                                       confidence=row["confidence"],
                                       methods=state.get("current_methods", []))
            if text:
                services.store.set_note(state["key"], row["item"], text, reviewer=_who(name))
            return f"Saved verdict: **{verdict}** ({time.strftime('%H:%M:%S')}).", _progress(state, name)
        return record

    for button, verdict in ((plausible, "plausible"), (implausible, "implausible"), (unsure, "unsure")):
        button.click(verdict_fn(verdict), [review_state, reviewer, note], [saved, progress_md],
                     api_name=f"verdict_{verdict}", **light)

    @friendly
    def save_note(state, name, text):
        if not state or state.get("current") is None:
            return gr.skip()
        row = state["filtered"][state["current"]]
        services.store.set_note(state["key"], row["item"], text or "", reviewer=_who(name))
        return f"Note saved ({time.strftime('%H:%M:%S')})."

    note.input(save_note, [review_state, reviewer, note], saved, api_name="review_note", trigger_mode="always_last",
               **light)
    note.blur(save_note, [review_state, reviewer, note], saved, api_visibility="private", **light)  # pastes, too

    @friendly
    def export_csv(state, name):
        key = state["key"] if state else None
        path = services.downloads / f"verdicts-{time.strftime('%Y%m%d-%H%M%S')}.csv"
        services.store.export_csv(path, dataset=key)
        return str(path)

    export.click(export_csv, [review_state, reviewer], export_file, api_name="review_export", **light)

    # the reviewer's name survives a refresh (browser local storage)
    reviewer.change(lambda n: n, reviewer, reviewer_saved, api_visibility="private", queue=False)
    return reviewer_saved, reviewer, review_model


# ------------------------------------------------------------------------------------------------ Learn tab
def build_learn_tab(services, names, first_model, explain_image, heavy):
    gr.Markdown("## What the methods do")
    gr.Markdown("\n\n".join(f"**{label}.** {text}" for label, text in ui.method_descriptions()))
    gr.Markdown("## What the scores mean")
    gr.Markdown(METRICS_TEXT)
    gr.Markdown("## Sanity check, live\nRandomise the model's top layers, stage by stage, and watch which maps "
                "change. Uses the Explain tab's image (or the first example).")
    with gr.Row():
        sanity_model = gr.Dropdown(ui.model_choices(names), value=first_model, allow_custom_value=True, label="Model", scale=2)
        sanity_methods = gr.CheckboxGroup([("Grad-CAM", "gradcam"), ("AHA", "aha"), ("GradSkip", "gradskip"),
                                           ("Attention rollout", "rollout"), ("Random (baseline)", "random")],
                                          value=["gradcam", "random"], label="Methods", scale=3,
                                          elem_id="sanity-methods")
        stages = gr.Slider(1, 6, value=4, step=1, label="Stages", scale=1)
        sanity_button = gr.Button("Run sanity check", variant="primary", scale=1, elem_id="sanity-button")
    sanity_gallery = gr.Gallery(label="Maps as the model is randomised (left: trained model)", columns=5,
                                format="png", height=300, elem_id="sanity-gallery")
    sanity_plot = gr.Plot(label="Rank correlation with the original map")

    @friendly
    def run_sanity(model_name, chosen, n_stages, path):
        chosen = list(chosen or [])
        if not chosen:
            raise gr.Error("Pick at least one method.")
        bundle = services.bundle(model_name)
        if not path:
            cells, photos = examples_list()
            path = (photos if bundle.num_classes == 1000 else cells or photos)[0]
        prepared = ui.prepare_input(load_image(path), bundle)
        target = ui.predict_top(bundle, prepared, 1)[0][0]
        items, curves = [], []
        for method in chosen:
            try:
                points = []
                for stage_name, stage_map, rho in ui.sanity_check_stages(bundle, method, prepared, target,
                                                                         stages=int(n_stages)):
                    record = ui.result_record(method, target, {}, stage_map, 0.0, None, bundle)
                    items.append((ui.render_overlays(prepared, [record], 0.6, "cividis")[0][0],
                                  f"{ui.method_label(method)} · {stage_name} · ρ={rho:.2f}"))
                    points.append((stage_name, rho))
                    curves_now = curves + [(ui.method_label(method), points)]
                    yield services.pictures(items), ui.sanity_figure(curves_now, f"Sanity check on {bundle.name}")
                curves.append((ui.method_label(method), points))
            except (MethodNotApplicable, ValueError, RuntimeError) as error:
                if not _user_facing(error):
                    raise
                gr.Warning(f"{ui.method_label(method)} skipped: {user_message(error)}")
        yield services.pictures(items), ui.sanity_figure(curves, f"Sanity check on {bundle.name}")

    sanity_button.click(run_sanity, [sanity_model, sanity_methods, stages, explain_image],
                        [sanity_gallery, sanity_plot], api_name="sanity_check", **heavy)

    gr.Markdown("## Decoy BloodMNIST: a model that cheats, before and after CAMAL")
    gr.Markdown("Every training image of decoy BloodMNIST carries a small coloured square whose colour and corner "
                "give the class away. A model trained on it can score well by looking at the square instead of "
                "the cell; its maps show it. CAMAL fine-tuning with cell masks pulls the maps (and the decision) "
                "back onto the cell. On the test split the squares are random, so the cheat stops working.")
    decoy_gallery = gr.Gallery(label="Decoy examples and maps", columns=6, format="png", height=260,
                               elem_id="decoy-gallery")
    decoy_info = gr.Markdown(elem_classes="help")
    decoy_button = gr.Button("Show decoy examples (and before/after maps when the models exist)",
                             elem_id="decoy-button")

    @friendly
    def show_decoy():
        return decoy_view(services)

    decoy_button.click(show_decoy, None, [decoy_gallery, decoy_info], api_name="decoy", **heavy)
    return sanity_model


def decoy_locations() -> list:
    """Folders that may hold decoy BloodMNIST (`decoy-bloodmnist/`) and its models (`weights/`)."""
    roots = [Path(p) for p in os.environ.get("SALIENCY_LAB_DECOY_DIR", "").split(os.pathsep) if p]
    return roots + [ROOT / "data", ROOT / ".." / "shared" / "data", ROOT]


def decoy_view(services) -> tuple:
    from explainers.decoy import CORNERS, PALETTE, add_decoy

    roots = decoy_locations()
    found = next((root / "decoy-bloodmnist" / "test" for root in roots
                  if (root / "decoy-bloodmnist" / "test" / "labels.csv").exists()), None)
    if found is None:
        items = []
        cells, _ = examples_list()
        for index, path in enumerate(cells[:8]):
            rgb = np.asarray(load_image(path))
            decoyed, _ = add_decoy(rgb, PALETTE[index % len(PALETTE)], index % 4)
            items.append((Image.fromarray(decoyed).resize((192, 192), Image.NEAREST),
                          f"class {index}: its square, {CORNERS[index % 4]}"))
        return services.pictures(items, "png"), (
            "The decoy data set is not built here yet: these are the shipped cells with their class's square "
            "added (the training rule). Build it with `python -m explainers.decoy --src "
            "../shared/data/bloodmnist/64 --out data/decoy-bloodmnist`, train a model on it and fine-tune that "
            "model with CAMAL (Masks & fine-tune tab, or `bench/bench_camal.py decoy`) to see its maps before and "
            "after here.")
    dataset = open_dataset(found)
    before, after = ui.decoy_model_cards([services.weights_dir] + [root / "weights" for root in roots])
    from explainers.camal import load_bundle

    bundles = {}
    for tag, card in (("before", before), ("after CAMAL", after)):
        if card is not None:
            bundles[tag] = services.cached(("decoy", str(card)), lambda c=card: load_bundle(str(c), device=DEVICE))
    items = []
    for index in range(min(4, len(dataset))):
        picture = dataset.image(index)
        items.append((picture.resize((192, 192), Image.NEAREST),
                      f"decoy test image {index} (true class {dataset.labels[index]})"))
        for tag, bundle in bundles.items():
            prepared = ui.prepare_input(picture, bundle)
            target = ui.predict_top(bundle, prepared, 1)[0][0]
            record = gpu_run_method(bundle, prepared, "gradcam", target, {}, services.cache, curves=False)
            items.append((ui.render_overlays(prepared, [record], 0.6, "cividis")[0][0],
                          f"{tag}: predicts {bundle.class_name(target)}"))
    text = (f"Decoy test split ({found}): the squares are random here, so a model that learned the shortcut "
            "is misled. " + (f"Before: **{before.stem}**. " if before else "No decoy-trained model found yet. ")
            + (f"After CAMAL: **{after.stem}**." if after else "No CAMAL fine-tune of it found yet."))
    return services.pictures(items, "png"), text


def launch_kwargs() -> dict:
    return {"theme": THEME, "css": CSS, "ssr_mode": False, "max_file_size": "20mb", "show_error": False}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    demo = build_app()
    demo.queue(default_concurrency_limit=4)
    # 127.0.0.1:7860 here; a Space sets GRADIO_SERVER_NAME=0.0.0.0 in the environment
    demo.launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")), **launch_kwargs())
