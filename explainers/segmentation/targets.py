"""What a segmentation explanation explains: a class c over a region, scored as the mean class-c logit over
that region (Seg-Grad-CAM's convention).

    target = RegionTarget(masks, classes)        # B x H x W bool regions, B class indices
    scores = target(logits)                      # B x C x H x W logits -> B region scores

One callable that every segmentation method accepts (the methods' `targets` argument: `score_targets`). The
region is, by default, the predicted region of c (`predicted_region`); or the connected piece of c's predicted
region that the user clicked (`clicked_region`); or a region the user drew (`drawn_region`). Each refuses, in
plain words, what it cannot explain (`RegionError`): a class absent from the prediction, a click on the
background, an empty drawing.
"""
from __future__ import annotations

import numpy as np
import torch


class RegionError(ValueError):
    """A region cannot be explained (empty, on the background, ...): the message says why in plain words."""


class RegionTarget:
    """The mean class-c logit over a region, per image: a function of B x C x H x W logits."""

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
        empty = [i for i in range(masks.shape[0]) if not bool(masks[i].any())]
        if empty:
            raise RegionError("The region to explain is empty: no pixel is selected. Pick a class the model "
                              "predicts in this image, click on a coloured region, or draw one.")
        self.masks = masks
        self.classes = classes

    def __len__(self) -> int:
        return self.masks.shape[0]

    @property
    def areas(self) -> torch.Tensor:
        return self.masks.flatten(1).sum(1)

    def weights(self, device, dtype=torch.float32) -> torch.Tensor:
        """B x H x W: 1 / area inside each region, 0 outside (the region mean as a weighted sum)."""
        masks = self.masks.to(device)
        return masks.to(dtype) / masks.flatten(1).sum(1).clamp_min(1).to(dtype).view(-1, 1, 1)

    def _check(self, logits: torch.Tensor) -> None:
        if logits.dim() != 4:
            raise ValueError(f"a region target reads B x C x H x W logits (a segmentation model), got shape "
                             f"{tuple(logits.shape)}")
        if tuple(logits.shape[-2:]) != tuple(self.masks.shape[-2:]):
            raise ValueError(f"the region is {tuple(self.masks.shape[-2:])} pixels but the logits are "
                             f"{tuple(logits.shape[-2:])}")

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """B scores: the mean over each region of its class's logit."""
        self._check(logits)
        if logits.shape[0] != len(self):
            raise ValueError(f"{len(self)} regions for {logits.shape[0]} images")
        picked = logits.gather(1, self.classes.to(logits.device).view(-1, 1, 1, 1).expand(-1, 1, *logits.shape[-2:]))
        return (picked[:, 0] * self.weights(logits.device, picked.dtype)).flatten(1).sum(1)

    def probability(self, logits: torch.Tensor) -> torch.Tensor:
        """B values in [0, 1]: the mean over each region of its class's softmax probability (the deletion and
        insertion curves' score: bounded, so areas under curves compare across images)."""
        self._check(logits)
        probabilities = logits.float().softmax(dim=1)
        picked = probabilities.gather(1, self.classes.to(logits.device).view(-1, 1, 1, 1)
                                      .expand(-1, 1, *logits.shape[-2:]))
        return (picked[:, 0] * self.weights(logits.device)).flatten(1).sum(1)

    def one(self, index: int) -> "RegionTarget":
        return RegionTarget(self.masks[index:index + 1], self.classes[index:index + 1])

    def repeated(self, count: int) -> "RegionTarget":
        """The target of one image for `count` perturbed copies of it (occlusion, RISE, curves)."""
        if len(self) != 1:
            raise ValueError("repeated() is for the target of one image")
        return RegionTarget(self.masks.expand(count, -1, -1), self.classes.expand(count))

    def describe(self, class_names) -> str:
        names = [class_names[int(c)] if 0 <= int(c) < len(class_names) else str(int(c)) for c in self.classes]
        return "; ".join(f"{name} over {int(a)} pixels" for name, a in zip(names, self.areas))


def is_region_target(targets) -> bool:
    return isinstance(targets, RegionTarget)


def require_region_target(method_label: str, targets, batch_size: int) -> RegionTarget:
    if not isinstance(targets, RegionTarget):
        raise ValueError(f"{method_label} explains a segmentation model's region: give a RegionTarget (a class over "
                         "a region), not class indices")
    if len(targets) != batch_size:
        raise ValueError(f"{len(targets)} regions for {batch_size} images")
    return targets


def _class_index(bundle, class_index) -> int:
    class_index = int(class_index)
    if not 0 <= class_index < bundle.num_classes:
        raise RegionError(f"There is no class {class_index} in '{bundle.name}': its classes are "
                          f"{', '.join(bundle.class_names)}.")
    return class_index


def background_classes(bundle) -> set:
    """Classes that are the background, not an object to explain (by name, as the card calls them)."""
    return {i for i, name in enumerate(bundle.class_names) if name.strip().lower() in ("background", "_background_")}


def predicted_region(bundle, prediction: torch.Tensor, class_index: int) -> torch.Tensor:
    """H x W bool: where the model predicts `class_index` (prediction: H x W class indices)."""
    class_index = _class_index(bundle, class_index)
    region = torch.as_tensor(prediction) == class_index
    if not bool(region.any()):
        raise RegionError(f"The model predicts no {bundle.class_names[class_index]} in this image, so there is no "
                          f"region to explain. Pick a class that the legend shows, or draw a region.")
    return region


def clicked_region(bundle, prediction: torch.Tensor, row: int, column: int) -> tuple:
    """(class index, H x W bool): the connected piece (8-neighbours) of the predicted class under the click."""
    from scipy import ndimage

    prediction = torch.as_tensor(prediction)
    height, width = prediction.shape
    if not (0 <= row < height and 0 <= column < width):
        raise RegionError(f"The click at ({column}, {row}) is outside the {width} x {height} image.")
    class_index = int(prediction[row, column])
    if class_index in background_classes(bundle):
        raise RegionError("You clicked on the background. Click on a coloured region (a cell the model found) or "
                          "pick a class from the list.")
    labels, _ = ndimage.label(prediction.cpu().numpy() == class_index, structure=np.ones((3, 3)))
    region = torch.from_numpy(labels == labels[row, column])
    return class_index, region


def drawn_region(bundle, drawing, class_index: int, image_hw: tuple) -> torch.Tensor:
    """H x W bool from a user's drawing (any array whose non-zero pixels are the region), at the model's size."""
    import torch.nn.functional as F

    class_index = _class_index(bundle, class_index)
    drawing = torch.as_tensor(np.asarray(drawing))
    if drawing.dim() == 3:  # an RGBA or RGB layer: any painted channel
        drawing = drawing.abs().sum(dim=-1)
    if drawing.dim() != 2:
        raise RegionError("The drawn region could not be read: draw on the image with the brush.")
    region = drawing != 0
    if tuple(region.shape) != tuple(image_hw):
        region = F.interpolate(region[None, None].float(), size=image_hw, mode="nearest")[0, 0] > 0.5
    if not bool(region.any()):
        raise RegionError("The drawn region is empty: paint over the part of the image to explain.")
    return region
