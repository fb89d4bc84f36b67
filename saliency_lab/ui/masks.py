"""The Masks & fine-tune tab: mark where the model should look (a drawing, or SAM from clicks or a box), collect
the masks in mask sets, and fine-tune a model on them with CAMAL as a background job (its panel: saliency_lab.ui.jobs)."""
from __future__ import annotations

from types import SimpleNamespace

import gradio as gr

from saliency_lab import browse as browse_module
from saliency_lab import finetune, masks
from saliency_lab.ui.common import friendly, or_skip
from saliency_lab.ui.jobs import FINETUNE_API, JobPanel

TITLE = "Masks & fine-tune"
TAB_ID = "masks"


def build(ctx) -> dict:
    """Both sections; a mask added to a set refreshes the training data, the model picked for fine-tuning the
    class labels."""
    services, light, demo = ctx.services, ctx.light, ctx.demo
    editor = _mask_editor(ctx, ctx.shared["explain_image"])
    tune = _finetune(ctx)

    @friendly
    def labels_for(model_name):
        if not model_name:
            return gr.skip()
        return gr.update(choices=masks.label_choices(services, model_name), value=None)

    editor["added"].success(tune["data_choices"], None, tune["train_data"], api_visibility="private", queue=False)
    tune["base_model"].change(labels_for, tune["base_model"], editor["mask_label"], api_visibility="private",
                              **light)
    demo.load(labels_for, tune["base_model"], editor["mask_label"], api_visibility="private", **light)
    demo.load(tune["data_choices"], None, tune["train_data"], api_visibility="private", queue=False)
    panel = tune["panel"]
    demo.load(friendly(panel.listing), None, panel.list_outputs(), api_visibility="private", **light)
    return {"model_pickers": [(tune["base_model"], lambda: gr.update(choices=finetune.finetune_models(services))),
                              (tune["train_data"], tune["data_choices"])]}


def _mask_editor(ctx, explain_image) -> dict:
    """Section 1: the editor, SAM's view and prompts, the mask preview and the mask sets."""
    ui = _mask_editor_layout(ctx)
    _wire_picture(ui, explain_image, ctx.light)
    _wire_sam_prompts(ui, ctx.services, ctx.heavy)
    added = _wire_mask_sets(ui, ctx.services, ctx.light)
    return {"added": added, "mask_label": ui.mask_label}


def _mask_editor_layout(ctx) -> SimpleNamespace:
    """The editor's components and its per-session states (SimpleNamespace, one attribute per name)."""
    services, first_model = ctx.services, ctx.first_model
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
            # a short label: the editor's toolbar sits on the label's line (a long one was cut on a phone)
            gr.Markdown("Paint a mask, or one stroke for a box.", elem_classes="help")
            editor = gr.ImageMask(label="Mask",
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
    return SimpleNamespace(editor=editor, use_explain=use_explain, draw_preview=draw_preview, stroke_box=stroke_box,
                           sam_view=sam_view, click_mode=click_mode, clear_points=clear_points,
                           segmenter_info=segmenter_info, mask_preview=mask_preview, set_name=set_name,
                           mask_label=mask_label, add_button=add_button, set_info=set_info, set_gallery=set_gallery,
                           sam_points=sam_points, current_mask=current_mask, sam_clean=sam_clean,
                           sam_original=sam_original)


def _wire_picture(ui, explain_image, light):
    """The image: from the Explain tab or uploaded into the editor (the SAM view shows an enlarged copy)."""

    def load_from_explain(path):
        picture, view = masks.load_picture(path)
        return picture, view, masks.empty_prompts(), None, None, view, picture

    ui.use_explain.click(friendly(load_from_explain), explain_image,
                         [ui.editor, ui.sam_view, ui.sam_points, ui.current_mask, ui.mask_preview, ui.sam_clean,
                          ui.sam_original],
                         api_name="mask_use_explain_image", **light)

    def editor_upload(value):
        loaded = masks.editor_picture(value)
        if loaded is None:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        rgb, view = loaded
        return view, masks.empty_prompts(), None, view, rgb

    ui.editor.upload(friendly(editor_upload), ui.editor,
                     [ui.sam_view, ui.sam_points, ui.current_mask, ui.sam_clean, ui.sam_original],
                     api_name="mask_editor_upload", **light)

    ui.draw_preview.click(friendly(masks.drawn_mask), ui.editor, [ui.mask_preview, ui.current_mask,
                                                                  ui.segmenter_info],
                          api_name="mask_from_drawing", **light)


def _wire_sam_prompts(ui, services, heavy):
    """SAM prompts: a click, a box (by API or from a painted stroke), clearing the clicks; every form ends in
    masks.PromptView -> the same five outputs."""
    sam_outputs = [ui.sam_view, ui.sam_points, ui.mask_preview, ui.current_mask, ui.segmenter_info]

    def shown(result):
        return result.view, result.prompts, or_skip(result.preview), or_skip(result.mask_state), result.note

    @friendly
    def on_sam_select(clean, original, prompts, mode, request: gr.Request, evt: gr.SelectData):
        x, y = evt.index
        return shown(masks.click(services, clean, prompts, mode, x, y, request.session_hash, original))

    ui.sam_view.select(on_sam_select, [ui.sam_clean, ui.sam_original, ui.sam_points, ui.click_mode], sam_outputs,
                       api_visibility="private", **heavy)

    # explicit-coordinate endpoints: the same logic as a click or a drag, callable from gradio_client
    click_x, click_y = gr.Number(visible=False), gr.Number(visible=False)
    click_button = gr.Button(visible=False)

    @friendly
    def on_click_api(clean, original, prompts, mode, x, y, request: gr.Request):
        """A click at (x, y) in the pixel grid of the image shown for SAM (the API form of a click)."""
        return shown(masks.click(services, clean, prompts, mode, x, y, request.session_hash, original))

    click_button.click(on_click_api, [ui.sam_clean, ui.sam_original, ui.sam_points, ui.click_mode, click_x, click_y],
                       sam_outputs, api_name="sam_click", **heavy)

    box_numbers = [gr.Number(visible=False) for _ in range(4)]
    box_button = gr.Button(visible=False)

    @friendly
    def on_box_api(clean, original, prompts, x0, y0, x1, y1, request: gr.Request):
        """A box [x0, y0, x1, y1] in the pixel grid of the image shown for SAM (the API form of a drag), with
        the clicked points."""
        return shown(masks.box_prompt(services, clean, prompts, [x0, y0, x1, y1], request.session_hash, original))

    box_button.click(on_box_api, [ui.sam_clean, ui.sam_original, ui.sam_points, *box_numbers], sam_outputs,
                     api_name="sam_box", **heavy)

    @friendly
    def on_stroke_box(value, clean, original, prompts, request: gr.Request):
        """The drag form of a box: the bounding box of the stroke painted in the editor, then SAM."""
        return shown(masks.stroke_box_prompt(services, value, clean, prompts, request.session_hash, original))

    ui.stroke_box.click(on_stroke_box, [ui.editor, ui.sam_clean, ui.sam_original, ui.sam_points], sam_outputs,
                        api_name="sam_box_from_stroke", **heavy)

    def clear(clean):
        return clean, masks.empty_prompts(), None, None, ""

    ui.clear_points.click(clear, ui.sam_clean, sam_outputs, api_name="sam_clear", queue=False)


def _wire_mask_sets(ui, services, light):
    """Mask sets: add the current mask under a class label, show a set by its name."""

    def set_view(name):
        return masks.mask_set_view(services.store, name)

    @friendly
    def add_to_set(name, label, mask_state):
        entry = masks.add_to_mask_set(services.store, name, label, mask_state)
        gr.Info(f"Added to '{name}' (entry {entry}).", duration=3)
        return set_view(name)

    added = ui.add_button.click(add_to_set, [ui.set_name, ui.mask_label, ui.current_mask],
                                [ui.set_gallery, ui.set_info], api_name="add_mask", **light)
    ui.set_name.submit(friendly(set_view), ui.set_name, [ui.set_gallery, ui.set_info], api_visibility="private",
                       **light)
    return added


def _finetune(ctx) -> dict:
    """Section 2: CAMAL fine-tuning as a background job in the job panel (every job on this server is listed)."""
    services, first_model = ctx.services, ctx.first_model
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
    panel = JobPanel(ctx, api=FINETUNE_API,
                     ids={"start": "start-finetune", "cancel": "cancel-finetune", "status": "job-status",
                          "progress": "job-progress", "pick": "job-pick", "resume": "resume-job", "open": "open-job",
                          "table": "jobs-table"})
    panel.controls("Start fine-tune", "Loss and IoU")
    before_after = gr.Gallery(label="Before / after (CAM over the image)", columns=1, format="png", height="auto",
                              object_fit="contain", elem_id="before-after")
    compare_table = gr.Dataframe(headers=["", "before", "after"], label="Before / after", interactive=False,
                                 wrap=True, elem_id="finetune-compare")
    panel.job_list("Jobs on this server (also those from before a restart)")

    def data_choices():
        choices = finetune.data_choices(services)
        return gr.update(choices=choices, value=choices[0][1] if choices else None)

    refresh_data.click(data_choices, None, train_data, api_visibility="private", queue=False)

    def start(model_name, data_choice, n_epochs, lam_value, backend_name):
        return finetune.start_finetune(services, model_name, data_choice, n_epochs, lam_value, backend_name,
                                       on_build=gr.Info)

    def new_models(report):
        return gr.update(choices=finetune.finetune_models(services)) if report.new_model else gr.skip()

    panel.wire(start, [base_model, train_data, epochs, lam, backend],
               finished=[(before_after, lambda report: report.gallery), (compare_table, lambda report: report.table),
                         (base_model, new_models)])
    return {"data_choices": data_choices, "train_data": train_data, "base_model": base_model, "panel": panel}
