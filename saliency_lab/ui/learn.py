"""The Learn tab: what the methods and scores mean, the live sanity check, the decoy before/after view and the grid
pointing game on one mosaic."""
from __future__ import annotations

import gradio as gr

from explainers.methods import METHODS
from saliency_lab import cue_demo, learn, menus
from saliency_lab.ui.common import friendly, model_picker_update

TITLE = "Learn"
TAB_ID = "learn"


def build(ctx) -> dict:
    """Uses the Explain tab's image (ctx.shared["explain_image"]) for the sanity check."""
    sanity_model = _build(ctx.services, ctx.names, ctx.first_model, ctx.shared["explain_image"], ctx.heavy, ctx.light,
                          ctx.shared.get("explain_state"))
    return {"model_pickers": [(sanity_model, lambda: model_picker_update(ctx.services))]}


def _build(services, names, first_model, explain_image, heavy, light, explain_state=None):
    gr.Markdown("## What the methods do")
    gr.Markdown("\n\n".join(f"**{label}.** {text}" for label, text in menus.method_descriptions()))
    gr.Markdown("## What the scores mean")
    gr.Markdown(learn.METRICS_TEXT)
    if explain_state is not None:  # the Explain tab's last explanation, step by step
        from saliency_lab.ui.explain import step_viewer

        step_viewer(services, explain_state, light, "learn-step")
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

    gr.Markdown("## A segmenter with a known answer: the planted cue")
    gr.Markdown("**bccd-segformer-cue** was fine-tuned from bccd-segformer on smears where a small green disc beside "
                "a platelet decides whether it is labelled a platelet: the cue, outside the cell, is what it relies "
                "on. On an example test smear with the cue planted, each model's maps of the platelet are shown: a "
                "map that explains the cue model points at the cue; bccd-segformer, never shown the cue, is the "
                "control.", elem_classes="help")
    cue_gallery = gr.Gallery(label="Cued smear · the cue model's maps · the control's maps", show_label=False,
                             columns=3, format="png", height="auto", object_fit="contain", elem_id="cue-gallery")
    cue_info = gr.Markdown(elem_classes="help", elem_id="cue-info")
    cue_button = gr.Button("Show the planted cue and both models' maps", elem_id="cue-button")
    cue_button.click(friendly(lambda: cue_demo.cue_view(services)), None, [cue_gallery, cue_info],
                     api_name="segmentation_cue", **heavy)

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
