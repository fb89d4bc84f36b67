"""Differentiable sort (methods.md section 2, ref): Gumbel-Sinkhorn soft permutations and soft top-k masks.

    P = gumbel_sinkhorn(scores, tau)          # B x d x d, rows = ranks (0 = most important), columns = cells
    M = soft_topk_masks(P, fractions)         # B x F x d, soft membership of every cell in the top p*d

Log-potentials L[i, j] = -(s_j - r_i)^2 with rank anchors r = linspace(1, 0, d): the highest score is
closest to the anchor 1 (rank 0). Standard Gumbel noise is added, everything divided by the temperature,
then Sinkhorn normalisation in log space (over ranks, then over cells). As tau -> 0 without noise P tends
to the hard sorting permutation (scores assumed distinct).
"""
from __future__ import annotations

import torch

SINKHORN_ITERATIONS = 30


def rank_anchors(d: int, device=None, dtype=torch.float32) -> torch.Tensor:
    return torch.linspace(1.0, 0.0, d, device=device, dtype=dtype)


def sample_gumbel(shape, *, generator: torch.Generator | None = None, device=None, dtype=torch.float32,
                  eps: float = 1e-10) -> torch.Tensor:
    uniform = torch.rand(shape, generator=generator, dtype=dtype, device="cpu" if generator is not None else device)
    return -torch.log(-torch.log(uniform + eps) + eps).to(device)


def log_sinkhorn(log_alpha: torch.Tensor, iterations: int = SINKHORN_ITERATIONS) -> torch.Tensor:
    """Alternate log-space normalisation of B x d x d potentials: over ranks (dim -2), then over cells (dim -1)."""
    for _ in range(iterations):
        log_alpha = log_alpha - torch.logsumexp(log_alpha, dim=-2, keepdim=True)
        log_alpha = log_alpha - torch.logsumexp(log_alpha, dim=-1, keepdim=True)
    return log_alpha


def gumbel_sinkhorn(scores: torch.Tensor, tau: float, *, noise: bool = True, noise_scale: float = 1.0,
                    iterations: int = SINKHORN_ITERATIONS, generator: torch.Generator | None = None) -> torch.Tensor:
    """Soft permutation (B x d x d, rank x cell, doubly stochastic) for B x d scores. Computed in float32."""
    if tau <= 0:
        raise ValueError("tau must be > 0")
    with torch.autocast(device_type=scores.device.type, enabled=False):
        scores = scores.float()
        d = scores.shape[-1]
        anchors = rank_anchors(d, device=scores.device)
        log_potentials = -(scores.unsqueeze(-2) - anchors.view(-1, 1)) ** 2  # B x d(ranks) x d(cells)
        if noise and noise_scale > 0:
            log_potentials = log_potentials + noise_scale * sample_gumbel(
                log_potentials.shape, generator=generator, device=scores.device)
        return log_sinkhorn(log_potentials / tau, iterations).exp()


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
