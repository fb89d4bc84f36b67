"""AHA without a trained explainer (methods.md section 2): optimise the same differentiable objective for
ONE image and class, directly on a G x G correction added to a prior map (attention rollout for class-token
ViTs, Grad-CAM otherwise). It costs `steps` forward + backward passes of the classifier on the perturbed
images, so it is slow next to the one-pass explainer, and is the fallback for every model that has none
(hub models, fine-tunes, a user's own). The classifier's weights and flags are never changed: the gradient
is taken with respect to the map only.
"""
from __future__ import annotations

import time

import torch

from ..resize import resize_bilinear
from .network import pools_class_token, standardise
from .objective import TAU_END, aha_loss, default_fractions, grid_range, reference_batch

PER_IMAGE_STEPS = 10
PER_IMAGE_LR = 0.5  # 16 bloodmnist-cnn val cells, ins-del from the Grad-CAM prior 0.376: 20 steps at 0.3 -> 0.535, 10 at 0.5 -> 0.530
PER_IMAGE_MAX_GRID = 14  # d = 196 cells: the sort's cost grows with d^2, and 14 x 14 is ViT-B/16's own grid
# Every step runs 2 x 14 perturbed copies of each image with a graph for the backward pass, so a batch is
# optimised in chunks of at most this many perturbed pixels per pass (about 1.4 GB of activations on the 64 px
# ViT, 2 GB on 128 px mosaics): 32 mosaics of 128 px in one pass took 18 GB and were killed. Each image's
# correction is independent (a summed loss, element-wise Adam), so chunking does not change the result.
PER_IMAGE_PIXELS_PER_PASS = 2 ** 20


def per_image_grid(image_hw) -> int:
    return min(PER_IMAGE_MAX_GRID, grid_range(image_hw)[1])


def prior_method(bundle) -> str:
    """The prior the optimisation starts from: rollout on class-token ViTs (a patch-token CAM points the wrong
    way there), Grad-CAM on everything else."""
    if getattr(bundle, "is_vit", False) and pools_class_token(bundle.network):
        return "rollout"
    return "gradcam"


def optimise_maps(bundle, images: torch.Tensor, targets: torch.Tensor, *, prior_maps: torch.Tensor,
                  steps: int = PER_IMAGE_STEPS, lr: float = PER_IMAGE_LR, grid: int | None = None, tau: float = TAU_END,
                  reference: str = "mean", progress=None, history: list | None = None,
                  deletion_weight: float = 1.0) -> torch.Tensor:
    """B x H x W maps (unbounded, higher = more important): the standardised prior map plus a G x G correction
    (bilinearly upsampled, so the prior's order within a cell survives) after `steps` Adam steps of the AHA
    loss (`deletion_weight` x deletion + 1 - insertion). `progress(done, total)` is called after every step (for a
    progress bar). `prior_maps`: B x H x W, the map it starts from (the `prior_method`'s, or a trained explainer's
    one pass): the caller computes it, so that this module never reaches back into the method registry."""
    image_hw = tuple(images.shape[-2:])
    targets = torch.as_tensor(targets, dtype=torch.long, device=images.device).view(-1)
    grid = grid or per_image_grid(image_hw)
    base = standardise(prior_maps.detach().float())
    if steps == 0:
        return base
    fractions = default_fractions()
    b = images.shape[0]
    per_pass = max(1, PER_IMAGE_PIXELS_PER_PASS // (2 * (len(fractions) - 2) * image_hw[0] * image_hw[1]))
    if b > per_pass:
        chunks = list(range(0, b, per_pass))

        def chunk_progress(offset):
            return None if progress is None else (lambda done, total: progress(offset * steps + done,
                                                                               len(chunks) * steps))
        traces = [[] for _ in chunks]
        maps = torch.cat([optimise_maps(bundle, images[i:i + per_pass], targets[i:i + per_pass], steps=steps, lr=lr,
                                        grid=grid, tau=tau, reference=reference,
                                        prior_maps=prior_maps[i:i + per_pass], progress=chunk_progress(n),
                                        history=traces[n], deletion_weight=deletion_weight)
                          for n, i in enumerate(chunks)])
        if history is not None:  # one row per step over the whole batch, as without chunks
            history.extend([sum(rows, []) for rows in zip(*traces)])
        return maps
    with torch.no_grad():
        references = reference_batch(images, reference, bundle.reference_color)
        both = bundle(torch.cat([images, references])).float().softmax(1)
        index = torch.arange(b, device=images.device)
        clean, blank = both[:b][index, targets], both[b:][index, targets]
    correction = torch.zeros(b, 1, grid, grid, device=images.device, requires_grad=True)
    optimizer = torch.optim.Adam([correction], lr=lr)

    def current():
        return base + resize_bilinear(correction, image_hw).squeeze(1)

    for step in range(steps):
        with torch.enable_grad():
            terms = aha_loss(bundle, images, current(), targets, references, grid=grid, tau=tau,
                             fractions=fractions, noise=False, endpoint_probs=(clean, blank), reduce=False,
                             deletion_weight=deletion_weight)
            # a sum: every image's correction has its own gradient, as if optimised alone
            (gradient,) = torch.autograd.grad(terms.loss.sum(), [correction])
        correction.grad = gradient
        optimizer.step()
        if history is not None:
            history.append([float(v) for v in terms.loss.detach()])
        if progress is not None:
            progress(step + 1, steps)
    with torch.no_grad():
        return current()


def step_passes() -> int:
    """Model passes one optimisation step costs per image (a backward counted as two): the image is sent through
    the model at every interior fraction of both curves, forward and backward (28 images per step, counted)."""
    return 3 * 2 * (len(default_fractions()) - 2)  # as optimise_maps: the interior fractions


def expected_seconds(bundle, steps: int = PER_IMAGE_STEPS, images: int = 1, **settings) -> float:
    """A measured estimate: one optimisation step on a blank image of the model's size, times the steps
    (`settings`: optimise_maps's grid / lr / deletion_weight, as the run will use them)."""
    x = torch.full((1, 3, *bundle.input_size), 0.5, device=bundle.device)
    started = time.perf_counter()
    optimise_maps(bundle, x, torch.zeros(1, dtype=torch.long, device=bundle.device), steps=1, **settings,
                  prior_maps=torch.rand(1, *bundle.input_size, generator=torch.Generator().manual_seed(0)).to(bundle.device))
    return (time.perf_counter() - started) * steps * images
