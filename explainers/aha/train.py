"""Training of AHA explainers (`python -m explainers train-aha`), methods.md section 2.

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
import platform
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from .network import AHAExplainer, DEFAULT_ARCH
from .objective import (NUM_FRACTIONS, PEAK_WEIGHT, REFERENCE_KINDS, TAU_END, TAU_START, aha_loss,
                        default_fractions, grid_range, reference_batch, tau_at)
from .store import explainer_stem, save_explainer, stem_from_out

TARGET_MODES = ("top1+second", "top1")
AUGMENTS = ("auto", "photo", "cells", "none")


# --- data ---------------------------------------------------------------------------------------------

def load_train_images(data, image_hw, *, photo: bool, subset: int | None = None, seed: int = 0):
    """uint8 N x 3 x S x S images in memory (photos: shorter side resized to input/0.875, centre square
    kept, so random resized crops have room) and their labels."""
    from PIL import Image

    from ..data import open_dataset, pil_to_tensor

    dataset = open_dataset(data, split="train")
    indices = list(range(len(dataset)))
    if subset and subset < len(indices):
        indices = sorted(random.Random(seed).sample(indices, subset))
    side = int(round(max(image_hw) / 0.875)) if photo else None
    images = []
    for index in indices:
        image = dataset.image(index)
        if photo:
            w, h = image.size
            scale = side / min(w, h)
            image = image.resize((max(side, round(w * scale)), max(side, round(h * scale))), Image.BICUBIC)
            w, h = image.size
            left, top = (w - side) // 2, (h - side) // 2
            image = image.crop((left, top, left + side, top + side))
        elif image.size != (image_hw[1], image_hw[0]):
            image = image.resize((image_hw[1], image_hw[0]), Image.BICUBIC)
        images.append((pil_to_tensor(image) * 255).round().to(torch.uint8))
    labels = torch.tensor([int(dataset.labels[i]) for i in indices], dtype=torch.long)
    return torch.stack(images), labels


def augment_photos(batch: torch.Tensor, image_hw, generator: torch.Generator) -> torch.Tensor:
    """Strong augmentation to stretch a few hundred photos: random resized crop (scale 0.2-1, ratio 3/4-4/3),
    horizontal flip, brightness / contrast / saturation jitter (+-30%)."""
    out = []
    for image in batch:
        _, h, w = image.shape
        for _ in range(10):
            area = h * w * float(torch.empty(1).uniform_(0.2, 1.0, generator=generator))
            ratio = math.exp(float(torch.empty(1).uniform_(math.log(3 / 4), math.log(4 / 3), generator=generator)))
            cw, ch = int(round(math.sqrt(area * ratio))), int(round(math.sqrt(area / ratio)))
            if 0 < cw <= w and 0 < ch <= h:
                break
        else:
            cw, ch = w, h
        top = int(torch.randint(0, h - ch + 1, (1,), generator=generator))
        left = int(torch.randint(0, w - cw + 1, (1,), generator=generator))
        crop = image[:, top:top + ch, left:left + cw].unsqueeze(0)
        crop = F.interpolate(crop, size=tuple(image_hw), mode="bilinear", align_corners=False, antialias=True)[0]
        if float(torch.rand(1, generator=generator)) < 0.5:
            crop = crop.flip(2)
        out.append(crop)
    out = torch.stack(out)
    b = out.shape[0]
    jitter = lambda: 1 + (torch.rand(b, 1, 1, 1, generator=generator) - 0.5) * 0.6  # noqa: E731
    gray = out.mean(dim=1, keepdim=True)
    out = gray + (out - gray) * jitter()
    mean = out.mean(dim=(1, 2, 3), keepdim=True)
    out = ((out - mean) * jitter() + mean) * jitter()
    return out.clamp(0, 1)


def augment_batch(images_u8: torch.Tensor, mode: str, image_hw, generator: torch.Generator) -> torch.Tensor:
    batch = images_u8.float() / 255
    if mode == "photo":
        return augment_photos(batch, image_hw, generator)
    if mode == "cells":
        from ..training import augment

        return augment(batch, generator)
    return batch


# --- distributed --------------------------------------------------------------------------------------

def distributed_setup():
    """(rank, world size, device) from torchrun's environment; initialises the process group if needed."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return rank, world, device


def replicas_identical(module: torch.nn.Module) -> bool:
    """True when every rank holds exactly the same parameters (checked with max/min all-reduces)."""
    if not (dist.is_available() and dist.is_initialized()):
        return True
    flat = torch.cat([p.detach().float().flatten() for p in module.parameters()])
    high, low = flat.clone(), flat.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    return bool(torch.equal(high, low))


# --- held-out figures ---------------------------------------------------------------------------------

def load_eval_images(bundle, data, limit: int | None, split: str = "val"):
    from ..data import open_dataset
    from ..images import prepare_for_model

    dataset = open_dataset(data, split=split, limit=limit)  # an even spread over the (class-sorted) file
    count = len(dataset)
    images = torch.cat([prepare_for_model(dataset.image(i), bundle)[0] for i in range(count)])
    return images, torch.tensor([int(dataset.labels[i]) for i in range(count)])


def held_out_figures(explainer: AHAExplainer, images: torch.Tensor, labels: torch.Tensor, *,
                     batch_size: int = 16, compare: tuple = ("gradcam", "random"), seed: int = 0) -> dict:
    """Hard (the evaluation engine: 21 fractions, mean reference) and soft (the training loss without noise,
    tau 0.3, finest grid, 16 fractions, mean reference) deletion / insertion AUCs of the explainer's top-1
    maps, next to the same images explained by an untrained explainer (the class activation map it starts
    from) and by the `compare` methods."""
    from ..methods import get_method
    from ..metrics import deletion_insertion

    bundle = explainer.bundle
    device = bundle.device
    torch.manual_seed(seed)
    untrained = AHAExplainer(bundle, **{k: explainer.arch[k] for k in ("width", "embed_dim", "gain_init",
                                                                      "class_embedding", "use_cam", "indices", "scales",
                                                                      "fusion_units", "prior") if k in explainer.arch})
    untrained.to(device).eval()
    rows = {"aha": [], "aha_untrained": []}
    rows.update({name: [] for name in compare})
    soft_del, soft_ins, correct = [], [], 0
    grid = grid_range(bundle.input_size)[1]
    for start in range(0, len(images), batch_size):
        x = images[start:start + batch_size].to(device)
        logits, maps, targets = explainer.predict_and_explain(x)
        correct += int((logits.argmax(1).cpu() == labels[start:start + batch_size]).sum())
        with torch.no_grad():
            terms = aha_loss(bundle, x, maps, targets, reference_batch(x, "mean", bundle.reference_color),
                             grid=grid, tau=TAU_END, noise=False, reduce=False)
        soft_del.append(terms.deletion_auc.cpu())
        soft_ins.append(terms.insertion_auc.cpu())
        candidates = {"aha": maps, "aha_untrained": untrained(x, targets).detach()}
        for name in compare:
            candidates[name] = get_method(name).attribute(bundle, x, targets).detach()
        for name, method_maps in candidates.items():
            curves = deletion_insertion(bundle, x, method_maps, targets, steps=20, reference="mean")
            rows[name].append(np.stack([curves.deletion_auc, curves.insertion_auc], 1))
    figures = {"images": int(len(images)), "targets": "top-1 prediction", "classifier_accuracy": correct / len(images),
               "hard": "deletion_insertion engine: 21 fractions (K=20), mean-colour reference, softmax of the target",
               "soft": f"training loss without noise: tau {TAU_END}, G={grid}, {NUM_FRACTIONS} fractions, mean reference",
               "soft_deletion_auc": float(torch.cat(soft_del).mean()),
               "soft_insertion_auc": float(torch.cat(soft_ins).mean())}
    for name, chunks in rows.items():
        values = np.concatenate(chunks)
        figures[f"{name}_deletion_auc"] = float(values[:, 0].mean())
        figures[f"{name}_insertion_auc"] = float(values[:, 1].mean())
    return figures


def validation_scores(explainer: AHAExplainer, images: torch.Tensor, *, batch_size: int = 32,
                      steps: int = 20) -> dict:
    """The fixed validation metric logged during training: hard deletion / insertion AUCs (the evaluation
    engine, mean reference, K = `steps`) of the explainer's top-1 maps on fixed held-out images."""
    from ..metrics import deletion_insertion

    bundle = explainer.bundle
    was_training = explainer.training
    explainer.eval()
    deletion, insertion = [], []
    try:
        for start in range(0, len(images), batch_size):
            x = images[start:start + batch_size].to(bundle.device)
            with torch.no_grad():
                _, maps, targets = explainer.predict_and_explain(x)
            curves = deletion_insertion(bundle, x, maps.float(), targets, steps=steps, reference="mean")
            deletion.append(np.asarray(curves.deletion_auc))
            insertion.append(np.asarray(curves.insertion_auc))
    finally:
        explainer.train(was_training)
    deletion, insertion = np.concatenate(deletion), np.concatenate(insertion)
    return {"deletion_auc": round(float(deletion.mean()), 5), "insertion_auc": round(float(insertion.mean()), 5),
            "ins_minus_del": round(float((insertion - deletion).mean()), 5)}


def refresh_held_out(model: str, val_data: str, *, stem=None, val_limit: int = 256,
                     compare: tuple = ("gradcam", "random")) -> dict:
    """Measure a trained explainer's held-out figures again (e.g. on another sample) and store them in its card;
    the weights are untouched. Returns the figures."""
    from ..models import load_model
    from .store import load_explainer

    bundle = load_model(model)
    stem = stem_from_out(stem) if stem else explainer_stem(model)
    explainer = load_explainer(bundle, stem).eval()
    x_val, y_val = load_eval_images(bundle, val_data, val_limit)
    figures = held_out_figures(explainer, x_val, y_val, compare=tuple(compare))
    figures.update({"data": str(val_data), "sample": f"{len(x_val)} images spread evenly over the file",
                    "command": " ".join(["python -m explainers"] + sys.argv[1:])})
    card_file = Path(str(stem) + ".json")
    card = json.loads(card_file.read_text())
    card["held_out"] = figures
    from ..training import atomic_write_text

    atomic_write_text(json.dumps(card, indent=2), card_file)  # the same card writer as save_explainer
    return figures


# --- training -----------------------------------------------------------------------------------------

def _targets(logits: torch.Tensor, labels: torch.Tensor, mode: str):
    """(pair index into the batch, target) pairs: top-1, plus the runner-up if top-1 is correct, else the label."""
    b = logits.shape[0]
    top2 = logits.topk(2, dim=1).indices
    first = top2[:, 0]
    index = torch.arange(b, device=logits.device)
    if mode == "top1":
        return index, first
    second = torch.where(first == labels, top2[:, 1], labels)
    return torch.cat([index, index]), torch.cat([first, second])


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
              val_every: int = 0, val_track: int = 64, progress: bool = True, command: str | None = None) -> dict:
    """Train (or resume) an explainer for `model` and export weights + card. Returns the card (rank 0).
    `val_every` > 0 measures the fixed validation metric (hard AUCs on `val_track` images of `val_data`)
    every that many steps, logs it, and exports the best checkpoint by ins-del instead of the last."""
    from ..models import load_model

    options = dict(data=data, out=out, val_data=val_data, val_limit=val_limit, steps=steps, epochs=epochs,
                   batch_size=batch_size, lr=lr, weight_decay=weight_decay, warmup=warmup, clip=clip, targets=targets,
                   fractions=fractions, fraction_samples=fraction_samples, peak_weight=peak_weight,
                   tau_start=tau_start, tau_end=tau_end, grid_min=grid_min, grid_max=grid_max, references=references,
                   augment=augment, subset=subset, seed=seed, width=width, embed_dim=embed_dim, gain_init=gain_init,
                   fusion_units=fusion_units, time_budget_minutes=time_budget_minutes,
                   checkpoint_every=checkpoint_every, log_every=log_every, compare=compare, val_every=val_every,
                   val_track=val_track, progress=progress, command=command)

    if targets not in TARGET_MODES:
        raise ValueError(f"targets must be one of {TARGET_MODES}")
    if augment not in AUGMENTS:
        raise ValueError(f"augment must be one of {AUGMENTS}")
    rank, world, device = distributed_setup()
    if device.type == "cpu" and world > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    bundle = bundle or load_model(model)
    bundle.to(device)
    # the classifier is shared (the model cache): freeze it for training, put every flag back afterwards
    saved_flags = [(p, p.requires_grad) for p in bundle.network.parameters()]
    saved_mode = bundle.network.training
    bundle.network.eval().requires_grad_(False)
    try:
        return _train_frozen(bundle, rank=rank, world=world, device=device, **options)
    finally:
        for parameter, flag in saved_flags:
            parameter.requires_grad_(flag)
        bundle.network.train(saved_mode)


def _train_frozen(bundle, *, rank, world, device, data, out, val_data, val_limit, steps, epochs, batch_size, lr,
                  weight_decay, warmup, clip, targets, fractions, fraction_samples, peak_weight, tau_start, tau_end,
                  grid_min, grid_max, references, augment, subset, seed, width, embed_dim, gain_init,
                  fusion_units, time_budget_minutes, checkpoint_every, log_every, compare, val_every, val_track,
                  progress, command) -> dict:
    model = bundle.name
    stem = stem_from_out(out) if out else explainer_stem(model)
    checkpoint_path = Path(str(stem) + ".ckpt")
    if rank == 0:
        checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
    image_hw = tuple(bundle.input_size)
    mode = augment if augment != "auto" else ("photo" if min(image_hw) >= 128 else "cells")
    low, high = grid_range(image_hw)
    low, high = grid_min or low, grid_max or high

    images, labels = load_train_images(data, image_hw, photo=mode == "photo", subset=subset, seed=seed)
    per_rank = max(1, batch_size // world)
    global_batch = per_rank * world
    steps_per_epoch = max(1, len(images) // global_batch)
    total_steps = int(steps) if steps else max(1, int(round(epochs * steps_per_epoch)))
    warmup_steps = max(1, int(round(warmup * total_steps)))

    torch.manual_seed(seed)
    explainer = AHAExplainer(bundle, width=width, embed_dim=embed_dim, gain_init=gain_init,
                             fusion_units=fusion_units).to(device)
    explainer.train()
    model_ddp = explainer
    if world > 1:
        model_ddp = torch.nn.parallel.DistributedDataParallel(
            explainer, device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=not explainer.use_cam)
    optimizer = torch.optim.AdamW(explainer.parameters(), lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup_steps) * (
        1.0 if s < warmup_steps else 0.5 * (1 + math.cos(math.pi * (s - warmup_steps) / max(1, total_steps - warmup_steps)))))

    step, elapsed_before, history = 0, 0.0, []
    validation, best = [], None  # best: {"step", "ins_minus_del", "state"} by the fixed validation metric
    x_track = None
    if val_every and val_data and rank == 0:
        x_track, _ = load_eval_images(bundle, val_data, val_track)
    if checkpoint_path.exists():
        state = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
        if state["total_steps"] != total_steps:
            raise ValueError(f"{checkpoint_path} was made for {state['total_steps']} steps, not {total_steps}; "
                             "use the same options or delete the checkpoint")
        explainer.load_state_dict(state["explainer"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        step, elapsed_before, history = state["step"], state["elapsed"], json.loads(state["history"])
        validation = json.loads(state.get("validation", "[]"))
        if "best_state" in state:
            best = {"step": int(state["best_step"]), "ins_minus_del": float(state["best_score"]),
                    "state": state["best_state"]}
        if rank == 0:
            print(f"Resuming aha-{model} at step {step}/{total_steps}", file=sys.stderr)

    fraction_grid = default_fractions(fractions)
    amp = device.type == "cuda"
    started = time.time()
    bar = tqdm(total=total_steps, initial=step, desc=f"aha-{model}", file=sys.stderr, disable=not progress or rank)
    running = None
    stopped_early = False

    def save_checkpoint():
        if rank == 0:
            from ..training import atomic_save

            state = {"explainer": explainer.state_dict(), "optimizer": optimizer.state_dict(),
                     "schedule": schedule.state_dict(), "step": step, "total_steps": total_steps,
                     "elapsed": elapsed_before + time.time() - started, "history": json.dumps(history),
                     "validation": json.dumps(validation)}
            if best is not None:
                state.update(best_state=best["state"], best_step=best["step"], best_score=best["ins_minus_del"])
            atomic_save(state, checkpoint_path)

    def track_validation():
        nonlocal best
        scores = validation_scores(explainer, x_track)
        scores.update(step=step, seconds=round(elapsed_before + time.time() - started, 1))
        validation.append(scores)
        if best is None or scores["ins_minus_del"] > best["ins_minus_del"]:
            best = {"step": step, "ins_minus_del": scores["ins_minus_del"],
                    "state": {k: v.detach().clone().cpu() for k, v in explainer.state_dict().items()}}
        bar.write(f"step {step}: validation deletion {scores['deletion_auc']:.4f} insertion "
                  f"{scores['insertion_auc']:.4f} ins-del {scores['ins_minus_del']:.4f} (best at step {best['step']})")

    if x_track is not None and step == 0:
        track_validation()  # the untrained explainer (its prior) is a candidate too
    while step < total_steps:
        epoch, position = divmod(step, steps_per_epoch)
        order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed * 1000 + epoch))
        chosen = order[position * global_batch + rank * per_rank: position * global_batch + (rank + 1) * per_rank]
        generator = torch.Generator().manual_seed(seed * 1_000_003 + step * 97 + rank)
        rng = random.Random(seed * 7919 + step)  # same on every rank: one grid, reference, fraction draw
        x = augment_batch(images[chosen], mode, image_hw, generator).to(device)
        y = labels[chosen].to(device)
        grid = rng.randint(low, high)
        reference = references[rng.randrange(len(references))]
        tau = tau_at(step, total_steps, tau_start, tau_end)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            encoded = explainer.encode(x)  # one classifier pass: features, and logits for the targets
            index, target = _targets(encoded.logits, y, targets)
            with torch.no_grad():
                refs = reference_batch(x, reference, bundle.reference_color)
                clean = encoded.logits.float().softmax(1)[index, target]
                blank = bundle(refs).float().softmax(1)[index, target]
            maps = model_ddp(encoded.select(index), target)
            terms = aha_loss(bundle, x[index], maps.float(), target, refs[index], grid=grid, tau=tau,
                             fractions=fraction_grid, fraction_samples=fraction_samples, peak_weight=peak_weight,
                             generator=generator, rng=rng, endpoint_probs=(clean, blank))
        optimizer.zero_grad(set_to_none=True)
        terms.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(explainer.parameters(), clip)
        optimizer.step()
        schedule.step()
        step += 1
        loss = float(terms.loss.detach())
        running = loss if running is None else 0.9 * running + 0.1 * loss
        bar.update(1)
        bar.set_postfix(loss=f"{running:.3f}", tau=f"{tau:.2f}", G=grid, lr=f"{schedule.get_last_lr()[0]:.1e}")
        if step % log_every == 0 or step == total_steps:
            history.append({"step": step, "loss": round(running, 5), "deletion_auc": round(float(terms.deletion_auc.mean()), 5),
                            "insertion_auc": round(float(terms.insertion_auc.mean()), 5),
                            "peak": round(float(terms.peak.mean()), 4), "tau": round(tau, 4), "grid": grid,
                            "grad_norm": round(float(grad_norm), 4),
                            "seconds": round(elapsed_before + time.time() - started, 1)})
        if x_track is not None and (step % val_every == 0 or step == total_steps):
            track_validation()
        if step % checkpoint_every == 0:
            save_checkpoint()
        if time_budget_minutes is not None:
            over = torch.tensor(float(elapsed_before + time.time() - started > 60 * time_budget_minutes))
            if world > 1:
                dist.all_reduce(over, op=dist.ReduceOp.MAX)
            if over.item() and step < total_steps:
                stopped_early = True
                break
    bar.close()
    save_checkpoint()
    train_seconds = elapsed_before + time.time() - started
    identical = replicas_identical(explainer)
    if not identical:
        raise RuntimeError("DDP replicas diverged: ranks hold different explainer weights")
    card = None
    if rank == 0:
        explainer.eval()
        exported_step = step
        if best is not None:  # keep the best checkpoint by the fixed validation metric, not the last
            explainer.load_state_dict(best["state"])
            exported_step = best["step"]
        recipe = {
            "data": str(data), "train_images": int(len(images)), "subset": subset, "augment": mode,
            "steps": step, "planned_steps": total_steps, "stopped_by_time_budget": stopped_early,
            "time_budget_minutes": time_budget_minutes, "epochs_done": round(step / steps_per_epoch, 3),
            "batch_size_global": global_batch, "world_size": world, "device": str(device),
            "autocast": "bf16" if amp else None, "targets": targets, "fractions": fractions,
            "fraction_samples_per_step": fraction_samples, "grid_range": [low, high],
            "references": list(references), "tau": [tau_start, tau_end], "optimizer": "AdamW",
            "lr": lr, "weight_decay": weight_decay, "warmup_fraction": warmup, "schedule": "linear warm-up, cosine",
            "grad_clip": clip, "peak_weight": peak_weight, "seed": seed,
        }
        if validation:
            recipe["validation_metric"] = (f"hard deletion/insertion (engine, K=20, mean reference) of top-1 maps on "
                                           f"{len(x_track)} images of {val_data} spread over the file, every "
                                           f"{val_every} steps; the exported weights are the best by ins-del")
        card = {"base_model": model, "recipe": recipe, "train_seconds": round(train_seconds, 1),
                "exported_step": exported_step, "validation": validation,
                "training_command": command or " ".join(["python -m explainers"] + sys.argv[1:]),
                "history": history, "ddp_replicas_identical": identical,
                "software": {"torch": torch.__version__, "python": platform.python_version()}}
        if val_data:
            x_val, y_val = load_eval_images(bundle, val_data, val_limit)
            figures = held_out_figures(explainer, x_val, y_val, compare=tuple(compare))
            figures["data"] = str(val_data)
            card["held_out"] = figures
        if validation:
            from .plot import validation_plot

            plot = validation_plot(validation, Path(str(stem) + ".validation.png"), exported_step=exported_step,
                                   title=f"aha-{model}: validation during training ({len(x_track)} images of {val_data})")
            card["validation_plot"] = plot.name
        card = save_explainer(explainer, stem, card)
    if world > 1:
        dist.barrier()
    return card


# --- command line -------------------------------------------------------------------------------------

def add_aha_figures_parser(commands) -> None:
    p = commands.add_parser("aha-figures", help="measure a trained AHA explainer's held-out figures into its card")
    p.add_argument("--model", required=True)
    p.add_argument("--val-data", required=True, help="held-out images (never trained on)")
    p.add_argument("--val-limit", type=int, default=256)
    p.add_argument("--explainer", default=None, help="explainer stem (default weights/aha-<model>)")
    p.set_defaults(handler=lambda args: print(json.dumps(refresh_held_out(
        args.model, args.val_data, stem=args.explainer, val_limit=args.val_limit), indent=2)) or 0)


def add_train_aha_parser(commands) -> None:
    """Register `train-aha` on an argparse subparsers object (explainers/cli.py)."""
    p = commands.add_parser("train-aha", help="train an AHA explainer for a model (resumable, torchrun for DDP)")
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True, help="training images (folder with labels.csv, or .npz)")
    p.add_argument("--out", default=None, help="output stem, default weights/aha-<model>")
    p.add_argument("--val-data", default=None, help="held-out images for the card's figures (never trained on)")
    p.add_argument("--val-limit", type=int, default=256)
    p.add_argument("--steps", type=int, default=None, help="optimisation steps (default: --epochs worth)")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=32, help="global batch (images; pairs with two targets)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--weight-decay", type=float, default=1e-3)
    p.add_argument("--warmup", type=float, default=0.06)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--targets", choices=TARGET_MODES, default="top1+second")
    p.add_argument("--fractions", type=int, default=NUM_FRACTIONS)
    p.add_argument("--fraction-samples", type=int, default=None, help="random interior fractions per step (all)")
    p.add_argument("--peak-weight", type=float, default=PEAK_WEIGHT)
    p.add_argument("--grid-min", type=int, default=None)
    p.add_argument("--grid-max", type=int, default=None)
    p.add_argument("--augment", choices=AUGMENTS, default="auto")
    p.add_argument("--subset", type=int, default=None, help="train on a random subset of N images")
    p.add_argument("--width", type=int, default=DEFAULT_ARCH["width"])
    p.add_argument("--fusion-units", type=int, choices=[1, 2], default=2,
                   help="residual conv units per fusion level: 2 = DPT, 1 = lighter decoder")
    p.add_argument("--time-budget-minutes", type=float, default=None)
    p.add_argument("--checkpoint-every", type=int, default=25)
    p.add_argument("--val-every", type=int, default=0,
                   help="measure the validation metric every N steps and export the best checkpoint (needs --val-data)")
    p.add_argument("--val-track", type=int, default=64, help="validation images tracked during training")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler=cmd_train_aha)


def cmd_train_aha(args) -> int:
    card = train_aha(model=args.model, data=args.data, out=args.out, val_data=args.val_data, val_limit=args.val_limit,
                     steps=args.steps, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                     weight_decay=args.weight_decay, warmup=args.warmup, clip=args.clip, targets=args.targets,
                     fractions=args.fractions, fraction_samples=args.fraction_samples, peak_weight=args.peak_weight,
                     grid_min=args.grid_min, grid_max=args.grid_max, augment=args.augment, subset=args.subset,
                     width=args.width, fusion_units=args.fusion_units, time_budget_minutes=args.time_budget_minutes,
                     checkpoint_every=args.checkpoint_every, seed=args.seed, val_every=args.val_every,
                     val_track=args.val_track)
    if card is not None:
        summary = {k: card[k] for k in ("base_model", "weights_file", "train_seconds")}
        summary["held_out"] = card.get("held_out")
        print(json.dumps(summary, indent=2))
    return 0
