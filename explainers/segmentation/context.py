"""Scores that a copy of the region cannot win: what, in and around the region, made the model call it class c.

The segmentation shows where the region is; a map that copies it says nothing more. So a segmentation map is
scored on what the region does not give away:
- **out-of-region deletion**: only the pixels outside the region dilated by `DILATION_PX` are ranked (by the
  map) and replaced by a reference (the mean colour, or a blurred copy of the image) in `steps` equal steps,
  reading the region's mean class-c probability after each; the area under that curve (lower: the map found the
  context the score leans on). Against orders that need no model: random, and nearest-first (the pixels closest
  to the region first);
- **in-region ordering**: only the region's own pixels are deleted, in the map's order; against random,
  centre-first (deepest inside the region first) and confidence order (the class probability, highest first);
- **mass outside**: the share of the map's mass outside the dilated region, split into other pixels the model
  calls c, other cell classes, and the background class;
- **PA / IoU with a binarisation fixed in advance**: the map's pixels above its mean (Chefer et al.'s rule), never
  k = the mask's area.
Curves read the probability (bounded, so areas compare across regions); fractions are of the pixels ranked.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..metrics import pixel_ranks, reference_images, trapezoid_auc
from .checks import mean_threshold
from .model import region_probability
from .scoring import pa_iou

DILATION_PX = 3
STEPS = 5
REFERENCES = ("mean", "blur")


def dilate(region: torch.Tensor, pixels: int = DILATION_PX) -> torch.Tensor:
    """H x W bool: the region grown by `pixels` (a square neighbourhood)."""
    region = torch.as_tensor(region).bool()
    if pixels <= 0:
        return region
    grown = F.max_pool2d(region.float()[None, None], 2 * pixels + 1, stride=1, padding=pixels)
    return grown[0, 0] > 0


def order_by_values(values: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Flat indices of the `allowed` pixels, highest value first (ties broken as the deletion engine breaks them)."""
    ranks = pixel_ranks(torch.nan_to_num(torch.as_tensor(values).float().cpu(), nan=0.0)[None])[0]
    candidates = torch.as_tensor(allowed).bool().flatten().nonzero()[:, 0].cpu()
    return candidates[torch.argsort(ranks[candidates])]


def random_order(allowed: torch.Tensor, seed: int = 0) -> torch.Tensor:
    candidates = torch.as_tensor(allowed).bool().flatten().nonzero()[:, 0].cpu()
    return candidates[torch.randperm(len(candidates), generator=torch.Generator().manual_seed(seed))]


def distance_to(mask: np.ndarray) -> np.ndarray:
    """Euclidean distance of every pixel to the nearest pixel of `mask` (0 on it)."""
    import cv2

    return cv2.distanceTransform((~mask).astype(np.uint8), cv2.DIST_L2, 5)


def nearest_first_order(region: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    distance = torch.from_numpy(distance_to(torch.as_tensor(region).bool().cpu().numpy()))
    return order_by_values(-distance, allowed)


def centre_first_order(region: torch.Tensor) -> torch.Tensor:
    """The region's pixels, deepest inside it (farthest from its outside) first."""
    region = torch.as_tensor(region).bool().cpu()
    depth = torch.from_numpy(distance_to(~region.numpy()))
    return order_by_values(depth, region)


@torch.no_grad()
def deletion_curves(bundle, image: torch.Tensor, target, orders: dict, *, steps: int = STEPS,
                    reference: str = "mean", batch_size: int = 8) -> dict:
    """{name: (steps + 1) region probabilities} as each order's pixels are replaced by the reference in `steps`
    equal steps (the first point is the unchanged image, shared)."""
    image = image if image.dim() == 4 else image.unsqueeze(0)
    height, width = image.shape[-2:]
    fill = reference_images(image, reference, bundle.reference_color)
    start = float(region_probability(bundle, image, target)[0])
    plan = []
    for name, order in orders.items():
        counts = np.round(np.linspace(0, 1, steps + 1) * len(order)).astype(int)
        plan.extend((name, int(count)) for count in counts[1:])
    values = {name: [start] for name in orders}
    for first in range(0, len(plan), batch_size):
        part = plan[first:first + batch_size]
        masks = torch.zeros(len(part), height * width, device=image.device)
        for row, (name, count) in enumerate(part):
            masks[row, orders[name][:count].to(image.device)] = 1
        masks = masks.view(-1, 1, height, width)
        perturbed = image * (1 - masks) + fill * masks
        probabilities = region_probability(bundle, perturbed, target.repeated(len(part)))
        for (name, _), value in zip(part, probabilities.tolist()):
            values[name].append(value)
    return {name: np.asarray(curve) for name, curve in values.items()}


def region_copy(region: torch.Tensor, sigma: float = 2.0) -> torch.Tensor:
    """H x W: the region blurred (Gaussian, `sigma` px): the answer row, a map that copies the region."""
    from ..metrics import gaussian_blur

    kernel = 2 * int(round(2 * sigma)) + 1
    return gaussian_blur(torch.as_tensor(region).float()[None, None], kernel_size=kernel, sigma=sigma)[0, 0]


def curve_auc(curve: np.ndarray) -> float:
    return float(trapezoid_auc(curve, np.linspace(0, 1, len(curve))))


def mass_outside(heat: torch.Tensor, grown: torch.Tensor, prediction: torch.Tensor, class_index: int,
                 background: set) -> dict:
    """Shares of a map's (non-negative) mass: outside the dilated region in all, and there on pixels the model
    calls the same class, another cell class, or a background class."""
    heat = torch.as_tensor(heat).float().clamp_min(0).cpu()
    total = float(heat.sum())
    if total <= 0:
        return {key: float("nan") for key in ("outside", "same_class", "other_cells", "background")}
    outside = ~torch.as_tensor(grown).bool().cpu()
    prediction = torch.as_tensor(prediction).cpu()
    is_background = torch.zeros_like(outside)
    for index in background:
        is_background |= prediction == index
    same = prediction == class_index
    return {"outside": float(heat[outside].sum()) / total,
            "same_class": float(heat[outside & same].sum()) / total,
            "other_cells": float(heat[outside & ~same & ~is_background].sum()) / total,
            "background": float(heat[outside & is_background].sum()) / total}


def fixed_pa_iou(heat: torch.Tensor, mask: torch.Tensor, valid: torch.Tensor | None = None) -> tuple:
    """(PA, IoU) of the map's above-mean pixels against a mask (the rule fixed in advance)."""
    return pa_iou(mean_threshold(torch.as_tensor(heat)[None])[0], mask, valid)
