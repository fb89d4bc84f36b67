"""The AHA trainer's data: training and held-out images, augmentation, the 2 x 2 mosaics and the targets each
step explains."""
from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F

from ..aha.network import pools_class_token


TARGET_MODES = ("top1+second", "top1", "varied")


AUGMENTS = ("auto", "photo", "cells", "none")


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


def to_input_size(images: torch.Tensor, bundle) -> torch.Tensor:
    """Mosaics bigger than a class-token ViT's input are shrunk to it (antialiased); others are left as they are."""
    if tuple(images.shape[-2:]) == tuple(bundle.input_size) or not pools_class_token(bundle.network):
        return images
    return F.interpolate(images, size=tuple(bundle.input_size), mode="bilinear", align_corners=False,
                         antialias=True).clamp(0, 1)


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


def mosaic_targets(labels: torch.Tensor, generator: torch.Generator, per_mosaic: int = 1) -> tuple:
    """(mosaic index, target) pairs: for each mosaic (M x 4 quadrant labels) the labels of `per_mosaic` different
    quadrants drawn at random (classes present in the mosaic)."""
    count = labels.shape[0]
    order = torch.rand(count, 4, generator=generator).argsort(dim=1)[:, :per_mosaic].to(labels.device)
    index = torch.arange(count, device=labels.device).repeat_interleave(per_mosaic)
    return index, labels.gather(1, order).reshape(-1)


def pick_targets(logits: torch.Tensor, labels: torch.Tensor, mode: str, generator: torch.Generator | None = None):
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
