"""The app's Gradio UI, one module per tab. Only this package (and app.py, which wires it) imports Gradio.

A tab is a module with three names:

    TITLE = "Agents"          # the tab's label
    TAB_ID = "agents"         # its id (stable: tests and links select it)
    def build(ctx: TabContext) -> dict:   # lays out the tab's components inside `with gr.Tab(...)` and wires
        ...                               # its own events; returns the parts other tabs or app.py need

Adding a tab is one module plus one line in `TAB_MODULES` below. `app.build_app` opens each tab in that order
and calls its `build`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# the tabs, in the order they are shown (module names inside saliency_lab.ui)
TAB_MODULES: list[str] = []


@dataclass
class TabContext:
    """What every tab may use: the shared services, the model names at start, the concurrency groups of heavy
    (model passes) and light (drawing) events, and `shared`: components one tab offers to others by name
    (e.g. "explain_image", the Explain tab's image) and values such as "data_dir"."""
    services: object
    names: list
    first_model: str
    heavy: dict
    light: dict
    shared: dict = field(default_factory=dict)
