"""Saliency Lab: faithful visual explanations of image classifiers (the Gradio 6 front end).

    python app.py                  # http://127.0.0.1:7860, offline, on the bundled models

Wiring only: the tabs live in `saliency_lab.ui` (one module per tab, listed in `saliency_lab.ui.TAB_MODULES`),
the work they ask for in the service layer `saliency_lab` (no Gradio), which calls the library `explainers`.
This file builds the shared services, opens each tab in order, and wires what crosses tabs: model pickers that
follow imports and fine-tunes, and page-level state. Heavy work (model passes) shares one concurrency id, so it
never starves the light events (drawing, sliders that recombine cached statistics).
"""
from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("MPLBACKEND", "Agg")  # Gradio switches matplotlib to Agg around every event: start there

try:  # ZeroGPU: `spaces` must be imported before torch; elsewhere the decorator is a no-op
    import spaces  # type: ignore  # noqa: F401  (saliency_lab.services.gpu uses it once imported)
except ImportError:  # pragma: no cover - not on a Space
    spaces = None

import logging
from pathlib import Path

import gradio as gr

from saliency_lab import browse as browse_module
from saliency_lab import menus
from saliency_lab.services import DEVICE, Services, configure_torch, default_loader
from saliency_lab.ui import TabContext, common, tab_modules
from saliency_lab.ui.style import CSS, INTRO, THEME

default_data_dir = browse_module.default_data_dir  # (kept importable from app)
friendly = common.friendly  # (kept importable from app)
ROOT = Path(__file__).resolve().parent
log = logging.getLogger("saliency_lab")


def default_state_dir() -> Path:
    """SQLite files (verdicts, mask sets, jobs): SALIENCY_LAB_STATE_DIR, else the user's data folder
    (`explainers.paths.data_dir()`: SALIENCY_DATA_DIR, the Space's /data, or ~/.local/share), never the code."""
    from explainers.paths import data_dir

    configured = os.environ.get("SALIENCY_LAB_STATE_DIR")
    return Path(configured) if configured else data_dir() / "app"


def build_app(model_names=None, loader=None, *, default_model=None, data_dir=None, state_dir=None,
              jobs_root=None, weights_dir=None, heavy_concurrency=None, sam_variant="auto",
              decoy_roots=None, segmentation_names=None) -> gr.Blocks:
    """Build the Blocks app. Everything is injectable so tests can use a tiny in-memory model:
    `model_names` (list or callable; default: explainers.models.list_models), `loader` (name -> ModelBundle;
    default: load_model, cached and thread-safe), `data_dir` (a labelled folder for the browser and the review),
    `state_dir` (SQLite files), `jobs_root` (fine-tune jobs), `weights_dir` (fine-tuned models), `decoy_roots`
    (folders that may hold decoy BloodMNIST and its models; default `saliency_lab.datasets.decoy_locations()`),
    `segmentation_names` (list or callable: the segmentation models the Explain menu offers; default
    `explainers.models.names("segmentation")`)."""
    from explainers.models import list_models

    if heavy_concurrency is None:  # one explanation per core (each torch op single-threaded, see configure_torch)
        heavy_concurrency = 2 if DEVICE == "cuda" else max(1, min(4, os.cpu_count() or 1))
    services = Services(loader or default_loader, model_names if model_names is not None else list_models,
                        state_dir or default_state_dir(), jobs_root, sam_variant, weights_dir=weights_dir,
                        parallel=heavy_concurrency, decoy_roots=decoy_roots,
                        segmentation_names=segmentation_names)
    configure_torch(heavy_concurrency)
    if (services.jobs_root / "jobs.sqlite").exists():  # reconcile the job records with their processes now (a dead
        services.runner()                              # process: interrupted), not when the next job starts
    names = services.names()
    heavy = dict(concurrency_id="heavy", concurrency_limit=heavy_concurrency)
    light = dict(concurrency_id="light", concurrency_limit=16, show_progress="hidden")

    with gr.Blocks(title="Saliency Lab", analytics_enabled=False) as demo:
        demo.services = services
        gr.Markdown(INTRO, elem_id="app-title")
        ctx = TabContext(services, names, default_model or menus.default_model(names), heavy, light,
                         shared={"data_dir": data_dir or browse_module.default_data_dir()}, demo=demo)
        built = []
        # "wrap": on a phone every tab stays one tap away (the default "menu" hides all but the first behind "...")
        with gr.Tabs(overflow_behavior="wrap", elem_id="main-tabs"):
            for module in tab_modules():
                with gr.Tab(module.TITLE, id=module.TAB_ID) as tab:
                    built.append((tab, module.build(ctx) or {}))
        demo.refresh_models = wire_across_tabs(built)

        def on_unload(request: gr.Request):
            services.forget_session(request.session_hash)

        demo.unload(on_unload)
    return demo


def wire_across_tabs(built) -> callable:
    """What crosses tabs (see saliency_lab.ui for the keys a tab's `build` may return): every model picker follows
    a new model (fine-tuned, imported or removed) when a tab that has one is selected and after `models_changed`;
    a tab's own `on_select`; page-level parts (`after_tabs`). Returns the refresh of the model pickers."""
    pickers = [picker for _, parts in built for picker in parts.get("model_pickers", [])]
    outputs = [component for component, _ in pickers]

    def refresh_models():
        """Fine-tuned and imported models appear in every model picker (the current choices are kept)."""
        return [update() for _, update in pickers]

    quiet = dict(api_visibility="private", queue=False)
    for tab, parts in built:
        if parts.get("model_pickers"):
            tab.select(refresh_models, None, outputs, **quiet)
        if parts.get("on_select"):
            refresh, refreshed = parts["on_select"]
            tab.select(refresh, None, refreshed, **quiet)
        for event in parts.get("models_changed", []):
            event.success(refresh_models, None, outputs, **quiet)
        if parts.get("after_tabs"):
            parts["after_tabs"]()
    return refresh_models


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
