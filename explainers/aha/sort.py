"""Differentiable sort (methods.md section 2): Gumbel-Sinkhorn soft permutations and soft top-k masks.

    P = gumbel_sinkhorn(scores, tau)          # B x d x d, rows = ranks (0 = most important), columns = cells
    M = soft_topk_masks(P, fractions)         # B x F x d, soft membership of every cell in the top p*d

Scale (methods.md, "Score scale"): an explainer's map is unbounded, so the pooled cell scores are first
standardised per image (mean 0, standard deviation 1) and compared with rank anchors standardised the same
way (linspace(1, 0, d), z-scored): only the ranking of a map matters, never its gain. The log-potentials are
L[i, j] = -(s_j - r_i)^2 / delta, with delta the spacing of neighbouring anchors: in these units a cell's
potential falls by k^2 * delta nats k ranks away from its own place, so tau reads the same at every grid
size (at tau 1 a cell spreads over about sqrt(1 / (2 delta)) ranks: 3 of 64 at G = 8). Standard Gumbel
noise is added, everything divided by tau, then Sinkhorn normalisation in log space (over ranks, then
over cells) runs until every column sums to 1 within `tolerance` (capped at `max_iterations`).

The converging iterations run without a graph; a short differentiable tail (`gradient_iterations`) starts
from the converged dual potentials, so the gradient is that of the fixed point (approximately) at a memory
cost independent of how many iterations convergence took.
"""
from __future__ import annotations

import torch

SINKHORN_TOLERANCE = 1e-2  # on every column sum (1%)
SINKHORN_MAX_ITERATIONS = 300
GRADIENT_ITERATIONS = 20
CHECK_EVERY = 5


def rank_anchors(d: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """Standardised, decreasing anchors (rank 0 first): z-scored linspace(1, 0, d)."""
    anchors = torch.linspace(1.0, 0.0, d, device=device, dtype=torch.float64)
    if d > 1:
        anchors = (anchors - anchors.mean()) / anchors.std(unbiased=False)
    return anchors.to(dtype)


def anchor_spacing(d: int) -> float:
    """Distance between neighbouring standardised anchors (sqrt(12 / (d^2 - 1)))."""
    return (12.0 / (d * d - 1)) ** 0.5 if d > 1 else 1.0


def standardise(scores: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Per-row z-scores of B x d scores (a constant row stays 0)."""
    mean = scores.mean(dim=-1, keepdim=True)
    std = scores.std(dim=-1, keepdim=True, unbiased=False)
    return (scores - mean) / std.clamp_min(eps)


def sample_gumbel(shape, *, generator: torch.Generator | None = None, device=None, dtype=torch.float32,
                  eps: float = 1e-10) -> torch.Tensor:
    uniform = torch.rand(shape, generator=generator, dtype=dtype, device="cpu" if generator is not None else device)
    return -torch.log(-torch.log(uniform + eps) + eps).to(device)


def _sinkhorn_step(log_alpha: torch.Tensor) -> torch.Tensor:
    log_alpha = log_alpha - torch.logsumexp(log_alpha, dim=-2, keepdim=True)  # every cell holds one rank
    return log_alpha - torch.logsumexp(log_alpha, dim=-1, keepdim=True)  # every rank holds one cell


def column_error(log_alpha: torch.Tensor) -> float:
    """max |column sum - 1| of exp(log_alpha) (rows are exact after a Sinkhorn step)."""
    return float((torch.logsumexp(log_alpha, dim=-2).exp() - 1).abs().max())


def log_sinkhorn(log_alpha: torch.Tensor, iterations: int | None = None, *, tolerance: float = SINKHORN_TOLERANCE,
                 max_iterations: int = SINKHORN_MAX_ITERATIONS,
                 gradient_iterations: int = GRADIENT_ITERATIONS, info: dict | None = None) -> torch.Tensor:
    """Log-space Sinkhorn of B x d x d potentials. `iterations` fixes the count (every step differentiable);
    by default it runs to `tolerance` on the column sums, capped at `max_iterations`."""
    if iterations is not None:
        for _ in range(iterations):
            log_alpha = _sinkhorn_step(log_alpha)
        if info is not None:
            info.update(iterations=iterations, column_error=column_error(log_alpha.detach()))
        return log_alpha
    needs_grad = log_alpha.requires_grad and torch.is_grad_enabled()
    done = 0
    with torch.no_grad():
        converged = log_alpha.detach()
        while done < max_iterations:
            converged = _sinkhorn_step(converged)
            done += 1
            if done % CHECK_EVERY == 0 and column_error(converged) < tolerance:
                break
    if not needs_grad:
        if info is not None:
            info.update(iterations=done, column_error=column_error(converged))
        return converged
    # the duals found above, as a constant offset; the tail's iterations carry the gradient
    log_alpha = log_alpha + (converged - log_alpha.detach())
    for _ in range(gradient_iterations):
        log_alpha = _sinkhorn_step(log_alpha)
    if info is not None:
        info.update(iterations=done + gradient_iterations, column_error=column_error(log_alpha.detach()))
    return log_alpha


def sort_potentials(scores: torch.Tensor, anchors: str = "sorted") -> torch.Tensor:
    """B x d(ranks) x d(cells) log-potentials -(s_j - r_i)^2 / delta of standardised scores. Anchors
    "sorted": the image's own standardised scores in descending order, held constant (each cell starts at
    its own rank, so Sinkhorn converges in a few iterations and tau -> 0 is the exact sort); "uniform": the
    standardised linspace(1, 0, d)."""
    d = scores.shape[-1]
    scores = standardise(scores)
    if anchors == "sorted":
        ranks = scores.detach().sort(dim=-1, descending=True).values.unsqueeze(-1)  # B x d x 1
    elif anchors == "uniform":
        ranks = rank_anchors(d, device=scores.device, dtype=scores.dtype).view(-1, 1)
    else:
        raise ValueError(f"anchors must be 'sorted' or 'uniform', got {anchors!r}")
    return -(scores.unsqueeze(-2) - ranks) ** 2 / anchor_spacing(d)


def gumbel_sinkhorn(scores: torch.Tensor, tau: float, *, noise: bool = True, noise_scale: float = 1.0,
                    iterations: int | None = None, tolerance: float = SINKHORN_TOLERANCE,
                    max_iterations: int = SINKHORN_MAX_ITERATIONS, generator: torch.Generator | None = None,
                    anchors: str = "sorted", info: dict | None = None) -> torch.Tensor:
    """Soft permutation (B x d x d, rank x cell, doubly stochastic) for B x d scores. Computed in float32.
    Invariant to the scale and offset of the scores (they are standardised per row)."""
    if tau <= 0:
        raise ValueError("tau must be > 0")
    with torch.autocast(device_type=scores.device.type, enabled=False):
        log_potentials = sort_potentials(scores.float(), anchors)
        if noise and noise_scale > 0:
            log_potentials = log_potentials + noise_scale * sample_gumbel(
                log_potentials.shape, generator=generator, device=scores.device)
        return log_sinkhorn(log_potentials / tau, iterations, tolerance=tolerance,
                            max_iterations=max_iterations, info=info).exp()


def hard_permutation(scores: torch.Tensor) -> torch.Tensor:
    """The exact sorting permutation matrix (B x d x d, rank x cell), descending scores first."""
    order = torch.argsort(scores, dim=-1, descending=True)
    return torch.nn.functional.one_hot(order, scores.shape[-1]).to(scores.dtype)


def cumulative_membership(permutation: torch.Tensor) -> torch.Tensor:
    """B x (d+1) x d: row k is every cell's soft membership in the top k (row 0 = nothing)."""
    cumulative = permutation.cumsum(dim=-2)
    zeros = torch.zeros_like(cumulative[..., :1, :])
    return torch.cat([zeros, cumulative], dim=-2)


def soft_topk_masks(permutation: torch.Tensor, fractions) -> torch.Tensor:
    """B x F x d soft masks of the top-p cells for each fraction p, by linear interpolation between the
    cumulative rows floor(p*d) and floor(p*d) + 1."""
    d = permutation.shape[-1]
    membership = cumulative_membership(permutation)
    fractions = torch.as_tensor(fractions, dtype=torch.float64).clamp(0, 1)
    positions = fractions * d
    lower = positions.floor().long().clamp(0, d)
    upper = (lower + 1).clamp(max=d)
    weight = (positions - lower.double()).to(permutation.dtype).to(permutation.device).view(1, -1, 1)
    lower, upper = lower.to(permutation.device), upper.to(permutation.device)
    return (1 - weight) * membership[:, lower] + weight * membership[:, upper]
