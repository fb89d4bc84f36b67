"""What a segmentation explanation explains: a class c over a region, scored as the mean class-c logit over
that region (Seg-Grad-CAM's convention).

    target = RegionTarget(masks, classes)        # B x H x W bool regions, B class indices
    scores = target(logits)                      # B x C x H x W logits -> B region scores

`RegionTarget` lives in `explainers.targets` beside the classifiers' `ClassTarget` (one target protocol: every
method that reads its score through the target explains a region); this module builds regions. The
region is, by default, the predicted region of c (`predicted_region`); or the connected piece of c's predicted
region that the user clicked (`clicked_region`); or a region the user drew (`drawn_region`). Each refuses, in
plain words, what it cannot explain (`RegionError`): a class absent from the prediction, a click on the
background, an empty drawing.
"""
from __future__ import annotations

import numpy as np
import torch

from ..targets import RegionError, RegionTarget  # the region target: one kind of the one target protocol

__all__ = ["RegionError", "RegionTarget", "background_classes", "clicked_region", "drawn_region",
           "is_region_target", "predicted_region", "require_region_target"]


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
