import numpy as np
import pytest
import torch

from explainers.data import pil_to_tensor
from explainers.images import load_image
from explainers.engine import explain
from explainers.methods import METHODS, MethodNotApplicable, available_methods, get_method
from explainers.methods.gradcam import gradcam_maps

from conftest import DATA_DIR, quadrant_bundle, tiny_cnn, tiny_vit

BASELINES = ["gradcam", "rollout", "chefer", "occlusion", "rise", "random"]


def hook_state(network):
    return [(len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks), getattr(m, "fused_attn", None))
            for m in network.modules()]


def real_cells(size):
    images = [pil_to_tensor(load_image(f"{DATA_DIR}/cell_{c}.jpg").resize((size, size))) for c in range(4)]
    return torch.stack(images)


@pytest.mark.parametrize("name", BASELINES)
def test_every_method_returns_b_h_w_maps(name, vit_bundle, images):
    options = {"n_masks": 64, "batch_size": 32} if name == "rise" else {}
    maps = explain(vit_bundle, images, [0, 1, 2], name, **options)
    assert maps.shape == (3, 32, 32) and maps.dtype == torch.float32
    assert torch.isfinite(maps).all()
    assert not maps.requires_grad


def test_vit_only_methods_refuse_cnns(cnn_bundle, images):
    for name in ("rollout", "chefer"):
        with pytest.raises(MethodNotApplicable, match="cannot explain 'tiny-cnn'"):
            explain(cnn_bundle, images, 0, name)
    assert "rollout" not in available_methods(cnn_bundle) and "gradcam" in available_methods(cnn_bundle)


def test_unknown_method_is_a_clear_error():
    with pytest.raises(KeyError, match="Unknown method 'nope'"):
        get_method("nope")


@pytest.mark.parametrize("make", [tiny_cnn, tiny_vit])
def test_gradcam_batch_level_equals_per_sample(make, images):
    bundle = make()
    targets = torch.tensor([0, 1, 3])
    batch = gradcam_maps(bundle, images, targets)
    single = torch.cat([gradcam_maps(bundle, images[i:i + 1], targets[i:i + 1]) for i in range(3)])
    assert (batch - single).abs().max() <= 1e-5


@pytest.mark.parametrize("make", [tiny_cnn, tiny_vit])
def test_gradcam_agrees_with_pytorch_grad_cam(make):
    from pytorch_grad_cam import GradCAM as PeerGradCAM
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    bundle = make()
    images = real_cells(32)
    targets = [0, 1, 2, 3]
    ours = gradcam_maps(bundle, images, torch.tensor(targets)).numpy()

    def reshape(tokens):  # the peer's documented ViT recipe: drop prefix tokens, tokens -> grid
        grid = tokens[:, bundle.num_prefix_tokens:, :]
        gh, gw = bundle.patch_grid()
        return grid.reshape(grid.shape[0], gh, gw, grid.shape[2]).permute(0, 3, 1, 2)

    with PeerGradCAM(model=bundle.network, target_layers=[bundle.cam_layer],
                     reshape_transform=reshape if bundle.is_vit else None) as peer:
        theirs = peer(input_tensor=bundle.normalize(images), targets=[ClassifierOutputTarget(t) for t in targets])
    for i in range(len(targets)):
        if ours[i].std() < 1e-6 and theirs[i].std() < 1e-6:
            continue  # both empty
        correlation = np.corrcoef(ours[i].ravel(), theirs[i].ravel())[0, 1]
        assert correlation >= 0.99, (i, correlation)


def test_differentiable_gradcam_trains_through(cnn_bundle, images):
    maps = get_method("gradcam", differentiable=True).attribute(cnn_bundle, images, torch.tensor([0, 1, 2]))
    assert maps.requires_grad
    maps[:, :16, :16].mean().backward()
    first_conv = cnn_bundle.network.conv1.weight
    assert first_conv.grad is not None and first_conv.grad.abs().sum() > 0
    detached = gradcam_maps(cnn_bundle, images, torch.tensor([0, 1, 2]), differentiable=True, detach_weights=True)
    assert torch.allclose(detached, maps.detach(), atol=1e-6)


def test_rise_finds_the_quadrant_and_is_deterministic():
    bundle = quadrant_bundle(scale=4.0)
    # slightly brighter than the reference everywhere: unsaturated, so hiding part of the quadrant shows
    image = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 0.2 + 0.5
    method = get_method("rise", n_masks=400, cells=4, batch_size=100)
    maps = method.attribute(bundle, image, torch.tensor([0]))
    inside, outside = maps[0, :16, :16].mean(), torch.cat([maps[0, 16:].flatten(), maps[0, :16, 16:].flatten()]).mean()
    assert inside > outside
    top_quarter = maps[0].flatten() >= maps[0].flatten().quantile(0.75)
    in_quadrant = torch.zeros(32, 32, dtype=torch.bool)
    in_quadrant[:16, :16] = True
    assert (top_quarter & in_quadrant.flatten()).sum() / top_quarter.sum() > 0.6
    again = get_method("rise", n_masks=400, cells=4, batch_size=57).attribute(bundle, image, torch.tensor([0]))
    assert torch.allclose(maps, again, atol=1e-5)  # chunking does not change the result


def test_rise_classifies_a_repeated_image_once_for_all_its_classes():
    """One image asked for several classes (GridPG's four, repeated) runs its masks once: the same maps as
    separate calls, half the forward passes."""
    bundle = quadrant_bundle(scale=4.0)
    image = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(3)) * 0.2 + 0.5
    other = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(4)) * 0.2 + 0.5
    images, targets = torch.cat([image, image, other, other]), torch.tensor([0, 1, 1, 0])
    calls = []
    handle = bundle.network.register_forward_hook(lambda module, args, output: calls.append(args[0].shape[0]))
    try:
        method = get_method("rise", n_masks=200, cells=4, batch_size=100)
        together = method.attribute(bundle, images, targets)
        shared_calls = len(calls)
        alone = torch.cat([method.attribute(bundle, images[i:i + 1], targets[i:i + 1]) for i in range(4)])
    finally:
        handle.remove()
    assert shared_calls == 2 * 2  # 2 distinct images x 2 mask chunks
    assert len(calls) - shared_calls == 4 * 2
    assert torch.allclose(together, alone, atol=1e-6)
    assert not torch.allclose(together[0], together[1])  # a different class, a different map


def occlusion_by_hand(network, image, target, window_h, window_w, corners, colour):
    """Occlusion written from its definition, one window and one forward pass at a time (not the module's code)."""
    _, height, width = image.shape
    with torch.no_grad():
        full = network(image[None])[0, target]
        total, count = torch.zeros(height, width), torch.zeros(height, width)
        for top, left in corners:
            occluded = image.clone()
            occluded[:, top:top + window_h, left:left + window_w] = torch.tensor(colour).view(3, 1, 1)
            total[top:top + window_h, left:left + window_w] += full - network(occluded[None])[0, target]
            count[top:top + window_h, left:left + window_w] += 1
    return total / count


def test_occlusion_windows_cover_every_pixel_and_reach_both_borders():
    from explainers.methods.occlusion import occlusion_windows

    for height, width, fraction in [(32, 32, 0.125), (33, 47, 0.125), (64, 64, 0.25), (7, 9, 0.5), (10, 10, 1.0)]:
        window_h, window_w, corners = occlusion_windows(height, width, fraction)
        covered = torch.zeros(height, width)
        for top, left in corners:
            assert 0 <= top <= height - window_h and 0 <= left <= width - window_w
            covered[top:top + window_h, left:left + window_w] += 1
        assert covered.min() >= 1, (height, width, fraction)
    window_h, window_w, corners = occlusion_windows(64, 64, 0.125)
    assert (window_h, window_w, len(corners)) == (8, 8, 15 * 15)  # 1/8 of the side, half-window stride


def test_occlusion_equals_its_definition_and_finds_the_quadrant():
    from explainers.methods.occlusion import occlusion_windows

    bundle = quadrant_bundle(scale=4.0)
    image = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 0.2 + 0.5
    maps = get_method("occlusion", batch_size=37).attribute(bundle, image, torch.tensor([0]))
    window_h, window_w, corners = occlusion_windows(32, 32, 0.125)
    by_hand = occlusion_by_hand(lambda x: bundle(x), image[0], 0, window_h, window_w, corners,
                                bundle.reference_color)
    assert torch.allclose(maps[0], by_hand, atol=1e-4)
    # the evidence is the bright top-left quadrant: nearly all positive attribution lies there
    positive = maps[0].clamp_min(0)
    assert positive[:16, :16].sum() / positive.sum() > 0.9
    probability = get_method("occlusion", score="probability").attribute(bundle, image, torch.tensor([0]))
    assert probability[0, :16, :16].mean() > probability[0, 16:, 16:].mean()


def test_occlusion_classifies_a_repeated_image_once_and_refuses_bad_options():
    bundle = quadrant_bundle(scale=4.0)
    image = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(3)) * 0.2 + 0.5
    other = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(4)) * 0.2 + 0.5
    images, targets = torch.cat([image, image, other]), torch.tensor([0, 1, 1])
    calls = []
    handle = bundle.network.register_forward_hook(lambda module, args, output: calls.append(args[0].shape[0]))
    try:
        method = get_method("occlusion", window_fraction=0.25, batch_size=25)  # 7 x 7 = 49 windows: 2 chunks
        together = method.attribute(bundle, images, targets)
        shared = list(calls)
        alone = torch.cat([method.attribute(bundle, images[i:i + 1], targets[i:i + 1]) for i in range(3)])
    finally:
        handle.remove()
    assert sorted(shared) == [1, 1, 24, 24, 25, 25]  # per distinct image: the full pass and the windows in 2 chunks
    assert torch.allclose(together, alone, atol=1e-5)
    assert torch.allclose(together[0], -together[1], atol=1e-4)  # two logits that are each other's negative
    with pytest.raises(ValueError, match="window_fraction"):
        get_method("occlusion", window_fraction=0)
    with pytest.raises(ValueError, match="score must be one of"):
        get_method("occlusion", score="margin")


@pytest.mark.parametrize("variant", [
    dict(),  # class token
    dict(timm_name="deit_tiny_distilled_patch16_224"),  # class + distillation token
    dict(reg_tokens=4),  # register tokens
    dict(class_token=False, global_pool="avg"),  # no class token
    dict(img_size=(32, 48)),  # non-square input
])
@pytest.mark.parametrize("name", ["rollout", "chefer", "gradcam"])
def test_vit_variants_and_no_leaked_hooks(variant, name):
    bundle = tiny_vit(**variant)
    h, w = bundle.input_size
    images = torch.rand(2, 3, h, w, generator=torch.Generator().manual_seed(2))
    before = hook_state(bundle.network)
    maps = explain(bundle, images, [0, 1], name)
    assert maps.shape == (2, h, w) and torch.isfinite(maps).all() and maps.min() >= 0
    assert maps.flatten(1).amax(1).gt(0).all()
    assert hook_state(bundle.network) == before  # hooks removed, fused attention restored


def test_prefix_tokens_and_cam_layers():
    assert tiny_vit(timm_name="deit_tiny_distilled_patch16_224").num_prefix_tokens == 2
    assert tiny_vit(reg_tokens=4).num_prefix_tokens == 5
    assert tiny_vit(class_token=False, global_pool="avg").has_class_token is False
    vit = tiny_vit(img_size=(32, 48))
    assert vit.patch_grid() == (4, 6) and vit.cam_layer_name == "blocks.1.norm1"
    assert tiny_cnn().cam_layer_name == "layer4"


def test_chefer_is_class_specific_and_rollout_is_not(vit_bundle, images):
    a = explain(vit_bundle, images[:1], [0], "chefer")
    b = explain(vit_bundle, images[:1], [1], "chefer")
    assert not torch.allclose(a, b)
    assert torch.allclose(explain(vit_bundle, images[:1], [0], "rollout"), explain(vit_bundle, images[:1], [1], "rollout"))


def test_registry_has_labels_and_descriptions():
    for name, cls in METHODS.items():
        assert cls.label and cls.description, name


def _chefer_backward_reference(bundle, images, targets):
    """Chefer as it was before issue #15, written out independently: tensor hooks on the attention
    probabilities, `.backward()` through every parameter, then R <- R + mean_h((dA * A)^+) R."""
    from explainers.attention import AttentionRecorder

    with AttentionRecorder(bundle, gradients=True) as recorder:
        with torch.enable_grad():
            logits = bundle(images.clone().requires_grad_(True))
            logits.gather(1, targets.view(-1, 1)).sum().backward()
    bundle.network.zero_grad(set_to_none=True)
    tokens = recorder.attentions[0].shape[-1]
    relevance = torch.eye(tokens).repeat(images.shape[0], 1, 1)
    for attention, gradient in zip(recorder.attentions, recorder.gradients):
        relevance = relevance + (gradient * attention.detach()).clamp_min(0).mean(dim=1) @ relevance
    prefix = bundle.num_prefix_tokens
    if bundle.has_class_token:
        row = relevance[:, 0, prefix:]
    else:
        row = relevance[:, prefix:, prefix:].mean(dim=1)
        row = row - row.min(dim=1, keepdim=True).values
    gh, gw = bundle.patch_grid(tuple(images.shape[-2:]))
    grid = row.reshape(-1, 1, gh, gw)
    maps = torch.nn.functional.interpolate(grid, size=tuple(images.shape[-2:]), mode="bilinear",
                                           align_corners=False)[:, 0].clamp_min(0)
    return maps / maps.flatten(1).amax(1).clamp_min(1e-8).view(-1, 1, 1)


@pytest.mark.parametrize("variant", [
    dict(), dict(timm_name="deit_tiny_distilled_patch16_224"), dict(reg_tokens=4),
    dict(class_token=False, global_pool="avg"), dict(img_size=(32, 48), depth=3),
])
def test_chefer_autograd_grad_matches_the_backward_implementation(variant):
    bundle = tiny_vit(**variant)
    h, w = bundle.input_size
    images = torch.rand(3, 3, h, w, generator=torch.Generator().manual_seed(5))
    targets = torch.tensor([0, 3, 1])
    expected = _chefer_backward_reference(bundle, images, targets)
    maps = get_method("chefer").attribute(bundle, images, targets)
    assert maps.shape == expected.shape
    assert (maps - expected).abs().max() <= 1e-5
    assert expected.flatten(1).std(1).min() > 0  # a non-trivial map (the comparison can fail)


def test_chefer_leaves_parameter_gradients_alone():
    bundle = tiny_vit()
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(6))
    targets = torch.tensor([0, 1])
    parameters = list(bundle.network.parameters())
    get_method("chefer").attribute(bundle, images, targets)
    assert all(p.grad is None for p in parameters)  # none computed
    # a caller's accumulated gradients (e.g. mid training step) survive: the old .backward() + zero_grad did not
    sentinels = [torch.full_like(p, 0.125) for p in parameters]
    for p, sentinel in zip(parameters, sentinels):
        p.grad = sentinel.clone()
    get_method("chefer").attribute(bundle, images, targets)
    assert all(p.grad is not None and torch.equal(p.grad, s) for p, s in zip(parameters, sentinels))
    # and the maps do not depend on whether the parameters want gradients (a frozen shared model)
    before = get_method("chefer").attribute(bundle, images, targets)
    for p in parameters:
        p.requires_grad_(False)
    assert torch.allclose(get_method("chefer").attribute(bundle, images, targets), before, atol=1e-6)


def test_explain_batch_is_the_one_run_path_seeded_locked_and_checked():
    """The same seed gives the same random maps and a new seed other ones; the bundle's lock is held while the
    method runs; a method that cannot explain the model is refused before any pass; what the method resolved
    (AHA's mode) comes back with the maps."""
    import threading

    from explainers.aha.network import AHAExplainer
    from explainers.aha.store import forget_explainers, register_explainer
    from explainers.engine import explain_batch
    from explainers.methods.base import Method

    class GlobalNoise(Method):  # draws from the global generator, as a method without its own may
        name, label = "global-noise", "Global noise"

        def attribute(self, bundle, images, targets):
            return torch.rand(images.shape[0], *images.shape[-2:])

    bundle = tiny_cnn(name="batch-cnn")
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    first = explain_batch(bundle, GlobalNoise(), images, [0, 1], seed=3)
    assert first.maps.shape == (2, 32, 32) and first.seconds >= 0 and first.resolved == {} and first.caveat is None
    assert torch.equal(first.maps, explain_batch(bundle, GlobalNoise(), images, [0, 1], seed=3).maps)
    assert not torch.equal(first.maps, explain_batch(bundle, GlobalNoise(), images, [0, 1], seed=4).maps)

    def another_thread_gets_the_lock() -> bool:
        got = []

        def attempt():
            got.append(bundle.lock.acquire(blocking=False))
            if got[0]:
                bundle.lock.release()
        thread = threading.Thread(target=attempt)
        thread.start()
        thread.join()
        return got[0]

    class Watcher(Method):
        name, label = "watcher", "Watcher"
        locked_out = None

        def attribute(self, bundle, images, targets):
            Watcher.locked_out = not another_thread_gets_the_lock()
            return torch.zeros(images.shape[0], *images.shape[-2:])

    explain_batch(bundle, Watcher(), images, [0, 1])
    assert Watcher.locked_out and another_thread_gets_the_lock()  # held while it ran, free afterwards
    with pytest.raises(MethodNotApplicable, match="batch-cnn"):
        explain_batch(bundle, "rollout", images, [0, 1])
    register_explainer(bundle, AHAExplainer(bundle))
    try:
        assert explain_batch(bundle, "aha", images, [0, 1]).resolved["mode"] == "trained"
    finally:
        forget_explainers()


@pytest.mark.parametrize("make", ["quadrant", "tiny_cnn"])
def test_integrated_gradients_is_complete_and_gives_reference_pixels_nothing(make):
    """Completeness (Sundararajan et al.'s axiom): the signed values sum to the probability's change from the
    reference image to the image; a pixel already at the reference colour gets exactly 0."""
    from explainers.methods.integrated_gradients import integrated_gradients

    bundle = quadrant_bundle(scale=4.0) if make == "quadrant" else tiny_cnn(size=32)
    image = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    reference = torch.tensor(bundle.reference_color).view(1, 3, 1, 1)
    image[:, :, 20:, 20:] = reference[0]
    classes = torch.tensor([0, 1])
    signed = integrated_gradients(bundle, image, classes, steps=64, batch_size=24)
    with torch.no_grad():
        probability = lambda x: bundle(x).softmax(dim=1)[torch.arange(2), classes]
        change = probability(image) - probability(reference.expand_as(image))
    assert torch.allclose(signed.flatten(1).sum(dim=1), change, rtol=0.03, atol=1e-4)
    assert float(signed[:, 20:, 20:].abs().max()) == 0.0
    # chunking the path does not change it; the method's map is the positive part
    again = integrated_gradients(bundle, image, classes, steps=64, batch_size=7)
    assert torch.allclose(signed, again, atol=1e-6)
    maps = get_method("intgrad", steps=64).attribute(bundle, image, classes)
    assert torch.allclose(maps, signed.clamp_min(0), atol=1e-6)


def test_integrated_gradients_finds_the_quadrant_and_refuses_bad_steps():
    bundle = quadrant_bundle(scale=4.0)
    image = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 0.2 + 0.5
    maps = get_method("intgrad").attribute(bundle, image, torch.tensor([0]))
    assert maps[0, :16, :16].sum() / maps[0].sum() > 0.9
    with pytest.raises(ValueError, match="steps must be between 4 and 64"):
        get_method("intgrad", steps=2)


def test_a_pixel_level_map_is_coloured_with_its_top_values_clipped_and_scored_as_it_is():
    """Integrated gradients' few extreme pixels would leave the rest of its map in the low colour: its top 1% is
    shown in the top colour (display only); a method that declares nothing is shown as it is."""
    from explainers.methods import METHODS

    values = np.arange(1000, dtype=np.float32).reshape(10, 100)
    shown = METHODS["intgrad"].display_map(values)
    assert shown.max() == pytest.approx(np.quantile(values, 0.99)) and (shown == values)[values <= 989].all()
    assert (METHODS["gradcam"].display_map(values) == values).all()
    assert np.isnan(METHODS["intgrad"].display_map(np.full((3, 3), np.nan))).all()  # nothing finite: as it is
