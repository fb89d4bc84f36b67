"""Test-time refinement (methods.md section 2; paper, not in the reference code, so a choice).

T Adam steps (0..10) on the decoder's output head for ONE image and class, with the training loss
(Gumbel noise off by default, tau at its final value 0.3, the finest training grid, the bundle's evaluation
reference), then the refined map. The shared explainer is never modified: each call works on its own copy
of the head's parameters through a pure functional forward, so concurrent refinements (two users at once)
cannot see each other's weights, and nothing needs restoring. The classifier pass and the decoder trunk
run once; only the small head and the loss's perturbed images are recomputed per step.
"""
from __future__ import annotations

import torch

from .network import AHAExplainer, OutputHead
from .objective import TAU_END, aha_loss, default_fractions, grid_range, reference_batch

MAX_REFINE_STEPS = 10
# The gain is inert (the loss sees a map's ranking only) and refining it only destabilised the step size.
REFINED = ("conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "cam_weight")
REFINE_LR = 0.002  # tuned on 6 imagenet-train photos (T=3: 0.05 and 0.2 wreck the map, 0.002 improves both curves)


def check_refine_steps(steps) -> int:
    if isinstance(steps, bool) or int(steps) != steps or not 0 <= int(steps) <= MAX_REFINE_STEPS:
        raise ValueError(f"refine_steps must be an integer in 0..{MAX_REFINE_STEPS}, got {steps!r}")
    return int(steps)


def refine_maps(explainer: AHAExplainer, images: torch.Tensor, targets: torch.Tensor, *, steps: int,
                lr: float = REFINE_LR, grid: int | None = None, tau: float = TAU_END, noise_scale: float = 0.0,
                reference: str = "mean", fractions=None, encoded=None, history: list | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """B x H x W maps after `steps` refinement steps per image (steps = 0: the single-pass map)."""
    steps = check_refine_steps(steps)
    bundle = explainer.bundle
    encoded = encoded if encoded is not None else explainer.encode(images)
    targets = torch.as_tensor(targets, dtype=torch.long, device=images.device).view(-1)
    image_hw = tuple(images.shape[-2:])
    with torch.no_grad():
        fused, cam = explainer.trunk(encoded, targets)
        shared = {name: p.detach() for name, p in explainer.head.named_parameters()}
        if steps == 0:
            return explainer.smooth(OutputHead.forward_with(shared, fused, cam, image_hw))
        references = reference_batch(images, reference, bundle.reference_color)
        clean = encoded.logits.float().softmax(1).gather(1, targets.view(-1, 1)).squeeze(1)
        blank = bundle(references).float().softmax(1).gather(1, targets.view(-1, 1)).squeeze(1)
    grid = grid or grid_range(image_hw)[1]
    fractions = default_fractions() if fractions is None else fractions
    maps = []
    for i in range(images.shape[0]):
        params = {name: value.clone().requires_grad_(name in REFINED) for name, value in shared.items()}
        optimizer = torch.optim.Adam([params[name] for name in REFINED if name in params], lr=lr)
        cam_i = None if cam is None else cam[i:i + 1]
        trace = []
        for _ in range(steps):
            with torch.enable_grad():
                current = explainer.smooth(OutputHead.forward_with(params, fused[i:i + 1], cam_i, image_hw))
                terms = aha_loss(bundle, images[i:i + 1], current, targets[i:i + 1], references[i:i + 1],
                                 grid=grid, tau=tau, fractions=fractions, noise=noise_scale > 0,
                                 noise_scale=noise_scale, generator=generator,
                                 endpoint_probs=(clean[i:i + 1], blank[i:i + 1]))
                trained = [params[name] for name in REFINED if name in params]
                grads = torch.autograd.grad(terms.loss, trained, allow_unused=True)  # cam_weight: unused without CAM
            for value, grad in zip(trained, grads):
                value.grad = torch.zeros_like(value) if grad is None else grad
            optimizer.step()
            trace.append(float(terms.loss.detach()))
        with torch.no_grad():
            maps.append(explainer.smooth(OutputHead.forward_with(params, fused[i:i + 1], cam_i, image_hw)))
            if history is not None:  # the loss of the returned map too (one more evaluation)
                final = aha_loss(bundle, images[i:i + 1], maps[-1], targets[i:i + 1], references[i:i + 1],
                                 grid=grid, tau=tau, fractions=fractions, noise=noise_scale > 0,
                                 noise_scale=noise_scale, generator=generator,
                                 endpoint_probs=(clean[i:i + 1], blank[i:i + 1]))
                history.append(trace + [float(final.loss)])
    return torch.cat(maps)
