"""The sanity checks of a method's maps, one implementation for the library, the benchmarks and the app's live
view: the model-randomisation check (Adebayo et al. 2018) and whether a map depends on the class asked about.
Every map comes from the engine's one run path (`engine.explain_batch`: lock, seed, checks).

    for name, done, maps in randomization_stages(bundle, get_method("gradcam"), images, targets, stages=4):
        ...   # stage 0: the trained model; then more and more of its top layers re-initialised

Cascading: the parameterised modules are re-initialised from the output layer down, on a deep copy (the caller's
model is never touched). Re-initialisation: He-normal weights (std sqrt(2 / fan_in)), norm scales
U(0.5, 1.5), other vectors N(0, 0.1), all drawn from a private generator seeded with `seed`, so the
randomised model is the same for every method (the global RNG, which a method may draw from, is reseeded
before each map instead, by `engine.explain_batch`). A faithful method's map changes: its rank correlation with the
original falls well below 1.
"""
from __future__ import annotations

import copy
import threading

import numpy as np
import torch

from .engine import explain_batch
from .methods import Method, get_method
from .metrics import CLASS_BLIND_RHO, spearman


def parameter_layers(network) -> list:
    """[(name, module)] of the modules that own parameters, from the output layer down (the root module, which
    holds a ViT's position embedding and class token, last)."""
    layers = [(name, module) for name, module in network.named_modules()
              if any(True for _ in module.parameters(recurse=False))]
    layers.reverse()
    return layers


def reinitialise(name: str, module, generator: torch.Generator) -> None:
    """Draw new values for a module's own parameters (see the module docstring)."""
    with torch.no_grad():
        for parameter in module.parameters(recurse=False):
            if parameter.dim() > 1:
                fan_in = parameter[0].numel()
                values = torch.randn(parameter.shape, generator=generator) * (2.0 / fan_in) ** 0.5
            elif "norm" in name or "bn" in name:
                values = torch.rand(parameter.shape, generator=generator) + 0.5
            else:
                values = torch.randn(parameter.shape, generator=generator) * 0.1
            parameter.copy_(values.to(parameter.device, parameter.dtype))


def stage_chunks(layers: list, *, stages: int | None = None, layers_per_stage: int | None = None,
                 max_layers: int | None = None) -> list:
    """How many layers each stage re-initialises: one per stage up to `max_layers` (all when None), or, with
    `stages`, `layers_per_stage` (default len/(2*stages)) for the first stage and doubling after it."""
    if stages is None:
        count = len(layers) if not max_layers else min(max_layers, len(layers))
        return [layers[i:i + 1] for i in range(count)]
    per_stage = layers_per_stage or max(1, len(layers) // (2 * stages))
    chunks, done = [], 0
    for stage in range(stages):
        chunk = layers[done:done + per_stage * (1 if stage == 0 else 2 ** stage)]
        if not chunk:
            break
        chunks.append(chunk)
        done += len(chunk)
    return chunks


def randomization_stages(bundle, method, images: torch.Tensor, targets, *, seed: int = 0, stages: int | None = None,
                         layers_per_stage: int | None = None, max_layers: int | None = None):
    """Yields (last layer re-initialised or None, number of layers re-initialised, B x H x W maps): first the
    trained model's maps, then one item per stage (`stage_chunks`). `method`: a Method or a registered name."""
    method = method if isinstance(method, Method) else get_method(method)
    original = explain_batch(bundle, method, images, targets, seed=seed).maps
    with bundle.lock:
        randomized = copy.copy(bundle)
        randomized.network = copy.deepcopy(bundle.network)
    randomized.lock = threading.RLock()
    yield None, 0, original
    generator = torch.Generator().manual_seed(seed)
    done = 0
    for chunk in stage_chunks(parameter_layers(randomized.network), stages=stages,
                              layers_per_stage=layers_per_stage, max_layers=max_layers):
        for name, module in chunk:
            reinitialise(name, module, generator)
        done += len(chunk)
        yield chunk[-1][0], done, explain_batch(randomized, method, images, targets, seed=seed).maps


def randomization_sanity_check(bundle, method, images: torch.Tensor, targets, *, seed: int = 0,
                               max_layers: int | None = None) -> list:
    """[(layer name, mean Spearman rho of the maps with the trained model's)] after re-initialising one more layer
    each time, from the top down."""
    results, original = [], None
    for name, _, maps in randomization_stages(bundle, method, images, targets, seed=seed, max_layers=max_layers):
        if name is None:
            original = maps
            continue
        results.append((name, float(np.mean([spearman(original[i], maps[i]) for i in range(images.shape[0])]))))
    return results


# --- does the map depend on the class asked about? (thresholds: metrics.CLASS_BLIND_RHO, CLASS_BLIND_MARGIN) ---
def class_dependence(bundle, method, images: torch.Tensor, *, batch_size: int = 16, seed: int = 0) -> dict:
    """How much a method's map changes with the class asked about: per image, the Spearman rho between its map
    for the model's predicted class and its map for the runner-up class (1: the same map whatever the class;
    near 0 or below: a different map for each). `method`: a Method or a registered name; `images`: B x 3 x H x W
    in [0, 1]. Returns {"spearman_top1_top2": mean, "ci95": bootstrap interval or None, "images": B,
    "maps_agree": mean >= CLASS_BLIND_RHO, "per_image": [rho, ...]} (a map constant over the image has no rank
    order: its rho is left out of the mean). Agreeing maps alone do not make a method class-blind: where the two
    classes' evidence lies in one place every method's maps agree (AHA's `caveat` also asks for a margin over
    Grad-CAM's rho on the same images)."""
    from .statistics import bootstrap_ci

    method = method if isinstance(method, Method) else get_method(method)
    method.check(bundle)
    if images.shape[0] < 1:
        raise ValueError("class_dependence needs at least one image")
    rhos = []
    for start in range(0, images.shape[0], batch_size):
        batch = images[start:start + batch_size].to(bundle.device)
        with bundle.lock:
            with torch.no_grad():
                logits = bundle(batch)
            if logits.shape[1] < 2:
                raise ValueError(f"'{bundle.name}' has one class: no runner-up to compare the map with")
            top2 = logits.topk(2, dim=1).indices
            # reseeded for each class: a method drawing from the global generator draws the same for both
            maps = [explain_batch(bundle, method, batch, top2[:, column], seed=seed).maps.cpu() for column in (0, 1)]
        for first, second in zip(*maps):
            constant = float(first.max() - first.min()) == 0.0 or float(second.max() - second.min()) == 0.0
            rhos.append(float("nan") if constant else spearman(first, second))
    values = [r for r in rhos if np.isfinite(r)]
    mean = float(np.mean(values)) if values else float("nan")
    return {"spearman_top1_top2": mean, "ci95": bootstrap_ci(values, seed=seed) if len(values) > 1 else None,
            "images": len(rhos), "maps_agree": bool(values) and mean >= CLASS_BLIND_RHO, "per_image": rhos}
