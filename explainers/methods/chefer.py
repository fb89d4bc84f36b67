"""Gradient-weighted attention rollout (Chefer, Gur & Wolf 2021, "Generic attention-model
explainability"): R <- R + mean_heads((dA * A)^+) R over the blocks, read at the class token's row.
One forward and one (batch-level) backward pass, `torch.autograd.grad` to the recorded attention
probabilities only: no parameter gradient is computed and the shared model's `.grad` are left alone."""
from __future__ import annotations

import torch

from ..attention import AttentionRecorder, class_token_relevance, tokens_to_map
from . import register
from .base import Method, normalize_max, upsample


@register
class CheferRollout(Method):
    name = "chefer"
    label = "Gradient rollout (Chefer)"
    families = frozenset({"vit"})
    description = ("Rollout where each layer's attention is weighted by its gradient for the chosen class, "
                   "keeping only positive contributions: class-specific, one forward and one backward pass.")
    colour = "#CC79A7"
    order = 3

    def attribute(self, bundle, images, targets):
        with bundle.lock, AttentionRecorder(bundle) as recorder:
            with torch.enable_grad():
                inputs = images.detach().requires_grad_(True)  # a graph even for a frozen model
                logits = bundle(inputs)
                score = logits.gather(1, targets.view(-1, 1).to(logits.device)).sum()
                # gradients of the recorded attentions only: no parameter gradient is computed, no .grad touched
                gradients = torch.autograd.grad(score, recorder.attentions, allow_unused=True)
        attentions = [attention.detach() for attention in recorder.attentions]
        gradients = [torch.zeros_like(a) if g is None else g for a, g in zip(attentions, gradients)]
        with torch.no_grad():
            first = attentions[0]
            tokens = first.shape[-1]
            relevance = torch.eye(tokens, device=first.device).expand(first.shape[0], tokens, tokens).clone()
            for attention, gradient in zip(attentions, gradients):
                weighted = (gradient * attention).clamp_min(0).mean(dim=1)
                relevance = relevance + weighted @ relevance
            row = class_token_relevance(relevance, bundle)
            if not bundle.has_class_token:
                row = row - row.min(dim=1, keepdim=True).values
            maps = tokens_to_map(row, bundle, tuple(images.shape[-2:]))
            return normalize_max(upsample(maps, tuple(images.shape[-2:])).clamp_min(0))
