"""Cascading model randomisation of a SegFormer (explainers.segmentation.checks): the cascade re-initialises from
the decode head down and leaves the trained model alone; on the bundled model, a map that explains the model
changes when its decode head is random."""
import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from explainers.segmentation.checks import (CASCADE, cascading_randomisation, compare_maps,  # noqa: E402
                                            randomised_bundles)
from explainers.segmentation.methods import explain_region  # noqa: E402
from explainers.segmentation.targets import RegionTarget  # noqa: E402

from conftest import TINY_SEGFORMER_SIZE as SIZE, tiny_segformer  # noqa: E402


def test_the_cascade_reinitialises_from_the_top_and_keeps_the_trained_model():
    seg = tiny_segformer()
    before = {k: v.clone() for k, v in seg.network.state_dict().items()}
    steps = list(randomised_bundles(seg))
    assert [name for name, _ in steps] == list(CASCADE)
    for index, (_, random_bundle) in enumerate(steps):
        state = random_bundle.network.state_dict()
        changed = {k.split(".")[1] if k.startswith("segformer.decode_head") else k.split(".")[3]
                   for k, v in state.items() if v.dtype.is_floating_point and not torch.equal(v, before[k])}
        assert "decode_head" in changed  # the top step stays random at every later step
        assert len(changed) == index + 1  # one more part of the model each step
    assert all(torch.equal(v, before[k]) for k, v in seg.network.state_dict().items())


def test_compare_maps_reads_identical_maps_as_identical():
    heat = torch.rand(*SIZE, generator=torch.Generator().manual_seed(0))
    assert compare_maps(heat, heat) == {"spearman": pytest.approx(1.0), "iou": pytest.approx(1.0)}


@pytest.mark.slow
@pytest.mark.parametrize("method", ["gradcam", "gradskip", "gradrollout", pytest.param("rollout", marks=pytest.mark.xfail(
    strict=True, reason="attention rollout reads 0.59 on this region, one of 3 of the 22 held-out regions over 0.5 (from "
                        "-0.32 to 0.71; GradSkip's all within -0.14 to 0.21): its blocks read only the encoder's "
                        "attention, which this step leaves trained"))])
def test_a_map_of_the_bundled_model_changes_when_its_decode_head_is_random(method):
    """The gate every segmentation method meets since the signed start (GradSkip's, the rollouts' too); with the
    former |dP*P| start GradSkip read Spearman 0.78 on the held-out smears and attention rollout 0.95."""
    from PIL import Image

    from explainers.models import load_model
    from saliency_lab.segmentation import EXAMPLES_DIR

    bundle = load_model("bccd-segformer")
    picture = Image.open(EXAMPLES_DIR / "BloodImage_00007.jpg").convert("RGB").resize((320, 240))
    image = torch.from_numpy(np.array(picture)).permute(2, 0, 1).float().div(255)[None]
    with torch.no_grad():
        prediction = bundle(image)[0].argmax(0)
    target = RegionTarget((prediction == 2)[None], [2])  # the white cell
    rows = cascading_randomisation(bundle, image, target, lambda b, x, t: explain_region(b, x, t, method).maps,
                                   steps=1)
    assert rows[0]["spearman"] <= 0.5 and rows[0]["iou"] < 0.5
