"""The method contract, checked over the whole registry (timm's habit): every registered method runs on a tiny
ViT and a tiny CNN built here, or refuses with MethodNotApplicable and a message. Maps are B x H x W and
finite, a batch gives the per-sample maps, and the model is left as it was (requires_grad flags, train/eval
mode, fused attention). A new method file is tested by adding nothing here."""
import threading

import pytest
import torch

from conftest import tiny_cnn, tiny_vit
from explainers.aha.network import AHAExplainer
from explainers.aha.store import forget_explainers, register_explainer
from explainers.engine import explain
from explainers.methods import METHODS, MethodNotApplicable, get_method

FAST = {"rise": {"n_masks": 40, "batch_size": 20},  # few masks: the contract, not the quality
        "occlusion": {"window_fraction": 0.25}}
FAMILIES = {"vit": "vit", "cnn": "resnet"}  # the family of each tiny model `make_bundle` builds
APPLICABLE = [(kind, name) for kind, family in FAMILIES.items() for name in sorted(METHODS)
              if family in METHODS[name].families]


def make_bundle(kind: str):
    bundle = tiny_vit(name="contract-vit") if kind == "vit" else tiny_cnn(name="contract-cnn")
    bundle.network.eval()
    register_explainer(bundle, AHAExplainer(bundle))  # untrained: AHA's contract, not its quality
    return bundle


def model_state(bundle) -> dict:
    network = bundle.network
    return {"requires_grad": [p.requires_grad for p in network.parameters()],
            "training": [m.training for m in network.modules()],
            "fused": [getattr(m, "fused_attn", None) for m in network.modules()],
            "hooks": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
                         for m in network.modules()),
            "weights": [p.detach().clone() for p in network.parameters()]}


@pytest.fixture(scope="module", params=["vit", "cnn"])
def bundle(request):
    made = make_bundle(request.param)
    yield made
    forget_explainers()


@pytest.mark.parametrize("name", sorted(METHODS))
def test_contract(bundle, name):
    cls = METHODS[name]
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(3, 3, 32, 32, generator=generator)
    targets = [0, 1, 3]
    method = get_method(name, **FAST.get(name, {}))
    if bundle.family not in cls.families:
        with pytest.raises(MethodNotApplicable) as refused:
            explain(bundle, images, targets, name, **FAST.get(name, {}))
        assert len(str(refused.value)) > 20 and bundle.name in str(refused.value)
        return
    before = model_state(bundle)
    torch.manual_seed(0)
    maps = explain(bundle, images, targets, name, **FAST.get(name, {}))
    assert tuple(maps.shape) == (3, 32, 32)
    assert torch.isfinite(maps).all()
    if not cls.baseline:  # the random map draws one batch of noise: its samples are not per-image maps
        singles = torch.cat([method.attribute(bundle, images[i:i + 1], torch.tensor([t]))
                             for i, t in enumerate(targets)])
        assert torch.allclose(maps, singles, atol=1e-4, rtol=1e-3), (maps - singles).abs().max()
    after = model_state(bundle)
    for key in ("requires_grad", "training", "fused", "hooks"):
        assert before[key] == after[key], key
    assert all(torch.equal(a, b) for a, b in zip(before["weights"], after["weights"]))


@pytest.mark.parametrize("name", sorted(METHODS))
def test_declares_what_the_ui_needs(name):
    cls = METHODS[name]
    assert cls.name == name and cls.label and cls.description and cls.colour and cls.colour.startswith("#")
    for option in cls.declared_options():
        assert option.minimum <= option.default <= option.maximum and option.step > 0 and option.label
        get_method(name, **{option.name: option.kind(option.default)})  # a valid keyword of the method
        if option.live:
            assert cls.has_prepare(), f"{name}: a live option needs a prepare hook"


@pytest.mark.parametrize("name", sorted(METHODS))
def test_the_constructor_refuses_a_declared_option_outside_its_range(name):
    """The range is declared once, on the Option, and every caller meets it in the method's constructor."""
    for option in METHODS[name].declared_options():
        below, above = option.minimum - option.step, option.maximum + option.step
        for value in (below, above):
            with pytest.raises(ValueError, match="between"):
                get_method(name, **{option.name: option.kind(value)})
        get_method(name, **{option.name: option.kind(option.maximum)})  # the ends themselves are allowed


def test_every_method_explains_one_of_the_tiny_models():
    assert {name for _, name in APPLICABLE} == set(METHODS)


@pytest.mark.parametrize("kind,name", APPLICABLE)
def test_declared_passes_match_the_images_it_forwards(kind, name):
    """The app's time estimate before a run (`model_passes`) is within a factor 3 of the images one map really
    sends through the model (a backward counts as up to two), with the interactive options and with every costly
    user option at its maximum. Run for every (model, method) pair the method can explain: none is skipped."""
    cls = METHODS[name]
    bundle = make_bundle(kind)
    assert bundle.family == FAMILIES[kind]
    images = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    forwarded = []  # images through the first convolution (the patch embedding): forward_features counts too
    stem = next(m for m in bundle.network.modules() if isinstance(m, torch.nn.Conv2d))
    handle = stem.register_forward_hook(lambda module, args, output: forwarded.append(args[0].shape[0]))
    # the defaults, then every option that costs model passes at its maximum (AHA: 10 refinement steps)
    costly = {o.name: o.kind(o.maximum) for o in cls.user_options if not o.live}
    try:
        for options in ({}, costly) if costly else ({},):
            options = {**cls.interactive_options(bundle), **options}
            forwarded.clear()
            explain(bundle, images, [1], name, **options)
            declared = cls.model_passes(bundle, options)
            assert isinstance(declared, int) and declared >= 0
            assert declared / 3 <= sum(forwarded) <= declared, (options, declared, sum(forwarded))
    finally:
        handle.remove()
        forget_explainers()


def test_orders_and_colours_are_distinct():
    assert len({cls.order for cls in METHODS.values()}) == len(METHODS)
    assert len({cls.colour for cls in METHODS.values()}) == len(METHODS)


def test_a_function_of_the_output_as_target():
    """Grad-CAM explains a scalar per image computed from the logits (a critic's V(s)); the others refuse it."""
    bundle = tiny_cnn(name="contract-score")
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    by_index = explain(bundle, images, [1, 2], "gradcam")
    by_function = explain(bundle, images, lambda logits: logits[:, 1:3].diagonal(), "gradcam")
    assert torch.allclose(by_index, by_function, atol=1e-6)
    value = explain(bundle, images, lambda logits: logits.logsumexp(dim=1), "gradcam")
    assert value.shape == (2, 32, 32) and torch.isfinite(value).all()
    with pytest.raises(MethodNotApplicable, match="class indices only"):
        explain(bundle, images, lambda logits: logits[:, 0], "rise", n_masks=8)


def test_hook_methods_are_thread_safe_on_their_own():
    """Two threads running rollout and Chefer on one bundle, calling `attribute` itself (not the engine, which
    holds the lock): every map equals the single-threaded one (the capture code takes the bundle's lock)."""
    bundle = tiny_vit(name="contract-threads")
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    expected = {name: explain(bundle, images, [0, 1], name) for name in ("rollout", "chefer", "gradcam")}
    errors, wrong = [], []

    def work(name):
        try:
            for _ in range(12):
                maps = get_method(name).attribute(bundle, images, torch.tensor([0, 1]))
                if not torch.allclose(maps, expected[name], atol=1e-5):
                    wrong.append(name)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(f"{name}: {type(error).__name__}: {error}")

    threads = [threading.Thread(target=work, args=(name,)) for name in ("rollout", "chefer", "gradcam", "rollout")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and wrong == []
