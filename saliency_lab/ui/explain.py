"""The Explain tab: an image and a model in, each chosen method's map, the deletion and insertion curves and their
scores out; sliders for the methods' options, the overlay's look, downloads, the data-set browser. Each handler
makes one call into `saliency_lab.explain`, then draws pictures and figures for the outputs.

Its model menu also offers the segmentation models (labelled "· segmentation"): picking one hides the classifier
view and shows the segmentation view (`saliency_lab.ui.segment`, driven by this same menu) in its place; picking a
classifier brings the classifier view back."""
from __future__ import annotations

from types import SimpleNamespace

import gradio as gr

from explainers.engine import CURVE_NOTE
from explainers.images import COLORMAPS
from explainers.methods import METHODS
from saliency_lab import browse as browse_module
from saliency_lab import explain, figures, menus, pictures
from saliency_lab import segmentation
from saliency_lab.errors import is_user_error, user_message
from saliency_lab.ui import segment as segment_view
from saliency_lab.ui.common import (RefusedUpload, checked_image, dataset_dropdown, friendly, log, named,
                                    refusal_in_status_stream)

TITLE = "Explain"
TAB_ID = "explain"

SLIDERS = menus.sliders()  # [(method, Option)]: each method's user options, in slider order
DETAILS = next((METHODS[m].details for m in menus.method_order(list(METHODS)) if METHODS[m].details), "Details")
LIVE = [i for i, (_, option) in enumerate(SLIDERS) if option.live]  # sliders recombined without a model pass
# the API's parameter names (gradio_client keywords): what an explanation takes, and the look of its overlays
SLIDER_PARAMETERS = [menus.api_parameter(method, option) for method, option in SLIDERS]
VIEW_PARAMETERS = ["opacity", "colour_map"]
EXPLAIN_PARAMETERS = ["image_path", "model_name", "methods", "target_choice", *SLIDER_PARAMETERS, *VIEW_PARAMETERS,
                      "outline_percent"]


def slider_values(values) -> dict:
    """{option name: value} of the sliders' values (in SLIDERS order)."""
    return {option.name: value for (_, option), value in zip(SLIDERS, values)}


def explain_maps_handler(services):
    @friendly
    def explain_maps(image_path, model_name, methods, target_choice, *rest):
        """Step 1 of an explanation: the top-5 prediction and each chosen method's map (fast; the curves follow
        in `explain_curves`, a separate event, so that under load everyone's maps come first). `rest`: the
        sliders' values (SLIDERS), the opacity, the colour map and the outlined top share (%)."""
        if isinstance(image_path, RefusedUpload):
            raise ValueError(str(image_path))
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

    return named(explain_maps, EXPLAIN_PARAMETERS)


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

    return named(explain_curves, ["state", *[SLIDER_PARAMETERS[i] for i in LIVE], *VIEW_PARAMETERS])


def stream_outputs(services, state, image, opacity, colormap, previous=None) -> tuple:
    """(overlays, curves figure, AUC table, status, state) of a streamed explanation's step; the pictures and the
    figure are gr.skip() when this step did not change them (`previous`: the state of the step before)."""
    results = state["results"]
    curves_changed = previous is None or explain.curve_methods(state) != explain.curve_methods(previous)
    # a stream only adds maps and curves (the captions carry the AUCs)
    changed = curves_changed or len(results) != len(previous["results"])
    overlays = explain.overlay_pictures(services, state, opacity, colormap, image) if changed else gr.skip()
    if not curves_changed:
        figure = gr.skip()
    elif explain.curve_methods(state):
        figure = figures.curves_figure(results)
    else:
        figure = figures.empty_figure("The curves appear here, each method's as soon as its map is in."
                                      if results or state.get("pending") else
                                      "No method could explain this model: see the notes above.")
    table = figures.auc_table(results) if changed else gr.skip()
    return overlays, figure, table, explain.status_text(state), state


def explain_stream_handler(services, refusals_in_status: bool = False):
    """The streamed explanation; with `refusals_in_status` (the page's own buttons), a refused input is said in
    the status line with nothing else changed, instead of an error (which the API's callers get)."""

    def explain_stream(image_path, model_name, methods, target_choice, *rest):
        """An explanation as it is made (the Explain button, a new image, a new class, the API's /explain): the
        prediction, then each method's map and at once its curves, the quickest methods first, each as soon as it
        is computed; a slow method (RISE) never holds back the others. `rest`: the sliders' values (SLIDERS), the
        opacity, the colour map and the outlined top share (%). Yields the top 5, the target menu, overlays,
        curves, score table, status, state and the details (GradSkip's head weights, at the end)."""
        if isinstance(image_path, RefusedUpload):
            raise ValueError(str(image_path))
        *values, opacity, colormap, outline = rest
        previous = None
        for state, image in explain.explain_stream(services, image_path, model_name, methods, target_choice,
                                                   slider_values(values), warn=gr.Warning):
            state = explain.set_outline(state, outline)
            done = previous is not None and "pending" not in state
            # the last message is whole (nothing skipped): it is what an API caller (gradio_client) receives
            outputs = stream_outputs(services, state, image, opacity, colormap, None if done else previous)
            if previous is None:
                target_update = gr.update(choices=explain.target_choices(state["prediction"]),
                                          value=state["target_choice"])
                yield explain.label_value(state["prediction"]), target_update, *outputs, gr.skip()
            elif "pending" in state:
                yield gr.skip(), gr.skip(), *outputs, gr.skip()
            else:  # done: the details panel (GradSkip's head weights) of the final state
                diagnostics = explain.head_weights(services, state, None, image)
                heads = None if diagnostics is None else figures.head_weights_figure(diagnostics)
                target_update = gr.update(choices=explain.target_choices(state["prediction"]),
                                          value=state["target_choice"])
                yield explain.label_value(state["prediction"]), target_update, *outputs, heads
            previous = state

    outputs = 8  # top 5, target menu, overlays, curves, score table, status, state, details
    wrapped = refusal_in_status_stream(explain_stream, 5, outputs) if refusals_in_status else friendly(explain_stream)
    return named(wrapped, EXPLAIN_PARAMETERS)


def outputs_of(services, state, opacity, colormap, image):
    """(overlays, curves figure, AUC table, status, state) of an updated explanation."""
    return (explain.overlay_pictures(services, state, opacity, colormap, image),
            figures.curves_figure(state["results"]), figures.auc_table(state["results"]),
            explain.status_text(state), state)


def live_change_handler(services, method, option):
    @friendly
    def on_live(value, state, opacity, colormap):
        """A live option moved (GradSkip's alpha): recombine the cached statistics (no model pass) and redraw."""
        if not any(explain.has_method(state, m) for m in explain.live_methods(option.name)):
            return gr.skip(), gr.skip(), gr.skip()
        state, image = explain.recombine_live(services, state, option.name, value)
        diagnostics = explain.head_weights(services, state, {option.name: value}, image)
        heads = gr.skip() if diagnostics is None else figures.head_weights_figure(diagnostics)
        return explain.overlay_pictures(services, state, opacity, colormap, image), heads, state

    return named(on_live, [menus.api_parameter(method, option), "state", *VIEW_PARAMETERS])


def option_release_handler(services, method, option):
    """A slider released: re-run the methods with this option at its new value, with their curves, keeping the
    other methods. A live option recombines cached statistics: only the curves run."""
    owners = menus.methods_with_option(option.name)

    @friendly
    def on_release(value, state, opacity, colormap):
        chosen = [m for m in owners if explain.has_method(state, m)]
        if not chosen:
            return (gr.skip(),) * 5
        for method in chosen:
            state, image = explain.rerun_method(services, state, method, {option.name: value})
        return outputs_of(services, state, opacity, colormap, image)

    return named(on_release, [menus.api_parameter(method, option), "state", *VIEW_PARAMETERS])


def redraw_handler(services):
    @friendly
    def redraw(opacity, colormap, state):
        """Opacity or colour map changed: re-blend the cached maps (no model)."""
        if not state or not state.get("results"):
            return gr.skip()
        return explain.overlay_pictures(services, state, opacity, colormap)

    return named(redraw, [*VIEW_PARAMETERS, "state"])


def downloads_handler(services):
    @friendly
    def downloads(state, opacity, colormap, size="original"):
        """Overlay PNGs (the image's original size, or enlarged), curves.csv and report.json for the current
        explanation."""
        paths = explain.write_downloads(services, state, opacity, colormap, size)
        return gr.update(value=[str(p) for p in paths], visible=True)

    return named(downloads, ["state", *VIEW_PARAMETERS, "size"])


def model_choices(services, names=None) -> list:
    """[(label, name)] of the Explain menu: the classifiers, then the segmentation models (labelled as such)."""
    names = services.names() if names is None else list(names)
    return menus.model_choices(names) + segmentation.model_choices(
        [n for n in services.segmentation_names() if n not in names])


def segments(services, model_name) -> bool:
    """Whether the picked model is a segmentation model (decided from its name and card: nothing is loaded)."""
    return segmentation.is_segmentation_model(model_name, services.segmentation_names())


def view_switch(segmentation_model: bool) -> tuple:
    """The updates of (the classifier view, the segmentation view): one shown, the other hidden."""
    return gr.update(visible=not segmentation_model), gr.update(visible=segmentation_model)


def segmentation_info(model_name) -> str:
    return (f"**{model_name}** segments: upload a smear or click an example, press Segment, then pick a class or "
            "click a coloured region; each method's map comes with its IoU and PA against the region, and the "
            "region score's deletion and insertion curves. Pick a classifier to return to the classifier view.")


def model_change_handler(services):
    @friendly
    def on_model(model_name, methods, progress=gr.Progress()):
        """Load the model (hub models download once), then offer the methods that can explain it; a segmentation
        model switches to the segmentation view instead (nothing loaded, the classifier's methods and sliders
        left as they are). Returns the methods, each slider's visibility, the info line, then the visibility of
        the classifier view and of the segmentation view. A model that cannot be loaded: our words on the info
        line, the rest left as it was (`after_model` then puts the menu back)."""
        if not model_name:
            return (gr.skip(),) * (4 + len(SLIDERS))
        if segments(services, model_name):
            return (gr.skip(), *[gr.skip() for _ in SLIDERS], segmentation_info(model_name), *view_switch(True))
        progress(0.1, desc=f"Loading {model_name} (hub models download on first use)…")
        try:
            choices, kept, info = explain.model_menu(services, model_name, methods)
        except Exception as error:  # noqa: BLE001 - said once, on the info line; the rest of the page stays
            return (gr.skip(), *[gr.skip() for _ in SLIDERS], model_failure_text(model_name, error),
                    *view_switch(False))
        return (gr.update(choices=choices, value=kept), *[gr.update(visible=m in kept) for m, _ in SLIDERS], info,
                *view_switch(False))

    return on_model


STILL_PREVIOUS = "The methods and options below are still the previous model's"


def model_failure_text(model_name, error) -> str:
    """The info line when a model cannot be loaded: our words, once (not a toast per event listening to the
    model menu), saying that the methods and options shown are still the previous model's."""
    if is_user_error(error):
        reason = user_message(error)
    else:
        log.error("could not load %s", model_name, exc_info=error)
        reason = "It failed on our side (the details are in the server log)."
    return (f"⚠ **{model_name} could not be loaded.** {reason.rstrip('.')}. {STILL_PREVIOUS}: pick another model, "
            "or try this one again later.")


def after_model(model_name, info, memory):
    """After the model menu's change: (the menu, the info line, `memory`). `memory` (a session state) holds the
    last model that loaded. A model that failed to load puts the menu back on that one (whose methods are the
    ones shown; not the failed name beside them) and the failure stays said on the info line when the menu's
    change for the model put back has run; any other pick forgets it."""
    memory = dict(memory or {})
    good = memory.get("good")
    failed = str(info or "").startswith(f"⚠ **{model_name} could not be loaded.**")
    if failed and good and good != model_name:
        note = str(info).replace(STILL_PREVIOUS, f"The menu is back on {good}, whose methods and options are shown")
        memory.update(failed=model_name, note=note)
        return gr.update(value=good), note, memory
    if failed:
        return gr.skip(), gr.skip(), memory
    if memory.get("failed") and model_name == good:  # the menu's change for the model put back
        note = memory["note"]
        memory.update(failed=None, note=None)
        return gr.skip(), note, memory
    memory.update(good=model_name, failed=None, note=None)
    return gr.skip(), gr.skip(), memory


def expected_handler(services):
    def show_expected(model_name, chosen, *values):
        """The expected-time line; "" when the model cannot be loaded (its info line says why, once) or is a
        segmentation model (the segmentation view is shown)."""
        if segments(services, model_name):
            return ""
        try:
            return explain.expected_text(services, model_name, chosen, slider_values(values))
        except Exception as error:  # noqa: BLE001 - the model menu's info line reports it
            log.info("no expected time for %s: %s", model_name, error)
            return ""

    return show_expected


def step_view_handler(services):
    def step_view(state, method, step):
        """The curve step viewer: its method menu (the methods whose curves are in), the two pictures the model
        sees at step `step` with the target's probability, and that method's curves with the step marked. No
        model pass: the probabilities are the curves' own."""
        choices = explain.curve_methods(state)
        values = [value for _, value in choices]
        if not values:
            return (gr.update(choices=[], value=None), None,
                    figures.empty_figure("Explain an image: its curves can then be watched step by step."))
        method = method if method in values else values[0]
        items = explain.curve_step(services, state, method, step)
        names = [f"{explain.download_prefix(state)}-{method}-{kind}-step{int(step)}" for kind in ("deletion",
                                                                                                   "insertion")]
        record = next(r for r in state["results"] if r["method"] == method)
        return (gr.update(choices=choices, value=method), services.pictures(items, fmt="png", names=names),
                figures.step_figure(record, int(step)))

    return step_view


def step_viewer(services, state, light, prefix: str) -> None:
    """"Watch the curve being made": a method menu, a step slider, the images the deletion and insertion curves
    feed the model at that step (on the reference) with the target's probability, and the method's curves with
    the step marked. Follows `state` (an explanation state component); ids start with `prefix`."""
    gr.Markdown("**Watch the curve being made.** Move the step: on the left the image as the deletion curve "
                "shows it to the model (the most important pixels replaced by the reference, the model's mean "
                "colour), on the right as the insertion curve does (only those pixels restored on that colour), "
                "each with the target's probability at that step.", elem_classes="help")
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=240):
            method = gr.Radio([], label="Method", elem_id=f"{prefix}-method")
            step = gr.Slider(0, 20, value=5, step=1, label="Step (each step: 5% of the pixels)",
                             elem_id=f"{prefix}-step")
            plot = gr.Plot(show_label=False, elem_id=f"{prefix}-plot")
        with gr.Column(scale=3, min_width=300):
            shown = gr.Gallery(show_label=False, label="What the model sees at this step", columns=2, height="auto",
                               format="png", object_fit="contain", allow_preview=False, elem_id=f"{prefix}-pictures",
                               buttons=["download"])
    handler = friendly(step_view_handler(services))
    outputs = [method, shown, plot]
    state.change(handler, [state, method, step], outputs, api_visibility="private", **light)
    method.input(handler, [state, method, step], outputs, api_visibility="private", **light)
    step.change(handler, [state, method, step], outputs, api_visibility="private",
                trigger_mode="always_last", **light)


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




# ------------------------------------------------------------------------------------------------ the tab
def build(ctx) -> dict:
    """Lay out the Explain tab and wire its events; offers its image and its explanation to other tabs as
    ctx.shared["explain_image"] and ctx.shared["explain_state"]."""
    ui = _layout(ctx)
    _wire_explain(ctx, ui)
    _wire_view(ctx, ui)
    _wire_browser(ctx, ui)
    ctx.shared["explain_image"] = ui.image
    ctx.shared["explain_state"] = ui.explain_state  # the Learn tab watches its curves being made
    return {"model_pickers": [(ui.model, lambda: gr.update(choices=model_choices(ctx.services)))]}


def _first_methods(ctx) -> list:
    """The first model's default methods (its load is shared with every session: load_model caches); the menu
    itself narrows to the model's methods on page load, while the API accepts any registered method."""
    try:
        return menus.default_methods(ctx.services.bundle(ctx.first_model))
    except Exception as error:  # noqa: BLE001 - the UI says so when the user picks it
        log.warning("could not load %s at start-up: %s", ctx.first_model, error)
        return ["aha", "gradcam"]


def _layout(ctx) -> SimpleNamespace:
    """The tab's components (returned by name for the wiring below): the model menu, the classifier view and the
    segmentation view (one of the two shown)."""
    explain_state = gr.State(None)
    model_memory = gr.State({"good": ctx.first_model})  # the last model that loaded (after_model)
    # one model menu for both views: a classifier shows the classifier view, a segmentation model the other
    with gr.Row(equal_height=False):
        with gr.Column(scale=4, min_width=320):
            model = gr.Dropdown(model_choices(ctx.services, ctx.names), value=ctx.first_model,
                                allow_custom_value=True, label="Model",
                                info="Bundled models first; hub models download once, on first use; fine-tuned "
                                     "models appear here when a fine-tune finishes, imported ones (Models tab) at "
                                     "once. Models marked “segmentation” open the segmentation view.",
                                elem_id="model")
        with gr.Column(scale=5, min_width=320):
            model_info = gr.Markdown(elem_classes="help", elem_id="model-info")
    first_segments = segments(ctx.services, ctx.first_model)
    with gr.Column(visible=not first_segments, elem_id="classifier-view") as classifier_view:
        classifier_parts = _classifier_layout(ctx, explain_state)
    with gr.Column(visible=first_segments, elem_id="segment-view") as segment_column:
        segment_parts = segment_view.build(ctx, model=model)
    return SimpleNamespace(explain_state=explain_state, model=model, model_info=model_info,
                           model_memory=model_memory,                           classifier_view=classifier_view, segment_column=segment_column,
                           segment_parts=segment_parts, **classifier_parts)


def _classifier_layout(ctx, explain_state) -> dict:
    """The classifier view's components, by name."""
    data_dir = ctx.shared["data_dir"]
    cell_examples, photo_examples = browse_module.examples_list()
    cell_labels, photo_labels = browse_module.example_labels(cell_examples, photo_examples)
    all_methods = [(menus.method_label(n), n) for n in menus.method_order(list(METHODS)) if not METHODS[n].baseline]
    first_methods = _first_methods(ctx)
    with gr.Row(equal_height=False):
        with gr.Column(scale=4, min_width=320):
            image = checked_image(refusal_to_handler=True, type="filepath", sources=["upload", "clipboard"],
                                  label="Image (transparent parts are composed on white)",
                                  height=300, elem_id="input-image", buttons=["fullscreen"])
            # why an upload was refused: stays in view (a toast goes) until another image is explained
            image_note = gr.Markdown(visible=False, elem_id="image-note", elem_classes="warning-note")
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
            methods = gr.CheckboxGroup(all_methods, value=first_methods,
                                       label="Methods (pick several to compare them side by side)",
                                       elem_id="methods")
            with gr.Row():  # one slider per method option (explainers.methods.Option)
                sliders = [gr.Slider(o.minimum, o.maximum, value=o.default, step=o.step, label=o.label,
                                     info=o.info or None, elem_id=menus.slider_ids(m, o).elem_id,
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
    with gr.Accordion("Watch the curve being made", open=True, elem_id="curve-steps"):
        step_viewer(ctx.services, explain_state, ctx.light, "curve-step")
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
    return {name: value for name, value in locals().items() if name not in ("ctx", "explain_state")}


def _wire_explain(ctx, ui) -> None:
    """Explain (streamed: each map and its curves as soon as computed), a new image, a new model or methods, the
    expected time, the option sliders."""
    services, heavy, light, demo = ctx.services, ctx.heavy, ctx.light, ctx.demo
    heavy_concurrency = heavy["concurrency_limit"]
    explain_inputs = [ui.image, ui.model, ui.methods, ui.target, *ui.sliders, ui.opacity, ui.colormap, ui.outline]
    expected_inputs = [ui.model, ui.methods, *ui.sliders]
    show_expected = named(expected_handler(services), ["model_name", "methods", *SLIDER_PARAMETERS])
    after_run = dict(api_visibility="private", **light)  # a run's measured time is the next expected time
    maps_outputs = [ui.top5, ui.target, ui.overlays, ui.curves, ui.aucs, ui.status, ui.explain_state]
    stream_outputs_list = maps_outputs + [ui.heads]
    curves_inputs = [ui.explain_state, *[ui.sliders[i] for i in LIVE], ui.opacity, ui.colormap]
    curves_outputs = [ui.overlays, ui.curves, ui.aucs, ui.status, ui.explain_state, ui.heads]
    stream_fn = explain_stream_handler(services)
    page_stream = explain_stream_handler(services, refusals_in_status=True)  # the page's own events
    curves_group = dict(concurrency_id="curves", concurrency_limit=heavy_concurrency)
    # the API: /explain streams (each yield one more map or curve pair); /explain_maps and /explain_curves are
    # its two steps apart (hidden triggers)
    for name, fn, inputs, outputs in (("explain", stream_fn, explain_inputs, stream_outputs_list),
                                      ("explain_maps", explain_maps_handler(services), explain_inputs, maps_outputs),
                                      ("explain_curves", explain_curves_handler(services), curves_inputs,
                                       curves_outputs)):
        gr.Button(visible=False).click(fn, inputs, outputs, api_name=name, **(curves_group if name ==
                                                                              "explain_curves" else heavy))
    # one place shows progress and errors (the status line says what is still computing), not a red pill on
    # every panel; elapsed time only: the expected time of each method on this model is shown before it runs
    on_stream = dict(heavy, show_progress_on=[ui.overlays], show_progress="minimal")
    ui.explain_button.click(page_stream, explain_inputs, stream_outputs_list, api_visibility="private",
                            **on_stream).success(show_expected, expected_inputs, ui.expected, **after_run)
    ui.target.input(page_stream, explain_inputs, stream_outputs_list, api_name="explain_target",
                    **on_stream).success(show_expected, expected_inputs, ui.expected, **after_run)

    def cleared(message):
        return None, gr.update(choices=[("Predicted class (top-1)", "auto")], value="auto"), [], \
            figures.empty_figure(message), [], "", None, gr.skip()

    @friendly
    def new_image(image_path, model_name, chosen, _target, *rest):
        """A new image: reset the target to the top-1 class and explain at once (streamed). An upload that a
        browser would not show as the model reads it (16-bit, CMYK, alpha, TIFF, EXIF rotation...) is first
        replaced by the normalised picture (its change explains it): one image for preview, model and overlays.
        A refused upload empties the box and says why beside it (no toast); the emptied box's own change then
        clears the results, which belonged to the picture no longer shown, and leaves the note in view."""
        if isinstance(image_path, RefusedUpload):
            yield None, gr.update(value=f"⚠ **This file was not explained.** {image_path}", visible=True), \
                *(gr.skip(),) * len(stream_outputs_list)
            return
        if not image_path:  # cleared (by the person, or after a refusal, whose note stays)
            yield gr.skip(), gr.skip(), *cleared("Pick an image to see its curves.")
            return
        shown, note = explain.shown_image(services, image_path)
        if shown != str(image_path):
            if note:
                gr.Info(note, duration=6)
            yield shown, gr.update(value="", visible=False), *cleared("Explaining the normalised picture…")
            return
        hide_note = gr.update(value="", visible=False)
        for outputs in stream_fn(image_path, model_name, chosen, "auto", *rest):
            yield gr.skip(), hide_note, *outputs
            hide_note = gr.skip()

    named(new_image, EXPLAIN_PARAMETERS)

    def example_picker(paths):
        def pick_example(evt: gr.SelectData):
            return paths[evt.index]
        return pick_example

    for paths, gallery in ui.example_galleries:
        gallery.select(example_picker(paths), None, ui.image, api_visibility="private", queue=False)
    ui.image.change(new_image, explain_inputs, [ui.image, ui.image_note, *stream_outputs_list],
                    api_name="explain_new_image", **on_stream).success(
        show_expected, expected_inputs, ui.expected, **after_run)

    model_outputs = [ui.methods, *ui.sliders, ui.model_info, ui.classifier_view, ui.segment_column]
    ui.model.change(model_change_handler(services), [ui.model, ui.methods], model_outputs, api_name="select_model",
                    **heavy).then(after_model, [ui.model, ui.model_info, ui.model_memory],
                                  [ui.model, ui.model_info, ui.model_memory], api_visibility="private", queue=False,
                                  show_progress="hidden")
    ui.methods.change(methods_change, ui.methods, [*ui.sliders, ui.heads_box], api_visibility="private",
                      show_progress="hidden", queue=False)
    # shown when the page opens; the model and a slider that costs model passes (AHA's refinement steps)
    # change it too
    expected_triggers = [demo.load, ui.model.change, ui.methods.change] + [
        slider.release for slider, (_, option) in zip(ui.sliders, SLIDERS) if not option.live]
    gr.on(expected_triggers, show_expected, expected_inputs, ui.expected, api_name="expected_time", **light)
    _wire_sliders(ctx, ui, show_expected, after_run)
    demo.load(model_change_handler(services), [ui.model, ui.methods], model_outputs, api_visibility="private")


def _wire_sliders(ctx, ui, show_expected, after_run) -> None:
    """Each method option's slider: a live one recombines while it moves; any re-runs its methods when released."""
    services, heavy, light = ctx.services, ctx.heavy, ctx.light
    expected_inputs = [ui.model, ui.methods, *ui.sliders]
    for slider, (method, option) in zip(ui.sliders, SLIDERS):
        ids = menus.slider_ids(method, option)
        previews = []
        if option.live:  # recombined while it moves (no model pass); the curves when it is released
            previews.append(slider.change(live_change_handler(services, method, option),
                                          [slider, ui.explain_state, ui.opacity, ui.colormap],
                                          [ui.overlays, ui.heads, ui.explain_state],
                                          api_name=ids.preview_api_name, **light))
        # a preview still waiting when the slider is released is superseded: were it to run after the release's
        # result, it would put back a caption without curves (and a state without them)
        released = slider.release(option_release_handler(services, method, option),
                                  [slider, ui.explain_state, ui.opacity, ui.colormap],
                                  [ui.overlays, ui.curves, ui.aucs, ui.status, ui.explain_state],
                                  api_name=ids.api_name, trigger_mode="always_last", cancels=previews, **heavy)
        if not option.live:  # it ran the method again: its measured time is the next expected one
            released.success(show_expected, expected_inputs, ui.expected, **after_run)


def _wire_view(ctx, ui) -> None:
    """The overlay's look (opacity, colour map, outline), downloads, the unfamiliar-image note: no model pass."""
    services, light = ctx.services, ctx.light
    gr.on([ui.opacity.change, ui.colormap.change], redraw_handler(services), [ui.opacity, ui.colormap, ui.explain_state],
          ui.overlays, api_name="redraw", **light)
    ui.colormap.change(pictures.colour_bar_html, ui.colormap, ui.colour_bar, api_visibility="private", queue=False)

    @friendly
    def on_outline(outline_percent, state, opacity, colour_map):
        """The outlined top share changed: redraw the cached maps with it (no model pass)."""
        if not state or not state.get("results"):
            return gr.skip(), gr.skip()
        state = explain.set_outline(state, outline_percent)
        return explain.overlay_pictures(services, state, opacity, colour_map), state

    ui.outline.change(on_outline, [ui.outline, ui.explain_state, ui.opacity, ui.colormap], [ui.overlays, ui.explain_state],
                   api_name="outline", **light)
    ui.download_button.click(downloads_handler(services), [ui.explain_state, ui.opacity, ui.colormap, ui.download_size], ui.files,
                          api_name="downloads", **light)
    # the size choice names the explained image's pixels (original, enlarged)
    ui.explain_state.change(lambda s: gr.update(choices=explain.download_choices(s)), ui.explain_state, ui.download_size,
                         api_visibility="private", queue=False, show_progress="hidden")
    # an image unlike the model's training images: said above the prediction for as long as it is explained
    def show_unfamiliar(state):
        note = explain.unfamiliar_note(state)
        return gr.update(value=note, visible=bool(note))

    ui.explain_state.change(show_unfamiliar, ui.explain_state, ui.unfamiliar, api_visibility="private", queue=False,
                         show_progress="hidden")


def _wire_browser(ctx, ui) -> None:
    """The data-set browser: a page of thumbnails, a click explains that image."""
    light, data_dir = ctx.light, ctx.shared["data_dir"]
    ctx.demo.load(lambda: gr.update(choices=browse_module.dataset_menu(data_dir)[0]), None, ui.browse_folder,
                  api_visibility="private", queue=False)  # new uploads, too
    # browser
    browse_outputs = [ui.browse_gallery, ui.browse_indices, ui.browse_info, ui.browse_class, ui.browse_page]
    ui.browse_button.click(browse, [ui.browse_folder, ui.browse_class, ui.browse_page], browse_outputs, api_name="browse",
                        **light)
    ui.browse_class.input(lambda f, c: browse(f, c, 1), [ui.browse_folder, ui.browse_class], browse_outputs,
                       api_visibility="private", **light)
    ui.browse_page.submit(browse, [ui.browse_folder, ui.browse_class, ui.browse_page], browse_outputs, api_visibility="private",
                        **light)

    def on_browse_select(indices, evt: gr.SelectData):
        return int(indices[evt.index])

    ui.browse_gallery.select(on_browse_select, ui.browse_indices, ui.browse_index, api_visibility="private",
                          queue=False).then(
        browse_pick, [ui.browse_folder, ui.browse_index], ui.image, api_name="browse_select", api_visibility="private")
    ui.browse_open.click(browse_pick, [ui.browse_folder, ui.browse_index], ui.image, api_name="browse_pick")
