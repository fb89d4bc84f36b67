"""The app's Gradio UI, one module per tab. Only this package (and app.py, which wires it) imports Gradio.

A tab is a module with three names:

    TITLE = "Agents"          # the tab's label
    TAB_ID = "agents"         # its id (stable: tests and links select it)
    def build(ctx: TabContext) -> dict:   # lays out the tab's components inside `with gr.Tab(...)` and wires
        ...                               # its own events; returns the parts other tabs or app.py need

Adding a tab is one module plus one line in `TAB_MODULES` below. `app.build_app` opens each tab in that order
and calls its `build`. What `build` returns is optional, each key read by `app.wire_across_tabs`:

    "model_pickers":  [(component, update_fn)]  menus that list models: `update_fn()` returns their gr.update;
                      run when a tab that has one is selected and after a model is imported or removed
    "models_changed": [event]                   events after which every model picker is refreshed
    "on_select":      (fn, outputs)             run when this tab is selected
    "after_tabs":     fn()                      called inside the Blocks after all tabs are built (page-level
                      parts such as a gr.BrowserState, which inside a lazily rendered tab would load too late)

Modules here that are not tabs: `common` (errors as messages, the checked image input, menus every tab uses),
`jobs` (the job panel every job kind uses), `studies` (the Review tab's study panel), `segment` (the segmentation
view, inside the Explain tab), `style` (theme and CSS).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field

# the tabs, in the order they are shown (module names inside saliency_lab.ui)
TAB_MODULES: list[str] = [
    "explain",  # also the segmentation view (ui.segment), shown when a segmentation model is picked
    "agents",
    "masks",
    "review",
    "learn",
    "models",
]


@dataclass
class TabContext:
    """What every tab may use: the shared services, the model names at start, the concurrency groups of heavy
    (model passes) and light (drawing) events, and `shared`: components one tab offers to others by name
    (e.g. "explain_image", the Explain tab's image) and values such as "data_dir"; `demo`, the gr.Blocks being
    built (for its load events)."""
    services: object
    names: list
    first_model: str
    heavy: dict
    light: dict
    shared: dict = field(default_factory=dict)
    demo: object = None


def tab_modules() -> list:
    """The tab modules of TAB_MODULES, imported, in order."""
    return [importlib.import_module(f"{__name__}.{name}") for name in TAB_MODULES]
