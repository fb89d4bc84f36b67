"""Checks that a segmentation map explains the model, not the answer (docs/methods.md section 5).

- **Swapped start**: `ShownRegion` scores one region (so every gradient is that region's) while its `masks` show
  another. A method that reads the region only through the score's gradients and outputs draws the same map for
  both; a method that reads the region's pixels follows the shown one.
- **Cascading model randomisation** (Adebayo et al. 2018): the model's parts are re-initialised from the top
  down (the decode head, then encoder stage 4, 3, 2, 1), each step keeping the earlier ones random; the map of
  the same region (the trained model's, fixed) is compared with the trained model's map by Spearman rank
  correlation and by the IoU of the two maps' binarised pixels (mean-value threshold). A map that barely changes
  (Spearman above 0.5 at the first randomised step) explains the input or the target, not the model.
"""
from __future__ import annotations

import copy

import torch

from ..metrics import spearman
from .targets import RegionTarget

CASCADE = ("decode head", "stage 4", "stage 3", "stage 2", "stage 1")
SPEARMAN_GATE = 0.5


class ShownRegion(RegionTarget):
    """The score (and so every gradient) of `scored`; the `masks` of `shown`."""

    def __init__(self, scored: RegionTarget, shown_masks: torch.Tensor):
        super().__init__(shown_masks, scored.classes)
        self.scored = scored

    def score(self, outputs: torch.Tensor) -> torch.Tensor:
        return self.scored.score(outputs)

    def probability(self, outputs: torch.Tensor) -> torch.Tensor:
        return self.scored.probability(outputs)

    def take(self, rows) -> "ShownRegion":
        rows = torch.as_tensor(rows, dtype=torch.long).view(-1)
        return ShownRegion(self.scored.take(rows), self.masks[rows.to(self.masks.device)])

    def repeated(self, count: int) -> "ShownRegion":
        return ShownRegion(self.scored.repeated(count), self.masks.expand(count, -1, -1))


def cascade_modules(network) -> list:
    """[(step name, [modules])] from the top of the network down: the decode head, then the encoder's stages
    (patch embedding, blocks, final norm) from the last to the first."""
    segformer = network.segformer
    stages = list(segformer.segformer.stages)
    steps = [("decode head", [segformer.decode_head])]
    for index in reversed(range(len(stages))):
        steps.append((f"stage {index + 1}", [stages[index]]))
    return steps


def _reinitialise(module: torch.nn.Module, generator_seed: int) -> None:
    torch.manual_seed(generator_seed)
    for part in module.modules():
        if hasattr(part, "reset_parameters"):
            part.reset_parameters()
        if hasattr(part, "reset_running_stats"):
            part.reset_running_stats()


def randomised_bundles(bundle, seed: int = 0, steps: int | None = None):
    """Yield (step name, bundle) for the cascade: each a copy of the model with that step and every earlier one
    re-initialised (seeded). The trained bundle is untouched."""
    from .model import bundle_from_segformer

    network = copy.deepcopy(bundle.network)
    cascade = cascade_modules(network)[:steps]
    for index, (name, modules) in enumerate(cascade):
        for module in modules:
            _reinitialise(module, seed + index)
        network.eval()
        yield name, bundle_from_segformer(f"{bundle.name} (random from {name})", copy.deepcopy(network),
                                          class_names=bundle.class_names, input_size=bundle.input_size,
                                          mean=bundle.mean, std=bundle.std, reference_color=bundle.reference_color,
                                          card=dict(bundle.card))


def mean_threshold(maps: torch.Tensor) -> torch.Tensor:
    """B x H x W bool: pixels above their map's mean (Chefer et al.'s binarisation, fixed in advance)."""
    maps = torch.as_tensor(maps).float()
    return maps > maps.flatten(1).mean(dim=1).view(-1, 1, 1)


def binary_iou(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = torch.as_tensor(a).bool(), torch.as_tensor(b).bool()
    union = int((a | b).sum())
    return float((a & b).sum()) / union if union else float("nan")


def compare_maps(trained: torch.Tensor, other: torch.Tensor) -> dict:
    """Spearman and the IoU of the mean-threshold pixels of two H x W maps."""
    return {"spearman": spearman(trained, other),
            "iou": binary_iou(mean_threshold(trained[None])[0], mean_threshold(other[None])[0])}


def cascading_randomisation(bundle, image: torch.Tensor, target: RegionTarget, explain, *, steps: int | None = None,
                            seed: int = 0) -> list:
    """[{step, spearman, iou}] of `explain(bundle, image, target) -> 1 x H x W` along the cascade, against the
    trained model's map of the same region."""
    trained = explain(bundle, image, target)[0].detach()
    rows = []
    for name, random_bundle in randomised_bundles(bundle, seed=seed, steps=steps):
        rows.append({"step": name, **compare_maps(trained, explain(random_bundle, image, target)[0].detach())})
    return rows
