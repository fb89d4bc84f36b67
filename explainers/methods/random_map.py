"""A random map: the floor every real method must beat on deletion and insertion."""
from __future__ import annotations

import torch

from . import register
from .base import ANY_TARGET_FAMILIES, Method


@register
class RandomMap(Method):
    name = "random"
    label = "Random (baseline)"
    description = "Uniform noise: any method worth using must beat it on deletion and insertion."
    colour = "#999999"
    order = 8
    families = ANY_TARGET_FAMILIES
    any_target = True  # draws the same noise whatever the target
    baseline = True

    def __init__(self, seed: int = 0):
        super().__init__(seed=seed)
        self.seed = seed

    @torch.no_grad()
    def attribute(self, bundle, images, targets):
        generator = torch.Generator().manual_seed(self.seed)
        b, _, height, width = images.shape
        return torch.rand(b, height, width, generator=generator).to(images.device)
