"""AHA, Amortized Hybrid Attribution (methods.md section 2).

Two modes, one objective (deletion AUC + (1 - insertion AUC) through a differentiable sort):
- "trained" (one pass): a trained explainer network draws the map from the classifier's own features, in
  the same pass as the prediction. `refine_steps` T > 0 then optimises the map for this image and class:
  T Adam steps on a coarse correction added to the explainer's (standardised) map (our choice: the paper
  refines the decoder head; a correction of the map itself costs the same classifier passes per step and
  paid more in our measurements).
- "per-image": on a model with no trained explainer (hub models, fine-tunes, a user's model) the same
  optimisation starts from a prior (rollout on class-token ViTs, Grad-CAM otherwise) and runs
  `per_image_steps` steps: slow (that many classifier passes over the perturbed images), never unavailable.
`mode="auto"` takes the trained explainer where it exists. The mode used is in `options["mode"]` of the
result and in the menu note.
"""
from __future__ import annotations

import torch

from ..aha.network import check_output_blur, resolve_targets
from ..aha.per_image import (PER_IMAGE_LR, PER_IMAGE_STEPS, expected_seconds, optimise_maps, prior_method,
                              step_passes)
from ..aha.refine import MAX_REFINE_STEPS
from ..aha.store import ExplainerUnavailable, get_explainer
from ..targets import ClassTarget, TargetScoreModel, as_target
from . import register
from .base import ANY_TARGET_FAMILIES, Method, MethodNotApplicable, Option

MODES = ("auto", "trained", "per-image")
PER_IMAGE_LABEL = "AHA (per image)"  # its label in the per-image mode (`label_for`)
REFINE_MAP_LR = 0.3  # the correction's step size at test time (T <= 10 steps from a trained map)
# A trained explainer's card may name its own refinement settings ("refinement": lr, grid, deletion_weight), chosen
# on validation data (bench/studies/aha_refine_val.py); these are the settings where it names none.
REFINE_DEFAULTS = {"lr": REFINE_MAP_LR, "grid": None, "deletion_weight": 1.0}  # grid None: the per-image grid
MAX_PER_IMAGE_STEPS = 50


@register
class AHA(Method):
    name = "aha"
    label = "AHA (amortized)"
    description = ("A small network trained to minimise deletion and maximise insertion directly (through a "
                   "differentiable sort) draws the map in one pass on top of the classifier's own features: "
                   "about the cost of one forward pass. Refinement steps (0-10) optimise it further for this "
                   "image. Where the explainer's card sets a class contrast (bloodmnist-vit), the map of a class other "
                   "than the prediction adds where the model's patch tokens, read by its own head, favour that class "
                   "over the prediction, so the map changes with the class asked about (the note beside it says how "
                   "faithful that was measured). On a model without a trained explainer the same objective is optimised for this one "
                   "image from a prior map (per-image mode: slower, a progress bar shows it). Higher = more "
                   "important; the map is standardised per image (0 = this image's mean importance; only its ranking "
                   "enters the curves).")
    colour = "#0072B2"
    order = 0
    families = ANY_TARGET_FAMILIES
    any_target = True  # class indices in either mode; any other target in the per-image mode
    user_options = (Option("refine_steps", "AHA refinement steps T", 0, 0, MAX_REFINE_STEPS, 1, int,
                           "0 = one pass (fastest); each step optimises the map for this image (about one "
                           "forward and backward pass of the model over 28 perturbed images).",
                           rank=1, flag="refine-steps"),)
    flag_options = (Option("per_image_steps", "AHA per-image steps", PER_IMAGE_STEPS, 1, MAX_PER_IMAGE_STEPS, 1, int,
                           "Optimisation steps of the per-image mode (a model without a trained explainer)."),)

    @classmethod
    def default_for(cls, bundle) -> bool:
        return True

    @classmethod
    def has_trained_explainer(cls, bundle) -> bool:
        try:
            get_explainer(bundle)
        except ExplainerUnavailable:
            return False
        return True

    @classmethod
    def label_for(cls, bundle=None) -> str:
        return cls.label if bundle is not None and cls.has_trained_explainer(bundle) else PER_IMAGE_LABEL

    @classmethod
    def menu_note(cls, bundle) -> str | None:
        if cls.has_trained_explainer(bundle):
            return "one pass (trained explainer)"
        return (f"per-image optimisation ({PER_IMAGE_STEPS} steps from {prior_method(bundle)}): no trained "
                "explainer for this model")

    @classmethod
    def quick_on(cls, bundle) -> bool:
        return cls.has_trained_explainer(bundle)

    @classmethod
    def caveat(cls, bundle, options: dict | None = None) -> str | None:
        """Where the trained explainer's card measured its one pass as class-blind (`class_dependence`, written by
        `python -m explainers class-dependence --into-card`: its maps for the two top classes agree, rho >=
        CLASS_BLIND_RHO, and by CLASS_BLIND_MARGIN more than Grad-CAM's, paired interval above 0): say that the map
        hardly changes with the class asked about and name the refinement steps that do follow it. The refinement
        and the per-image mode optimise against the model's own score for the class: no caveat for them."""
        from ..metrics import CLASS_BLIND_MARGIN, CLASS_BLIND_RHO

        options = options or {}
        if int(options.get("refine_steps", 0) or 0) > 0 or options.get("mode", "trained") not in ("trained", "auto"):
            return None
        try:
            card = getattr(get_explainer(bundle), "card", None) or {}  # an in-memory explainer has none
        except ExplainerUnavailable:
            return None
        measured = card.get("class_dependence") or {}
        rows = measured.get("by_refine_steps") or {}

        def blind(row) -> bool:
            rho, against = row.get("spearman_top1_top2"), row.get("minus_gradcam") or {}
            interval = against.get("ci95")
            return (rho is not None and rho >= float(measured.get("class_blind_rho", CLASS_BLIND_RHO))
                    and against.get("mean") is not None
                    and against["mean"] >= float(measured.get("class_blind_margin", CLASS_BLIND_MARGIN))
                    and (interval is None or interval[0] > 0))

        one_pass = rows.get("0")
        if not one_pass or not blind(one_pass):
            return cls._other_class_caveat(bundle, card)
        reference = (measured.get("gradcam") or {}).get("spearman_top1_top2")
        text = (f"On {bundle.name} AHA's one pass draws nearly the same map whatever the class asked about "
                f"(Spearman {one_pass['spearman_top1_top2']:.2f} between its maps for the two top classes on "
                f"{measured.get('images', '?')} held-out images"
                + (f"; Grad-CAM {reference:.2f}" if reference is not None else "")
                + "): it shows where the evidence lies, not which class it supports.")
        following = sorted((int(steps), row["spearman_top1_top2"]) for steps, row in rows.items()
                           if int(steps) > 0 and row.get("spearman_top1_top2") is not None and not blind(row))
        if following:
            steps, rho = following[0]
            return text + f" With refinement steps T = {steps} the map follows the class (Spearman {rho:.2f})."
        return text + " Refinement steps T optimise the map for the chosen class."

    @staticmethod
    def _other_class_caveat(bundle, card: dict) -> str | None:
        """Where the card's class contrast was measured on held-out images (`class_contrast.test.other_classes`: the
        runner-up's maps, curves reading its probability) and the one pass's map is not above a random map's there
        (paired interval): say so, and what the refinement steps scored on the same images."""
        reading = (((card.get("class_contrast") or {}).get("test") or {}).get("other_classes")) or {}
        against_random = reading.get("one_pass_minus_random") or {}
        interval = against_random.get("ci95")
        if not interval or interval[0] > 0:
            return None
        text = (f"On {bundle.name} AHA's one pass draws the predicted class's map as trained; for another class it "
                f"adds where the model's patch tokens favour that class, so the map follows the class asked about, "
                f"but it was not shown faithful to that class: with the curves reading that class's probability, its "
                f"map of the runner-up scored {reading['one_pass']:+.3f} ins-del on {reading.get('images', '?')} "
                f"held-out images, no better than a random map ({reading['random']:+.3f}).")
        refined = reading.get("refined") or {}
        if refined.get("ins_minus_del") is not None:
            above = ((refined.get("minus_random") or {}).get("ci95") or [0.0])[0] > 0
            text += (f" With refinement steps T = {refined['steps']} it scored {refined['ins_minus_del']:+.3f}"
                     + (": use them for a class other than the prediction." if above else
                        ", not above a random map either."))
        return text

    @classmethod
    def model_passes(cls, bundle, options: dict | None = None) -> int:
        """The one pass, or the prior map; then, for T refinement steps (or the per-image mode's steps), the two
        end points and every step's passes (`step_passes`: 84 per image): T=3 costs about 85 times T=0."""
        options = options or {}
        mode = options.get("mode", "auto")
        trained = mode == "trained" or (mode == "auto" and cls.has_trained_explainer(bundle))
        steps = int(options.get("refine_steps", 0)) if trained else int(options.get("per_image_steps",
                                                                                     PER_IMAGE_STEPS))
        return 3 + (2 + steps * step_passes() if steps else 0)

    def __init__(self, refine_steps: int = 0, refine_lr: float | None = None, reference: str = "mean",
                 mode: str = "auto", per_image_steps: int = PER_IMAGE_STEPS, per_image_lr: float = PER_IMAGE_LR,
                 output_blur: float | None = None):
        """`output_blur` (pixels; None = the card's) overrides a trained explainer's output blur, e.g. to measure
        a card's choice against none (`evaluate --methods aha,aha:output_blur=0`); the per-image mode has none.
        `refine_lr` (None = the card's refinement setting, else REFINE_MAP_LR) sets the refinement's step size."""
        output_blur = None if output_blur is None else check_output_blur(output_blur)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if refine_lr is not None and not 0 < float(refine_lr) <= 10:
            raise ValueError(f"refine_lr must be in (0, 10], got {refine_lr!r}")
        super().__init__(refine_steps=refine_steps, reference=reference, mode=mode,
                         per_image_steps=per_image_steps, per_image_lr=per_image_lr,
                         **({} if refine_lr is None else {"refine_lr": float(refine_lr)}),
                         **({} if output_blur is None else {"output_blur": output_blur}))
        self.output_blur = output_blur
        # in range and whole: their declared Options, checked by `Method.__init__` just above
        refine_steps, per_image_steps = int(refine_steps), int(per_image_steps)
        self.options.update(refine_steps=refine_steps, per_image_steps=per_image_steps)
        self.refine_steps, self.refine_lr, self.reference = refine_steps, refine_lr, reference
        self.mode, self.per_image_steps, self.per_image_lr = mode, per_image_steps, per_image_lr
        self.resolved_options: dict = {}

    def resolve_mode(self, bundle) -> str:
        if self.mode != "auto":
            return self.mode
        return "trained" if self.has_trained_explainer(bundle) else "per-image"

    def explainer(self, bundle):
        try:
            return get_explainer(bundle)
        except ExplainerUnavailable as error:
            raise MethodNotApplicable(str(error)) from error

    def check(self, bundle) -> None:
        super().check(bundle)
        if self.resolve_mode(bundle) == "trained":
            self.explainer(bundle)
        else:
            self._refuse_blur_without_explainer(bundle)

    def _refuse_blur_without_explainer(self, bundle) -> None:
        if self.output_blur is not None:
            raise MethodNotApplicable(f"output_blur overrides a trained explainer's blur; '{bundle.name}' has no trained "
                                      "explainer (the per-image mode has no blur)")

    def expected_seconds(self, bundle, images: int = 1) -> float:
        """About how long one map takes in the mode this model gets (measured with one step now)."""
        if self.resolve_mode(bundle) == "trained" and self.refine_steps == 0:
            return 0.0
        if self.resolve_mode(bundle) == "trained":
            return expected_seconds(bundle, self.refine_steps, images, **self.refinement_settings(bundle))
        return expected_seconds(bundle, self.per_image_steps, images)

    def refinement_settings(self, bundle) -> dict:
        """lr, grid and deletion_weight of the trained mode's refinement: the card's "refinement" where it names
        them (chosen on validation data), else REFINE_DEFAULTS; an explicit `refine_lr` wins."""
        card = getattr(self.explainer(bundle), "card", None) or {}
        named = card.get("refinement") or {}
        settings = {key: named.get(key, default) for key, default in REFINE_DEFAULTS.items()}
        if self.refine_lr is not None:
            settings["lr"] = self.refine_lr
        settings["lr"], settings["deletion_weight"] = float(settings["lr"]), float(settings["deletion_weight"])
        settings["grid"] = None if settings["grid"] is None else int(settings["grid"])
        return settings

    def attribute(self, bundle, images, targets, progress=None):
        """`targets`: class indices (either mode), or any other `Target` (a region: the per-image mode)."""
        target = as_target(targets, images.shape[0], images.device)
        if not isinstance(target, ClassTarget):
            return self.explain_target(bundle, images, target, progress=progress)
        return self.predict_and_explain(bundle, images, target.classes, progress=progress)[1]

    def explain_target(self, bundle, images, target, progress=None):
        """B x H x W maps for a target other than class indices (a region): the per-image optimisation of each
        image's target in its probability form (`TargetScoreModel`), from the prior method's map of the target."""
        if self.mode == "trained":
            raise MethodNotApplicable(f"AHA's trained explainer draws maps of a classifier's classes; a {target.kind} "
                                      "target is explained by AHA's per-image mode (mode 'per-image' or 'auto').")
        self._refuse_blur_without_explainer(bundle)
        prior = prior_method(bundle)
        from . import get_method

        prior_maps = get_method(prior).attribute(bundle, images, target).detach()
        count = images.shape[0]
        maps = []
        for index in range(count):
            def step(done, total, offset=index):
                progress(offset * total + done, count * total)

            one = TargetScoreModel(bundle, target.take([index]))  # softmax class 0: the target's probability
            zero = torch.zeros(1, dtype=torch.long, device=images.device)
            maps.append(optimise_maps(one, images[index:index + 1], zero, steps=self.per_image_steps,
                                      lr=self.per_image_lr, reference=self.reference,
                                      prior_maps=prior_maps[index:index + 1],
                                      progress=None if progress is None else step).detach())
        self.resolved_options = {"mode": "per-image", "prior": prior, "steps": self.per_image_steps}
        return torch.cat(maps)

    def predict_and_explain(self, bundle, images, targets=None, progress=None):
        """(logits, maps, targets); top-1 targets when None. `progress(done, total)` follows optimisation steps."""
        mode = self.resolve_mode(bundle)
        self.resolved_options = {"mode": mode}
        if mode == "per-image":
            self._refuse_blur_without_explainer(bundle)
            with torch.no_grad():
                logits = bundle(images)
            targets = resolve_targets(logits, targets)
            prior = prior_method(bundle)
            from . import get_method

            prior_maps = get_method(prior).attribute(bundle, images, targets).detach()
            maps = optimise_maps(bundle, images, targets, steps=self.per_image_steps, lr=self.per_image_lr,
                                 reference=self.reference, prior_maps=prior_maps, progress=progress)
            self.resolved_options.update(prior=prior, steps=self.per_image_steps)
            return logits, maps.detach(), targets
        explainer = self.explainer(bundle)
        with torch.inference_mode():  # the single pass: no autograd bookkeeping at all
            logits, maps, targets = explainer.predict_and_explain(images, targets, output_blur=self.output_blur)
        blur = explainer.output_blur if self.output_blur is None else self.output_blur
        if blur > 0 or self.output_blur is not None:  # said where it shapes the map (or was asked for)
            self.resolved_options["output_blur"] = blur
        if explainer.class_contrast and bool((targets != logits.argmax(dim=1)).any()):  # said where it shaped a map
            self.resolved_options["class_contrast"] = explainer.class_contrast
        logits, maps, targets = logits.clone(), maps.clone(), targets.clone()  # ordinary tensors for the caller
        if self.refine_steps > 0:
            settings = self.refinement_settings(bundle)
            maps = optimise_maps(bundle, images, targets, steps=self.refine_steps, reference=self.reference,
                                 prior_maps=maps, progress=progress, **settings).detach()
            self.resolved_options["refinement"] = settings
        return logits, maps, targets


__all__ = ["AHA", "MAX_REFINE_STEPS", "MODES"]
