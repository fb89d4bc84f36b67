"""A compact PPO (clipped surrogate, GAE, value loss, entropy bonus) with the CAMAL term on the critic.

    loss = PPO loss + lambda * (1/B) * sum over frames b with a non-empty mask of (beta_b - alpha_b)

The two parts' gradients are clipped separately (`clipped_step`) and both norms are logged per update. Measuring
the two norms takes a backward pass each through the whole network; with `norm_every = k > 1` they are measured on
every k-th minibatch only, and the minibatches between take ONE backward of the two parts weighted by the factors
last measured (`weighted_step`): the same clipped sum where the norms change slowly, at 1.26x a vanilla
update instead of 2.13x with k = 8 (bench/agents_cost.py on this CPU).

alpha_b / beta_b = mean of the V(s) Grad-CAM H_b (batch-level, differentiable; `networks.value_cam`) inside /
outside the frame's mask of what matters. Frames whose mask is empty (or covers the whole frame) add no term; the
sum is divided by the minibatch size B, so lambda weighs one frame's regulariser against one frame's PPO loss.

Why not stable-baselines3: its rollout buffer has no slot for a per-frame mask and its `PPO.train` is one long
method, so the CAMAL term would mean copying that method; the loop below is short enough to test whole.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..resize import resize_bilinear_adjoint
from .networks import value_cam


@dataclass
class PPOConfig:
    num_envs: int = 8
    rollout_steps: int = 128
    epochs: int = 4
    minibatch: int = 256
    lr: float = 2.5e-4
    lr_schedule: str = "constant"  # or "linear": Adam's rate falls from lr to 0 over the run's step cap
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip: float = 0.1
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    max_grad_norm: float = 0.5  # the PPO loss's gradient is clipped to this norm
    camal_max_grad_norm: float = 0.5  # ... and the CAMAL term's, separately (it cannot shrink the PPO step)
    camal_lambda: float = 0.0  # 0 = vanilla PPO (no CAM is computed)
    cam_mode: str = "differentiable"  # or "detach-weights"
    norm_every: int = 1  # measure the two clip factors on every k-th minibatch (1 = every one, exact)

    def to_dict(self) -> dict:
        return asdict(self)

    def lr_at(self, steps_done: int, steps_total: int | None) -> float:
        """The learning rate of the update that starts after `steps_done` environment steps. The linear schedule
        (stable-baselines3's zoo recipes for Atari) damps the late updates where, at a constant rate, several
        of our runs' training returns fell from their peak (e.g. 12.6 to 9.9 over the last 16 updates)."""
        if self.lr_schedule == "constant":
            return self.lr
        if self.lr_schedule != "linear":
            raise ValueError(f"unknown learning-rate schedule '{self.lr_schedule}' (constant or linear)")
        if not steps_total:
            raise ValueError("a linear learning-rate schedule needs the run's step cap (--steps)")
        return self.lr * max(0.0, 1.0 - steps_done / steps_total)


class Rollout:
    """T x N storage of one rollout (frames as uint8, masks as bool)."""

    def __init__(self, steps: int, num_envs: int, frame_shape: tuple, device):
        self.frames = torch.zeros((steps, num_envs, *frame_shape), dtype=torch.uint8)
        self.masks = torch.zeros((steps, num_envs, *frame_shape[1:]), dtype=torch.bool)
        self.actions = torch.zeros((steps, num_envs), dtype=torch.long)
        self.log_probs = torch.zeros((steps, num_envs))
        self.values = torch.zeros((steps, num_envs))
        self.rewards = torch.zeros((steps, num_envs))
        self.dones = torch.zeros((steps, num_envs))  # 1 where the step ended an episode
        self.device = device

    def advantages(self, last_values: torch.Tensor, gamma: float, gae_lambda: float) -> tuple:
        """Generalised advantage estimation; returns (advantages, returns), each T x N."""
        steps = self.rewards.shape[0]
        advantages = torch.zeros_like(self.rewards)
        running = torch.zeros_like(last_values)
        for t in reversed(range(steps)):
            next_values = last_values if t == steps - 1 else self.values[t + 1]
            alive = 1.0 - self.dones[t]
            delta = self.rewards[t] + gamma * next_values * alive - self.values[t]
            running = delta + gamma * gae_lambda * alive * running
            advantages[t] = running
        return advantages, advantages + self.values


def camal_term(cams: torch.Tensor, masks: torch.Tensor) -> tuple:
    """(sum over frames with a usable mask of beta - alpha, number of such frames, sum alpha, sum beta).

    alpha / beta: the mean of the bilinearly upsampled map inside / outside the mask. `cams` may be at the CAM
    layer's grid (B x h x w, the cheap form the training loss uses): then each mask is carried onto that grid by
    the adjoint of the upsampling, <U c, m> = <c, U^T m>, which gives the same alpha and beta without
    upsampling the maps and back-propagating through it (about a quarter of a CAMAL update's cost on a CPU)."""
    m = masks.to(cams.dtype)
    inside = m.sum(dim=(1, 2))
    outside = (1 - m).sum(dim=(1, 2))
    usable = (inside > 0) & (outside > 0)
    if cams.shape[-2:] != masks.shape[-2:]:
        inside_weights = resize_bilinear_adjoint(m, cams.shape[-2:])
        all_weights = resize_bilinear_adjoint(torch.ones_like(m[:1]), cams.shape[-2:])
        alpha_sum = (cams * inside_weights).sum(dim=(1, 2))
        beta_sum = (cams * all_weights).sum(dim=(1, 2)) - alpha_sum
    else:
        alpha_sum, beta_sum = (cams * m).sum(dim=(1, 2)), (cams * (1 - m)).sum(dim=(1, 2))
    alpha = alpha_sum / inside.clamp_min(1)
    beta = beta_sum / outside.clamp_min(1)
    gap = torch.where(usable, beta - alpha, torch.zeros_like(alpha))
    return gap.sum(), int(usable.sum()), alpha[usable].sum().detach(), beta[usable].sum().detach()


def ppo_loss(net, frames, masks, actions, old_log_probs, advantages, returns, config: PPOConfig) -> tuple:
    """The minibatch loss and its parts (floats)."""
    if config.camal_lambda:
        cams, logits, values = value_cam(net, frames, differentiable=True, at_grid=True,
                                         detach_weights=config.cam_mode == "detach-weights")
    else:
        logits, values = net(frames)
    distribution = torch.distributions.Categorical(logits=logits)
    log_probs = distribution.log_prob(actions)
    ratio = (log_probs - old_log_probs).exp()
    normalised = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    policy_loss = -torch.min(ratio * normalised, ratio.clamp(1 - config.clip, 1 + config.clip) * normalised).mean()
    value_loss = F.mse_loss(values, returns)
    entropy = distribution.entropy().mean()
    loss = policy_loss + config.value_coef * value_loss - config.entropy_coef * entropy
    parts = {"policy_loss": float(policy_loss.detach()), "value_loss": float(value_loss.detach()),
             "entropy": float(entropy.detach()),
             "clip_fraction": float(((ratio - 1).abs() > config.clip).float().mean())}
    camal = None
    if config.camal_lambda:
        gap_sum, usable, alpha_sum, beta_sum = camal_term(cams, masks)
        camal = config.camal_lambda * gap_sum / frames.shape[0]
        parts.update({"camal_gap": float(gap_sum.detach()) / max(usable, 1), "camal_frames": usable / frames.shape[0],
                      "cam_inside": float(alpha_sum) / max(usable, 1), "cam_outside": float(beta_sum) / max(usable, 1)})
    return loss, camal, parts


def clipped_step(net, optimizer, loss: torch.Tensor, camal: torch.Tensor | None, config: PPOConfig) -> dict:
    """One optimiser step. The PPO loss's gradient and the CAMAL term's are clipped to their own norms
    (`max_grad_norm`, `camal_max_grad_norm`) and then added, so a large CAMAL gradient cannot shrink the PPO step
    (one shared clip did: a CAMAL norm 13x the PPO norm cut every PPO step 13-fold). Returns both norms before
    clipping and the two factors applied (`ppo_factor`, `camal_factor`, what `weighted_step` reuses)."""
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer.zero_grad(set_to_none=True)
    if camal is None:
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
        optimizer.step()
        return {"ppo_grad_norm": float(norm)}
    ppo_grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    camal_grads = torch.autograd.grad(camal, params, allow_unused=True)
    norms = {}
    scaled = []
    for key, grads, limit in (("ppo_grad_norm", ppo_grads, config.max_grad_norm),
                              ("camal_grad_norm", camal_grads, config.camal_max_grad_norm)):
        grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params)]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        norms[key] = float(norm)
        factor = min(1.0, limit / (float(norm) + 1e-6))
        norms[key.replace("grad_norm", "factor")] = factor
        scaled.append([g * factor for g in grads])
    for p, g_ppo, g_camal in zip(params, *scaled):
        p.grad = g_ppo + g_camal
    optimizer.step()
    return norms


def weighted_step(net, optimizer, loss: torch.Tensor, camal: torch.Tensor, factors: dict) -> None:
    """One optimiser step on factors["ppo_factor"] * grad(loss) + factors["camal_factor"] * grad(camal) in a
    single backward pass: `clipped_step`'s sum with the factors it measured on an earlier minibatch."""
    optimizer.zero_grad(set_to_none=True)
    (factors["ppo_factor"] * loss + factors["camal_factor"] * camal).backward()
    optimizer.step()


def ppo_update(net, optimizer, rollout: Rollout, last_values: torch.Tensor, config: PPOConfig,
               generator: torch.Generator) -> dict:
    """`config.epochs` passes over the rollout in shuffled minibatches; returns the mean of each loss part (a
    part logged on some minibatches only, such as the gradient norms with `norm_every > 1`, over those)."""
    advantages, returns = rollout.advantages(last_values, config.gamma, config.gae_lambda)
    flat = {"frames": rollout.frames.flatten(0, 1), "masks": rollout.masks.flatten(0, 1),
            "actions": rollout.actions.flatten(), "log_probs": rollout.log_probs.flatten(),
            "advantages": advantages.flatten(), "returns": returns.flatten()}
    device = rollout.device
    flat = {key: value.to(device) for key, value in flat.items()}
    total = flat["actions"].shape[0]
    sums, counts, factors, step = {}, {}, None, 0
    for _ in range(config.epochs):
        order = torch.randperm(total, generator=generator).to(device)
        for start in range(0, total, config.minibatch):
            index = order[start:start + config.minibatch]
            loss, camal, parts = ppo_loss(net, flat["frames"][index], flat["masks"][index], flat["actions"][index],
                                   flat["log_probs"][index], flat["advantages"][index], flat["returns"][index],
                                   config)
            if camal is None or factors is None or step % max(config.norm_every, 1) == 0:
                norms = clipped_step(net, optimizer, loss, camal, config)
                if camal is not None and (factors is None or norms["camal_grad_norm"] > 0):
                    # a minibatch with no usable mask has no CAMAL gradient: its factor (1) says nothing
                    factors = {key: norms[key] for key in ("ppo_factor", "camal_factor")}
                parts.update({key: value for key, value in norms.items() if not key.endswith("_factor")})
            else:
                weighted_step(net, optimizer, loss, camal, factors)
            step += 1
            for key, value in parts.items():
                sums[key] = sums.get(key, 0.0) + value
                counts[key] = counts.get(key, 0) + 1
    explained = 1 - float((returns - rollout.values).var() / returns.var().clamp_min(1e-8))
    return {**{key: value / counts[key] for key, value in sums.items()}, "explained_variance": explained}


@torch.no_grad()
def act(net, frames: np.ndarray, device, generator: torch.Generator | None = None, greedy: bool = False) -> tuple:
    """(actions, log-probs, values) for a batch of uint8 frames."""
    logits, values = net(torch.as_tensor(frames, device=device))
    distribution = torch.distributions.Categorical(logits=logits.float().cpu())
    if greedy:
        actions = logits.argmax(dim=1).cpu()
    else:
        actions = torch.multinomial(distribution.probs, 1, generator=generator).squeeze(1)
    return actions, distribution.log_prob(actions), values.float().cpu()
