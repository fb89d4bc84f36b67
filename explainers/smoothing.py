"""A separable Gaussian blur for maps (edges replicated), shared by GradSkip's class gate and AHA's output."""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


@functools.lru_cache(maxsize=16)
def _gaussian_kernel(sigma: float, radius: int) -> torch.Tensor:
    offsets = torch.arange(-radius, radius + 1, dtype=torch.float32)
    kernel = torch.exp(-offsets ** 2 / (2 * sigma ** 2))
    return kernel / kernel.sum()


def gaussian_smooth(grid: torch.Tensor, sigma: float) -> torch.Tensor:
    """B x 1 x h x w blurred by a Gaussian of `sigma` cells (radius 3 sigma, edges replicated); sigma 0: unchanged.
    The kernel is cached, so a slider that moves sigma pays only the two convolutions."""
    if sigma <= 0:
        return grid
    radius = max(1, int(round(3 * sigma)))
    kernel = _gaussian_kernel(float(sigma), radius).to(device=grid.device, dtype=grid.dtype)
    padded = F.pad(grid, (radius, radius, radius, radius), mode="replicate")
    blurred = F.conv2d(padded, kernel.view(1, 1, 1, -1))
    return F.conv2d(blurred, kernel.view(1, 1, -1, 1))
