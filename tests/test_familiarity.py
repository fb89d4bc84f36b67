"""The unfamiliar-image check: pre-logit features from the prediction's own forward pass, Mahalanobis scores with
known answers, the threshold from validation images, the verdict reaching the CLI, the app's state and report.json."""
import json

import numpy as np
import pytest
import torch
from PIL import Image

from explainers import engine, familiarity
from explainers.familiarity import FamiliarityStats
from explainers.statistics import wilson_interval

from conftest import forward_passes, tiny_cnn, tiny_vit


def test_features_come_from_the_predictions_own_forward_pass():
    """logits_and_features: the logits are the bundle's, the features timm's pre-logits, from ONE forward pass."""
    for bundle in (tiny_cnn(), tiny_vit()):
        images = torch.rand(3, 3, *bundle.input_size)
        with forward_passes(bundle.network) as calls:
            logits, features = familiarity.logits_and_features(bundle, images)
        assert len(calls) == 1
        with torch.no_grad():
            network = bundle.network
            expected = network.forward_head(network.forward_features(bundle.normalize(images)), pre_logits=True)
            assert torch.allclose(logits, bundle(images), atol=1e-5)
        assert torch.allclose(features, expected.flatten(1), atol=1e-5)
        assert not bundle.network._forward_pre_hooks and not familiarity.classifier_head(network)._forward_pre_hooks


def test_vit_features_can_add_the_mean_patch_token_from_the_same_pass():
    """WITH_PATCH_MEAN on a ViT: the pre-logits, then the mean of the patch tokens after the final norm (class token
    left out), still one forward pass; refused on a CNN; statistics remember which features they were fitted on."""
    vit = tiny_vit()
    images = torch.rand(2, 3, *vit.input_size)
    with forward_passes(vit.network) as calls:
        _, both = familiarity.logits_and_features(vit, images, familiarity.WITH_PATCH_MEAN)
    assert len(calls) == 1 and not vit.network.norm._forward_hooks
    with torch.no_grad():
        tokens = vit.network.forward_features(vit.normalize(images))
        pre_logits = vit.network.forward_head(tokens, pre_logits=True)
    width = pre_logits.shape[1]
    assert both.shape == (2, 2 * width)
    assert torch.allclose(both[:, :width], pre_logits, atol=1e-5)
    assert torch.allclose(both[:, width:], tokens[:, vit.num_prefix_tokens:].mean(dim=1), atol=1e-5)
    with pytest.raises(ValueError, match="needs a ViT"):
        familiarity.logits_and_features(tiny_cnn(), torch.rand(1, 3, 32, 32), familiarity.WITH_PATCH_MEAN)
    with pytest.raises(ValueError, match="features must be one of"):
        familiarity.logits_and_features(vit, images, "tokens")


def test_statistics_fitted_on_patch_means_are_read_with_them(tiny_folder):
    bundle = tiny_vit(name="familiar-vit")
    stats = familiarity.fit(bundle, tiny_folder, tiny_folder, features=familiarity.WITH_PATCH_MEAN)
    assert stats.source["features"] == familiarity.WITH_PATCH_MEAN and stats.precision.shape[0] == 64
    prepared = engine.prepare_input(Image.open(tiny_folder / "cell_0.jpg").convert("RGB"), bundle)
    try:
        familiarity.register_stats(bundle, stats)
        assert familiarity.feature_kind(bundle) == familiarity.WITH_PATCH_MEAN
        _, verdict = engine.predict_and_check(bundle, prepared)  # the 64 features the statistics expect
        expected = stats.score(familiarity.logits_and_features(bundle, prepared.tensor,
                                                               familiarity.WITH_PATCH_MEAN)[1])
        assert verdict["score"] == round(float(expected), 3)
    finally:
        familiarity.register_stats(bundle, None)
    assert familiarity.feature_kind(bundle) == familiarity.PRE_LOGITS


def test_scores_are_mahalanobis_distances_to_the_nearest_class_mean():
    """A known answer: identity precision gives the Euclidean distance to the nearest mean; a scaled axis counts
    less; the percentile counts the validation scores below."""
    stats = FamiliarityStats(means=torch.tensor([[0.0, 0.0], [10.0, 0.0]], dtype=torch.float64),
                             precision=torch.diag(torch.tensor([1.0, 0.25], dtype=torch.float64)),
                             val_scores=torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64), threshold=3.5,
                             source={"quantile": 0.75})
    scores = stats.score(torch.tensor([[3.0, 0.0], [9.0, 0.0], [0.0, 4.0]]))
    assert torch.allclose(scores, torch.tensor([3.0, 1.0, 2.0], dtype=torch.float64))
    assert stats.percentile(2.5) == 50.0 and stats.percentile(0.5) == 0.0 and stats.percentile(9) == 100.0
    far, near = familiarity.verdict(stats, 5.0, "m"), familiarity.verdict(stats, 2.0, "m")
    assert far["unfamiliar"] and "does not look like the images m learned from" in far["message"]
    assert "than those of 100.0% of its validation images" in far["message"]
    assert not near["unfamiliar"] and "message" not in near and near["validation_percentile"] == 25.0


def test_wilson_interval_known_values():
    low, high = wilson_interval(0, 10)
    assert low == pytest.approx(0.0, abs=1e-12) and high == pytest.approx(0.2775, abs=1e-3)
    low, high = wilson_interval(5, 10)
    assert (low, high) == (pytest.approx(0.2366, abs=1e-3), pytest.approx(0.7634, abs=1e-3))
    assert wilson_interval(0, 0) == (0.0, 1.0)


def _noise_folder(folder, count=4, size=32):
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(count):
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / f"noise_{i}.png")
    return folder


def test_fit_save_load_and_flag_noise_not_the_training_cells(tiny_folder, tmp_path):
    """Fitted on the cells, the check flags at most one of them (the one above the 99% quantile of their own scores),
    and every random-noise image, whose features lie far from every class, scores above every cell; the statistics
    survive a safetensors round trip."""
    bundle = tiny_cnn(size=32)
    stats = familiarity.fit(bundle, tiny_folder, tiny_folder, quantile=0.99)
    assert stats.means.shape[0] == 4 and stats.precision.shape[0] == stats.means.shape[1]
    assert stats.threshold == pytest.approx(float(torch.quantile(stats.val_scores, 0.99)))
    assert stats.source["train_images"] == 6 and stats.source["val_images"] == 6
    path = familiarity.save(stats, tmp_path / "m.familiarity.safetensors")
    loaded = familiarity.load(path)
    assert torch.equal(loaded.precision, stats.precision) and loaded.threshold == stats.threshold
    assert loaded.source == stats.source
    cells = familiarity.flagged_share(bundle, loaded, tiny_folder)
    noise = familiarity.flagged_share(bundle, loaded, _noise_folder(tmp_path / "noise"))
    assert cells["images"] == 6 and cells["flagged"] <= 1  # at most the one cell above the 99% quantile
    assert noise["flagged"] == 4 and noise["median_score"] > stats.val_scores.max()
    assert noise["share_ci95"] == list(wilson_interval(4, 4))


def test_predict_and_check_matches_predict_top_and_says_nothing_without_statistics(tiny_folder):
    import explainers

    assert explainers.predict_and_check is engine.predict_and_check  # the public API (README's example)
    bundle = tiny_cnn(name="familiar-tiny")
    prepared = engine.prepare_input(Image.open(tiny_folder / "cell_0.jpg").convert("RGB"), bundle)
    try:
        familiarity.register_stats(bundle, None)
        assert engine.predict_and_check(bundle, prepared) == (engine.predict_top(bundle, prepared), None)
        familiarity.register_stats(bundle, familiarity.fit(bundle, tiny_folder, tiny_folder))
        with forward_passes(bundle.network) as calls:
            prediction, verdict = engine.predict_and_check(bundle, prepared)
        assert len(calls) == 1  # the prediction and the check: one forward pass
        assert [(i, n) for i, n, _ in prediction] == [(i, n) for i, n, _ in engine.predict_top(bundle, prepared)]
        assert np.allclose([p for *_, p in prediction], [p for *_, p in engine.predict_top(bundle, prepared)])
        assert set(verdict) >= {"score", "threshold", "unfamiliar", "validation_percentile"}
    finally:
        familiarity.register_stats(bundle, None)


def test_an_unfamiliar_upload_is_said_in_the_app_state_status_report_and_cli(tiny_folder, tmp_path, capsys):
    """Noise given to a cell model: a warning (the app's toast), the status line, report.json and the CLI say it;
    a training cell is explained without one."""
    from explainers import models
    from explainers.cli import main
    from saliency_lab import explain
    from saliency_lab.services import Services

    bundle = models.register_bundle(tiny_cnn(name="familiar-cli"))
    noise = _noise_folder(tmp_path / "noise", count=1) / "noise_0.png"
    try:
        familiarity.register_stats(bundle, familiarity.fit(bundle, tiny_folder, tiny_folder, quantile=0.99))
        services = Services(lambda name: bundle, ["familiar-cli"], tmp_path / "state")
        assert "Images unlike its training images are flagged." in explain.model_menu(services, "familiar-cli",
                                                                                          ["gradcam"])[2]
        warnings = []
        state, _ = explain.explain_maps(services, str(noise), "familiar-cli", ["gradcam"], warn=warnings.append)
        assert state["familiarity"]["unfamiliar"] and warnings == [state["familiarity"]["message"]]
        assert explain.status_text(state).startswith("⚠ **Unfamiliar image.** This image does not look like")
        assert explain.unfamiliar_note(state).startswith("⚠ **Unfamiliar image.** This image does not look like")
        other = str(state["prediction"][1][0])  # another class of the same image: the note stays, no second toast
        again, _ = explain.explain_maps(services, str(noise), "familiar-cli", ["gradcam"], other,
                                        warn=warnings.append)
        assert again["familiarity"]["unfamiliar"] and len(warnings) == 1
        state, _ = explain.explain_curves(services, state)
        paths = explain.write_downloads(services, state, 0.5, "cividis")
        report = json.loads(next(p for p in paths if p.name.endswith("-report.json")).read_text())  # <image>-<model>-report.json
        assert report["familiarity"] == state["familiarity"]
        lowest = min(range(6), key=lambda i: familiarity.get_stats(bundle).score(familiarity.logits_and_features(
            bundle, engine.prepare_input(Image.open(tiny_folder / f"cell_{i}.jpg").convert("RGB"),
                                         bundle).tensor)[1]).item())
        warnings.clear()
        state, _ = explain.explain_maps(services, str(tiny_folder / f"cell_{lowest}.jpg"), "familiar-cli", ["gradcam"],
                                        warn=warnings.append)
        assert not state["familiarity"]["unfamiliar"] and warnings == []
        assert "Unfamiliar" not in explain.status_text(state)
        assert explain.unfamiliar_note(state) == ""
        assert main(["explain", "--model", "familiar-cli", "--method", "gradcam", "--image", str(noise), "--out",
                     str(tmp_path / "out")]) == 0
        assert "warning: This image does not look like the images familiar-cli learned from" in capsys.readouterr().out
        saved = json.loads((tmp_path / "out" / "report.json").read_text())
        assert saved["familiarity"]["unfamiliar"] is True
    finally:
        familiarity.register_stats(bundle, None)
    assert "Not checked for images unlike its training images" in explain.model_menu(services, "familiar-cli",
                                                                                       ["gradcam"])[2]


def test_the_familiarity_command_fits_writes_and_counts(tiny_folder, tmp_path, capsys):
    from explainers import models
    from explainers.cli import main

    models.register_bundle(tiny_cnn(name="familiar-fit"))
    out, report = tmp_path / "stats.safetensors", tmp_path / "report.json"
    noise = _noise_folder(tmp_path / "noise")
    assert main(["familiarity", "--model", "familiar-fit", "--train", str(tiny_folder), "--val", str(tiny_folder),
                 "--out", str(out), "--check", f"noise={noise}", "--check", str(tiny_folder),
                 "--report", str(report)]) == 0
    data = json.loads(report.read_text())
    assert familiarity.load(out).threshold == data["threshold"]
    checks = {row["name"]: row for row in data["checks"]}
    assert checks["noise"]["flagged"] == 4 and checks["noise"]["images"] == 4
    assert checks[tiny_folder.name]["images"] == 6
    assert "noise: 4/4 flagged" in capsys.readouterr().out
    assert main(["familiarity", "--model", "familiar-fit", "--train", str(tiny_folder), "--val", str(tiny_folder),
                 "--quantile", "1.5"]) == 2
    unlabelled = tmp_path / "unlabelled"
    unlabelled.mkdir()
    (unlabelled / "labels.csv").write_text("file,class_index\n" + "".join(f"{p.name},-1\n" for p in noise.iterdir()))
    for p in noise.iterdir():
        (unlabelled / p.name).write_bytes(p.read_bytes())
    capsys.readouterr()
    assert main(["familiarity", "--model", "familiar-fit", "--train", str(unlabelled), "--val", str(tiny_folder),
                 "--out", str(out)]) == 2  # -1 (no label) is not a class: refused, not a silent last class
    assert "must be class indices of familiar-fit" in capsys.readouterr().err


def test_evaluate_counts_the_unfamiliar_images_in_its_one_prediction_pass(tiny_folder, tmp_path, capsys):
    """`evaluate` reads each image's familiarity in the pass that picks its target: the report names the flagged
    files and the table warns; a model without statistics reports null. Noise among cells: exactly the noise."""
    import shutil

    from explainers import models
    from explainers.cli import main

    bundle = models.register_bundle(tiny_cnn(name="familiar-eval"))
    mixed = tmp_path / "mixed"
    shutil.copytree(tiny_folder, mixed)
    noise = _noise_folder(tmp_path / "noise", count=2)
    rows = (mixed / "labels.csv").read_text()
    for p in noise.iterdir():
        shutil.copy(p, mixed / p.name)
        rows += f"{p.name},0\n"
    (mixed / "labels.csv").write_text(rows)
    out = tmp_path / "report.json"
    assert main(["evaluate", "--model", "familiar-eval", "--methods", "gradcam", "--data", str(mixed), "--steps", "2",
                 "--out", str(out)]) == 0
    assert json.loads(out.read_text())["familiarity"] is None and "warning" not in capsys.readouterr().out
    try:
        stats = familiarity.fit(bundle, tiny_folder, tiny_folder, quantile=0.99)
        stats.threshold = float(stats.val_scores.max())  # every cell below, the noise far above (known answer)
        familiarity.register_stats(bundle, stats)
        assert main(["evaluate", "--model", "familiar-eval", "--methods", "gradcam", "--data", str(mixed), "--steps",
                     "2", "--out", str(out)]) == 0
    finally:
        familiarity.register_stats(bundle, None)
    report = json.loads(out.read_text())["familiarity"]
    assert report["unfamiliar"] == 2 and sorted(report["unfamiliar_files"]) == ["noise_0.png", "noise_1.png"]
    assert len(report["scores"]) == 8
    assert "warning: 2 of 8 images do not look like the images familiar-eval learned from" in capsys.readouterr().out
