import numpy as np
import pytest
import torch

from explainers.methods import get_method
from explainers.metrics import (Curves, deletion_insertion, fraction_counts, pixel_ranks, pointing_game,
                                randomization_sanity_check, reference_images, spearman, top_pixel_iou,
                                trapezoid_auc)

from conftest import quadrant_bundle, tiny_cnn, tiny_vit


def naive_curves(bundle, images, maps, targets, steps, reference):
    """An independent, straightforward implementation: one forward pass per image and step."""
    b, _, h, w = images.shape
    fractions = np.linspace(0, 1, steps + 1)
    base = reference_images(images, reference, bundle.reference_color)
    deletion = np.zeros((b, steps + 1))
    insertion = np.zeros((b, steps + 1))
    for i in range(b):
        ranks = pixel_ranks(maps[i:i + 1])[0]
        for k, p in enumerate(fractions):
            top = (ranks < int(round(p * h * w))).view(1, 1, h, w).float()
            with torch.no_grad():
                deleted = bundle(images[i:i + 1] * (1 - top) + base[i:i + 1] * top).softmax(1)[0, targets[i]]
                inserted = bundle(base[i:i + 1] * (1 - top) + images[i:i + 1] * top).softmax(1)[0, targets[i]]
            deletion[i, k], insertion[i, k] = float(deleted), float(inserted)
    return deletion, insertion


@pytest.mark.parametrize("reference", ["mean", "black", "blur"])
@pytest.mark.parametrize("make", [tiny_cnn, tiny_vit])
def test_batched_engine_matches_one_pass_per_step(make, reference, images):
    bundle = make()
    maps = torch.rand(3, 32, 32, generator=torch.Generator().manual_seed(5))
    targets = torch.tensor([0, 1, 3])
    curves = deletion_insertion(bundle, images, maps, targets, steps=10, reference=reference, batch_size=7)
    deletion, insertion = naive_curves(bundle, images, maps, targets, 10, reference)
    assert np.abs(curves.deletion - deletion).max() <= 1e-6
    assert np.abs(curves.insertion - insertion).max() <= 1e-6
    # end points: nothing deleted = the model's own score; everything inserted = the same
    with torch.no_grad():
        own = bundle(images).softmax(1)[torch.arange(3), targets].numpy()
    assert np.allclose(curves.deletion[:, 0], own, atol=1e-6)
    assert np.allclose(curves.insertion[:, -1], own, atol=1e-6)


def test_trapezoid_known_answers():
    fractions = np.linspace(0, 1, 21)
    assert trapezoid_auc(np.ones((1, 21)), fractions)[0] == pytest.approx(1.0)
    assert trapezoid_auc(fractions[None], fractions)[0] == pytest.approx(0.5)
    assert trapezoid_auc(np.array([[1.0, 0.0]]), np.array([0.0, 1.0]))[0] == pytest.approx(0.5)


def test_fraction_counts_cover_all_pixels():
    fractions, counts = fraction_counts(20, 1000)
    assert len(fractions) == 21 and counts[0] == 0 and counts[-1] == 1000
    assert np.all(np.diff(counts.numpy()) > 0)


def test_quadrant_model_known_answer():
    bundle = quadrant_bundle()
    # bright top-left quadrant, darker-than-mean texture elsewhere (which the model ignores)
    image = 0.5 * torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    image[..., :16, :16] = 1.0
    target = torch.tensor([0])
    maps = get_method("gradcam").attribute(bundle, image, target)
    # Grad-CAM sees only the top-left quadrant
    assert maps[0, :16, :16].min() > 0.99 and maps[0, 16:, :].max() == 0 and maps[0, :, 16:].max() == 0
    curves = deletion_insertion(bundle, image, maps, target, steps=20, reference="mean")
    # deletion: after 25% of the pixels (the quadrant) are gone the class is at chance and stays there
    assert curves.deletion[0, 0] > 0.99
    assert np.allclose(curves.deletion[0, 5:], 0.5, atol=1e-6)
    assert np.all(np.diff(curves.deletion[0, :6]) <= 0) and curves.deletion[0, 4] > 0.9
    # insertion: the quadrant restored = full confidence from 25% on
    assert np.allclose(curves.insertion[0, 5:], curves.insertion[0, -1], atol=1e-6)
    # a map pointing at the wrong quadrant deletes nothing that matters until the end
    wrong = torch.zeros(1, 32, 32)
    wrong[0, 16:, 16:] = 1
    worse = deletion_insertion(bundle, image, wrong, target)
    assert worse.deletion_auc[0] > curves.deletion_auc[0] + 0.3
    assert worse.insertion_auc[0] < curves.insertion_auc[0] - 0.1


def test_ties_are_broken_deterministically(cnn_bundle, images):
    constant = torch.zeros(3, 32, 32)
    first = deletion_insertion(cnn_bundle, images, constant, [0, 0, 0], steps=5)
    second = deletion_insertion(cnn_bundle, images, constant, [0, 0, 0], steps=5)
    assert np.array_equal(first.deletion, second.deletion)
    ranks = pixel_ranks(constant)
    assert sorted(ranks[0].tolist()) == list(range(32 * 32))
    assert not torch.equal(ranks[0], torch.arange(32 * 32))  # random order, not raster order


def test_average_drop_and_summary():
    curves = Curves(fractions=np.linspace(0, 1, 3), deletion=np.array([[1.0, 0.5, 0.0]]),
                    insertion=np.array([[0.0, 0.4, 0.8]]))
    assert curves.average_drop(0.5)[0] == pytest.approx(50.0)
    summary = curves.summary()
    assert summary["deletion_auc"] == pytest.approx(0.5)
    assert summary["insertion_auc"] == pytest.approx(0.4)
    assert summary["ins_minus_del"] == pytest.approx(-0.1)


def test_pointing_game_and_iou_known_answers():
    maps = torch.zeros(2, 64, 64)
    maps[0, 10, 10] = 1  # inside the mask
    maps[1, 10, 40] = 1  # 20 px right of the mask: outside the 15 px tolerance
    masks = torch.zeros(2, 64, 64, dtype=torch.bool)
    masks[:, 5:15, 5:20] = True
    assert pointing_game(maps, masks).tolist() == [1.0, 0.0]
    maps[1, 10, 40] = 0
    maps[1, 10, 30] = 1  # 10 px away: a hit with tolerance
    assert pointing_game(maps, masks)[1] == 1.0
    perfect = masks.float()
    assert top_pixel_iou(perfect, masks).tolist() == [1.0, 1.0]
    opposite = (~masks).float()
    assert top_pixel_iou(opposite, masks).tolist() == [0.0, 0.0]


def test_unknown_reference_and_bad_shapes(cnn_bundle, images):
    with pytest.raises(ValueError, match="reference"):
        deletion_insertion(cnn_bundle, images, torch.rand(3, 32, 32), [0, 0, 0], reference="white")
    with pytest.raises(ValueError, match="B x H x W"):
        deletion_insertion(cnn_bundle, images, torch.rand(3, 16, 16), [0, 0, 0])


def test_spearman_known_answers():
    a = torch.arange(100.0).view(10, 10)
    assert spearman(a, a) == pytest.approx(1.0)
    assert spearman(a, -a) == pytest.approx(-1.0)


def test_sanity_check_separates_gradcam_from_a_model_independent_map(cnn_bundle, images):
    gradcam = randomization_sanity_check(cnn_bundle, get_method("gradcam"), images, [0, 1, 2], max_layers=4)
    assert len(gradcam) == 4 and min(rho for _, rho in gradcam) < 0.8
    random_map = randomization_sanity_check(cnn_bundle, get_method("random"), images, [0, 1, 2], max_layers=2)
    assert all(rho == pytest.approx(1.0) for _, rho in random_map)  # ignores the model: fails the check
    # the caller's model is untouched
    before = {k: v.clone() for k, v in cnn_bundle.network.state_dict().items()}
    randomization_sanity_check(cnn_bundle, get_method("gradcam"), images, [0, 1, 2], max_layers=1)
    assert all(torch.equal(before[k], v) for k, v in cnn_bundle.network.state_dict().items())
