"""Seeing a ViT's attention: a context manager that records each block's attention probabilities
(and, on request, their gradients) through hooks, with timm's fused attention switched off only for
the duration. On exit the model is exactly as before: hooks removed, fused attention restored.

The recorder holds the bundle's lock (an RLock) from entry to exit, so two threads explaining one model never
see each other's forward passes in their hooks: the library is thread-safe on its own.
"""
from __future__ import annotations

import torch

from .models import disable_fused_attention, restore_fused_attention


class _NoLock:
    def acquire(self):
        return True

    def release(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def model_lock(bundle):
    """The bundle's re-entrant lock, held while a method's hooks are registered on its network (a no-op object
    for a bundle without one)."""
    return getattr(bundle, "lock", None) or _NoLock()


class AttentionRecorder:
    """with AttentionRecorder(bundle, gradients=True) as rec: logits = bundle(x); ...; rec.attentions[l]

    `attentions[l]` / `gradients[l]`: B x heads x N x N for block l (in block order).
    """

    def __init__(self, bundle, gradients: bool = False):
        if not bundle.is_vit:
            raise ValueError(f"'{bundle.name}' is not a ViT-family model: it has no token attention to record")
        self.bundle = bundle
        self.want_gradients = gradients
        self.attentions: list = []
        self.gradients: list = []
        self._handles: list = []
        self._fused: list = []

    def __enter__(self):
        self._lock = model_lock(self.bundle)
        self._lock.acquire()
        try:
            self._fused = disable_fused_attention(self.bundle.network, [b.attn for b in self.bundle.blocks])
        except BaseException:
            self._lock.release()
            raise
        blocks = self.bundle.blocks
        self.attentions = [None] * len(blocks)
        self.gradients = [None] * len(blocks)
        for index, block in enumerate(blocks):
            self._handles.append(block.attn.attn_drop.register_forward_hook(self._make_hook(index)))
        return self

    def _make_hook(self, index: int):
        def hook(_module, _inputs, output):
            self.attentions[index] = output
            if self.want_gradients and output.requires_grad:
                def save_gradient(gradient):
                    self.gradients[index] = gradient
                output.register_hook(save_gradient)
        return hook

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        restore_fused_attention(self._fused)
        self._lock.release()
        return False


def class_token_relevance(matrix: torch.Tensor, bundle) -> torch.Tensor:
    """Read a B x N x N token-relevance matrix at the class token's row over the patch tokens
    (the mean row over patch tokens for models without a class token); returns B x gh x gw."""
    prefix = bundle.num_prefix_tokens
    if bundle.has_class_token:
        row = matrix[:, 0, prefix:]
    else:
        row = matrix[:, prefix:, prefix:].mean(dim=1)
    return row


def tokens_to_map(row: torch.Tensor, bundle, image_hw: tuple) -> torch.Tensor:
    gh, gw = bundle.patch_grid(image_hw)
    return row.reshape(row.shape[0], gh, gw)
