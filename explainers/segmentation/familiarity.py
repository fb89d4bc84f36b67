"""Does this photo look like the smears a segmentation model learned from? The segmentation form of
`explainers.familiarity` (a cat photo given to the BCCD model is still painted with red cells, white cells and
platelets: the check says that the prediction may mean nothing).

Features: the encoder's last stage (SegFormer's stage 4, one vector per 32 x 32 pixel cell), read by a hook in the
prediction's own forward pass (no model pass of its own). One Gaussian (mean and a shrunk covariance) is fitted on
every cell of the training smears; a photo's score is the mean, over its cells, of the cells' Mahalanobis distance
to that Gaussian (a smear's cells are many and alike: thousands of samples for a 256-dimensional covariance, where
one vector per photo would give a few hundred). The threshold is a quantile of the validation smears' scores, as
in the classifier form; the statistics are stored in the same file format (`familiarity.save`), one "class".

    stats = fit(bundle, train_paths, val_paths)          # once: python bench/familiarity_segmentation.py
    logits, verdict = forward_and_check(bundle, images)  # verdict per image, None where there are no statistics
"""
from __future__ import annotations

import torch

from .. import familiarity
from ..familiarity import SHRINKAGE, FamiliarityStats, get_stats, verdict

FEATURES = "segformer_stage4_cells"


def _last_stage(bundle):
    return bundle.network.segformer.segformer.stages[-1]


@torch.no_grad()
def logits_and_cells(bundle, images: torch.Tensor) -> tuple:
    """(logits B x C x H x W, the last stage's cells B x N x D) from one forward pass."""
    seen = []

    def keep(module, args, output):
        seen.append(output[0] if isinstance(output, tuple) else output)

    handle = _last_stage(bundle).register_forward_hook(keep)
    try:
        logits = bundle(images)
    finally:
        handle.remove()
    if not seen:
        raise ValueError("the segmentation model's last encoder stage was not called in the forward pass")
    cells = seen[-1]
    if cells.dim() == 4:  # B x D x h x w
        cells = cells.flatten(2).transpose(1, 2)
    return logits, cells.float()


def scores(stats: FamiliarityStats, cells: torch.Tensor) -> torch.Tensor:
    """B x N x D cells -> B scores: the mean cell distance to the fitted Gaussian."""
    b, n, d = cells.shape
    return stats.score(cells.reshape(b * n, d).cpu()).view(b, n).mean(dim=1)


def _cells_of(bundle, tensors) -> torch.Tensor:
    rows = []
    for tensor in tensors:
        with bundle.lock:
            rows.append(logits_and_cells(bundle, tensor)[1].cpu())
    return torch.cat(rows)


def fit(bundle, train_images, val_images, *, quantile: float = familiarity.QUANTILE, source=None) -> FamiliarityStats:
    """The Gaussian of the training smears' cells and the threshold at `quantile` of the validation smears' scores.
    `train_images`, `val_images`: iterables of 1 x 3 x H x W tensors in [0, 1] at the model's input size."""
    if not 0.5 <= quantile < 1:
        raise ValueError(f"quantile must be in [0.5, 1), got {quantile}")
    train = _cells_of(bundle, train_images)
    cells = train.reshape(-1, train.shape[-1]).double()
    mean = cells.mean(dim=0)
    centred = cells - mean
    covariance = centred.T @ centred / max(1, len(centred) - 1)
    covariance += SHRINKAGE * covariance.diagonal().mean() * torch.eye(len(covariance), dtype=covariance.dtype)
    stats = FamiliarityStats(means=mean.unsqueeze(0), precision=torch.linalg.inv(covariance),
                             val_scores=torch.zeros(0, dtype=torch.float64), threshold=float("inf"), source={})
    val_scores = scores(stats, _cells_of(bundle, val_images).double()).sort().values
    stats.val_scores = val_scores
    stats.threshold = float(torch.quantile(val_scores, quantile))
    stats.source = {"model": bundle.name, "features": FEATURES, "train_images": int(train.shape[0]),
                    "cells_per_image": int(train.shape[1]), "val_images": int(len(val_scores)),
                    "quantile": quantile, **(source or {}),
                    "score": f"mean over the last encoder stage's cells of their Mahalanobis distance to one Gaussian "
                             f"of the training smears' cells (+{SHRINKAGE} x mean variance on the diagonal)"}
    return stats


@torch.no_grad()
def forward_and_check(bundle, images: torch.Tensor) -> tuple:
    """(logits B x C x H x W, a verdict per image or None where the model has no statistics; hub models have none:
    their training data is not here)."""
    stats = get_stats(bundle)
    with bundle.lock:
        if stats is None:
            return bundle(images), None
        logits, cells = logits_and_cells(bundle, images)
    return logits, [smear_verdict(stats, float(score), bundle.name) for score in scores(stats, cells)]


def smear_verdict(stats: FamiliarityStats, score: float, model_name: str) -> dict:
    """`familiarity.verdict` in the words of a segmentation model (smears, not classes)."""
    record = verdict(stats, score, model_name)
    if record["unfamiliar"]:
        record["message"] = (f"This photo does not look like the smears {model_name} learned from: its features lie "
                             f"further from theirs than those of {record['validation_percentile']:.1f}% of its "
                             f"validation smears (score {score:.1f}; flagged above {stats.threshold:.1f}). The "
                             "segmentation may mean nothing, and so may its explanations.")
    return record
