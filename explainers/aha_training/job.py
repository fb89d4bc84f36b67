"""The 'aha-train' job kind of the app's job runner: train an AHA explainer from the Models tab."""
from __future__ import annotations

import json
from pathlib import Path

from ..aha.network import DEFAULT_ARCH
from ..aha.store import stem_from_out
from .loop import train_aha


JOB_PARAMS = ("model", "data", "val_data", "val_holdout", "steps", "minutes", "seed", "batch_size", "val_every",
              "val_track", "val_limit", "fraction_samples", "lr", "width", "checkpoint_every", "log_every", "compare",
              "out", "data_name", "val_name", "subset")


JOB_DEFAULTS = {"steps": 200, "batch_size": 16, "fraction_samples": 6, "val_track": 64, "val_limit": 128,
                "checkpoint_every": 10, "log_every": 5, "seed": 0, "compare": ["gradcam"]}


DEFAULT_HOLDOUT = 0.1


def job_out_stem(model: str, out=None) -> Path:
    """Where an 'aha-train' job writes: `out` if given (never inside the code's weights/), else the user's models
    folder (`store.user_explainer_stem`, which refuses models that ship an explainer)."""
    from ..models import WEIGHTS_DIR
    from ..aha.store import user_explainer_stem

    if not out:
        return user_explainer_stem(model)
    stem = stem_from_out(out)
    weights = Path(WEIGHTS_DIR).resolve()
    if stem.resolve().parent == weights or weights in stem.resolve().parents:
        raise ValueError(f"an AHA job never writes into the code's weights folder ({WEIGHTS_DIR}); leave 'out' "
                         "empty (the user's models folder) or name another folder")
    return stem


def run_aha_job(params: dict, context) -> dict:
    """The 'aha-train' job kind (registered in the app's job runner, `saliency_lab.jobs`): train an AHA explainer
    for `params["model"]` on `params["data"]` with `steps` and/or `minutes` (whichever ends first), validating on
    `val_data` or, without it, on `val_holdout` (default 10%) of the data held out of training. Progress every
    step, the validation deletion / insertion / ins-del as metrics each time they are measured, cancellation
    checked after every step, resumable from the checkpoint in the job folder. On success the explainer is stored
    beside the model (the user's models folder) and AHA runs in one pass for it."""
    from ..training import check_job_params

    check_job_params("aha-train", params, JOB_PARAMS)
    options = {**JOB_DEFAULTS, **{k: v for k, v in params.items() if v is not None}}
    model = str(options["model"])
    stem = job_out_stem(model, options.get("out"))
    steps = int(options["steps"])
    if steps < 1:
        raise ValueError("steps must be at least 1")
    minutes = float(options["minutes"]) if options.get("minutes") else None
    val_data = options.get("val_data") or None
    holdout = None if val_data else float(options.get("val_holdout") or DEFAULT_HOLDOUT)
    val_every = int(options.get("val_every") or max(1, steps // 10))
    checkpoint = context.checkpoint_path("aha.ckpt")
    described = {k: options[k] for k in ("data_name", "val_name") if options.get(k)}
    card_extra = {"trained_by": "aha-train job", "job_id": getattr(context, "job_id", None),
                  "job_params": {k: v for k, v in params.items()}, **described}
    command = ("aha-train job " + json.dumps({k: v for k, v in params.items()}, default=str))

    def report(step, total, **metrics):
        context.progress(step, total, **metrics)

    card = train_aha(model=model, data=str(options["data"]), out=str(stem), val_data=val_data, val_holdout=holdout,
                     val_limit=int(options["val_limit"]), steps=steps, batch_size=int(options["batch_size"]),
                     fraction_samples=options.get("fraction_samples"), lr=float(options.get("lr", 3e-4)),
                     width=int(options.get("width", DEFAULT_ARCH["width"])), subset=options.get("subset"),
                     seed=int(options["seed"]), time_budget_minutes=minutes,
                     checkpoint_every=int(options["checkpoint_every"]), log_every=int(options["log_every"]),
                     compare=tuple(options.get("compare") or ()), val_every=val_every,
                     val_track=int(options["val_track"]), progress=False, command=command, checkpoint=checkpoint,
                     report=report, cancelled=context.cancelled, card_extra=card_extra)
    if card is None or card.get("cancelled"):
        return json.loads(json.dumps(card or {"cancelled": True}, default=str))
    if checkpoint.exists():
        checkpoint.unlink()  # done: the explainer is exported (a done job is never resumed)
    summary = {"model": model, "explainer": str(stem), "card": str(stem) + ".json",
               "weights": str(stem.parent / card["weights_file"]), "exported_step": card.get("exported_step"),
               "steps": card["recipe"]["steps"], "planned_steps": card["recipe"]["planned_steps"],
               "stopped_by_time_budget": card["recipe"]["stopped_by_time_budget"],
               "train_seconds": card["train_seconds"], "device": card["recipe"]["device"],
               "validation": card.get("validation"), "held_out": card.get("held_out"),
               "validation_data": card["recipe"].get("validation_data"),
               "validation_plot": str(stem.parent / card["validation_plot"]) if card.get("validation_plot") else None}
    return json.loads(json.dumps(summary, default=str))
