"""RISE (Petsiuk et al. 2018): the target's probability (a class's; a region's mean class probability) under N
random masks, averaged per pixel.

Batched: masks go through the model `batch_size` at a time, and each chunk of masks is generated once
(from a fixed seed) and applied to every image. Masked pixels take the reference colour (the data
set's mean, which is what a zero in normalised space meant in the original code)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import register
from ..targets import as_target
from .base import ANY_TARGET_FAMILIES, Method, Option, repeated_runs


def rise_mask_plan(count: int, cells: int, cell_hw: tuple, keep_probability: float, seed: int) -> tuple:
    """Random binary grids and shifts for all masks at once (tiny), so chunking never changes the masks."""
    generator = torch.Generator().manual_seed(seed)
    grids = (torch.rand(count, 1, cells, cells, generator=generator) < keep_probability).float()
    shifts_y = torch.randint(0, cell_hw[0], (count,), generator=generator)
    shifts_x = torch.randint(0, cell_hw[1], (count,), generator=generator)
    return grids, shifts_y, shifts_x


def rise_masks(grids, shifts_y, shifts_x, image_hw: tuple, cell_hw: tuple) -> torch.Tensor:
    """count x H x W soft masks: each cells x cells grid bilinear-upsampled, then cropped at its shift."""
    height, width = image_hw
    cells = grids.shape[-1]
    up = F.interpolate(grids, size=((cells + 1) * cell_hw[0], (cells + 1) * cell_hw[1]), mode="bilinear",
                       align_corners=False)
    return torch.stack([up[i, 0, shifts_y[i]:shifts_y[i] + height, shifts_x[i]:shifts_x[i] + width]
                        for i in range(grids.shape[0])])


@register
class RISE(Method):
    name = "rise"
    label = "RISE"
    description = ("Hides random parts of the image thousands of times and averages the masks weighted by the "
                   "class probability. Model-agnostic and faithful, but slow: N forward passes.")
    colour = "#56B4E9"
    order = 5
    families = ANY_TARGET_FAMILIES
    any_target = True
    slow = True
    quick_pixels = 96 * 96

    @classmethod
    def interactive_options(cls, bundle) -> dict:
        """1,000 masks on a CPU for small inputs (300 for large ones), 4,000 on a GPU: it stays interactive."""
        on_gpu = bundle.device.type == "cuda"
        return {"n_masks": 4000 if on_gpu else (1000 if cls.quick_on(bundle) else 300), "batch_size": 100}

    @classmethod
    def model_passes(cls, bundle, options: dict | None = None) -> int:
        return int((options or {}).get("n_masks", cls.interactive_options(bundle)["n_masks"]))

    flag_options = (Option("n_masks", "RISE masks", 4000, 1, 100_000, 1, int,
                           "Random masks averaged: more give smoother maps; each costs one forward pass.",
                           flag="rise-masks"),)

    def __init__(self, n_masks: int = 4000, cells: int = 8, keep_probability: float = 0.5, batch_size: int = 200,
                 seed: int = 0):
        super().__init__(n_masks=n_masks, cells=cells, keep_probability=keep_probability, batch_size=batch_size,
                         seed=seed)
        self.n_masks, self.cells, self.keep_probability = n_masks, cells, keep_probability
        self.batch_size, self.seed = batch_size, seed

    @torch.no_grad()
    def attribute(self, bundle, images, targets, progress=None):
        b, _, height, width = images.shape
        reference = torch.tensor(bundle.reference_color, device=images.device).view(1, 3, 1, 1)
        saliency = torch.zeros(b, height * width, device=images.device)
        cell_hw = (math.ceil(height / self.cells), math.ceil(width / self.cells))
        grids, shifts_y, shifts_x = rise_mask_plan(self.n_masks, self.cells, cell_hw, self.keep_probability, self.seed)
        target = as_target(targets, b, images.device)
        runs = repeated_runs(images)  # an image asked about several targets is masked and scored once
        rows = {run: target.rows(*run) for run in runs}
        done = 0
        while done < self.n_masks:
            count = min(self.batch_size, self.n_masks - done)
            chunk = slice(done, done + count)
            masks = rise_masks(grids[chunk], shifts_y[chunk], shifts_x[chunk], (height, width), cell_hw)
            masks = masks.to(images.device)
            flat_masks = masks.view(count, -1)
            masks = masks.unsqueeze(1)
            for start, stop in runs:
                masked = images[start:start + 1] * masks + reference * (1 - masks)
                probabilities = rows[(start, stop)].copies(bundle(masked), probability=True)  # masks x rows
                saliency[start:stop] += probabilities.T @ flat_masks
            done += count
            if progress is not None:
                progress(done / self.n_masks)
        return (saliency / (self.n_masks * self.keep_probability)).view(b, height, width)
