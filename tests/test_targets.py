"""The target protocol (explainers.targets): what an explanation explains, for any model kind.

The class-target maps and curves are held to the ones the methods gave before the protocol existed
(`tests/data/class_target_maps.safetensors`, written by `python tests/test_targets.py` at that commit): the
protocol changed how a method reads its score, not what it computes."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import DATA_DIR, tiny_cnn  # noqa: E402

GOLDEN = os.path.join(DATA_DIR, "class_target_maps.safetensors")
# (label, method name, options): every method that takes any target, on class indices
CLASS_CASES = (("occlusion", "occlusion", {"window_fraction": 0.25}),
               ("occlusion-probability", "occlusion", {"window_fraction": 0.25, "score": "probability"}),
               ("rise", "rise", {"n_masks": 40, "batch_size": 16}),
               ("random", "random", {}),
               ("gradcam", "gradcam", {}),
               ("aha-per-image", "aha", {"mode": "per-image", "per_image_steps": 2}))


def golden_inputs():
    """Three 32 px images (the first twice, for two classes: one image explained for several classes) on a tiny
    CNN with four classes."""
    generator = torch.Generator().manual_seed(3)
    images = torch.rand(2, 3, 32, 32, generator=generator)
    return tiny_cnn(seed=1), images[[0, 0, 1]], torch.tensor([0, 2, 1])


def class_target_results(targets=None) -> dict:
    """Each case's maps, and the deletion/insertion curves of the Grad-CAM maps (`targets`: as the methods get
    them; None: the class indices)."""
    from explainers.methods import get_method
    from explainers.metrics import deletion_insertion

    bundle, images, classes = golden_inputs()
    targets = classes if targets is None else targets
    results = {}
    for label, name, options in CLASS_CASES:
        torch.manual_seed(0)
        results[label] = get_method(name, **options).attribute(bundle, images, targets).detach().float()
    curves = deletion_insertion(bundle, images, results["gradcam"], targets, steps=8)
    results["curves"] = torch.stack([torch.as_tensor(curves.deletion), torch.as_tensor(curves.insertion)]).float()
    return results


if __name__ == "__main__":
    from safetensors.torch import save_file

    save_file({key: value.contiguous() for key, value in class_target_results().items()}, GOLDEN)
    print("wrote", GOLDEN)


def test_class_targets_reproduce_the_maps_and_curves_before_the_protocol():
    from safetensors.torch import load_file

    from explainers.targets import ClassTarget

    before = load_file(GOLDEN)
    _, _, classes = golden_inputs()
    for given in (None, ClassTarget(classes)):  # class indices as a tensor, or as the protocol's class target
        now = class_target_results(given)
        assert set(now) == set(before)
        for key, value in before.items():  # identical on the machine that wrote them; a float's last bits elsewhere
            torch.testing.assert_close(now[key], value, rtol=1e-5, atol=1e-6, msg=key)


# --- a region target on a tiny segmentation-like model ------------------------------------------------------------
SIZE = 16


class PixelNet(torch.nn.Module):
    """Three classes per pixel from 1 x 1 convolutions (a known answer): class 1's logit at a pixel is 8 x that
    pixel's mean brightness (normalised: image - 0.5), class 0's its opposite, class 2's zero; nothing else moves
    it."""

    def __init__(self):
        super().__init__()
        self.features = torch.nn.Conv2d(3, 1, 1, bias=False)
        self.head = torch.nn.Conv2d(1, 3, 1, bias=False)
        with torch.no_grad():
            self.features.weight.fill_(1 / 3)
            self.head.weight.copy_(torch.tensor([-8.0, 8.0, 0.0]).view(3, 1, 1, 1))

    def forward(self, x):
        return self.head(self.features(x))


def pixel_bundle():
    from explainers.bundle import ModelBundle

    return ModelBundle(name="pixel-seg", network=PixelNet().eval(), mean=(0.5, 0.5, 0.5), std=(1.0, 1.0, 1.0),
                       input_size=(SIZE, SIZE), class_names=["background", "bright", "other"], family="cnn",
                       reference_color=(0.5, 0.5, 0.5), cam_layer_name="features", task="segmentation")


def region_case():
    """One image, bright (0.9) inside a 4 x 6 square and dark (0.1) elsewhere, asked about class 1 over that
    square and over a 3 x 3 piece of it (one image, two regions: perturbed once for both)."""
    from explainers.targets import RegionTarget

    square = torch.zeros(SIZE, SIZE, dtype=torch.bool)
    square[4:8, 4:10] = True
    piece = torch.zeros_like(square)
    piece[4:7, 4:7] = True
    image = torch.full((1, 3, SIZE, SIZE), 0.1)
    image[..., square] = 0.9
    return image.expand(2, -1, -1, -1).clone(), RegionTarget(torch.stack([square, piece]), [1, 1])


def near(mask, reach):
    """The pixels within `reach` (Chebyshev distance) of the mask."""
    pooled = torch.nn.functional.max_pool2d(mask.float()[None, None], 2 * reach + 1, stride=1, padding=reach)
    return pooled[0, 0] > 0


def test_region_target_scores_and_reading():
    from explainers.targets import ClassTarget

    bundle = pixel_bundle()
    images, target = region_case()
    outputs = bundle(images)
    assert outputs.shape == (2, 3, SIZE, SIZE)
    torch.testing.assert_close(target.score(outputs), torch.full((2,), 8 * 0.4))  # 8 x (0.9 - 0.5) over the region
    probability = torch.softmax(torch.tensor([-3.2, 3.2, 0.0]), 0)[1]  # every region pixel's logits
    torch.testing.assert_close(target.probability(outputs), torch.full((2,), float(probability)))
    torch.testing.assert_close(target.curve_score(outputs), target.probability(outputs))
    copies = target.copies(outputs[:1].expand(5, -1, -1, -1))  # five copies of the image, each row's score
    assert copies.shape == (5, 2)
    with pytest.raises(ValueError, match="region target"):
        ClassTarget([1, 1]).score(outputs)  # class indices do not explain a segmentation output


def test_occlusion_of_a_region_moves_only_near_it():
    from explainers.engine import explain_batch

    bundle = pixel_bundle()
    images, target = region_case()
    maps = explain_batch(bundle, "occlusion", images, target).maps  # window 1/8 of 16 px: 2 px, stride 1
    for row in range(2):
        region = target.masks[row]
        assert bool((maps[row][region] > 0).all())  # hiding any pixel of the region lowers its score
        assert float(maps[row][~near(region, 2)].abs().max()) == 0.0  # no window reaching the region: no drop


def test_rise_grad_cam_and_random_take_a_region():
    from explainers.engine import explain_batch

    bundle = pixel_bundle()
    images, target = region_case()
    rise = explain_batch(bundle, "rise", images, target).maps
    for row in range(2):
        region = target.masks[row]
        assert float(rise[row][region].mean()) > float(rise[row][~near(region, 2)].mean())
    cam = explain_batch(bundle, "gradcam", images, target).maps  # mean gradient x brightness: the bright square
    square = target.masks[0]
    assert float(cam[0][square].min()) == pytest.approx(1.0) and float(cam[0][~square].abs().max()) == 0.0
    noise = explain_batch(bundle, "random", images, target).maps
    assert torch.equal(noise, explain_batch(bundle, "random", images, [1, 1]).maps)  # the same noise


def test_per_image_aha_explains_a_region():
    from explainers.engine import explain_batch
    from explainers.methods import MethodNotApplicable, get_method
    from explainers.metrics import deletion_insertion

    bundle = pixel_bundle()
    images, target = region_case()
    batch = explain_batch(bundle, get_method("aha", per_image_steps=3), images[:1], target.take([0]))
    assert batch.maps.shape == (1, SIZE, SIZE) and bool(torch.isfinite(batch.maps).all())
    assert batch.resolved["mode"] == "per-image"
    prior = explain_batch(bundle, "gradcam", images[:1], target.take([0])).maps
    ours, start = (deletion_insertion(bundle, images[:1], maps, target.take([0]), steps=16)
                   for maps in (batch.maps, prior))
    assert float(ours.deletion_auc[0]) <= float(start.deletion_auc[0]) + 1e-6  # from the prior, no worse
    with pytest.raises(MethodNotApplicable, match="per-image"):  # a trained explainer draws classes only
        get_method("aha", mode="trained").attribute(bundle, images[:1], target.take([0]))


def test_curves_read_the_region_target():
    """Deleting the region's pixels first: once they are all gone the region reads what the reference image does
    (no other pixel moves it); at 0 it reads the clean image."""
    from explainers.metrics import deletion_insertion

    bundle = pixel_bundle()
    images, target = region_case()
    maps = target.masks.float()
    curves = deletion_insertion(bundle, images, maps, target, steps=SIZE * SIZE)
    clean = target.probability(bundle(images)).detach().numpy()
    blank = target.probability(bundle(torch.full_like(images, 0.5))).detach().numpy()
    for row in range(2):
        area = int(target.areas[row])
        assert curves.deletion[row, 0] == pytest.approx(clean[row], abs=1e-6)
        assert curves.deletion[row, area] == pytest.approx(blank[row], abs=1e-6)
        assert curves.insertion[row, area] == pytest.approx(clean[row], abs=1e-6)


def test_engine_runs_a_region_target_with_its_cache_and_curves():
    from PIL import Image

    from explainers import engine

    bundle = pixel_bundle()
    images, target = region_case()
    picture = Image.fromarray((images[0].permute(1, 2, 0).numpy() * 255).round().astype("uint8"))
    prepared = engine.prepare_input(picture, bundle)
    cache = engine.ExplanationCache()
    record = engine.run_method(bundle, prepared, "occlusion", target.take([0]), {}, cache=cache, steps=8)
    assert record["target_name"] == "bright over 24 pixels" and record["deletion_auc"] is not None
    again = engine.run_method(bundle, prepared, "occlusion", target.take([0]), {}, cache=cache, steps=8)
    assert again["deletion_auc"] == record["deletion_auc"]  # the cache keys the region
    other = engine.run_method(bundle, prepared, "occlusion", target.take([1]), {}, cache=cache, steps=8)
    assert not (other["map"] == record["map"]).all()  # another region: another key, another map
    assert engine.report("pixel-seg", [record])["methods"][0]["target"].startswith("region:1:")


def test_class_only_methods_refuse_a_region_in_words():
    from conftest import tiny_vit
    from explainers.engine import explain_batch
    from explainers.methods import MethodNotApplicable

    bundle = tiny_vit()
    images, target = region_case()
    with pytest.raises(MethodNotApplicable, match="class indices only"):
        explain_batch(bundle, "rollout", torch.rand(2, 3, 32, 32), target)


def test_no_attribute_call_outside_the_run_path():
    """Maps come from `engine.explain_batch` (the bundle's lock, the seed, the checks); only the engine and the
    method definitions themselves call `.attribute(` (a method may run its prior method inside its own run)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    allowed = {root / "explainers" / "engine.py", root / "explainers" / "segmentation" / "methods.py"}
    found = []
    for path in sorted([*(root / "explainers").rglob("*.py"), *(root / "saliency_lab").rglob("*.py"), root / "app.py"]):
        if path in allowed or (root / "explainers" / "methods") in path.parents:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\.attribute\(", line) and not re.search(r"def attribute\(", line):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_contrast_target_reads_one_class_against_another():
    """Known answers: z_c - z_d and its sigmoid; rows taken together; the curves start at the clean image's
    sigmoid; a gradient method explains the contrast as it explains the logit difference given as a function."""
    from explainers.metrics import deletion_insertion
    from explainers.methods import get_method
    from explainers.targets import ContrastTarget

    outputs = torch.tensor([[2.0, 0.0, 1.0, -1.0], [0.0, 3.0, 0.5, 0.0]])
    target = ContrastTarget([0, 2], [2, 1])
    assert torch.allclose(target.score(outputs), torch.tensor([1.0, -2.5]))
    assert torch.allclose(target.probability(outputs), torch.sigmoid(torch.tensor([1.0, -2.5])))
    assert target.take([1]).key() == "contrast:2-1" and len(target.take([1, 1])) == 2
    assert target.describe(["a", "b", "c", "d"]) == "a rather than c; c rather than b"
    with pytest.raises(ValueError, match="one class to compare against"):
        ContrastTarget([0, 1], [2])

    bundle, images, classes = golden_inputs()
    against = torch.tensor([1, 0, 3])
    contrast = ContrastTarget(classes, against)
    maps = torch.rand(3, 32, 32, generator=torch.Generator().manual_seed(0))
    curves = deletion_insertion(bundle, images, maps, contrast, steps=8)
    clean = torch.sigmoid(bundle(images).gather(1, classes.view(-1, 1)) - bundle(images).gather(1, against.view(-1, 1)))
    assert torch.allclose(torch.as_tensor(curves.deletion[:, 0]).float(), clean.flatten().float(), atol=1e-5)
    gradcam = get_method("gradcam")
    contrast_maps = gradcam.attribute(bundle, images, contrast).detach()
    own = gradcam.attribute(bundle, images, lambda out: (out.gather(1, classes.view(-1, 1))
                                                          - out.gather(1, against.view(-1, 1))).flatten()).detach()
    assert torch.allclose(contrast_maps, own, atol=1e-6)
