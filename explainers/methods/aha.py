"""AHA, Amortized Hybrid Attribution (methods.md section 2): a trained explainer network returns the map in
one pass that shares the classifier's forward; `refine_steps` T > 0 adds T test-time optimisation steps of
the explainer's output head on this image and class (the shared weights are never changed)."""
from __future__ import annotations

import torch

from ..aha.network import resolve_targets
from ..aha.refine import MAX_REFINE_STEPS, REFINE_LR, check_refine_steps, refine_maps
from ..aha.store import ExplainerUnavailable, get_explainer
from . import register
from .base import Method, MethodNotApplicable, Option


@register
class AHA(Method):
    name = "aha"
    label = "AHA (amortized)"
    description = ("A small network trained to minimise deletion and maximise insertion directly (through a "
                   "differentiable sort) draws the map in one pass on top of the classifier's own features: "
                   "about the cost of one forward pass. Refinement steps (0-10) optimise it further for this "
                   "image. Needs a trained explainer for the model. Higher = more important; the map is "
                   "unbounded (only its ranking matters).")
    colour = "#0072B2"
    order = 0
    user_options = (Option("refine_steps", "AHA refinement steps T", 0, 0, MAX_REFINE_STEPS, 1, int,
                           "0 = one pass (fastest); each step optimises the map for this image.",
                           rank=1, elem_id="refine", api_name="refine"),)

    @classmethod
    def default_for(cls, bundle) -> bool:
        return True

    @classmethod
    def menu_note(cls, bundle) -> str | None:
        try:
            cls().check(bundle)
        except Exception:  # noqa: BLE001 - not ready for this model
            return "not trained for this model"
        return None

    def __init__(self, refine_steps: int = 0, refine_lr: float = REFINE_LR, reference: str = "mean"):
        refine_steps = check_refine_steps(refine_steps)
        super().__init__(refine_steps=refine_steps, refine_lr=refine_lr, reference=reference)
        self.refine_steps, self.refine_lr, self.reference = refine_steps, refine_lr, reference

    def explainer(self, bundle):
        try:
            return get_explainer(bundle)
        except ExplainerUnavailable as error:
            raise MethodNotApplicable(str(error)) from error

    def check(self, bundle) -> None:
        super().check(bundle)
        self.explainer(bundle)

    def attribute(self, bundle, images, targets):
        return self.predict_and_explain(bundle, images, targets)[1]

    def predict_and_explain(self, bundle, images, targets=None):
        """(logits, maps, targets) from one classifier pass (top-1 targets when None)."""
        explainer = self.explainer(bundle)
        if self.refine_steps == 0:  # the single pass: no autograd bookkeeping at all
            with torch.inference_mode():
                logits, maps, targets = explainer.predict_and_explain(images, targets)
            return logits.clone(), maps.clone(), targets.clone()  # ordinary tensors for the caller
        encoded = explainer.encode(images)
        targets = resolve_targets(encoded.logits, targets)
        maps = refine_maps(explainer, images, targets, steps=self.refine_steps, lr=self.refine_lr,
                           reference=self.reference, encoded=encoded)
        return encoded.logits, maps.detach(), targets


__all__ = ["AHA", "MAX_REFINE_STEPS"]
