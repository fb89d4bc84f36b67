"""GradSkip (docs/methods.md section 3): tiny random-weight ViT-family models built here, CPU, fast."""
import pytest
import timm
import torch

from conftest import forward_passes, tiny_cnn, tiny_vit
from explainers.attention import AttentionRecorder
from explainers.engine import explain
from explainers.methods import MethodNotApplicable, available_methods, get_method
from explainers.methods.gradskip import ATTENTION_WEIGHTINGS, GradSkip, GradSkipState, gini, prepare
from explainers.models import bundle_from_timm

VARIANTS = {
    "vit": {},
    "deit_distilled": {"timm_name": "deit_tiny_distilled_patch16_224"},
    "registers": {"reg_tokens": 4},
    "no_class_token": {"class_token": False, "global_pool": "avg"},
    "registers_no_class_token_non_square": {"reg_tokens": 2, "class_token": False, "global_pool": "avg",
                                            "img_size": (48, 64)},
    "layer_scale_non_square": {"init_values": 1e-1, "img_size": (40, 24)},
}


def _images(bundle, count=3, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(count, 3, *bundle.input_size, generator=generator)


def _hook_snapshot(network):
    return [(name, len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks),
             len(getattr(m, "_forward_hooks_with_kwargs", {})), len(getattr(m, "_forward_pre_hooks_with_kwargs", {})),
             len(getattr(m, "_backward_pre_hooks", {})), getattr(m, "fused_attn", None))
            for name, m in network.named_modules()]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_maps_shape_finite_non_negative(variant):
    bundle = tiny_vit(**VARIANTS[variant])
    images = _images(bundle)
    maps = get_method("gradskip").attribute(bundle, images, torch.tensor([0, 1, 3]))
    assert maps.shape == (3, *bundle.input_size)
    assert torch.isfinite(maps).all() and (maps >= 0).all()
    assert torch.allclose(maps.flatten(1).amax(1), torch.ones(3))  # max-normalised, never all zero
    assert maps.flatten(1).std(1).min() > 0


def test_prefix_tokens_are_the_ones_the_model_reports():
    assert tiny_vit(**VARIANTS["deit_distilled"]).num_prefix_tokens == 2
    assert tiny_vit(**VARIANTS["registers"]).num_prefix_tokens == 5
    bundle = tiny_vit(**VARIANTS["registers_no_class_token_non_square"])
    state = prepare(bundle, _images(bundle, 1), [0])
    assert state.grid == (6, 8) and state.num_prefix_tokens == 2 and not state.has_class_token
    assert state.attention_flow.shape[-1] == 2 + 6 * 8


@pytest.mark.parametrize("variant", ["vit", "deit_distilled", "registers_no_class_token_non_square"])
def test_batch_equals_per_sample(variant):
    bundle = tiny_vit(**VARIANTS[variant])
    images, targets = _images(bundle), torch.tensor([2, 0, 1])
    method = GradSkip()
    batch_state = method.prepare(bundle, images, targets)
    for alpha in (0.5, 0.0, 1.0):
        batch = batch_state.map(alpha)
        single = torch.cat([method.prepare(bundle, images[i:i + 1], targets[i:i + 1]).map(alpha) for i in range(3)])
        assert torch.allclose(batch, single, atol=1e-5)
    singles = [method.prepare(bundle, images[i:i + 1], targets[i:i + 1]) for i in range(3)]
    relevance = torch.cat([s.relevance() for s in singles])
    assert torch.allclose(batch_state.relevance(), relevance, atol=1e-5, rtol=1e-4)
    head_weights = torch.cat([s.head_weights() for s in singles])
    assert torch.allclose(batch_state.head_weights(), head_weights, atol=1e-5)


def test_alpha_recombination_runs_no_model_pass(monkeypatch):
    bundle = tiny_vit()
    state = prepare(bundle, _images(bundle), [0, 1, 2])
    calls = []
    handle = bundle.network.register_forward_hook(lambda *_: calls.append("forward"))
    for name in ("grad", "backward"):
        monkeypatch.setattr(torch.autograd, name, lambda *a, **k: calls.append(name))
    monkeypatch.setattr(torch.Tensor, "backward", lambda *a, **k: calls.append("Tensor.backward"))
    try:
        maps = {alpha: state.map(alpha) for alpha in (0.0, 0.25, 0.5, 0.75, 1.0)}
        state.map(0.3, normalize=False)
        state.head_weights(0.7)
        state.diagnostics(0.2)
        state.map(0.5, head_selection="sparsest")
        weighted = {w: state.map(0.5, attention_weighting=w) for w in ATTENTION_WEIGHTINGS}
        for w in ATTENTION_WEIGHTINGS:
            state.map(0.0, attention_weighting=w, normalize=False)
            state.beta_profile(1.0, index=2, attention_weighting=w)
    finally:
        handle.remove()
    assert calls == []
    assert not torch.allclose(maps[0.0], maps[1.0], atol=1e-4)
    assert all(m.shape == (3, 32, 32) for m in maps.values())
    assert not torch.allclose(weighted["gradient"], weighted["attention"], atol=1e-4)  # the option does something
    # the forward hook does count a real pass (the check above can fail)
    handle = bundle.network.register_forward_hook(lambda *_: calls.append("forward"))
    try:
        with torch.no_grad():
            bundle(_images(bundle, 1))
    finally:
        handle.remove()
    assert calls == ["forward"]


def test_attribute_equals_prepare_then_map_and_explain():
    bundle = tiny_vit()
    images, targets = _images(bundle), torch.tensor([0, 1, 2])
    direct = get_method("gradskip", alpha=0.25).attribute(bundle, images, targets)
    assert torch.allclose(direct, prepare(bundle, images, targets).map(0.25), atol=1e-6)
    assert torch.allclose(direct, explain(bundle, images, targets, "gradskip", alpha=0.25), atol=1e-6)
    assert "gradskip" in available_methods(bundle)


def test_alpha_extremes_use_one_metric():
    bundle = tiny_vit(depth=3, num_heads=4)
    state = prepare(bundle, _images(bundle), [0, 1, 2])
    assert state.head_weights(0.0).shape == (3, 3, 4)
    assert torch.allclose(state.head_weights(0.0), state.normalized_sparsity())
    assert torch.allclose(state.head_weights(1.0), state.normalized_gradient_flow())
    mid = state.head_weights(0.5)
    assert torch.allclose(mid, 0.5 * state.normalized_sparsity() + 0.5 * state.normalized_gradient_flow())
    assert torch.allclose(mid.sum(-1), torch.ones(3, 3), atol=1e-5)


def test_gradient_flow_and_sparsity_match_an_independent_capture():
    bundle = tiny_vit(**VARIANTS["registers"])
    images, targets = _images(bundle), torch.tensor([0, 1, 2])
    state = prepare(bundle, images, targets)
    with AttentionRecorder(bundle, gradients=True) as recorder:
        with torch.enable_grad():
            inputs = images.clone().requires_grad_(True)
            bundle(inputs).gather(1, targets.view(-1, 1)).sum().backward()
    bundle.network.zero_grad(set_to_none=True)
    for layer, (attention, gradient) in enumerate(zip(recorder.attentions, recorder.gradients)):
        product = attention.detach() * gradient
        assert torch.allclose(state.gradient_flow[:, layer], product.abs().mean(dim=(-2, -1)), rtol=1e-4, atol=1e-9)
        assert torch.allclose(state.attention_flow[:, layer], product.clamp_min(0), rtol=1e-4, atol=1e-9)
        expected = gini(attention.detach()[:, :, 0, bundle.num_prefix_tokens:])
        assert torch.allclose(state.sparsity[:, layer], expected, atol=1e-6)
    assert ((state.beta_main >= 0) & (state.beta_main <= 1)).all()


def test_head_threshold_zeroes_weak_heads():
    bundle = tiny_vit(num_heads=4)
    state = prepare(bundle, _images(bundle, 1), [0])
    state.gradient_flow = torch.tensor([[[1.0, 0.5, 0.05, 0.2]] * 2])
    expected = torch.tensor([1.0, 0.5, 0.0, 0.2]) / 1.7
    assert torch.allclose(state.normalized_gradient_flow()[0, 0], expected)
    assert torch.allclose(state.normalized_gradient_flow(head_threshold=0.0)[0, 0], state.gradient_flow[0, 0] / 1.75)


def test_head_selection_ablation_keeps_a_quarter_of_the_heads():
    bundle = tiny_vit(num_heads=8, embed_dim=64)
    state = prepare(bundle, _images(bundle, 2), [0, 1])
    sparse = state.head_mask(head_selection="sparsest")
    dense = state.head_mask(head_selection="least_sparse")
    assert (sparse.sum(-1) == 2).all() and (dense.sum(-1) == 2).all()
    ranked = state.sparsity.argsort(dim=-1, descending=True)
    assert (sparse.gather(-1, ranked[..., :2]) == 1).all() and (dense.gather(-1, ranked[..., -2:]) == 1).all()
    weights = state.head_weights(0.5, head_selection="sparsest")
    assert ((weights > 0).float() <= sparse).all()
    maps = GradSkip(head_selection="least_sparse").attribute(bundle, _images(bundle, 2), torch.tensor([0, 1]))
    assert torch.isfinite(maps).all()


def test_gini_known_vectors():
    assert gini(torch.ones(7)).item() == pytest.approx(0.0, abs=1e-7)
    for n in (2, 5, 196):
        one_hot = torch.zeros(n)
        one_hot[n // 2] = 3.0
        assert gini(one_hot).item() == pytest.approx((n - 1) / n, abs=1e-6)
    assert gini(torch.zeros(4)).item() == 0.0
    assert gini(torch.tensor([1.0, 0.0, 0.0, 1.0])).item() == pytest.approx(0.5, abs=1e-6)
    rows = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 2.0]])
    assert torch.allclose(gini(rows.t(), dim=0), torch.tensor([0.0, 2 / 3]))


@pytest.mark.parametrize("variant", ["vit", "deit_distilled", "no_class_token"])
def test_rescale_gives_completeness(variant):
    bundle = tiny_vit(**VARIANTS[variant])
    state = prepare(bundle, _images(bundle), [0, 1, 2])
    assert torch.allclose(state.relevance().sum(dim=(1, 2)), state.target_logits, atol=1e-5)
    assert torch.allclose(state.map(normalize=False).sum(dim=(1, 2)), state.target_logits, atol=1e-4)
    logits = bundle(_images(bundle)).gather(1, torch.tensor([[0], [1], [2]])).squeeze(1)
    assert torch.allclose(state.target_logits, logits.detach(), atol=1e-5)
    unscaled = state.relevance(rescale=False).sum(dim=(1, 2))
    assert (unscaled > 0).all() and (unscaled <= 1 + 1e-5).all()  # relevance is conserved, prefix part dropped
    assert torch.allclose(state.token_relevance().sum(-1), torch.ones(3), atol=1e-5)


def test_hooks_removed_and_fused_attention_restored():
    bundle = tiny_vit(**VARIANTS["registers"])
    before = _hook_snapshot(bundle.network)
    assert any(flag is True for *_, flag in before)  # timm's fused attention is on by default here
    prepare(bundle, _images(bundle), [0, 1, 2])
    assert _hook_snapshot(bundle.network) == before
    assert all(p.grad is None for p in bundle.network.parameters())  # parameters' gradients untouched


def test_hooks_removed_when_the_pass_fails():
    bundle = tiny_vit()
    before = _hook_snapshot(bundle.network)
    mlp = bundle.network.blocks[1].mlp

    def broken(_x):
        raise RuntimeError("boom")

    mlp.forward = broken
    try:
        with pytest.raises(RuntimeError, match="boom"):
            prepare(bundle, _images(bundle, 2), [0, 1])
    finally:
        del mlp.forward
    assert _hook_snapshot(bundle.network) == before


def test_targets_validated():
    bundle = tiny_vit()
    with pytest.raises(ValueError, match="target"):
        prepare(bundle, _images(bundle, 2), [0, 9])
    with pytest.raises(ValueError):
        prepare(bundle, _images(bundle, 2), [0])


def test_propagation_by_hand():
    """One block, one head, class token + 2 patches: R_0 = W~^T (b * R_1) + (1 - b) * R_1."""
    flow = torch.tensor([[0.0, 2.0, 2.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # last row all zero -> identity
    values = torch.tensor([1.0, 1.0, 3.0])
    state = GradSkipState(
        attention_flow=flow.view(1, 1, 1, 3, 3), value_norms=values.view(1, 1, 1, 3),
        gradient_flow=torch.ones(1, 1, 1), sparsity=torch.ones(1, 1, 1),
        main_flow=torch.tensor([[[3.0, 1.0, 0.0]]]), skip_flow=torch.tensor([[[-1.0, 1.0, 0.0]]]),
        end_gradient_norm=torch.tensor([[2.0, 0.0, 0.0]]), logits=torch.tensor([[4.0, 0.0]]),
        targets=torch.tensor([0]), num_prefix_tokens=1, has_class_token=True, grid=(1, 2), image_hw=(2, 4),
        options={"alpha": 0.5, "head_threshold": 0.1, "beta_reduction": "token", "rescale": True,
                 "head_selection": None, "head_fraction": 0.25, "start": "auto",
                 "attention_weighting": "gradient"})
    # b_main = 3 / (3 + 1) = 0.75 at the class token; W~ row 0 = [0, 2, 6] / 8
    expected = torch.tensor([0.25, 0.75 * 0.25, 0.75 * 0.75])
    assert torch.allclose(state.token_relevance(), expected.view(1, 3))
    assert torch.allclose(state.relevance(), (torch.tensor([0.1875, 0.5625]) * 4 / 0.75).view(1, 1, 2))
    # layer reduction: b_main = |3 + 1 + 0| / (|4| + |0|) = 1
    assert torch.allclose(state.token_relevance(beta_reduction="layer"), torch.tensor([[0.0, 0.25, 0.75]]))
    maps = state.map()
    assert maps.shape == (1, 2, 4) and maps.max().item() == pytest.approx(1.0)
    assert maps[0, :, :2].mean() < maps[0, :, 2:].mean()


def test_start_options():
    bundle = tiny_vit(**VARIANTS["deit_distilled"])
    state = prepare(bundle, _images(bundle, 1), [0])
    start = state.start_relevance()
    assert start[0, :2].sum() == pytest.approx(1.0, abs=1e-5)  # class + distillation tokens carry the head's input
    assert start[0, 0] > 0 and start[0, 1] > 0
    assert state.start_relevance(start="class_token")[0, 0] == 1.0
    bundle = tiny_vit(**VARIANTS["no_class_token"])
    state = prepare(bundle, _images(bundle, 1), [0])
    start = state.start_relevance(start="gradient_norm")
    assert torch.allclose(start, torch.full_like(start, 1 / start.shape[1]), atol=1e-5)  # average pooling
    contributions = state.end_contribution.clamp_min(0)
    assert torch.allclose(state.start_relevance(), contributions / contributions.sum(), atol=1e-6)  # auto
    assert state.pooled_head and (contributions == 0).any() and (contributions > 0).any()


def _train_bright_square_vit(seed, **kwargs):
    """A tiny ViT trained (~150 steps) to say class 1 when an 8 px white square lies in the top-left quadrant."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        bundle = tiny_vit(num_classes=2, seed=seed, **kwargs)
        generator = torch.Generator().manual_seed(seed)

        def batch(n):
            x = torch.rand(n, 3, 32, 32, generator=generator) * 0.5 + 0.25
            y = torch.randint(0, 2, (n,), generator=generator)
            for i in range(n):
                if y[i] == 1:
                    r, c = torch.randint(0, 9, (2,), generator=generator)
                    x[i, :, r:r + 8, c:c + 8] = 1.0
            return x, y

        optimizer = torch.optim.AdamW(bundle.network.parameters(), lr=3e-3)
        bundle.network.train()
        for _ in range(150):
            x, y = batch(32)
            loss = torch.nn.functional.cross_entropy(bundle(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        bundle.network.eval()
        x, y = batch(64)
        return bundle, x[y == 1]
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize("seed, kwargs", [(2, {}), (1, {"class_token": False, "global_pool": "avg", "reg_tokens": 2})])
def test_known_answer_relevance_lands_on_the_evidence(seed, kwargs):
    bundle, images = _train_bright_square_vit(seed, **kwargs)
    targets = torch.ones(images.shape[0], dtype=torch.long)
    assert (bundle(images).argmax(1) == 1).float().mean() > 0.9
    maps = get_method("gradskip").attribute(bundle, images, targets)
    ratio = maps[:, :16, :16].mean(dim=(1, 2)) / maps.mean(dim=(1, 2))  # 1 = no preference, 4 = all there
    assert ratio.mean() > 2.0 and (ratio > 1).float().mean() > 0.9


def test_diagnostics_for_the_ui():
    bundle = tiny_vit(depth=3, num_heads=2)
    state = prepare(bundle, _images(bundle, 2), [0, 1])
    info = state.diagnostics(0.3, index=1)
    assert len(info["head_weights"]) == 3 and len(info["head_weights"][0]) == 2
    assert len(info["beta_main"]) == 3 and all(0 <= b <= 1 for b in info["beta_main"])
    assert info["alpha"] == 0.3 and info["target"] == 1
    assert state.beta_main_per_layer.shape == (2, 3)
    assert state.head_weights(0.3).shape == (2, 3, 2)


def test_options_validated():
    for bad in ({"alpha": 1.5}, {"beta_reduction": "mean"}, {"head_selection": "random"}, {"head_fraction": 0},
                {"start": "cls"}, {"head_threshold": -1}):
        with pytest.raises(ValueError):
            GradSkip(**bad)
    bundle = tiny_vit()
    state = prepare(bundle, _images(bundle, 1), [0])
    with pytest.raises(ValueError):
        state.map(-0.1)
    with pytest.raises(TypeError, match="head_threshold"):
        state.map(0.5, head_treshold=0.2)


def test_cnn_refused_with_a_clear_message():
    bundle = tiny_cnn()
    assert "gradskip" not in available_methods(bundle)
    with pytest.raises(MethodNotApplicable, match="ViT-family"):
        get_method("gradskip").attribute(bundle, torch.rand(1, 3, 32, 32), torch.tensor([0]))
    with pytest.raises(MethodNotApplicable, match="CNN"):
        explain(bundle, torch.rand(1, 3, 32, 32), 0, "gradskip")


def test_swin_refused_with_a_clear_message():
    torch.manual_seed(0)
    try:
        network = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, img_size=64, window_size=4,
                                    embed_dim=24, depths=(1, 1), num_heads=(1, 1), num_classes=4)
    except Exception as error:  # pragma: no cover - depends on the timm version
        pytest.skip(f"tiny Swin does not build with this timm: {error}")
    bundle = bundle_from_timm("tiny-swin", network, input_size=(64, 64))
    assert bundle.family == "swin"
    with pytest.raises(MethodNotApplicable, match="Swin"):
        get_method("gradskip").check(bundle)
    with pytest.raises(MethodNotApplicable, match="Swin"):
        prepare(bundle, torch.rand(1, 3, 64, 64), [0])


def _hand_state(weighting="gradient", attention=True):
    """One block, one head, class token + 2 patches (the by-hand case above), with its attention A."""
    flow = torch.tensor([[0.0, 2.0, 2.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    probabilities = torch.tensor([[0.5, 0.25, 0.25], [0.0, 1.0, 0.0], [0.25, 0.25, 0.5]])
    return GradSkipState(
        attention_flow=flow.view(1, 1, 1, 3, 3), value_norms=torch.tensor([1.0, 1.0, 3.0]).view(1, 1, 1, 3),
        attention=probabilities.view(1, 1, 1, 3, 3) if attention else None,
        gradient_flow=torch.ones(1, 1, 1), sparsity=torch.ones(1, 1, 1),
        main_flow=torch.tensor([[[3.0, 1.0, 0.0]]]), skip_flow=torch.tensor([[[-1.0, 1.0, 0.0]]]),
        end_gradient_norm=torch.tensor([[2.0, 0.0, 0.0]]), logits=torch.tensor([[4.0, 0.0]]),
        targets=torch.tensor([0]), num_prefix_tokens=1, has_class_token=True, grid=(1, 2), image_hw=(2, 4),
        options={"alpha": 0.5, "attention_weighting": weighting})


def test_attention_weightings_by_hand():
    """R_0 = W~^T (b * R_1) + (1 - b) R_1 with b = 0.75 at the class token, where all of R_1 starts."""
    state = _hand_state()
    # gradient: row 0 of relu(dA*A) diag|v| = [0, 2, 6] -> [0, 1/4, 3/4]
    assert torch.allclose(state.token_relevance(), torch.tensor([[0.25, 0.1875, 0.5625]]))
    # attention: row 0 of A diag|v| = [0.5, 0.25, 0.75] -> [1/3, 1/6, 1/2]
    expected = torch.tensor([[0.25 + 0.75 / 3, 0.75 / 6, 0.75 / 2]])
    assert torch.allclose(state.token_relevance(attention_weighting="attention"), expected)
    assert torch.allclose(_hand_state("attention").token_relevance(), expected)  # the captured default
    # one head: per-head normalisation changes nothing; the blend is the mean of the two rows
    assert torch.allclose(state.token_relevance(attention_weighting="gradient_per_head"), state.token_relevance())
    blend = torch.tensor([[0.25 + 0.75 * (0 + 1 / 3) / 2, 0.75 * (0.25 + 1 / 6) / 2, 0.75 * (0.75 + 0.5) / 2]])
    assert torch.allclose(state.token_relevance(attention_weighting="blend"), blend)


def test_per_head_normalisation_gives_the_head_weights_the_say():
    """Two heads, one with 10x the gradient scale: the paper's form follows the loud head, the per-head form
    follows w_q (equal weights here: the mean of the two heads' normalised rows)."""
    loud = torch.tensor([[0.0, 10.0, 0.0], [0.0, 10.0, 0.0], [0.0, 0.0, 10.0]])
    quiet = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    state = _hand_state()
    state.attention_flow = torch.stack([loud, quiet]).view(1, 1, 2, 3, 3)
    state.attention = torch.full((1, 1, 2, 3, 3), 1 / 3)
    state.value_norms = torch.ones(1, 1, 2, 3)
    state.gradient_flow, state.sparsity = torch.ones(1, 1, 2), torch.ones(1, 1, 2)
    weights = state.head_weights(0.5)
    assert torch.allclose(weights, torch.full((1, 1, 2), 0.5))
    paper = state.layer_matrices(weights)[0, 0, 0]
    per_head = state.layer_matrices(weights, attention_weighting="gradient_per_head")[0, 0, 0]
    assert torch.allclose(paper, torch.tensor([0.0, 10 / 11, 1 / 11]))
    assert torch.allclose(per_head, torch.tensor([0.0, 0.5, 0.5]))
    assert torch.allclose(state.layer_matrices(weights, attention_weighting="attention")[0, 0, 0],
                          torch.full((3,), 1 / 3))


def test_captured_attention_matches_an_independent_recording():
    bundle = tiny_vit(**VARIANTS["registers"])
    images, targets = _images(bundle), torch.tensor([0, 1, 2])
    state = prepare(bundle, images, targets)
    qkv_outputs = []
    handles = [block.attn.qkv.register_forward_hook(lambda _m, _i, out: qkv_outputs.append(out))
               for block in bundle.network.blocks]
    try:
        with AttentionRecorder(bundle) as recorder, torch.no_grad():
            bundle(images)
    finally:
        for handle in handles:
            handle.remove()
    heads = bundle.network.blocks[0].attn.num_heads
    for layer, attention in enumerate(recorder.attentions):
        assert torch.allclose(state.attention[:, layer], attention, atol=1e-6)
        b, n, width = qkv_outputs[layer].shape
        values = qkv_outputs[layer].reshape(b, n, 3, heads, width // (3 * heads))[:, :, 2]  # B x N x Hd x d
        assert torch.allclose(state.value_norms[:, layer], values.norm(dim=-1).transpose(1, 2), atol=1e-6)
    assert torch.allclose(state.attention.sum(-1), torch.ones_like(state.attention.sum(-1)), atol=1e-5)


@pytest.mark.parametrize("weighting", ATTENTION_WEIGHTINGS)
def test_every_weighting_is_a_method_option_and_a_free_override(weighting):
    bundle = tiny_vit(**VARIANTS["deit_distilled"])
    images, targets = _images(bundle), torch.tensor([0, 1, 2])
    direct = get_method("gradskip", attention_weighting=weighting, alpha=0.25).attribute(bundle, images, targets)
    assert torch.allclose(direct, prepare(bundle, images, targets).map(0.25, attention_weighting=weighting),
                          atol=1e-6)
    state = prepare(bundle, images, targets, attention_weighting=weighting)
    assert state.options["attention_weighting"] == weighting
    assert torch.allclose(state.map(0.25), direct, atol=1e-6)
    assert torch.isfinite(direct).all() and (direct >= 0).all()
    assert torch.allclose(state.token_relevance().sum(-1), torch.ones(3), atol=1e-5)  # conserved for every form
    assert torch.allclose(state.relevance().sum(dim=(1, 2)), state.target_logits, atol=1e-4)


def test_weighting_validated_and_missing_attention_is_a_clear_error():
    with pytest.raises(ValueError, match="attention_weighting"):
        GradSkip(attention_weighting="relu")
    bundle = tiny_vit()
    state = prepare(bundle, _images(bundle, 1), [0])
    with pytest.raises(ValueError, match="attention_weighting"):
        state.map(0.5, attention_weighting="plain")
    bare = _hand_state(attention=False)
    assert torch.isfinite(bare.map()).all()  # the paper's form needs no A
    with pytest.raises(ValueError, match="attention probabilities"):
        bare.map(attention_weighting="attention")


def _two_layer_state(weighting):
    """cls + 2 patches, two blocks, one head, b_main = 1 everywhere, relevance starting on the class token.
    The top block sends the class token's relevance to patch 1 with a large gradient (10); the bottom block
    sends patch 1's to patch 2 with a weak one (1)."""
    flow = torch.zeros(1, 2, 1, 3, 3)
    flow[0, 1, 0, 0, 1] = 10.0
    flow[0, 0, 0, 1, 2] = 1.0
    return GradSkipState(
        attention_flow=flow, value_norms=torch.ones(1, 2, 1, 3), attention=torch.full((1, 2, 1, 3, 3), 1 / 3),
        gradient_flow=torch.ones(1, 2, 1), sparsity=torch.ones(1, 2, 1),
        main_flow=torch.ones(1, 2, 3), skip_flow=torch.zeros(1, 2, 3),
        end_gradient_norm=torch.tensor([[1.0, 0.0, 0.0]]), logits=torch.tensor([[4.0, 0.0]]),
        targets=torch.tensor([0]), num_prefix_tokens=1, has_class_token=True, grid=(1, 2), image_hw=(2, 4),
        options={"alpha": 0.5, "attention_weighting": weighting})


def test_gradient_residual_lets_a_weak_layer_pass_relevance_on():
    # the paper's row-normalised form: the weak bottom block moves everything from patch 1 to patch 2
    assert torch.allclose(_two_layer_state("gradient").token_relevance(), torch.tensor([[0.0, 0.0, 1.0]]))
    # residual form: one scale (10) for the image; the bottom block's row is [0, 0.9 (identity), 0.1]
    state = _two_layer_state("gradient_residual")
    assert torch.allclose(state.token_relevance(), torch.tensor([[0.0, 0.9, 0.1]]))
    matrices = state.layer_matrices(state.head_weights())
    assert torch.allclose(matrices.sum(-1), torch.ones(1, 2, 3))  # still row-stochastic: relevance is conserved
    assert torch.allclose(matrices[0, 1, 0], torch.tensor([0.0, 1.0, 0.0]))


def test_class_gated_is_attention_relevance_times_the_blurred_residual_gate():
    """gate_reference="none" (the 2026-12-01 gate): attention's relevance times the evidence over its maximum, to the
    power; the default reference divides by attention first (its own test below)."""
    state = _two_layer_state("class_gated")
    attention = state.token_relevance(attention_weighting="attention")[:, 1:]
    residual = state.token_relevance(attention_weighting="gradient_residual")[:, 1:]
    ungated = state.token_relevance(gate_sigma=0, gate_power=0)[:, 1:]
    assert torch.allclose(ungated, attention / attention.sum())
    product = attention * residual / residual.max()
    evidence = {"gate_reference": "none", "gate_sigma": 0}
    assert torch.allclose(state.token_relevance(gate_power=1, **evidence)[:, 1:], product / product.sum())
    squared = attention * (residual / residual.max()) ** 2
    assert torch.allclose(state.token_relevance(gate_power=2, **evidence)[:, 1:], squared / squared.sum())
    gated = state.token_relevance(gate_power=2, gate_reference="none")  # blurred over the 1 x 2 patch grid
    assert gated[0, 0] == 0 and torch.isclose(gated.sum(), torch.tensor(1.0))
    # blurring pulls the gate towards uniform, so the gated map moves towards attention's
    assert (gated[0, 2] - attention[0, 1] / attention.sum()).abs() < (squared[0, 1] / squared.sum()
                                                                       - attention[0, 1] / attention.sum()).abs()
    with pytest.raises(ValueError, match="gate_sigma"):
        state.map(gate_sigma=-1)
    with pytest.raises(ValueError, match="gate_power"):
        GradSkip(gate_power=9)


@pytest.mark.parametrize("variant", ["vit", "deit_distilled", "registers_no_class_token_non_square"])
def test_class_gated_propagates_both_forms_as_their_own_propagations_do(variant):
    """The joint propagation of "class_gated" (both forms as one batch of 2B) gives what each form's own
    propagation gives, also with head weights that zero whole layers (identity rows)."""
    bundle = tiny_vit(**VARIANTS[variant])
    images, targets = _images(bundle), torch.tensor([0, 1, 2])
    state = prepare(bundle, images, targets)
    for alpha, threshold in ((0.5, 0.1), (1.0, 1.0), (0.0, 0.1)):
        attention, residual = state._gated_relevance(alpha, head_threshold=threshold)
        assert torch.allclose(attention, state._raw_relevance(alpha, head_threshold=threshold,
                                                              attention_weighting="attention"), atol=1e-6)
        assert torch.allclose(residual, state._raw_relevance(alpha, head_threshold=threshold,
                                                             attention_weighting="gradient_residual"), atol=1e-6)
        assert torch.allclose(attention.sum(-1), torch.ones(3)) and torch.allclose(residual.sum(-1), torch.ones(3))
    state.sparsity = torch.zeros_like(state.sparsity)  # alpha 0 and no sparsity: every W~ row is zero
    attention, _ = state._gated_relevance(0.0)
    assert torch.allclose(attention, state.start_relevance())  # identity everywhere: the start relevance


def test_class_gate_knee_flattens_the_gate_above_it():
    """gate_knee k: the gate is min(1, g / k) ** power (g the blurred residual over its maximum), so patches
    with at least k of the maximum class evidence are ranked by attention alone; k = 1 is the plain gate."""
    state = _two_layer_state("class_gated")
    _, residual = state._gated_relevance(None)
    plain = state.class_gate(None, residual, gate_sigma=0, gate_power=1)
    knee = state.class_gate(None, residual, gate_sigma=0, gate_power=2, gate_knee=0.5)
    assert torch.allclose(knee, (plain / 0.5).clamp_max(1) ** 2)
    assert torch.allclose(state.class_gate(None, residual, gate_sigma=0, gate_power=1, gate_knee=1.0), plain)
    assert (knee >= plain ** 2 - 1e-7).all() and knee.max() == 1
    with pytest.raises(ValueError, match="gate_knee"):
        state.map(gate_knee=0)
    with pytest.raises(ValueError, match="gate_knee"):
        GradSkip(gate_knee=1.5)


def test_class_gate_relative_to_attention_is_the_evidence_per_unit_of_attention():
    """gate_reference="attention": with no blur the gate is (r / sum r) / (a / sum a + f max(a / sum a)) over its
    maximum, to the power (f = GATE_REFERENCE_FLOOR); evidence that only repeats attention's (r = a) gives the
    nearly flat (1 + f) a / (a + f max a), and where the evidence outweighs attention the gate is highest."""
    from explainers.methods.gradskip import GATE_REFERENCE_FLOOR as f

    state = _two_layer_state("class_gated")
    attention = torch.tensor([[0.2, 0.6, 0.2]])  # prefix token first, then the 2 patches
    residual = torch.tensor([[0.0, 0.5, 0.5]])
    gate = state.class_gate(None, residual, attention, gate_sigma=0, gate_power=2, gate_reference="attention")
    a, r = torch.tensor([0.75, 0.25]), torch.tensor([0.5, 0.5])
    expected = r / (a + f * a.max())
    assert torch.allclose(gate, ((expected / expected.max()) ** 2).unsqueeze(0))
    assert gate[0, 1] == 1 and gate[0, 0] < 1  # patch 2 has more evidence than attention there
    same = state.class_gate(None, attention, attention, gate_sigma=0, gate_power=1, gate_reference="attention")
    assert torch.allclose(same, ((1 + f) * a / (a + f * a.max())).unsqueeze(0))
    # "none": the evidence alone (equal on both patches here); "attention" is the default (chosen on val data)
    plain = state.class_gate(None, residual, attention, gate_sigma=0, gate_power=1, gate_reference="none")
    assert torch.allclose(plain, torch.ones(1, 2))
    assert state.options["gate_reference"] == "attention" and GradSkip().options["gate_reference"] == "attention"
    # through the map: attention's patch relevance times the gate, from one joint propagation
    relevance, evidence = state._gated_relevance(None)
    gated = relevance[:, 1:] * state.class_gate(None, evidence, relevance, gate_reference="attention")
    assert torch.allclose(state.token_relevance(gate_reference="attention")[:, 1:], gated / gated.sum())
    with pytest.raises(ValueError, match="gate_reference"):
        state.map(gate_reference="rollout")
    with pytest.raises(ValueError, match="gate_reference"):
        GradSkip(gate_reference="evidence")


def test_gaussian_blur_keeps_mass_and_symmetry():
    from explainers.methods.gradskip import _gaussian_blur

    grid = torch.zeros(1, 1, 15, 15)
    grid[0, 0, 7, 7] = 1.0
    blurred = _gaussian_blur(grid, 2.0)
    assert torch.isclose(blurred.sum(), torch.tensor(1.0), atol=1e-3)
    assert torch.allclose(blurred, blurred.flip(-1)) and torch.allclose(blurred, blurred.transpose(-1, -2))
    assert blurred[0, 0, 7, 7] == blurred.max() and blurred[0, 0, 7, 7] < 0.1
    assert torch.equal(_gaussian_blur(grid, 0.0), grid)
    small = _gaussian_blur(torch.rand(2, 1, 2, 3), 3.0)  # a radius larger than the grid: edges replicated
    assert small.shape == (2, 1, 2, 3) and torch.isfinite(small).all()


def test_gaussian_blur_is_the_replicate_padded_separable_convolution():
    """The blur runs as products with cached blur matrices (one Kronecker matrix on small grids, two on larger ones);
    it must be the same linear map as padding the edges and convolving rows then columns with the normalised 1-D
    Gaussian (radius 3 sigma), gradients included, on both paths."""
    import torch.nn.functional as F

    from explainers.smoothing import gaussian_smooth

    def by_convolution(grid, sigma):
        radius = max(1, int(round(3 * sigma)))
        taps = torch.exp(-torch.arange(-radius, radius + 1, dtype=grid.dtype) ** 2 / (2 * sigma ** 2))
        taps = taps / taps.sum()
        padded = F.pad(grid, (radius,) * 4, mode="replicate")
        return F.conv2d(F.conv2d(padded, taps.view(1, 1, 1, -1)), taps.view(1, 1, -1, 1))

    torch.manual_seed(0)
    for shape, sigma in (((2, 1, 64, 64), 8.0), ((3, 1, 14, 14), 2.0), ((1, 1, 7, 9), 0.7), ((2, 1, 2, 3), 3.0)):
        grid = torch.randn(shape, dtype=torch.float64, requires_grad=True)
        fast, slow = gaussian_smooth(grid, sigma), by_convolution(grid, sigma)
        assert fast.shape == shape and torch.allclose(fast, slow, atol=1e-12)
        weights = torch.randn(shape, dtype=torch.float64)
        assert torch.allclose(torch.autograd.grad((fast * weights).sum(), grid)[0],
                              torch.autograd.grad((slow * weights).sum(), grid)[0], atol=1e-12)
    constant = torch.full((1, 1, 10, 12), 3.5)
    assert torch.allclose(gaussian_smooth(constant, 4.0), constant)  # rows of each blur matrix sum to 1
    for h, w in ((11, 13), (21, 19)):  # one grid blurred by the Kronecker matrix, one by two products
        with torch.inference_mode():  # a one-pass map blurred first under inference mode caches the matrices...
            gaussian_smooth(torch.rand(1, 1, h, w), 1.7)
        grid = torch.rand(1, 1, h, w, requires_grad=True)
        gaussian_smooth(grid, 1.7).sum().backward()  # ...which a later blur under autograd must still be able to save
        assert grid.grad is not None and torch.isfinite(grid.grad).all()


def test_beta_profile_by_hand():
    state = _hand_state()
    profile = state.beta_profile()
    # all of R_1 starts on the class token, where b_main = 3 / (3 + 1): 75% goes through attention
    assert profile["main_share"] == pytest.approx([0.75]) and profile["skip_share"] == pytest.approx([0.25])
    assert profile["beta_main_mean"] == pytest.approx([(0.75 + 0.5 + 0.0) / 3])
    assert profile["main_flow"] == pytest.approx([4.0]) and profile["skip_flow"] == pytest.approx([0.0])
    assert profile["layers"] == [0] and profile["target"] == 0
    with pytest.raises(IndexError):
        state.beta_profile(index=1)


def test_beta_profile_on_a_vit():
    bundle = tiny_vit(depth=4, num_heads=2)
    state = prepare(bundle, _images(bundle, 2), [0, 1])
    entering = state.layer_relevance()
    assert entering.shape == (2, 4, state.attention_flow.shape[-1])
    assert torch.allclose(entering.sum(-1), torch.ones(2, 4), atol=1e-5)
    assert torch.allclose(entering[:, -1], state.start_relevance())  # the top block receives the start
    beta = state.beta_main_tokens()
    for index in range(2):
        profile = state.beta_profile(0.3, index=index)
        assert len(profile["main_share"]) == 4
        assert all(0 <= m <= 1 for m in profile["main_share"])
        assert [m + s for m, s in zip(profile["main_share"], profile["skip_share"])] == pytest.approx([1.0] * 4)
        expected = (beta[index] * state.layer_relevance(0.3)[index]).sum(-1)
        assert profile["main_share"] == pytest.approx(expected.tolist(), abs=1e-6)
        # the relevance-weighted share at the top block reads b_main at the tokens the head reads (not the mean)
        assert profile["main_share"][-1] == pytest.approx(float((beta[index, -1] * state.start_relevance()[index]).sum()))
    assert state.diagnostics(0.3, index=1)["main_share"] == pytest.approx(state.beta_profile(0.3, index=1)["main_share"])


def test_beta_profile_library_function():
    from explainers.methods.gradskip import beta_profile

    bundle = tiny_vit(depth=3, num_heads=2)
    image = _images(bundle, 1)
    profile = beta_profile(bundle, image, 2, alpha=0.5)
    state = prepare(bundle, image, [2])
    assert profile["main_share"] == pytest.approx(state.beta_profile(0.5)["main_share"], abs=1e-6)
    assert len(profile["main_share"]) == 3 and profile["target"] == 2
    assert beta_profile(bundle, image[0], 2, alpha=0.5)["main_share"] == pytest.approx(profile["main_share"], abs=1e-6)
    # from a cached state: no model pass
    with forward_passes(bundle.network) as calls:
        cached = beta_profile(bundle, image, 2, 0.5, state=state, attention_weighting="attention")
    assert calls == [] and cached["attention_weighting"] == "attention"
    assert cached["main_share"] == pytest.approx(state.beta_profile(0.5, attention_weighting="attention")["main_share"])
    with pytest.raises(ValueError, match="explains class"):
        beta_profile(bundle, image, 1, state=state)
    with pytest.raises(ValueError, match="one image"):
        beta_profile(bundle, _images(bundle, 2), 0)


def _assert_same_capture(first: dict, second: dict) -> None:
    """Two captures of the same pass: every statistic equal up to float rounding (stacked A, dA, |v| and the
    per-layer activations and their gradients)."""
    layers = first["attention"].shape[1]
    assert first["attention"].shape == second["attention"].shape and first["attention"].dim() == 5
    assert torch.allclose(first["attention"], second["attention"], atol=1e-6)
    assert torch.allclose(first["attention_grad"], second["attention_grad"], atol=1e-6, rtol=1e-4)
    assert first["attention_grad"].abs().amax() > 0
    assert torch.allclose(first["value_norms"], second["value_norms"], atol=1e-6, rtol=1e-5)
    for key in ("x", "o", "grad_x", "grad_o"):
        assert len(first[key]) == len(second[key]) == layers
        for a, b in zip(first[key], second[key]):
            assert torch.allclose(a, b, atol=1e-6, rtol=1e-4), key
    for key in ("z", "grad_z", "logits"):
        assert torch.allclose(first[key], second[key], atol=1e-6, rtol=1e-4), key


@pytest.mark.parametrize("variant", ["vit", "deit_distilled", "registers_no_class_token_non_square",
                                     "layer_scale_non_square", "qk_norm"])
def test_rebuilt_attention_equals_the_unfused_capture(variant):
    """rebuild_attention=True (the "auto" default on a GPU, for timm's Attention) keeps timm's fused attention on and rebuilds
    A = softmax(q k^T s), dA = dO v^T after the pass; rebuild_attention=False switches fused attention off
    and reads A at attn_drop. Both must give the same statistics."""
    from explainers.methods.gradskip import capture

    bundle = tiny_vit(**({"qk_norm": True} if variant == "qk_norm" else VARIANTS[variant]))
    images, targets = _images(bundle), torch.tensor([0, 1, 2])
    seen = []
    handle = bundle.network.blocks[0].attn.register_forward_pre_hook(lambda m, _a: seen.append(m.fused_attn))
    try:
        rebuilt = capture(bundle, images, targets, rebuild_attention=True)
        unfused = capture(bundle, images, targets, rebuild_attention=False)
    finally:
        handle.remove()
    assert rebuilt["rebuilt_attention"] and not unfused["rebuilt_attention"]
    assert seen == [True, False]  # the rebuilding path leaves the fused kernel on
    assert not capture(bundle, images, targets)["rebuilt_attention"]  # "auto" on a CPU: unfused (measured faster)
    _assert_same_capture(rebuilt, unfused)
    state = prepare(bundle, images, targets)
    assert state.attention_flow.abs().sum() > 0


def test_attention_modules_other_than_timms_fall_back_to_the_unfused_capture():
    """The rebuilt path takes only timm's own Attention class; a subclass under another name (whose forward may
    differ) is read at attn_drop with fused attention switched off, and its statistics are the same."""
    from timm.models.vision_transformer import Attention

    from explainers.methods.gradskip import capture

    class CustomAttention(Attention):
        pass

    bundle = tiny_vit()
    images, targets = _images(bundle), torch.tensor([0, 1, 2])
    standard = capture(bundle, images, targets, rebuild_attention=True)
    for block in bundle.network.blocks:
        block.attn.__class__ = CustomAttention
    fallback = capture(bundle, images, targets, rebuild_attention=True)
    assert standard["rebuilt_attention"] and not fallback["rebuilt_attention"]
    assert all(block.attn.fused_attn for block in bundle.network.blocks)  # restored after the unfused pass
    _assert_same_capture(standard, fallback)


@pytest.mark.parametrize("weighting", ["gradient", "attention", "gradient_residual", "blend"])
def test_folded_propagation_steps_equal_the_matrices_they_fold(weighting):
    """`_steps` folds the row sums, b_main and the identity rows of all-zero rows into one scaling and one diagonal
    add: it must equal diag(b) W~ + diag(1 - b) built from `layer_matrices` (random state, zero rows included)."""
    generator = torch.Generator().manual_seed(0)
    b, layers, heads, n = 2, 3, 2, 5
    flow = torch.rand(b, layers, heads, n, n, generator=generator)
    flow[0, 1, :, 2] = 0  # an all-zero row in every head: W~ takes the identity row there
    flow[1, 2] = 0  # a layer without any gradient
    attention = torch.rand(b, layers, heads, n, n, generator=generator).softmax(dim=-1)
    attention[0, 0, :, 3] = 0
    state = GradSkipState(
        attention_flow=flow, attention=attention, value_norms=torch.rand(b, layers, heads, n, generator=generator),
        gradient_flow=torch.rand(b, layers, heads, generator=generator), sparsity=torch.rand(b, layers, heads,
                                                                                          generator=generator),
        main_flow=torch.randn(b, layers, n, generator=generator), skip_flow=torch.randn(b, layers, n,
                                                                                         generator=generator),
        end_gradient_norm=torch.rand(b, n, generator=generator), logits=torch.randn(b, 3, generator=generator),
        targets=torch.tensor([0, 2]), num_prefix_tokens=1, has_class_token=True, grid=(2, 2), image_hw=(4, 4),
        options={"alpha": 0.5, "attention_weighting": weighting})
    weights, beta = state.head_weights(0.3), state.beta_main_tokens()
    expected = beta.unsqueeze(-1) * state.layer_matrices(weights) + torch.diag_embed(1 - beta)
    steps = state._steps(weights, beta)
    assert torch.allclose(steps, expected, atol=1e-6)
    assert torch.allclose(steps.sum(dim=-1), torch.ones(b, layers, n), atol=1e-5)  # relevance is conserved
    written = torch.full_like(steps, float("nan"))
    assert state._steps(weights, beta, out=written).data_ptr() == written.data_ptr()
    assert torch.allclose(written, expected, atol=1e-6)
