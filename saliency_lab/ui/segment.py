"""The segmentation view: a segmentation model's prediction as an overlay with a legend; pick a class, click a
region or draw one; each method's heatmap (whole, or with "context only" the map outside the region, the region
outlined), the deletion of the pixels outside the region beside the region's own deletion and insertion curves,
and a caption saying what a map that copies the region would score.

Not a tab of its own: the Explain tab embeds it (`build(ctx, model=its model menu)` inside a column it shows when a
segmentation model is picked there). `build(ctx)` lays out the view inside whatever container is open; without
`model` it has its own model menu (used on its own, e.g. in a test). It returns its components by name.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from pathlib import Path

import gradio as gr

from saliency_lab import figures
from saliency_lab import segmentation as service
from saliency_lab.errors import is_user_error, user_message
from saliency_lab.ui.common import friendly

log = logging.getLogger("saliency_lab")


def unfamiliar_update(shown):
    """The warning above the prediction when the photo does not look like the model's training smears."""
    verdict = getattr(shown, "familiarity", None) or {}
    note = verdict.get("message", "") if verdict.get("unfamiliar") else ""
    return gr.update(value=f"⚠ {note}" if note else "", visible=bool(note))


class Asks:
    """The newest explanation each page asked for, so that a click (or Explain) while one streams replaces it.

    Each ask takes a ticket at once, in a quick unqueued step before the stream; a stream whose ticket is no longer
    its page's newest stops at its next update, leaving the cores to the new one. (Gradio's own ways do not fit a
    click: "always_last" reruns the first click's event, and a listener that cancels cannot be dispatched before
    the one it cancels.)"""

    def __init__(self, keep: int = 4096):
        self._lock = threading.Lock()
        self._newest: OrderedDict = OrderedDict()  # session -> its newest ticket
        self._keep = keep  # pages remembered (the oldest forgotten first; a forgotten page's stream runs on)

    def ask(self, session: str) -> int:
        with self._lock:
            ticket = self._newest.pop(session, 0) + 1
            self._newest[session] = ticket
            while len(self._newest) > self._keep:
                self._newest.popitem(last=False)
            return ticket

    def wanted(self, session: str, ticket) -> bool:
        """Whether the stream holding `ticket` is still its page's newest (None: an API call, always wanted)."""
        if ticket is None:
            return True
        with self._lock:
            return self._newest.get(session, ticket) == ticket


def pictures_of(records, context: bool = False) -> list:
    """The gallery's (overlay, caption) pairs: each map (whole, or with `context` only outside the region, the
    region outlined) with its out-of-region deletion AUC once known, and its IoU and PA against the region."""
    key = "overlay_context" if context else "overlay"
    return [(r[key], (f"{r['label']}: " + (f"deletion outside the region {r['outside_auc']:.3f}; "
                                          if "outside_auc" in r else "")
                      + f"IoU {r['iou_predicted']:.2f}, PA {r['pa_predicted']:.2f} "
                        f"(vs the {r.get('region', 'predicted region')})")) for r in records or []]


# what a new prediction clears: the target line, maps, caption, table, both curves, records
CLEARED = ("", [], "", "", None, None, None)


def segment_picture(loader, model_name, picture, truth):
    """The prediction, its legend and notes, the class menu, the picture for drawing, and the unfamiliar-photo
    warning (shown before any explanation). A refusal (no picture, no model) is said in the notes and leaves
    the rest as it was."""
    if picture is None or not model_name:
        return (*(gr.skip(),) * 3, "⚠ " + ("Upload a smear photo or pick an example first." if picture is None
                                           else "Pick a segmentation model."), *(gr.skip(),) * 3,
                *(gr.skip(),) * len(CLEARED))
    view = service.SegmentationView(loader(model_name))
    shown = view.predict(picture, truth=truth)
    present = view.classes_present(shown)
    note = " ".join(shown.notes) or ("The example's derived mask is known: IoU and PA against it are shown too."
                                     if shown.truth is not None else "")
    if not present:
        note = (note + " The model found no object in this image (all background): there is no region to "
                "explain; draw one instead.").strip()
    # the previous explanation belonged to the picture no longer shown: cleared
    return (shown, shown.overlay, view.legend_markdown(shown), note,
            gr.update(choices=present, value=present[0] if present else None), shown.rgb, unfamiliar_update(shown),
            *CLEARED)


def explain_region_stream(loader, model_name, shown, chosen, context, region, replicas=None, wanted=None, **where):
    """Streamed: the maps as they come (cheapest first), then their curves, then the deletion outside the
    region with what a copy of the region would score; a region that cannot be explained (a background
    click, an empty drawing) is said on the target line, the rest left as it was. `wanted()` false: a newer
    explanation replaced this one, which stops before its next update (closing the stream drops its work)."""
    wanted = wanted or (lambda: True)
    if shown is None:
        yield "⚠ Segment an image first.", *(gr.skip(),) * 7
        return
    view = service.SegmentationView(loader(model_name), replicas=replicas)
    try:
        target = view.region(shown, **where)
        if not chosen:
            raise ValueError("Pick at least one explanation method.")
    except Exception as error:  # noqa: BLE001 - a refusal in our words; a bug goes on to `friendly`
        if not is_user_error(error):
            raise
        yield "⚠ " + user_message(error), *(gr.skip(),) * 3, unfamiliar_update(shown), *(gr.skip(),) * 3
        return
    text = f"Explaining **{target.describe(view.bundle.class_names)}**."
    waiting = figures.empty_figure("The curves appear here once the maps are in.")
    # the gallery and the plot are sent only when they change: each one sent is drawn again by the page, on a
    # small machine the same cores that compute the next curves
    drawn, plotted, plot, records = 0, None, waiting, []
    for records in view.explain_stream(shown, target, chosen, region=region):
        if not wanted():
            return
        curves_in = sum("deletion" in r for r in records)
        if curves_in != plotted:
            plot = (figures.curves_figure(records, title="Deletion and insertion of the region's class probability")
                    if curves_in else waiting)
        pending = len(chosen) - curves_in
        status = text + (f" Computing the curves… ({pending} to go)" if pending else
                         " Deleting the pixels outside the region…")
        yield (status, pictures_of(records, context) if len(records) != drawn else gr.skip(),
               service.scores_markdown(records), plot if curves_in != plotted else gr.skip(),
               unfamiliar_update(shown), *(gr.skip(),) * 3)
        drawn, plotted = len(records), curves_in
    if not wanted():
        return
    reference = view.context(shown, target, records)
    if not wanted():
        return
    # the last message is whole (nothing skipped): it is what an API caller (gradio_client) receives
    yield (text, pictures_of(records, context), service.scores_markdown(records), plot, unfamiliar_update(shown),
           service.context_curves_figure(records, reference), service.copy_caption(reference), records)


def build(ctx, model=None) -> dict:
    """The view's components and events; `model`: the menu that names the segmentation model (the Explain tab's),
    else the view has its own."""
    loader = ctx.services.loader
    replicas = ctx.services.cache.replicas  # model copies for the curves (the classifier view's pool)
    example_paths = [path for path, _ in service.examples()]
    shown_state = gr.State(None)  # the Shown of the current image (per session)
    truth_state = gr.State(None)

    gr.Markdown("Explain a **segmentation model**: the target is a class over a region, scored as the mean class "
                "logit there. Pick a class, click a coloured region, or draw one.")
    # inputs on the left; on the right the prediction, its legend and the maps (one screen), then scores and curves
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=320):
            if model is None:
                names = service.segmentation_models()
                model = gr.Dropdown(names, value=names[0] if names else None, label="Segmentation model",
                                    allow_custom_value=True, elem_id="seg-model",
                                    info="The bundled BCCD model, or a SegFormer name from the HuggingFace hub.")
            image = gr.Image(type="numpy", label="Smear photo", height=260, elem_id="seg-image")
            examples = gr.Gallery([(path, Path(path).stem) for path in example_paths],
                                  label="Example test smears (with their masks): click one", columns=3,
                                  height="auto", allow_preview=False, object_fit="cover", elem_id="seg-examples",
                                  elem_classes="example-gallery", buttons=[])
            segment_button = gr.Button("Segment", variant="primary", elem_id="seg-run")
            class_name = gr.Dropdown([], label="Class to explain (its predicted region)", elem_id="seg-class")
            methods = gr.CheckboxGroup(service.method_choices(), value=list(service.DEFAULT_METHODS),
                                       label="Methods", elem_id="seg-methods")
            explain_button = gr.Button("Explain the class's region", elem_id="seg-explain")
            with gr.Accordion("Draw a region instead", open=False):
                # a short label: the editor's toolbar sits on the label's line (a long one was cut)
                gr.Markdown("Paint the region: the class picked above is explained there.", elem_classes="help")
                drawing = gr.ImageMask(label="Region", type="numpy", elem_id="seg-drawing")
                drawn_button = gr.Button("Explain the drawn region", elem_id="seg-explain-drawn")
        with gr.Column(scale=1, min_width=320):
            predicted = gr.Image(type="numpy", label="Prediction: click a region",
                                 interactive=False, format="png", height=260, elem_id="seg-prediction")
            unfamiliar = gr.Markdown(visible=False, elem_id="seg-unfamiliar", elem_classes="warning-note")
            legend = gr.Markdown(elem_id="seg-legend")
            notes = gr.Markdown(elem_id="seg-notes")
            target_text = gr.Markdown(elem_id="seg-target")
            context_only = gr.Checkbox(False, label="Context only: the map outside the region (region outlined)",
                                       elem_id="seg-context-only",
                                       info="The segmentation already shows where the region is; what around it "
                                            "made the model call it this class?")
            gallery = gr.Gallery(label="Maps (white: the map's above-mean pixels, not drawn for "
                                       "pixel-level maps; black: the explained region)",
                                 columns=2, height="auto", format="png", object_fit="contain", elem_id="seg-maps")
    caption = gr.Markdown(elem_id="seg-copy-caption")
    table = gr.Markdown(elem_id="seg-scores")
    with gr.Row(equal_height=False):
        # side by side from 680 px, one under the other on a phone (side by side their titles ran together)
        curves = gr.Plot(label="Deletion and insertion of the region score", elem_id="seg-curves", min_width=340)
        context_curves = gr.Plot(label="Deletion outside the region", elem_id="seg-context-curves", min_width=340)
    records_state = gr.State(None)  # the last explanation's records (the toggle redraws from them)

    @friendly
    def pick_example(evt: gr.SelectData):
        path = example_paths[evt.index]
        return path, service.example_mask(path)

    @friendly
    def segment(model_name, picture, truth):
        """The prediction, its legend and the class menu (see `segment_picture`)."""
        return segment_picture(loader, model_name, picture, truth)

    asks = Asks()
    ticket_state = gr.State(None)  # the page's ticket for the explanation it asked for last
    click_state = gr.State(None)  # where the last click was (the ask step reads the click, the stream runs after)

    def ask(request: gr.Request):
        return asks.ask(request.session_hash)

    def ask_click(evt: gr.SelectData, request: gr.Request):
        return asks.ask(request.session_hash), tuple(evt.index)

    def still_wanted(request, ticket):
        session = getattr(request, "session_hash", None)
        return lambda: asks.wanted(session, ticket)

    @friendly
    def explain_class(model_name, shown, chosen_class, chosen, context, ticket=None, request: gr.Request = None):
        yield from explain_region_stream(loader, model_name, shown, chosen, context, "predicted", replicas,
                                         wanted=still_wanted(request, ticket), class_name=chosen_class)

    @friendly
    def explain_click(model_name, shown, chosen, context, click, ticket, request: gr.Request):
        yield from explain_region_stream(loader, model_name, shown, chosen, context, "clicked", replicas,
                                         wanted=still_wanted(request, ticket), click=click)

    @friendly
    def explain_drawn(model_name, shown, chosen_class, chosen, context, painted, ticket, request: gr.Request):
        layers = (painted or {}).get("layers") or []
        painted_layer = layers[0][..., 3] if layers else None
        if painted_layer is None or not painted_layer.any():
            yield "⚠ The drawn region is empty: paint over the part of the image to explain.", *(gr.skip(),) * 7
            return
        yield from explain_region_stream(loader, model_name, shown, chosen, context, "drawn", replicas,
                                         wanted=still_wanted(request, ticket), class_name=chosen_class,
                                         drawing=painted_layer)

    outputs = [target_text, gallery, table, curves, unfamiliar, context_curves, caption, records_state]
    examples.select(pick_example, None, [image, truth_state], api_visibility="private", **ctx.light)
    # another model: the shown prediction was the previous model's (its regions, its classes)
    model.change(lambda: (None, None, "", "", gr.update(choices=[], value=None), gr.update(value="", visible=False)),
                 None, [shown_state, predicted, legend, notes, class_name, unfamiliar], api_visibility="private",
                 queue=False, show_progress="hidden")
    image.upload(lambda: None, None, [truth_state], **ctx.light)
    segment_button.click(segment, [model, image, truth_state],
                         [shown_state, predicted, legend, notes, class_name, drawing, unfamiliar, target_text, gallery,
                          caption, table, curves, context_curves, records_state], api_name="segment", **ctx.heavy)
    # one place shows progress (the maps), not a pending badge on every panel
    streamed = dict(ctx.heavy, show_progress_on=[gallery], show_progress="minimal")
    # every ask (Explain, a click, a drawing) takes its ticket at once, then streams; one asked while another
    # streams replaces it ("multiple": the new one is never dropped; the old one stops at its next update)
    asked = dict(queue=False, show_progress="hidden", api_visibility="private")
    replacing = dict(streamed, trigger_mode="multiple")
    explain_button.click(ask, None, ticket_state, **asked).then(
        explain_class, [model, shown_state, class_name, methods, context_only, ticket_state], outputs,
        api_name="segment_explain", **replacing)
    predicted.select(ask_click, None, [ticket_state, click_state], **asked).then(
        explain_click, [model, shown_state, methods, context_only, click_state, ticket_state], outputs, **replacing)
    drawn_button.click(ask, None, ticket_state, **asked).then(
        explain_drawn, [model, shown_state, class_name, methods, context_only, drawing, ticket_state], outputs,
        **replacing)
    context_only.change(pictures_of, [records_state, context_only], [gallery], api_visibility="private",
                        **ctx.light)
    return {"segment_model": model, "segment_image": image, "segment_prediction": predicted,
            "segment_maps": gallery, "segment_scores": table, "segment_curves": curves,
            "segment_context_curves": context_curves, "segment_caption": caption, "segment_context_only": context_only}
