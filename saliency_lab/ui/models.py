"""The Models tab: import your own model (timm architecture + safetensors weights + class names), list and remove
imports, and train an AHA explainer for any model as a background job."""
from __future__ import annotations

import gradio as gr

from explainers.import_model import PICKLE_SUFFIXES
from saliency_lab import aha_train, datasets, models_tab
from saliency_lab.ui.common import named, refusal_in_status
from saliency_lab.ui.jobs import JobPanel, api_names

TITLE = "Models"
TAB_ID = "models"


def build(ctx) -> dict:
    """An import or a removal refreshes every model picker (`models_changed`); selecting the tab refreshes its own
    lists (`on_select`)."""
    parts = _build(ctx)
    return {"models_changed": parts["changed"], "on_select": (parts["refresh"], parts["refresh_outputs"])}


def _build(ctx) -> dict:
    services, heavy, light = ctx.services, ctx.heavy, ctx.light
    """Import your own model (timm architecture + safetensors weights + class names), list and remove imports."""
    gr.Markdown("Explain **your own model**: a [timm](https://huggingface.co/docs/timm) architecture and its weights "
                "as a **safetensors** state dict (pickled `.pt`/`.pth`/`.bin` checkpoints are refused: loading them "
                "can run code; the error says how to convert one), plus the class names (a text file, one per line, "
                "or a CSV). The checkpoint must fit the architecture exactly; one forward pass checks it. Imported "
                "models are stored in the data folder and appear in every model menu.", elem_classes="help")
    with gr.Row(equal_height=False):
        with gr.Column(scale=5, min_width=320):
            with gr.Row():
                # the picker takes pickled checkpoints too, so that our refusal (with the line that converts one)
                # is what a person reads, not the browser's "Invalid file type"
                weights = gr.File(label="Weights (.safetensors)", file_types=[".safetensors", *PICKLE_SUFFIXES],
                                  type="filepath",
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

    def import_files(*args):
        message = models_tab.import_upload(services, *args)
        return (message, *listing())

    do_import = named(refusal_in_status(import_files, untouched=2),  # a refused import: the table and menu stay
                      ["weights", "classes", "arch", "name", "input_size", "mean", "std", "model_args", "imported_by",
                       "crop_pct"])

    def remove_model(model_name):
        message = models_tab.remove(services, model_name)
        return (message, *listing())

    do_remove = refusal_in_status(remove_model, untouched=2)

    imported = import_button.click(do_import, [weights, classes, arch, name, input_size, mean, std, model_args,
                                               imported_by, crop_pct], [status, table, to_remove], api_name="import_model",
                                   **heavy)
    removed = remove_button.click(do_remove, to_remove, [status, table, to_remove], api_name="remove_model", **light)
    train = _aha_training(ctx)
    for event in (imported, removed):  # a new or removed model: the training form's model list follows
        event.success(train["refresh"], None, train["refresh_outputs"], api_visibility="private", queue=False)

    def refresh_all():
        return (*listing(), *train["refresh"]())

    return {"changed": [imported, removed], "refresh": refresh_all,
            "refresh_outputs": [table, to_remove, *train["refresh_outputs"]]}


def _aha_training(ctx) -> dict:
    """The Models tab's "Train an AHA explainer" section: an 'aha-train' job (saliency_lab.aha_train) in the job
    panel, its validation curve drawn live, and the AHA jobs with resume."""
    services = ctx.services
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
        aha_data = gr.Dropdown(datasets.choices(), value=None, label="Training data (labelled)", scale=3,
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
    panel = JobPanel(ctx, api=api_names("aha_train"), kind=aha_train.KIND,
                     ids={"start": "aha-start", "cancel": "aha-cancel", "status": "aha-status",
                          "progress": "aha-progress", "plot": "aha-plot", "pick": "aha-job-pick",
                          "resume": "aha-resume", "open": "aha-open"})
    panel.controls("Start training", "Validation deletion and insertion over the training steps")
    panel.job_list("AHA training jobs on this server (all jobs: Masks & fine-tune tab)", short=True)

    def start(model_name, dataset, validation, steps, minutes, seed, backend):
        return aha_train.start_training(services, model_name, dataset, validation, steps, minutes, seed, backend)

    def new_models(report):
        return gr.update(choices=aha_train.model_choices(services)) if report.status == "done" else gr.skip()

    panel.wire(start, [aha_model, aha_data, aha_val, aha_steps, aha_minutes, aha_seed, aha_backend],
               finished=[(aha_model, new_models), (panel.pick, lambda report: gr.update(choices=panel.choices()))],
               list_on_start=True)

    def refresh():
        return (gr.update(choices=aha_train.model_choices(services)), gr.update(choices=datasets.choices()),
                gr.update(choices=aha_train.validation_choices()), gr.update(choices=panel.choices()))

    return {"refresh": refresh, "refresh_outputs": [aha_model, aha_data, aha_val, panel.pick]}
