"""The segmentation kind: a tiny SegFormer built here (no download, no ../shared), region targets, the methods'
segmentation forms, their refusals, and the pieces GradSkip's propagation is made of."""
import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from explainers.engine import explain  # noqa: E402
from explainers.methods import METHODS, MethodNotApplicable, get_method  # noqa: E402
from explainers.metrics import spearman  # noqa: E402
from explainers.segmentation.checks import ShownRegion  # noqa: E402
from explainers.segmentation.capture import (BlockRecord, capture, key_shares, spread_keys,  # noqa: E402
                                             to_finer_grid)
from explainers.segmentation.methods import (explain_region, get_segmentation_method,  # noqa: E402
                                             list_segmentation_methods, SegGradSkip)
from explainers.segmentation.targets import (RegionError, RegionTarget, clicked_region, drawn_region,  # noqa: E402
                                             predicted_region)

from conftest import TINY_SEGFORMER_SIZE as SIZE, tiny_segformer  # noqa: E402


@pytest.fixture(scope="module")
def seg():
    return tiny_segformer()


@pytest.fixture(scope="module")
def images():
    return torch.rand(2, 3, *SIZE, generator=torch.Generator().manual_seed(1))


def box_region(top, left, height, width, size=SIZE):
    mask = torch.zeros(size, dtype=torch.bool)
    mask[top:top + height, left:left + width] = True
    return mask


def test_bundle_returns_logits_at_the_input_size(seg, images):
    with torch.no_grad():
        logits = seg(images)
    assert logits.shape == (2, 3, *SIZE)
    assert seg.task == "segmentation" and seg.family == "segformer" and not seg.is_vit


def test_region_target_is_the_mean_class_logit_over_the_region():
    logits = torch.randn(2, 3, 4, 5)
    masks = torch.zeros(2, 4, 5, dtype=torch.bool)
    masks[0, 1:3, 2:4] = True
    masks[1, 0, 0] = True
    scores = RegionTarget(masks, [2, 1])(logits)
    assert torch.allclose(scores[0], logits[0, 2, 1:3, 2:4].mean())
    assert torch.allclose(scores[1], logits[1, 1, 0, 0])
    probability = RegionTarget(masks, [2, 1]).probability(logits)
    assert torch.allclose(probability[0], logits[0].softmax(0)[2, 1:3, 2:4].mean())


def test_empty_region_is_refused_in_plain_words(seg):
    with pytest.raises(RegionError, match="empty"):
        RegionTarget(torch.zeros(1, 4, 4, dtype=torch.bool), [1])
    prediction = torch.zeros(8, 8, dtype=torch.long)
    with pytest.raises(RegionError, match="predicts no round"):
        predicted_region(seg, prediction, 1)
    with pytest.raises(RegionError, match="empty"):
        drawn_region(seg, np.zeros((8, 8)), 1, (8, 8))


def test_click_on_background_is_refused_and_a_click_picks_its_connected_piece(seg):
    prediction = torch.zeros(10, 10, dtype=torch.long)
    prediction[1:3, 1:3] = 1
    prediction[6:9, 6:9] = 1
    with pytest.raises(RegionError, match="background"):
        clicked_region(seg, prediction, 5, 5)
    class_index, region = clicked_region(seg, prediction, 7, 7)
    assert class_index == 1 and int(region.sum()) == 9 and not bool(region[1, 1])


def test_drawn_region_is_read_at_the_model_size(seg):
    drawing = np.zeros((16, 32, 4), np.uint8)
    drawing[4:8, 8:16, 3] = 255
    region = drawn_region(seg, drawing, 2, (8, 16))
    assert region.shape == (8, 16) and int(region.sum()) == 8


@pytest.mark.parametrize("name", ["gradskip", "gradcam", "rollout", "gradrollout", "occlusion", "rise", "intgrad",
                                  "aha", "random"])
def test_every_method_explains_a_region(seg, images, name):
    options = {"rise": {"n_masks": 16}, "aha": {"per_image_steps": 1}, "occlusion": {"window_fraction": 0.5}}.get(name, {})
    target = RegionTarget(torch.stack([box_region(8, 16, 16, 32), box_region(30, 60, 20, 40)]), [1, 2])
    maps = explain_region(seg, images, target, name, **options).maps
    assert maps.shape == (2, *SIZE) and torch.isfinite(maps).all()
    if name in ("gradskip", "rollout", "gradrollout"):  # the SegFormer-specific ones: max-normalised relevance
        assert float(maps.min()) >= 0 and float(maps.max()) <= 1 + 1e-6


@pytest.mark.parametrize("name", ["gradskip", "gradrollout", "rollout", "gradcam", "intgrad"])
def test_a_swapped_region_is_not_followed_when_the_gradients_are_unchanged(seg, images, name):
    """The region's score (so every gradient) stays the left box's; the masks the method could read show the
    mirrored box. A map drawn from the score's gradients is unchanged; one that reads the region follows it."""
    left = RegionTarget(box_region(0, 0, 32, 32).unsqueeze(0), [1])
    shown = ShownRegion(left, left.masks.flip(-1))
    true_map, shown_map = (explain_region(seg, images[:1], t, name).maps for t in (left, shown))
    assert torch.allclose(true_map, shown_map, atol=1e-6)


def test_different_regions_give_different_gradskip_maps(seg, images):
    left = RegionTarget(box_region(0, 0, 32, 32).unsqueeze(0), [1])
    right = RegionTarget(box_region(32, 96, 32, 32).unsqueeze(0), [1])
    first, second = (explain_region(seg, images[:1], t, "gradskip").maps[0] for t in (left, right))
    assert spearman(first, second) < 0.9


def test_gradskip_conserves_relevance_and_alpha_is_free(seg, images):
    target = RegionTarget(box_region(8, 16, 16, 32).unsqueeze(0), [1])
    state = SegGradSkip().prepare(seg, images[:1], target)
    relevance = state.relevance()
    assert relevance.shape == (1, 16, 32)
    # every grid side divisible by R, no token left unpooled: all of the start arrives (signed by default: its net)
    signed = state.captured.decoder_signed
    net = sum(float(flow.sum()) for flow in signed) / sum(float(flow.abs().sum()) for flow in signed)
    assert abs(float(relevance.sum()) - net) < 1e-4
    assert abs(float(state.relevance(start="decoder").sum()) - 1.0) < 1e-4
    assert not torch.equal(state.map(alpha=0.0), state.map(alpha=1.0))
    with pytest.raises(ValueError, match="alpha"):
        state.map(alpha=1.5)


def test_a_capture_keeps_no_graph_alive(seg, images):
    """Each GradSkip or rollout map used to keep ~40 MB alive for good on the bundled model: a gradient hook
    that reached its own tensor made a cycle through the autograd graph that Python's collector cannot free."""
    import gc
    import weakref

    kept = []
    projection = seg.network.segformer.decode_head.linear_projections[0].proj
    handle = projection.register_forward_hook(lambda _m, _a, output: kept.append(weakref.ref(output)))
    try:
        capture(seg, images[:1], RegionTarget(box_region(8, 16, 16, 32).unsqueeze(0), [1]))
    finally:
        handle.remove()
    gc.collect()
    assert kept and all(ref() is None for ref in kept)


def test_capture_keeps_full_queries_reduced_keys_and_gradients(seg, images):
    target = RegionTarget(box_region(8, 16, 16, 32).unsqueeze(0), [2])
    captured = capture(seg, images[:1], target)
    assert captured.stage_grids == [(16, 32), (8, 16), (4, 8), (2, 4)]
    first, last = captured.blocks[0], captured.blocks[-1]
    assert first.attention.shape[-2:] == (16 * 32, 2 * 4)  # queries at the full grid, keys reduced 8 x 8
    assert last.attention.shape[-2:] == (8, 8)  # stage 4: no reduction
    for block in captured.blocks:
        assert torch.allclose(block.attention.sum(-1), torch.ones(1), atol=1e-5)
        assert block.attention_grad.shape == block.attention.shape
        assert block.main_flow.shape == block.skip_flow.shape == (1, block.grid[0] * block.grid[1])
    assert float(sum(b.attention_grad.abs().sum() for b in captured.blocks)) > 0
    assert [tuple(f.shape) for f in captured.decoder_flow] == [(1, 512), (1, 128), (1, 32), (1, 8)]
    assert torch.allclose(captured.scores, target(seg(images[:1])).detach(), atol=1e-5)
    # the region score reads the decoder; its tokens inside the region carry the most direct evidence
    assert float(captured.decoder_flow[0].sum()) > 0


def test_key_shares_sum_to_one_per_cell_and_spreading_keeps_the_total():
    conv = torch.nn.Conv2d(4, 4, kernel_size=2, stride=2)
    hidden = torch.randn(1, 4 * 6, 4)
    shares = key_shares(hidden, conv, (4, 6)).view(1, 4, 6)
    cells = shares.view(1, 2, 2, 3, 2).sum(dim=(2, 4))
    assert torch.allclose(cells, torch.ones_like(cells), atol=1e-5)
    record = BlockRecord(stage=0, grid=(4, 6), reduced_grid=(2, 3), reduction=2, key_shares=shares.view(1, -1))
    keys = torch.rand(1, 6)
    for mode in ("conv", "even"):
        spread = spread_keys(keys, record, mode)
        assert spread.shape == (1, 24) and torch.allclose(spread.sum(), keys.sum())
    even = spread_keys(keys, record, "even").view(4, 6)
    assert torch.allclose(even[0, 0], keys[0, 0] / 4)


def test_relevance_moves_to_a_finer_grid_with_its_total():
    coarse = torch.rand(3, 2 * 4)
    fine = to_finer_grid(coarse, (2, 4), (3, 7))
    assert fine.shape == (3, 21) and torch.allclose(fine.sum(1), coarse.sum(1))


def test_seg_gradcam_agrees_with_pytorch_grad_cam(seg, images):
    gradcam_module = pytest.importorskip("pytorch_grad_cam")
    from pytorch_grad_cam.utils.model_targets import SemanticSegmentationTarget

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.network = seg.network

        def forward(self, x):
            return seg(x)

    region = box_region(16, 32, 24, 48)
    ours = explain_region(seg, images[:1], RegionTarget(region[None], [1]), "gradcam").maps
    peer = gradcam_module.GradCAM(model=Wrapped(), target_layers=[seg.network.segformer.decode_head.linear_fuse])
    theirs = peer(input_tensor=images[:1], targets=[SemanticSegmentationTarget(1, region.float().numpy())])
    assert spearman(ours[0], torch.from_numpy(theirs[0])) >= 0.99


def test_classifier_only_methods_refuse_a_segmentation_model(seg, images):
    with pytest.raises(MethodNotApplicable, match="classifiers only"):
        get_segmentation_method("chefer", seg)
    with pytest.raises(MethodNotApplicable, match="no method called"):
        get_segmentation_method("nonsense", seg)
    with pytest.raises(MethodNotApplicable, match="tiny-seg"):
        explain(seg, images[:1], [1], "chefer")  # the classifier registry refuses it too


def test_segmentation_methods_refuse_a_classifier():
    from conftest import tiny_vit

    with pytest.raises(MethodNotApplicable, match="classifier"):
        get_segmentation_method("gradskip", tiny_vit())


def test_methods_need_a_region_target(seg, images):
    with pytest.raises(ValueError, match="RegionTarget|region target"):
        explain_region(seg, images[:1], torch.tensor([1]), "gradskip")


def test_menu_order_puts_gradskip_first_after_aha():
    names = list_segmentation_methods()
    assert names[:3] == ["aha", "gradskip", "gradcam"] and names[-1] == "random"


def test_window_spread_between_stages_keeps_the_total():
    from explainers.segmentation.capture import to_finer_by_window, window_shares

    conv = torch.nn.Conv2d(4, 6, kernel_size=3, stride=2, padding=1)
    fine = torch.randn(2, 4, 8, 12)
    shares = window_shares(fine, conv)  # B x 9 x (4 * 6)
    assert shares.shape == (2, 9, 24) and torch.allclose(shares.sum(1), torch.ones(2, 24), atol=1e-5)
    coarse = torch.rand(2, 24)
    spread = to_finer_by_window(coarse, shares, conv, (8, 12))
    assert spread.shape == (2, 96) and torch.allclose(spread.sum(1), coarse.sum(1), atol=1e-5)


def test_depthwise_spread_follows_the_filter_and_keeps_the_total():
    from explainers.segmentation.capture import depthwise_shares, spread_depthwise

    conv = torch.nn.Conv2d(4, 4, 3, 1, 1, groups=4)
    hidden = torch.randn(2, 5 * 7, 4)
    shares = depthwise_shares(hidden, conv, (5, 7))
    assert shares.shape == (2, 9, 35) and torch.allclose(shares.sum(1), torch.ones(2, 35), atol=1e-5)
    # the definition, window by window: ||W_(dy,dx) * h_t|| over channels, zero past the border
    windows = torch.nn.functional.unfold(hidden.transpose(1, 2).reshape(2, 4, 5, 7), 3, padding=1).view(2, 4, 9, 35)
    norms = (conv.weight.detach().view(1, 4, 9, 1) * windows).norm(dim=1)
    assert torch.allclose(shares, norms / norms.sum(dim=1, keepdim=True), atol=1e-5)
    relevance = torch.rand(2, 35)
    assert torch.allclose(spread_depthwise(relevance, shares, (5, 7)).sum(1), relevance.sum(1), atol=1e-5)
    # a filter that reads only the right-hand neighbour: a token's relevance goes to that neighbour
    with torch.no_grad():
        conv.weight.zero_()
        conv.weight[:, 0, 1, 2] = 1.0
    shares = depthwise_shares(hidden, conv, (5, 7))
    one = torch.zeros(1, 35)
    one[0, 2 * 7 + 3] = 1.0
    moved = spread_depthwise(one, shares[:1], (5, 7)).view(5, 7)
    assert float(moved[2, 4]) == pytest.approx(1.0) and float(moved.sum()) == pytest.approx(1.0)


def test_ffn_spread_changes_nothing_when_the_ffn_carries_nothing():
    model = tiny_segformer()
    images = torch.rand(1, 3, *SIZE, generator=torch.Generator().manual_seed(2))
    target = RegionTarget(box_region(8, 16, 16, 32).unsqueeze(0), [1])
    state = SegGradSkip().prepare(model, images, target)
    assert not torch.allclose(state.relevance(ffn_spread="conv"), state.relevance(ffn_spread="none"))
    for stage in model.network.segformer.segformer.stages:
        for block in stage.blocks:
            with torch.no_grad():
                block.mlp.fc2.weight.zero_()
                block.mlp.fc2.bias.zero_()
    state = SegGradSkip().prepare(model, images, target)
    assert all(float(r.ffn_main_flow.abs().max()) == 0.0 for r in state.captured.blocks)
    assert torch.allclose(state.relevance(ffn_spread="conv"), state.relevance(ffn_spread="none"), atol=1e-7)


@pytest.mark.parametrize("options", [dict(attention_weighting="gradient_residual", start="decoder"),
                                     dict(stage_spread="conv", start="decoder"),
                                     dict(ffn_spread="conv", start="decoder"),
                                     dict(attention_weighting="attention", key_spread="even", start="decoder_abs")])
def test_gradskip_variants_conserve_relevance(seg, images, options):
    target = RegionTarget(box_region(8, 16, 16, 32).unsqueeze(0), [1])
    state = SegGradSkip(**options).prepare(seg, images[:1], target)
    assert abs(float(state.relevance().sum()) - 1.0) < 1e-4


def test_the_signed_start_conserves_its_net_share_and_is_the_positive_start_where_nothing_is_negative(seg, images):
    target = RegionTarget(box_region(8, 16, 16, 32).unsqueeze(0), [1])
    state = SegGradSkip().prepare(seg, images[:1], target)
    signed = state.captured.decoder_signed
    net = sum(float(flow.sum()) for flow in signed) / sum(float(flow.abs().sum()) for flow in signed)
    assert any(bool((flow < 0).any()) for flow in signed)  # a real mix of signs, so the check means something
    assert abs(float(state.relevance(start="decoder_signed").sum()) - net) < 1e-4
    state.captured.decoder_signed = [flow.clamp_min(0) for flow in signed]
    assert torch.allclose(state.relevance(start="decoder_signed"), state.relevance(start="decoder"), atol=1e-7)


def test_a_map_option_the_capture_lacks_is_refused(seg, images):
    target = RegionTarget(box_region(8, 16, 16, 32).unsqueeze(0), [1])
    state = SegGradSkip().prepare(seg, images[:1], target)
    with pytest.raises(ValueError, match="stage_spread='conv'"):
        state.map(stage_spread="conv")


def test_the_pixel_step_reads_the_images_own_gradient_times_its_difference_from_the_reference(seg, images):
    target = RegionTarget(box_region(8, 16, 16, 32).unsqueeze(0), [1])
    image = images[:1]
    state = SegGradSkip(pixel_step="input_gradient").prepare(seg, image, target)
    # the pixel term against autograd on a plain pass of the same score
    inputs = image.clone().requires_grad_(True)
    gradient, = torch.autograd.grad(target(seg(inputs)).sum(), inputs)
    reference = torch.tensor(seg.reference_color).view(1, 3, 1, 1)
    expected = ((image - reference) * gradient).sum(dim=1)
    assert torch.allclose(state.captured.pixel_flow, expected, atol=1e-6)
    assert bool((expected > 0).any()) and bool((expected < 0).any())  # both signs, so the relu below is tested
    # the map: the upsampled token relevance to the power 1/2 times the positive part of the pixel term
    tokens = torch.nn.functional.interpolate(state.relevance()[:, None].float(), size=image.shape[-2:],
                                             mode="bilinear", align_corners=False)[:, 0].clamp_min(0)
    product = tokens.sqrt() * expected.clamp_min(0)
    assert torch.allclose(state.map(), product / product.amax(), atol=1e-5)
    assert float(state.map()[expected <= 0].abs().max()) == 0.0  # a pixel the score does not lean on stays dark
    # the sum: the token map and the product, each scaled to a maximum of 1 (read from the same capture)
    both = tokens / tokens.amax() + product / product.amax()
    assert torch.allclose(state.map(pixel_step="upsample_and_input_gradient"), both / both.amax(), atol=1e-5)
    assert SegGradSkip().options["pixel_step"] == "upsample_and_input_gradient"  # the default (chosen on val)
    # the plain upsampling's capture stops at the first block (no pixel term) and says what to do in plain words
    plain = SegGradSkip(pixel_step="upsample").prepare(seg, image, target)
    assert plain.captured.pixel_flow is None
    with pytest.raises(ValueError, match="pixel_step='input_gradient'"):
        plain.map(pixel_step="input_gradient")
    with pytest.raises(ValueError, match="pixel_step must be one of"):
        SegGradSkip(pixel_step="nearest")


def test_binarise_rules_and_pa_iou_known_answers():
    from explainers.segmentation.checks import mean_threshold
    from explainers.segmentation.scoring import binarise, box_energy, box_mask, pa_iou

    heat = torch.tensor([[0.0, 0.2, 0.9], [1.0, 0.4, 0.6]])
    assert binarise(heat[None])[0].tolist() == [[False, False, True], [True, False, True]]
    assert mean_threshold(heat[None])[0].tolist() == [[False, False, True], [True, False, True]]  # mean 0.517
    mask = torch.tensor([[False, False, True], [True, True, False]])
    pa, iou = pa_iou(mean_threshold(heat[None])[0], mask)
    assert pa == pytest.approx(4 / 6) and iou == pytest.approx(2 / 4)
    valid = torch.tensor([[True, True, True], [True, False, True]])
    assert pa_iou(mean_threshold(heat[None])[0], mask, valid) == (pytest.approx(4 / 5), pytest.approx(2 / 3))
    box = box_mask([["WBC", 1, 0, 2, 0], ["RBC", 0, 1, 0, 1]], "WBC", (2, 3))
    assert box.tolist() == [[False, True, True], [False, False, False]]
    assert box_energy(heat, box) == pytest.approx(1.1 / 3.1)


def test_summary_averages_per_class_then_classes_and_compares_paired():
    from explainers.segmentation.evaluate import summarise

    records = []
    for image, (wbc, rbc) in {"a": (0.9, 0.5), "b": (0.7, 0.3), "c": (0.8, 0.4)}.items():
        records += [{"image": image, "class": "WBC", "method": "gradskip", "iou": wbc, "pa": 0.9, "seconds": 1.0},
                    {"image": image, "class": "RBC", "method": "gradskip", "iou": rbc, "pa": 0.9, "seconds": 1.0},
                    {"image": image, "class": "WBC", "method": "rollout", "iou": wbc - 0.1, "pa": 0.8,
                     "seconds": 2.0}]
    report = summarise(records, ["gradskip", "rollout"], n_resamples=200)
    assert report["methods"]["gradskip"]["iou"] == pytest.approx((0.8 + 0.4) / 2)
    assert report["methods"]["gradskip"]["per_class_iou"] == {"RBC": 0.4, "WBC": 0.8}
    assert report["methods"]["rollout"]["iou"] == pytest.approx(0.7)
    lead = report["comparisons"]["gradskip_minus_best_iou"]
    assert lead["second"] == "rollout" and lead["images"] == 3 and lead["mean"] == pytest.approx(-0.1)
    assert lead["ci95"][0] <= -0.1 <= lead["ci95"][1]


def test_hub_segformer_offline_fails_at_once_in_plain_words(monkeypatch):
    from explainers.models import ModelUnavailableError, load_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelUnavailableError, match="could not be downloaded"):
        load_model("nvidia/segformer-b0-finetuned-ade-512-512")


def test_integrated_gradients_takes_four_steps_in_the_segmentation_view_on_a_cpu(seg):
    """The view's interactive steps (chosen on the cued val platelets: 4 found the cue as often as 16); a
    classifier keeps the method's default."""
    from conftest import tiny_cnn
    from saliency_lab.segmentation import interactive_options

    assert interactive_options("intgrad", seg) == {"steps": 4}
    assert get_method("intgrad").steps == 16 and METHODS["intgrad"].interactive_options(tiny_cnn()) == {}
