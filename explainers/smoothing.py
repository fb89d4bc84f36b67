"""A separable Gaussian blur for maps (edges replicated), shared by GradSkip's class gate and AHA's output."""
from __future__ import annotations

import functools

import torch


def cached_matrix(builder):
    """A float64 matrix builder turned into a cache of read-only matrices per (arguments, dtype, device), built
    outside inference mode: a cached inference tensor made by a first call under `torch.inference_mode` (a one-pass
    map) could not be saved for backward by a later call under autograd. Shared by the blur and `resize`."""
    @functools.lru_cache(maxsize=64)
    def cached(*arguments):
        *key, dtype, device = arguments
        with torch.inference_mode(False):
            return builder(*key).to(device=device, dtype=dtype)
    return cached


@cached_matrix
def _blur_matrix(sigma: float, size: int) -> torch.Tensor:
    """size x size: row i holds the 1-D Gaussian's taps around i, with the taps that fall past an edge added to the
    edge cell (replicate padding folded in), so one side of the blur is a matrix product."""
    radius = max(1, int(round(3 * sigma)))
    offsets = torch.arange(-radius, radius + 1)
    kernel = torch.exp(-offsets.double() ** 2 / (2 * sigma ** 2))
    kernel = kernel / kernel.sum()
    columns = (torch.arange(size).view(-1, 1) + offsets.view(1, -1)).clamp(0, size - 1)
    matrix = torch.zeros(size, size, dtype=torch.float64)
    return matrix.scatter_add_(1, columns, kernel.expand(size, -1).contiguous())


# up to this many cells (16 x 16) a grid is blurred by ONE product with the Kronecker product of its two blur
# matrices (at most 256 x 256): three ops instead of about eleven for two broadcast products, which is what counts
# for GradSkip's class gate on a ViT's patch grid (a few hundred cells); larger maps keep the two products
KRONECKER_CELLS = 256


@cached_matrix
def _grid_blur_matrix(sigma: float, h: int, w: int) -> torch.Tensor:
    """(h w) x (h w): a flattened h x w grid times this is the separable blur (kron(rows, columns) transposed)."""
    cpu = torch.device("cpu")
    return torch.kron(_blur_matrix(sigma, h, torch.float64, cpu), _blur_matrix(sigma, w, torch.float64, cpu)).T


def gaussian_smooth(grid: torch.Tensor, sigma: float) -> torch.Tensor:
    """B x 1 x h x w blurred by a Gaussian of `sigma` cells (radius 3 sigma, edges replicated); sigma 0: unchanged.
    Two matrix products with cached h x h and w x w blur matrices: on a 64 x 64 map at sigma 8 this is several
    times faster than padding and two 49-tap convolutions (which CPU torch runs on its slow path for one channel),
    and it is the same linear map; at 518 x 518 (the largest timm ViT inputs) it is about as fast as them."""
    if sigma <= 0:
        return grid
    h, w = grid.shape[-2:]
    if h * w <= KRONECKER_CELLS:
        flat = grid.reshape(-1, h * w) @ _grid_blur_matrix(float(sigma), h, w, grid.dtype, grid.device)
        return flat.view(grid.shape)
    rows = _blur_matrix(float(sigma), h, grid.dtype, grid.device)
    columns = _blur_matrix(float(sigma), w, grid.dtype, grid.device)
    return rows @ grid @ columns.T
