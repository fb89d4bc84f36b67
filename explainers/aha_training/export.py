"""Exporting a trained AHA explainer: the best checkpoint by the validation metric, its card (the recipe, the
held-out figures) and the validation plot."""
from __future__ import annotations

import platform
import sys
import time
from pathlib import Path

import torch

from ..aha.store import save_explainer
from .data import load_eval_images
from .figures import held_out_figures


def close_segment(run) -> list:
    """The run's segments (each start of the command) with the current one brought up to now: its last step and
    its seconds."""
    if run.segments:
        run.segments[-1].update(to_step=run.step, seconds=round(time.time() - run.started, 1))
    return run.segments


def card_recipe(run) -> dict:
    """The card's recipe: every option and derived setting the run used, and how its weights were chosen."""
    best, baseline, held_indices = run.best, run.baseline, run.held_indices
    recipe = {
        "data": str(run.data), "train_images": int(len(run.images)), "subset": run.subset, "augment": run.mode,
        "steps": run.step, "planned_steps": run.total_steps, "stopped_by_time_budget": run.stopped_early,
        "time_budget_minutes": run.time_budget_minutes, "epochs_done": round(run.step / run.steps_per_epoch, 3),
        "batch_size_global": run.global_batch, "world_size": run.world, "device": str(run.device),
        "autocast": "bf16" if run.amp else None, "targets": run.targets, "fractions": run.fractions,
        "fraction_samples_per_step": run.fraction_samples, "grid_range": [run.low, run.high],
        "mosaic_every": run.mosaic_every, "mosaic_classes": int(run.mosaic_classes),
        "mosaic_cell_size": list(run.cell_hw) if run.mosaic_every else None, "score_of_other_targets": run.score,
        "class_input": run.explainer.class_input, "select_rule": run.select_rule, "val_rho_max": run.val_rho_max,
        "validation_floor": baseline, "time_schedule": bool(run.time_schedule),
        "class_input_lr_scale": float(run.class_input_lr_scale),
        "references": list(run.references), "tau": [run.tau_start, run.tau_end], "optimizer": "AdamW",
        "lr": run.lr, "weight_decay": run.weight_decay, "warmup_fraction": run.warmup,
        "schedule": "linear warm-up, cosine", "grad_clip": run.clip, "peak_weight": run.peak_weight, "seed": run.seed,
        "deletion_weight": run.deletion_weight, "init_from": run.init_from,
        "segments": close_segment(run),  # each start of the command: a run stopped and resumed has several
    }
    if run.val_gridpg_min is not None:
        recipe["val_gridpg"] = {"min": float(run.val_gridpg_min), "mosaics": int(run.val_mosaics), "seed": 0,
                                "exported_meets_min": bool(best is not None and (
                                    best.get("eligible") if not isinstance(best.get("eligible"), tuple)
                                    else best["eligible"][1]))}
    if run.select_rule == "class-following" and best is not None:
        recipe["exported_meets_rule"] = dict(zip(("follows_and_faithful", "follows", "faithful"),
                                                 [bool(v) for v in best["eligible"]]))
    if held_indices is not None:
        recipe["validation_data"] = (f"held out of {run.data}: {len(held_indices)} of "
                                     f"{len(held_indices) + len(run.images)} images ({run.val_holdout:g}), spread "
                                     "evenly over the file, never trained on")
        recipe["held_out_indices"] = held_indices
    elif run.val_data:
        recipe["validation_data"] = str(run.val_data)
    if run.validation:
        source = (f"the {len(held_indices)} held-out images" if held_indices is not None else str(run.val_data))
        recipe["validation_metric"] = (f"hard deletion/insertion (engine, K=20, mean reference) of top-1 maps on "
                                       f"{len(run.x_track)} images of {source} spread over the file, every "
                                       f"{run.val_every} steps; the exported weights are the best by "
                                       + ("ins-del" if run.deletion_weight == 1 else
                                          f"insertion - {run.deletion_weight:g} x deletion (the loss's weighting)")
                                       + (f", among the checkpoints whose GridPG on {run.val_mosaics} val mosaics is "
                                          f"at least {run.val_gridpg_min:g}" if run.val_gridpg_min is not None else ""))
        if run.select_rule == "class-following":
            recipe["validation_metric"] += (
                "; ranked instead by the class-following rule (docs/aha-explainers.md): class rho (top class vs "
                f"runner-up, scipy Spearman) <= {run.val_rho_max} where set, GridPG on {run.val_mosaics} val "
                f"mosaics >= {run.val_gridpg_min} where set, ins-del >= {baseline['method']}'s on the same images "
                f"({baseline['ins_minus_del']:.4f}); ties by "
                + ("GridPG" if run.track_mosaics is not None and run.val_rho_max is None else "ins-del"))
    return recipe


def export_explainer(run, train_seconds: float, identical: bool) -> dict:
    """Export (rank 0): the best checkpoint by the validation metric (else the last), its card with the recipe and
    held-out figures, and the validation plot. Returns the saved card."""
    explainer, model, stem, held_indices = run.explainer, run.model, run.stem, run.held_indices
    explainer.eval()
    exported_step = run.step
    if run.best is not None:  # keep the best checkpoint by the fixed validation metric, not the last
        explainer.load_state_dict(run.best["state"])
        exported_step = run.best["step"]
    recipe = card_recipe(run)
    card = {"base_model": model, "recipe": recipe, "train_seconds": round(train_seconds, 1),
            "exported_step": exported_step, "validation": run.validation,
            "training_command": run.command or " ".join(["python -m explainers"] + sys.argv[1:]),
            "history": run.history, "ddp_replicas_identical": identical,
            "software": {"torch": torch.__version__, "python": platform.python_version()},
            "device": str(run.device), "trained_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    card.update(run.card_extra or {})
    if run.val_data:
        x_val, y_val = load_eval_images(run.bundle, run.val_data, run.val_limit, split=run.val_split,
                                        indices=held_indices)
        figures = held_out_figures(explainer, x_val, y_val, compare=tuple(run.compare))
        figures["data"] = str(run.val_data) if held_indices is None else recipe["validation_data"]
        card["held_out"] = figures
    if run.validation:
        from .plot import validation_plot

        plot = validation_plot(run.validation, Path(str(stem) + ".validation.png"), exported_step=exported_step,
                               title=f"aha-{model}: validation during training ({len(run.x_track)} images"
                                     f"{' held out' if held_indices is not None else ' of ' + str(run.val_data)})")
        card["validation_plot"] = plot.name
    return save_explainer(explainer, stem, card)
