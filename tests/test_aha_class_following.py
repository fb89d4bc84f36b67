"""The class-following one pass (issue 39 item 3): scores for flat-probability targets, varied targets, the class
input of class-token ViTs, native-size mosaics, warm starts across models, and the checkpoint rule."""
import json
import math

import pytest
import torch

from conftest import as_uint8, tiny_vit, write_labelled_folder
from explainers.aha.network import AHAExplainer
from explainers.aha.objective import soft_curves, target_scores
from explainers.aha.store import load_explainer, save_explainer


def cell_folder(root, count=16, size=32, seed=0):
    """Class k = a bright square in quadrant k on a noisy background (labels 0-3), as PNGs with labels.csv."""
    generator = torch.Generator().manual_seed(seed)
    half, side = size // 2, size // 4

    def cell(i):
        image = torch.rand(3, size, size, generator=generator) * 0.4 + 0.1
        label = i % 4
        top, left = (label // 2) * half, (label % 2) * half
        image[:, top + 2: top + 2 + side, left + 2: left + 2 + side] = 0.95
        return f"img_{i}.png", as_uint8(image), label

    return write_labelled_folder(root, (cell(i) for i in range(count)))


def test_target_scores_known_answers():
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0]])
    targets = torch.tensor([1, 2])
    probs = logits.softmax(1)
    assert torch.allclose(target_scores(logits, targets, "prob"), probs[[0, 1], [1, 2]])
    assert torch.allclose(target_scores(logits, targets, "logprob"), probs[[0, 1], [1, 2]].log())
    assert torch.allclose(target_scores(logits, targets, "margin"), torch.tensor([1.0 - 2.0, 1.0 - 3.0]))
    assert target_scores(logits, torch.tensor([0, 1]), "margin").tolist() == [1.0, 2.0]  # the top class: positive
    with pytest.raises(ValueError, match="score must be one of"):
        target_scores(logits, targets, "rank")


def test_other_scores_apply_to_chosen_rows_only_and_keep_the_probability_scale():
    bundle = tiny_vit()
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(3, 3, 32, 32, generator=generator)
    maps = torch.rand(3, 32, 32, generator=generator)
    targets = torch.tensor([0, 1, 2])
    references = torch.full_like(images, 0.5)
    common = dict(grid=4, tau=0.3, noise=False)
    plain = soft_curves(bundle, images, maps, targets, references, **common)
    none = soft_curves(bundle, images, maps, targets, references, score="logprob",
                       score_rows=torch.tensor([False, False, False]), **common)
    assert torch.allclose(plain.deletion, none.deletion) and torch.allclose(plain.insertion, none.insertion)
    rows = torch.tensor([False, True, True])
    mixed = soft_curves(bundle, images, maps, targets, references, score="margin", score_rows=rows, **common)
    assert torch.allclose(mixed.deletion[0], plain.deletion[0])
    with torch.no_grad():
        clean = target_scores(bundle(images), targets, "margin")
        blank = target_scores(bundle(references), targets, "margin")
    scale = (clean - blank).abs().clamp_min(1.0)
    # the end points: the clean image's score at p = 0 of deletion, the reference's at p = 1, each over its gap
    assert torch.allclose(mixed.deletion[1:, 0], (clean / scale)[1:], atol=1e-5)
    assert torch.allclose(mixed.deletion[1:, -1], (blank / scale)[1:], atol=1e-5)
    assert torch.allclose(mixed.insertion[1:, 0], (blank / scale)[1:], atol=1e-5)


def test_varied_targets_are_the_top_class_the_runner_up_and_another_class():
    from explainers.aha_training.data import pick_targets

    logits = torch.tensor([[5.0, 4.0, 0.0, 1.0, 2.0], [0.0, 1.0, 9.0, 8.0, 2.0]]).repeat(20, 1)
    index, target, not_top = pick_targets(logits, torch.zeros(40, dtype=torch.long), "varied",
                                      torch.Generator().manual_seed(0))
    assert index.tolist() == list(range(40)) * 3
    first, second, other = target.view(3, 40)
    assert first.tolist() == [0, 2] * 20 and second.tolist() == [1, 3] * 20
    assert all(o not in (f, s) for f, s, o in zip(first.tolist(), second.tolist(), other.tolist()))
    assert len(set(other[::2].tolist())) == 3  # the random class is drawn among all the others
    assert not_top.tolist() == [False] * 40 + [True] * 80


def test_mosaic_targets_are_different_present_quadrants():
    from explainers.aha_training.data import mosaic_targets

    labels = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23]])
    index, target = mosaic_targets(labels, torch.Generator().manual_seed(0), per_mosaic=2)
    assert index.tolist() == [0, 0, 1, 1]
    assert set(target[:2].tolist()) <= {10, 11, 12, 13} and target[0] != target[1]
    assert set(target[2:].tolist()) <= {20, 21, 22, 23} and target[2] != target[3]


def test_the_class_following_key_ranks_follows_and_faithful_first():
    from explainers.aha_training.validation import class_following_key

    def key(rho, insdel, gridpg=None):
        row = {"class_rho": rho, "ins_minus_del": insdel} | ({} if gridpg is None else {"gridpg": gridpg})
        return class_following_key(row, floor=0.40, rho_max=0.5, gridpg_min=None, primary="ins_minus_del")

    both, follows_only, faithful_only = key(0.45, 0.41), key(0.2, 0.39), key(0.9, 0.50)
    assert both > follows_only > faithful_only > key(0.9, 0.39)
    assert key(0.45, 0.42) > key(0.1, 0.41)  # among equals, ins-del decides
    assert not key(float("nan"), 0.5)[1]
    grid = class_following_key({"ins_minus_del": 0.5, "gridpg": 0.6}, floor=0.4, rho_max=None, gridpg_min=0.526,
                               primary="gridpg")
    assert grid == (True, True, True, 0.6)


def test_schedule_factor_warms_up_then_falls_to_zero():
    from explainers.aha_training.loop import schedule_factor

    assert schedule_factor(0.03, 0.06) == pytest.approx(0.5)
    assert schedule_factor(0.06, 0.06) == pytest.approx(1.0)
    assert schedule_factor(0.53, 0.06) == pytest.approx(0.5)
    assert schedule_factor(1.0, 0.06) == pytest.approx(0.0, abs=1e-12) and schedule_factor(2.0, 0.06) == 0.0


def test_the_class_input_reads_each_token_through_the_head_row_and_starts_at_zero():
    bundle = tiny_vit(num_classes=4)
    torch.manual_seed(0)
    plain = AHAExplainer(bundle, width=8, embed_dim=8)
    torch.manual_seed(0)
    with_input = AHAExplainer(bundle, width=8, embed_dim=8, class_input="token_logits")
    missing, unexpected = with_input.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and all(name.startswith(("class_inputs.", "class_mix")) for name in missing)
    with torch.no_grad():
        for conv in (plain.head.conv2,):
            conv.weight.normal_()
        with_input.head.load_state_dict(plain.head.state_dict())
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    targets = torch.tensor([0, 3])
    encoded = with_input.encode(images)
    with torch.no_grad():
        assert torch.allclose(plain(images, targets), with_input(encoded, targets), atol=1e-5)  # zero at the start
        # the input by hand: final normed patch tokens through the head, log-softmax, the target's channel
        final, _ = bundle.network.forward_intermediates(bundle.normalize(images), indices=list(with_input.indices),
                                                        intermediates_only=False)
        token_logits = bundle.network.get_classifier()(final[:, 1:])  # B x 16 x classes
        expected = token_logits.log_softmax(-1)[torch.arange(2), :, targets].view(2, 4, 4)
        expected = (expected - expected.mean((1, 2), keepdim=True)) / expected.flatten(1).std(1, unbiased=False).view(2, 1, 1)
        assert torch.allclose(with_input.class_token_map(encoded, targets), expected, atol=1e-4)
        other = with_input.class_token_map(encoded, torch.tensor([1, 2]))
        assert not torch.allclose(other, expected, atol=1e-2)  # a class-specific input
        with_input.class_mix.fill_(1.0)
        a, b = with_input(encoded, targets), with_input(encoded, torch.tensor([1, 2]))
        assert not torch.allclose(a, b, atol=1e-3)


def test_class_input_survives_save_and_load_and_a_warm_start_across_models(tmp_path):
    from explainers.aha_training.loop import warm_start

    bundle = tiny_vit("tiny-a", seed=0)
    other_model = tiny_vit("tiny-b", seed=1)  # same shapes, other weights (as the grid ViT beside the cell ViT)
    torch.manual_seed(0)
    start = AHAExplainer(bundle, width=8, embed_dim=8, output_blur=2.0)
    with torch.no_grad():
        start.head.conv2.weight.normal_()
    save_explainer(start, tmp_path / "aha-a", {"base_model": "tiny-a", "exported_step": 3})
    warm, facts = warm_start(other_model, tmp_path / "aha-a", "token_logits")
    assert warm.class_input == "token_logits" and warm.output_blur == 0.0
    assert facts["base_model"] == "tiny-a" and facts["its_output_blur_px"] == 2.0
    assert set(facts["new_weights_at_zero"]) == {"class_mix"} | {f"class_inputs.{i}.{p}" for i in range(len(warm.indices))
                                                                 for p in ("weight", "bias")}
    assert torch.equal(warm.head.conv2.weight, start.head.conv2.weight)
    save_explainer(warm, tmp_path / "aha-b", {"base_model": "tiny-b"})
    loaded = load_explainer(other_model, tmp_path / "aha-b")
    assert loaded.class_input == "token_logits" and json.loads((tmp_path / "aha-b.json").read_text())[
        "architecture"]["class_input"] == "token_logits"
    wider = AHAExplainer(bundle, width=12, embed_dim=8)
    save_explainer(wider, tmp_path / "aha-wide", {"base_model": "tiny-a"})
    loaded_wide, _ = warm_start(bundle, tmp_path / "aha-wide")
    assert loaded_wide.arch["width"] == 12  # its own architecture
    (tmp_path / "aha-bad.json").write_text(json.dumps({"architecture": {"width": 8, "embed_dim": 8}}))
    save_explainer(AHAExplainer(bundle, width=8, embed_dim=16), tmp_path / "aha-bad2", {})
    (tmp_path / "aha-bad.safetensors").write_bytes((tmp_path / "aha-bad2.safetensors").read_bytes())
    with pytest.raises(ValueError, match="does not fit"):
        warm_start(bundle, tmp_path / "aha-bad")


def test_class_following_training_on_native_size_mosaics_exports_the_rule_s_choice(tmp_path):
    """A class-token ViT trains on varied targets and on mosaics at its own input size; every validation row holds
    the class rho and GridPG; the exported checkpoint is the best by the class-following key."""
    from explainers.aha_training.validation import class_following_key, validation_mosaics
    from explainers.aha_training.data import mosaic_cell_size
    from explainers.aha_training.loop import train_aha

    bundle = tiny_vit("tiny-cells", num_classes=4)
    data = cell_folder(tmp_path / "train", count=16)
    val = cell_folder(tmp_path / "val", count=8, seed=1)
    assert mosaic_cell_size(bundle) == (16, 16)
    mosaics, classes = validation_mosaics(bundle, str(val), 2)
    assert mosaics.shape == (2, 3, 32, 32) and classes.shape == (2, 4)  # at the ViT's own input size
    card = train_aha(bundle=bundle, data=str(data), out=str(tmp_path / "run" / "aha-x"), val_data=str(val), steps=3,
                     batch_size=4, fractions=5, width=8, embed_dim=8, targets="varied", score="logprob",
                     class_input="token_logits", select_rule="class-following", val_rho_max=0.5, val_every=1,
                     val_track=4, val_limit=4, val_mosaics=2, mosaic_every=2, mosaic_classes=2, progress=False,
                     compare=("rollout",), time_budget_minutes=10.0, time_schedule=True)
    rows = card["validation"]
    assert [row["step"] for row in rows] == [0, 1, 2, 3]
    assert all(-1 <= row["class_rho"] <= 1 and 0 <= row["gridpg"] <= 1 for row in rows)
    floor = card["recipe"]["validation_floor"]
    assert floor["method"] == "rollout" and card["recipe"]["class_input"] == "token_logits"
    keys = {row["step"]: class_following_key(row, floor=floor["ins_minus_del"], rho_max=0.5, gridpg_min=None,
                                             primary="ins_minus_del") for row in rows}
    assert card["exported_step"] == max(keys, key=lambda step: (keys[step], -step))
    assert card["architecture"]["class_input"] == "token_logits"
    assert math.isfinite(card["held_out"]["rollout_deletion_auc"])


def saved_with_class_term(tmp_path, key: str, weight: float, **options):
    """(bundle, an explainer of a tiny ViT, the same explainer saved and loaded with `key` = weight in its card)."""
    bundle = tiny_vit("tiny-term")
    torch.manual_seed(0)
    plain = AHAExplainer(bundle, width=8, embed_dim=8, **options)
    with torch.no_grad():
        plain.head.conv2.weight.normal_()
    save_explainer(plain, tmp_path / "aha-p", {"base_model": "tiny-term"})
    card = json.loads((tmp_path / "aha-p.json").read_text())
    card["architecture"][key] = weight
    (tmp_path / "aha-p.json").write_text(json.dumps(card))
    return bundle, plain, load_explainer(bundle, tmp_path / "aha-p")


def test_class_boost_adds_the_class_input_to_the_standardised_map_and_is_saved(tmp_path):
    from explainers.aha.network import standardise
    from explainers.resize import resize_bilinear

    bundle, plain, boosted = saved_with_class_term(tmp_path, "class_boost", 0.5, class_input="token_logits")
    assert boosted.class_boost == 0.5
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    targets = torch.tensor([1, 2])
    _, base, _ = plain.predict_and_explain(images, targets)
    _, maps, _ = boosted.predict_and_explain(images, targets)
    extra = resize_bilinear(plain.class_token_map(plain.encode(images), targets), (32, 32))
    assert torch.allclose(maps, standardise(base + 0.5 * extra), atol=1e-5)
    with pytest.raises(ValueError, match="needs a class input"):
        AHAExplainer(bundle, width=8, embed_dim=8, class_boost=1.0)


def test_class_contrast_changes_every_class_but_the_predicted_one_and_is_saved(tmp_path):
    from explainers.aha.network import standardise
    from explainers.resize import resize_bilinear

    bundle, plain, contrasted = saved_with_class_term(tmp_path, "class_contrast", 1.0)
    assert contrasted.class_contrast == 1.0 and contrasted.class_input == "none"
    images = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    encoded = contrasted.encode(images)
    predicted = encoded.logits.argmax(1)
    other = (predicted + 1) % bundle.num_classes
    # the predicted class: the trained map, untouched
    _, base, _ = plain.predict_and_explain(images, predicted)
    _, same, _ = contrasted.predict_and_explain(images, predicted)
    assert torch.allclose(same, base, atol=1e-5)
    # another class: the trained map plus where that class's token logits beat the prediction's
    _, base_other, _ = plain.predict_and_explain(images, other)
    _, maps, _ = contrasted.predict_and_explain(images, other)
    tokens = contrasted.token_logits(encoded)
    rows = torch.arange(3)
    difference = tokens[rows, other] - tokens[rows, predicted]
    extra = resize_bilinear(standardise(difference), (32, 32))
    assert torch.allclose(maps, standardise(base_other + extra), atol=1e-5)
    assert not torch.allclose(maps, base_other, atol=1e-3)
    assert torch.count_nonzero(contrasted.class_contrast_map(encoded, predicted)) == 0
    with pytest.raises(ValueError, match="class_contrast must lie"):
        AHAExplainer(bundle, width=8, embed_dim=8, class_contrast=-1.0)
