"""The Models tab's "Train an AHA explainer" section: which models and data sets a job can train on, starting an
'aha-train' job (this machine or HF Jobs), and what the section shows while it runs (a progress line with an
ETA, the validation deletion / insertion curve over steps) and when it is done (AHA runs in one pass).

    models = model_choices(services)           # [(label, name)] every model a job can load, imported ones included
    data = datasets.choices()                   # [(label, name)] named data sets, never server paths
    job_id, message = start_training(services, "my-cells", "bloodmnist-cells", steps=200, minutes=10)
    report = job_panel.job_report(services, job_id)   # progress line with ETA, validation curve (`describe_job`)

The job itself is the library's (`explainers.aha_training.job.run_aha_job`, the 'aha-train' kind of `saliency_lab.jobs`).
Where the explainer goes: the user's models folder, beside an imported or fine-tuned model's card; models that
ship an explainer in the code's weights/ are refused (the loader takes the shipped one first; the job never writes
into weights/): import a copy under another name to train your own. Errors meant for the user are ValueError.
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace
from pathlib import Path

from . import datasets, figures, finetune, job_panel, menus

KIND = "aha-train"
HOLDOUT = "holdout"  # the validation choice "hold 10% of the training data out"
HOLDOUT_FRACTION = 0.1
MAX_STEPS = 100_000


# ------------------------------------------------------------------------------------------------ pickers
def trainable(services, name) -> bool:
    """A job process can load the model and the explainer may be stored for it (no shipped explainer)."""
    from explainers.aha.store import shipped_explainer

    try:
        return finetune.can_finetune(services, name) and shipped_explainer(name) is None
    except ValueError:
        return False


def model_choices(services) -> list:
    """[(label, name)] of every model an 'aha-train' job can train an explainer for (imported, fine-tuned,
    bundled without a shipped explainer, downloaded hub models); the label says whether AHA is one-pass yet."""
    from explainers.aha.store import explainer_stem

    out = []
    for label, name in menus.model_choices([n for n in services.names() if trainable(services, n)]):
        try:
            trained = Path(str(explainer_stem(name)) + ".json").exists()
        except ValueError:
            trained = False
        out.append((f"{label} · {'has an explainer (train again to replace it)' if trained else 'AHA per-image'}",
                    name))
    return out


def validation_choices() -> list:
    return [(f"Hold {HOLDOUT_FRACTION:.0%} of the training data out (default)", HOLDOUT)] + datasets.choices()


# ------------------------------------------------------------------------------------------------ start
def _stage_model_files(services, name) -> str | None:
    """An imported or fine-tuned model's card and weights copied into a folder of their own (what an HF job
    uploads: the container has no data folder of ours); None for models the container loads by name."""
    from explainers import models

    card_file = models.card_path(name)
    if not card_file.exists() or card_file.parent == Path(models.WEIGHTS_DIR):
        return None
    card = json.loads(card_file.read_text())
    folder = services.state_dir / "staged-models" / name
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy2(card_file, folder / card_file.name)
    shutil.copy2(models.weights_path(name, card), folder / Path(card.get("weights_file", f"{name}.safetensors")).name)
    return str(folder)


def start_training(services, model_name, dataset, validation=HOLDOUT, steps=200, minutes=None, seed=0,
                   backend="local") -> tuple:
    """Queue an 'aha-train' job; returns (job id, a Markdown line). `validation`: HOLDOUT or a data set name."""
    from explainers.aha_training.job import job_out_stem

    if not model_name:
        raise ValueError("Pick the model to train an explainer for.")
    if not dataset:
        raise ValueError("Pick the training data set.")
    job_out_stem(model_name)  # a model that ships its explainer: refused here, with the reason
    if not finetune.can_finetune(services, model_name):
        raise ValueError(f"{model_name} cannot be trained here: a job cannot load it (pick an imported, fine-tuned, "
                         "bundled or downloaded model).")
    try:
        steps = int(steps)
    except (TypeError, ValueError) as error:
        raise ValueError("Steps: give a whole number.") from error
    if not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"Steps: between 1 and {MAX_STEPS}.")
    minutes = float(minutes) if minutes not in (None, "") and float(minutes) > 0 else None
    data = datasets.resolve(dataset)
    from explainers.aha_training.data import check_labels
    from explainers.data import open_dataset

    check_labels([int(v) for v in open_dataset(data, split="train").labels], services.bundle(model_name), dataset)
    params = {"model": model_name, "data": str(data), "steps": steps, "seed": int(seed or 0),
              "val_every": max(1, steps // 10)}
    if minutes:
        params["minutes"] = minutes
    if validation and validation != HOLDOUT:
        if validation == dataset:
            raise ValueError("Validate on other images than the training ones (or hold part of them out).")
        params["val_data"] = str(datasets.resolve(validation))
        validation_text = f"validation on **{validation}**"
    else:
        params["val_holdout"] = HOLDOUT_FRACTION
        validation_text = f"validation on {HOLDOUT_FRACTION:.0%} of **{dataset}** held out of training"
    if backend == "hf-jobs":
        if not services.hf_token:
            raise ValueError("HuggingFace Jobs needs a token: set HF_TOKEN in the environment (or the Space's "
                             "secrets).")
        params["out"] = f"aha-{model_name}"  # the explainer comes back into the models folder when the job ends
        staged = _stage_model_files(services, model_name)
        if staged:
            params["model_files"] = staged
    else:
        params.update(data_name=str(dataset), val_name=str(validation or HOLDOUT))
    try:
        job_id = services.runner().submit(KIND, params, backend=backend)
    except KeyError as error:
        raise ValueError("AHA training jobs are not available in this build (no 'aha-train' job kind).") from error
    budget = f"{steps} steps" + (f" or {minutes:g} min, whichever ends first" if minutes else "")
    return job_id, (f"Job **{job_id}** queued: training an AHA explainer for **{model_name}** on **{dataset}** "
                    f"({budget}; {validation_text}).")


# ------------------------------------------------------------------------------------------------ progress
FINISHING = " · finishing: held-out figures, then the explainer is saved…"


def eta_text(step, total, history, now, minutes=None) -> str:
    """'step 12/200 (6%) · 1.30 s/step · about 4 min left (ETA 14:05)': the job panel's `job_panel.eta_text` (the
    rate of this run of the job, since its last 'start' point: a resumed job counts from where it resumed), capped
    by the minutes budget, with what an 'aha-train' job does once its steps are done."""
    return job_panel.eta_text(step, total, history, now, minutes, finishing=FINISHING)


def _forget_once(services, job) -> None:
    """A new explainer: drop the cached explainer and the cached maps of its model (once per job)."""
    key = ("aha-job-applied", job["id"])
    with services._lock:
        if services._objects.get(key):
            return
        services._objects[key] = True
    from explainers.aha.store import forget_explainers

    forget_explainers((job.get("params") or {}).get("model"))
    services.cache.clear()


@job_panel.describes(KIND)
def describe_job(services, job, history, report) -> job_panel.JobReport:
    """An 'aha-train' job in the job panel: a progress line with an ETA, the validation curve, and once done the
    exported checkpoint's figures (AHA then runs in one pass)."""
    params = job.get("params") or {}
    model = params.get("model", "")
    if any("val_deletion_auc" in p for p in history):
        figure = figures.aha_validation_figure(history, title=f"AHA explainer for {model}: validation")
    elif report.finished:
        figure = figures.empty_figure(f"No validation point: the job {job['status']} before measuring one.")
    else:
        figure = figures.empty_figure("Waiting for the first validation point (the untrained explainer)…")
    text = f"Job **{job['id']}** ({model}): {job['status']}"
    line = job_panel.progress_text(job, history, time.time(), minutes=params.get("minutes"), finishing=FINISHING)
    if line:
        text += " · " + line
    if job.get("error"):
        text += f" — {job['error'][:300]}"
    if not report.finished:
        return replace(report, text=text, figure=figure)
    percent = report.percent
    result = job.get("result") or {}
    if job["status"] == "done":
        _forget_once(services, job)
        best = next((p for p in result.get("validation") or [] if p.get("step") == result.get("exported_step")), None)
        if best:
            text += (f". Exported the best validation checkpoint (step {best['step']}: deletion "
                     f"{best['deletion_auc']:.4f}, insertion {best['insertion_auc']:.4f}, ins−del "
                     f"{best['ins_minus_del']:.4f})")
        text += f". AHA now runs in **one pass** for **{model}** (trained explainer)."
        percent = 100.0
    elif job["status"] in job_panel.RESUMABLE:
        text += ". Resume it from the job list: it continues from its last checkpoint."
    return replace(report, text=text, figure=figure, percent=percent)


def aha_note(services, model_name) -> str:
    """What AHA does on this model now: one pass with a trained explainer, or per-image optimisation."""
    from explainers.methods import METHODS

    if not model_name:
        return ""
    note = METHODS["aha"].menu_note(services.bundle(model_name))
    return f"AHA on **{model_name}**: {note}." if note else ""
