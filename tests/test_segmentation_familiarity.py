"""The segmentation view's unfamiliar-photo check, its streamed explanations (maps first, cheapest first, then the
curves) and the curves' fast forward pass (the same logits as the model's own)."""
import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from explainers import familiarity  # noqa: E402
from explainers.segmentation import familiarity as seg_familiarity  # noqa: E402
from explainers.segmentation.model import fast_logits  # noqa: E402
from saliency_lab.segmentation import SegmentationView, cost_groups, scores_markdown  # noqa: E402
from conftest import tiny_segformer  # noqa: E402

SIZE = (64, 128)


@pytest.fixture(scope="module")
def bundle():
    return tiny_segformer("tiny-seg-familiar", size=SIZE)


def smear(seed):
    """Pink discs on a pale background: the kind of photo the check is fitted on."""
    rng = np.random.default_rng(seed)
    image = np.full((*SIZE, 3), (235, 215, 220), np.float32)
    rows, columns = np.mgrid[:SIZE[0], :SIZE[1]]
    for _ in range(12):
        y, x, r = rng.integers(0, SIZE[0]), rng.integers(0, SIZE[1]), rng.integers(5, 12)
        image[(rows - y) ** 2 + (columns - x) ** 2 < r * r] = (200, 110, 140)
    image += rng.normal(0, 4, image.shape)
    return torch.from_numpy(image.clip(0, 255) / 255).float().permute(2, 0, 1).unsqueeze(0)


def test_fast_logits_are_the_models_logits(bundle):
    import copy

    from explainers.segmentation.model import _folds

    images = torch.rand(3, 3, *SIZE)
    with torch.no_grad():
        assert torch.allclose(fast_logits(bundle, images), bundle(images), atol=1e-5)
    # a trained decode head's batch norm (statistics and affine weights far from a fresh one's) folded into the fuse
    trained = copy.copy(bundle)
    trained.network = copy.deepcopy(bundle.network)
    norm = trained.network.segformer.decode_head.batch_norm
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for tensor, low, high in ((norm.running_mean, -2, 2), (norm.running_var, 0.1, 3), (norm.weight, -2, 2),
                                  (norm.bias, -1, 1)):
            tensor.copy_(torch.rand(tensor.shape, generator=generator) * (high - low) + low)
        assert _folds(trained.network.segformer.decode_head)
        reference = trained(images)
        assert torch.allclose(fast_logits(trained, images), reference, atol=1e-4)
        assert torch.allclose(fast_logits(trained, images, (5, 40, 10, 90)), reference[:, :, 5:40, 10:90], atol=1e-4)
    norm.train()  # batch statistics: nothing to fold
    assert not _folds(trained.network.segformer.decode_head)


def test_an_unlike_photo_is_flagged_and_a_smear_is_not(bundle):
    stats = seg_familiarity.fit(bundle, [smear(i) for i in range(12)], [smear(100 + i) for i in range(12)],
                                quantile=0.9)
    assert stats.means.shape[0] == 1 and stats.source["cells_per_image"] == 8  # a 2 x 4 last-stage grid
    _, verdicts = seg_familiarity.forward_and_check(bundle, smear(7))  # no statistics registered: no verdict
    assert verdicts is None
    familiarity.register_stats(bundle, stats)
    try:
        checkerboard = (torch.arange(SIZE[1]).view(1, -1) // 8 + torch.arange(SIZE[0]).view(-1, 1) // 8) % 2
        odd = torch.stack([checkerboard, 1 - checkerboard, checkerboard * 0.2]).float().unsqueeze(0)
        logits, verdicts = seg_familiarity.forward_and_check(bundle, torch.cat([smear(200), odd]))
        assert logits.shape == (2, 3, *SIZE)
        assert not verdicts[0]["unfamiliar"] and verdicts[1]["unfamiliar"]
        assert "does not look like the smears" in verdicts[1]["message"]
        shown = SegmentationView(bundle).predict((odd[0].permute(1, 2, 0).numpy() * 255).astype(np.uint8))
        assert shown.familiarity["unfamiliar"]
    finally:
        familiarity.register_stats(bundle, None)


def test_the_stream_gives_the_maps_cheapest_first_then_the_curves(bundle):
    view = SegmentationView(bundle)
    shown = view.predict(np.full((*SIZE, 3), 128, np.uint8))
    shown.prediction = torch.zeros(SIZE, dtype=torch.long)
    shown.prediction[16:48, 32:96] = 2
    target = view.region(shown, class_name="square")
    chosen = ["gradskip", "rise", "gradcam"]
    assert cost_groups(chosen) == [["gradcam", "gradskip"], ["rise"]]
    steps = [[(r["method"], "deletion" in r) for r in records]
             for records in view.explain_stream(shown, target, chosen, curve_steps=2, region="drawn",
                                                options={"rise": {"n_masks": 8}})]
    assert steps[0] == [("gradcam", False)]  # the cheapest map alone, at once
    # (the curves are made beside the next map, so when each comes depends on the clock: the order is the test)
    first_map = {m: next(i for i, rows in enumerate(steps) if m in dict(rows)) for m in chosen}
    first_curve = {m: next(i for i, rows in enumerate(steps) if dict(rows).get(m)) for m in chosen}
    assert first_map["gradcam"] < first_map["gradskip"] < first_map["rise"]  # cheapest first, the slow one last
    assert first_curve["gradcam"] <= first_curve["gradskip"] < first_curve["rise"]
    assert all(first_map[m] < first_curve[m] for m in chosen)  # a map is shown before its curves
    assert all([m for m, _ in rows] == [m for m in chosen if m in dict(rows)] for rows in steps)  # picked order
    progress = [len(rows) + sum(curves for _, curves in rows) for rows in steps]  # maps and curves shown
    assert all(a < b for a, b in zip(progress, progress[1:]))  # every step brings something new
    assert steps[-1] == [("gradskip", True), ("rise", True), ("gradcam", True)]
    last = view.explain(shown, target, chosen[:1], curve_steps=2, region="drawn")
    table = scores_markdown(last)
    assert "against the drawn region" in table and "…" not in table
    assert "…" in scores_markdown([{k: v for k, v in last[0].items() if "auc" not in k}])


def test_curves_reuse_their_end_points_and_match_the_plain_engine(bundle):
    from explainers.metrics import deletion_insertion
    from explainers.targets import TargetScoreModel as _RegionScoreModel
    from explainers.segmentation.scoring import region_curves
    from explainers.segmentation.targets import RegionTarget

    image = smear(3)
    region = torch.zeros(1, *SIZE, dtype=torch.bool)
    region[0, 16:40, 20:60] = True
    target = RegionTarget(region, [1])
    maps = torch.rand(2, *SIZE)
    plain = deletion_insertion(_RegionScoreModel(bundle, target), image.expand(2, -1, -1, -1), maps,
                               torch.zeros(2, dtype=torch.long), steps=4)
    known = {}
    first = region_curves(bundle, image, maps[:1], target, steps=4, known=known)
    assert set(known) == {0, 1}  # the whole image and the all-reference one, kept for the next map
    second = region_curves(bundle, image, maps[1:], target, steps=4, known=known)
    for row, curves in enumerate((first, second)):
        assert np.allclose(curves.deletion[0], plain.deletion[row], atol=1e-5)
        assert np.allclose(curves.insertion[0], plain.insertion[row], atol=1e-5)


def test_a_window_of_the_logits_is_that_window_of_the_whole_and_a_region_reads_only_its_box(bundle):
    """The decode head made only where a window's upsampling reads (the curves' region score): the same logits as
    the whole pass's, cropped, at the borders and for a single pixel too; a region's probability is unchanged."""
    from explainers.segmentation.model import bilinear_rows, region_probability, region_window
    from explainers.segmentation.targets import RegionTarget

    # the weight matrices are F.interpolate's own
    values = torch.rand(1, 1, 5, 7, generator=torch.Generator().manual_seed(2))
    resized = torch.nn.functional.interpolate(values, size=(13, 11), mode="bilinear", align_corners=False)
    assert torch.allclose(bilinear_rows(13, 5).float() @ values[0, 0] @ bilinear_rows(11, 7).float().T, resized[0, 0],
                          atol=1e-6)
    images = torch.rand(2, 3, *bundle.input_size, generator=torch.Generator().manual_seed(1))
    height, width = bundle.input_size
    whole = fast_logits(bundle, images)
    # a window under half the image takes the resampled decode head, at or over half a crop of the whole pass
    for window in [(0, height, 0, width), (5, 17, 9, 40), (0, 3, width - 2, width), (height - 1, height, 0, 1),
                   (0, height // 2, 0, width - 1), (0, height // 2 + 1, 0, width)]:
        top, bottom, left, right = window
        part = fast_logits(bundle, images, window)
        assert part.shape == (2, whole.shape[1], bottom - top, right - left)
        assert torch.allclose(part, whole[:, :, top:bottom, left:right], atol=1e-5)
    masks = torch.zeros(2, height, width, dtype=torch.bool)
    masks[0, 4:9, 10:30], masks[1, 20:25, 3:6] = True, True
    target = RegionTarget(masks, [1, 2])
    assert region_window(masks) == (4, 25, 3, 30)
    assert torch.allclose(region_probability(bundle, images, target), target.probability(bundle(images)), atol=1e-6)
