"""Attention rollout (Abnar & Zuidema 2020): multiply the head-fused, residual-corrected attention
matrices of all blocks and read the class token's row. Needs no gradient, so it is class-agnostic."""
from __future__ import annotations

import torch

from ..attention import AttentionRecorder, class_token_relevance, tokens_to_map
from . import register
from .base import Method, normalize_max, upsample


@register
class AttentionRollout(Method):
    name = "rollout"
    label = "Attention rollout"
    families = frozenset({"vit"})
    description = ("Follows attention through every layer (adding the skip connection as identity) and reads "
                   "where the class token ends up looking. Uses no gradient, so the map is the same for every "
                   "class.")
    colour = "#E69F00"
    order = 4

    def __init__(self, head_fusion: str = "mean", discard_ratio: float = 0.0):
        if head_fusion not in ("mean", "max", "min"):
            raise ValueError("head_fusion must be mean, max or min")
        super().__init__(head_fusion=head_fusion, discard_ratio=discard_ratio)
        self.head_fusion, self.discard_ratio = head_fusion, discard_ratio

    @torch.no_grad()
    def attribute(self, bundle, images, targets):
        with AttentionRecorder(bundle) as recorder:
            bundle(images)
        rollout = None
        for attention in recorder.attentions:
            fused = getattr(attention, self.head_fusion)(dim=1)
            if self.head_fusion != "mean":
                fused = fused.values
            if self.discard_ratio > 0:  # drop the weakest links (never the class token's own column)
                flat = fused.flatten(1)
                k = int(flat.shape[1] * self.discard_ratio)
                lowest = flat.topk(k, dim=1, largest=False).indices
                flat.scatter_(1, lowest, 0)
                fused = flat.view_as(fused)
            identity = torch.eye(fused.shape[-1], device=fused.device).expand_as(fused)
            step = 0.5 * fused + 0.5 * identity
            step = step / step.sum(dim=-1, keepdim=True)
            rollout = step if rollout is None else step @ rollout
        row = class_token_relevance(rollout, bundle)
        maps = tokens_to_map(row, bundle, tuple(images.shape[-2:]))
        return normalize_max(upsample(maps, tuple(images.shape[-2:])).clamp_min(0))
