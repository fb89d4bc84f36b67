"""The Review tab: review explanations image by image (verdicts and notes saved the moment they are made), and
review studies with several reviewers (saliency_lab.ui.studies)."""
from __future__ import annotations

from types import SimpleNamespace

import gradio as gr

from saliency_lab import browse as browse_module
from saliency_lab import datasets, menus, review
from saliency_lab.ui import studies as study_panel
from saliency_lab.ui.common import dataset_dropdown, friendly, model_picker_update, or_skip

TITLE = "Review"
TAB_ID = "review"


def build(ctx) -> dict:
    """The single-list review, then the study panel. Both reviewer names live in browser storage at the page's top
    level (`after_tabs`): a BrowserState inside a tab the page does not open first is mounted late (tabs render
    lazily), so a load event would read nothing and the saved name never came back after a reload."""
    services, light, demo = ctx.services, ctx.light, ctx.demo
    reviewer_saved = gr.BrowserState("", storage_key="saliency-lab-reviewer", render=False)
    reviewer, review_model, folder = _review_list(ctx, reviewer_saved)
    study = study_panel.build(ctx)
    data_dir = ctx.shared["data_dir"]

    def after_tabs():
        reviewer_saved.render()
        study["saved"].render()
        demo.load(lambda saved: saved or gr.skip(), reviewer_saved, reviewer, api_visibility="private", queue=False)
        demo.load(lambda saved: saved or gr.skip(), study["saved"], study["reviewer"], api_visibility="private",
                  queue=False)
        demo.load(study["methods_for"], study["model"], study["methods"], api_visibility="private", **light)
        demo.load(lambda: gr.update(choices=datasets.choices()), None, study["dataset"],
                  api_visibility="private", queue=False)
        demo.load(lambda: gr.update(choices=browse_module.dataset_menu(data_dir)[0]), None, folder,
                  api_visibility="private", queue=False)  # new uploads, too

    return {"model_pickers": [(review_model, lambda: model_picker_update(services))], "after_tabs": after_tabs}


def _review_list(ctx, reviewer_saved):
    """Review one data set image by image: load, filter, open, verdict, note, export."""
    ui = _review_list_layout(ctx)
    _wire_review_loading(ui, ctx.services, ctx.heavy, ctx.light)
    _wire_review_item(ui, ctx.services, ctx.heavy, ctx.light)
    # the reviewer's name survives a refresh (browser local storage)
    ui.reviewer.change(lambda n: n, ui.reviewer, reviewer_saved, api_visibility="private", queue=False)
    return ui.reviewer, ui.review_model, ui.folder


def _review_list_layout(ctx) -> SimpleNamespace:
    """The list's components and its per-session state (SimpleNamespace, one attribute per name)."""
    names, first_model, data_dir = ctx.names, ctx.first_model, ctx.shared["data_dir"]
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
    return SimpleNamespace(review_state=review_state, folder=folder, review_model=review_model, reviewer=reviewer,
                           load_button=load_button, class_filter=class_filter, correctness=correctness, limit=limit,
                           page=page, progress_md=progress_md, gallery=gallery, maps=maps, item_info=item_info,
                           plausible=plausible, implausible=implausible, unsure=unsure, note=note, saved=saved,
                           previous=previous, following=following, export=export, export_file=export_file,
                           position=position, open_button=open_button)


def _wire_review_loading(ui, services, heavy, light):
    """Load a data set's predictions, filter them by class and correctness, page through them."""

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

    gallery_outputs = [ui.gallery, ui.review_state, ui.progress_md, ui.page]
    ui.load_button.click(load, [ui.folder, ui.review_model, ui.limit, ui.class_filter, ui.correctness, ui.reviewer],
                         [*gallery_outputs, ui.class_filter], api_name="review_load", **heavy)

    @friendly
    def refilter(state, class_value, correct_value, page_value, name):
        return page_outputs(review.filter_page(services, state, class_value, correct_value, page_value, name))

    gr.on([ui.class_filter.input, ui.correctness.input], lambda s, c, k, n: refilter(s, c, k, 1, n),
          [ui.review_state, ui.class_filter, ui.correctness, ui.reviewer], gallery_outputs,
          api_visibility="private", **light)
    ui.page.submit(refilter, [ui.review_state, ui.class_filter, ui.correctness, ui.page, ui.reviewer],
                   gallery_outputs, api_name="review_page", **light)


def _wire_review_item(ui, services, heavy, light):
    """Open an image (click, position, previous, next), record its verdict and note, export the verdicts."""

    @friendly
    def open_item(state, index, name):
        """Open the image at position `index` of the filtered list (explicit coordinates)."""
        item = review.open_item(services, state, index, name)
        return item.items, item.info, item.note, item.saved, item.state, item.index

    open_outputs = [ui.maps, ui.item_info, ui.note, ui.saved, ui.review_state, ui.position]

    def on_select(state, name, evt: gr.SelectData):
        return open_item(state, (state or {}).get("page_start", 0) + evt.index, name)

    verdict_buttons = [ui.plausible, ui.implausible, ui.unsure]

    def show_verdict(state, name):
        """The saved verdict of the opened image, shown as the selected (primary) button."""
        variants = review.verdict_variants(review.current_verdict(services, state, name))
        return [gr.update(variant=v) for v in variants]

    selected = dict(api_visibility="private", queue=False, show_progress="hidden")
    opened = [ui.gallery.select(on_select, [ui.review_state, ui.reviewer], open_outputs, api_visibility="private",
                                **heavy),
              ui.open_button.click(open_item, [ui.review_state, ui.position, ui.reviewer], open_outputs,
                                   api_name="review_open", **heavy),
              ui.previous.click(friendly(lambda state, name: open_item(state, review.neighbour_index(state, -1), name)),
                                [ui.review_state, ui.reviewer], open_outputs, api_name="review_previous", **heavy),
              ui.following.click(friendly(lambda state, name: open_item(state, review.neighbour_index(state, 1), name)),
                                 [ui.review_state, ui.reviewer], open_outputs, api_name="review_next", **heavy)]
    for event in opened:
        event.then(show_verdict, [ui.review_state, ui.reviewer], verdict_buttons, **selected)

    def verdict_fn(verdict):
        @friendly
        def record(state, name, text):
            return review.record_verdict(services, state, name, verdict, text)
        return record

    for button, verdict in zip(verdict_buttons, review.VERDICTS):
        button.click(verdict_fn(verdict), [ui.review_state, ui.reviewer, ui.note], [ui.saved, ui.progress_md],
                     api_name=f"verdict_{verdict}", **light).then(show_verdict, [ui.review_state, ui.reviewer],
                                                                 verdict_buttons, **selected)

    @friendly
    def save_note(state, name, text):
        return or_skip(review.save_note(services, state, name, text))

    ui.note.input(save_note, [ui.review_state, ui.reviewer, ui.note], ui.saved, api_name="review_note",
                  trigger_mode="always_last", **light)
    ui.note.blur(save_note, [ui.review_state, ui.reviewer, ui.note], ui.saved, api_visibility="private",
                 **light)  # pastes, too

    @friendly
    def export_csv(state, name):
        return review.export_verdicts(services, state)

    ui.export.click(export_csv, [ui.review_state, ui.reviewer], ui.export_file, api_name="review_export", **light)
