"""CAMAL: class activation map attention learning (spec: docs methods.md section 4).

Fine-tune a classifier so that its class activation map lies inside a trusted mask:

    L = mean_b CE(logits_b, y_b) + lambda * mean_b (beta_b - alpha_b)

The paper writes lambda * sum_b (beta_b - alpha_b) next to a batch-mean cross-entropy, which makes the weight of
the mask term lambda x B (32x at batch 32) and dependent on the batch size; here both terms are batch means, so
lambda weighs one image's regulariser against one image's cross-entropy (lambda_here = B x lambda_paper).

alpha_b / beta_b = mean of the Grad-CAM map H_b (target = the label y_b, normalised by its maximum, upsampled to
the mask) inside / outside the mask M_b. The CAM is batch-level (`methods.gradcam.gradcam_maps`: ONE backward for
the batch) and differentiable (gradient taken with create_graph, `cam_mode="differentiable"`, the default) or
cheaper with its channel weights detached (`cam_mode="detach-weights"`: no second-order path through the
weights). lambda defaults to DEFAULT_LAMBDA = 16 per image (tuned on decoy BloodMNIST val). Not verified against author code (the paper has none).

    python -m explainers camal --model bloodmnist-cnn --data DIR/train [--masks DIR/train] \
        --eval-data DIR/test --epochs 3 --lambda 16 --out weights/bloodmnist-cnn-camal

Library: `run_camal(...)` (what the CLI and the 'camal' job kind call), `finetune`, `evaluate`, `camal_loss`,
`camal_regulariser`. Data and masks: a mask set (`explainers.masks`, `masks.csv`). The result is a model-zoo
checkpoint (`weights/NAME.safetensors` + `NAME.json`, kind "classifier"): `models.load_model(NAME)` loads it and
`models.list_models()` lists it; its card records the base model, data, masks, lambda, epochs, the before/after
metrics and a before/after figure (`NAME.camal.png`).

Choices (named options): AdamW, cosine learning-rate decay, gradient clipping at 1.0, paired augmentation of images
and masks (random 90-degree turns and flips), `freeze_early` = fraction of the network's early units frozen
(0 = none); BatchNorm keeps its running statistics (`bn_train=False`: a small or shifted mask set cannot
corrupt them, and samples never interact, so the batch-level CAM is exact during training too); bf16 autocast
on CUDA. Pointing game tolerance: TorchRay's 15 px at 224 px, scaled to the image
(4 px at 64 px; `metrics.pointing_tolerance`, shared with `evaluate`), since 15 px would cover most of a 64 px image.

Data-parallel: run under torchrun (`torchrun --nproc_per_node 2 -m explainers camal ...`; gloo on CPU, NCCL on
CUDA). Each rank takes its share of every global batch; gradients are summed with all_reduce (the loss is
scaled so the sum equals the single-process loss of the global batch); rank 0 evaluates and writes the model.
"""
from __future__ import annotations

import copy
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .masks import MaskError, MaskSet, find_masks_csv, load_mask_set
from .methods.gradcam import gradcam_maps
from .models import load_bundle  # noqa: F401  (a name or a card: the zoo's one card loader)

CAM_MODES = ("differentiable", "detach-weights")
# lambda per image (the regulariser is a batch mean): 16, chosen on decoy BloodMNIST val (random squares) from
# {1, 4, 16, 32}: 16 and 32 were within noise there (clean accuracy 0.690 / 0.698, IoU 0.699 / 0.708 on 800 val
# images, vanilla 0.538 / 0.472), and 32 (the old sum at batch 32) cost clean accuracy from a pretrained start.
DEFAULT_LAMBDA = 16.0
# learning rate 3e-4 (was 1e-4), chosen on decoy BloodMNIST val with the default 3 epochs and lambda 16 (issue #11,
# bench/results/camal-decoy-val-epochs-lr.json): CAM-in-mask IoU 0.395 (vanilla) -> 0.838 at 3e-4 (x2.12, clean
# accuracy 0.786 vs vanilla 0.539) but only -> 0.658 at 1e-4 (x1.57); 8 epochs reached 0.867 but lost clean
# accuracy (0.603), lambda 64 was level with 16 (0.851 / 0.805).
DEFAULT_LR = 3e-4
DEFAULTS = {"epochs": 3, "lam": DEFAULT_LAMBDA, "lr": DEFAULT_LR, "weight_decay": 0.05, "batch_size": 32,
            "cam_mode": "differentiable", "freeze_early": 0.0, "augment": True, "seed": 0}


class Cancelled(Exception):
    """The run was cancelled: raised between batches of the evaluation (`run_camal` returns a cancelled
    summary); the training loop checks after every step and stops."""


def _check_cancelled(cancelled) -> None:
    if cancelled is not None and cancelled():
        raise Cancelled()


# ------------------------------------------------------------------------------------------ the loss
def camal_regulariser(cams: torch.Tensor, masks: torch.Tensor) -> tuple:
    """(beta - alpha per sample, alpha, beta): means of the B x H x W maps inside / outside the masks."""
    if cams.shape != masks.shape:
        raise MaskError(f"CAMs are {tuple(cams.shape)} but masks are {tuple(masks.shape)}: a mask must match "
                        "its image's size")
    m = masks.to(cams.dtype)
    inside = m.sum(dim=(1, 2))
    outside = (1 - m).sum(dim=(1, 2))
    if bool((inside == 0).any()) or bool((outside == 0).any()):
        raise MaskError("A mask in the batch is empty or covers the whole image: CAMAL needs an inside and an "
                        "outside for every image.")
    alpha = (cams * m).sum(dim=(1, 2)) / inside
    beta = (cams * (1 - m)).sum(dim=(1, 2)) / outside
    return beta - alpha, alpha, beta


def camal_loss(bundle, images: torch.Tensor, labels: torch.Tensor, masks: torch.Tensor, *, lam: float = 1.0,
               cam_mode: str = "differentiable", layer: str | None = None, reduction_size: int | None = None,
               with_iou: bool = False):
    """mean CE + lambda * mean_b (beta_b - alpha_b) from one forward pass (the CAM's logits are the CE's logits).

    `reduction_size`: divide the summed CE and the summed regulariser by this (the global batch size under data
    parallelism, where the ranks' gradients are summed; default B).
    Returns (loss, stats) with stats sums over the batch: ce, reg, alpha, beta, correct, count; with `with_iou`
    (and a CAM, lambda > 0) also iou: the summed top-pixel IoU of the batch's CAMs with their masks (as
    `evaluate`'s, on the training batch)."""
    if cam_mode not in CAM_MODES:
        raise ValueError(f"cam_mode must be one of {', '.join(CAM_MODES)}, got {cam_mode!r}")
    count = images.shape[0]
    if lam:
        cams, logits = gradcam_maps(bundle, images, labels, layer_name=layer, differentiable=True,
                                    detach_weights=cam_mode == "detach-weights", upsample_to=tuple(masks.shape[-2:]),
                                    return_logits=True)
        reg, alpha, beta = camal_regulariser(cams.float(), masks)
        reg_sum = reg.sum()
    else:  # plain fine-tuning: no CAM at all
        logits = bundle(images)
        reg_sum = alpha = beta = torch.zeros((), device=images.device)
    ce_sum = F.cross_entropy(logits.float(), labels, reduction="sum")
    loss = (ce_sum + lam * reg_sum) / (reduction_size or count)
    stats = {"ce": ce_sum.detach(), "reg": reg_sum.detach(), "alpha": alpha.detach().sum(),
             "beta": beta.detach().sum(), "correct": (logits.argmax(1) == labels).sum().detach(),
             "count": torch.tensor(count, device=images.device)}
    if with_iou and lam:
        from .metrics import top_pixel_iou

        ious = top_pixel_iou(cams.detach().float(), masks)
        stats["iou"] = torch.tensor(float(np.nansum(ious)), device=images.device)
    return loss, stats


# ------------------------------------------------------------------------------------------ model helpers
def private_copy(bundle):
    """A bundle sharing nothing trainable with the (cached, shared) original."""
    clone = copy.copy(bundle)
    clone.network = copy.deepcopy(bundle.network)
    clone.card = dict(bundle.card)
    import threading
    clone.lock = threading.RLock()
    return clone


def network_units(network: nn.Module) -> list:
    """The network's units in forward order: top-level children, with block/stage lists expanded."""
    units = []
    for name, child in network.named_children():
        if name in ("blocks", "stages", "layers") and isinstance(child, (nn.Sequential, nn.ModuleList)):
            units += [(f"{name}.{i}", sub) for i, sub in enumerate(child)]
        elif any(True for _ in child.parameters()):
            units.append((name, child))
    return [(n, u) for n, u in units if any(True for _ in u.parameters())]


def freeze_early_layers(network: nn.Module, fraction: float) -> list:
    """Freeze the first `fraction` of the units (never the last one, the head) and the network's own direct
    parameters (class token, position embedding). Returns the frozen units' names."""
    if not fraction:
        return []
    units = network_units(network)
    count = min(len(units) - 1, int(round(fraction * len(units))))
    frozen = []
    for name, unit in units[:max(count, 0)]:
        for parameter in unit.parameters():
            parameter.requires_grad_(False)
        frozen.append(name)
    for parameter in network.parameters(recurse=False):
        parameter.requires_grad_(False)
    return frozen


def _set_frozen_eval(network: nn.Module, frozen: list) -> None:
    for name in frozen:
        network.get_submodule(name).eval()  # frozen BatchNorm keeps its statistics


def _batchnorm_eval(network: nn.Module) -> None:
    """BatchNorm uses and keeps its running statistics (its affine weights still train): a small or shifted
    fine-tuning set cannot corrupt them, and samples do not interact, so the batch-level CAM is exact."""
    for module in network.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.eval()


def paired_augment(images: torch.Tensor, masks: torch.Tensor, turns: torch.Tensor, flips: torch.Tensor) -> tuple:
    """The same random 90-degree turn and horizontal flip for each image and its mask."""
    images, masks = images.clone(), masks.clone()
    for k in range(1, 4):
        index = (turns == k).nonzero().flatten()
        if len(index):
            images[index] = torch.rot90(images[index], k, dims=(2, 3))
            masks[index] = torch.rot90(masks[index], k, dims=(1, 2))
    images[flips] = images[flips].flip(3)
    masks[flips] = masks[flips].flip(2)
    return images, masks


# ------------------------------------------------------------------------------------------ distributed
def dist_info() -> tuple:
    """(world size, rank, local rank); (1, 0, 0) outside torchrun."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank(), int(os.environ.get("LOCAL_RANK", 0))
    return 1, 0, 0


def init_distributed(device=None) -> tuple:
    """Join the torchrun process group if WORLD_SIZE > 1 (gloo on CPU, NCCL on CUDA); returns (world, rank, device)."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        use_cuda = torch.cuda.is_available() and str(device or "cuda").startswith("cuda")
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    world, rank, local_rank = dist_info()
    if device is None:
        device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    elif world > 1 and str(device) == "cuda":
        device = f"cuda:{local_rank}"
    if str(device).startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    return world, rank, str(device)


def _all_reduce_(tensors: list) -> None:
    """Sum tensors across ranks in one flat buffer."""
    import torch.distributed as dist

    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def _broadcast_state(network: nn.Module) -> None:
    import torch.distributed as dist

    for tensor in list(network.parameters()) + list(network.buffers()):
        dist.broadcast(tensor.data, src=0)


def _average_buffers(network: nn.Module, world: int) -> None:
    buffers = [b for b in network.buffers() if b.is_floating_point()]
    _all_reduce_(buffers)
    for b in buffers:
        b.div_(world)


# ------------------------------------------------------------------------------------------ evaluation


@torch.no_grad()
def predict_labels(bundle, images_u8: torch.Tensor, batch_size: int = 128) -> torch.Tensor:
    bundle.network.eval()
    out = []
    for start in range(0, len(images_u8), batch_size):
        x = images_u8[start:start + batch_size].to(bundle.device).float() / 255
        out.append(bundle(x).argmax(1).cpu())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def resolve_labels(bundle, data: MaskSet) -> MaskSet:
    """Replace -1 labels by the model's predictions (pseudo-labels; fixed before fine-tuning)."""
    unknown = data.labels < 0
    if bool(unknown.any()):
        labels = data.labels.clone()
        labels[unknown] = predict_labels(bundle, data.images[unknown])
        data = MaskSet(data.images, data.masks, labels, data.files, data.root)
        data.pseudo_labels = int(unknown.sum())
    return data


def cam_maps(bundle, data: MaskSet, *, batch_size: int = 64, layer: str | None = None, limit: int | None = None,
             cancelled=None):
    """Grad-CAM maps (target = label) and predictions for a mask set, eval mode, batch-level; `cancelled()` is
    checked before every batch (raises Cancelled)."""
    bundle.network.eval()
    count = min(len(data), limit) if limit else len(data)
    maps, predictions = [], []
    for start in range(0, count, batch_size):
        _check_cancelled(cancelled)
        stop = min(start + batch_size, count)
        x = data.float_images(slice(start, stop)).to(bundle.device)
        y = data.labels[start:stop].to(bundle.device)
        cams, logits = gradcam_maps(bundle, x, y, layer_name=layer, return_logits=True)
        maps.append(cams.detach().float().cpu())
        predictions.append(logits.detach().argmax(1).cpu())
    return torch.cat(maps), torch.cat(predictions)


def evaluate(bundle, data: MaskSet, *, batch_size: int = 64, curve_limit: int = 128, steps: int = 20,
             reference: str = "mean", layer: str | None = None, return_maps: bool = False, cancelled=None,
             curve_batch: int = 16):
    """Accuracy, CAM-vs-mask IoU (top pixels), pointing game, mean CAM inside/outside the mask, and
    deletion/insertion AUCs (on the first `curve_limit` images; which way is better: `metrics.METRICS`).
    `cancelled()` is checked between batches (CAMs: `batch_size` images, curves: `curve_batch` images; each
    image's curve is independent of the others, so the means over chunks are the means over all)."""
    from .metrics import deletion_insertion, pointing_game, pointing_tolerance, top_pixel_iou

    maps, predictions = cam_maps(bundle, data, batch_size=batch_size, layer=layer, cancelled=cancelled)
    masks = data.masks.bool()
    _, alpha, beta = camal_regulariser(maps, masks)
    energy_inside = (maps * masks).sum(dim=(1, 2)) / maps.sum(dim=(1, 2)).clamp_min(1e-12)
    tolerance = pointing_tolerance(masks.shape[-2:])
    result = {
        "count": len(data),
        "accuracy": float((predictions == data.labels).float().mean()),
        "iou": float(np.nanmean(top_pixel_iou(maps, masks))),
        "pointing_game": float(np.nanmean(pointing_game(maps, masks, tolerance=tolerance))),
        "cam_inside": float(alpha.mean()), "cam_outside": float(beta.mean()),
        "energy_inside": float(energy_inside.mean()), "pointing_tolerance_px": tolerance,
    }
    if getattr(data, "pseudo_labels", 0):
        result["pseudo_labels"] = int(data.pseudo_labels)
    if curve_limit:
        n = min(curve_limit, len(data))
        sums = {}
        for start in range(0, n, curve_batch):
            _check_cancelled(cancelled)
            stop = min(n, start + curve_batch)
            curves = deletion_insertion(bundle, data.float_images(slice(start, stop)).to(bundle.device),
                                        maps[start:stop].to(bundle.device), data.labels[start:stop].to(bundle.device),
                                        steps=steps, reference=reference, batch_size=256)
            for key, value in curves.summary().items():
                sums[key] = sums.get(key, 0.0) + value * (stop - start)
        result.update({key: value / n for key, value in sums.items()})
        result["curve_count"] = n
    return (result, maps) if return_maps else result


# ------------------------------------------------------------------------------------------ fine-tuning
def _resume(checkpoint, settings: dict, network, optimizer, schedule) -> tuple:
    """(first epoch, history) from a checkpoint made with the same settings (its weights, optimiser and schedule
    loaded), else (0, [])."""
    if not (checkpoint and checkpoint.exists()):
        return 0, []
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    if json.loads(state["settings"]) != settings:
        print(f"CAMAL: ignoring {checkpoint}: made with other settings", file=sys.stderr)
        return 0, []
    network.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["schedule"])
    print(f"CAMAL: resuming from epoch {int(state['epoch'])} ({checkpoint})", file=sys.stderr)
    return int(state["epoch"]), json.loads(state["history"])


def finetune(bundle, train: MaskSet, *, epochs: int = 3, lam: float = DEFAULT_LAMBDA, lr: float = DEFAULT_LR,
             weight_decay: float = 0.05, batch_size: int = 32, cam_mode: str = "differentiable",
             freeze_early: float = 0.0, augment: bool = True, seed: int = 0, bf16: bool = True,
             layer: str | None = None, grad_clip: float = 1.0, bn_train: bool = False, progress=None,
             cancelled=None, checkpoint=None, log_every: int = 10) -> dict:
    """Fine-tune `bundle.network` in place with mean CE + lambda * mean_b (beta_b - alpha_b).

    Resumes from `checkpoint` (written atomically after every epoch) if it exists and was made with the same
    settings. `progress(step, total, **metrics)` and `cancelled()` are the job runner's hooks: the step alone every
    step, and every `log_every` steps (and an epoch's last) the batch's epoch, loss, ce, reg, alpha, beta, lr and,
    with lambda > 0, iou (the top-pixel IoU of the batch's CAMs with its masks). Returns
    {"history": [...per epoch...], "cancelled": bool, "steps": n, "seconds": t}."""
    from .models import disable_fused_attention, kept_training_state, restore_fused_attention
    from .atomic import atomic_torch_save

    if cam_mode not in CAM_MODES:
        raise ValueError(f"cam_mode must be one of {', '.join(CAM_MODES)}, got {cam_mode!r}")
    if bool((train.labels < 0).any()):
        raise ValueError("training labels contain -1: call resolve_labels first")
    world, rank, _ = dist_info()
    network, device = bundle.network, bundle.device
    use_bf16 = bool(bf16) and device.type == "cuda"
    torch.manual_seed(seed)
    with kept_training_state(network):  # early layers frozen, train mode: all put back on leaving, errors too
        frozen = freeze_early_layers(network, freeze_early)
        parameters = [p for p in network.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay)
        n = len(train)
        steps_per_epoch = max(1, math.ceil(n / batch_size))
        total_steps = epochs * steps_per_epoch
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * min(1.0, s / max(total_steps, 1)))))
        settings = {"epochs": epochs, "lam": lam, "lr": lr, "batch_size": batch_size, "cam_mode": cam_mode,
                    "freeze_early": freeze_early, "seed": seed, "n": n, "world": world, "bn_train": bn_train}
        checkpoint = Path(checkpoint) if checkpoint else None
        start_epoch, history = _resume(checkpoint, settings, network, optimizer, schedule)
        if world > 1:
            _broadcast_state(network)
        changed = disable_fused_attention(network) if lam and bundle.is_vit else []  # math attention: double backward
        started, was_cancelled, step_count = time.time(), False, 0
        try:
            for epoch in range(start_epoch, epochs):
                network.train()
                _set_frozen_eval(network, frozen)
                if not bn_train:
                    _batchnorm_eval(network)
                order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
                sums = {k: 0.0 for k in ("ce", "reg", "alpha", "beta", "correct", "count")}
                for step in range(steps_per_epoch):
                    global_index = order[step * batch_size:(step + 1) * batch_size]
                    draws = torch.Generator().manual_seed(seed * 1_000_003 + epoch * 10_007 + step)
                    turns = torch.randint(0, 4, (len(global_index),), generator=draws)
                    flips = torch.rand(len(global_index), generator=draws) < 0.5
                    index = global_index[rank::world]
                    x, m = train.float_images(index), train.masks[index]
                    if augment:
                        x, m = paired_augment(x, m, turns[rank::world], flips[rank::world])
                    x, m, y = x.to(device), m.to(device), train.labels[index].to(device)
                    logged = step % log_every == 0 or step == steps_per_epoch - 1
                    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_bf16):
                        loss, stats = camal_loss(bundle, x, y, m, lam=lam, cam_mode=cam_mode, layer=layer,
                                                 reduction_size=len(global_index), with_iou=logged)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    if world > 1:
                        for p in parameters:
                            if p.grad is None:
                                p.grad = torch.zeros_like(p)
                        _all_reduce_([p.grad for p in parameters])
                        keys = list(sums) + (["iou"] if "iou" in stats else [])  # every rank logs the same steps
                        packed = torch.stack([stats[k].float() for k in keys])
                        _all_reduce_([packed])
                        stats = dict(zip(keys, packed))
                    if grad_clip:
                        torch.nn.utils.clip_grad_norm_(parameters, grad_clip)
                    optimizer.step()
                    schedule.step()
                    step_count += 1
                    for k in sums:
                        sums[k] += float(stats[k])
                    global_step = epoch * steps_per_epoch + step + 1
                    if progress is not None and rank == 0 and not logged:
                        progress(global_step, total_steps)  # the step alone, every step: an exact bar, a cheap write
                    elif progress is not None and rank == 0:
                        count = max(float(stats["count"]), 1.0)
                        progress(global_step, total_steps, epoch=epoch + 1,
                                 loss=(float(stats["ce"]) + lam * float(stats["reg"])) / count,
                                 ce=float(stats["ce"]) / count,
                                 reg=float(stats["reg"]) / count, alpha=float(stats["alpha"]) / count,
                                 beta=float(stats["beta"]) / count, lr=schedule.get_last_lr()[0],
                                 **({"iou": float(stats["iou"]) / count} if "iou" in stats else {}))
                    if cancelled is not None and cancelled():
                        was_cancelled = True
                        break
                if was_cancelled:
                    break
                if world > 1 and bn_train:
                    _average_buffers(network, world)
                count = max(sums["count"], 1.0)
                history.append({"epoch": epoch + 1, "ce": sums["ce"] / count, "reg_per_image": sums["reg"] / count,
                                "alpha": sums["alpha"] / count, "beta": sums["beta"] / count,
                                "train_accuracy": sums["correct"] / count})
                print(f"CAMAL epoch {epoch + 1}/{epochs}: " + " ".join(f"{k} {v:.4f}" for k, v in history[-1].items()
                                                                     if k != "epoch"), file=sys.stderr)
                if checkpoint and rank == 0:
                    checkpoint.parent.mkdir(parents=True, exist_ok=True)
                    atomic_torch_save({"model": network.state_dict(), "optimizer": optimizer.state_dict(),
                                 "schedule": schedule.state_dict(), "epoch": epoch + 1, "history": json.dumps(history),
                                 "settings": json.dumps(settings)}, checkpoint)
        finally:
            restore_fused_attention(changed)
    return {"history": history, "cancelled": was_cancelled, "steps": step_count,
            "seconds": round(time.time() - started, 2), "frozen": frozen}


# ------------------------------------------------------------------------------------------ figure
def before_after_figure(data: MaskSet, before: torch.Tensor, after: torch.Tensor, count: int = 6,
                        cell: int = 128):
    """Rows: images; columns: image with the mask outline, CAM before, CAM after (cividis overlays)."""
    from PIL import Image, ImageDraw

    from .images import overlay

    count = min(count, len(data), len(before), len(after))
    canvas = Image.new("RGB", (3 * cell, count * cell + 16), "white")
    draw = ImageDraw.Draw(canvas)
    for column, title in enumerate(("image + mask", "CAM before", "CAM after")):
        draw.text((column * cell + 4, 2), title, fill="black")
    for row in range(count):
        image = data.images[row].permute(1, 2, 0).numpy().copy()
        mask = data.masks[row].numpy()
        edge = mask & ~np.pad(mask, 1)[2:, 1:-1] | mask & ~np.pad(mask, 1)[:-2, 1:-1] \
            | mask & ~np.pad(mask, 1)[1:-1, 2:] | mask & ~np.pad(mask, 1)[1:-1, :-2]
        outlined = image.copy()
        outlined[edge] = (0, 255, 0)
        tiles = [Image.fromarray(outlined), overlay(image, before[row].numpy(), 0.5),
                 overlay(image, after[row].numpy(), 0.5)]
        for column, tile in enumerate(tiles):
            canvas.paste(tile.resize((cell, cell), Image.NEAREST), (column * cell, 16 + row * cell))
    return canvas


# ------------------------------------------------------------------------------------------ orchestration
def _out_name(out) -> tuple:
    from .models import safe_name

    out = Path(out)
    name = out.name
    for suffix in (".safetensors", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return out.parent, safe_name(name)


def _timm_spec(bundle) -> tuple:
    card = bundle.card or {}
    if card.get("timm_name"):
        kwargs = dict(card.get("timm_kwargs", {}))
        kwargs.setdefault("num_classes", bundle.num_classes)
        return card["timm_name"], kwargs
    architecture = (getattr(bundle.network, "pretrained_cfg", None) or {}).get("architecture")
    if not architecture:
        raise ValueError(f"Cannot record how to rebuild '{bundle.name}': its card has no timm_name")
    return architecture, {"num_classes": bundle.num_classes}


def _eval_sets(data, masks, eval_data) -> list:
    if eval_data:
        paths = [eval_data] if isinstance(eval_data, (str, Path)) else list(eval_data)
    else:
        sibling = find_masks_csv(masks or data).parent.parent / "val"
        paths = [sibling] if (sibling / "masks.csv").exists() else [masks or data]
    named, seen = [], set()
    for path in paths:
        name = Path(path).name if Path(path).suffix != ".csv" else Path(path).parent.name
        while name in seen:
            name += "'"
        seen.add(name)
        named.append((name, str(path)))
    return named


def run_camal(*, model: str, data: str, out: str, masks: str | None = None, epochs: int = 3,
              lam: float = DEFAULT_LAMBDA,
              lr: float = DEFAULT_LR, weight_decay: float = 0.05, batch_size: int = 32, cam_mode: str = "differentiable",
              freeze_early: float = 0.0, augment: bool = True, limit: int | None = None, eval_data=None,
              eval_limit: int | None = 512, curve_limit: int = 128, device: str | None = None, seed: int = 0,
              bf16: bool = True, layer: str | None = None, bn_train: bool = False, progress=None, cancelled=None,
              checkpoint=None, figure: bool = True) -> dict:
    """Evaluate, fine-tune with CAMAL, evaluate again, export a model-zoo checkpoint. Returns a summary.

    `data`: the training images (folder); `masks`: the mask set (masks.csv or its folder; default `data`);
    `eval_data`: mask set(s) evaluated before and after (default: the sibling 'val' mask set, else the training
    set); `out`: weights/NAME (the zoo lists models in its weights folder)."""
    try:
        return _run_camal(model=model, data=data, out=out, masks=masks, epochs=epochs, lam=lam, lr=lr,
                          weight_decay=weight_decay, batch_size=batch_size, cam_mode=cam_mode,
                          freeze_early=freeze_early, augment=augment, limit=limit, eval_data=eval_data,
                          eval_limit=eval_limit, curve_limit=curve_limit, device=device, seed=seed, bf16=bf16,
                          layer=layer, bn_train=bn_train, progress=progress, cancelled=cancelled,
                          checkpoint=checkpoint, figure=figure)
    except Cancelled:
        return {"name": _out_name(out)[1], "cancelled": True, "history": [], "steps": 0}


def _run_camal(*, model, data, out, masks, epochs, lam, lr, weight_decay, batch_size, cam_mode, freeze_early,
               augment, limit, eval_data, eval_limit, curve_limit, device, seed, bf16, layer, bn_train, progress,
               cancelled, checkpoint, figure) -> dict:
    from .training import export_classifier

    world, rank, device = init_distributed(device)
    out_dir, name = _out_name(out)
    masks_path = masks or data
    find_masks_csv(masks_path)  # fail early and clearly
    base = load_bundle(model, device="cpu")
    bundle = private_copy(base).to(device)
    data_dir = data if Path(data).is_dir() else None
    train = resolve_labels(bundle, load_mask_set(masks_path, data_dir, image_hw=bundle.input_size, limit=limit))
    if train.labels.max() >= bundle.num_classes:
        raise ValueError(f"labels go up to {int(train.labels.max())} but '{model}' has {bundle.num_classes} classes")
    evaluations = []
    if rank == 0:
        for set_name, path in _eval_sets(data, masks, eval_data):
            evaluations.append((set_name, path, resolve_labels(bundle, load_mask_set(
                path, image_hw=bundle.input_size, limit=eval_limit))))
    before, before_maps = _evaluate_sets(bundle, evaluations, "before", curve_limit=curve_limit, layer=layer,
                                         cancelled=cancelled)
    if progress is not None and rank == 0:
        progress(0, None, phase="evaluated before", **{f"before_{k}": v for k, v in
                                                       (next(iter(before.values()), {}) or {}).items()
                                                       if isinstance(v, float)})
    trained = finetune(bundle, train, epochs=epochs, lam=lam, lr=lr, weight_decay=weight_decay,
                       batch_size=batch_size, cam_mode=cam_mode, freeze_early=freeze_early, augment=augment,
                       seed=seed, bf16=bf16, layer=layer, bn_train=bn_train, progress=progress, cancelled=cancelled,
                       checkpoint=checkpoint)
    summary = {"name": name, "world_size": world, "rank": rank, "train_count": len(train), **trained}
    if trained["cancelled"] or rank != 0:
        if world > 1:
            import torch.distributed as dist
            dist.barrier()
        return summary
    after, after_maps = _evaluate_sets(bundle, evaluations, "after ", curve_limit=curve_limit, layer=layer,
                                       cancelled=cancelled)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = {}
    if figure and evaluations:
        figure_file = f"{name}.camal.png"
        before_after_figure(evaluations[0][2], before_maps, after_maps).save(out_dir / figure_file)
        figures["before_after"] = figure_file
    timm_name, timm_kwargs = _timm_spec(bundle)
    first = next(iter(after.values()), {})
    camal_record = {
        "base_model": model, "data": str(data), "masks": str(masks_path), "lambda": lam, "epochs": epochs,
        "cam_mode": cam_mode, "freeze_early": freeze_early, "lr": lr, "weight_decay": weight_decay,
        "batch_size": batch_size, "augment": augment, "bn_train": bn_train, "seed": seed, "limit": limit,
        "world_size": world,
        "device": str(device), "bf16": bool(bf16) and str(device).startswith("cuda"), "train_count": len(train),
        "eval_data": {set_name: path for set_name, path, _ in evaluations}, "before": before, "after": after,
        "figures": figures, "frozen_units": trained["frozen"], "train_seconds": trained["seconds"],
        "method": "CAMAL (Grad-CAM, batch-level; L = mean CE + lambda * mean_b (beta_b - alpha_b), lambda per "
                  "image); not verified "
                  "against author code",
    }
    bundle.network.to("cpu")
    card = export_classifier(
        bundle.network, name=name, out_dir=out_dir, timm_name=timm_name, timm_kwargs=timm_kwargs,
        mean=bundle.mean, std=bundle.std, class_names=bundle.class_names, data=str(data),
        val_accuracy=first.get("accuracy"), test_data=None, seed=seed, history=trained["history"], epochs=epochs,
        train_seconds=trained["seconds"], input_size=int(bundle.input_size[0]),
        extra={"input_size": list(bundle.input_size), "reference_color": list(bundle.reference_color),
               "crop_pct": bundle.crop_pct, "interpolation": bundle.interpolation, "cam_layer": bundle.cam_layer_name,
               "base_model": model, "camal": camal_record})
    _forget_cached(name)
    if checkpoint and Path(checkpoint).exists():
        Path(checkpoint).unlink()  # done: a later run with the same --out starts afresh
    if world > 1:
        import torch.distributed as dist
        dist.barrier()
    from .models import card_folders

    listed = any(out_dir.resolve() == Path(folder).resolve() for folder in card_folders())
    if not listed:
        print(f"CAMAL: {name} written to {out_dir}; the model zoo lists models in "
              f"{' and '.join(str(f) for f in card_folders())} only (load this one with "
              f"--model {out_dir / (name + '.json')})", file=sys.stderr)
    summary.update({"before": before, "after": after, "card": str(out_dir / f"{name}.json"),
                    "weights": str(out_dir / card["weights_file"]), "figures": figures, "listed_in_zoo": listed})
    return summary


def _evaluate_sets(bundle, evaluations: list, when: str, **options) -> tuple:
    """({set name: metrics}, the first set's first 8 CAMs) for the evaluation mask sets, each logged."""
    results, first_maps = {}, None
    for set_name, _, eval_set in evaluations:
        results[set_name], maps = evaluate(bundle, eval_set, return_maps=True, **options)
        first_maps = maps[:8] if first_maps is None else first_maps
        print(f"CAMAL {when} [{set_name}]: {json.dumps(results[set_name])}", file=sys.stderr)
    return results, first_maps


def _forget_cached(name: str) -> None:
    """A re-exported model must not be served from the zoo's cache of an older version."""
    from . import models

    models.forget(name)


# ------------------------------------------------------------------------------------------ job kind
JOB_PARAMS = ("model", "data", "masks", "out", "epochs", "lambda", "lr", "weight_decay", "batch_size", "cam_mode",
              "freeze_early", "augment", "limit", "eval_data", "eval_limit", "curve_limit", "seed", "bf16", "layer",
              "bn_train")


def run_camal_job(params: dict, context) -> dict:
    """The 'camal' job kind: params as the CLI's flags (`lambda`, `epochs`, `out`, ...); resumable from the job
    folder's checkpoint; progress and cancellation through the job context."""
    from .training import check_job_params

    check_job_params("camal", params, JOB_PARAMS)
    kwargs = {key: params[key] for key in ("masks", "lr", "weight_decay", "batch_size", "cam_mode", "freeze_early",
                                           "augment", "limit", "eval_data", "eval_limit", "curve_limit", "seed",
                                           "bf16", "layer", "bn_train") if params.get(key) is not None}
    out = params.get("out") or str(Path("weights") / f"{Path(str(params['model'])).stem}-camal")
    summary = run_camal(model=params["model"], data=params["data"], out=out, epochs=int(params.get("epochs", 3)),
                        lam=float(params.get("lambda", DEFAULT_LAMBDA)), device=getattr(context, "device", None),
                        progress=context.progress, cancelled=context.cancelled,
                        checkpoint=context.checkpoint_path("camal.ckpt"), **kwargs)
    return json.loads(json.dumps(summary, default=str))


# ------------------------------------------------------------------------------------------ CLI
def cli_main(args) -> int:
    def report(step, total, **metrics):
        shown = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
        if metrics:  # steps without metrics only move the app's progress bar
            print(f"[camal] step {step}/{total or '?'} {shown}", file=sys.stderr, flush=True)

    out_dir, name = _out_name(args.out)
    summary = run_camal(model=args.model, data=args.data, masks=args.masks, out=args.out, epochs=args.epochs,
                        lam=args.lam, lr=DEFAULT_LR if args.lr is None else args.lr, weight_decay=args.weight_decay,
                        batch_size=args.batch_size,
                        cam_mode=args.cam_mode, freeze_early=args.freeze_early, augment=args.augment,
                        limit=args.limit, eval_data=args.eval_data, eval_limit=args.eval_limit,
                        curve_limit=args.curve_limit, device=args.device, seed=args.seed, bf16=args.bf16,
                        bn_train=args.bn_train, progress=report,
                        checkpoint=args.checkpoint or out_dir / f"{name}.camal.ckpt")
    if summary.get("rank", 0) == 0:
        shown = ("name", "card", "listed_in_zoo", "before", "after", "world_size", "seconds")
        print(json.dumps({k: summary[k] for k in shown if k in summary}, indent=2))
        if getattr(args, "push_to", None):  # an HF Jobs run: hand the model back through the hub
            from .hub import push_result

            (out_dir / f"{name}.summary.json").write_text(json.dumps(summary, indent=2, default=str))
            push_result(out_dir / name, args.push_to)
            print(f"[camal] pushed {name} to {args.push_to}", file=sys.stderr, flush=True)
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    return 0
