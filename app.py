"""Saliency Lab: faithful visual explanations of image classifiers (the Gradio 6 front end).

    python app.py                  # http://127.0.0.1:7860, offline, on the bundled models

Thin on purpose: this file only builds the layout and wires events to the app's service layer, `saliency_lab`
(which calls the library, `explainers`, the same functions the CLI calls): `saliency_lab.explain` (the Explain
tab), `saliency_lab.browse` (data folders), `saliency_lab.masks` and `saliency_lab.finetune` (Masks &
fine-tune), `saliency_lab.review` (Review), `saliency_lab.learn` (Learn), `saliency_lab.services` (the shared
models, caches, review store, jobs and SAM), `saliency_lab.menus` / `figures` (menus, plotly figures). The
method list and its sliders come from the method registry (`explainers.methods`). What stays here is Gradio glue: components, events, gr.State, gr.Progress,
and turning errors into messages (`friendly`). Per-user state lives in gr.State / gr.BrowserState and
per-session keys; heavy work shares one concurrency id, so it never starves the sliders, which only recombine
cached statistics.
"""
from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("MPLBACKEND", "Agg")  # Gradio switches matplotlib to Agg around every event: start there

try:  # ZeroGPU: `spaces` must be imported before torch; elsewhere the decorator is a no-op
    import spaces  # type: ignore  # noqa: F401  (saliency_lab.services.gpu uses it once imported)
except ImportError:  # pragma: no cover - not on a Space
    spaces = None

import functools
import inspect
import logging
import time
import traceback
from pathlib import Path

import gradio as gr
import torch

from explainers.engine import CURVE_NOTE
from explainers.images import COLORMAPS, ImageError, load_image
from explainers.methods import METHODS
from saliency_lab import browse as browse_module
from saliency_lab import (aha_train, explain, figures, finetune, learn, masks, menus, models_tab, pictures,
                          review, review_data, studies)
from explainers.review_report import SLOTS
from saliency_lab.errors import is_user_error, user_message
from saliency_lab.services import DEVICE, Services, configure_torch, default_loader

default_data_dir = browse_module.default_data_dir  # (kept importable from app)
SLIDERS = menus.sliders()  # [(method, Option)]: each method's user options, in slider order


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
def default_state_dir() -> Path:
    """SQLite files (verdicts, mask sets, jobs): SALIENCY_LAB_STATE_DIR, else the user's data folder
    (`explainers.paths.data_dir()`: SALIENCY_DATA_DIR, the Space's /data, or ~/.local/share), never the code."""
    from explainers.paths import data_dir

    configured = os.environ.get("SALIENCY_LAB_STATE_DIR")
    return Path(configured) if configured else data_dir() / "app"
log = logging.getLogger("saliency_lab")


def friendly(fn):
    """Turn every exception into a gr.Error with a clear message (never a stack trace in the UI)."""

    def convert(error):
        if isinstance(error, gr.Error):
            return error
        if is_user_error(error):
            return gr.Error(user_message(error))
        if isinstance(error, torch.cuda.OutOfMemoryError if hasattr(torch.cuda, "OutOfMemoryError") else MemoryError):
            return gr.Error("Out of memory: try a smaller image, fewer methods or a smaller model.")
        reference = f"{int(time.time()) % 1_000_000:06d}"
        log.error("unexpected error %s in %s:\n%s", reference, fn.__name__, traceback.format_exc())
        return gr.Error(f"Something went wrong on our side: this is a bug, not your input. The details are in "
                        f"the server log (reference {reference}).")

    if inspect.isgeneratorfunction(fn):
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


CHECKED = "checked-upload"  # the class that marks a gr.Image whose uploads load_image checks first


_REFUSED: dict = {}  # upload path -> when it was last refused (one toast per refused upload)


def _checked_preprocess(plain):
    def preprocess(self, payload):
        if CHECKED in (self.elem_classes or []) and payload is not None and getattr(payload, "path", None):
            try:
                load_image(payload.path)
            except ImageError as error:
                # the browser sends a replaced image's change twice: the second refusal fails silently
                now, path = time.monotonic(), str(payload.path)
                repeated = now - _REFUSED.get(path, -1e9) < 5.0
                _REFUSED.clear() if len(_REFUSED) > 256 else None
                _REFUSED[path] = now
                raise gr.Error(user_message(error), visible=not repeated) from error
        return plain(self, payload)

    preprocess.checked = True
    return preprocess


if not getattr(gr.Image.preprocess, "checked", False):
    # At the class, not per instance: an update of the component (gr.update, gr.skip as an output) makes Gradio
    # rebuild it from its constructor arguments, which would drop a per-instance wrapper; the marker class
    # survives. (A gr.Image subclass would make Gradio write a .pyi stub next to this file.)
    gr.Image.preprocess = _checked_preprocess(gr.Image.preprocess)


def checked_image(**kwargs) -> gr.Image:
    """A gr.Image that refuses unreadable, too large or too small uploads with a clear message, before any
    handler runs (explainers.images.load_image's checks: header-first size limits, allowed decoders), and hands
    the handler the file as uploaded (image_mode=None: Gradio's RGB conversion would whiten 16-bit data)."""
    kwargs.setdefault("image_mode", None)
    kwargs["elem_classes"] = [*(kwargs.get("elem_classes") or []), CHECKED]
    return gr.Image(**kwargs)


def dataset_dropdown(data_dir, **kwargs) -> gr.Dropdown:
    """A menu of named data sets (saliency_lab.browse.dataset_choices: shipped, BloodMNIST's test split when
    present, the data folder's), no server paths; off a Space a folder path inside the data roots may be typed."""
    choices, value = browse_module.dataset_menu(data_dir)
    local = not browse_module.on_space()
    return gr.Dropdown(choices, value=value, label="Data set", allow_custom_value=local,
                       info="Shipped sets, BloodMNIST's test split when present, and those in your data folder"
                            + (" (or type a folder inside the data roots)." if local else "."), **kwargs)


def or_skip(value):
    """None -> gr.skip() (leave the output as it is)."""
    return gr.skip() if value is None else value


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
.warning-note { background: #fff4e5; color: #5f3b00; border-left: 4px solid #e69f00; padding: 6px 12px;
                border-radius: 6px; }
footer { display: none !important; }
#input-image img, #sam-view img { width: 100%; height: 100%; object-fit: contain; }
#input-image img { image-rendering: auto; }
/* Explain with up to 6 methods: every map and every number visible (no inner scroll, wrapped captions) */
#overlays .grid-wrap, #sanity-gallery .grid-wrap, #before-after .grid-wrap {
  max-height: none !important; min-height: 0 !important; height: auto !important; overflow: visible !important; }
#overlays .thumbnail-item { aspect-ratio: auto !important; height: auto !important; overflow: visible !important; }
#overlays .thumbnail-lg > img { height: auto !important; aspect-ratio: 1 / 1; }
#overlays .caption-label { position: static !important; white-space: normal !important; max-width: 100% !important;
                           overflow: visible !important; text-overflow: clip !important; font-size: 12px;
                           line-height: 1.3; border: none !important; opacity: 1 !important; }
@media (max-width: 640px) { #overlays .grid-container { grid-template-columns: repeat(2, minmax(0, 1fr)) !important; } }
#aucs table { table-layout: auto; }
#aucs td, #aucs th { white-space: normal !important; font-size: 13px; }
@media (max-width: 640px) {  /* a phone: the options are in the captions; the scores keep their columns */
  #aucs th:nth-child(2), #aucs td:nth-child(2), #aucs th:nth-child(6), #aucs td:nth-child(6) { display: none; }
  #aucs td, #aucs th { font-size: 12px; padding: 4px !important; min-width: 0 !important; width: auto !important; }
  #aucs table { width: 100% !important; min-width: 0 !important; }
}
.section-title p { margin: 0; font-size: 1.05em; }
.example-gallery .caption-label { font-size: 11px; max-width: 100% !important; }
.example-gallery .grid-wrap { max-height: none !important; min-height: 0 !important; height: auto !important;
                              overflow: visible !important; }
/* the data-set browser and the review gallery: as many columns as fit (no clipped column), whole labels */
#browse-gallery .grid-container, #review-gallery .grid-container {
  grid-template-columns: repeat(auto-fill, minmax(84px, 1fr)) !important; }
#browse-gallery .grid-wrap, #review-gallery .grid-wrap { padding-top: 36px; }  /* clear of the block's label */
#browse-gallery .thumbnail-item, #review-gallery .thumbnail-item {
  aspect-ratio: auto !important; height: auto !important; overflow: visible !important; }
#browse-gallery .thumbnail-item > img, #review-gallery .thumbnail-item > img { height: auto !important;
  aspect-ratio: 1 / 1; }
#browse-gallery .caption-label, #review-gallery .caption-label { position: static !important;
  white-space: normal !important; max-width: 100% !important; overflow: visible !important;
  text-overflow: clip !important; font-size: 11px; line-height: 1.25; border: none !important;
  opacity: 1 !important; }
.colour-bar { margin: 2px 0 6px; }
.colour-bar-strip { height: 12px; border-radius: 4px; border: 1px solid var(--border-color-primary); }
.colour-bar-labels { display: flex; justify-content: space-between; font-size: 12px;
                     color: var(--body-text-color-subdued); }
"""

INTRO = """# Saliency Lab
Which pixels made the classifier decide, and can we trust that answer? Pick an image and a model, compare
explanation methods side by side, and check them with deletion/insertion curves.
"""


# ================================================================================================
# Explain (each handler: one library call, then pictures and figures for the outputs)
# ================================================================================================
DETAILS = next((METHODS[m].details for m in menus.method_order(list(METHODS)) if METHODS[m].details), "Details")
LIVE = [i for i, (_, option) in enumerate(SLIDERS) if option.live]  # sliders recombined without a model pass


def slider_values(values) -> dict:
    """{option name: value} of the sliders' values (in SLIDERS order)."""
    return {option.name: value for (_, option), value in zip(SLIDERS, values)}


def explain_maps_handler(services):
    @friendly
    def explain_maps(image_path, model_name, methods, target_choice, *rest):
        """Step 1 of an explanation: the top-5 prediction and each chosen method's map (fast; the curves follow
        in `explain_curves`, a separate event, so that under load everyone's maps come first). `rest`: the
        sliders' values (SLIDERS), the opacity, the colour map and the outlined top share (%)."""
        *values, opacity, colormap, outline = rest
        state, image = explain.explain_maps(services, image_path, model_name, methods, target_choice,
                                            slider_values(values), warn=gr.Warning)
        state = explain.set_outline(state, outline)
        message = ("Computing the deletion and insertion curves…" if state["results"]
                   else "No method could explain this model: see the warnings.")
        target_update = gr.update(choices=explain.target_choices(state["prediction"]), value=state["target_choice"])
        return (explain.label_value(state["prediction"]), target_update,
                explain.overlay_pictures(services, state, opacity, colormap, image), figures.empty_figure(message),
                figures.auc_table(state["results"]), explain.status_text(state), state)

    return explain_maps


def explain_curves_handler(services):
    @friendly
    def explain_curves(state, *rest):
        """Step 2: deletion and insertion curves of every map (2 x 21 model passes each), on one set of axes.
        `rest`: the live sliders' values, the opacity and the colour map."""
        *values, opacity, colormap = rest
        if not state or not state.get("results"):
            return (gr.skip(),) * 6
        state, image = explain.explain_curves(services, state)
        diagnostics = explain.head_weights(services, state,
                                           {SLIDERS[i][1].name: v for i, v in zip(LIVE, values)}, image)
        heads = gr.skip() if diagnostics is None else figures.head_weights_figure(diagnostics)
        return (explain.overlay_pictures(services, state, opacity, colormap, image),  # the captions carry the AUCs
                figures.curves_figure(state["results"]), figures.auc_table(state["results"]),
                explain.status_text(state), state, heads)

    return explain_curves


def explain_handler(services):
    maps_fn, curves_fn = explain_maps_handler(services), explain_curves_handler(services)

    @friendly
    def explain_all(image_path, model_name, methods, target_choice, *rest):
        """Both steps in one call (the API form): maps first, then curves."""
        *values, opacity, colormap, _outline = rest
        label, target_update, overlays, figure, table, status, state = maps_fn(
            image_path, model_name, methods, target_choice, *rest)
        yield label, target_update, overlays, figure, table, status, state, gr.skip()
        if state["results"]:
            overlays, figure, table, status, state, heads = curves_fn(state, *[values[i] for i in LIVE], opacity,
                                                                      colormap)
            yield label, gr.skip(), overlays, figure, table, status, state, heads

    return explain_all


def outputs_of(services, state, opacity, colormap, image):
    """(overlays, curves figure, AUC table, status, state) of an updated explanation."""
    return (explain.overlay_pictures(services, state, opacity, colormap, image),
            figures.curves_figure(state["results"]), figures.auc_table(state["results"]),
            explain.status_text(state), state)


def live_change_handler(services, option):
    @friendly
    def on_live(value, state, opacity, colormap):
        """A live option moved (GradSkip's alpha): recombine the cached statistics (no model pass) and redraw."""
        if not any(explain.has_method(state, m) for m in explain.live_methods(option.name)):
            return gr.skip(), gr.skip(), gr.skip()
        state, image = explain.recombine_live(services, state, option.name, value)
        diagnostics = explain.head_weights(services, state, {option.name: value}, image)
        heads = gr.skip() if diagnostics is None else figures.head_weights_figure(diagnostics)
        return explain.overlay_pictures(services, state, opacity, colormap, image), heads, state

    return on_live


def option_release_handler(services, option):
    """A slider released: re-run the methods with this option at its new value, with their curves, keeping the
    other methods. A live option recombines cached statistics: only the curves run."""
    owners = menus.methods_with_option(option.name)

    @friendly
    def on_release(value, state, opacity, colormap):
        chosen = [m for m in owners if explain.has_method(state, m)]
        if not chosen:
            return (gr.skip(),) * 5
        for method in chosen:
            state, image = explain.rerun_method(services, state, method, {option.name: option.cast(value)})
        return outputs_of(services, state, opacity, colormap, image)

    return on_release


def redraw_handler(services):
    @friendly
    def redraw(opacity, colormap, state):
        """Opacity or colour map changed: re-blend the cached maps (no model)."""
        if not state or not state.get("results"):
            return gr.skip()
        return explain.overlay_pictures(services, state, opacity, colormap)

    return redraw


def downloads_handler(services):
    @friendly
    def downloads(state, opacity, colormap, size="original"):
        """Overlay PNGs (the image's original size, or enlarged), curves.csv and report.json for the current
        explanation."""
        paths = explain.write_downloads(services, state, opacity, colormap, size)
        return gr.update(value=[str(p) for p in paths], visible=True)

    return downloads


def model_change_handler(services):
    @friendly
    def on_model(model_name, methods, progress=gr.Progress()):
        """Load the model (hub models download once), then offer the methods that can explain it."""
        if not model_name:
            return (gr.skip(),) * (2 + len(SLIDERS))
        progress(0.1, desc=f"Loading {model_name} (hub models download on first use)…")
        choices, kept, info = explain.model_menu(services, model_name, methods)
        return (gr.update(choices=choices, value=kept), *[gr.update(visible=m in kept) for m, _ in SLIDERS], info)

    return on_model


def shows_details(methods) -> bool:
    """The details panel (GradSkip's head weights and main / skip shares) is shown while a method with details is
    ticked: also for the methods ticked when the page opens, which no change event announces."""
    return any(m in METHODS and bool(METHODS[m].details) for m in methods or [])


def methods_change(methods):
    """Each slider is shown while its method is ticked; the details panel while a method with details is."""
    methods = methods or []
    return (*[gr.update(visible=m in methods) for m, _ in SLIDERS], gr.update(visible=shows_details(methods)))


# ---------------------------------------------------------------- data-set browsing (Explain + Review)
@friendly
def browse(folder, class_filter, page):
    """Thumbnails of one page of a labelled folder, filtered by class; returns (gallery, indices, info, ...)."""
    shown = browse_module.browse(folder, class_filter, page)
    return shown.items, shown.indices, shown.info, gr.update(choices=shown.class_choices), \
        gr.update(maximum=shown.pages, value=shown.page)


@friendly
def browse_pick(folder, index):
    """The image at data-set position `index` (explicit coordinates: the API form of a gallery click)."""
    return browse_module.pick(folder, index)


# ================================================================================================
# The app
# ================================================================================================
def build_app(model_names=None, loader=None, *, default_model=None, data_dir=None, state_dir=None,
              jobs_root=None, weights_dir=None, heavy_concurrency=None, sam_variant="auto",
              decoy_roots=None) -> gr.Blocks:
    """Build the Blocks app. Everything is injectable so tests can use a tiny in-memory model:
    `model_names` (list or callable; default: explainers.models.list_models), `loader` (name -> ModelBundle;
    default: load_model, cached and thread-safe), `data_dir` (a labelled folder for the browser and the review),
    `state_dir` (SQLite files), `jobs_root` (fine-tune jobs), `weights_dir` (fine-tuned models), `decoy_roots`
    (folders that may hold decoy BloodMNIST and its models; default `saliency_lab.browse.decoy_locations()`)."""
    from explainers.models import list_models

    if heavy_concurrency is None:  # one explanation per core (each torch op single-threaded, see configure_torch)
        heavy_concurrency = 2 if DEVICE == "cuda" else max(1, min(4, os.cpu_count() or 1))
    services = Services(loader or default_loader, model_names if model_names is not None else list_models,
                        state_dir or default_state_dir(), jobs_root, sam_variant, weights_dir=weights_dir,
                        parallel=heavy_concurrency, decoy_roots=decoy_roots)
    configure_torch(heavy_concurrency)
    if (services.jobs_root / "jobs.sqlite").exists():  # reconcile the job records with their processes now (a dead
        services.runner()                              # process: interrupted), not when the next job starts
    names = services.names()
    first_model = default_model or menus.default_model(names)
    data_dir = data_dir or browse_module.default_data_dir()
    heavy = dict(concurrency_id="heavy", concurrency_limit=heavy_concurrency)
    light = dict(concurrency_id="light", concurrency_limit=16, show_progress="hidden")
    cell_examples, photo_examples = browse_module.examples_list()
    cell_labels, photo_labels = browse_module.example_labels(cell_examples, photo_examples)
    all_methods = [(menus.method_label(n), n) for n in menus.method_order(list(METHODS)) if not METHODS[n].baseline]
    first_methods = ["aha", "gradcam"]
    try:  # the first model's defaults (its load is shared with every session: load_model caches); the menu
        # itself narrows to the model's methods on page load, while the API accepts any registered method
        first_bundle = services.bundle(first_model)
        first_methods = menus.default_methods(first_bundle)
    except Exception as error:  # noqa: BLE001 - the UI says so when the user picks it
        log.warning("could not load %s at start-up: %s", first_model, error)

    with gr.Blocks(title="Saliency Lab", analytics_enabled=False) as demo:
        demo.services = services
        gr.Markdown(INTRO, elem_id="app-title")
        explain_state = gr.State(None)
        # outside the tabs: a BrowserState inside a tab not yet shown reads as its default at page load, so the
        # saved name never came back after a reload
        reviewer_saved = gr.BrowserState("", storage_key="saliency-lab-reviewer")

        with gr.Tabs() as tabs:
            # ---------------------------------------------------------------------------- Explain
            with gr.Tab("Explain", id="explain") as explain_tab:
                with gr.Row(equal_height=False):
                    with gr.Column(scale=4, min_width=320):
                        image = checked_image(type="filepath", sources=["upload", "clipboard"],
                                              label="Image (transparent parts are composed on white)",
                                         height=300, elem_id="input-image", buttons=["fullscreen"])
                        with gr.Accordion("Examples", open=True):
                            # galleries, not gr.Examples: a thumbnail *and* its class under it (example_labels
                            # would replace the thumbnails by the text)
                            example_galleries = []
                            for paths, labels, title, element in (
                                    (cell_examples, cell_labels, "Blood cells (BloodMNIST test split): click one",
                                     "cell-examples"),
                                    (photo_examples, photo_labels,
                                     "Photos (for the ImageNet model efficientnet-lite0): click one", "photo-examples")):
                                example_galleries.append((paths, gr.Gallery(
                                    list(zip(paths, labels)), label=title, columns=4, height="auto",
                                    allow_preview=False, object_fit="cover", elem_id=element,
                                    elem_classes="example-gallery", buttons=[])))
                        with gr.Accordion("BloodMNIST browser", open=False):
                            browse_folder = dataset_dropdown(data_dir, elem_id="browse-folder")
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
                        model = gr.Dropdown(menus.model_choices(names), value=first_model, allow_custom_value=True,
                                            label="Model",
                                            info="Bundled models first; hub models download once, on first use; "
                                                 "fine-tuned models appear here when a fine-tune finishes, imported ones (Models tab) at once.",
                                            elem_id="model")
                        model_info = gr.Markdown(elem_classes="help")
                        methods = gr.CheckboxGroup(all_methods, value=first_methods,
                                                   label="Methods (pick several to compare them side by side)",
                                                   elem_id="methods")
                        with gr.Row():  # one slider per method option (explainers.methods.Option)
                            sliders = [gr.Slider(o.minimum, o.maximum, value=o.default, step=o.step, label=o.label,
                                                 info=o.info or None, elem_id=o.elem_id or None,
                                                 visible=m in first_methods) for m, o in SLIDERS]
                        explain_button = gr.Button("Explain", variant="primary", size="lg", elem_id="explain-button")
                        expected = gr.Markdown(elem_classes="help", elem_id="expected-time")
                        unfamiliar = gr.Markdown(visible=False, elem_id="unfamiliar-note", elem_classes="warning-note")
                        top5 = gr.Label(num_top_classes=5, label="Prediction (top 5)", elem_id="top5")
                        target = gr.Radio([("Predicted class (top-1)", "auto")], value="auto",
                                          label="Explain which class? (why this class and not that one)",
                                          elem_id="target")
                with gr.Row(equal_height=False):
                    with gr.Column(scale=5, min_width=340):
                        gr.Markdown("**Heatmaps** (bright = important)", elem_classes="section-title")
                        colour_bar = gr.HTML(pictures.colour_bar_html("cividis"), elem_id="colour-bar")
                        overlays = gr.Gallery(show_label=False, label="Heatmaps", columns=3, height="auto",
                                              format="png", object_fit="contain", elem_id="overlays",
                                              buttons=["download", "fullscreen"])
                        with gr.Row():
                            opacity = gr.Slider(0, 1, value=0.55, step=0.05, label="Overlay opacity", scale=3,
                                                elem_id="opacity")
                            colormap = gr.Radio(list(COLORMAPS), value="cividis",
                                                label="Colour map (colour-blind safe)", scale=2)
                        outline = gr.Slider(0, 50, value=0, step=5, label="Outline the top % of each map",
                                            info="the pixels the deletion curve removes first (0: off; no model "
                                                 "pass)", elem_id="outline")
                        status = gr.Markdown(elem_classes="help", elem_id="explain-status")
                    with gr.Column(scale=6, min_width=360):
                        gr.Markdown("**How to read the curves:** " + CURVE_NOTE, elem_classes="note")
                        curves = gr.Plot(label="Deletion and insertion curves", elem_id="curves")
                        aucs = gr.Dataframe(headers=figures.AUC_HEADERS, label="Scores", interactive=False,
                                            elem_id="aucs", wrap=True)
                with gr.Accordion(DETAILS, open=False, visible=shows_details(first_methods),
                                  elem_id="method-details") as heads_box:
                    heads = gr.Plot(label="Head weights")
                with gr.Row():
                    with gr.Column(scale=1, min_width=260):
                        download_size = gr.Radio(explain.download_choices(), value="original",
                                                 label="Overlay PNGs for download", elem_id="download-size")
                        download_button = gr.Button("Prepare downloads (PNG overlays, curves CSV, JSON report)",
                                                    elem_id="download-button")
                    files = gr.File(label="Downloads", file_count="multiple", elem_id="downloads", visible=False)

            # ---------------------------------------------------------------------------- Masks & fine-tune
            with gr.Tab("Masks & fine-tune", id="masks") as masks_tab:
                masks_parts = build_masks_tab(services, names, first_model, image, heavy, light)

            # ---------------------------------------------------------------------------- Review
            with gr.Tab("Review", id="review") as review_tab:
                reviewer, review_model, review_folder = build_review_tab(services, names, first_model, data_dir,
                                                                         reviewer_saved, heavy, light)
                study_parts = build_study_panel(services, names, first_model, heavy, light)

            # ---------------------------------------------------------------------------- Learn
            with gr.Tab("Learn", id="learn") as learn_tab:
                sanity_model = build_learn_tab(services, names, first_model, image, heavy, light)

            # ---------------------------------------------------------------------------- Models
            with gr.Tab("Models", id="models") as models_tab_ui:
                models_parts = build_models_tab(services, heavy, light)

        # ------------------------------------------------------------------ Explain wiring
        explain_inputs = [image, model, methods, target, *sliders, opacity, colormap, outline]
        expected_inputs = [model, methods, *sliders]
        show_expected = friendly(lambda m, chosen, *values: explain.expected_text(services, m, chosen,
                                                                                 slider_values(values)))
        after_run = dict(api_visibility="private", **light)  # a run's measured time is the next expected time
        maps_outputs = [top5, target, overlays, curves, aucs, status, explain_state]
        curves_inputs = [explain_state, *[sliders[i] for i in LIVE], opacity, colormap]
        curves_outputs = [overlays, curves, aucs, status, explain_state, heads]
        maps_fn, curves_fn = explain_maps_handler(services), explain_curves_handler(services)
        curves_group = dict(concurrency_id="curves", concurrency_limit=heavy_concurrency)
        # the API form: both steps in one call (a hidden trigger, same inputs as the Explain button)
        explain_all = gr.Button(visible=False)
        explain_all.click(explain_handler(services), explain_inputs, maps_outputs + [heads], api_name="explain",
                          **heavy)
        # one place shows progress and errors (the heatmaps, then the curves), not a red pill on every panel
        # elapsed time only: Gradio's ETA is the average of earlier runs of any model and method ("1.2/0.2s");
        # the expected time of each method on this model is shown before it runs (#expected-time)
        curves_group.update(show_progress_on=[curves], show_progress="minimal")
        on_maps = dict(heavy, show_progress_on=[overlays], show_progress="minimal")
        explain_button.click(maps_fn, explain_inputs, maps_outputs, api_name="explain_maps", **on_maps).success(
            curves_fn, curves_inputs, curves_outputs, api_name="explain_curves", **curves_group).success(
            show_expected, expected_inputs, expected, **after_run)
        target.input(maps_fn, explain_inputs, maps_outputs, api_name="explain_target", **on_maps).success(
            curves_fn, curves_inputs, curves_outputs, api_visibility="private", **curves_group).success(
            show_expected, expected_inputs, expected, **after_run)

        def cleared(message):
            return None, gr.update(choices=[("Predicted class (top-1)", "auto")], value="auto"), [], \
                figures.empty_figure(message), [], "", None

        @friendly
        def new_image(image_path, model_name, chosen, _target, *rest):
            """A new image: reset the target to the top-1 class and explain at once. An upload that a browser
            would not show as the model reads it (16-bit, CMYK, alpha, TIFF, EXIF rotation...) is first replaced
            by the normalised picture (its change explains it): one image for preview, model and overlays."""
            if not image_path:
                return gr.skip(), *cleared("Pick an image to see its curves.")
            shown, note = explain.shown_image(services, image_path)
            if shown != str(image_path):
                if note:
                    gr.Info(note, duration=6)
                return shown, *cleared("Explaining the normalised picture…")
            return gr.skip(), *maps_fn(image_path, model_name, chosen, "auto", *rest)

        def example_picker(paths):
            def pick_example(evt: gr.SelectData):
                return paths[evt.index]
            return pick_example

        for paths, gallery in example_galleries:
            gallery.select(example_picker(paths), None, image, api_visibility="private", queue=False)
        image.change(new_image, explain_inputs, [image, *maps_outputs], api_name="explain_new_image",
                     **on_maps).success(
            curves_fn, curves_inputs, curves_outputs, api_visibility="private", **curves_group).success(
            show_expected, expected_inputs, expected, **after_run)

        model.change(model_change_handler(services), [model, methods], [methods, *sliders, model_info],
                     api_name="select_model", **heavy)
        methods.change(methods_change, methods, [*sliders, heads_box], api_visibility="private",
                       show_progress="hidden", queue=False)
        # shown when the page opens; the model and a slider that costs model passes (AHA's refinement steps)
        # change it too
        expected_triggers = [demo.load, model.change, methods.change] + [
            slider.release for slider, (_, option) in zip(sliders, SLIDERS) if not option.live]
        gr.on(expected_triggers, show_expected, expected_inputs, expected, api_name="expected_time", **light)
        for slider, (_, option) in zip(sliders, SLIDERS):
            previews = []
            if option.live:  # recombined while it moves (no model pass); the curves when it is released
                previews.append(slider.change(live_change_handler(services, option),
                                              [slider, explain_state, opacity, colormap], [overlays, heads, explain_state],
                                              api_name=option.preview_api_name or None, **light))
            # a preview still waiting when the slider is released is superseded: were it to run after the release's
            # result, it would put back a caption without curves (and a state without them)
            released = slider.release(option_release_handler(services, option), [slider, explain_state, opacity,
                                      colormap], [overlays, curves, aucs, status, explain_state],
                                      api_name=option.api_name or None, trigger_mode="always_last", cancels=previews,
                                      **heavy)
            if not option.live:  # it ran the method again: its measured time is the next expected one
                released.success(show_expected, expected_inputs, expected, **after_run)
        gr.on([opacity.change, colormap.change], redraw_handler(services), [opacity, colormap, explain_state],
              overlays, api_name="redraw", **light)
        colormap.change(pictures.colour_bar_html, colormap, colour_bar, api_visibility="private", queue=False)

        @friendly
        def on_outline(percent, state, opacity_value, colormap_value):
            """The outlined top share changed: redraw the cached maps with it (no model pass)."""
            if not state or not state.get("results"):
                return gr.skip(), gr.skip()
            state = explain.set_outline(state, percent)
            return explain.overlay_pictures(services, state, opacity_value, colormap_value), state

        outline.change(on_outline, [outline, explain_state, opacity, colormap], [overlays, explain_state],
                       api_name="outline", **light)
        download_button.click(downloads_handler(services), [explain_state, opacity, colormap, download_size], files,
                              api_name="downloads", **light)
        # the size choice names the explained image's pixels (original, enlarged)
        explain_state.change(lambda s: gr.update(choices=explain.download_choices(s)), explain_state, download_size,
                             api_visibility="private", queue=False, show_progress="hidden")
        # an image unlike the model's training images: said above the prediction for as long as it is explained
        def show_unfamiliar(state):
            note = explain.unfamiliar_note(state)
            return gr.update(value=note, visible=bool(note))

        explain_state.change(show_unfamiliar, explain_state, unfamiliar, api_visibility="private", queue=False,
                             show_progress="hidden")

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

        browse_gallery.select(on_browse_select, browse_indices, browse_index, api_visibility="private",
                              queue=False).then(
            browse_pick, [browse_folder, browse_index], image, api_name="browse_select", api_visibility="private")
        browse_open.click(browse_pick, [browse_folder, browse_index], image, api_name="browse_pick")

        demo.load(model_change_handler(services), [model, methods], [methods, *sliders, model_info],
                  api_visibility="private")
        # A BrowserState inside a tab the page does not open first is mounted late (tabs render lazily), so the
        # load below would read nothing: both reviewer names live at the top of the page (the review list's is
        # made there; the study panel's is rendered here).
        study_parts["saved"].render()
        demo.load(lambda saved: saved or gr.skip(), reviewer_saved, reviewer, api_visibility="private", queue=False)
        demo.load(lambda saved: saved or gr.skip(), study_parts["saved"], study_parts["reviewer"], api_visibility="private",
                  queue=False)
        demo.load(study_parts["methods_for"], study_parts["model"], study_parts["methods"], api_visibility="private",
                  **light)
        demo.load(lambda: gr.update(choices=review_data.named_datasets()), None, study_parts["dataset"],
                  api_visibility="private", queue=False)
        demo.load(lambda: [gr.update(choices=browse_module.dataset_menu(data_dir)[0])] * 2, None,
                  [browse_folder, review_folder], api_visibility="private", queue=False)  # new uploads, too
        demo.load(masks_parts["labels_for"], masks_parts["base_model"], masks_parts["mask_label"],
                  api_visibility="private", **light)
        demo.load(masks_parts["data_choices"], None, masks_parts["train_data"], api_visibility="private", queue=False)
        demo.load(masks_parts["list_jobs"], None, masks_parts["jobs_outputs"], api_visibility="private", **light)

        model_dropdowns = [model, masks_parts["base_model"], review_model, sanity_model]

        def refresh_models():
            """Fine-tuned models appear in every model picker (the current choices are kept)."""
            choices = menus.model_choices(services.names())
            return [gr.update(choices=finetune.finetune_models(services) if dropdown is masks_parts["base_model"]
                              else choices) for dropdown in model_dropdowns] + [masks_parts["data_choices"]()]

        for tab in (explain_tab, masks_tab, review_tab, learn_tab):
            tab.select(refresh_models, None, [*model_dropdowns, masks_parts["train_data"]], api_visibility="private",
                       queue=False)
        demo.refresh_models = refresh_models
        for event in models_parts["changed"]:  # an import or a removal: every model picker follows
            event.success(refresh_models, None, [*model_dropdowns, masks_parts["train_data"]],
                          api_visibility="private", queue=False)
        models_tab_ui.select(models_parts["refresh"], None, models_parts["refresh_outputs"], api_visibility="private",
                             queue=False)

        def on_unload(request: gr.Request):
            services.forget_session(request.session_hash)

        demo.unload(on_unload)
    return demo




# ------------------------------------------------------------------------------------------------ Masks tab
def build_masks_tab(services, names, first_model, explain_image, heavy, light):
    gr.Markdown("### 1 · Mark where the model *should* look\n"
                "Paint over the relevant region and press *Use my drawing*, **or** let SAM find it: click object / "
                "background points on the right, or **drag a box**: paint a rough stroke around (or over) the "
                "object in the editor and press *Box from my stroke → SAM* (two *Box corner* clicks work too). "
                "Then add the image, its mask and its class to a mask set.", elem_classes="help")
    sam_points = gr.State(masks.empty_prompts())
    current_mask = gr.State(None)
    sam_clean = gr.State(None)  # the image SAM sees (small images enlarged so they can be clicked)
    sam_original = gr.State(None)  # the image as loaded: masks are stored at this size
    with gr.Row(equal_height=False):
        with gr.Column(scale=1):
            editor = gr.ImageMask(label="Paint a mask (or a stroke for a box)",
                                  type="numpy", sources=["upload", "clipboard"], format="png", height=340,
                                  elem_id="mask-editor", layers=False,
                                  brush=gr.Brush(colors=["#0072B2"], color_mode="fixed", default_size=12))
            with gr.Row():
                use_explain = gr.Button("Use the image from the Explain tab", size="sm")
                draw_preview = gr.Button("Use my drawing", variant="secondary", size="sm", elem_id="use-drawing")
                stroke_box = gr.Button("Box from my stroke → SAM", variant="secondary", size="sm",
                                       elem_id="stroke-box")
        with gr.Column(scale=1):
            sam_view = gr.Image(label="Click for SAM: points or box corners", type="numpy", interactive=False,
                                format="png", height=340, elem_id="sam-view")
            with gr.Row():
                click_mode = gr.Radio([("Object point", "object"), ("Background point", "background"),
                                       ("Box corner (two clicks)", "box")], value="object", label="A click adds",
                                      scale=3)
                clear_points = gr.Button("Clear clicks", size="sm", scale=1)
            segmenter_info = gr.Markdown(elem_classes="help", elem_id="segmenter-info")
    mask_preview = gr.Image(label="Mask preview", type="pil", interactive=False, format="png", height=260,
                            elem_id="mask-preview")
    with gr.Row():
        set_name = gr.Textbox("my-masks", label="Mask set name", scale=2, elem_id="set-name")
        mask_label = gr.Dropdown(masks.label_choices(services, first_model), label="Class label of this image",
                                 scale=2, elem_id="mask-label", allow_custom_value=True)
        add_button = gr.Button("Add to mask set", variant="primary", scale=1, elem_id="add-mask")
    set_info = gr.Markdown(elem_classes="help", elem_id="set-info")
    set_gallery = gr.Gallery(label="Mask set (image with mask)", columns=10, height=170, format="png",
                             allow_preview=False, object_fit="contain", fit_columns=False)

    gr.Markdown("### 2 · Fine-tune with CAMAL\nCAMAL fine-tunes the classifier so its class activation map stays "
                "inside the masks (loss = cross-entropy + λ × (mean CAM outside − mean CAM inside), both averaged "
                "over the batch: λ is per image).",
                elem_classes="help")
    with gr.Row():
        tunable = finetune.finetune_models(services)
        base_model = gr.Dropdown(tunable, value=first_model if first_model in [n for _, n in tunable] else
                                 (tunable[0][1] if tunable else None), allow_custom_value=True,
                                 label="Model to fine-tune", info="Only models a fine-tune job can load.", scale=2)
        train_data = gr.Dropdown([], label="Training masks", scale=2, elem_id="train-data",
                                 allow_custom_value=not browse_module.on_space(),  # typed "path:..." off a Space
                                 info="Your mask sets, the decoy BloodMNIST set, or BCCD boxes when present.")
        refresh_data = gr.Button("↻ Refresh the list", size="sm", scale=0, min_width=120, elem_id="refresh-data")
    with gr.Row():
        epochs = gr.Slider(1, 30, value=3, step=1, label="Epochs")
        lam = gr.Slider(0, 64, value=16.0, step=0.5, label="λ (weight of the mask loss, per image)",
                        info="16: tuned on decoy BloodMNIST val; 0 = plain fine-tuning.")
        backend = gr.Radio([("This machine", "local"), ("HuggingFace Jobs (needs HF_TOKEN)", "hf-jobs")],
                           value="local", label="Run on")
    launch, cancel, job_id, job_status, job_progress, job_plot = job_controls(
        "Start fine-tune", "Loss and IoU", start_id="start-finetune", cancel_id="cancel-finetune",
        status_id="job-status", progress_id="job-progress")
    before_after = gr.Gallery(label="Before / after (CAM over the image)", columns=1, format="png", height="auto",
                              object_fit="contain", elem_id="before-after")
    compare_table = gr.Dataframe(headers=["", "before", "after"], label="Before / after", interactive=False)
    timer = gr.Timer(1.0, active=False)
    with gr.Accordion("Jobs on this server (also those from before a restart)", open=False):
        jobs_table = gr.Dataframe(headers=finetune.JOB_HEADERS, interactive=False, elem_id="jobs-table",
                                  wrap=True)
        with gr.Row():
            job_pick = gr.Dropdown([], label="Job", scale=3, elem_id="job-pick")
            refresh_jobs = gr.Button("Refresh the list", size="sm", scale=1)
            resume_button = gr.Button("Resume (interrupted, failed, cancelled)", size="sm", scale=1,
                                      elem_id="resume-job")
            open_result = gr.Button("Open (progress or result)", size="sm", scale=1, elem_id="open-job")

    # ---- the image: from the Explain tab or uploaded into the editor (the SAM view shows an enlarged copy)
    def load_from_explain(path):
        picture, view = masks.load_picture(path)
        return picture, view, masks.empty_prompts(), None, None, view, picture

    use_explain.click(friendly(load_from_explain), explain_image, [editor, sam_view, sam_points, current_mask,
                                                                 mask_preview, sam_clean, sam_original],
                      api_name="mask_use_explain_image", **light)

    def editor_upload(value):
        loaded = masks.editor_picture(value)
        if loaded is None:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        rgb, view = loaded
        return view, masks.empty_prompts(), None, view, rgb

    editor.upload(friendly(editor_upload), editor, [sam_view, sam_points, current_mask, sam_clean, sam_original],
                  api_name="mask_editor_upload", **light)

    draw_preview.click(friendly(masks.drawn_mask), editor, [mask_preview, current_mask, segmenter_info],
                       api_name="mask_from_drawing", **light)

    # ---- SAM prompts: every form ends in masks.PromptView -> the same five outputs
    sam_outputs = [sam_view, sam_points, mask_preview, current_mask, segmenter_info]

    def shown(result):
        return result.view, result.prompts, or_skip(result.preview), or_skip(result.mask_state), result.note

    @friendly
    def on_sam_select(clean, original, prompts, mode, request: gr.Request, evt: gr.SelectData):
        x, y = evt.index
        return shown(masks.click(services, clean, prompts, mode, x, y, request.session_hash, original))

    sam_view.select(on_sam_select, [sam_clean, sam_original, sam_points, click_mode], sam_outputs,
                    api_visibility="private", **heavy)

    # explicit-coordinate endpoints: the same logic as a click or a drag, callable from gradio_client
    click_x, click_y = gr.Number(visible=False), gr.Number(visible=False)
    click_button = gr.Button(visible=False)

    @friendly
    def on_click_api(clean, original, prompts, mode, x, y, request: gr.Request):
        """A click at (x, y) in the pixel grid of the image shown for SAM (the API form of a click)."""
        return shown(masks.click(services, clean, prompts, mode, x, y, request.session_hash, original))

    click_button.click(on_click_api, [sam_clean, sam_original, sam_points, click_mode, click_x, click_y], sam_outputs,
                       api_name="sam_click", **heavy)

    box_numbers = [gr.Number(visible=False) for _ in range(4)]
    box_button = gr.Button(visible=False)

    @friendly
    def on_box_api(clean, original, prompts, x0, y0, x1, y1, request: gr.Request):
        """A box [x0, y0, x1, y1] in the pixel grid of the image shown for SAM (the API form of a drag), with
        the clicked points."""
        return shown(masks.box_prompt(services, clean, prompts, [x0, y0, x1, y1], request.session_hash, original))

    box_button.click(on_box_api, [sam_clean, sam_original, sam_points, *box_numbers], sam_outputs, api_name="sam_box",
                     **heavy)

    @friendly
    def on_stroke_box(value, clean, original, prompts, request: gr.Request):
        """The drag form of a box: the bounding box of the stroke painted in the editor, then SAM."""
        return shown(masks.stroke_box_prompt(services, value, clean, prompts, request.session_hash, original))

    stroke_box.click(on_stroke_box, [editor, sam_clean, sam_original, sam_points], sam_outputs,
                     api_name="sam_box_from_stroke", **heavy)

    def clear(clean):
        return clean, masks.empty_prompts(), None, None, ""

    clear_points.click(clear, sam_clean, sam_outputs, api_name="sam_clear", queue=False)

    # ---- mask sets
    def set_view(name):
        return masks.mask_set_view(services.store, name)

    @friendly
    def add_to_set(name, label, mask_state):
        entry = masks.add_to_mask_set(services.store, name, label, mask_state)
        gr.Info(f"Added to '{name}' (entry {entry}).", duration=3)
        return set_view(name)

    add_button.click(add_to_set, [set_name, mask_label, current_mask], [set_gallery, set_info], api_name="add_mask",
                     **light).success(lambda: data_choices(), None, train_data, api_visibility="private", queue=False)
    set_name.submit(friendly(set_view), set_name, [set_gallery, set_info], api_visibility="private", **light)

    @friendly
    def labels_for(model_name):
        if not model_name:
            return gr.skip()
        return gr.update(choices=masks.label_choices(services, model_name), value=None)

    base_model.change(labels_for, base_model, mask_label, api_visibility="private", **light)

    # ---- fine-tune
    def data_choices():
        choices = finetune.data_choices(services)
        return gr.update(choices=choices, value=choices[0][1] if choices else None)

    refresh_data.click(data_choices, None, train_data, api_visibility="private", queue=False)

    @friendly
    def start(model_name, data_choice, n_epochs, lam_value, backend_name):
        new_id, message = finetune.start_finetune(services, model_name, data_choice, n_epochs, lam_value, backend_name,
                                            on_build=gr.Info)
        return new_id, message, gr.update(active=True), 0

    launch.click(start, [base_model, train_data, epochs, lam, backend], [job_id, job_status, timer, job_progress],
                 api_name="start_finetune", **light)

    @friendly
    def poll(current):
        if not current:
            return gr.skip(), gr.skip(), gr.skip(), gr.update(active=False), gr.skip(), gr.skip(), gr.skip()
        report = finetune.job_report(services, current)
        if not report.finished:
            return report.text, report.percent, report.figure, gr.skip(), gr.skip(), gr.skip(), gr.skip()
        models = gr.update(choices=finetune.finetune_models(services)) if report.new_model else gr.skip()
        return report.text, report.percent, report.figure, gr.update(active=False), report.gallery, report.table, \
            models

    timer.tick(poll, job_id, [job_status, job_progress, job_plot, timer, before_after, compare_table, base_model],
               api_name="finetune_status", concurrency_id="poll", concurrency_limit=32, show_progress="hidden")
    cancel.click(friendly(lambda current: finetune.cancel_finetune(services, current)), job_id, job_status,
                 api_name="cancel_finetune", queue=False)

    # ---- the job list: state, progress, model, times, error; resume interrupted jobs, open finished ones
    @friendly
    def list_jobs():
        return finetune.job_rows(services), gr.update(choices=finetune.job_choices(services))

    refresh_jobs.click(list_jobs, None, [jobs_table, job_pick], api_name="jobs_list", **light)

    @friendly
    def follow(chosen):
        """Follow a job in the panel above: the timer polls it (progress, then its before/after result)."""
        return chosen, finetune.open_job(services, chosen), gr.update(active=True)

    @friendly
    def resume(chosen):
        message = finetune.resume_job(services, chosen)
        return chosen, message, gr.update(active=True)

    open_result.click(follow, job_pick, [job_id, job_status, timer], api_name="open_job", **light)
    resume_button.click(resume, job_pick, [job_id, job_status, timer], api_name="resume_job", **light).then(
        list_jobs, None, [jobs_table, job_pick], api_visibility="private", **light)
    return {"data_choices": data_choices, "train_data": train_data, "base_model": base_model,
            "labels_for": labels_for, "mask_label": mask_label, "list_jobs": list_jobs,
            "jobs_outputs": [jobs_table, job_pick]}


def job_controls(start_label, plot_label, *, start_id, cancel_id, status_id, progress_id, plot_id=None):
    """The controls every job form has (CAMAL fine-tune, AHA training): Start / Cancel, the job id, a status
    line, a progress number and a live plot."""
    with gr.Row():
        start = gr.Button(start_label, variant="primary", elem_id=start_id)
        cancel = gr.Button("Cancel", variant="stop", elem_id=cancel_id)
    job = gr.State(None)
    status = gr.Markdown(elem_id=status_id)
    progress = gr.Number(0, label="Progress (%)", precision=0, interactive=False, elem_id=progress_id)
    plot = gr.Plot(label=plot_label, elem_id=plot_id)
    return start, cancel, job, status, progress, plot


# ------------------------------------------------------------------------------------------------ Review tab
def build_review_tab(services, names, first_model, data_dir, reviewer_saved, heavy, light):
    gr.Markdown("Review explanations image by image. Verdicts and notes are saved **the moment you make them** "
                "(SQLite on the server): a refresh or a crash loses nothing.", elem_classes="help")
    review_state = gr.State(None)
    with gr.Row():
        folder = dataset_dropdown(data_dir, scale=4, elem_id="review-folder")
        review_model = gr.Dropdown(menus.model_choices(names), value=first_model, allow_custom_value=True, label="Model",
                                   scale=2)
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
            with gr.Row(elem_classes="verdict-row"):  # the saved verdict's button is the primary one
                plausible, implausible, unsure = (gr.Button(v.capitalize(), variant="secondary",
                                                            elem_id=f"verdict-{v}") for v in review.VERDICTS)
            note = gr.Textbox(label="Note (saved as you type)", lines=4, elem_id="review-note")
            saved = gr.Markdown(elem_classes="help", elem_id="review-saved")
            with gr.Row():
                previous = gr.Button("← Previous", elem_id="review-previous")
                following = gr.Button("Next →", elem_id="review-next")
            export = gr.Button("Export verdicts (CSV)")
            export_file = gr.File(label="Verdicts CSV")
    position = gr.Number(visible=False, precision=0)
    open_button = gr.Button(visible=False)

    def page_outputs(shown):
        return shown.items, shown.state, shown.progress, gr.update(maximum=shown.pages, value=shown.page)

    @friendly
    def load(folder_path, model_name, n_images, class_value, correct_value, name, progress=gr.Progress()):
        state, warning = review.load_review(
            services, folder_path, model_name, n_images,
            progress=lambda done, total: progress(done / total if total else 0, desc=f"Predicting {total} images…"))
        if warning:
            gr.Warning(warning)
        shown = review.filter_page(services, state, class_value, correct_value, 1, name)
        return (*page_outputs(shown), gr.update(choices=browse_module.class_filter_choices(state["names"])))

    gallery_outputs = [gallery, review_state, progress_md, page]
    load_button.click(load, [folder, review_model, limit, class_filter, correctness, reviewer],
                      [*gallery_outputs, class_filter], api_name="review_load", **heavy)

    @friendly
    def refilter(state, class_value, correct_value, page_value, name):
        return page_outputs(review.filter_page(services, state, class_value, correct_value, page_value, name))

    gr.on([class_filter.input, correctness.input], lambda s, c, k, n: refilter(s, c, k, 1, n),
          [review_state, class_filter, correctness, reviewer], gallery_outputs, api_visibility="private", **light)
    page.submit(refilter, [review_state, class_filter, correctness, page, reviewer], gallery_outputs,
                api_name="review_page", **light)

    @friendly
    def open_item(state, index, name):
        """Open the image at position `index` of the filtered list (explicit coordinates)."""
        item = review.open_item(services, state, index, name)
        return item.items, item.info, item.note, item.saved, item.state, item.index

    open_outputs = [maps, item_info, note, saved, review_state, position]

    def on_select(state, name, evt: gr.SelectData):
        return open_item(state, (state or {}).get("page_start", 0) + evt.index, name)

    verdict_buttons = [plausible, implausible, unsure]

    def show_verdict(state, name):
        """The saved verdict of the opened image, shown as the selected (primary) button."""
        variants = review.verdict_variants(review.current_verdict(services, state, name))
        return [gr.update(variant=v) for v in variants]

    selected = dict(api_visibility="private", queue=False, show_progress="hidden")
    opened = [gallery.select(on_select, [review_state, reviewer], open_outputs, api_visibility="private", **heavy),
              open_button.click(open_item, [review_state, position, reviewer], open_outputs, api_name="review_open",
                                **heavy),
              previous.click(friendly(lambda s, n: open_item(s, review.neighbour_index(s, -1), n)),
                             [review_state, reviewer], open_outputs, api_name="review_previous", **heavy),
              following.click(friendly(lambda s, n: open_item(s, review.neighbour_index(s, 1), n)),
                              [review_state, reviewer], open_outputs, api_name="review_next", **heavy)]
    for event in opened:
        event.then(show_verdict, [review_state, reviewer], verdict_buttons, **selected)

    def verdict_fn(verdict):
        @friendly
        def record(state, name, text):
            return review.record_verdict(services, state, name, verdict, text)
        return record

    for button, verdict in zip(verdict_buttons, review.VERDICTS):
        button.click(verdict_fn(verdict), [review_state, reviewer, note], [saved, progress_md],
                     api_name=f"verdict_{verdict}", **light).then(show_verdict, [review_state, reviewer],
                                                                 verdict_buttons, **selected)

    @friendly
    def save_note(state, name, text):
        return or_skip(review.save_note(services, state, name, text))

    note.input(save_note, [review_state, reviewer, note], saved, api_name="review_note", trigger_mode="always_last",
               **light)
    note.blur(save_note, [review_state, reviewer, note], saved, api_visibility="private", **light)  # pastes, too

    @friendly
    def export_csv(state, name):
        return review.export_verdicts(services, state)

    export.click(export_csv, [review_state, reviewer], export_file, api_name="review_export", **light)

    # the reviewer's name survives a refresh (browser local storage)
    reviewer.change(lambda n: n, reviewer, reviewer_saved, api_visibility="private", queue=False)
    return reviewer, review_model, folder


# ------------------------------------------------------------------------------------------------ Review studies
MAX_SLOTS = 8  # maps A..H in a blinded study


def build_study_panel(services, names, first_model, heavy, light):
    """Review studies: data sets in (named or uploaded), a study created with its code, reviewing under a name
    (open verdicts or blinded 1-5 ratings of maps A, B, C...), results and exports. The reviewer's name
    is kept in browser storage; returns the parts that build_app wires on page load."""
    gr.Markdown("## Review studies\nSeveral reviewers, open verdicts or a **blinded comparison** (maps shown as A, B, "
                "C… in a random order, rated 1-5), agreement statistics. A study is opened with its name and the "
                "**study code** shown once to its creator.", elem_classes="help")
    study_state = gr.State(None)
    study_reviewer_saved = gr.BrowserState("", storage_key="saliency-lab-study-reviewer", render=False)  # build_app
    with gr.Accordion("1 · Data set: pick one or upload", open=False):
        with gr.Row():
            upload_files = gr.File(label="A zip with labels.csv (file,class_index), a MedMNIST .npz, or images "
                                         "(no labels: predictions only)", file_count="multiple", scale=3,
                                   elem_id="study-upload")
            upload_folder = gr.File(label="…or a whole folder (images, with its labels.csv if it has one)",
                                    file_count="directory", scale=2, elem_id="study-upload-folder")
            with gr.Column(scale=2):
                upload_name = gr.Textbox(label="Name of the data set", placeholder="e.g. ward-7-smears",
                                         elem_id="study-upload-name")
                upload_button = gr.Button("Upload and check", elem_id="study-upload-button")
        upload_info = gr.Markdown(elem_classes="help", elem_id="study-upload-info")
    with gr.Accordion("2 · Create a study", open=False):
        with gr.Row():
            study_new_name = gr.Textbox(label="Study name", placeholder="e.g. cells-2026-blinded", elem_id="study-new-name")
            study_dataset = gr.Dropdown(review_data.named_datasets(), label="Data set", allow_custom_value=True,
                                        elem_id="study-dataset")  # uploads join the list; the name is checked
            study_model = gr.Dropdown(menus.model_choices(names), value=first_model, label="Model", elem_id="study-model")
        with gr.Row():
            study_methods = gr.CheckboxGroup(  # every method (the API may name any); narrowed to the model on load
                [(menus.method_label(n), n) for n in menus.method_order(list(METHODS)) if not METHODS[n].baseline],
                label="Methods to show", elem_id="study-methods")
            study_protocol = gr.Radio([("Open: verdict + note", "open"), ("Blinded comparison: maps A, B, C… rated 1-5",
                                                                           "blinded")], value="blinded",
                                      label="Protocol", elem_id="study-protocol")
        with gr.Row():
            study_reviewers = gr.Textbox(label="Reviewers (comma-separated; empty: anyone with the code)",
                                         placeholder="dr-lee, dr-okafor", elem_id="study-reviewers")
            study_count = gr.Slider(2, 500, value=30, step=1, label="Images (spread over the data set)",
                                    elem_id="study-count")
            study_create = gr.Button("Create study", variant="primary", elem_id="study-create")
        study_created = gr.Markdown(elem_id="study-created")
    with gr.Accordion("3 · Review", open=True):
        with gr.Row():
            study_name = gr.Textbox(label="Study name", elem_id="study-name")
            study_code = gr.Textbox(label="Study code", type="password", elem_id="study-code")
            study_reviewer = gr.Textbox(label="Your name (reviewer)", elem_id="study-reviewer")
            study_open = gr.Button("Open study", variant="primary", elem_id="study-open")
        study_progress = gr.Markdown(elem_id="study-progress")
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                study_maps = gr.Gallery(label="Image and maps", columns=5, height=280, format="png",
                                        allow_preview=True, elem_id="study-maps")
                study_info = gr.Markdown(elem_id="study-info")
            with gr.Column(scale=2):
                with gr.Row(elem_classes="verdict-row", visible=False) as verdict_row:
                    verdict_buttons = [gr.Button(v.capitalize(), elem_id=f"study-verdict-{v}")
                                       for v in ("plausible", "implausible", "unsure")]
                ratings = [gr.Radio([str(v) for v in studies.RATING_VALUES], label=f"Map {slot}", visible=False,
                                    elem_id=f"study-rate-{slot}") for slot in SLOTS[:MAX_SLOTS]]
                best = gr.Radio([], label="Best map (optional)", visible=False, elem_id="study-best")
                study_note = gr.Textbox(label="Note (saved as you type)", lines=3, elem_id="study-note")
                study_saved = gr.Markdown(elem_classes="help", elem_id="study-saved")
                with gr.Row():
                    study_previous = gr.Button("← Previous", elem_id="study-previous")
                    study_next = gr.Button("Next →", elem_id="study-next")
                    study_next_open = gr.Button("Next to do", elem_id="study-next-open")
    with gr.Accordion("4 · Results (reveals the method names)", open=False):
        with gr.Row():
            results_button = gr.Button("Show results", elem_id="study-results-button")
            export_csv = gr.Button("Export responses (CSV)", elem_id="study-export-csv")
            export_json = gr.Button("Export report (JSON)", elem_id="study-export-json")
        results_md = gr.Markdown(elem_id="study-results")
        with gr.Row():
            ratings_plot = gr.Plot(label="Ratings per method", elem_id="study-ratings-plot")
            kappa_plot = gr.Plot(label="Agreement between reviewers", elem_id="study-kappa-plot")
        export_file = gr.File(label="Export", elem_id="study-export")
        report_json = gr.JSON(label="Report", visible=False)
    hidden_position = gr.Number(visible=False, precision=0)
    hidden_slot = gr.Textbox(visible=False)
    hidden_rating = gr.Number(visible=False, precision=0)
    hidden_verdict = gr.Textbox(visible=False)
    show_button, rate_button, best_button, verdict_button = (gr.Button(visible=False) for _ in range(4))

    # ---- data in
    @friendly
    def upload(files, name, folder=None):
        result = review_data.import_upload(list(files or []) + list(folder or []), name)
        return result.message(), gr.update(choices=review_data.named_datasets(), value=result.name)

    upload_button.click(upload, [upload_files, upload_name, upload_folder], [upload_info, study_dataset],
                        api_name="review_upload", **light)

    # ---- create
    def methods_for(model_name):
        try:
            choices = studies.study_method_choices(services.bundle(model_name))
        except Exception:  # noqa: BLE001 - the create button says why
            return gr.update(choices=[], value=[])
        return gr.update(choices=choices, value=[v for _, v in choices][:3])

    study_model.change(methods_for, study_model, study_methods, api_visibility="private", **light)

    @friendly
    def create(name, dataset_name, model_name, methods, reviewers, protocol, count, progress=gr.Progress()):
        _, _, text = studies.create_study(
            services, name, dataset_name, model_name, methods, reviewers, protocol, count,
            progress=lambda done, total: progress(done / total if total else 0, desc=f"Predicting {total} images…"))
        return text, name

    study_create.click(create, [study_new_name, study_dataset, study_model, study_methods, study_reviewers,
                                study_protocol, study_count], [study_created, study_name],
                       api_name="review_study_create", **heavy)

    # ---- review
    item_outputs = [study_maps, study_info, study_note, study_saved, study_progress, study_state, verdict_row,
                    *ratings, best]

    def item_updates(shown):
        blinded = shown.state["protocol"] == "blinded"
        response = shown.response
        rating_updates = []
        for k, slot in enumerate(SLOTS[:MAX_SLOTS]):
            visible = blinded and slot in shown.slots
            value = response["ratings"].get(slot)
            rating_updates.append(gr.update(visible=visible, value=None if value is None else str(value)))
        best_update = gr.update(visible=blinded, choices=[("none", "none")] + [(f"Map {s}", s) for s in shown.slots],
                                value=response["best"] or "none")
        saved_line = ("Saved verdict: **%s**." % response["verdict"]) if response.get("verdict") else ""
        return (shown.items, shown.info, response["note"], saved_line, shown.progress, shown.state,
                gr.update(visible=not blinded), *rating_updates, best_update)

    @friendly
    def open_study(name, code, reviewer):
        state, _ = studies.open_study(services, name, code, reviewer)
        return item_updates(studies.show_item(services, state, state["position"], reviewer))

    study_open.click(open_study, [study_name, study_code, study_reviewer], item_outputs, api_name="review_study_open",
                     **heavy)

    @friendly
    def show(state, reviewer, position):
        return item_updates(studies.show_item(services, state, position, reviewer))

    show_button.click(show, [study_state, study_reviewer, hidden_position], item_outputs, api_name="review_study_show",
                      **heavy)
    study_previous.click(lambda s, r: show(s, r, studies.step(services, s, r, -1)), [study_state, study_reviewer],
                         item_outputs, api_visibility="private", **heavy)
    study_next.click(lambda s, r: show(s, r, studies.step(services, s, r, 1)), [study_state, study_reviewer],
                     item_outputs, api_visibility="private", **heavy)
    study_next_open.click(lambda s, r: show(s, r, studies.next_open(services, s, r)), [study_state, study_reviewer],
                          item_outputs, api_name="review_study_next", **heavy)

    @friendly
    def verdict(state, reviewer, value, note):
        return studies.record_verdict(services, state, reviewer, value, note)

    for button, value in zip(verdict_buttons, ("plausible", "implausible", "unsure")):
        button.click(lambda s, r, n, v=value: verdict(s, r, v, n), [study_state, study_reviewer, study_note],
                     [study_saved, study_progress], api_visibility="private", **light)
    verdict_button.click(verdict, [study_state, study_reviewer, hidden_verdict, study_note],
                         [study_saved, study_progress], api_name="review_study_verdict", **light)

    @friendly
    def rate(state, reviewer, slot, value):
        saved_line, progress_line = studies.rate(services, state, reviewer, slot, value)
        return or_skip(saved_line), progress_line

    for radio, slot in zip(ratings, SLOTS[:MAX_SLOTS]):
        radio.input(lambda s, r, v, slot=slot: rate(s, r, slot, v), [study_state, study_reviewer, radio],
                    [study_saved, study_progress], api_visibility="private", **light)
    rate_button.click(rate, [study_state, study_reviewer, hidden_slot, hidden_rating], [study_saved, study_progress],
                      api_name="review_study_rate", **light)

    @friendly
    def pick(state, reviewer, slot):
        return studies.pick_best(services, state, reviewer, slot)

    best.input(pick, [study_state, study_reviewer, best], [study_saved, study_progress], api_visibility="private",
               **light)
    best_button.click(pick, [study_state, study_reviewer, hidden_slot], [study_saved, study_progress],
                      api_name="review_study_best", **light)

    @friendly
    def note_saved(state, reviewer, text):
        return or_skip(studies.save_note(services, state, reviewer, text))

    study_note.input(note_saved, [study_state, study_reviewer, study_note], study_saved, api_name="review_study_note",
                     trigger_mode="always_last", **light)

    # ---- results
    @friendly
    def results(name, code, progress=gr.Progress()):
        shown = studies.study_results(
            services, name, code,
            progress=lambda done, total: progress(done / total if total else 0, desc="Deletion/insertion AUCs…"))
        return shown.summary, shown.ratings_figure, shown.kappa_figure, shown.report

    results_button.click(results, [study_name, study_code], [results_md, ratings_plot, kappa_plot, report_json],
                         api_name="review_agreement", **heavy)
    export_csv.click(friendly(lambda n, c: studies.export_study(services, n, c, "csv")), [study_name, study_code],
                     export_file, api_name="review_study_export_csv", **light)
    export_json.click(friendly(lambda n, c: studies.export_study(services, n, c, "json")), [study_name, study_code],
                      export_file, api_name="review_study_export_json", **light)

    study_reviewer.change(lambda n: n, study_reviewer, study_reviewer_saved, api_visibility="private", queue=False)
    return {"saved": study_reviewer_saved, "reviewer": study_reviewer, "model": study_model, "methods": study_methods,
            "methods_for": methods_for, "dataset": study_dataset}


# ------------------------------------------------------------------------------------------------ Models tab
def build_models_tab(services, heavy, light) -> dict:
    """Import your own model (timm architecture + safetensors weights + class names), list and remove imports."""
    gr.Markdown("Explain **your own model**: a [timm](https://huggingface.co/docs/timm) architecture and its weights "
                "as a **safetensors** state dict (pickled `.pt`/`.pth`/`.bin` checkpoints are refused: loading them "
                "can run code; the error says how to convert one), plus the class names (a text file, one per line, "
                "or a CSV). The checkpoint must fit the architecture exactly; one forward pass checks it. Imported "
                "models are stored in the data folder and appear in every model menu.", elem_classes="help")
    with gr.Row(equal_height=False):
        with gr.Column(scale=5, min_width=320):
            with gr.Row():
                weights = gr.File(label="Weights (.safetensors)", file_types=[".safetensors"], type="filepath",
                                  elem_id="import-weights", height=120)
                classes = gr.File(label="Class names (.txt or .csv)", file_types=[".txt", ".csv"], type="filepath",
                                  elem_id="import-classes", height=120)
            with gr.Row():
                arch = gr.Dropdown(list(models_tab.ARCHITECTURES), value=None, allow_custom_value=True,
                                   label="timm architecture", info="any timm name, or hf-hub:org/name (no files needed)",
                                   elem_id="import-arch")
                name = gr.Textbox(label="Name", placeholder="my-model", info="letters, digits, '.', '-', '_'",
                                  elem_id="import-name")
            with gr.Accordion("Preprocessing and architecture options (default: timm's config)", open=False):
                with gr.Row():
                    input_size = gr.Textbox(label="Input size (H W)", placeholder="224 224", elem_id="import-size")
                    mean = gr.Textbox(label="Mean (R G B)", placeholder="0.485 0.456 0.406", elem_id="import-mean")
                    std = gr.Textbox(label="Std (R G B)", placeholder="0.229 0.224 0.225", elem_id="import-std")
                    crop_pct = gr.Textbox(label="Centre crop (1 = none)", placeholder="timm's", elem_id="import-crop")
                model_args = gr.Textbox(label="Model arguments (JSON, timm keyword arguments)",
                                        placeholder='{"depth": 6, "embed_dim": 192}', elem_id="import-args")
                imported_by = gr.Textbox(label="Imported by", placeholder="your name (default: the server's login)",
                                         elem_id="import-by")
            import_button = gr.Button("Import", variant="primary", elem_id="import-button")
            status = gr.Markdown(elem_id="import-status")
        with gr.Column(scale=6, min_width=360):
            table = gr.Dataframe(models_tab.imported_rows(), headers=models_tab.TABLE_HEADERS, interactive=False,
                                 label="Imported models", elem_id="imported-table")
            with gr.Row():
                to_remove = gr.Dropdown(models_tab.removable_choices(), value=None, label="Remove an imported model",
                                        elem_id="remove-model", scale=3)
                remove_button = gr.Button("Remove", variant="stop", elem_id="remove-button", scale=1)

    def listing():
        return models_tab.imported_rows(), gr.update(choices=models_tab.removable_choices(), value=None)

    @friendly
    def do_import(*args):
        message = models_tab.import_upload(services, *args)
        return (message, *listing())

    @friendly
    def do_remove(model_name):
        message = models_tab.remove(services, model_name)
        return (message, *listing())

    imported = import_button.click(do_import, [weights, classes, arch, name, input_size, mean, std, model_args,
                                               imported_by, crop_pct], [status, table, to_remove], api_name="import_model",
                                   **heavy)
    removed = remove_button.click(do_remove, to_remove, [status, table, to_remove], api_name="remove_model", **light)
    train = build_aha_training(services, light)
    for event in (imported, removed):  # a new or removed model: the training form's model list follows
        event.success(train["refresh"], None, train["refresh_outputs"], api_visibility="private", queue=False)

    def refresh_all():
        return (*listing(), *train["refresh"]())

    return {"changed": [imported, removed], "refresh": refresh_all,
            "refresh_outputs": [table, to_remove, *train["refresh_outputs"]]}


def build_aha_training(services, light) -> dict:
    """The Models tab's "Train an AHA explainer" section: an 'aha-train' job (saliency_lab.aha_train) with its
    validation curve drawn live, cancel, and the AHA jobs with resume."""
    gr.Markdown("### Train an AHA explainer\nAHA draws its map in **one pass** with an explainer trained for the "
                "model; without one it optimises every image on its own (slower). Train one here for any model, "
                "yours included: a background job (it survives a closed page and resumes after a restart). The "
                "plot shows the fixed validation metric (hard deletion and insertion of the explainer's maps on "
                "held-out images) as it trains; the best checkpoint is kept. The explainer is stored beside the "
                "model in the data folder. Models that ship an explainer are not listed: import a copy under "
                "another name to train your own.", elem_classes="help")
    with gr.Row():
        aha_model = gr.Dropdown(aha_train.model_choices(services), value=None, label="Model", scale=3,
                                elem_id="aha-model", info="every model a job can load, imported ones included")
        aha_data = gr.Dropdown(aha_train.dataset_choices(), value=None, label="Training data (labelled)", scale=3,
                               elem_id="aha-data", info="the shipped cells and the data sets in the data folder")
        aha_val = gr.Dropdown(aha_train.validation_choices(), value=aha_train.HOLDOUT, label="Validation data", scale=3,
                              elem_id="aha-val", info="never trained on")
    with gr.Row():
        aha_steps = gr.Number(200, minimum=1, maximum=aha_train.MAX_STEPS, precision=0, label="Steps",
                              elem_id="aha-steps")
        aha_minutes = gr.Number(10, minimum=0, precision=1, label="Minutes at most (0 = no limit)",
                                elem_id="aha-minutes")
        aha_seed = gr.Number(0, precision=0, label="Seed", elem_id="aha-seed")
        aha_backend = gr.Radio([("This machine", "local"), ("HuggingFace Jobs, GPU (needs HF_TOKEN)", "hf-jobs")],
                               value="local", label="Run on", elem_id="aha-backend")
    aha_start, aha_cancel, aha_job, aha_status, aha_percent, aha_plot = job_controls(
        "Start training", "Validation deletion and insertion over the training steps", start_id="aha-start",
        cancel_id="aha-cancel", status_id="aha-status", progress_id="aha-progress", plot_id="aha-plot")
    aha_timer = gr.Timer(1.0, active=False)
    with gr.Accordion("AHA training jobs on this server (all jobs: Masks & fine-tune tab)", open=False):
        with gr.Row():
            aha_pick = gr.Dropdown(aha_train.job_choices(services), label="Job", scale=3, elem_id="aha-job-pick")
            aha_refresh = gr.Button("Refresh", size="sm", scale=1)
            aha_resume = gr.Button("Resume (interrupted, failed, cancelled)", size="sm", scale=1, elem_id="aha-resume")
            aha_open = gr.Button("Open", size="sm", scale=1, elem_id="aha-open")

    @friendly
    def start(model_name, dataset, validation, steps, minutes, seed, backend):
        new_id, message = aha_train.start_training(services, model_name, dataset, validation, steps, minutes, seed,
                                                   backend)
        return new_id, message, gr.update(active=True), 0, gr.update(choices=aha_train.job_choices(services))

    aha_start.click(start, [aha_model, aha_data, aha_val, aha_steps, aha_minutes, aha_seed, aha_backend],
                    [aha_job, aha_status, aha_timer, aha_percent, aha_pick], api_name="aha_train_start", **light)

    @friendly
    def poll(current):
        if not current:
            return gr.skip(), gr.skip(), gr.skip(), gr.update(active=False), gr.skip(), gr.skip()
        report = aha_train.job_report(services, current)
        if not report.finished:
            return report.text, report.percent, report.figure, gr.skip(), gr.skip(), gr.skip()
        models = gr.update(choices=aha_train.model_choices(services)) if report.status == "done" else gr.skip()
        return report.text, report.percent, report.figure, gr.update(active=False), models, \
            gr.update(choices=aha_train.job_choices(services))

    aha_timer.tick(poll, aha_job, [aha_status, aha_percent, aha_plot, aha_timer, aha_model, aha_pick],
                   api_name="aha_train_status", concurrency_id="poll", concurrency_limit=32, show_progress="hidden")
    aha_cancel.click(friendly(lambda current: finetune.cancel_finetune(services, current)), aha_job, aha_status,
                     api_name="aha_train_cancel", queue=False)

    def jobs():
        return gr.update(choices=aha_train.job_choices(services))

    aha_refresh.click(friendly(jobs), None, aha_pick, api_name="aha_train_jobs", **light)

    @friendly
    def follow(chosen):
        return chosen, finetune.open_job(services, chosen), gr.update(active=True)

    @friendly
    def resume(chosen):
        return chosen, finetune.resume_job(services, chosen), gr.update(active=True)

    aha_open.click(follow, aha_pick, [aha_job, aha_status, aha_timer], api_name="aha_train_open", **light)
    aha_resume.click(resume, aha_pick, [aha_job, aha_status, aha_timer], api_name="aha_train_resume", **light).then(
        jobs, None, aha_pick, api_visibility="private", **light)

    def refresh():
        return (gr.update(choices=aha_train.model_choices(services)), gr.update(choices=aha_train.dataset_choices()),
                gr.update(choices=aha_train.validation_choices()), gr.update(choices=aha_train.job_choices(services)))

    return {"refresh": refresh, "refresh_outputs": [aha_model, aha_data, aha_val, aha_pick]}


# ------------------------------------------------------------------------------------------------ Learn tab
def build_learn_tab(services, names, first_model, explain_image, heavy, light):
    gr.Markdown("## What the methods do")
    gr.Markdown("\n\n".join(f"**{label}.** {text}" for label, text in menus.method_descriptions()))
    gr.Markdown("## What the scores mean")
    gr.Markdown(learn.METRICS_TEXT)
    gr.Markdown("## Sanity check, live\nRandomise the model's top layers, stage by stage, and watch which maps "
                "change. Uses the Explain tab's image (or the first example).")
    with gr.Row():
        sanity_model = gr.Dropdown(menus.model_choices(names), value=first_model, allow_custom_value=True,
                                   label="Model", scale=2)
        sanity_methods = gr.CheckboxGroup([(menus.method_label(n), n) for n in menus.method_order(list(METHODS))
                                           if not METHODS[n].slow],
                                          value=["gradcam", "random"], label="Methods", scale=3,
                                          elem_id="sanity-methods")
        stages = gr.Slider(1, 6, value=4, step=1, label="Stages", scale=1)
        sanity_button = gr.Button("Run sanity check", variant="primary", scale=1, elem_id="sanity-button")
    sanity_gallery = gr.Gallery(label="Maps as the model is randomised (left: trained model)", columns=5,
                                format="png", height="auto", elem_id="sanity-gallery")
    sanity_plot = gr.Plot(label="Rank correlation with the original map")

    @friendly
    def run_sanity(model_name, chosen, n_stages, path):
        yield from learn.sanity_run(services, model_name, chosen, n_stages, path, warn=gr.Warning)

    sanity_button.click(run_sanity, [sanity_model, sanity_methods, stages, explain_image],
                        [sanity_gallery, sanity_plot], api_name="sanity_check", **heavy)

    gr.Markdown("## Decoy BloodMNIST: a model that cheats, before and after CAMAL")
    gr.Markdown("Every training image of decoy BloodMNIST carries a small coloured square whose colour and corner "
                "give the class away. A model trained on it can score well by looking at the square instead of "
                "the cell; its maps show it. CAMAL fine-tuning with cell masks pulls the maps (and the decision) "
                "back onto the cell. On test images the squares are random, so the cheat stops working. Each "
                "triple below: a decoy test image, the Grad-CAM of the model trained on decoy BloodMNIST (before) "
                "and of its CAMAL fine-tune (after), each with its prediction (✓ right, ✗ wrong).")
    decoy_gallery = gr.Gallery(label="Decoy test image · before CAMAL · after CAMAL", show_label=False, columns=6,
                               format="png", height="auto", object_fit="contain", elem_id="decoy-gallery")
    decoy_info = gr.Markdown(elem_classes="help", elem_id="decoy-info")
    decoy_button = gr.Button("Show decoy examples (and before/after maps when the models exist)",
                             elem_id="decoy-button")
    decoy_button.click(friendly(lambda: learn.decoy_view(services)), None, [decoy_gallery, decoy_info],
                       api_name="decoy", **heavy)

    gr.Markdown("## Why this class and not that one: the grid pointing game")
    gr.Markdown("Four shipped cells of four different classes make a 2 × 2 mosaic (which cells, classes and places: "
                "from the seed). Each method explains each of the four classes on the same mosaic; a map that knows "
                "*which* cell makes the class puts its attribution in that class's quadrant (score 1), one that only "
                "finds cells spreads it (chance 0.25). The model is measured first: its quadrant sensitivity says "
                "whether it reads each class where it is. The ViT is **bloodmnist-vit-grid**, fine-tuned on mosaics "
                "(the bundled ViT, trained on single cells, does not read mosaics).", elem_classes="help")
    with gr.Row():
        grid_model = gr.Dropdown(list(learn.GRID_MODELS), value=learn.GRID_MODELS[0], label="Model", scale=2,
                                 elem_id="grid-model")
        grid_seed = gr.Number(0, minimum=0, precision=0, label="Mosaic (seed)", scale=1, elem_id="grid-seed")
        grid_methods = gr.CheckboxGroup(learn.grid_method_choices(),
                                        value=learn.grid_default_methods(learn.GRID_MODELS[0]), label="Methods", scale=3,
                                        elem_id="grid-methods")
        grid_button = gr.Button("Make the mosaic and explain its four classes", variant="primary", scale=1,
                                elem_id="grid-button")
    grid_class = gr.Radio(learn.grid_class_choices(None), value="all", label="Show the maps of",
                          elem_id="grid-class")
    grid_gallery = gr.Gallery(label="The mosaic, then each method's map (the class's quadrant outlined)", columns=4,
                              format="png", height="auto", object_fit="contain", elem_id="grid-gallery")
    grid_info = gr.Markdown(elem_classes="help", elem_id="grid-info")
    grid_state = gr.State(None)

    @friendly
    def run_grid(model_name, seed, chosen):
        result = learn.grid_mosaic(services, model_name, seed, chosen)
        items, text = learn.grid_view(services, result, "all")
        return items, text, gr.update(choices=learn.grid_class_choices(result), value="all"), result

    @friendly
    def show_grid(result, shown):  # drawing only: the maps are in the state
        return learn.grid_view(services, result, shown)

    grid_button.click(run_grid, [grid_model, grid_seed, grid_methods],
                      [grid_gallery, grid_info, grid_class, grid_state], api_name="gridpg", **heavy)
    grid_model.input(learn.grid_default_methods, grid_model, grid_methods, api_visibility="private", queue=False)
    grid_class.input(show_grid, [grid_state, grid_class], [grid_gallery, grid_info], api_visibility="private", **light)
    return sanity_model


def launch_kwargs(demo=None) -> dict:
    """The arguments of `demo.launch`: theme, upload limit, and the folders whose files the app shows (the data
    folder above all: a finished job's pictures live there, and Gradio refuses to serve a file outside the
    working directory, its temp folder and `allowed_paths`)."""
    # uploads are images (checked from their header by load_image) and imported models' weights (Models tab)
    upload_mb = int(os.environ.get("SALIENCY_LAB_MAX_UPLOAD_MB", "400"))
    if demo is not None and getattr(demo, "services", None) is not None:
        allowed = demo.services.served_folders()
    else:
        from explainers.paths import data_dir

        allowed = [str(data_dir())]
    return {"theme": THEME, "css": CSS, "ssr_mode": False, "max_file_size": f"{upload_mb}mb", "show_error": False,
            "allowed_paths": allowed}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    demo = build_app()
    demo.queue(default_concurrency_limit=4)
    # 127.0.0.1:7860 here; a Space sets GRADIO_SERVER_NAME=0.0.0.0 in the environment
    demo.launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")), **launch_kwargs(demo))
