"""The Review tab's study panel: data sets in (named or uploaded), a study created with its code, reviewing under a
name (open verdicts or blinded 1-5 ratings of maps A, B, C...), results and exports."""
from __future__ import annotations

from types import SimpleNamespace

import gradio as gr

from explainers.methods import METHODS
from explainers.review_report import SLOTS
from saliency_lab import datasets, menus, review_data, studies
from saliency_lab.ui.common import friendly, or_skip, refusal_in_status

MAX_SLOTS = 8  # maps A..H in a blinded study


def build(ctx) -> dict:
    """The panel; returns what the Review tab wires on page load: the reviewer's name kept in browser storage
    (rendered at the page's top level by the Review tab), the model and methods menus, the data-set menu."""
    ui = _layout(ctx)
    _wire_data_and_create(ctx, ui)
    _wire_reviewing(ctx, ui)
    _wire_results(ctx, ui)
    ui.study_reviewer.change(lambda n: n, ui.study_reviewer, ui.study_reviewer_saved, api_visibility="private",
                             queue=False)
    return {"saved": ui.study_reviewer_saved, "reviewer": ui.study_reviewer, "model": ui.study_model,
            "methods": ui.study_methods, "methods_for": ui.methods_for, "dataset": ui.study_dataset}


def _layout(ctx) -> SimpleNamespace:
    names, first_model = ctx.names, ctx.first_model
    gr.Markdown("## Review studies\nSeveral reviewers, open verdicts or a **blinded comparison** (maps shown as A, B, "
                "C… in a random order, rated 1-5), agreement statistics. A study is opened with its name and the "
                "**reviewers' code** shown once to its creator, who also gets an **owner code**: the only key to the "
                "results until the study is closed.", elem_classes="help")
    study_state = gr.State(None)
    study_reviewer_saved = gr.BrowserState("", storage_key="saliency-lab-study-reviewer", render=False)  # build_app
    with gr.Accordion("1 · Data set: pick one or upload", open=False):
        with gr.Row():
            upload_files = gr.File(label="A zip with labels.csv (file,class_index), a MedMNIST .npz, or images "
                                         "(no labels: predictions only)", file_count="multiple", scale=3,
                                   elem_id="study-upload")
            upload_folder = gr.File(label="…or a whole folder (images, with its labels.csv if it has one)",
                                    file_count="directory", scale=2, elem_id="study-upload-folder")
            with gr.Column(scale=2):
                upload_name = gr.Textbox(label="Name of the data set", placeholder="e.g. ward-7-smears",
                                         elem_id="study-upload-name")
                upload_button = gr.Button("Upload and check", elem_id="study-upload-button")
        upload_info = gr.Markdown(elem_classes="help", elem_id="study-upload-info")
    with gr.Accordion("2 · Create a study", open=False):
        with gr.Row():
            study_new_name = gr.Textbox(label="Study name", placeholder="e.g. cells-2026-blinded", elem_id="study-new-name")
            study_dataset = gr.Dropdown(datasets.choices(), label="Data set", allow_custom_value=True,
                                        elem_id="study-dataset")  # uploads join the list; the name is checked
            study_model = gr.Dropdown(menus.model_choices(names), value=first_model, label="Model", elem_id="study-model")
        with gr.Row():
            study_methods = gr.CheckboxGroup(  # every method (the API may name any); narrowed to the model on load
                [(menus.method_label(n), n) for n in menus.method_order(list(METHODS)) if not METHODS[n].baseline],
                label="Methods to show", elem_id="study-methods")
            study_protocol = gr.Radio([("Open: verdict + note", "open"), ("Blinded comparison: maps A, B, C… rated 1-5",
                                                                           "blinded")], value="blinded",
                                      label="Protocol", elem_id="study-protocol")
        with gr.Row():
            study_reviewers = gr.Textbox(label="Reviewers (comma-separated; empty: anyone with the code)",
                                         placeholder="dr-lee, dr-okafor", elem_id="study-reviewers")
            study_count = gr.Slider(2, 500, value=30, step=1, label="Images (spread over the data set)",
                                    elem_id="study-count")
            study_create = gr.Button("Create study", variant="primary", elem_id="study-create")
        study_created = gr.Markdown(elem_id="study-created")
    with gr.Accordion("3 · Review", open=True):
        with gr.Row():
            study_name = gr.Textbox(label="Study name", elem_id="study-name")
            study_code = gr.Textbox(label="Reviewers' code", type="password", elem_id="study-code")
            study_reviewer = gr.Textbox(label="Your name (reviewer)", elem_id="study-reviewer")
            study_open = gr.Button("Open study", variant="primary", elem_id="study-open")
        study_progress = gr.Markdown(elem_id="study-progress")
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                study_maps = gr.Gallery(label="Image and maps", columns=5, height=280, format="png",
                                        allow_preview=True, elem_id="study-maps")
                study_info = gr.Markdown(elem_id="study-info")
            with gr.Column(scale=2):
                with gr.Row(elem_classes="verdict-row", visible=False) as verdict_row:
                    verdict_buttons = [gr.Button(v.capitalize(), elem_id=f"study-verdict-{v}")
                                       for v in ("plausible", "implausible", "unsure")]
                ratings = [gr.Radio([str(v) for v in studies.RATING_VALUES], label=f"Map {slot}", visible=False,
                                    elem_id=f"study-rate-{slot}") for slot in SLOTS[:MAX_SLOTS]]
                best = gr.Radio([], label="Best map (optional)", visible=False, elem_id="study-best")
                study_note = gr.Textbox(label="Note (saved as you type)", lines=3, elem_id="study-note")
                study_saved = gr.Markdown(elem_classes="help", elem_id="study-saved")
                with gr.Row():
                    study_previous = gr.Button("← Previous", elem_id="study-previous")
                    study_next = gr.Button("Next →", elem_id="study-next")
                    study_next_open = gr.Button("Next to do", elem_id="study-next-open")
    with gr.Accordion("4 · Results (reveals the method names)", open=False):
        gr.Markdown("The results and exports name the methods, so they need the study's **owner code** (shown once "
                    "to its creator) until the owner closes the study; from then on the reviewers' code shows them "
                    "too, and no more responses are taken.", elem_classes="help")
        with gr.Row():
            owner_code = gr.Textbox(label="Owner code (results and exports)", type="password",
                                    elem_id="study-owner-code", scale=2)
            results_button = gr.Button("Show results", elem_id="study-results-button")
            export_csv = gr.Button("Export responses (CSV)", elem_id="study-export-csv")
            export_json = gr.Button("Export report (JSON)", elem_id="study-export-json")
            close_button = gr.Button("Close the study", variant="stop", elem_id="study-close")
        results_md = gr.Markdown(elem_id="study-results")
        with gr.Row():
            ratings_plot = gr.Plot(label="Ratings per method", elem_id="study-ratings-plot")
            kappa_plot = gr.Plot(label="Agreement between reviewers", elem_id="study-kappa-plot")
        export_file = gr.File(label="Export", elem_id="study-export")
        report_json = gr.JSON(label="Report", visible=False)
    hidden_position = gr.Number(visible=False, precision=0)
    hidden_slot = gr.Textbox(visible=False)
    hidden_rating = gr.Number(visible=False, precision=0)
    hidden_verdict = gr.Textbox(visible=False)
    show_button, rate_button, best_button, verdict_button = (gr.Button(visible=False) for _ in range(4))
    return SimpleNamespace(**locals())


def _wire_data_and_create(ctx, ui) -> None:
    services, heavy, light = ctx.services, ctx.heavy, ctx.light
    # ---- data in
    @friendly
    def upload(files, name, folder=None):
        result = review_data.import_upload(list(files or []) + list(folder or []), name)
        return result.message(), gr.update(choices=datasets.choices(), value=result.name)

    ui.upload_button.click(upload, [ui.upload_files, ui.upload_name, ui.upload_folder], [ui.upload_info, ui.study_dataset],
                        api_name="review_upload", **light)

    # ---- create
    def methods_for(model_name):
        try:
            choices = studies.study_method_choices(services.bundle(model_name))
        except Exception:  # noqa: BLE001 - the create button says why
            return gr.update(choices=[], value=[])
        return gr.update(choices=choices, value=[v for _, v in choices][:3])

    ui.study_model.change(methods_for, ui.study_model, ui.study_methods, api_visibility="private", **light)

    @friendly
    def create(name, dataset_name, model_name, methods, reviewers, protocol, count, progress=gr.Progress()):
        _, _, text = studies.create_study(
            services, name, dataset_name, model_name, methods, reviewers, protocol, count,
            progress=lambda done, total: progress(done / total if total else 0, desc=f"Predicting {total} images…"))
        return text, name

    ui.study_create.click(create, [ui.study_new_name, ui.study_dataset, ui.study_model, ui.study_methods, ui.study_reviewers,
                                ui.study_protocol, ui.study_count], [ui.study_created, ui.study_name],
                       api_name="review_study_create", **heavy)
    ui.methods_for = methods_for


def _wire_reviewing(ctx, ui) -> None:
    services, heavy, light = ctx.services, ctx.heavy, ctx.light
    # ---- review
    item_outputs = [ui.study_maps, ui.study_info, ui.study_note, ui.study_saved, ui.study_progress, ui.study_state, ui.verdict_row,
                    *ui.ratings, ui.best]

    def item_updates(shown):
        blinded = shown.state["protocol"] == "blinded"
        response = shown.response
        rating_updates = []
        for k, slot in enumerate(SLOTS[:MAX_SLOTS]):
            visible = blinded and slot in shown.slots
            value = response["ratings"].get(slot)
            rating_updates.append(gr.update(visible=visible, value=None if value is None else str(value)))
        best_update = gr.update(visible=blinded, choices=[("none", "none")] + [(f"Map {s}", s) for s in shown.slots],
                                value=response["best"] or "none")
        saved_line = ("Saved verdict: **%s**." % response["verdict"]) if response.get("verdict") else ""
        return (shown.items, shown.info, response["note"], saved_line, shown.progress, shown.state,
                gr.update(visible=not blinded), *rating_updates, best_update)

    @friendly
    def open_study(name, code, reviewer):
        state, _ = studies.open_study(services, name, code, reviewer)
        return item_updates(studies.show_item(services, state, state["position"], reviewer))

    ui.study_open.click(open_study, [ui.study_name, ui.study_code, ui.study_reviewer], item_outputs, api_name="review_study_open",
                     **heavy)

    @friendly
    def show(state, reviewer, position):
        return item_updates(studies.show_item(services, state, position, reviewer))

    ui.show_button.click(show, [ui.study_state, ui.study_reviewer, ui.hidden_position], item_outputs, api_name="review_study_show",
                      **heavy)
    ui.study_previous.click(lambda s, r: show(s, r, studies.step(services, s, r, -1)), [ui.study_state, ui.study_reviewer],
                         item_outputs, api_visibility="private", **heavy)
    ui.study_next.click(lambda s, r: show(s, r, studies.step(services, s, r, 1)), [ui.study_state, ui.study_reviewer],
                     item_outputs, api_visibility="private", **heavy)
    ui.study_next_open.click(lambda state, reviewer: show(state, reviewer, studies.next_open(services, state, reviewer)), [ui.study_state, ui.study_reviewer],
                          item_outputs, api_name="review_study_next", **heavy)

    @friendly
    def verdict(state, reviewer, value, note):
        return studies.record_verdict(services, state, reviewer, value, note)

    for button, value in zip(ui.verdict_buttons, ("plausible", "implausible", "unsure")):
        button.click(lambda s, r, n, v=value: verdict(s, r, v, n), [ui.study_state, ui.study_reviewer, ui.study_note],
                     [ui.study_saved, ui.study_progress], api_visibility="private", **light)
    ui.verdict_button.click(verdict, [ui.study_state, ui.study_reviewer, ui.hidden_verdict, ui.study_note],
                         [ui.study_saved, ui.study_progress], api_name="review_study_verdict", **light)

    @friendly
    def rate(state, reviewer, slot, value):
        saved_line, progress_line = studies.rate(services, state, reviewer, slot, value)
        return or_skip(saved_line), progress_line

    for radio, slot in zip(ui.ratings, SLOTS[:MAX_SLOTS]):
        radio.input(lambda s, r, v, slot=slot: rate(s, r, slot, v), [ui.study_state, ui.study_reviewer, radio],
                    [ui.study_saved, ui.study_progress], api_visibility="private", **light)
    ui.rate_button.click(rate, [ui.study_state, ui.study_reviewer, ui.hidden_slot, ui.hidden_rating], [ui.study_saved, ui.study_progress],
                      api_name="review_study_rate", **light)

    @friendly
    def pick(state, reviewer, slot):
        return studies.pick_best(services, state, reviewer, slot)

    ui.best.input(pick, [ui.study_state, ui.study_reviewer, ui.best], [ui.study_saved, ui.study_progress], api_visibility="private",
               **light)
    ui.best_button.click(pick, [ui.study_state, ui.study_reviewer, ui.hidden_slot], [ui.study_saved, ui.study_progress],
                      api_name="review_study_best", **light)

    @friendly
    def note_saved(state, reviewer, text):
        return or_skip(studies.save_note(services, state, reviewer, text))

    ui.study_note.input(note_saved, [ui.study_state, ui.study_reviewer, ui.study_note], ui.study_saved, api_name="review_study_note",
                     trigger_mode="always_last", **light)


def _wire_results(ctx, ui) -> None:
    services, heavy, light = ctx.services, ctx.heavy, ctx.light
    # ---- results
    def results(name, code, progress=gr.Progress()):
        """The study's results; a refused code (wrong, or the reviewers' before the owner closes the study) is one
        sentence in the results box, the figures and report left as they were (no red badge on each)."""
        shown = studies.study_results(
            services, name, code,
            progress=lambda done, total: progress(done / total if total else 0, desc="Deletion/insertion AUCs…"))
        return shown.summary, shown.ratings_figure, shown.kappa_figure, shown.report

    # the owner code (not the reviewers' code of section 3) unlocks the results until the owner closes the study
    ui.results_button.click(refusal_in_status(results, 3), [ui.study_name, ui.owner_code], [ui.results_md, ui.ratings_plot, ui.kappa_plot, ui.report_json],
                         api_name="review_agreement", **heavy)
    ui.export_csv.click(friendly(lambda name, code: studies.export_study(services, name, code, "csv")), [ui.study_name, ui.owner_code],
                     ui.export_file, api_name="review_study_export_csv", **light)
    ui.export_json.click(friendly(lambda name, code: studies.export_study(services, name, code, "json")), [ui.study_name, ui.owner_code],
                      ui.export_file, api_name="review_study_export_json", **light)
    ui.close_button.click(friendly(lambda name, code: studies.close_study(services, name, code)), [ui.study_name, ui.owner_code],
                          ui.results_md, api_name="review_study_close", **light)
