import numpy as np
import pytest
import torch

from explainers.methods import get_method
from explainers.metrics import (Curves, deletion_insertion, fraction_counts, pixel_ranks, pointing_game,
                                pointing_tolerance, road_fill, road_noise_scale, spearman, top_pixel_iou,
                                trapezoid_auc)
from explainers.models import ModelBundle
from explainers.sanity import randomization_sanity_check

from conftest import QuadrantNet, quadrant_bundle, tiny_cnn, tiny_vit


def naive_reference(image, reference, color):
    """The reference image, written without the engine's helpers (blur: torchvision's Gaussian blur)."""
    if reference == "mean":
        return torch.tensor(color, dtype=image.dtype).view(3, 1, 1) * torch.ones_like(image)
    if reference == "black":
        return torch.zeros_like(image)
    from torchvision.transforms.functional import gaussian_blur

    return gaussian_blur(image, kernel_size=[11, 11], sigma=[5.0, 5.0])


def naive_curves(bundle, images, maps, targets, steps, reference):
    """An independent, straightforward implementation: the map's pixels sorted by value (the maps of these
    tests have no ties), one forward pass per image, curve and step."""
    b, _, h, w = images.shape
    deletion = np.zeros((b, steps + 1))
    insertion = np.zeros((b, steps + 1))
    for i in range(b):
        values = maps[i].flatten().numpy()
        assert len(np.unique(values)) == h * w, "this reference assumes a map without ties"
        order = np.argsort(-values, kind="stable")  # most important first
        base = naive_reference(images[i], reference, bundle.reference_color)
        for k in range(steps + 1):
            count = int(round(k / steps * h * w))
            top = torch.zeros(h * w)
            top[torch.as_tensor(order[:count].copy())] = 1.0
            top = top.view(1, h, w)
            with torch.no_grad():
                deleted = bundle((images[i] * (1 - top) + base * top)[None]).softmax(1)[0, targets[i]]
                inserted = bundle((base * (1 - top) + images[i] * top)[None]).softmax(1)[0, targets[i]]
            deletion[i, k], insertion[i, k] = float(deleted), float(inserted)
    return deletion, insertion


class ForwardCounter:
    """Counts the network's forward passes and the images each one sees."""

    def __init__(self, network):
        self.sizes = []
        self.handle = network.register_forward_hook(lambda module, inputs, output: self.sizes.append(len(inputs[0])))


def test_engine_batches_every_curve_point_into_few_forward_passes(cnn_bundle, images):
    counter = ForwardCounter(cnn_bundle.network)
    deletion_insertion(cnn_bundle, images, torch.rand(3, 32, 32), [0, 1, 2], steps=10, batch_size=7)
    # 3 images x 2 curves x 11 points = 66 perturbed images, 7 per pass: 10 passes, each image once
    assert counter.sizes == [7] * 9 + [3]
    counter.sizes.clear()
    deletion_insertion(cnn_bundle, images, torch.rand(3, 32, 32), [0, 1, 2], steps=10)  # default batch 256
    assert counter.sizes == [66]
    counter.handle.remove()


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
    assert pointing_game(maps, masks, tolerance=15).tolist() == [1.0, 0.0]
    maps[1, 10, 40] = 0
    maps[1, 10, 30] = 1  # 10 px away: a hit with TorchRay's 15 px ...
    assert pointing_game(maps, masks, tolerance=15)[1] == 1.0
    assert pointing_game(maps, masks)[1] == 0.0  # ... but not with 15 px scaled to 64 px (4 px)
    maps[1, 10, 30] = 0
    maps[1, 10, 23] = 1  # 3 px away: a hit at 64 px
    assert pointing_game(maps, masks)[1] == 1.0
    perfect = masks.float()
    assert top_pixel_iou(perfect, masks).tolist() == [1.0, 1.0]
    opposite = (~masks).float()
    assert top_pixel_iou(opposite, masks).tolist() == [0.0, 0.0]


def test_pointing_tolerance_scales_with_image_size():
    assert pointing_tolerance((224, 224)) == 15  # TorchRay's value at its image size
    assert pointing_tolerance((64, 64)) == 4 and pointing_tolerance((128, 128)) == 9
    assert pointing_tolerance((64, 300)) == 4 and pointing_tolerance((8, 8)) == 1


def test_unknown_reference_and_bad_shapes(cnn_bundle, images):
    with pytest.raises(ValueError, match="reference"):
        deletion_insertion(cnn_bundle, images, torch.rand(3, 32, 32), [0, 0, 0], reference="white")
    with pytest.raises(ValueError, match="B x H x W"):
        deletion_insertion(cnn_bundle, images, torch.rand(3, 16, 16), [0, 0, 0])


def test_spearman_known_answers():
    a = torch.arange(100.0).view(10, 10)
    assert spearman(a, a) == pytest.approx(1.0)
    assert spearman(a, -a) == pytest.approx(-1.0)
    assert spearman(torch.zeros(4, 4), a[:4, :4]) == 0.0  # a constant map has no rank order


def test_spearman_with_ties_agrees_with_scipy():
    from scipy.stats import spearmanr

    generator = torch.Generator().manual_seed(3)
    for zeros, levels in ((0.6, None), (0.3, 4), (0.0, 3)):
        a = torch.rand(32, 32, generator=generator)
        b = torch.rand(32, 32, generator=generator)
        if levels:  # few distinct values: many ties inside each map
            a, b = (a * levels).floor(), (b * levels).floor()
        a[torch.rand(32, 32, generator=generator) < zeros] = 0.0
        b[torch.rand(32, 32, generator=generator) < zeros] = 0.0
        b = torch.where(torch.rand(32, 32, generator=generator) < 0.5, a, b)  # partly related maps
        assert spearman(a, b) == pytest.approx(spearmanr(a.flatten().numpy(), b.flatten().numpy())[0], abs=1e-9)


def test_spearman_reads_no_agreement_in_shared_zeros():
    """Two independent maps with 60% zeros each (a ReLU's zeros) share many tied pixels: a shared tie-break order
    would rank those alike and read agreement (about 0.13 here); averaged ranks read none."""
    generator = torch.Generator().manual_seed(0)
    rhos = []
    for _ in range(20):
        a, b = torch.rand(2, 64, 64, generator=generator)
        rhos.append(spearman(torch.relu(a - 0.6), torch.relu(b - 0.6)))
    assert abs(float(np.mean(rhos))) < 0.02


def test_sanity_check_separates_gradcam_from_a_model_independent_map(cnn_bundle, images):
    gradcam = randomization_sanity_check(cnn_bundle, get_method("gradcam"), images, [0, 1, 2], max_layers=4)
    assert len(gradcam) == 4 and min(rho for _, rho in gradcam) < 0.8
    random_map = randomization_sanity_check(cnn_bundle, get_method("random"), images, [0, 1, 2], max_layers=2)
    assert all(rho == pytest.approx(1.0) for _, rho in random_map)  # ignores the model: fails the check
    # the caller's model is untouched
    before = {k: v.clone() for k, v in cnn_bundle.network.state_dict().items()}
    randomization_sanity_check(cnn_bundle, get_method("gradcam"), images, [0, 1, 2], max_layers=1)
    assert all(torch.equal(before[k], v) for k, v in cnn_bundle.network.state_dict().items())


def road_case():
    """The quadrant model on an image whose top-left quadrant is a bright, smooth blob on a dark field:
    imputing a removed pixel from its neighbours keeps it bright, painting it the mean colour does not."""
    bundle = quadrant_bundle(scale=6.0)
    generator = torch.Generator().manual_seed(4)
    ys, xs = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")
    blob = torch.exp(-((ys - 7) ** 2 + (xs - 8) ** 2) / 60.0)
    images = torch.stack([(0.25 + 0.7 * blob + 0.05 * torch.rand(32, 32, generator=generator)).expand(3, -1, -1)
                          for _ in range(3)])
    images[2] = images[2].flip(-1)  # the blob leaves the quadrant: another score level
    maps = torch.rand(3, 32, 32, generator=generator) + torch.stack([blob, -blob, blob])
    return bundle, images.contiguous(), maps, torch.tensor([0, 0, 1])


def test_road_agrees_with_pytorch_grad_cam():
    pytest.importorskip("pytorch_grad_cam")
    from pytorch_grad_cam.metrics.road import ROADLeastRelevantFirst, ROADMostRelevantFirst
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputSoftmaxTarget

    bundle, images, maps, targets = road_case()
    torch.manual_seed(0)  # pytorch-grad-cam's imputation noise uses the global generator
    normalized = bundle.normalize(images)
    cams = maps.numpy()
    target_fns = [ClassifierOutputSoftmaxTarget(int(t)) for t in targets]
    # pytorch-grad-cam's curves at 10%, ..., 90%: MoRF at percentile p removes the top (100 - p)% (our
    # deletion at 1 - p/100), LeRF at p removes the bottom (100 - p)%, i.e. keeps the top p% (our insertion)
    percentiles = list(range(10, 100, 10))
    morf = np.stack([ROADMostRelevantFirst(100 - q)(normalized, cams, target_fns, bundle.network, return_diff=False)
                     for q in percentiles], axis=1)
    lerf = np.stack([ROADLeastRelevantFirst(q)(normalized, cams, target_fns, bundle.network, return_diff=False)
                     for q in percentiles], axis=1)
    curves = deletion_insertion(bundle, images, maps, targets, steps=10, reference="road")
    inner = curves.fractions[1:10]
    ours_morf, ours_lerf = curves.deletion[:, 1:10], curves.insertion[:, 1:10]
    assert np.abs(trapezoid_auc(ours_morf, inner) - trapezoid_auc(morf, inner)).max() < 0.01
    assert np.abs(trapezoid_auc(ours_lerf, inner) - trapezoid_auc(lerf, inner)).max() < 0.01
    assert np.abs(ours_morf - morf).max() < 0.05 and np.abs(ours_lerf - lerf).max() < 0.05  # point by point
    with torch.no_grad():
        own = bundle(images).softmax(1)[torch.arange(3), targets].numpy()
    # the check can fail: the mean-colour reference scores these images very differently
    mean_curves = deletion_insertion(bundle, images, maps, targets, steps=10, reference="mean")
    assert np.abs(trapezoid_auc(mean_curves.deletion[:, 1:10], inner) - trapezoid_auc(morf, inner)).max() > 0.05
    # ends: nothing removed = the model's own score
    assert np.allclose(curves.deletion[:, 0], own, atol=1e-6) and np.allclose(curves.insertion[:, -1], own, atol=1e-6)


class Recorder(QuadrantNet):
    """The quadrant model, keeping every normalised input it reads."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, x):
        self.seen.append(x.detach().clone())
        return super().forward(x)


def test_road_noise_is_in_the_models_normalised_units():
    """ROAD's authors and pytorch-grad-cam add N(0, 0.01) to the normalised tensor the model reads: on a flat image
    (where imputation is exact) the removed pixels the model sees differ from the flat value by that noise, whatever
    the model's std."""
    pytest.importorskip("pytorch_grad_cam")
    from pytorch_grad_cam.metrics.road import NoisyLinearImputer

    std = (0.1, 0.25, 0.5)
    network = Recorder().eval()
    bundle = ModelBundle(name="recorder", network=network, mean=(0.5, 0.5, 0.5), std=std, input_size=(32, 32),
                         class_names=["a", "b"], family="cnn", reference_color=(0.5, 0.5, 0.5), cam_layer_name="layer4")
    images = torch.full((1, 3, 32, 32), 0.4)
    maps = torch.rand(1, 32, 32, generator=torch.Generator().manual_seed(1))
    deletion_insertion(bundle, images, maps, [0], steps=2, reference="road", batch_size=64)
    seen = torch.cat(network.seen)  # deletion at p = 0, 0.5, 1, then insertion
    flat = bundle.normalize(images)[0]
    half_removed = seen[1] - flat  # deletion at p = 0.5: noise on the removed half, 0 elsewhere
    removed = half_removed.abs().sum(0) > 0
    assert int(removed.sum()) == 512
    ours = half_removed[:, removed].std(dim=1)
    torch.manual_seed(0)
    peer = NoisyLinearImputer(noise=0.01)(flat, (~removed).float()) - flat  # pytorch-grad-cam on the normalised image
    theirs = peer[:, removed].std(dim=1)
    assert torch.allclose(ours, torch.full((3,), 0.01), rtol=0.15) and torch.allclose(theirs, ours, rtol=0.2)
    assert torch.allclose(road_noise_scale(bundle), 0.01 * torch.tensor(std))
    # road_fill takes one noise level per channel
    filled = road_fill(images, removed[None], images, [torch.Generator().manual_seed(0)], noise=(0.0, 0.0, 0.1))
    assert torch.allclose(filled[0, :2], images[0, :2], atol=1e-5) and filled[0, 2][removed].std() > 0.05


def test_road_is_deterministic_and_independent_of_the_forward_batch():
    pytest.importorskip("pytorch_grad_cam")
    bundle, images, maps, targets = road_case()
    first = deletion_insertion(bundle, images, maps, targets, steps=5, reference="road", batch_size=5)
    second = deletion_insertion(bundle, images, maps, targets, steps=5, reference="road", batch_size=64)
    assert np.allclose(first.deletion, second.deletion, atol=1e-6)
    assert np.allclose(first.insertion, second.insertion, atol=1e-6)


def test_linear_imputer_agrees_with_the_road_authors_implementation():
    """Our imputer solves the same system as ROAD's code as pytorch-grad-cam ships it (noise off), at every share of
    removed pixels, image borders included."""
    pytest.importorskip("pytorch_grad_cam")
    from pytorch_grad_cam.metrics.road import NoisyLinearImputer

    from explainers.metrics import LinearImputer

    generator = torch.Generator().manual_seed(2)
    ours, theirs = LinearImputer(), NoisyLinearImputer(noise=0.0)
    for size, removed_share in ((16, 0.1), (24, 0.5), (20, 0.95), (12, 0.0)):
        image = torch.rand(3, size, size, generator=generator)
        keep = (torch.rand(size, size, generator=generator) >= removed_share).float()
        assert torch.allclose(ours(image, keep), theirs(image, keep), atol=1e-5)
        assert torch.equal(ours(image, keep)[:, keep > 0], image[:, keep > 0])  # kept pixels untouched


def test_road_needs_no_pytorch_grad_cam(monkeypatch, quadrant):
    import builtins

    real_import = builtins.__import__

    def refuse(name, *args, **kwargs):
        if name.startswith("pytorch_grad_cam"):
            raise ImportError("no module")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", refuse)
    curves = deletion_insertion(quadrant, torch.rand(1, 3, 32, 32), torch.rand(1, 32, 32), [0], steps=4,
                                reference="road")
    assert curves.deletion.shape == (1, 5) and np.isfinite(curves.deletion).all()


def test_each_metric_declares_its_label_direction_and_range():
    from explainers.metrics import METRICS, Metric, better_arrow, better_text, curve_note

    assert {"deletion_auc", "insertion_auc", "ins_minus_del", "pointing_game", "gridpg"} <= set(METRICS)
    for name, declared in METRICS.items():
        assert declared.name == name and declared.label and declared.what and declared.low < declared.high
        assert declared.better in ("higher", "lower")
        if declared.chance is not None:
            assert declared.low <= declared.chance <= declared.high
    assert better_arrow("deletion_auc") == "\u2193" and better_arrow("insertion_auc") == "\u2191"
    assert better_text("deletion_auc") == "lower is better" and better_text("gridpg") == "higher is better"
    assert METRICS["deletion_auc"].is_better(0.1, 0.2) and METRICS["insertion_auc"].is_better(0.2, 0.1)
    assert curve_note().startswith("Lower deletion AUC is better")
    with pytest.raises(KeyError, match="Unknown metric"):
        better_arrow("accuracy")
    with pytest.raises(ValueError, match="higher' or 'lower"):
        Metric("x", "X", "sideways", 0.0, 1.0, what="nothing")


def test_the_score_table_picks_the_best_method_by_the_declared_direction():
    from explainers.statistics import score_table

    rows = {row["method"]: row for row in score_table({
        "a": {"deletion": [0.1, 0.2, 0.15], "insertion": [0.5, 0.6, 0.55]},
        "b": {"deletion": [0.3, 0.4, 0.35], "insertion": [0.7, 0.8, 0.75]}}, seed=0)}
    assert rows["a"]["deletion_auc_best"] and not rows["b"]["deletion_auc_best"]  # lower deletion is better
    assert rows["b"]["insertion_auc_best"] and not rows["a"]["insertion_auc_best"]  # higher insertion is better
