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

import argparse
import json
import math
import os
import platform
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from .network import AHAExplainer, DEFAULT_ARCH, pools_class_token
from .objective import (NUM_FRACTIONS, PEAK_WEIGHT, REFERENCE_KINDS, SCORES, TAU_END, TAU_START, aha_loss,
                        default_fractions, grid_range, reference_batch, tau_at)
from .store import explainer_stem, load_explainer, save_explainer, stem_from_out

TARGET_MODES = ("top1+second", "top1", "varied")
SELECT_RULES = ("ins-del", "class-following")
AUGMENTS = ("auto", "photo", "cells", "none")


# --- data ---------------------------------------------------------------------------------------------

def holdout_indices(total: int, fraction: float) -> tuple:
    """(train indices, held-out indices) of a data set of `total` images: the held-out part is `fraction` of it
    (at least 1 image, at least 1 left to train on), spread evenly over the file (every k-th image: all classes of
    a class-sorted labels.csv in proportion), deterministic."""
    from ..data import spread_indices

    if not 0 < fraction < 1:
        raise ValueError(f"the held-out fraction must lie between 0 and 1, got {fraction}")
    if total < 2:
        raise ValueError(f"{total} image(s): too few to hold some out for validation; give validation data")
    held = spread_indices(total, min(total - 1, max(1, int(round(total * fraction)))))
    chosen = set(held)
    return [i for i in range(total) if i not in chosen], held


def check_labels(labels, bundle, data) -> None:
    """The data set's labels must be classes of the model (the runner-up target falls back to the label)."""
    labels = torch.as_tensor(labels)
    if len(labels) and (int(labels.max()) >= bundle.num_classes or int(labels.min()) < 0):
        raise ValueError(f"the labels of {data} run from {int(labels.min())} to {int(labels.max())}, but "
                         f"'{bundle.name}' has {bundle.num_classes} classes (0-{bundle.num_classes - 1}): train on "
                         "images labelled with this model's classes")


def load_train_images(data, image_hw, *, photo: bool, subset: int | None = None, seed: int = 0,
                      indices: list | None = None):
    """uint8 N x 3 x S x S images in memory (photos: shorter side resized to input/0.875, centre square
    kept, so random resized crops have room) and their labels. `indices`: only these images of the file."""
    from PIL import Image

    from ..data import open_dataset, pil_to_tensor

    dataset = open_dataset(data, split="train")
    indices = list(range(len(dataset))) if indices is None else list(indices)
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


# --- held-out figures ---------------------------------------------------------------------------------

def load_eval_images(bundle, data, limit: int | None, split: str = "val", indices: list | None = None):
    """Model inputs and labels of `limit` images spread evenly over the file (or over `indices` of it)."""
    from ..data import open_dataset, spread_indices
    from ..images import prepare_for_model

    if indices is None:
        dataset = open_dataset(data, split=split, limit=limit)  # an even spread over the (class-sorted) file
        chosen = list(range(len(dataset)))
    else:
        dataset = open_dataset(data, split=split)
        chosen = [indices[i] for i in spread_indices(len(indices), limit)]
    images = torch.cat([prepare_for_model(dataset.image(i), bundle)[0] for i in chosen])
    return images, torch.tensor([int(dataset.labels[i]) for i in chosen])


def held_out_figures(explainer: AHAExplainer, images: torch.Tensor, labels: torch.Tensor, *,
                     batch_size: int = 16, compare: tuple = ("gradcam", "random"), seed: int = 0) -> dict:
    """Hard (the evaluation engine: 21 fractions, mean reference) and soft (the training loss without noise,
    tau 0.3, finest grid, 16 fractions, mean reference) deletion / insertion AUCs of the explainer's top-1
    maps, next to the same images explained by an untrained explainer (the class activation map it starts
    from) and by the `compare` methods."""
    from ..engine import explain_batch
    from ..metrics import deletion_insertion

    bundle = explainer.bundle
    device = bundle.device
    torch.manual_seed(seed)
    untrained = AHAExplainer(bundle, **{k: explainer.arch[k] for k in ("width", "embed_dim", "gain_init",
                                                                      "class_embedding", "use_cam", "indices", "scales",
                                                                      "fusion_units", "prior", "class_input")
                                  if k in explainer.arch})
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
            candidates[name] = explain_batch(bundle, name, x, targets, seed=None).maps  # seeded above
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


def mosaic_cell_size(bundle) -> tuple:
    """The cell size of the 2 x 2 mosaics a model is trained and validated on: the card's `grid_cell_size` (a model
    fine-tuned on mosaics), half the input size for class-token ViTs (their native input: a class-token ViT does not
    read an input twice its size), else the input size (a globally pooled network reads a mosaic twice its size)."""
    named = (getattr(bundle, "card", None) or {}).get("grid_cell_size")
    if named:
        return tuple(int(v) for v in named)
    if pools_class_token(bundle.network):
        return tuple(max(1, int(v) // 2) for v in bundle.input_size)
    return tuple(bundle.input_size)


def validation_mosaics(bundle, data, count: int, split: str = "val") -> tuple:
    """(mosaics, classes): `count` fixed 2 x 2 mosaics of four classes of `data` (seed 0, as `gridpg` draws them),
    cells at `mosaic_cell_size`."""
    from ..data import open_dataset
    from ..gridpg import build_mosaics, plan_mosaics

    dataset = open_dataset(data, split=split)
    plan = plan_mosaics(dataset.labels, count, 0)
    mosaics, classes = build_mosaics(dataset, plan, mosaic_cell_size(bundle), bundle)
    return to_input_size(mosaics, bundle), classes


def to_input_size(images: torch.Tensor, bundle) -> torch.Tensor:
    """Mosaics bigger than a class-token ViT's input are shrunk to it (antialiased); others are left as they are."""
    if tuple(images.shape[-2:]) == tuple(bundle.input_size) or not pools_class_token(bundle.network):
        return images
    return F.interpolate(images, size=tuple(bundle.input_size), mode="bilinear", align_corners=False,
                         antialias=True).clamp(0, 1)


def validation_class_dependence(explainer: AHAExplainer, images: torch.Tensor, batch_size: int = 32) -> float:
    """Mean Spearman rho (scipy's, average ranks for ties) between the explainer's one-pass maps for the top class
    and for the runner-up of each image: 1 = the same map whatever the class."""
    from scipy.stats import spearmanr

    was_training = explainer.training
    explainer.eval()
    rhos = []
    try:
        for start in range(0, len(images), batch_size):
            x = images[start:start + batch_size].to(explainer.bundle.device)
            with torch.no_grad():
                logits = explainer.encode(x).logits
                top2 = logits.topk(2, dim=1).indices
                first = explainer.predict_and_explain(x, top2[:, 0])[1].float().cpu().numpy()
                second = explainer.predict_and_explain(x, top2[:, 1])[1].float().cpu().numpy()
            for a, b in zip(first, second):
                if np.ptp(a) > 0 and np.ptp(b) > 0:
                    rhos.append(float(spearmanr(a.ravel(), b.ravel())[0]))
    finally:
        explainer.train(was_training)
    return round(float(np.mean(rhos)), 5) if rhos else float("nan")


def baseline_scores(bundle, method: str, images: torch.Tensor, *, batch_size: int = 16, steps: int = 20) -> dict:
    """Per-image hard deletion / insertion AUCs (mean-colour reference) of a method's maps of the top-1 classes:
    {"deletion": array, "insertion": array}. A method that cannot explain the model is refused (`check`)."""
    from ..engine import explain_batch
    from ..methods import get_method
    from ..metrics import deletion_insertion

    peer = get_method(method)
    peer.check(bundle)
    scores = {"deletion": [], "insertion": []}
    for start in range(0, len(images), batch_size):
        x = images[start:start + batch_size].to(bundle.device)
        with torch.no_grad():
            targets = bundle(x).argmax(1)
        maps = explain_batch(bundle, peer, x, targets, seed=None).maps.float()
        curves = deletion_insertion(bundle, x, maps, targets, steps=steps, reference="mean")
        scores["deletion"].append(np.asarray(curves.deletion_auc))
        scores["insertion"].append(np.asarray(curves.insertion_auc))
    return {k: np.concatenate(v) for k, v in scores.items()}


def baseline_validation(bundle, images: torch.Tensor, method: str, batch_size: int = 32, steps: int = 20) -> dict:
    """The same validation metric as `validation_scores` for a baseline method's top-1 maps (the floor the
    class-following rule asks a checkpoint to keep)."""
    scores = baseline_scores(bundle, method, images, batch_size=batch_size, steps=steps)
    deletion, insertion = scores["deletion"], scores["insertion"]
    return {"method": method, "deletion_auc": round(float(deletion.mean()), 5),
            "insertion_auc": round(float(insertion.mean()), 5), "ins_minus_del": round(float((insertion - deletion).mean()), 5)}


def class_following_key(scores: dict, *, floor: float, rho_max: float | None, gridpg_min: float | None,
                        primary: str) -> tuple:
    """The rule (docs/aha-explainers.md, written before the runs) that ranks validation checkpoints: `follows` =
    class dependence at most `rho_max` and GridPG at least `gridpg_min` (each where set), `faithful` = ins-del at
    least the baseline's `floor` on the same images; a checkpoint meeting both beats one meeting only `follows`,
    which beats one meeting only `faithful`; ties are broken by `primary` ("ins_minus_del" or "gridpg")."""
    follows = True
    if rho_max is not None:
        follows = follows and bool(np.isfinite(scores.get("class_rho", np.nan))) and scores["class_rho"] <= rho_max
    if gridpg_min is not None:
        follows = follows and scores.get("gridpg", -1.0) >= gridpg_min
    faithful = scores["ins_minus_del"] >= floor
    return (follows and faithful, follows, faithful, float(scores[primary]))


def validation_gridpg(explainer: AHAExplainer, mosaics: torch.Tensor, classes: torch.Tensor,
                      batch_size: int = 8) -> float:
    """Mean GridPG share (positive attribution in the asked class's quadrant) of the explainer's maps of each
    mosaic's four classes."""
    from ..gridpg import quadrant_share

    was_training = explainer.training
    explainer.eval()
    shares = []
    try:
        for start in range(0, len(mosaics), batch_size):
            chunk, asked = mosaics[start:start + batch_size], classes[start:start + batch_size]
            with torch.no_grad():
                _, maps, _ = explainer.predict_and_explain(chunk.repeat_interleave(4, dim=0), asked.reshape(-1))
            shares.append(quadrant_share(maps, torch.arange(4).repeat(len(chunk))))
    finally:
        explainer.train(was_training)
    return round(float(np.concatenate(shares).mean()), 5)


def refresh_held_out(model: str, val_data: str, *, stem=None, val_limit: int = 256,
                     compare: tuple = ("gradcam", "random")) -> dict:
    """Measure a trained explainer's held-out figures again (e.g. on another sample) and store them in its card;
    the weights are untouched. Returns the figures."""
    from ..models import load_model

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
    from ..atomic import atomic_write_text

    atomic_write_text(card_file, json.dumps(card, indent=2))  # the same card writer as save_explainer
    return figures


# --- training -----------------------------------------------------------------------------------------

def mosaic_batch(cells: torch.Tensor, labels: torch.Tensor, generator: torch.Generator, all_labels: bool = False) -> tuple:
    """B cells -> B // 4 mosaics (cells 4i..4i+3 as TL, TR, BL, BR) at twice the size, and for each the label of
    one quadrant drawn at random (`all_labels`: the four quadrants' labels, M x 4)."""
    count = cells.shape[0] // 4
    quads = cells[:4 * count].view(count, 4, *cells.shape[1:])
    mosaics = torch.cat([torch.cat([quads[:, 0], quads[:, 1]], dim=3), torch.cat([quads[:, 2], quads[:, 3]], dim=3)],
                        dim=2)
    if all_labels:
        return mosaics, labels[:4 * count].view(count, 4)
    which = torch.randint(0, 4, (count,), generator=generator).to(labels.device)
    return mosaics, labels[:4 * count].view(count, 4)[torch.arange(count, device=labels.device), which]


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


def mosaic_targets(labels: torch.Tensor, generator: torch.Generator, per_mosaic: int = 1) -> tuple:
    """(mosaic index, target) pairs: for each mosaic (M x 4 quadrant labels) the labels of `per_mosaic` different
    quadrants drawn at random (classes present in the mosaic)."""
    count = labels.shape[0]
    order = torch.rand(count, 4, generator=generator).argsort(dim=1)[:, :per_mosaic].to(labels.device)
    index = torch.arange(count, device=labels.device).repeat_interleave(per_mosaic)
    return index, labels.gather(1, order).reshape(-1)


def _targets(logits: torch.Tensor, labels: torch.Tensor, mode: str, generator: torch.Generator | None = None):
    """(pair index into the batch, target, which pairs are not the top class) triples: top-1, plus the runner-up if
    top-1 is correct, else the label; "varied": top-1, the runner-up, and a random other class."""
    b = logits.shape[0]
    top2 = logits.topk(2, dim=1).indices
    first = top2[:, 0]
    index = torch.arange(b, device=logits.device)
    if mode == "top1":
        return index, first, torch.zeros(b, dtype=torch.bool, device=logits.device)
    if mode == "varied":
        classes = logits.shape[1]
        if classes < 3:
            raise ValueError("varied targets need at least 3 classes")
        offset = torch.randint(1, classes - 1, (b,), generator=generator).to(logits.device)
        # a class other than the top two: step from the runner-up past the top class, wrapping around
        other = (top2[:, 1] + offset) % classes
        other = torch.where(other == first, (other + 1) % classes, other)
        other = torch.where(other == top2[:, 1], (other + 1) % classes, other)
        other = torch.where(other == first, (other + 1) % classes, other)
        not_top = torch.cat([torch.zeros(b, dtype=torch.bool), torch.ones(2 * b, dtype=torch.bool)]).to(logits.device)
        return torch.cat([index, index, index]), torch.cat([first, top2[:, 1], other]), not_top
    second = torch.where(first == labels, top2[:, 1], labels)
    return torch.cat([index, index]), torch.cat([first, second]), torch.cat([first != first, second != first])


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
    run.step, run.elapsed_before, run.history = 0, 0.0, []
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
                 "validation": json.dumps(run.validation)}
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
            eligible = scores["gridpg"] >= float(run.val_gridpg_min)
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
            index, target, not_top = _targets(encoded.logits, y, run.targets, generator)
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
    run.optimizer.step()
    run.schedule.step()
    step = run.step = step + 1
    loss = float(terms.loss.detach())
    running = run.running = loss if run.running is None else 0.9 * run.running + 0.1 * loss
    run.bar.update(1)
    run.bar.set_postfix(loss=f"{running:.3f}", tau=f"{tau:.2f}", G=grid, lr=f"{run.schedule.get_last_lr()[0]:.1e}")
    if step % run.log_every == 0 or step == run.total_steps:
        run.history.append({"step": step, "loss": round(running, 5),
                            "deletion_auc": round(float(terms.deletion_auc.mean()), 5),
                            "insertion_auc": round(float(terms.insertion_auc.mean()), 5),
                            "peak": round(float(terms.peak.mean()), 4), "tau": round(tau, 4), "grid": grid,
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
        card = _export(run, train_seconds, identical)
    if run.world > 1:
        dist.barrier()
    return card


def _recipe(run) -> dict:
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


def _export(run, train_seconds: float, identical: bool) -> dict:
    """Export (rank 0): the best checkpoint by the validation metric (else the last), its card with the recipe and
    held-out figures, and the validation plot. Returns the saved card."""
    explainer, model, stem, held_indices = run.explainer, run.model, run.stem, run.held_indices
    explainer.eval()
    exported_step = run.step
    if run.best is not None:  # keep the best checkpoint by the fixed validation metric, not the last
        explainer.load_state_dict(run.best["state"])
        exported_step = run.best["step"]
    recipe = _recipe(run)
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


# --- the job kind -------------------------------------------------------------------------------------

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
    from .store import user_explainer_stem

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
    p.add_argument("--val-holdout", type=float, default=None,
                   help="without --val-data: hold this fraction of --data out of training and validate on it")
    p.add_argument("--mosaic-every", type=int, default=0,
                   help="every N-th step on 2 x 2 mosaics of the batch (globally pooled CNNs; 0: never)")
    p.add_argument("--deletion-weight", type=float, default=1.0,
                   help="weight of the deletion AUC in the loss (and the checkpoint choice): w * deletion + 1 - insertion")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--val-gridpg-min", type=float, default=None,
                   help="export only checkpoints whose grid pointing game on --val-mosaics val mosaics is at least this "
                        "(globally pooled networks; e.g. Grad-CAM's share there)")
    p.add_argument("--val-mosaics", type=int, default=16)
    p.add_argument("--score", choices=SCORES, default="prob",
                   help="score of targets other than the top class (runner-up, random classes, mosaic targets)")
    p.add_argument("--class-input", choices=["none", "token_logits"], default="none",
                   help="a class-specific input beside a class-blind prior (class-token ViTs)")
    p.add_argument("--select-rule", choices=SELECT_RULES, default="ins-del")
    p.add_argument("--val-rho-max", type=float, default=None,
                   help="class-following rule: the largest class dependence (top vs runner-up rho) that follows the class")
    p.add_argument("--val-baseline", default=None, help="class-following rule: the method whose val ins-del is the floor")
    p.add_argument("--mosaic-classes", type=int, default=1, help="quadrants' classes explained per mosaic (1-4)")
    p.add_argument("--time-schedule", action="store_true",
                   help="tau and the learning rate follow the time budget where it runs out before the steps")
    p.add_argument("--compare", default="gradcam,random", help="methods beside AHA in the card's held-out figures")
    p.add_argument("--log-every", type=int, default=5, help="steps between the card's history rows")
    p.add_argument("--class-input-lr-scale", type=float, default=1.0,
                   help="learning rate of the class input's weights, as a multiple of --lr")
    p.add_argument("--init", default=None, help="start from this explainer stem of the same model (warm start; "
                   "its architecture, a new schedule, no output blur)")
    p.add_argument("--push-to", default=None, help=argparse.SUPPRESS)  # an HF Jobs run: the explainer goes back
    p.set_defaults(handler=cmd_train_aha)


def cmd_train_aha(args) -> int:
    card = train_aha(model=args.model, data=args.data, out=args.out, val_data=args.val_data, val_limit=args.val_limit,
                     steps=args.steps, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                     weight_decay=args.weight_decay, warmup=args.warmup, clip=args.clip, targets=args.targets,
                     fractions=args.fractions, fraction_samples=args.fraction_samples, peak_weight=args.peak_weight,
                     grid_min=args.grid_min, grid_max=args.grid_max, augment=args.augment, subset=args.subset,
                     width=args.width, fusion_units=args.fusion_units, time_budget_minutes=args.time_budget_minutes,
                     checkpoint_every=args.checkpoint_every, seed=args.seed, val_every=args.val_every,
                     val_track=args.val_track, val_holdout=args.val_holdout, mosaic_every=args.mosaic_every,
                     deletion_weight=args.deletion_weight, init=args.init, val_gridpg_min=args.val_gridpg_min,
                     val_mosaics=args.val_mosaics, score=args.score, class_input=args.class_input,
                     select_rule=args.select_rule, val_rho_max=args.val_rho_max, val_baseline=args.val_baseline,
                     mosaic_classes=args.mosaic_classes, time_schedule=args.time_schedule,
                     log_every=args.log_every, class_input_lr_scale=args.class_input_lr_scale,
                     compare=tuple(m for m in args.compare.split(",") if m))
    if card is not None:
        summary = {k: card[k] for k in ("base_model", "weights_file", "train_seconds")}
        summary["held_out"] = card.get("held_out")
        print(json.dumps(summary, indent=2))
        if args.push_to:  # inside an HF Job: hand the explainer (weights, card, plot) back through the hub
            from ..hub import push_result

            stem = stem_from_out(args.out) if args.out else explainer_stem(args.model)
            push_result(stem, args.push_to)
            print(f"[train-aha] pushed {stem.name} to {args.push_to}", file=sys.stderr, flush=True)
    return 0
