"""AHA's differentiable objective (methods.md section 2, ref).

loss = soft deletion AUC + (1 - soft insertion AUC) + 0.0025 * peak penalty (of the standardised map)

The loss depends on the map's ranking only: the sort standardises the cell scores, and the peak penalty is
taken on the map standardised per image, so scaling a map (its gain) changes nothing.

The map is average-pooled to a G x G grid, softly sorted (`sort.gumbel_sinkhorn`), and for every fraction p
the soft top-p mask (G x G) is upsampled (nearest) to the image, smoothed (Gaussian, sigma 1, reflect
padding), clamped to [0, 1] and used to blend the image with a reference: deletion replaces the top-p cells
by the reference, insertion keeps only them. The target's softmax probability along the fractions gives
the curves; AUC by trapezoid over `linspace(0, 1, 16)`.

Deleting the least-important cells first (sorting the negated map) at fraction p removes exactly the cells
outside the top (1 - p); its curve is insertion's curve read backwards, so its area equals insertion's area.
We therefore compute insertion from the same soft permutation (one Sinkhorn instead of two; identical in
the noise-free limit, and one shared Gumbel draw otherwise).

The endpoints p = 0 and p = 1 do not depend on the map (the clean image and the reference): they are
computed once without gradient. `fraction_samples` (a scaled-down-recipe option) evaluates only a random
subset of the interior fractions per step, re-weighted so that the AUC estimate stays unbiased.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..metrics import gaussian_blur
from .sort import gumbel_sinkhorn, soft_topk_masks

NUM_FRACTIONS = 16
PEAK_WEIGHT = 0.0025
PEAK_KERNEL = 15
REFERENCE_KINDS = ("black", "mean", "blur")
TRAIN_BLUR = (37, 37.0)  # kernel, sigma of the training blur reference (ref)
TAU_START, TAU_END = 1.0, 0.3


def default_fractions(count: int = NUM_FRACTIONS) -> torch.Tensor:
    return torch.linspace(0.0, 1.0, count, dtype=torch.float64)


def trapezoid_weights(fractions) -> torch.Tensor:
    """w such that sum_k w_k y_k is the trapezoid area over the fractions."""
    fractions = torch.as_tensor(fractions, dtype=torch.float64)
    widths = fractions[1:] - fractions[:-1]
    weights = torch.zeros_like(fractions)
    weights[:-1] += widths / 2
    weights[1:] += widths / 2
    return weights


# --- schedules and augmentation ----------------------------------------------------------------------

def grid_range(image_hw) -> tuple:
    """G's range: 7..28 for 224 px inputs (ref), scaled with the image size for smaller images."""
    size = min(image_hw)
    low = max(2, round(7 * size / 224))
    high = max(low, round(28 * size / 224))
    return low, high


def tau_at(step: int, total_steps: int, start: float = TAU_START, end: float = TAU_END) -> float:
    """Linear temperature schedule from `start` to `end` over training (ref: 1.0 -> 0.3)."""
    if total_steps <= 1:
        return end
    return start + (end - start) * min(1.0, max(0.0, step / (total_steps - 1)))


def reference_batch(images: torch.Tensor, kind: str, mean_color=(0.5, 0.5, 0.5), blur=TRAIN_BLUR) -> torch.Tensor:
    """The reference images in [0, 1] space: black, the data set's mean colour, or a strong blur (37, 37)."""
    if kind == "black":
        return torch.zeros_like(images)
    if kind == "mean":
        return torch.tensor(mean_color, dtype=images.dtype, device=images.device).view(1, 3, 1, 1).expand_as(images)
    if kind == "blur":
        return gaussian_blur(images, kernel_size=blur[0], sigma=blur[1])
    raise ValueError(f"Unknown reference '{kind}': choose one of {', '.join(REFERENCE_KINDS)}")


# --- pieces of the loss ------------------------------------------------------------------------------

def standardise_maps(maps: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Per-map z-scores of B x H x W maps: the loss sees a map's ranking, never its gain."""
    flat = maps.flatten(1)
    mean = flat.mean(1).view(-1, 1, 1)
    std = flat.std(1, unbiased=False).clamp_min(eps).view(-1, 1, 1)
    return (maps - mean) / std


def peak_penalty(maps: torch.Tensor, kernel: int = PEAK_KERNEL) -> torch.Tensor:
    """Per-map mean(relu(a - avgpool_15(a))^2) on the full-resolution map (B x H x W -> B)."""
    local = F.avg_pool2d(maps.unsqueeze(1), kernel, stride=1, padding=kernel // 2, count_include_pad=False)
    return F.relu(maps.unsqueeze(1) - local).pow(2).flatten(1).mean(dim=1)


def smooth_masks(masks: torch.Tensor, sigma: float = 1.0) -> torch.Tensor:
    """Gaussian smoothing (reflect padding) of N x 1 x H x W masks; sigma 0 = off."""
    if sigma <= 0:
        return masks
    kernel = 2 * math.ceil(3 * sigma) + 1
    return gaussian_blur(masks, kernel_size=kernel, sigma=sigma)


def grid_scores(maps: torch.Tensor, grid: int) -> torch.Tensor:
    """B x H x W maps -> B x G*G cell scores (average pooling)."""
    return F.adaptive_avg_pool2d(maps.unsqueeze(1).float(), grid).flatten(1)


def cell_masks_to_image(cell_masks: torch.Tensor, grid: int, image_hw, sigma: float = 1.0) -> torch.Tensor:
    """B x F x G*G soft cell masks -> B x F x H x W image masks (nearest upsampling, smoothing, clamp)."""
    b, f, _ = cell_masks.shape
    masks = cell_masks.reshape(b * f, 1, grid, grid)
    masks = F.interpolate(masks, size=tuple(image_hw), mode="nearest")
    masks = smooth_masks(masks, sigma).clamp(0, 1)
    return masks.view(b, f, *image_hw)


SCORES = ("prob", "logprob", "margin")


def target_scores(logits: torch.Tensor, targets: torch.Tensor, score: str = "prob") -> torch.Tensor:
    """The curve's score of each target: the softmax probability (ref), its log, or the logit margin (the target's
    logit minus the largest other logit). Where a class's probability is flat near 0 (a runner-up, a class absent
    from the image) the probability gives almost no gradient; the other two keep one."""
    logits = logits.float()
    column = targets.view(-1, 1)
    if score == "prob":
        return logits.softmax(dim=1).gather(1, column).squeeze(1)
    if score == "logprob":
        return logits.log_softmax(dim=1).gather(1, column).squeeze(1)
    if score == "margin":
        own = logits.gather(1, column).squeeze(1)
        others = logits.scatter(1, column, float("-inf")).amax(dim=1)
        return own - others
    raise ValueError(f"score must be one of {', '.join(SCORES)}, got {score!r}")


def target_probabilities(classify, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = classify(images)
    return logits.float().softmax(dim=1).gather(1, targets.view(-1, 1)).squeeze(1)


def mixed_scores(logits: torch.Tensor, targets: torch.Tensor, score: str, use_score: torch.Tensor | None):
    """Per row the probability, or `score` where `use_score` is true (rows of a batch of curves)."""
    probs = target_scores(logits, targets, "prob")
    if use_score is None or score == "prob" or not bool(use_score.any()):
        return probs
    return torch.where(use_score, target_scores(logits, targets, score), probs)


@dataclass
class SoftCurves:
    fractions: torch.Tensor  # F (float64, cpu)
    weights: torch.Tensor  # F trapezoid weights actually used (re-weighted when subsampling)
    deletion: torch.Tensor  # B x F probabilities (NaN where a fraction was not evaluated)
    insertion: torch.Tensor

    @property
    def deletion_auc(self) -> torch.Tensor:
        return _weighted(self.deletion, self.weights)

    @property
    def insertion_auc(self) -> torch.Tensor:
        return _weighted(self.insertion, self.weights)


def _weighted(curves: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    used = weights > 0
    return (curves[:, used] * weights[used].to(curves.device, curves.dtype)).sum(dim=1)


def soft_curves(classify, images: torch.Tensor, maps: torch.Tensor, targets: torch.Tensor,
                references: torch.Tensor, *, grid: int, tau: float, fractions=None, noise: bool = True,
                noise_scale: float = 1.0, smooth_sigma: float = 1.0, fraction_samples: int | None = None,
                generator: torch.Generator | None = None, rng: random.Random | None = None,
                endpoint_probs: tuple | None = None, score: str = "prob",
                score_rows: torch.Tensor | None = None) -> SoftCurves:
    """Soft deletion and insertion curves of B (image, map, target) triples, one batched forward pass.
    `score` (with `score_rows`, B bool: which triples use it; all when None) replaces the softmax probability
    by another score (`target_scores`) for those triples, divided per triple by the gap between its clean and
    reference scores (at least 1, no gradient) so that its curves stay on the probability's scale."""
    alternative = score != "prob"
    if alternative:
        if score not in SCORES:
            raise ValueError(f"score must be one of {', '.join(SCORES)}, got {score!r}")
        score_rows = (torch.ones(images.shape[0], dtype=torch.bool, device=images.device) if score_rows is None
                      else score_rows.to(images.device).bool())
        endpoint_probs = None  # the end points in the same scores, below
    b, _, h, w = images.shape
    fractions = default_fractions() if fractions is None else torch.as_tensor(fractions, dtype=torch.float64)
    weights = trapezoid_weights(fractions)
    is_endpoint = (fractions <= 0) | (fractions >= 1)
    interior = torch.nonzero(~is_endpoint).flatten().tolist()
    if fraction_samples is not None and 0 < fraction_samples < len(interior):
        total = float(weights[interior].sum())
        picked = sorted((rng or random).sample(interior, fraction_samples))
        weights = torch.where(is_endpoint, weights, torch.zeros_like(weights))
        picked_total = float(trapezoid_weights(fractions)[picked].sum())
        weights[picked] = trapezoid_weights(fractions)[picked] * (total / picked_total)
        interior = picked
    scores = grid_scores(maps, grid)
    permutation = gumbel_sinkhorn(scores, tau, noise=noise, noise_scale=noise_scale, generator=generator)
    cell_masks = soft_topk_masks(permutation, fractions[interior])  # B x F' x d
    masks = cell_masks_to_image(cell_masks, grid, (h, w), smooth_sigma).to(images.dtype)  # B x F' x H x W
    masks = masks.unsqueeze(2)  # B x F' x 1 x H x W
    x, ref = images.unsqueeze(1), references.unsqueeze(1)
    deleted = x + masks * (ref - x)  # top-p cells replaced by the reference
    inserted = ref + masks * (x - ref)  # only the top-p cells kept
    batch = torch.cat([deleted, inserted], dim=1).reshape(-1, 3, h, w)
    count = len(interior)
    if alternative:
        rows = score_rows.repeat_interleave(2 * count)
        probs = mixed_scores(classify(batch), targets.repeat_interleave(2 * count), score, rows).view(b, 2, count)
    else:
        probs = target_probabilities(classify, batch, targets.repeat_interleave(2 * count)).view(b, 2, count)

    deletion = torch.full((b, len(fractions)), float("nan"), device=images.device)
    insertion = torch.full_like(deletion, float("nan"))
    deletion, insertion = deletion.to(probs.dtype), insertion.to(probs.dtype)
    deletion = deletion.index_copy(1, torch.tensor(interior, device=images.device), probs[:, 0])
    insertion = insertion.index_copy(1, torch.tensor(interior, device=images.device), probs[:, 1])
    if is_endpoint.any():
        if endpoint_probs is None:
            with torch.no_grad():
                if alternative:
                    endpoints = mixed_scores(classify(torch.cat([images, references])), targets.repeat(2), score,
                                             score_rows.repeat(2))
                else:
                    endpoints = target_probabilities(classify, torch.cat([images, references]), targets.repeat(2))
            clean, blank = endpoints[:b], endpoints[b:]
        else:
            clean, blank = endpoint_probs
        for index in torch.nonzero(is_endpoint).flatten().tolist():
            at_zero = float(fractions[index]) <= 0
            deletion[:, index] = clean if at_zero else blank
            insertion[:, index] = blank if at_zero else clean
    if alternative:
        if not is_endpoint.any():
            with torch.no_grad():
                ends = mixed_scores(classify(torch.cat([images, references])), targets.repeat(2), score,
                                    score_rows.repeat(2))
            clean, blank = ends[:b], ends[b:]
        scale = torch.where(score_rows, (clean - blank).abs().clamp_min(1.0), torch.ones_like(clean)).detach()
        deletion, insertion = deletion / scale.view(-1, 1), insertion / scale.view(-1, 1)
    return SoftCurves(fractions=fractions, weights=weights, deletion=deletion, insertion=insertion)


@dataclass
class LossTerms:
    loss: torch.Tensor  # scalar
    deletion_auc: torch.Tensor  # B (detached)
    insertion_auc: torch.Tensor
    peak: torch.Tensor


def aha_loss(classify, images, maps, targets, references, *, grid: int, tau: float, fractions=None,
             noise: bool = True, noise_scale: float = 1.0, peak_weight: float = PEAK_WEIGHT,
             smooth_sigma: float = 1.0, fraction_samples: int | None = None,
             generator: torch.Generator | None = None, rng: random.Random | None = None,
             endpoint_probs: tuple | None = None, reduce: bool = True, deletion_weight: float = 1.0,
             score: str = "prob", score_rows: torch.Tensor | None = None) -> LossTerms:
    """deletion_weight * deletion AUC + (1 - insertion AUC) + peak_weight * peak penalty, averaged over the batch.
    (deletion_weight > 1 trades insertion for deletion where a model's baseline is strong on deletion.)"""
    curves = soft_curves(classify, images, maps, targets, references, grid=grid, tau=tau, fractions=fractions,
                         noise=noise, noise_scale=noise_scale, smooth_sigma=smooth_sigma,
                         fraction_samples=fraction_samples, generator=generator, rng=rng,
                         endpoint_probs=endpoint_probs, score=score, score_rows=score_rows)
    deletion_auc, insertion_auc = curves.deletion_auc, curves.insertion_auc
    peak = peak_penalty(standardise_maps(maps.float()))  # on the standardised map: scale-free like the sort
    per_sample = deletion_weight * deletion_auc + (1 - insertion_auc) + peak_weight * peak
    return LossTerms(loss=per_sample.mean() if reduce else per_sample, deletion_auc=deletion_auc.detach(),
                     insertion_auc=insertion_auc.detach(), peak=peak.detach())
