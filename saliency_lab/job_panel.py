"""What the app shows of a background job, whatever its kind (the one job panel: `saliency_lab.ui.jobs`): its
report (status line, progress, live figure, and once finished its results), the list of jobs, cancel, resume,
open.

    report = job_report(services, job_id)    # JobReport: text, percent, figure, status, finished, gallery, table
    rows = job_rows(services)                # [job, kind, state, progress, model, started, finished, error]
    job_choices(services, kind="aha-train")  # [(label, id)] for a picker
    cancel_job(services, job_id); resume_job(services, job_id); open_job(services, job_id)

Every job's report says how far it is, whatever its kind, from the job's record and its metric history (the rows
`JobContext.progress(step, total, **metrics)` writes): step x of N, the epoch when the rows carry one, the time
elapsed, an ETA from the recent step rate (`eta_text`; "estimating…" until there are two timed points) and the
latest value of each metric (`METRIC_NAMES` gives readable names: loss, IoU, ...). A kind with a time budget may
send `budget_fraction` (the share of it spent): the ETA is then the earlier of the two ends.

A job kind that shows more than the plain progress registers how it describes itself with `@describes("kind")`
(`saliency_lab.finetune`: CAMAL's before/after comparison; `saliency_lab.aha_train`: the validation curve, its
minutes budget; `saliency_lab.agents`: return and IoU curves). Errors meant for the user are ValueError.
"""
from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import figures

FINISHED = ("done", "failed", "cancelled", "interrupted")
RESUMABLE = ("failed", "cancelled", "interrupted")
JOB_HEADERS = ["job", "kind", "state", "progress", "model", "started", "finished", "error"]
# the modules that describe the app's job kinds (imported on first use: each registers with @describes)
DESCRIBED_IN = ("saliency_lab.finetune", "saliency_lab.aha_train", "saliency_lab.agents")
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


# readable names of the metrics the job kinds send; others show as their key with spaces
METRIC_NAMES = {"loss": "loss", "iou": "IoU", "ce": "cross-entropy", "reg": "mask term", "alpha": "CAM inside mask",
                "beta": "CAM outside mask", "accuracy": "accuracy", "return": "return",
                "return_100": "mean return (last 100)", "val_deletion_auc": "val deletion AUC",
                "val_insertion_auc": "val insertion AUC", "val_ins_minus_del": "val insertion − deletion"}
FIRST_METRICS = ("loss", "iou")  # shown first, then the others in the order the rows brought them
MAX_METRICS = 6
# bookkeeping in the rows, not metrics to show (before_X is shown beside X)
NOT_SHOWN = {"t", "step", "epoch", "phase", "elapsed_s", "resumed_from", "seconds", "budget_fraction", "best_step",
             "lr", "tau", "grid", "grad_norm", "update", "episodes"}
RATE_WINDOW = 20  # timed rows the step rate is measured over (the most recent ones of this run of the job)
FINISHING = " · finishing…"


def duration_text(seconds) -> str:
    """'45 s', '3 min 20 s', '2 h 05 min'."""
    seconds = max(0, int(round(float(seconds))))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def this_run(history) -> list:
    """The rows of the job's latest run: from its last `phase="start"` row, or from where the step went back (a
    resumed job starts its steps again from its checkpoint)."""
    first = 0
    for index, point in enumerate(history):
        previous = history[index - 1].get("step") if index else None
        if point.get("phase") == "start" or (index and point.get("step") is not None and previous is not None
                                               and point["step"] < previous):
            first = index
    return list(history[first:])


def _timed(point) -> bool:
    return isinstance(point.get("t"), (int, float)) and isinstance(point.get("step"), (int, float))


def _budget_left(run, now, minutes, started):
    """Seconds left of the time budget, or None: `minutes` counted from the run's start row (with the `elapsed_s`
    of the runs before it), else the latest `budget_fraction` of the rows against the job's start."""
    start = next((p for p in reversed(run) if p.get("phase") == "start" and _timed(p)), None)
    if minutes and start is not None:
        return 60 * float(minutes) - float(start.get("elapsed_s") or 0) - (now - start["t"])
    latest = next((p for p in reversed(run) if isinstance(p.get("budget_fraction"), (int, float)) and _timed(p)),
                  None)
    if latest is None or not started:
        return None
    fraction, spent = float(latest["budget_fraction"]), latest["t"] - float(started)
    if fraction >= 1:
        return 0.0
    if fraction <= 0 or spent <= 0:
        return None
    return spent / fraction - spent - (now - latest["t"])


def eta_text(step, total, history, now, minutes=None, *, finishing=FINISHING, started=None) -> str:
    """'step 12/200 (6%) · 1.30 s/step · about 4 min left (ETA 14:05)' for a running job.

    The rate is that of the recent steps of this run of the job (`this_run`, at most `RATE_WINDOW` rows back; the
    job's current step at `now` is the last point when it is ahead of the rows): "estimating…" until there are
    two timed points. The time left is capped by a budget (`minutes`, or the rows' `budget_fraction` against
    `started`); `finishing` is said once the steps are done or the budget is spent."""
    step, total = int(step or 0), int(total or 0)
    run = this_run(history)
    budget_left = _budget_left(run, now, minutes, started)
    if not total and not step:
        return "starting…"
    line = f"step {step}/{total} ({100 * step / total:.0f}%)" if total else f"step {step}"
    if total and step >= total:
        return line + finishing
    if budget_left is not None and budget_left <= 0:
        spent = f"the {float(minutes):g} min budget" if minutes else "the time budget"
        return line + f" · {spent} is spent" + finishing
    points = [(float(p["t"]), int(p["step"])) for p in run if _timed(p)][-RATE_WINDOW:]
    if not points or step > points[-1][1]:
        points.append((float(now), step))
    per_step = left = None
    if len(points) >= 2 and points[-1][1] > points[0][1]:
        (t0, s0), (t1, s1) = points[0], points[-1]
        per_step = (t1 - t0) / (s1 - s0)
        if total:
            left = max(0.0, per_step * (total - s1) - (now - t1))
    if budget_left is not None:
        left = budget_left if left is None else min(left, budget_left)
    if per_step is not None:  # fast steps (an agent's environment steps) as a rate
        line += f" · {per_step:.2f} s/step" if per_step >= 0.1 or per_step <= 0 else f" · {1 / per_step:.3g} steps/s"
    if left is None:
        return line + (" · ETA estimating… (measuring the speed)" if total or budget_left is not None else "")
    shown = f"{left:.0f} s" if left < 90 else f"{left / 60:.0f} min"
    return f"{line} · about {shown} left (ETA {time.strftime('%H:%M', time.localtime(now + left))})"


def latest_metrics(history) -> dict:
    """{key: latest value} of the numeric metrics in the rows (loss and IoU first), at most `MAX_METRICS`."""
    latest = {}
    for point in history:
        for key, value in point.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in NOT_SHOWN:
                latest[key] = value
    shown = [k for k in FIRST_METRICS if k in latest] + [k for k in latest if k not in FIRST_METRICS
                                                         and not k.startswith("before_")]
    return {key: latest[key] for key in shown[:MAX_METRICS]}


def metrics_text(history) -> str:
    """'loss 0.4123 · IoU 0.612 (before 0.401)': the latest metrics of the rows, readable names."""
    latest = latest_metrics(history)
    before = {}
    for point in history:
        before.update({k[len("before_"):]: v for k, v in point.items()
                       if k.startswith("before_") and isinstance(v, (int, float))})
    return " · ".join(f"{METRIC_NAMES.get(k, k.replace('_', ' '))} {v:.4g}"
                      + (f" (before {before[k]:.4g})" if k in before else "") for k, v in latest.items())


def progress_text(job, history, now=None, *, minutes=None, finishing=FINISHING) -> str:
    """How far a job is, whatever its kind: step x of N (and the epoch), elapsed, ETA while it runs (`eta_text`),
    the latest metrics; '' for a job that has not started."""
    now = time.time() if now is None else now
    progress, status = job.get("progress") or {}, job.get("status")
    started, finished = job.get("started"), job.get("finished")
    if status == "queued" or (status in FINISHED and not history and not progress.get("step")):
        return ""
    if status == "running":
        head, _, rest = eta_text(progress.get("step"), progress.get("total"), history, now, minutes,
                                 finishing=finishing, started=started).partition(" · ")
        parts = [head] + ([rest] if rest else [])
    else:
        step, total = int(progress.get("step") or 0), progress.get("total")
        parts = [f"step {step}/{total}" if total else f"step {step}"]
    run = this_run(history)
    epoch = next((p["epoch"] for p in reversed(run) if isinstance(p.get("epoch"), (int, float))), None)
    if epoch is not None:  # beside the step
        epochs = (job.get("params") or {}).get("epochs")
        parts.insert(1, f"epoch {int(epoch)}" + (f"/{int(epochs)}" if isinstance(epochs, (int, float)) else ""))
    if started:
        parts.append(("elapsed " if status == "running" else "ran ")
                     + duration_text((now if status == "running" or not finished else finished) - float(started)))
    shown = metrics_text(run if run and latest_metrics(run) else history)
    return " · ".join(parts + ([shown] if shown else []))


def percent_done(job) -> float:
    progress = job["progress"]
    return 100.0 * (progress["step"] or 0) / progress["total"] if progress.get("total") else 0.0


def job_report(services, job_id) -> JobReport:
    """Status line (with `progress_text`: step, epoch, elapsed, ETA, latest metrics), progress (%) and live figure
    of a job, with its results once finished (as its kind describes them)."""
    runner = services.runner()
    job = runner.get(job_id)
    history = runner.history(job_id)
    if history:
        figure = figures.job_figure(history)
    elif job["status"] in FINISHED:  # never "waiting" for a job that will not send a step
        figure = figures.empty_figure(f"No training steps: the job {job['status']} before its first step.")
    else:
        figure = figures.empty_figure("Waiting for the first step…")
    line = progress_text(job, history)
    text = (f"Job **{job_id}**: {job['status']}" + (f" · {line}" if line else "")
            + (f" — {job['error'][:300]}" if job.get("error") else ""))
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
    """[job, kind, state, progress, model, started, finished, error] of the most recent jobs (newest first; of one
    `kind` when given). The runner reconciled every record with its process when it started (a dead process:
    interrupted). The model of a job that makes one (an agent) is the one it makes."""
    rows = []
    for job in services.runner().list(limit):
        if kind is not None and job["kind"] != kind:
            continue
        rows.append([job["id"], job["kind"], job["status"], progress_cell(job), job_model(job), _when(job["started"]),
                     _when(job["finished"]), (job.get("error") or "")[:200]])
    return rows


def progress_cell(job: dict) -> str:
    """"step/total", "step N" where the total is not known, "done" for a finished job that said none."""
    progress = job.get("progress") or {}
    step, total = progress.get("step"), progress.get("total")
    if total:
        return f"{step or 0}/{total}"
    if step:
        return f"step {step}"
    return "done" if job["status"] == "done" else ""


def job_model(job: dict) -> str:
    """The model a job works on (fine-tune, AHA training) or makes (an agent: its name and scenario)."""
    params = job.get("params") or {}
    model = Path(str(params.get("model", ""))).name.removesuffix(".json")
    if job["kind"] == "aha-train":
        model += " (AHA explainer)"
    if not model and params.get("name"):
        model = str(params["name"]) + (f" ({params['scenario']})" if params.get("scenario") else "")
    return model


def job_choices(services, limit: int = 30, kind: str | None = None) -> list:
    """[(label, id)] of the recent jobs (of one `kind` when given) for a picker."""
    return [(" · ".join(part for part in (row[0], row[2], row[4], row[3]) if part), row[0])
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
