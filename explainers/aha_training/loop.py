"""The AHA training loop: `train_aha` (`python -m explainers train-aha`), methods.md section 2.

    python -m explainers train-aha --model bloodmnist-cnn --data ../shared/data/bloodmnist/64/train \
        --val-data ../shared/data/bloodmnist/64/val --out weights/aha-bloodmnist-cnn
    torchrun --nproc_per_node 2 -m explainers train-aha ...     # data-parallel (DDP; gloo on CPU, nccl on GPU)

The classifier is frozen; only the decoder trains. Recipe defaults are the reference's (AdamW lr 3e-4,
weight decay 1e-3, 6% warm-up then cosine, grad-norm clip 1.0, global batch 32, tau 1.0 -> 0.3, G drawn
per step, the reference image drawn per batch from black / mean / blur, targets top-1 plus runner-up-or-
label, 16 fractions); every one is an option so that a scaled-down run records exactly what it used.
Resumable: a checkpoint (`<out>.ckpt`, atomic) every `--checkpoint-every` steps; every random draw is a
function of (seed, step, rank), so a resumed run continues the same sequence. `--time-budget-minutes`
ends a run cleanly (checkpoint + export) when the budget is spent. bf16 autocast on GPU.
"""
from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from ..aha.network import AHAExplainer, DEFAULT_ARCH, pools_class_token
from ..aha.objective import (NUM_FRACTIONS, PEAK_WEIGHT, REFERENCE_KINDS, SCORES, TAU_END, TAU_START, aha_loss,
                             default_fractions, grid_range, reference_batch, tau_at)
from ..aha.store import explainer_stem, stem_from_out
from ..metrics import METRICS
from .data import (AUGMENTS, TARGET_MODES, augment_batch, check_labels, holdout_indices, load_eval_images,
                   load_train_images, mosaic_batch, mosaic_cell_size, mosaic_targets, pick_targets, to_input_size)
from .export import close_segment, export_explainer
from .validation import (SELECT_RULES, baseline_validation, class_following_key, validation_class_dependence,
                         validation_gridpg, validation_mosaics, validation_scores)


def distributed_setup():
    """(rank, world size, device, started) from torchrun's environment; initialises the process group if needed
    (`started` says this call did, so the caller also tears it down)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    started = False
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        started = True
    return rank, world, device, started


def replicas_identical(module: torch.nn.Module) -> bool:
    """True when every rank holds exactly the same parameters (checked with max/min all-reduces)."""
    if not (dist.is_available() and dist.is_initialized()):
        return True
    flat = torch.cat([p.detach().float().flatten() for p in module.parameters()])
    high, low = flat.clone(), flat.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    return bool(torch.equal(high, low))


def warm_start(bundle, init, class_input: str = "none") -> tuple:
    """(explainer for `bundle`, card facts) from the explainer at stem `init`: its architecture (without its output
    blur) and weights. It may explain another model whose decoder shapes match (e.g. the single-cell ViT's explainer
    for the mosaic ViT) and may lack the class input, whose weights then start at zero; any other mismatch is an
    error."""
    from safetensors.torch import load_file

    stem = stem_from_out(init)
    card_file, weights_file = Path(str(stem) + ".json"), Path(str(stem) + ".safetensors")
    if not card_file.exists() or not weights_file.exists():
        raise ValueError(f"no explainer to start from at {stem} (its .json and .safetensors)")
    card = json.loads(card_file.read_text())
    arch = dict(card["architecture"])
    keys = ("width", "embed_dim", "gain_init", "class_embedding", "use_cam", "indices", "scales", "fusion_units",
            "prior")
    explainer = AHAExplainer(bundle, **{k: arch[k] for k in keys if k in arch},
                             class_input=class_input if class_input != "none" else arch.get("class_input", "none"))
    try:
        missing, unexpected = explainer.load_state_dict(load_file(str(weights_file)), strict=False)
    except RuntimeError as error:  # shapes differ
        raise ValueError(f"{weights_file} does not fit this explainer ({str(error)[:300]})") from None
    allowed = ("class_inputs.", "class_mix")
    if unexpected or any(not name.startswith(allowed) for name in missing):
        raise ValueError(f"{weights_file} does not fit this explainer (missing {missing[:4]}, unexpected "
                         f"{unexpected[:4]})")
    facts = {"stem": str(init), "base_model": card.get("base_model"), "exported_step": card.get("exported_step"),
             "trained_at": card.get("trained_at"), "its_output_blur_px": arch.get("output_blur", 0.0),
             "new_weights_at_zero": sorted(missing)}
    return explainer, facts


def schedule_factor(done: float, warmup: float) -> float:
    """The learning-rate factor at `done` (0..1) of a run: linear warm-up over the `warmup` share, then cosine to 0."""
    done = min(1.0, max(0.0, done))
    if done < warmup:
        return max(done / warmup, 1e-3)
    return 0.5 * (1 + math.cos(math.pi * (done - warmup) / max(1e-9, 1 - warmup)))


def train_aha(*, model: str | None = None, bundle=None, data: str, out: str | None = None,
              val_data: str | None = None, val_limit: int = 256, steps: int | None = None, epochs: float = 1.0,
              batch_size: int = 32, lr: float = 3e-4, weight_decay: float = 1e-3, warmup: float = 0.06,
              clip: float = 1.0, targets: str = "top1+second", fractions: int = NUM_FRACTIONS,
              fraction_samples: int | None = None, peak_weight: float = PEAK_WEIGHT, tau_start: float = TAU_START,
              tau_end: float = TAU_END, grid_min: int | None = None, grid_max: int | None = None,
              references=REFERENCE_KINDS, augment: str = "auto", subset: int | None = None, seed: int = 0,
              width: int = DEFAULT_ARCH["width"], embed_dim: int = DEFAULT_ARCH["embed_dim"],
              gain_init: float = DEFAULT_ARCH["gain_init"], fusion_units: int = 2, time_budget_minutes: float | None = None,
              checkpoint_every: int = 25, log_every: int = 5, compare: tuple = ("gradcam", "random"),
              val_every: int = 0, val_track: int = 64, progress: bool = True, command: str | None = None,
              val_holdout: float | None = None, checkpoint=None, report=None, cancelled=None,
              card_extra: dict | None = None, mosaic_every: int = 0, deletion_weight: float = 1.0,
              init: str | None = None, val_gridpg_min: float | None = None, val_mosaics: int = 16,
              score: str = "prob", class_input: str = "none", select_rule: str = "ins-del",
              val_rho_max: float | None = None, val_baseline: str | None = None, mosaic_classes: int = 1,
              time_schedule: bool = False, class_input_lr_scale: float = 1.0) -> dict:
    """Train (or resume) an explainer for `model` and export weights + card. Returns the card (rank 0).
    `init`: an explainer stem of the same model to start from (its architecture and weights; a new optimiser and
    schedule, and no output blur: the exported card has none, choose it again with `aha-output-blur`).
    `val_gridpg_min` (globally pooled networks, with `val_data` and `val_every`): each validation also measures the
    grid pointing game on `val_mosaics` 2 x 2 mosaics of `val_data` (seed 0), and only checkpoints scoring at least
    this are exported (a run whose single-cell ins-del rose while its mosaics fell to 0.68 is why; when none reaches
    it, the best by ins-del is exported and the card says so).
    `mosaic_every` k > 0 (globally pooled networks only): every k-th step trains on 2 x 2 mosaics of the batch's
    images at twice the input size, each explained for one quadrant's label, so the explainer cannot learn
    "the centre of the image" as its answer (the grid pointing game measures that).
    `val_every` > 0 measures the fixed validation metric (hard AUCs on `val_track` images of `val_data`)
    every that many steps, logs it, and exports the best checkpoint by ins-del instead of the last.
    `deletion_weight` w weighs the deletion AUC in the loss (w * deletion + 1 - insertion); the best checkpoint is
    then the one with the highest insertion - w * deletion (ins-del when w = 1, the default).
    Class-following options: `score` ("logprob" or "margin") scores every target other than the top class (the
    runner-up, random classes, every mosaic target) where the probability is flat (`objective.target_scores`);
    `targets="varied"` explains the top class, the runner-up and a random other class of every image;
    `mosaic_classes` quadrants' classes are explained per mosaic; `class_input="token_logits"` gives the explainer
    its class-specific input (`network.CLASS_INPUTS`); `select_rule="class-following"` ranks validation checkpoints
    by `class_following_key`: class dependence (`val_rho_max`) and GridPG (`val_gridpg_min`) where set, ins-del at
    least `val_baseline`'s (rollout on class-token ViTs, Grad-CAM otherwise) on the same val images.
    `time_schedule` (with `time_budget_minutes`): tau and the learning rate follow the share of the budget spent
    when it is ahead of the share of the steps done (a run whose speed is not known beforehand).
    `init` may name an explainer of another model with the same decoder shapes, or one without the class input:
    the missing class-input weights start at zero (its maps unchanged).

    `val_holdout` (a fraction, only without `val_data`): hold that share of `data` out of training (spread evenly
    over the file) and validate on it. `checkpoint`: the resume file (default `<out>.ckpt`). The job runner's
    hooks: `report(step, total, **metrics)` after every step (metrics: the running loss every `log_every` steps;
    `val_deletion_auc`, `val_insertion_auc`, `val_ins_minus_del` each time the validation metric is measured;
    `phase="start"` with `resumed_from` and `elapsed_s` just before the first step of this run) and
    `cancelled()`, checked after every step: when it is true the run saves its checkpoint and returns
    {"cancelled": True, "step": ..., "total_steps": ...} without exporting. `card_extra` is merged into the card."""
    from ..models import kept_training_state, load_model

    options = dict(data=data, out=out, val_data=val_data, val_limit=val_limit, steps=steps, epochs=epochs,
                   batch_size=batch_size, lr=lr, weight_decay=weight_decay, warmup=warmup, clip=clip, targets=targets,
                   fractions=fractions, fraction_samples=fraction_samples, peak_weight=peak_weight,
                   tau_start=tau_start, tau_end=tau_end, grid_min=grid_min, grid_max=grid_max, references=references,
                   augment=augment, subset=subset, seed=seed, width=width, embed_dim=embed_dim, gain_init=gain_init,
                   fusion_units=fusion_units, time_budget_minutes=time_budget_minutes,
                   checkpoint_every=checkpoint_every, log_every=log_every, compare=compare, val_every=val_every,
                   val_track=val_track, progress=progress, command=command, val_holdout=val_holdout,
                   checkpoint=checkpoint, report=report, cancelled=cancelled, card_extra=card_extra,
                   mosaic_every=mosaic_every, deletion_weight=deletion_weight, init=init,
                   val_gridpg_min=val_gridpg_min, val_mosaics=val_mosaics, score=score, class_input=class_input,
                   select_rule=select_rule, val_rho_max=val_rho_max, val_baseline=val_baseline,
                   mosaic_classes=mosaic_classes, time_schedule=time_schedule,
                   class_input_lr_scale=class_input_lr_scale)

    if not 0.0 < float(deletion_weight) <= 10.0:
        raise ValueError(f"deletion_weight must be in (0, 10], got {deletion_weight}")
    if targets not in TARGET_MODES:
        raise ValueError(f"targets must be one of {TARGET_MODES}")
    if augment not in AUGMENTS:
        raise ValueError(f"augment must be one of {AUGMENTS}")
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}")
    if select_rule not in SELECT_RULES:
        raise ValueError(f"select_rule must be one of {SELECT_RULES}")
    if not 1 <= int(mosaic_classes) <= 4:
        raise ValueError(f"mosaic_classes must be 1-4 quadrants, got {mosaic_classes}")
    if val_holdout is not None and val_data:
        raise ValueError("give either validation data or a held-out fraction of the training data, not both")
    rank, world, device, started_group = distributed_setup()
    if device.type == "cpu" and world > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    bundle = bundle or load_model(model)
    bundle.to(device)
    try:
        with kept_training_state(bundle.network):  # the classifier is shared (the model cache): frozen for the run
            bundle.network.eval().requires_grad_(False)
            return _train_frozen(bundle, rank=rank, world=world, device=device, **options)
    finally:
        if started_group and dist.is_initialized():
            # a gloo group left alive at interpreter exit can abort a rank ("terminate called without an
            # active exception") after the work is done: end it here, on every rank
            dist.destroy_process_group()


class _Run(SimpleNamespace):
    """One `_train_frozen` run: its options, what setup derives from them, and what changes step by step (step,
    history, validation, best). The helpers below share it instead of closures over some forty names."""


def _train_frozen(bundle, *, rank, world, device, **options) -> dict:
    """`train_aha` with the classifier frozen: set up, resume, step to the end (or a stop), export (rank 0)."""
    run = _Run(bundle=bundle, rank=rank, world=world, device=device, model=bundle.name, **options)
    _setup_data(run)
    torch.manual_seed(run.seed)  # after the data, before the explainer: its initial weights as before
    _setup_explainer(run)
    _setup_validation(run)
    _resume(run)
    run.fraction_grid = default_fractions(run.fractions)
    run.amp = device.type == "cuda"
    run.started = time.time()
    # this segment of the run (a resumed run has several): the card lists each one
    run.segments.append({"from_step": run.step, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                         "device": str(device), "to_step": run.step, "seconds": 0.0})
    run.bar = tqdm(total=run.total_steps, initial=run.step, desc=f"aha-{run.model}", file=sys.stderr,
                   disable=not run.progress or rank)
    run.running = None
    run.stopped_early = run.stopped_by_cancel = False
    if run.x_track is not None and run.step == 0:
        _track_validation(run)  # the untrained explainer (its prior) is a candidate too
    if run.report is not None and rank == 0:
        run.report(run.step, run.total_steps, phase="start", resumed_from=run.step,
                   elapsed_s=round(run.elapsed_before, 1))
    while run.step < run.total_steps:
        _train_step(run)
        _after_step(run)
        if _stop_requested(run):
            break
    return _finish(run)


def _elapsed(run) -> float:
    """Training seconds so far, the runs before a resume included (the time budget and the schedule count them)."""
    return run.elapsed_before + time.time() - run.started


def _setup_data(run) -> None:
    """Paths, augmentation mode, grid range, the validation split and the training images: all that fixes the step
    count, checked before anything is built."""
    bundle = run.bundle
    run.stem = stem_from_out(run.out) if run.out else explainer_stem(run.model)
    run.checkpoint_path = Path(run.checkpoint) if run.checkpoint else Path(str(run.stem) + ".ckpt")
    if run.rank == 0:
        run.checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
    image_hw = run.image_hw = tuple(bundle.input_size)
    mosaic_reader = bool((getattr(bundle, "card", None) or {}).get("grid_cell_size"))  # a model trained on cells
    run.mode = run.augment if run.augment != "auto" else (
        "photo" if min(image_hw) >= 128 and not mosaic_reader else "cells")
    low, high = grid_range(image_hw)
    run.low, run.high = run.grid_min or low, run.grid_max or high
    run.mosaic_every = int(run.mosaic_every or 0)
    run.class_token = pools_class_token(bundle.network)
    # cells are held at the mosaic cell size: single steps bring them to the input size, mosaic steps join four
    # (a class-token ViT gets its mosaics at its own input size, a globally pooled network at twice it)
    run.cell_hw = mosaic_cell_size(bundle) if run.mode == "cells" else image_hw
    if run.mosaic_every and run.batch_size // run.world < 1:
        raise ValueError("mosaic steps need at least 1 image per process and step")
    if run.mosaic_every and run.mode != "cells":
        raise ValueError("mosaic steps are for cell images (augment 'cells')")

    if run.val_gridpg_min is not None:
        if not (run.val_data and run.val_every):
            raise ValueError("--val-gridpg-min needs --val-data and --val-every (it scores val mosaics at each validation)")
        if not 0.0 <= float(run.val_gridpg_min) <= 1.0 or int(run.val_mosaics) < 1:
            raise ValueError(f"val_gridpg_min must be a share in [0, 1] and val_mosaics >= 1, got "
                             f"{run.val_gridpg_min}, {run.val_mosaics}")
    train_indices, run.held_indices, run.val_split = None, None, "val"
    if run.val_holdout is not None:
        from ..data import open_dataset

        train_indices, run.held_indices = holdout_indices(len(open_dataset(run.data, split="train")),
                                                          float(run.val_holdout))
        run.val_data, run.val_split = run.data, "train"  # the held-out images of the training file
    run.images, run.labels = load_train_images(run.data, run.cell_hw, photo=run.mode == "photo", subset=run.subset,
                                               seed=run.seed, indices=train_indices)
    check_labels(run.labels, bundle, run.data)
    run.per_rank = max(1, run.batch_size // run.world)
    run.global_batch = run.per_rank * run.world
    run.steps_per_epoch = max(1, len(run.images) // run.global_batch)
    run.total_steps = int(run.steps) if run.steps else max(1, int(round(run.epochs * run.steps_per_epoch)))
    run.warmup_steps = max(1, int(round(run.warmup * run.total_steps)))


def _setup_explainer(run) -> None:
    """The explainer (new, or warm-started), its DDP wrapper, the AdamW optimiser and the warm-up + cosine schedule."""
    bundle, device = run.bundle, run.device
    run.init_from = None
    if run.init:  # warm start: the architecture and weights of an explainer, without its blur
        run.explainer, run.init_from = warm_start(bundle, run.init, run.class_input)
        run.explainer.to(device)
    else:
        run.explainer = AHAExplainer(bundle, width=run.width, embed_dim=run.embed_dim, gain_init=run.gain_init,
                                     fusion_units=run.fusion_units, class_input=run.class_input).to(device)
    explainer = run.explainer
    explainer.train()
    run.model_ddp = explainer
    if run.world > 1:
        run.model_ddp = torch.nn.parallel.DistributedDataParallel(
            explainer, device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=not explainer.use_cam)
    # the class input's weights (new, at zero in a warm start) may learn faster than the rest (`class_input_lr_scale`)
    lr = run.lr
    fresh = [p for name, p in explainer.named_parameters() if name.startswith(("class_inputs.", "class_mix"))]
    rest = [p for name, p in explainer.named_parameters() if not name.startswith(("class_inputs.", "class_mix"))]
    groups = [{"params": rest, "lr": lr}] + ([{"params": fresh, "lr": lr * run.class_input_lr_scale}] if fresh else [])
    run.optimizer = torch.optim.AdamW(groups, lr=lr, weight_decay=run.weight_decay)
    warmup_steps, total_steps = run.warmup_steps, run.total_steps
    run.schedule = torch.optim.lr_scheduler.LambdaLR(run.optimizer, lambda s: min(1.0, (s + 1) / warmup_steps) * (
        1.0 if s < warmup_steps else 0.5 * (1 + math.cos(math.pi * (s - warmup_steps) / max(1, total_steps - warmup_steps)))))


def _setup_validation(run) -> None:
    """What each validation measures (rank 0): the tracked val images, the val mosaics for GridPG, and the
    class-following rule's ins-del floor (a baseline method on the same images)."""
    bundle = run.bundle
    run.x_track = None
    if run.val_every and run.val_data and run.rank == 0:
        run.x_track, _ = load_eval_images(bundle, run.val_data, run.val_track, split=run.val_split,
                                          indices=run.held_indices)
    run.track_mosaics = None
    if ((run.val_gridpg_min is not None or (run.select_rule == "class-following" and run.mosaic_every))
            and run.rank == 0 and run.val_data):
        run.track_mosaics = validation_mosaics(bundle, run.val_data, int(run.val_mosaics), split=run.val_split)
    run.baseline = None
    if run.select_rule == "class-following" and run.x_track is not None:
        run.baseline = baseline_validation(bundle, run.x_track,
                                           run.val_baseline or ("rollout" if run.class_token else "gradcam"))
        bar_note = f"validation floor: {run.baseline['method']} ins-del {run.baseline['ins_minus_del']:.4f}"
        print(bar_note, file=sys.stderr, flush=True)


def _resume(run) -> None:
    """The starting state: step 0, or the checkpoint's (weights, optimiser, schedule, history, the best so far)."""
    run.step, run.elapsed_before, run.history, run.segments = 0, 0.0, [], []
    run.validation, run.best = [], None  # best: {"step", "ins_minus_del", "state"} by the fixed validation metric
    checkpoint_path, total_steps = run.checkpoint_path, run.total_steps
    if not checkpoint_path.exists():
        return
    state = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
    if state["total_steps"] != total_steps:
        raise ValueError(f"{checkpoint_path} was made for {state['total_steps']} steps, not {total_steps}; "
                         "use the same options or delete the checkpoint")
    run.explainer.load_state_dict(state["explainer"])
    run.optimizer.load_state_dict(state["optimizer"])
    run.schedule.load_state_dict(state["schedule"])
    run.step, run.elapsed_before, run.history = state["step"], state["elapsed"], json.loads(state["history"])
    run.validation = json.loads(state.get("validation", "[]"))
    # a checkpoint made before segments were recorded: its steps are one earlier segment of unknown start
    run.segments = json.loads(state.get("segments", "null")) or [
        {"from_step": 0, "started_utc": None, "device": None, "to_step": run.step, "seconds": round(run.elapsed_before, 1)}]
    if "best_state" in state:
        kept = state.get("best_eligible", True)
        run.best = {"step": int(state["best_step"]), "ins_minus_del": float(state["best_score"]),
                    "eligible": tuple(kept) if isinstance(kept, (list, tuple)) else bool(kept),
                    "state": state["best_state"]}
    if run.rank == 0:
        print(f"Resuming aha-{run.model} at step {run.step}/{total_steps}", file=sys.stderr)


def _save_checkpoint(run) -> None:
    """The resume file (rank 0, atomic): everything `_resume` reads back."""
    if run.rank == 0:
        from ..atomic import atomic_torch_save

        state = {"explainer": run.explainer.state_dict(), "optimizer": run.optimizer.state_dict(),
                 "schedule": run.schedule.state_dict(), "step": run.step, "total_steps": run.total_steps,
                 "elapsed": _elapsed(run), "history": json.dumps(run.history),
                 "validation": json.dumps(run.validation), "segments": json.dumps(close_segment(run))}
        best = run.best
        if best is not None:
            state.update(best_state=best["state"], best_step=best["step"], best_score=best["ins_minus_del"],
                         best_eligible=best.get("eligible", True))
        atomic_torch_save(state, run.checkpoint_path)


def _track_validation(run) -> None:
    """Measure the validation metric now (rank 0), log it, and keep the weights if they rank best so far."""
    explainer, x_track, best = run.explainer, run.x_track, run.best
    scores = validation_scores(explainer, x_track)
    eligible = True
    if run.track_mosaics is not None:
        scores["gridpg"] = validation_gridpg(explainer, *run.track_mosaics)
        if run.val_gridpg_min is not None:
            eligible = METRICS["gridpg"].meets(scores["gridpg"], float(run.val_gridpg_min))
    if run.select_rule == "class-following":
        scores["class_rho"] = validation_class_dependence(explainer, x_track)
        primary = "gridpg" if "gridpg" in scores and run.val_rho_max is None else "ins_minus_del"
        key = class_following_key(scores, floor=run.baseline["ins_minus_del"], rho_max=run.val_rho_max,
                                  gridpg_min=run.val_gridpg_min, primary=primary)
        eligible, selection = key[:3], key[3]
    else:
        selection = scores["insertion_auc"] - run.deletion_weight * scores["deletion_auc"]  # ins-del when w = 1
    scores.update(step=run.step, seconds=round(_elapsed(run), 1))
    run.validation.append(scores)
    # a checkpoint at the GridPG floor beats any below it; among equals the higher selection score wins
    if best is None or (eligible, selection) > (best.get("eligible", True), best["ins_minus_del"]):
        best = run.best = {"step": run.step, "ins_minus_del": selection, "eligible": eligible,
                           "state": {k: v.detach().clone().cpu() for k, v in explainer.state_dict().items()}}
    if run.report is not None and run.rank == 0:
        run.report(run.step, run.total_steps, val_deletion_auc=scores["deletion_auc"],
                   val_insertion_auc=scores["insertion_auc"], val_ins_minus_del=scores["ins_minus_del"],
                   best_step=best["step"])
    gridpg = f" GridPG {scores['gridpg']:.3f}" if "gridpg" in scores else ""
    gridpg += f" class rho {scores['class_rho']:.3f}" if "class_rho" in scores else ""
    run.bar.write(f"step {run.step}: validation deletion {scores['deletion_auc']:.4f} insertion "
                  f"{scores['insertion_auc']:.4f} ins-del {scores['ins_minus_del']:.4f}{gridpg} "
                  f"(best at step {best['step']})")


def _step_images(run, generator: torch.Generator, mosaic_step: bool) -> tuple:
    """This rank's share of the step's batch (augmented, on the device) and its labels. The order is a function
    of (seed, epoch), so every rank and a resumed run agree on it."""
    step, per_rank, global_batch, images = run.step, run.per_rank, run.global_batch, run.images
    epoch, position = divmod(step, run.steps_per_epoch)
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(run.seed * 1000 + epoch))
    chosen = order[position * global_batch + run.rank * per_rank: position * global_batch + (run.rank + 1) * per_rank]
    if mosaic_step and run.class_token:  # four random cells per mosaic: as many mosaics as a batch has images
        chosen = torch.randint(0, len(images), (4 * per_rank,), generator=generator)
    x = augment_batch(images[chosen], run.mode, run.image_hw, generator).to(run.device)
    return x, run.labels[chosen].to(run.device)


def _mosaic_inputs(run, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator, grid: int) -> tuple:
    """A mosaic step's inputs: 2 x 2 mosaics of the batch's cells at the input size, the (mosaic index, target)
    pairs for `mosaic_classes` present quadrants' labels, and the grid (doubled for a larger, pooled mosaic)."""
    x, y4 = mosaic_batch(x, y, generator, all_labels=True)
    x = to_input_size(x, run.bundle)
    mosaic_index, y = mosaic_targets(y4, generator, int(run.mosaic_classes))
    if not run.class_token:
        grid = min(2 * grid, grid_range(tuple(x.shape[-2:]))[1])
    return x, y, mosaic_index, grid


def _step_tau(run) -> float:
    """This step's tau; with `time_schedule`, also the learning rate set from the share of the budget spent."""
    tau = tau_at(run.step, run.total_steps, run.tau_start, run.tau_end)
    if run.time_schedule and run.time_budget_minutes:
        # the schedule follows whichever is further along, the steps or the time budget, so a run cut by its
        # budget still ends at tau_end with the learning rate at 0
        done = max(run.step / max(1, run.total_steps - 1), _elapsed(run) / (60 * float(run.time_budget_minutes)))
        tau = run.tau_start + (run.tau_end - run.tau_start) * min(1.0, done)
        for group in run.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * schedule_factor(done, run.warmup)
    return tau


def _train_step(run) -> None:
    """One optimisation step: draw the batch (a mosaic step every `mosaic_every`), the loss, the update, the log.
    Every random draw is a function of (seed, step, rank), so a resumed run continues the same sequence."""
    bundle, explainer, step = run.bundle, run.explainer, run.step
    generator = torch.Generator().manual_seed(run.seed * 1_000_003 + step * 97 + run.rank)
    rng = random.Random(run.seed * 7919 + step)  # same on every rank: one grid, reference, fraction draw
    grid = rng.randint(run.low, run.high)
    mosaic_step = bool(run.mosaic_every) and step % run.mosaic_every == run.mosaic_every - 1
    x, y = _step_images(run, generator, mosaic_step)
    if mosaic_step:  # 2 x 2 mosaics of the batch's cells, each explained for present quadrants' labels
        x, y, mosaic_index, grid = _mosaic_inputs(run, x, y, generator, grid)
    elif tuple(x.shape[-2:]) != run.image_hw:  # cells held at the mosaic cell size, brought to the input size
        x = F.interpolate(x, size=run.image_hw, mode="bilinear", align_corners=False).clamp(0, 1)
    reference = run.references[rng.randrange(len(run.references))]
    tau = _step_tau(run)
    with torch.autocast(device_type=run.device.type, dtype=torch.bfloat16, enabled=run.amp):
        encoded = explainer.encode(x)  # one classifier pass: features, and logits for the targets
        if mosaic_step:
            index, target = mosaic_index, y
            not_top = target != encoded.logits.argmax(1)[index]
        else:
            index, target, not_top = pick_targets(encoded.logits, y, run.targets, generator)
        with torch.no_grad():
            refs = reference_batch(x, reference, bundle.reference_color)
            clean = encoded.logits.float().softmax(1)[index, target]
            blank = bundle(refs).float().softmax(1)[index, target]
        maps = run.model_ddp(encoded.select(index), target)
        # the probability for the top class (ref); `score` for the others, where the probability is flat
        scored = (dict(score=run.score, score_rows=not_top) if run.score != "prob"
                  else dict(endpoint_probs=(clean, blank)))
        terms = aha_loss(bundle, x[index], maps.float(), target, refs[index], grid=grid, tau=tau,
                         fractions=run.fraction_grid, fraction_samples=run.fraction_samples,
                         peak_weight=run.peak_weight, generator=generator, rng=rng,
                         deletion_weight=run.deletion_weight, **scored)
    run.optimizer.zero_grad(set_to_none=True)
    terms.loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(explainer.parameters(), run.clip)
    used_lr = run.optimizer.param_groups[0]["lr"]  # with time_schedule, set by _step_tau, not by the step schedule
    run.optimizer.step()
    run.schedule.step()
    step = run.step = step + 1
    loss = float(terms.loss.detach())
    running = run.running = loss if run.running is None else 0.9 * run.running + 0.1 * loss
    run.bar.update(1)
    run.bar.set_postfix(loss=f"{running:.3f}", tau=f"{tau:.2f}", G=grid, lr=f"{used_lr:.1e}")
    if step % run.log_every == 0 or step == run.total_steps:
        run.history.append({"step": step, "loss": round(running, 5),
                            "deletion_auc": round(float(terms.deletion_auc.mean()), 5),
                            "insertion_auc": round(float(terms.insertion_auc.mean()), 5),
                            "peak": round(float(terms.peak.mean()), 4), "tau": round(tau, 4), "grid": grid,
                            "lr": float(f"{used_lr:.3g}"),
                            "grad_norm": round(float(grad_norm), 4), "seconds": round(_elapsed(run), 1)})


def _after_step(run) -> None:
    """After each step: the job runner's progress report, validation every `val_every`, a checkpoint every
    `checkpoint_every`."""
    step, total_steps = run.step, run.total_steps
    if run.report is not None and run.rank == 0:
        if step % run.log_every == 0 or step == total_steps:
            run.report(step, total_steps, loss=round(run.running, 5))
        else:
            run.report(step, total_steps)  # the step alone: an exact progress bar, a cheap write
    if run.x_track is not None and (step % run.val_every == 0 or step == total_steps):
        _track_validation(run)
    if step % run.checkpoint_every == 0:
        _save_checkpoint(run)


def _stop_requested(run) -> bool:
    """Whether to stop before the last step: cancelled (asked on rank 0) or the time budget spent. Every rank
    takes the maximum, so all stop at the same step."""
    if run.cancelled is not None:
        stop = torch.tensor(float(bool(run.cancelled()) if run.rank == 0 else 0.0))
        if run.world > 1:
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item() and run.step < run.total_steps:
            run.stopped_by_cancel = True
            return True
    if run.time_budget_minutes is not None:
        over = torch.tensor(float(_elapsed(run) > 60 * run.time_budget_minutes))
        if run.world > 1:
            dist.all_reduce(over, op=dist.ReduceOp.MAX)
        if over.item() and run.step < run.total_steps:
            run.stopped_early = True
            return True
    return False


def _finish(run) -> dict:
    """After the last step (or a stop): a last validation if the budget cut the run, the checkpoint, then either
    the cancelled summary or the exported explainer's card (rank 0; None on the other ranks)."""
    if run.x_track is not None and run.stopped_early and (not run.validation or run.validation[-1]["step"] != run.step):
        _track_validation(run)  # the last steps before the budget ran out are a candidate too
    run.bar.close()
    _save_checkpoint(run)
    train_seconds = _elapsed(run)
    if run.stopped_by_cancel:
        if run.rank == 0:
            print(f"aha-{run.model}: cancelled at step {run.step}/{run.total_steps}; checkpoint {run.checkpoint_path}",
                  file=sys.stderr)
        return {"cancelled": True, "step": run.step, "total_steps": run.total_steps,
                "checkpoint": str(run.checkpoint_path), "train_seconds": round(train_seconds, 1)}
    identical = replicas_identical(run.explainer)
    if not identical:
        raise RuntimeError("DDP replicas diverged: ranks hold different explainer weights")
    card = None
    if run.rank == 0:
        card = export_explainer(run, train_seconds, identical)
    if run.world > 1:
        dist.barrier()
    return card
