"""Train the bundled segmentation model: a SegFormer-B0-sized network from scratch on the prepared BCCD folder.

    python -m explainers train-seg --data .devdata/bccd-seg --out weights --budget-s 330

The whole data set (a few MB) lives on the device; augmentation runs there too, so a busy CPU does not slow the
GPU: per batch one random scale (0.75-1.5), per image a random 256 x 256 crop (padded with the ignore label),
flips and a quarter turn, and stain-like colour changes (brightness, contrast, saturation, per-channel gain).
Loss: cross entropy with inverse-square-root class-frequency weights plus a soft Dice term (both skip the ignore
label). AdamW, warm-up then cosine decay over the time budget (`--budget-s`: training wall time, excluding the
final evaluation). bfloat16 autocast on CUDA. The checkpoint with the best validation mIoU is kept; a checkpoint
file in `--work` makes the run resumable (same command again). The export is the best state in half precision
(`NAME.safetensors`), its card (`NAME.json`: config, classes, colours, command, steps, time, device, the val and
test IoU per class measured on the exported half-precision weights) and the training curve (`NAME-curve.jsonl`).
"""
from __future__ import annotations

import copy
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..atomic import atomic_torch_save, atomic_write_bytes, atomic_write_text
from .bccd import IGNORE_INDEX
from .model import IMAGENET_MEAN, IMAGENET_STD, build_segformer, segformer_config

CROP = 256


def load_prepared(folder, split: str, device) -> tuple:
    """(images uint8 N x 3 x H x W, masks uint8 N x H x W, names) of one split of a prepared folder."""
    folder = Path(folder)
    names = json.loads((folder / "splits.json").read_text())[split]
    images = np.stack([read_rgb(folder / "images" / f"{n}.jpg") for n in names])
    masks = np.stack([read_mask(folder / "masks" / f"{n}.png") for n in names])
    return (torch.from_numpy(images).permute(0, 3, 1, 2).contiguous().to(device),
            torch.from_numpy(masks).to(device), names)


def read_rgb(path) -> np.ndarray:
    """H x W x 3 uint8 (Pillow, or OpenCV where Pillow is absent, as on a bare GPU machine)."""
    try:
        from PIL import Image
    except ImportError:
        import cv2

        return cv2.cvtColor(cv2.imread(str(path), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    return np.asarray(Image.open(path).convert("RGB"))


def read_mask(path) -> np.ndarray:
    try:
        from PIL import Image
    except ImportError:
        import cv2

        return cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    return np.asarray(Image.open(path))


def augment(images: torch.Tensor, masks: torch.Tensor, generator: torch.Generator, crop: int = CROP) -> tuple:
    """A batch of augmented float images in [0, 1] (B x 3 x crop x crop) and long masks, all on the device."""
    device = images.device
    batch = images.shape[0]

    def uniform(low, high, *shape):
        return torch.rand(*shape, generator=generator, device=device) * (high - low) + low

    scale = float(uniform(0.75, 1.5, 1))
    height, width = images.shape[-2:]
    size = (max(crop // 2, round(height * scale)), max(crop // 2, round(width * scale)))
    x = F.interpolate(images.float() / 255, size=size, mode="bilinear", align_corners=False)
    y = F.interpolate(masks[:, None].float(), size=size, mode="nearest")[:, 0].long()
    pad_h, pad_w = max(0, crop - size[0]), max(0, crop - size[1])
    if pad_h or pad_w:
        x = F.pad(x, (0, pad_w, 0, pad_h), value=0.8)
        y = F.pad(y, (0, pad_w, 0, pad_h), value=IGNORE_INDEX)
    tops = torch.randint(0, x.shape[-2] - crop + 1, (batch,), generator=generator, device=device).tolist()
    lefts = torch.randint(0, x.shape[-1] - crop + 1, (batch,), generator=generator, device=device).tolist()
    turns = torch.randint(0, 4, (batch,), generator=generator, device=device).tolist()
    flips = torch.randint(0, 2, (batch,), generator=generator, device=device).tolist()
    out_x, out_y = [], []
    for b in range(batch):
        xb = x[b, :, tops[b]:tops[b] + crop, lefts[b]:lefts[b] + crop]
        yb = y[b, tops[b]:tops[b] + crop, lefts[b]:lefts[b] + crop]
        if flips[b]:
            xb, yb = xb.flip(-1), yb.flip(-1)
        out_x.append(torch.rot90(xb, turns[b], (-2, -1)))
        out_y.append(torch.rot90(yb, turns[b], (-2, -1)))
    x, y = torch.stack(out_x), torch.stack(out_y)
    grey = x.mean(dim=1, keepdim=True)
    x = grey + (x - grey) * uniform(0.7, 1.3, batch, 1, 1, 1)  # saturation
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    x = mean + (x - mean) * uniform(0.8, 1.2, batch, 1, 1, 1)  # contrast
    x = x * uniform(0.85, 1.15, batch, 1, 1, 1) * uniform(0.93, 1.07, batch, 3, 1, 1)  # brightness, stain gain
    return x.clamp(0, 1), y


def normalise(images: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(IMAGENET_MEAN, device=images.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=images.device).view(1, 3, 1, 1)
    return (images - mean) / std


def class_weights(masks: torch.Tensor, num_classes: int) -> torch.Tensor:
    counts = torch.bincount(masks[masks != IGNORE_INDEX].flatten().long(), minlength=num_classes).float()
    weights = (counts.sum() / counts.clamp_min(1)).sqrt()
    return weights / weights.mean()


def segmentation_loss(logits: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    logits = F.interpolate(logits.float(), size=target.shape[-2:], mode="bilinear", align_corners=False)
    cross_entropy = F.cross_entropy(logits, target, weight=weights, ignore_index=IGNORE_INDEX)
    valid = (target != IGNORE_INDEX).unsqueeze(1)
    probabilities = logits.softmax(dim=1) * valid
    one_hot = F.one_hot(target.clamp_max(logits.shape[1] - 1), logits.shape[1]).permute(0, 3, 1, 2) * valid
    intersection = (probabilities * one_hot).sum(dim=(0, 2, 3))
    dice = 1 - (2 * intersection + 1) / (probabilities.sum(dim=(0, 2, 3)) + one_hot.sum(dim=(0, 2, 3)) + 1)
    return cross_entropy + 0.5 * dice.mean()


@torch.no_grad()
def confusion(network, images: torch.Tensor, masks: torch.Tensor, num_classes: int, batch_size: int = 16,
              autocast: bool = False) -> torch.Tensor:
    """num_classes x num_classes pixel counts (row: mask class, column: predicted), ignore label left out."""
    table = torch.zeros(num_classes, num_classes, dtype=torch.long, device=images.device)
    for start in range(0, images.shape[0], batch_size):
        x = normalise(images[start:start + batch_size].float() / 255)
        with torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=autocast):
            predicted = network(x).argmax(dim=1)
        y = masks[start:start + batch_size].long()
        keep = y != IGNORE_INDEX
        table += torch.bincount(y[keep] * num_classes + predicted[keep],
                                minlength=num_classes ** 2).view(num_classes, num_classes)
    return table


def iou_per_class(table: torch.Tensor) -> list:
    table = table.double()
    intersection = table.diag()
    union = table.sum(0) + table.sum(1) - intersection
    return [float(v) for v in (intersection / union.clamp_min(1))]


def _schedule(progress: float, warmup: float = 0.05) -> float:
    if progress < warmup:
        return progress / warmup
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (progress - warmup) / (1 - warmup))))


def fit(network, optimizer, generator, sample_batch, val_x, val_y, weights, *, lr, budget_s, work,
        eval_every_s=15.0, log=print) -> tuple:
    """The time-budgeted training loop shared by `train-seg` and the known-answer fine-tune: `sample_batch()`
    gives (images in [0, 1], long masks); warm-up + cosine over `budget_s` of training time; validation mIoU every
    `eval_every_s`; a checkpoint in `work` every minute (the same call resumes from it). Returns (the best-on-val
    state dict, the run's state with its curve)."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    checkpoint_file = work / "checkpoint.pt"
    device = val_x.device
    autocast = device.type == "cuda"
    num_classes = len(weights)
    state = {"step": 0, "elapsed_s": 0.0, "best_miou": -1.0, "best_step": 0, "curve": []}
    best_state = copy.deepcopy(network.segformer.state_dict())
    if checkpoint_file.exists():
        saved = torch.load(checkpoint_file, map_location=device, weights_only=True)
        network.segformer.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        generator.set_state(saved["generator"].cpu())
        best_state = saved["best_model"]
        state = saved["state"]
        log(f"resumed at step {state['step']} ({state['elapsed_s']:.0f} s of {budget_s:.0f} s)")

    def save_checkpoint():
        atomic_torch_save({"model": network.segformer.state_dict(), "optimizer": optimizer.state_dict(),
                           "generator": generator.get_state(), "best_model": best_state, "state": state},
                          checkpoint_file)

    network.train()
    started = time.perf_counter() - state["elapsed_s"]
    last_eval, last_save = state["elapsed_s"], state["elapsed_s"]
    while state["elapsed_s"] < budget_s:
        for group in optimizer.param_groups:
            group["lr"] = lr * _schedule(state["elapsed_s"] / budget_s)
        x, y = sample_batch()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = network.segformer(pixel_values=normalise(x)).logits
        loss = segmentation_loss(logits, y, weights)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        state["step"] += 1
        state["elapsed_s"] = time.perf_counter() - started
        final = state["elapsed_s"] >= budget_s
        if final or state["elapsed_s"] - last_eval >= eval_every_s:
            last_eval = state["elapsed_s"]
            network.eval()
            ious = iou_per_class(confusion(network, val_x, val_y, num_classes, autocast=autocast))
            network.train()
            miou = sum(ious) / len(ious)
            state["curve"].append({"step": state["step"], "elapsed_s": round(state["elapsed_s"], 1),
                                   "loss": round(loss.item(), 4), "lr": optimizer.param_groups[0]["lr"],
                                   "val_iou": [round(v, 4) for v in ious], "val_miou": round(miou, 4)})
            log(json.dumps(state["curve"][-1]))
            if miou > state["best_miou"]:
                state["best_miou"], state["best_step"] = miou, state["step"]
                best_state = copy.deepcopy(network.segformer.state_dict())
        if final or state["elapsed_s"] - last_save >= 60:
            last_save = state["elapsed_s"]
            save_checkpoint()
    return best_state, state


def train_segformer(data, out_dir, *, name="bccd-segformer", budget_s=330.0, batch_size=32, lr=6e-4, seed=0,
                    work_dir=None, device=None, eval_every_s=15.0, crop=CROP, command=None, threads=None,
                    log=print) -> dict:
    """Train within `budget_s` seconds of training time, export the best-on-val state; returns the card."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    meta = json.loads((Path(data) / "meta.json").read_text())
    classes = meta["classes"]
    train_x, train_y, _ = load_prepared(data, "train", device)
    val_x, val_y, _ = load_prepared(data, "val", device)
    config_values = dict(num_labels=len(classes))
    network = build_segformer(segformer_config(**config_values), attention="sdpa").to(device)
    optimizer = torch.optim.AdamW(network.parameters(), lr=lr, weight_decay=0.01)
    generator = torch.Generator(device=device).manual_seed(seed)
    weights = class_weights(train_y, len(classes))
    work = Path(work_dir or Path(out_dir) / f".{name}-work")

    def sample_batch():
        index = torch.randint(0, train_x.shape[0], (batch_size,), generator=generator, device=device)
        return augment(train_x[index], train_y[index], generator, crop)

    best_state, state = fit(network, optimizer, generator, sample_batch, val_x, val_y, weights, lr=lr,
                            budget_s=budget_s, work=work, eval_every_s=eval_every_s, log=log)
    return export(network, best_state, state, data=data, out_dir=out_dir, name=name, meta=meta,
                  config_values=config_values, device=device, seed=seed, batch_size=batch_size, lr=lr, crop=crop,
                  budget_s=budget_s, command=command)


def export(network, best_state, state, *, data, out_dir, name, meta, config_values, device, seed, batch_size, lr,
           crop, budget_s, command) -> dict:
    """Write NAME.safetensors (half precision), NAME.json and NAME-curve.jsonl; the IoUs are measured on the
    exported half-precision weights."""
    from safetensors.torch import save

    out_dir = Path(out_dir)
    half = {key: value.detach().to("cpu", torch.float16).contiguous() for key, value in best_state.items()}
    network.segformer.load_state_dict({key: value.float() for key, value in half.items()})
    network.eval()
    classes = meta["classes"]
    results = {}
    for split in ("val", "test"):
        images, masks, names = load_prepared(data, split, device)
        ious = iou_per_class(confusion(network, images, masks, len(classes)))
        results[split] = {"images": len(names), "iou": dict(zip(classes, [round(v, 4) for v in ious])),
                          "miou": round(sum(ious) / len(ious), 4),
                          "miou_cells": round(sum(ious[1:]) / (len(ious) - 1), 4)}
    train_images, _, _ = load_prepared(data, "train", "cpu")
    reference = (train_images.float() / 255).mean(dim=(0, 2, 3)).tolist()
    atomic_write_bytes(out_dir / f"{name}.safetensors", save(half))
    card = {
        "name": name, "kind": "segmentation", "architecture": "segformer",
        "segformer_config": config_values, "class_names": classes, "class_colours": meta["colours"],
        "ignore_index": IGNORE_INDEX, "input_size": [meta["size"][1], meta["size"][0]],
        "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD), "reference_color": [round(v, 4) for v in reference],
        "weights_file": f"{name}.safetensors", "weights_dtype": "float16",
        "data": {"source": meta["source"], "prepared_size": meta["size"], "mask_rule": meta["rule"],
                 "mask_rule_counts": meta["rule_counts"],
                 "prepare_command": "python -m explainers prepare-seg --source BCCD_DIR --out DIR"},
        "training": {"from_scratch": True, "steps": state["step"], "best_step": state["best_step"],
                     "train_seconds": round(state["elapsed_s"], 1), "budget_s": budget_s, "batch_size": batch_size,
                     "crop": crop, "lr": lr, "seed": seed, "optimizer": "AdamW (wd 0.01), warm-up + cosine over time",
                     "loss": "weighted cross entropy + 0.5 soft Dice, ignore label skipped",
                     "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
                     or "cpu", "torch": torch.__version__, "transformers": _transformers_version(),
                     "selected_on": "val mIoU (all four classes)"},
        "training_command": command or "python -m explainers train-seg --data DIR --out weights",
        "val": results["val"], "test": results["test"],
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    atomic_write_text(out_dir / f"{name}.json", json.dumps(card, indent=2))
    atomic_write_text(out_dir / f"{name}-curve.jsonl", "".join(json.dumps(row) + "\n" for row in state["curve"]))
    return card


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def command_line(argv=None, program: str = "python -m explainers") -> str:
    """The training command as typed (`argv`, default this process's), with the data and run folders as
    placeholders and an absolute --out as OUT: cards hold no machine paths."""
    import shlex

    words = list(sys.argv[1:] if argv is None else argv)
    for flag, placeholder in (("--data", "DIR"), ("--val-data", "DIR"), ("--work", "RUN_FOLDER"), ("--out", "OUT")):
        at = words.index(flag) + 1 if flag in words else len(words)
        if at < len(words) and (flag != "--out" or Path(words[at]).is_absolute()):
            words[at] = placeholder
    return f"{program} {shlex.join(words)}"
