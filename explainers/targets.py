"""What an explanation explains: one target protocol for every kind of model.

A target reads, for each of B images, one score from the model's outputs. The methods that perturb the input
or differentiate a score (occlusion, RISE, Grad-CAM, AHA's per-image mode, the random map) and the
deletion/insertion curves ask the target for it, never the outputs directly, so a classifier's class, a
segmentation model's region and (next) a detector's box are explained by the same methods:

    target = ClassTarget([3, 1])                  # a classifier: B class indices
    target = RegionTarget(masks, classes)         # a segmentation model: class c over a region (B x H x W)
    scores = target.score(outputs)                # B scores to explain (a logit, a region's mean logit)
    shares = target.probability(outputs)          # B values in [0, 1]: the same score as a probability
    read = target.curve_score(outputs)            # what the deletion/insertion curves read (the probability)

Every target also gives a target over some of its rows (`take`: a row may repeat, e.g. one image's row for
each of its perturbed copies) and scores the outputs of N perturbed copies of one image for each of its rows
at once (`copies`: N x rows, what occlusion and RISE read). A new kind of target is one subclass of `Target`
with `__len__`, `take`, `score` and `probability`; a detector's box target would score the class of the
detection that best overlaps a box.

A plain function of the outputs (B scores, e.g. an agent critic's value V(s)) is accepted as a target by the
methods that differentiate a score of the whole batch (Grad-CAM): `as_target` wraps it in `FunctionTarget`,
which has no rows to take and no probability form.
"""
from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod

import torch

__all__ = ["ClassTarget", "ContrastTarget", "FunctionTarget", "RegionError", "RegionTarget", "Target", "TargetScoreModel",
           "as_target", "target_key"]


class Target(ABC):
    """B scores read from a model's outputs: what an explanation of B images explains."""

    kind: str = ""  # its name in messages and cache keys
    rows_known: bool = True  # has rows (`take`, `copies`); a whole-batch function has none

    @abstractmethod
    def __len__(self) -> int:
        """B: how many images it explains."""

    @abstractmethod
    def take(self, rows) -> "Target":
        """The target of these rows (a list or a LongTensor of indices; a row may repeat)."""

    @abstractmethod
    def score(self, outputs: torch.Tensor) -> torch.Tensor:
        """B scores to explain from the model's outputs for B images (what a gradient or a drop is taken of)."""

    @abstractmethod
    def probability(self, outputs: torch.Tensor) -> torch.Tensor:
        """B values in [0, 1]: the score's probability form (bounded, so curves compare across images)."""

    def curve_score(self, outputs: torch.Tensor) -> torch.Tensor:
        """What the deletion and insertion curves read for each image: the probability form."""
        return self.probability(outputs)

    def __call__(self, outputs: torch.Tensor) -> torch.Tensor:
        return self.score(outputs)

    def copies(self, outputs: torch.Tensor, probability: bool = False) -> torch.Tensor:
        """N x rows: the outputs of N perturbed copies of ONE image, scored by each row of this target (every
        row explains that image: one image asked about several classes or regions is perturbed once)."""
        count = outputs.shape[0]
        columns = []
        for row in range(len(self)):
            one = self.take(torch.full((count,), row, dtype=torch.long))
            columns.append(one.probability(outputs) if probability else one.score(outputs))
        return torch.stack(columns, dim=1)

    def rows(self, start: int, stop: int) -> "Target":
        return self.take(torch.arange(start, stop))

    def key(self) -> str:
        """A short text that is the same for equal targets (an explanation cache's key)."""
        return self.kind

    def describe(self, class_names) -> str:
        """The target in words, for a caption or a report."""
        return self.kind


def _name(class_names, index: int) -> str:
    return class_names[index] if 0 <= index < len(class_names) else str(index)


class ClassTarget(Target):
    """A classifier's class per image: the score is its logit, the probability its softmax share."""

    kind = "class"

    def __init__(self, classes, device=None):
        self.classes = torch.as_tensor(classes, dtype=torch.long, device=device).flatten()

    def __len__(self) -> int:
        return self.classes.numel()

    def take(self, rows) -> "ClassTarget":
        return ClassTarget(self.classes[torch.as_tensor(rows, dtype=torch.long, device=self.classes.device)])

    def _check(self, outputs: torch.Tensor) -> None:
        if outputs.dim() != 2:
            raise ValueError(f"class indices explain a classifier's B x C outputs, got shape {tuple(outputs.shape)}: "
                             "a segmentation model's region needs a region target (a class over a region)")

    def score(self, outputs: torch.Tensor) -> torch.Tensor:
        self._check(outputs)
        return outputs.gather(1, self.classes.view(-1, 1).to(outputs.device).clone()).flatten()

    def probability(self, outputs: torch.Tensor) -> torch.Tensor:
        self._check(outputs)
        return outputs.softmax(dim=1).gather(1, self.classes.view(-1, 1).to(outputs.device)).squeeze(1)

    def copies(self, outputs: torch.Tensor, probability: bool = False) -> torch.Tensor:
        self._check(outputs)  # each pass gives every class's score: one column per row, no extra pass
        return (outputs.softmax(dim=1) if probability else outputs)[:, self.classes.to(outputs.device)]

    def key(self) -> str:
        return f"class:{','.join(str(int(c)) for c in self.classes)}"

    def describe(self, class_names) -> str:
        return "; ".join(_name(class_names, int(c)) for c in self.classes)


class ContrastTarget(Target):
    """One class against another per image ("why c rather than d"): the score is the logit difference z_c - z_d,
    its probability form sigmoid(z_c - z_d), the chance c wins a two-way choice between the two. Unlike c's softmax
    share, it is not flat near 0 when c is a runner-up far behind: its curves read c's ground on d."""

    kind = "contrast"

    def __init__(self, classes, against, device=None):
        self.classes = torch.as_tensor(classes, dtype=torch.long, device=device).flatten()
        self.against = torch.as_tensor(against, dtype=torch.long, device=device).flatten()
        if self.classes.shape != self.against.shape:
            raise ValueError(f"a contrast needs one class to compare against per class: {self.classes.numel()} "
                             f"classes, {self.against.numel()} against")

    def __len__(self) -> int:
        return self.classes.numel()

    def take(self, rows) -> "ContrastTarget":
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.classes.device)
        return ContrastTarget(self.classes[rows], self.against[rows])

    def score(self, outputs: torch.Tensor) -> torch.Tensor:
        ClassTarget._check(self, outputs)
        pick = lambda classes: outputs.gather(1, classes.view(-1, 1).to(outputs.device)).flatten()  # noqa: E731
        return pick(self.classes) - pick(self.against)

    def probability(self, outputs: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.score(outputs).float())

    def key(self) -> str:
        return "contrast:" + ",".join(f"{int(c)}-{int(d)}" for c, d in zip(self.classes, self.against))

    def describe(self, class_names) -> str:
        return "; ".join(f"{_name(class_names, int(c))} rather than {_name(class_names, int(d))}"
                         for c, d in zip(self.classes, self.against))


class RegionError(ValueError):
    """A region cannot be explained (empty, on the background, ...): the message says why in plain words."""


class RegionTarget(Target):
    """A segmentation model's class c over a region, per image: the score is the mean class-c logit over the
    region (Seg-Grad-CAM's convention), the probability the mean class-c softmax probability over it. Outputs
    are B x C x H x W logits at the regions' size."""

    kind = "region"

    def __init__(self, masks: torch.Tensor, classes):
        masks = torch.as_tensor(masks).bool()
        if masks.dim() == 2:
            masks = masks.unsqueeze(0)
        classes = torch.as_tensor(classes, dtype=torch.long).view(-1)
        if classes.numel() == 1 and masks.shape[0] > 1:
            classes = classes.expand(masks.shape[0]).clone()
        if classes.numel() != masks.shape[0]:
            raise ValueError(f"a region target needs one class per region: {classes.numel()} classes for "
                             f"{masks.shape[0]} regions")
        if not bool(masks.flatten(1).any(dim=1).all()):
            raise RegionError("The region to explain is empty: no pixel is selected. Pick a class the model "
                              "predicts in this image, click on a coloured region, or draw one.")
        self.masks = masks
        self.classes = classes

    def __len__(self) -> int:
        return self.masks.shape[0]

    def take(self, rows) -> "RegionTarget":
        rows = torch.as_tensor(rows, dtype=torch.long).view(-1)
        return RegionTarget(self.masks[rows.to(self.masks.device)], self.classes[rows.to(self.classes.device)])

    @property
    def areas(self) -> torch.Tensor:
        return self.masks.flatten(1).sum(1)

    def weights(self, device, dtype=torch.float32) -> torch.Tensor:
        """B x H x W: 1 / area inside each region, 0 outside (the region mean as a weighted sum)."""
        masks = self.masks.to(device)
        return masks.to(dtype) / masks.flatten(1).sum(1).clamp_min(1).to(dtype).view(-1, 1, 1)

    def _check(self, outputs: torch.Tensor) -> None:
        if outputs.dim() != 4:
            raise ValueError(f"a region target reads B x C x H x W logits (a segmentation model), got shape "
                             f"{tuple(outputs.shape)}")
        if tuple(outputs.shape[-2:]) != tuple(self.masks.shape[-2:]):
            raise ValueError(f"the region is {tuple(self.masks.shape[-2:])} pixels but the logits are "
                             f"{tuple(outputs.shape[-2:])}")
        if outputs.shape[0] != len(self):
            raise ValueError(f"{len(self)} regions for {outputs.shape[0]} images")

    def _region_mean(self, values: torch.Tensor) -> torch.Tensor:
        picked = values.gather(1, self.classes.to(values.device).view(-1, 1, 1, 1).expand(-1, 1, *values.shape[-2:]))
        return (picked[:, 0] * self.weights(values.device, picked.dtype)).flatten(1).sum(1)

    def score(self, outputs: torch.Tensor) -> torch.Tensor:
        """B scores: the mean over each region of its class's logit."""
        self._check(outputs)
        return self._region_mean(outputs)

    def probability(self, outputs: torch.Tensor) -> torch.Tensor:
        """B values in [0, 1]: the mean over each region of its class's softmax probability."""
        self._check(outputs)
        return self._region_mean(outputs.float().softmax(dim=1))

    def one(self, index: int) -> "RegionTarget":
        return self.take([index])

    def repeated(self, count: int) -> "RegionTarget":
        """The target of one image for `count` perturbed copies of it."""
        if len(self) != 1:
            raise ValueError("repeated() is for the target of one image")
        return RegionTarget(self.masks.expand(count, -1, -1), self.classes.expand(count))

    def key(self) -> str:
        digest = hashlib.sha256(self.masks.cpu().numpy().tobytes()).hexdigest()[:16]
        return f"region:{','.join(str(int(c)) for c in self.classes)}:{tuple(self.masks.shape)}:{digest}"

    def describe(self, class_names) -> str:
        return "; ".join(f"{_name(class_names, int(c))} over {int(a)} pixels" for c, a in zip(self.classes, self.areas))


class FunctionTarget(Target):
    """A function of the whole batch's outputs returning B scores (an agent critic's V(s), a sum of logits):
    Grad-CAM differentiates it; it has no rows to take and no probability form."""

    kind = "function"
    rows_known = False

    def __init__(self, function):
        self.function = function

    def __len__(self) -> int:
        raise TypeError("a function target has no fixed number of rows")

    def take(self, rows):
        raise ValueError("a function of the whole batch's outputs cannot be split into rows: this method needs "
                         "a target with one row per image (class indices or regions)")

    def score(self, outputs: torch.Tensor) -> torch.Tensor:
        scores = self.function(outputs)
        if scores.shape != (outputs.shape[0],):
            raise ValueError(f"a target function must return one score per image (shape ({outputs.shape[0]},)), "
                             f"got {tuple(scores.shape)}")
        return scores

    def probability(self, outputs: torch.Tensor) -> torch.Tensor:
        raise ValueError("a target function has no probability form: give class indices or a region target")

    def key(self) -> str:
        return f"function:{getattr(self.function, '__qualname__', 'anonymous')}:{id(self.function)}"


def as_target(targets, batch_size: int | None = None, device=None) -> Target:
    """A `Target` for what a caller gives: a Target as it is; an int, a list or a tensor of class indices as a
    `ClassTarget` (an int repeated for the batch); a plain function of the outputs as a `FunctionTarget`."""
    if isinstance(targets, Target):
        target = targets
    elif callable(targets) and not isinstance(targets, torch.Tensor):
        return FunctionTarget(targets)
    else:
        if isinstance(targets, int) and batch_size is not None:
            targets = [targets] * batch_size
        target = ClassTarget(targets, device=device)
    if batch_size is not None and target.rows_known and len(target) != batch_size:
        raise ValueError(f"Got {len(target)} targets for {batch_size} images")
    return target


def target_key(target):
    """An int for one class index (as records and caches have always keyed it), else the target's `key()`."""
    if isinstance(target, ClassTarget) and len(target) == 1:
        return int(target.classes[0])
    if isinstance(target, Target):
        return target.key()
    return int(target)


class TargetScoreModel:
    """One image's target as a two-class "classifier" of perturbed copies of that image: outputs (log p,
    log(1 - p)) with p the target's probability, so that softmax class 0 is p. What a class-only objective (AHA's
    per-image optimisation) reads for any target."""

    def __init__(self, bundle, target: Target):
        if len(target) != 1:
            raise ValueError("a target score model explains one image: give the target of one row")
        self.bundle = bundle
        self.target = target
        self.reference_color = bundle.reference_color
        self.input_size = bundle.input_size
        self.family = bundle.family

    @property
    def device(self):
        return self.bundle.device

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        rows = torch.zeros(images.shape[0], dtype=torch.long)
        p = self.target.take(rows).probability(self.bundle(images)).clamp(1e-6, 1 - 1e-6)
        return torch.stack([p.log(), (1 - p).log()], dim=1)
