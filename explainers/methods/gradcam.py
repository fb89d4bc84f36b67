"""Grad-CAM (Selvaraju et al. 2017), batch-level: one backward pass for the whole batch.

Samples do not interact in an eval-mode network, so the gradient of sum_b y_b[target_b] with respect to
the layer's activations equals the B per-sample gradients: O(1) backward passes instead of O(B). With
`differentiable=True` the map stays in the autograd graph (CAMAL trains through it).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..attention import model_lock
from . import register
from .base import ANY_TARGET_FAMILIES, Method, normalize_max, target_scores, upsample


def gradcam_maps(bundle, images: torch.Tensor, targets: torch.Tensor, *, layer_name: str | None = None,
                 differentiable: bool = False, detach_weights: bool = False, upsample_to: tuple | None = None,
                 normalize: bool = True, return_logits: bool = False):
    """B x H x W Grad-CAM maps (each divided by its maximum), optionally with the logits of the same pass."""
    layer = bundle.network.get_submodule(layer_name or bundle.cam_layer_name)
    captured = {}

    def hook(_module, _inputs, output):
        captured["activations"] = output

    with model_lock(bundle):  # no other thread's forward pass may reach the hook
        handle = layer.register_forward_hook(hook)
        try:
            with torch.enable_grad():
                inputs = images
                if not any(p.requires_grad for p in bundle.network.parameters()) and not images.requires_grad:
                    inputs = images.detach().requires_grad_(True)  # a frozen model still needs a graph
                logits = bundle(inputs)
                score = target_scores(logits, targets).sum()  # class indices, any Target, a function of the outputs
                activations = captured["activations"]
                # detached weights need no second-order graph: the map stays differentiable through the
                # activations alone, and the graph is only retained for the caller's loss
                (gradients,) = torch.autograd.grad(score, activations,
                                                   create_graph=differentiable and not detach_weights,
                                                   retain_graph=differentiable)
        finally:
            handle.remove()
    image_hw = tuple(images.shape[-2:])
    activations = bundle.activations_to_grid(activations, image_hw)
    gradients = bundle.activations_to_grid(gradients, image_hw)
    if not differentiable:
        activations = activations.detach()
    weights = gradients.mean(dim=(2, 3), keepdim=True)
    if detach_weights:
        weights = weights.detach()
    cams = F.relu((weights * activations).sum(dim=1))
    cams = upsample(cams, upsample_to or image_hw)
    if normalize:
        cams = normalize_max(cams)
    return (cams, logits) if return_logits else cams


@register
class GradCAM(Method):
    name = "gradcam"
    label = "Grad-CAM"
    description = ("Weights the target layer's feature maps by the average gradient of the class score, "
                   "keeps the positive part and upsamples. Coarse (the layer's resolution) but cheap: one "
                   "forward and one backward pass.")
    colour = "#009E73"
    order = 2
    families = ANY_TARGET_FAMILIES
    any_target = True
    score_targets = True  # also a function of the whole batch's outputs (a critic's V(s))

    @classmethod
    def default_for(cls, bundle) -> bool:
        return not bundle.is_vit

    def __init__(self, layer: str | None = None, differentiable: bool = False, detach_weights: bool = False):
        super().__init__(layer=layer, differentiable=differentiable, detach_weights=detach_weights)
        self.layer, self.differentiable, self.detach_weights = layer, differentiable, detach_weights

    def attribute(self, bundle, images, targets):
        maps = gradcam_maps(bundle, images, targets, layer_name=self.layer, differentiable=self.differentiable,
                            detach_weights=self.detach_weights)
        return maps if self.differentiable else maps.detach()
