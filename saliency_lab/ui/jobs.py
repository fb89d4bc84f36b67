"""The one job panel every background job kind uses (CAMAL fine-tune, AHA training): start and cancel, a status
line, progress and a live plot polled by a timer, the kind's results when it finishes, and the list of jobs on this
server with open and resume. What it shows of a job comes from `saliency_lab.job_panel` (whatever the kind).

    panel = JobPanel(ctx, api="aha_train", kind="aha-train", ids={...})
    panel.controls("Start training", "Validation curve")      # the buttons, status, progress, plot
    ... the kind's own result components ...
    panel.job_list("AHA training jobs on this server")         # the picker, refresh, resume, open
    panel.wire(start, [model, data, ...], finished=[(component, lambda report: update)])
"""
from __future__ import annotations

import inspect

import gradio as gr

from saliency_lab import job_panel
from saliency_lab.ui.common import friendly, named

# api names of the panel's endpoints: the fine-tune panel keeps the names its endpoints had
FINETUNE_API = {"start": "start_finetune", "status": "finetune_status", "cancel": "cancel_finetune",
                "list": "jobs_list", "open": "open_job", "resume": "resume_job"}


def api_names(prefix: str) -> dict:
    """The endpoints of a panel named after its kind: prefix_start, prefix_status, prefix_cancel, prefix_jobs,
    prefix_open, prefix_resume."""
    return {"start": f"{prefix}_start", "status": f"{prefix}_status", "cancel": f"{prefix}_cancel",
            "list": f"{prefix}_jobs", "open": f"{prefix}_open", "resume": f"{prefix}_resume"}


class JobPanel:
    """`kind`: the job kind the list shows (None: every job, with a table of them); `api`: the endpoints' names
    (`api_names`); `ids`: elem_ids of start, cancel, status, progress, plot, pick, resume, open, table."""

    def __init__(self, ctx, *, api: dict, kind: str | None = None, ids: dict | None = None):
        self.ctx, self.api, self.kind, self.ids = ctx, api, kind, ids or {}

    def controls(self, start_label: str, plot_label: str) -> None:
        ids = self.ids
        with gr.Row():
            self.start = gr.Button(start_label, variant="primary", elem_id=ids.get("start"))
            self.cancel = gr.Button("Cancel", variant="stop", elem_id=ids.get("cancel"))
        self.job = gr.State(None)
        self.status = gr.Markdown(elem_id=ids.get("status"))
        self.progress = gr.Number(0, label="Progress (%)", precision=0, interactive=False,
                                  elem_id=ids.get("progress"))
        self.plot = gr.Plot(label=plot_label, elem_id=ids.get("plot"))
        self.timer = gr.Timer(1.0, active=False)

    def job_list(self, title: str, *, short: bool = False) -> None:
        """The jobs on this server: a table (every kind) or only a picker (one kind), refresh, resume, open."""
        ids = self.ids
        with gr.Accordion(title, open=False):
            self.table = None
            if self.kind is None:
                self.table = gr.Dataframe(headers=job_panel.JOB_HEADERS, interactive=False, elem_id=ids.get("table"),
                                          wrap=True)
            with gr.Row():
                self.pick = gr.Dropdown(self.choices() if self.kind else [], label="Job", scale=3,
                                        elem_id=ids.get("pick"))
                self.refresh = gr.Button("Refresh" if short else "Refresh the list", size="sm", scale=1)
                self.resume = gr.Button("Resume (interrupted, failed, cancelled)", size="sm", scale=1,
                                        elem_id=ids.get("resume"))
                self.open = gr.Button("Open" if short else "Open (progress or result)", size="sm", scale=1,
                                      elem_id=ids.get("open"))

    def choices(self) -> list:
        return job_panel.job_choices(self.ctx.services, kind=self.kind)

    def list_outputs(self) -> list:
        return [self.table, self.pick] if self.table is not None else [self.pick]

    def listing(self):
        """The job list now (the table's rows and the picker, or the picker)."""
        picker = gr.update(choices=self.choices())
        if self.table is None:
            return picker
        return job_panel.job_rows(self.ctx.services), picker

    def wire(self, start_fn, start_inputs, *, finished=(), list_on_start: bool = False) -> None:
        """`start_fn(*inputs) -> (job id, message)`; `finished`: [(component, fn(report) -> update)] shown when the
        followed job ends; `list_on_start`: the picker lists the new job at once."""
        services, light, api = self.ctx.services, self.ctx.light, self.api
        extra = [component for component, _ in finished]
        started = [self.pick] if list_on_start else []

        @friendly
        def start(*values):
            new_id, message = start_fn(*values)
            listed = [gr.update(choices=self.choices())] if list_on_start else []
            return (new_id, message, gr.update(active=True), 0, *listed)

        named(start, list(inspect.signature(start_fn).parameters))  # the API names the start's parameters
        self.start.click(start, start_inputs, [self.job, self.status, self.timer, self.progress, *started],
                         api_name=api["start"], **light)

        @friendly
        def poll(current):
            if not current:
                return (gr.skip(),) * 3 + (gr.update(active=False),) + (gr.skip(),) * len(extra)
            report = job_panel.job_report(services, current)
            if not report.finished:
                return (report.text, report.percent, report.figure, gr.skip()) + (gr.skip(),) * len(extra)
            return (report.text, report.percent, report.figure, gr.update(active=False),
                    *[update(report) for _, update in finished])

        self.timer.tick(poll, self.job, [self.status, self.progress, self.plot, self.timer, *extra],
                        api_name=api["status"], concurrency_id="poll", concurrency_limit=32, show_progress="hidden")
        self.cancel.click(friendly(lambda current: job_panel.cancel_job(services, current)), self.job, self.status,
                          api_name=api["cancel"], queue=False)
        self.refresh.click(friendly(self.listing), None, self.list_outputs(), api_name=api["list"], **light)

        @friendly
        def follow(chosen):
            """Follow a job in the panel above: the timer polls it (progress, then its result)."""
            return chosen, job_panel.open_job(services, chosen), gr.update(active=True)

        @friendly
        def resume(chosen):
            return chosen, job_panel.resume_job(services, chosen), gr.update(active=True)

        self.open.click(follow, self.pick, [self.job, self.status, self.timer], api_name=api["open"], **light)
        self.resume.click(resume, self.pick, [self.job, self.status, self.timer], api_name=api["resume"],
                          **light).then(friendly(self.listing), None, self.list_outputs(), api_visibility="private",
                                        **light)
