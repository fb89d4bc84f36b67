"""Scoring a segmentation explanation: a map against a mask (PA, IoU), against the human boxes (energy inside,
pointing game), and the region score's deletion and insertion curves.

Binarisation rules, fixed in advance: primary, the map's pixels above its mean (`checks.mean_threshold`, Chefer et
al.'s rule); secondary ("half"), the pixels at or above half of the map's maximum. Never k = the area of the mask
a map is compared with: that hands every map the answer's size. Pixel accuracy (PA) and IoU are computed over the
pixels that are not ignored (the derived masks' ignore label: stained matter no box covers).
"""
from __future__ import annotations

import numpy as np
import torch

BINARY_THRESHOLD = 0.5


def binarise(maps: torch.Tensor, threshold: float = BINARY_THRESHOLD) -> torch.Tensor:
    """B x H x W bool: pixels at or above `threshold` x the map's maximum (an all-zero map: none)."""
    maps = torch.as_tensor(maps).float().clamp_min(0)
    peak = maps.flatten(1).amax(dim=1).view(-1, 1, 1)
    return (maps >= threshold * peak) & (peak > 0)


def pa_iou(binary: torch.Tensor, mask: torch.Tensor, valid: torch.Tensor | None = None) -> tuple:
    """(PA, IoU) of one H x W binary map against one H x W bool mask over the `valid` pixels (all if None).
    IoU is NaN where both are empty."""
    binary, mask = torch.as_tensor(binary).bool(), torch.as_tensor(mask).bool()
    valid = torch.ones_like(mask) if valid is None else torch.as_tensor(valid).bool()
    b, m = binary[valid], mask[valid]
    union = int((b | m).sum())
    iou = float((b & m).sum()) / union if union else float("nan")
    pa = float((b == m).float().mean()) if b.numel() else float("nan")
    return pa, iou


def box_mask(boxes, class_name: str, image_hw: tuple) -> torch.Tensor:
    """H x W bool: the union of the boxes of one class ([class, x0, y0, x1, y1] in pixels)."""
    mask = torch.zeros(image_hw, dtype=torch.bool)
    for name, x0, y0, x1, y1 in boxes:
        if name == class_name:
            top, left = max(0, int(np.floor(y0))), max(0, int(np.floor(x0)))
            mask[top:int(np.ceil(y1)) + 1, left:int(np.ceil(x1)) + 1] = True
    return mask


def box_energy(maps: torch.Tensor, box: torch.Tensor) -> float:
    """The share of a map's (non-negative) mass inside the box mask (NaN for an all-zero map)."""
    maps = torch.as_tensor(maps).float().clamp_min(0)
    total = float(maps.sum())
    return float(maps[torch.as_tensor(box).bool()].sum()) / total if total > 0 else float("nan")


def region_curves(bundle, image: torch.Tensor, maps: torch.Tensor, target, *, steps: int = 20,
                  batch_size: int | None = None, known: dict | None = None):
    """Deletion and insertion curves (explainers.metrics engine) of one image's region score in its probability
    form (the region's mean class-c softmax probability): `maps` B x H x W for the same image and region (one per
    method). Returns a `Curves` with B rows. The passes go through `region_probability` (the logits made only in
    the region's box), a few images at a time (on a CPU, batches of 2-4 smears were ~2x quicker per image than
    batches of 22-32, measured; None: 4 on a CPU, 32 on a GPU). Each curve starts or ends at the whole image or the
    all-reference one, the same for every map: their scores are computed once and kept in `known` (pass the same
    dict to the calls for one image and region, e.g. one method at a time): 4 of each map's 2 x (steps + 1) passes."""
    from ..metrics import deletion_insertion, reference_images
    from ..targets import TargetScoreModel as _RegionScoreModel
    from .model import region_probability

    image = image if image.dim() == 4 else image.unsqueeze(0)
    ends = (image[0], reference_images(image, "mean", bundle.reference_color)[0])
    known = {} if known is None else known

    class CurveScoreModel(_RegionScoreModel):
        def __call__(self, images: torch.Tensor) -> torch.Tensor:
            which = [next((e for e, end in enumerate(ends) if torch.equal(one, end)), None) for one in images]
            todo = [i for i, e in enumerate(which) if e is None or e not in known]
            out = torch.empty(images.shape[0], 2, device=images.device)
            if todo:
                rows = torch.zeros(len(todo), dtype=torch.long)
                p = region_probability(self.bundle, images[todo], self.target.take(rows))
                p = p.clamp(1e-6, 1 - 1e-6)
                out[todo] = torch.stack([p.log(), (1 - p).log()], dim=1)
                known.update({which[i]: out[i].clone() for i in todo if which[i] is not None})
            for i, e in enumerate(which):
                if i not in todo:
                    out[i] = known[e]
            return out

    if batch_size is None:
        batch_size = 4 if image.device.type == "cpu" else 32
    model = CurveScoreModel(bundle, target)
    count = maps.shape[0]
    return deletion_insertion(model, image.expand(count, -1, -1, -1), maps.to(image.device),
                              torch.zeros(count, dtype=torch.long), steps=steps, batch_size=batch_size)
