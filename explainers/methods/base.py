"""The one contract every explanation method follows (Captum's shape).

    method = get_method("gradcam", **options)
    maps = method.attribute(bundle, images, targets)   # B x H x W float, higher = more important

`images` are B x 3 x H x W in [0, 1] (the bundle normalises), `targets` a LongTensor of B class indices.
A method that cannot explain a model (e.g. attention rollout on a CNN) raises `MethodNotApplicable` with
a message a user can act on, from `check(bundle)`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch
import torch.nn.functional as F

ALL_FAMILIES = frozenset({"vit", "swin", "convnext", "resnet", "efficientnet", "cnn"})


class MethodNotApplicable(ValueError):
    """This method cannot explain this model (a clear, user-facing reason)."""


class Method(ABC):
    name: ClassVar[str] = ""
    label: ClassVar[str] = ""  # shown in the UI
    families: ClassVar[frozenset] = ALL_FAMILIES
    description: ClassVar[str] = ""

    def __init__(self, **options):
        self.options = options

    def check(self, bundle) -> None:
        if bundle.family not in self.families:
            raise MethodNotApplicable(
                f"{self.label or self.name} cannot explain '{bundle.name}' ({bundle.family}): it needs one of "
                f"{', '.join(sorted(self.families))}.")

    @abstractmethod
    def attribute(self, bundle, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """B x H x W maps (higher = more important) for B images and B target classes."""

    def __repr__(self):
        return f"{type(self).__name__}({self.options})"


def as_targets(targets, batch_size: int, device=None) -> torch.Tensor:
    """Accept an int, a list or a tensor; return a LongTensor of B targets."""
    if isinstance(targets, int):
        targets = [targets] * batch_size
    targets = torch.as_tensor(targets, dtype=torch.long, device=device).flatten()
    if targets.numel() != batch_size:
        raise ValueError(f"Got {targets.numel()} targets for {batch_size} images")
    return targets


def upsample(maps: torch.Tensor, size: tuple) -> torch.Tensor:
    """B x h x w -> B x H x W, bilinear."""
    if tuple(maps.shape[-2:]) == tuple(size):
        return maps
    return F.interpolate(maps.unsqueeze(1), size=size, mode="bilinear", align_corners=False).squeeze(1)


def normalize_max(maps: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Divide each map by its maximum (maps are non-negative); an all-zero map stays zero."""
    peak = maps.flatten(1).amax(dim=1).clamp_min(eps).view(-1, 1, 1)
    return maps / peak
