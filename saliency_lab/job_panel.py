"""What the app shows of a background job, whatever its kind (the one job panel: `saliency_lab.ui.jobs`): its
report (status line, progress, live figure, and once finished its results), the list of jobs, cancel, resume,
open.

    report = job_report(services, job_id)    # JobReport: text, percent, figure, status, finished, gallery, table
    rows = job_rows(services)                # [job, state, progress, model, started, finished, error]
    job_choices(services, kind="aha-train")  # [(label, id)] for a picker
    cancel_job(services, job_id); resume_job(services, job_id); open_job(services, job_id)

A job kind that shows more than the plain progress registers how it describes itself with `@describes("kind")`
(`saliency_lab.finetune`: CAMAL's loss and IoU, its before/after comparison; `saliency_lab.aha_train`: the
validation curve and an ETA). Errors meant for the user are ValueError.
"""
from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import figures

FINISHED = ("done", "failed", "cancelled", "interrupted")
RESUMABLE = ("failed", "cancelled", "interrupted")
JOB_HEADERS = ["job", "state", "progress", "model", "started", "finished", "error"]
# the modules that describe the app's job kinds (imported on first use: each registers with @describes)
DESCRIBED_IN = ("saliency_lab.finetune", "saliency_lab.aha_train")
_DESCRIBERS: dict = {}


@dataclass
class JobReport:
    """A job as the panel shows it; `gallery` and `table` only once it has `finished`."""

    text: str
    percent: float
    figure: object
    status: str
    finished: bool = False
    gallery: list = field(default_factory=list)
    table: list = field(default_factory=list)

    @property
    def new_model(self) -> bool:
        return self.status == "done"


def describes(kind: str):
    """Decorator: `fn(services, job, history, report) -> JobReport` describes jobs of this kind, starting from the
    plain report (`report`: status line, progress, the loss/IoU figure of its history)."""
    def register(fn):
        _DESCRIBERS[kind] = fn
        return fn
    return register


def _describer(kind):
    if not _DESCRIBERS:
        for module in DESCRIBED_IN:
            importlib.import_module(module)
    return _DESCRIBERS.get(kind)


def percent_done(job) -> float:
    progress = job["progress"]
    return 100.0 * (progress["step"] or 0) / progress["total"] if progress.get("total") else 0.0


def job_report(services, job_id) -> JobReport:
    """Status line, progress (%) and live figure of a job, with its results once finished (as its kind
    describes them)."""
    runner = services.runner()
    job = runner.get(job_id)
    history = runner.history(job_id)
    if history:
        figure = figures.job_figure(history)
    elif job["status"] in FINISHED:  # never "waiting" for a job that will not send a step
        figure = figures.empty_figure(f"No training steps: the job {job['status']} before its first step.")
    else:
        figure = figures.empty_figure("Waiting for the first step…")
    text = f"Job **{job_id}**: {job['status']}" + (f" — {job['error'][:300]}" if job.get("error") else "")
    report = JobReport(text, percent_done(job), figure, job["status"], job["status"] in FINISHED)
    describe = _describer(job.get("kind"))
    return report if describe is None else describe(services, job, history, report)


def cancel_job(services, job_id) -> str:
    """Ask the runner to cancel a job; a Markdown line. A finished job keeps its state and its reason."""
    if not job_id:
        raise ValueError("No job is running.")
    runner = services.runner()
    job = runner.get(job_id)
    if job["status"] in FINISHED:
        reason = f" — {job['error'][:300]}" if job.get("error") else ""
        return f"Job **{job_id}** has already finished: {job['status']}{reason}. Nothing to cancel."
    job = runner.cancel(job_id)
    if job["status"] == "cancelled":
        return f"Job **{job_id}**: cancelled."
    return f"Job **{job_id}**: stopping (cancel requested; it stops after the current batch)."


def _when(seconds) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) if seconds else ""


def job_rows(services, limit: int = 30, kind: str | None = None) -> list:
    """[job, state, progress, model, started, finished, error] of the most recent jobs (newest first; of one
    `kind` when given). The runner reconciled every record with its process when it started (a dead process:
    interrupted)."""
    rows = []
    for job in services.runner().list(limit):
        if kind is not None and job["kind"] != kind:
            continue
        progress = job["progress"]
        done = f"{progress['step'] or 0}/{progress['total']}" if progress.get("total") else ""
        model = Path(str((job.get("params") or {}).get("model", ""))).name.removesuffix(".json")
        if job["kind"] == "aha-train":
            model += " (AHA explainer)"
        rows.append([job["id"], job["status"], done, model, _when(job["started"]), _when(job["finished"]),
                     (job.get("error") or "")[:200]])
    return rows


def job_choices(services, limit: int = 30, kind: str | None = None) -> list:
    """[(label, id)] of the recent jobs (of one `kind` when given) for a picker."""
    return [(" · ".join(part for part in (row[0], row[1], row[3], row[2]) if part), row[0])
            for row in job_rows(services, limit, kind)]


def resume_job(services, job_id) -> str:
    """Queue an interrupted, failed or cancelled job again (it resumes from its last checkpoint)."""
    if not job_id:
        raise ValueError("Pick a job in the list first.")
    job = services.runner().get(job_id)
    if job["status"] not in RESUMABLE:
        raise ValueError(f"Job {job_id} is {job['status']}: only interrupted, failed or cancelled jobs can be "
                         "resumed.")
    services.runner().resume(job_id)
    return f"Job **{job_id}** queued again: it resumes from its last checkpoint."


def open_job(services, job_id) -> str:
    """The job to follow in the panel (its progress, or its finished result); ValueError for an unknown id."""
    if not job_id:
        raise ValueError("Pick a job in the list first.")
    job = services.runner().get(job_id)
    return f"Job **{job_id}**: {job['status']}."
