"""AHA (methods.md section 2): differentiable sort, soft objective, explainer, refinement, training, DDP."""
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import as_uint8, free_port, tiny_cnn, tiny_vit, write_labelled_folder
from explainers.aha.network import AHAExplainer
from explainers.aha.objective import (aha_loss, default_fractions, grid_range, peak_penalty, reference_batch,
                                      soft_curves, tau_at, trapezoid_weights)
from explainers.aha.refine import refine_maps
from explainers.aha.sort import (SINKHORN_MAX_ITERATIONS, SINKHORN_TOLERANCE, gumbel_sinkhorn, hard_permutation,
                                 soft_topk_masks)
from explainers.aha.store import forget_explainers, load_explainer, register_explainer, save_explainer
from explainers.metrics import deletion_insertion

REPO = Path(__file__).resolve().parent.parent


# --- data and a tiny classifier with a real signal -----------------------------------------------------

def quadrant_images(count, size=32, seed=0):
    """Class k = a bright square in quadrant k on a noisy background."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.rand(count, 3, size, size, generator=generator) * 0.4 + 0.1
    labels = torch.arange(count) % 4
    half, side = size // 2, size // 4
    for i, label in enumerate(labels.tolist()):
        top, left = (label // 2) * half, (label % 2) * half
        dy, dx = torch.randint(0, half - side + 1, (2,), generator=generator).tolist()
        images[i, :, top + dy: top + dy + side, left + dx: left + dx + side] = 0.95
    return images, labels


@pytest.fixture(scope="module")
def trained_cnn():
    bundle = tiny_cnn("tiny-quadrant")
    images, labels = quadrant_images(128)
    optimizer = torch.optim.Adam(bundle.network.parameters(), lr=1e-2)
    bundle.network.train()
    for step in range(30):
        index = torch.arange(step * 32, step * 32 + 32) % 128
        loss = F.cross_entropy(bundle(images[index]), labels[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    bundle.network.eval().requires_grad_(False)
    return bundle


# --- the differentiable sort ---------------------------------------------------------------------------

def test_sinkhorn_low_temperature_without_noise_is_the_hard_sort():
    generator = torch.Generator().manual_seed(0)
    scores = torch.stack([torch.randperm(9, generator=generator).float() / 8 for _ in range(3)])
    soft = gumbel_sinkhorn(scores, tau=1e-3, noise=False)
    assert torch.allclose(soft, hard_permutation(scores), atol=1e-4)
    # the highest score holds rank 0
    assert torch.equal(soft[:, 0].argmax(dim=1), scores.argmax(dim=1))


@pytest.mark.parametrize("tau,noise", [(1.0, True), (0.3, True), (0.3, False), (0.1, False)])
def test_sinkhorn_runs_to_its_tolerance_and_is_doubly_stochastic(tau, noise):
    scores = torch.randn(4, 25, generator=torch.Generator().manual_seed(1)) * 3
    info = {}
    soft = gumbel_sinkhorn(scores, tau=tau, noise=noise, generator=torch.Generator().manual_seed(2), info=info)
    assert (soft >= 0).all()
    assert torch.allclose(soft.sum(dim=-1), torch.ones(4, 25), atol=1e-4)  # every rank holds one cell
    # every cell holds one rank, to the tolerance (the old fixed 30 iterations left 0.57-1.55 at tau 0.3)
    assert info["column_error"] < SINKHORN_TOLERANCE and info["iterations"] <= SINKHORN_MAX_ITERATIONS
    assert float((soft.sum(dim=-2) - 1).abs().max()) < SINKHORN_TOLERANCE
    tight = gumbel_sinkhorn(scores, tau=tau, noise=noise, tolerance=1e-3, max_iterations=5000,
                            generator=torch.Generator().manual_seed(2))
    assert float((tight.sum(dim=-2) - 1).abs().max()) < 1e-3


def test_sort_depends_on_the_ranking_only():
    """Scaling or shifting the scores (the map's gain) changes nothing; the old sort changed with the scale."""
    scores = torch.randn(3, 36, generator=torch.Generator().manual_seed(11))
    for tau in (1.0, 0.3, 0.1):
        base = gumbel_sinkhorn(scores, tau=tau, noise=False)
        for scale, shift in ((8.4, 0.0), (58.0, -20.0), (0.05, 3.0)):
            assert torch.allclose(gumbel_sinkhorn(scores * scale + shift, tau=tau, noise=False), base, atol=1e-5)


def test_gradient_of_the_converged_sort_matches_a_long_unrolled_one():
    """The differentiable tail started from the converged duals gives the gradient of many unrolled steps."""
    scores = torch.randn(2, 16, generator=torch.Generator().manual_seed(12))
    weights = torch.randn(2, 16, 16, generator=torch.Generator().manual_seed(13))
    grads = []
    for iterations in (None, 400):
        s = scores.clone().requires_grad_(True)
        (gumbel_sinkhorn(s, tau=0.5, noise=False, iterations=iterations, tolerance=1e-5, max_iterations=2000)
         * weights).sum().backward()
        grads.append(s.grad)
    assert float((grads[0] - grads[1]).abs().max()) < 0.05 * float(grads[1].abs().max())


def test_sinkhorn_gets_sharper_as_tau_falls():
    scores = torch.linspace(0, 1, 16)[torch.randperm(16, generator=torch.Generator().manual_seed(3))].unsqueeze(0)
    hard = hard_permutation(scores)
    errors = [float((gumbel_sinkhorn(scores, tau=t, noise=False) - hard).abs().max()) for t in (1.0, 0.1, 0.01, 1e-4)]
    assert errors == sorted(errors, reverse=True) and errors[-1] < 1e-3 < errors[0]


def test_soft_topk_masks_known_answers():
    scores = torch.tensor([[0.1, 0.9, 0.5, 0.3]])  # order: cell 1, 2, 3, 0
    masks = soft_topk_masks(hard_permutation(scores), [0.0, 0.25, 0.5, 0.625, 1.0])[0]
    assert torch.allclose(masks[0], torch.zeros(4))
    assert torch.allclose(masks[1], torch.tensor([0.0, 1.0, 0.0, 0.0]))
    assert torch.allclose(masks[2], torch.tensor([0.0, 1.0, 1.0, 0.0]))
    assert torch.allclose(masks[3], torch.tensor([0.0, 1.0, 1.0, 0.5]))  # fractional: half of the third cell
    assert torch.allclose(masks[4], torch.ones(4))


def test_soft_topk_masks_are_monotone_in_p_and_sum_to_p_d():
    scores = torch.randn(3, 36, generator=torch.Generator().manual_seed(4))
    soft = gumbel_sinkhorn(scores, tau=0.5, generator=torch.Generator().manual_seed(5))
    fractions = torch.linspace(0, 1, 23)
    masks = soft_topk_masks(soft, fractions)
    assert (masks[:, 1:] - masks[:, :-1] >= -1e-6).all()
    assert torch.allclose(masks.sum(-1), (fractions * 36).float().expand(3, -1), atol=1e-3)


# --- the objective ---------------------------------------------------------------------------------------

def test_schedules_and_grid_range():
    assert grid_range((224, 224)) == (7, 28)
    assert grid_range((64, 64)) == (2, 8)
    assert tau_at(0, 100) == 1.0 and abs(tau_at(99, 100) - 0.3) < 1e-9 and 0.3 < tau_at(50, 100) < 1.0
    weights = trapezoid_weights(default_fractions())
    assert abs(float(weights.sum()) - 1.0) < 1e-12 and len(weights) == 16


def test_references_and_peak_penalty():
    images = torch.rand(2, 3, 64, 64)
    assert torch.equal(reference_batch(images, "black"), torch.zeros_like(images))
    assert torch.allclose(reference_batch(images, "mean", (0.1, 0.2, 0.3))[:, :, 5, 5], torch.tensor([0.1, 0.2, 0.3]))
    blurred = reference_batch(images, "blur")
    assert blurred.shape == images.shape and blurred.std() < images.std() / 3
    flat, peaked = torch.zeros(1, 32, 32), torch.zeros(1, 32, 32)
    peaked[0, 16, 16] = 10.0
    assert float(peak_penalty(flat)) == 0.0
    assert abs(float(peak_penalty(peaked)) - (10 - 10 / 225) ** 2 / 1024) < 1e-5  # known answer


@pytest.mark.parametrize("fractions", [5, 9])
def test_soft_auc_tends_to_the_hard_engine_auc(trained_cnn, fractions):
    bundle = trained_cnn
    images, _ = quadrant_images(4, seed=7)
    with torch.no_grad():
        targets = bundle(images).argmax(1)
    grid, steps = 4, fractions - 1  # 16 cells of 8 x 8 pixels; p * d whole cells at every fraction
    cells = torch.stack([torch.randperm(16, generator=torch.Generator().manual_seed(i)).float() / 15 for i in range(4)])
    maps = F.interpolate(cells.view(4, 1, grid, grid), size=(32, 32), mode="nearest")[:, 0]
    hard = deletion_insertion(bundle, images, maps, targets, steps=steps, reference="mean")
    refs = reference_batch(images, "mean", bundle.reference_color)
    errors = []
    for tau in (3.0, 0.3, 1e-4):
        with torch.no_grad():
            soft = soft_curves(bundle, images, maps, targets, refs, grid=grid, tau=tau, fractions=np.linspace(0, 1, fractions),
                               noise=False, smooth_sigma=0.0)
        errors.append(max(np.abs(soft.deletion_auc.numpy() - hard.deletion_auc).max(),
                          np.abs(soft.insertion_auc.numpy() - hard.insertion_auc).max()))
        if tau == 1e-4:
            np.testing.assert_allclose(soft.deletion.numpy(), hard.deletion, atol=1e-4)
            np.testing.assert_allclose(soft.insertion.numpy(), hard.insertion, atol=1e-4)
    assert errors[-1] < 1e-4 and errors[0] > errors[-1]


def test_fraction_subsampling_is_unbiased(trained_cnn):
    bundle = trained_cnn
    images, _ = quadrant_images(2, seed=8)
    maps = torch.rand(2, 32, 32, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([0, 1])
    refs = reference_batch(images, "mean", bundle.reference_color)
    import random

    with torch.no_grad():
        full = soft_curves(bundle, images, maps, targets, refs, grid=4, tau=0.3, noise=False)
        endpoints = (full.deletion[:, 0], full.deletion[:, -1])
        rng = random.Random(0)
        estimates = [soft_curves(bundle, images, maps, targets, refs, grid=4, tau=0.3, noise=False,
                                 fraction_samples=4, rng=rng, endpoint_probs=endpoints).deletion_auc for _ in range(30)]
    assert torch.allclose(torch.stack(estimates).mean(0), full.deletion_auc, atol=0.03)


def _explainer_batch(bundle, count: int, seed: int):
    """A fresh tiny explainer and one encoded batch: (explainer, images, encoded, top-1 targets, mean references)."""
    torch.manual_seed(0)
    explainer = AHAExplainer(bundle, width=16, embed_dim=16)
    images, _ = quadrant_images(count, seed=seed)
    encoded = explainer.encode(images)
    return explainer, images, encoded, encoded.logits.argmax(1), reference_batch(images, "mean", bundle.reference_color)


def test_loss_decreases_on_a_tiny_model(trained_cnn):
    bundle = trained_cnn
    explainer, images, encoded, targets, refs = _explainer_batch(bundle, 4, seed=9)
    optimizer = torch.optim.Adam(explainer.parameters(), lr=3e-3)
    losses = []
    for _ in range(12):
        maps = explainer(encoded, targets)
        terms = aha_loss(bundle, images, maps, targets, refs, grid=8, tau=0.3, noise=False, fractions=np.linspace(0, 1, 6))
        optimizer.zero_grad()
        terms.loss.backward()
        optimizer.step()
        losses.append(float(terms.loss.detach()))
    assert losses[-1] < losses[0] - 0.02, losses
    assert bundle.network.layer1[0].conv1.weight.grad is None  # the classifier stays frozen


def test_deletion_weight_scales_only_the_deletion_term(trained_cnn):
    bundle = trained_cnn
    explainer, images, encoded, targets, refs = _explainer_batch(bundle, 3, seed=4)
    maps = explainer(encoded, targets).detach()
    kwargs = dict(grid=8, tau=0.3, noise=False, fractions=np.linspace(0, 1, 6), reduce=False)
    plain = aha_loss(bundle, images, maps, targets, refs, **kwargs)
    weighted = aha_loss(bundle, images, maps, targets, refs, deletion_weight=2.5, **kwargs)
    assert torch.allclose(weighted.deletion_auc, plain.deletion_auc) and torch.allclose(weighted.insertion_auc,
                                                                                           plain.insertion_auc)
    assert torch.allclose(weighted.loss - plain.loss, 1.5 * plain.deletion_auc, atol=1e-6)
    assert float(plain.deletion_auc.min()) > 0  # so the check above is not 0 == 0


# --- the explainer network -------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [tiny_cnn, tiny_vit])
def test_explainer_shares_the_classifier_pass_and_is_class_conditional(make):
    bundle = make()
    explainer = AHAExplainer(bundle, width=16, embed_dim=16)
    images = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    logits, maps, targets = explainer.predict_and_explain(images)
    with torch.no_grad():
        assert torch.allclose(logits, bundle(images), atol=1e-5)
    assert maps.shape == (3, 32, 32) and torch.equal(targets, logits.argmax(1))
    if explainer.prior == "rollout":  # a class-agnostic prior: the untrained map is the same for every class
        with torch.no_grad():
            assert torch.equal(explainer(images, torch.zeros(3, dtype=torch.long)),
                               explainer(images, torch.ones(3, dtype=torch.long)))
        torch.nn.init.normal_(explainer.films[-1].weight, std=0.5)  # as after training: FiLM carries the class
        torch.nn.init.normal_(explainer.head.conv2.weight, std=0.5)
    with torch.no_grad():
        first = explainer(images, torch.zeros(3, dtype=torch.long))
        second = explainer(images, torch.ones(3, dtype=torch.long))
    assert (first - second).abs().max() > 1e-3
    assert explainer.num_parameters() < 1_000_000


def test_the_returned_map_is_standardised_with_the_raw_maps_ranking():
    """The raw map's offset is arbitrary (the loss reads ranks); the returned one has mean 0 and unit spread per
    image, so its sign means above / below this image's mean importance, and ranks exactly as the raw map."""
    from explainers.aha.network import standardise
    from explainers.metrics import pixel_ranks

    bundle = tiny_cnn()
    explainer = AHAExplainer(bundle, width=16, embed_dim=16)
    torch.nn.init.normal_(explainer.head.conv2.weight, std=0.5)
    with torch.no_grad():
        explainer.head.conv2.bias.fill_(3.0)  # a raw map that is positive almost everywhere
    images = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    _, maps, targets = explainer.predict_and_explain(images)
    with torch.no_grad():
        raw = explainer(images, targets)
    assert float((raw > 0).float().mean()) > 0.9 and 0.2 < float((maps > 0).float().mean()) < 0.8
    flat = maps.flatten(1)
    assert torch.allclose(flat.mean(1), torch.zeros(3), atol=1e-5)
    assert torch.allclose(flat.std(1, unbiased=False), torch.ones(3), atol=1e-4)
    assert torch.equal(pixel_ranks(maps), pixel_ranks(raw))
    assert torch.equal(standardise(torch.ones(1, 4, 4)), torch.zeros(1, 4, 4))  # a flat map stays flat


def test_priors_cam_for_pooled_networks_rollout_for_class_token_vits():
    from explainers.methods import get_method
    from scipy.stats import spearmanr

    cnn, vit = tiny_cnn(), tiny_vit()
    assert AHAExplainer(cnn, width=8, embed_dim=8).prior == "cam"
    explainer = AHAExplainer(vit, width=8, embed_dim=8)
    assert explainer.prior == "rollout" and "cam_proj" in dict(explainer.named_modules())
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        untrained = explainer(images, torch.zeros(2, dtype=torch.long))
    rollout = get_method("rollout").attribute(vit, images, torch.zeros(2, dtype=torch.long))
    for a, b in zip(untrained, rollout):  # the untrained explainer is rollout (same ranking)
        assert spearmanr(a.flatten().numpy(), b.flatten().numpy())[0] > 0.95
    assert AHAExplainer(vit, width=8, embed_dim=8, prior="none").prior == "none"


def test_class_embedding_reaches_the_map_without_the_cam_skip():
    bundle = tiny_cnn()
    torch.manual_seed(0)
    explainer = AHAExplainer(bundle, width=16, embed_dim=16, use_cam=False, class_embedding="learned")
    with torch.no_grad():
        for film in explainer.films:
            film.weight.normal_(0, 0.5)
        explainer.head.conv2.weight.normal_(0, 0.5)
        images = torch.rand(2, 3, 32, 32)
        a = explainer(images, torch.tensor([0, 0]))
        b = explainer(images, torch.tensor([3, 3]))
    assert (a - b).abs().max() > 1e-4


def test_class_rows_stand_in_for_a_reinitialised_head_exactly():
    """The head-sensitivity training shows the explainer other heads' rows (bench/studies/aha_head_sensitivity.py): on a
    class-token ViT (a class-agnostic prior) the stand-in rows give exactly the map of the re-initialised model."""
    import copy

    from explainers.sanity import parameter_layers, reinitialise

    vit = tiny_vit()
    torch.manual_seed(0)
    explainer = AHAExplainer(vit, width=8, embed_dim=8)
    with torch.no_grad():
        for film in explainer.films:
            film.weight.normal_(0, 0.5)
        explainer.head.conv2.weight.normal_(0, 0.5)
    randomized = copy.copy(vit)
    randomized.network = copy.deepcopy(vit.network)
    name, module = parameter_layers(randomized.network)[0]
    assert module is randomized.network.get_classifier()
    reinitialise(name, module, torch.Generator().manual_seed(5))
    on_randomized = AHAExplainer(randomized, width=8, embed_dim=8)
    on_randomized.load_state_dict(explainer.state_dict())
    images, targets = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 2])
    with torch.no_grad():
        own = explainer(images, targets)
        same_rows = explainer(images, targets, class_rows=vit.network.get_classifier().weight[targets])
        stand_in = explainer(images, targets, class_rows=module.weight[targets])
        direct = on_randomized(images, targets)
    assert torch.allclose(own, same_rows, atol=1e-6)
    assert torch.allclose(stand_in, direct, atol=1e-5)
    assert (stand_in - own).abs().max() > 1e-3  # the rows do reach the map
    with pytest.raises(ValueError, match="class-agnostic prior"):  # a CAM prior reads the real head: refused
        cnn_explainer = AHAExplainer(tiny_cnn(), width=8, embed_dim=8)
        cnn_explainer(images, targets, class_rows=torch.zeros(3, 16))
    table = AHAExplainer(vit, width=8, embed_dim=8, class_embedding="learned")
    with pytest.raises(ValueError, match="head class embedding"):  # a learnt class table would ignore the rows
        table(images, targets, class_rows=module.weight[targets])


@pytest.mark.parametrize("fusion_units", [2, 1])
def test_save_and_load_roundtrip(tmp_path, fusion_units):
    bundle = tiny_vit()
    explainer = AHAExplainer(bundle, width=16, embed_dim=16, fusion_units=fusion_units)
    with torch.no_grad():
        explainer.head.conv2.weight.normal_()
    card = save_explainer(explainer, tmp_path / "aha-tiny-vit", {"base_model": "tiny-vit"})
    loaded = load_explainer(bundle, tmp_path / "aha-tiny-vit")
    images = torch.rand(2, 3, 32, 32)
    targets = torch.tensor([1, 2])
    with torch.no_grad():
        assert torch.allclose(loaded(images, targets), explainer(images, targets))
    assert card["architecture"]["width"] == 16 and (tmp_path / "aha-tiny-vit.json").exists()
    assert card["architecture"]["fusion_units"] == fusion_units and card["architecture"]["scales"] == [1.0, 0.5]


def test_output_blur_is_a_gaussian_of_the_unblurred_map_and_survives_save_and_load(tmp_path):
    from explainers.smoothing import gaussian_smooth

    bundle = tiny_vit()
    torch.manual_seed(0)
    sharp = AHAExplainer(bundle, width=16, embed_dim=16)
    with torch.no_grad():
        sharp.head.conv2.weight.normal_()
    blurred = AHAExplainer(bundle, width=16, embed_dim=16, output_blur=2.0)
    blurred.load_state_dict(sharp.state_dict())  # no new parameter: the same weights fit
    images, targets = torch.rand(2, 3, 32, 32), torch.tensor([1, 2])
    with torch.no_grad():
        a, b = sharp(images, targets), blurred(images, targets)
        assert torch.allclose(b, gaussian_smooth(a.unsqueeze(1), 2.0).squeeze(1), atol=1e-6)
        assert (a - b).abs().max() > 1e-3  # the blur did something
        card = save_explainer(blurred, tmp_path / "aha-tiny-vit", {"base_model": "tiny-vit"})
        assert card["architecture"]["output_blur"] == 2.0
        assert torch.allclose(load_explainer(bundle, tmp_path / "aha-tiny-vit")(images, targets), b)
    with pytest.raises(ValueError, match="output_blur"):
        AHAExplainer(bundle, width=16, embed_dim=16, output_blur=-1)


def test_the_method_can_override_the_cards_output_blur_for_one_call():
    """`aha:output_blur=S` measures a card's blur against another in one evaluation; the shared explainer is
    not changed, and the per-image mode (no explainer, so no blur) refuses the option."""
    from explainers.aha.network import standardise
    from explainers.methods import get_method
    from explainers.smoothing import gaussian_smooth

    forget_explainers()
    bundle = tiny_cnn("blur-override")
    torch.manual_seed(0)
    explainer = AHAExplainer(bundle, width=16, embed_dim=16, output_blur=3.0)
    with torch.no_grad():
        explainer.head.conv2.weight.normal_()
    register_explainer(bundle, explainer)
    images, targets = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(2)), torch.tensor([0, 1])
    with torch.no_grad():
        raw = explainer(images, targets, output_blur=0)
    card_blur = get_method("aha")
    assert torch.allclose(card_blur.attribute(bundle, images, targets),
                          standardise(gaussian_smooth(raw.unsqueeze(1), 3.0).squeeze(1)), atol=1e-5)
    assert card_blur.resolved_options["output_blur"] == 3.0 and "output_blur" not in card_blur.options
    none = get_method("aha", output_blur=0)
    assert torch.allclose(none.attribute(bundle, images, targets), standardise(raw), atol=1e-5)
    assert none.options["output_blur"] == 0.0 == none.resolved_options["output_blur"]
    assert explainer.output_blur == 3.0  # the shared explainer kept its card's blur
    with pytest.raises(ValueError, match="output_blur"):
        get_method("aha", output_blur=100)
    from explainers.methods import MethodNotApplicable

    with pytest.raises(MethodNotApplicable, match="no trained explainer"):  # refused before any model pass ...
        get_method("aha", mode="per-image", output_blur=2).check(bundle)
    with pytest.raises(MethodNotApplicable, match="no trained explainer"):  # ... and by a direct call
        get_method("aha", mode="per-image", output_blur=2).attribute(bundle, images, targets)
    forget_explainers()


def test_output_blur_rule_takes_only_a_gain_beyond_chance():
    from explainers.aha_training.output_blur import summarise

    rng = np.random.default_rng(0)
    deletion = rng.uniform(0.1, 0.3, 40)
    insertion = rng.uniform(0.5, 0.7, 40)
    steady = {0.0: {"deletion": deletion, "insertion": insertion},
              2.0: {"deletion": deletion - 0.02, "insertion": insertion + 0.01},  # better on every image
              4.0: {"deletion": deletion - 0.01, "insertion": insertion}}
    rows, chosen = summarise(steady)
    assert chosen == 2.0 and rows[1]["ins_minus_del_vs_no_blur"]["mean"] == pytest.approx(0.03, abs=1e-5)
    noisy = {0.0: steady[0.0], 8.0: {"deletion": deletion, "insertion": insertion + rng.normal(0.005, 0.1, 40)}}
    rows, chosen = summarise(noisy)
    assert rows[1]["ins_minus_del"] > rows[0]["ins_minus_del"]  # a higher mean ...
    assert rows[1]["ins_minus_del_vs_no_blur"]["ci95"][0] < 0 and chosen == 0.0  # ... that is noise: no blur


def test_output_blur_rule_with_a_baseline_takes_the_best_sigma_ahead_of_it_on_both_curves():
    from explainers.aha_training.output_blur import summarise

    rng = np.random.default_rng(1)
    deletion = rng.uniform(0.1, 0.3, 40)
    insertion = rng.uniform(0.5, 0.7, 40)
    # the blur trades insertion for deletion: no blur loses on deletion, 8 px on insertion, 2 and 4 px win on both
    scores = {0.0: {"deletion": deletion + 0.01, "insertion": insertion + 0.02},
              2.0: {"deletion": deletion - 0.001, "insertion": insertion + 0.016},  # more ins-del, a thin lead
              4.0: {"deletion": deletion - 0.005, "insertion": insertion + 0.01},
              8.0: {"deletion": deletion - 0.03, "insertion": insertion - 0.005}}
    peer = {"deletion": deletion, "insertion": insertion}
    rows, chosen = summarise(scores, peer)
    assert chosen == 4.0  # not 8 (the best ins-del, behind on insertion), not 0 (behind on deletion), not 2 (thin)
    assert summarise(scores)[1] == 8.0  # without a baseline: the significant ins-del gain
    behind = {"deletion": deletion - 0.1, "insertion": insertion + 0.1}  # ahead of every sigma: the old rule
    assert summarise(scores, behind)[1] == summarise(scores)[1]


def test_output_blur_selection_measures_every_sigma_and_writes_only_the_card(tmp_path, trained_cnn):
    from explainers.aha_training.output_blur import select_output_blur

    torch.manual_seed(0)
    explainer = AHAExplainer(trained_cnn, width=16, embed_dim=16)
    with torch.no_grad():
        explainer.head.conv2.weight.normal_()
    stem = tmp_path / "aha-tiny-quadrant"
    save_explainer(explainer, stem, {"base_model": trained_cnn.name, "held_out": {"images": 4}})
    weights_before = (tmp_path / "aha-tiny-quadrant.safetensors").read_bytes()
    val = write_folder(tmp_path / "val", count=6, seed=3)
    dry = select_output_blur(bundle=trained_cnn, stem=stem, val_data=str(val), sigmas=[2, 4], apply=False)
    assert [row["sigma_px"] for row in dry["rows"]] == [0.0, 2.0, 4.0]  # no blur is always a candidate
    assert "output_blur_selection" not in json.loads((tmp_path / "aha-tiny-quadrant.json").read_text())
    significant = [r for r in dry["rows"][1:] if r["ins_minus_del_vs_no_blur"]["ci95"][0] > 0]
    expected = max(significant, key=lambda r: r["ins_minus_del"])["sigma_px"] if significant else 0.0
    assert dry["chosen_sigma_px"] == expected and dry["images"] == 6
    against = select_output_blur(bundle=trained_cnn, stem=stem, val_data=str(val), sigmas=[2, 4], apply=False,
                                 baseline="gradcam")
    peer = against["baseline"]
    assert peer["method"] == "gradcam" and 0 <= peer["deletion_auc"] <= 1 and "gradcam" in against["rule"]
    ahead = [r for r in against["rows"] if r["deletion_auc"] < peer["deletion_auc"]
             and r["insertion_auc"] > peer["insertion_auc"]]
    if ahead:
        lead = [min(peer["deletion_auc"] - r["deletion_auc"], r["insertion_auc"] - peer["insertion_auc"]) for r in ahead]
        assert against["chosen_sigma_px"] == ahead[int(np.argmax(lead))]["sigma_px"]
    else:
        assert against["chosen_sigma_px"] == dry["chosen_sigma_px"]
    for row in dry["rows"][1:]:
        diff = row["ins_minus_del_vs_no_blur"]["mean"]
        assert abs(diff - (row["ins_minus_del"] - dry["rows"][0]["ins_minus_del"])) < 2e-5
    chosen = select_output_blur(bundle=trained_cnn, stem=stem, val_data=str(val), sigmas=[2, 4])
    card = json.loads((tmp_path / "aha-tiny-quadrant.json").read_text())
    assert card["architecture"]["output_blur"] == chosen["chosen_sigma_px"] == dry["chosen_sigma_px"]
    assert card["held_out"]["output_blur_px"] == 0.0  # those figures predate the choice, and say so
    assert (tmp_path / "aha-tiny-quadrant.safetensors").read_bytes() == weights_before
    assert load_explainer(trained_cnn, stem).output_blur == chosen["chosen_sigma_px"]
    with pytest.raises(ValueError, match="held-out"):
        select_output_blur(bundle=trained_cnn, stem=stem, sigmas=[2])  # no --val-data and none in the card


# --- the method and refinement -----------------------------------------------------------------------------

def test_method_without_explainer_says_how_to_train_one():
    from explainers.methods import MethodNotApplicable, get_method

    forget_explainers()
    bundle = tiny_cnn("no-explainer-here")
    with pytest.raises(MethodNotApplicable, match="train-aha --model no-explainer-here"):
        get_method("aha", mode="trained").check(bundle)
    with pytest.raises(ValueError, match="between 0 and 10"):
        get_method("aha", refine_steps=11)
    with pytest.raises(ValueError, match="mode must be one of"):
        get_method("aha", mode="fast")
    assert "per-image optimisation" in type(get_method("aha")).menu_note(bundle)


def test_per_image_mode_runs_without_an_explainer_and_improves_on_its_prior(trained_cnn):
    """No trained explainer: `aha` optimises the objective for the image from Grad-CAM, says so, and the hard
    deletion/insertion of its maps beat the prior's."""
    from explainers.methods import get_method

    forget_explainers()
    bundle = trained_cnn
    images, _ = quadrant_images(6, seed=21)
    with torch.no_grad():
        targets = bundle(images).argmax(1)
    flags = [p.requires_grad for p in bundle.network.parameters()]
    method = get_method("aha", per_image_steps=15)
    method.check(bundle)
    calls = []
    maps = method.attribute(bundle, images, targets, progress=lambda done, total: calls.append((done, total)))
    assert method.resolved_options["mode"] == "per-image" and method.resolved_options["prior"] == "gradcam"
    assert calls[-1] == (15, 15) and len(calls) == 15
    assert maps.shape == (6, 32, 32) and torch.isfinite(maps).all()
    assert [p.requires_grad for p in bundle.network.parameters()] == flags  # the classifier is untouched
    prior = get_method("gradcam").attribute(bundle, images, targets)
    ours = deletion_insertion(bundle, images, maps, targets, steps=16, reference="mean")
    theirs = deletion_insertion(bundle, images, prior, targets, steps=16, reference="mean")
    gain = (ours.insertion_auc - ours.deletion_auc).mean() - (theirs.insertion_auc - theirs.deletion_auc).mean()
    assert gain > 0.01, gain


def test_per_image_mode_optimises_a_large_batch_in_chunks_with_the_same_result(trained_cnn, monkeypatch):
    """A batch too large for one pass (its perturbed copies would not fit in memory) is optimised in chunks;
    each image's correction is independent, so the maps, the progress and the loss history are those of one
    pass."""
    from explainers.aha import per_image

    bundle = trained_cnn
    images, _ = quadrant_images(5, seed=4)
    targets = torch.tensor([0, 1, 2, 3, 0])
    prior = torch.rand(5, 32, 32, generator=torch.Generator().manual_seed(1))
    whole_history, whole = [], per_image.optimise_maps(bundle, images, targets, steps=3, prior_maps=prior,
                                                      history=[] if False else None)
    whole_history = []
    whole = per_image.optimise_maps(bundle, images, targets, steps=3, prior_maps=prior, history=whole_history)
    passes = []
    original = per_image.aha_loss

    def counting_loss(classify, chunk, *args, **kwargs):
        passes.append(chunk.shape[0])
        return original(classify, chunk, *args, **kwargs)

    monkeypatch.setattr(per_image, "aha_loss", counting_loss)
    monkeypatch.setattr(per_image, "PER_IMAGE_PIXELS_PER_PASS", 2 * 14 * 32 * 32 * 2)  # two images per pass
    calls, chunked_history = [], []
    chunked = per_image.optimise_maps(bundle, images, targets, steps=3, prior_maps=prior, history=chunked_history,
                                      progress=lambda done, total: calls.append((done, total)))
    assert passes == [2, 2, 2, 2, 2, 2, 1, 1, 1]  # 3 chunks (2, 2, 1 images) x 3 steps
    assert calls[-1] == (9, 9) and [done for done, _ in calls] == list(range(1, 10))
    # equal up to float rounding, which Adam's first steps amplify where a gradient is ~0 (lr * sign)
    assert len(chunked_history) == 3 and all(len(row) == 5 for row in chunked_history)
    assert torch.allclose(torch.tensor(chunked_history), torch.tensor(whole_history), atol=1e-2)
    correlation = torch.corrcoef(torch.stack([chunked.flatten(), whole.flatten()]))[0, 1]
    assert correlation > 0.999, correlation


def test_refinement_restores_weights_and_is_thread_safe(trained_cnn):
    from explainers.methods import get_method

    bundle = trained_cnn
    torch.manual_seed(0)
    explainer = register_explainer(bundle, AHAExplainer(bundle, width=16, embed_dim=16))
    before = {k: v.clone() for k, v in explainer.state_dict().items()}
    images, _ = quadrant_images(2, seed=11)
    targets = torch.tensor([0, 3])
    single = get_method("aha").attribute(bundle, images, targets)
    history = []
    refined = refine_maps(explainer, images, targets, steps=3, history=history)
    assert all(torch.equal(before[k], v) for k, v in explainer.state_dict().items())
    assert (refined - single).abs().max() > 1e-4
    print("refinement traces", history)
    assert all(trace[-1] < trace[0] for trace in history), history
    method = get_method("aha", refine_steps=3)
    sequential = [method.attribute(bundle, images[i:i + 1], targets[i:i + 1]) for i in range(2)]
    results, errors = [None, None], []

    def work(i):
        try:
            for _ in range(2):
                results[i] = method.attribute(bundle, images[i:i + 1], targets[i:i + 1])
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for i in range(2):
        assert torch.allclose(results[i], sequential[i], atol=1e-5)
    assert all(torch.equal(before[k], v) for k, v in explainer.state_dict().items())
    forget_explainers()


def test_refinement_takes_the_settings_its_card_names_and_says_so(trained_cnn, monkeypatch):
    from explainers.aha.per_image import optimise_maps
    from explainers.methods import aha as aha_module
    from explainers.methods import get_method

    bundle = trained_cnn
    torch.manual_seed(0)
    explainer = register_explainer(bundle, AHAExplainer(bundle, width=16, embed_dim=16))
    images, _ = quadrant_images(2, seed=12)
    targets = torch.tensor([1, 2])
    calls = []

    def recording(*args, **kwargs):
        calls.append(kwargs)
        return optimise_maps(*args, **kwargs)

    monkeypatch.setattr(aha_module, "optimise_maps", recording)
    explainer.card = {}  # no settings named: the defaults
    method = get_method("aha", refine_steps=2)
    default_maps = method.attribute(bundle, images, targets)
    assert method.resolved_options["refinement"] == {"lr": 0.3, "grid": None, "deletion_weight": 1.0}
    explainer.card = {"refinement": {"lr": 0.5, "grid": 4, "deletion_weight": 2.0}}
    named_maps = method.attribute(bundle, images, targets)
    assert method.resolved_options["refinement"] == {"lr": 0.5, "grid": 4, "deletion_weight": 2.0}
    assert {k: calls[-1][k] for k in ("lr", "grid", "deletion_weight")} == {"lr": 0.5, "grid": 4, "deletion_weight": 2.0}
    assert (named_maps - default_maps).abs().max() > 1e-4  # the settings reach the optimisation
    one_pass = get_method("aha").attribute(bundle, images, targets)
    direct = optimise_maps(bundle, images, targets, steps=2, prior_maps=one_pass, lr=0.5, grid=4, deletion_weight=2.0)
    assert torch.allclose(named_maps, direct, atol=1e-5)
    explicit = get_method("aha", refine_steps=2, refine_lr=0.1)
    explicit.attribute(bundle, images, targets)
    assert explicit.resolved_options["refinement"]["lr"] == 0.1 and calls[-1]["grid"] == 4  # the caller's lr wins
    assert "refine_lr" not in method.options and explicit.options["refine_lr"] == 0.1
    assert method.expected_seconds(bundle) > 0
    with pytest.raises(ValueError, match="refine_lr"):
        get_method("aha", refine_lr=0)
    forget_explainers()


# --- training: resume, DDP ------------------------------------------------------------------------------------

def write_folder(root: Path, count=16, size=32, seed=0) -> Path:
    images, labels = quadrant_images(count, size, seed)
    return write_labelled_folder(root, ((f"img_{i}.png", as_uint8(images[i]), int(labels[i])) for i in range(count)))


def test_training_resumes_exactly(tmp_path, trained_cnn):
    from explainers.aha_training.loop import train_aha

    data = write_folder(tmp_path / "train")
    val = write_folder(tmp_path / "val", count=4, seed=1)
    common = dict(bundle=trained_cnn, data=str(data), steps=4, batch_size=4, fractions=5, targets="top1+second",
                  width=16, checkpoint_every=1, progress=False)
    straight = train_aha(out=str(tmp_path / "a" / "aha-x"), val_data=str(val), val_limit=4, **common)
    interrupted = train_aha(out=str(tmp_path / "b" / "aha-x"), time_budget_minutes=0.0, **common)
    assert interrupted["recipe"]["stopped_by_time_budget"] and interrupted["recipe"]["steps"] == 1
    resumed = train_aha(out=str(tmp_path / "b" / "aha-x"), **common)
    assert resumed["recipe"]["steps"] == 4 and not resumed["recipe"]["stopped_by_time_budget"]
    # the card lists both starts of the command: steps 0-1, then 1-4
    segments = resumed["recipe"]["segments"]
    assert [(s["from_step"], s["to_step"]) for s in segments] == [(0, 1), (1, 4)]
    assert all(s["device"] == "cpu" and s["started_utc"] and s["seconds"] >= 0 for s in segments)
    assert [(s["from_step"], s["to_step"]) for s in straight["recipe"]["segments"]] == [(0, 4)]
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "a" / "aha-x.safetensors"))
    b = load_file(str(tmp_path / "b" / "aha-x.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    held = straight["held_out"]
    assert held["images"] == 4 and 0 <= held["aha_deletion_auc"] <= 1 and "random_insertion_auc" in held
    card = json.loads((tmp_path / "a" / "aha-x.json").read_text())
    assert card["base_model"] == "tiny-quadrant" and card["recipe"]["fractions"] == 5


def test_training_can_start_from_an_existing_explainer(tmp_path, trained_cnn):
    """--init: the start explainer's architecture and weights, a new schedule, no output blur; recorded."""
    from safetensors.torch import load_file

    from explainers.aha_training.loop import train_aha

    data = write_folder(tmp_path / "train")
    torch.manual_seed(0)
    start = AHAExplainer(trained_cnn, width=12, embed_dim=16, output_blur=4.0)
    with torch.no_grad():
        start.head.conv2.weight.normal_()
    save_explainer(start, tmp_path / "start" / "aha-x", {"base_model": trained_cnn.name, "exported_step": 7})
    common = dict(bundle=trained_cnn, data=str(data), batch_size=4, fractions=5, checkpoint_every=1, progress=False)
    card = train_aha(out=str(tmp_path / "warm" / "aha-x"), steps=1, lr=1e-12, init=str(tmp_path / "start" / "aha-x"),
                     **common)
    assert card["architecture"]["width"] == 12 and card["architecture"]["output_blur"] == 0.0
    assert card["recipe"]["init_from"]["exported_step"] == 7 and card["recipe"]["init_from"]["its_output_blur_px"] == 4.0
    warm = load_file(str(tmp_path / "warm" / "aha-x.safetensors"))
    before = load_file(str(tmp_path / "start" / "aha-x.safetensors"))
    assert all(torch.allclose(warm[k], before[k], atol=1e-6) for k in before)  # lr ~0: the start's weights
    moved = train_aha(out=str(tmp_path / "moved" / "aha-x"), steps=2, lr=1e-2, init=str(tmp_path / "start" / "aha-x"),
                      **common)
    after = load_file(str(tmp_path / "moved" / "aha-x.safetensors"))
    assert moved["recipe"]["init_from"] is not None and any(not torch.allclose(after[k], before[k]) for k in before)


def test_training_can_require_a_grid_pointing_game_floor(tmp_path, trained_cnn):
    """--val-gridpg-min: every validation also scores val mosaics, only checkpoints at the floor are exported;
    when none reaches it the best by ins-del is, and the card says the floor was not met."""
    from explainers.aha_training.loop import train_aha
    from explainers.aha_training.validation import validation_gridpg, validation_mosaics

    data = write_folder(tmp_path / "train")
    val = write_folder(tmp_path / "val", count=8, seed=1)
    common = dict(bundle=trained_cnn, data=str(data), steps=3, batch_size=4, fractions=5, width=16, checkpoint_every=1,
                  progress=False, val_data=str(val), val_limit=4, val_every=1, val_track=4, val_mosaics=3)
    open_floor = train_aha(out=str(tmp_path / "a" / "aha-x"), val_gridpg_min=0.0, **common)
    shares = [entry["gridpg"] for entry in open_floor["validation"]]
    assert len(shares) == 4 and all(0.0 <= v <= 1.0 for v in shares)
    best = max(open_floor["validation"], key=lambda e: e["ins_minus_del"])
    assert open_floor["exported_step"] == best["step"] and open_floor["recipe"]["val_gridpg"]["exported_meets_min"]
    mosaics, classes = validation_mosaics(trained_cnn, str(val), 3)
    assert mosaics.shape == (3, 3, 64, 64) and classes.shape == (3, 4)
    floor = sorted(shares)[-1]  # only the checkpoints with the highest share qualify
    strict = train_aha(out=str(tmp_path / "b" / "aha-x"), val_gridpg_min=floor, **common)
    qualified = [e for e in strict["validation"] if e["gridpg"] >= floor]
    assert strict["exported_step"] == max(qualified, key=lambda e: e["ins_minus_del"])["step"]
    explainer = load_explainer(trained_cnn, tmp_path / "b" / "aha-x")
    assert validation_gridpg(explainer, mosaics, classes) == pytest.approx(floor, abs=1e-4)  # the exported one
    unreachable = train_aha(out=str(tmp_path / "d" / "aha-x"), val_gridpg_min=min(1.0, floor + 0.01), **common)
    if all(e["gridpg"] < min(1.0, floor + 0.01) for e in unreachable["validation"]):  # (as with this seed)
        assert not unreachable["recipe"]["val_gridpg"]["exported_meets_min"]
        assert unreachable["exported_step"] == max(unreachable["validation"], key=lambda e: e["ins_minus_del"])["step"]
    with pytest.raises(ValueError, match="val-gridpg-min needs"):
        train_aha(out=str(tmp_path / "c" / "aha-x"), **{**common, "val_every": 0}, val_gridpg_min=0.5)


def write_tiny_model(weights: Path, name: str, size=32):
    from safetensors.torch import save_file

    weights.mkdir(parents=True, exist_ok=True)
    bundle = tiny_cnn(name, size=size)
    save_file({k: v.contiguous() for k, v in bundle.network.state_dict().items()}, str(weights / f"{name}.safetensors"))
    card = {"kind": "classifier", "name": name, "timm_name": "resnet18",
            "timm_kwargs": {"num_classes": 4, "channels": [8, 16, 16, 16], "output_stride": 8},
            "weights_file": f"{name}.safetensors", "input_size": [size, size], "mean": [0.5] * 3, "std": [0.25] * 3,
            "reference_color": [0.5] * 3, "class_names": ["a", "b", "c", "d"]}
    (weights / f"{name}.json").write_text(json.dumps(card))



def test_ddp_two_processes_gloo_end_with_identical_weights(tmp_path):
    weights = tmp_path / "weights"
    write_tiny_model(weights, "tiny-ddp")
    data = write_folder(tmp_path / "train", count=16)
    env = dict(os.environ, SALIENCY_WEIGHTS_DIR=str(weights), OMP_NUM_THREADS="1", PYTHONPATH=str(REPO),
               CUDA_VISIBLE_DEVICES="")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(free_port()), "-m", "explainers", "train-aha", "--model", "tiny-ddp", "--data", str(data),
               "--out", str(weights / "aha-tiny-ddp"), "--steps", "3", "--batch-size", "8", "--fractions", "4",
               "--width", "16", "--checkpoint-every", "1"]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    card = json.loads((weights / "aha-tiny-ddp.json").read_text())
    assert card["recipe"]["world_size"] == 2 and card["recipe"]["batch_size_global"] == 8
    assert card["ddp_replicas_identical"] is True and card["recipe"]["steps"] == 3
    assert (weights / "aha-tiny-ddp.ckpt").exists()


def test_validation_plot_draws_every_series(tmp_path):
    import numpy as np
    from PIL import Image

    from explainers.aha_training.plot import SERIES, validation_plot

    points = [{"step": s, "deletion_auc": 0.3 - s / 1000, "insertion_auc": 0.5 + s / 1000,
               "ins_minus_del": 0.2 + s / 500} for s in (0, 40, 80)]
    path = validation_plot(points, tmp_path / "v.png", exported_step=80)
    pixels = np.asarray(Image.open(path).convert("RGB")).reshape(-1, 3)
    for _, _, colour in SERIES:
        assert (pixels == np.array(colour)).all(axis=1).sum() > 50  # each line is drawn
    with pytest.raises(ValueError):
        validation_plot([], tmp_path / "none.png")


def test_mosaic_batch_puts_four_cells_in_quadrants_and_names_one_label():
    from explainers.aha_training.data import mosaic_batch

    cells = torch.arange(9, dtype=torch.float32).view(9, 1, 1, 1).expand(9, 3, 2, 2).contiguous()
    labels = torch.tensor([10, 11, 12, 13, 20, 21, 22, 23, 99])
    mosaics, chosen = mosaic_batch(cells, labels, torch.Generator().manual_seed(0))
    assert mosaics.shape == (2, 3, 4, 4)  # the ninth cell is left out
    assert mosaics[0, 0, 0, 0] == 0 and mosaics[0, 0, 0, 3] == 1 and mosaics[0, 0, 3, 0] == 2 and mosaics[0, 0, 3, 3] == 3
    assert mosaics[1, 0, 0, 0] == 4 and mosaics[1, 0, 3, 3] == 7
    assert chosen[0].item() in (10, 11, 12, 13) and chosen[1].item() in (20, 21, 22, 23)
