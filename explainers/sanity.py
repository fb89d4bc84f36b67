"""The live sanity check (Adebayo et al. 2018) as the Learn tab shows it: the model's layers re-initialised
stage by stage from the top, each method's map redrawn at every stage, and the rank correlation with the
trained model's map.

    for pictures, figure in sanity_run(services, "bloodmnist-cnn", ["gradcam", "random"], stages=4):
        ...   # one more stage each time: [(file, caption)] and a plotly figure spec

Nothing here imports gradio.
"""
from __future__ import annotations

from . import ui_helpers as ui
from .browse import examples_list
from .errors import is_skippable, user_message
from .images import load_image


def default_image(bundle) -> str:
    """The first shipped photo for an ImageNet model, else the first shipped blood cell."""
    cells, photos = examples_list()
    return (photos if bundle.num_classes == 1000 else cells or photos)[0]


def sanity_run(services, model_name, methods, stages=4, image_path=None, *, warn=None):
    """Yields ([(file, caption)], figure) after every stage of every method; a method that cannot explain the
    model is skipped (and `warn(text)` called). `image_path` defaults to `default_image`."""
    methods = list(methods or [])
    if not methods:
        raise ValueError("Pick at least one method.")
    bundle = services.bundle(model_name)
    path = image_path or default_image(bundle)
    prepared = ui.prepare_input(load_image(path), bundle)
    target = ui.predict_top(bundle, prepared, 1)[0][0]
    title = f"Sanity check on {bundle.name}"
    items, curves = [], []
    for method in methods:
        try:
            points = []
            for stage_name, stage_map, rho in ui.sanity_check_stages(bundle, method, prepared, target,
                                                                     stages=int(stages)):
                record = ui.result_record(method, target, {}, stage_map, 0.0, None, bundle)
                items.append((ui.render_overlays(prepared, [record], 0.6, "cividis")[0][0],
                              f"{ui.method_label(method)} · {stage_name} · ρ={rho:.2f}"))
                points.append((stage_name, rho))
                yield services.pictures(items), ui.sanity_figure(curves + [(ui.method_label(method), points)], title)
            curves.append((ui.method_label(method), points))
        except (ValueError, RuntimeError) as error:
            if not is_skippable(error):
                raise
            if warn is not None:
                warn(f"{ui.method_label(method)} skipped: {user_message(error)}")
    yield services.pictures(items), ui.sanity_figure(curves, title)
