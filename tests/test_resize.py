"""`explainers.resize.resize_bilinear` must be the same linear map as F.interpolate(bilinear, align_corners=False)."""
import pytest
import torch
import torch.nn.functional as F

from explainers.resize import resize_bilinear


@pytest.mark.parametrize("shape, size", [((2, 1, 8, 8), (64, 64)), ((1, 3, 7, 9), (224, 100)),
                                         ((2, 32, 16, 16), (32, 32)), ((3, 2, 20, 12), (5, 7)), ((1, 1, 1, 1), (4, 6)),
                                         ((4, 8, 8), (64, 64))])
def test_resize_is_the_bilinear_interpolation(shape, size):
    """Up, down, non-square, channels, a single cell, and B x h x w maps (no channel axis); values and gradients."""
    torch.manual_seed(0)
    grid = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    fast = resize_bilinear(grid, size)
    reference = grid if grid.dim() == 4 else grid.unsqueeze(1)
    slow = F.interpolate(reference, size=size, mode="bilinear", align_corners=False)
    slow = slow if grid.dim() == 4 else slow.squeeze(1)
    assert fast.shape == slow.shape == (*shape[:-2], *size)
    assert torch.allclose(fast, slow, atol=1e-12)
    weights = torch.randn(fast.shape, dtype=torch.float64)
    assert torch.allclose(torch.autograd.grad((fast * weights).sum(), grid)[0],
                          torch.autograd.grad((slow * weights).sum(), grid)[0], atol=1e-12)


def test_resize_keeps_the_input_when_the_size_is_the_same_and_works_after_inference_mode():
    grid = torch.rand(2, 1, 5, 6)
    assert resize_bilinear(grid, (5, 6)) is grid
    with torch.inference_mode():  # the first call, under inference mode, caches the matrices...
        resize_bilinear(torch.rand(1, 1, 11, 3), (17, 29))
    grid = torch.rand(1, 1, 11, 3, requires_grad=True)
    resize_bilinear(grid, (17, 29)).sum().backward()  # ...which a later call under autograd must be able to save
    assert grid.grad is not None and torch.isfinite(grid.grad).all()
    half = resize_bilinear(torch.rand(1, 1, 4, 4, dtype=torch.float16), (8, 8))
    assert half.dtype == torch.float16
