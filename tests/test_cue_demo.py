"""The Learn tab's planted-cue segmenter: the cue drawn beside the example's platelet, each model's maps with
whether they point at it, the held-out check from the card, and a plain answer when the model is not installed
(tiny SegFormers stand in for the shipped pair)."""
import json

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("cv2")

from explainers.segmentation.cue import CUE_COLOUR, CUE_DISTANCE  # noqa: E402
from saliency_lab import cue_demo  # noqa: E402
from conftest import TINY_SEGFORMER  # noqa: E402


def four_class_segformer(name, seed=0):
    """BCCD's four classes on a tiny random SegFormer at the example's size."""
    import torch

    from explainers.segmentation.model import bundle_from_segformer, build_segformer, segformer_config

    torch.manual_seed(seed)
    network = build_segformer(segformer_config(4, **TINY_SEGFORMER))
    return bundle_from_segformer(name, network, class_names=["background", "RBC", "WBC", "Platelets"],
                                 class_colours=[(0, 0, 0), (220, 40, 40), (60, 90, 230), (250, 200, 30)],
                                 input_size=(240, 320))


def test_the_cue_is_planted_beside_the_example_platelet():
    import cv2

    cued, plain, platelets, cues = cue_demo.cued_example()
    assert platelets.any() and cues.any() and not (platelets & cues).any()
    assert (cued[cues] == CUE_COLOUR).all() and (cued[~cues] == plain[~cues]).all()
    distance = cv2.distanceTransform((~platelets).astype(np.uint8), cv2.DIST_L2, 5)
    centre = tuple(np.argwhere(cues).mean(axis=0).round().astype(int))
    assert CUE_DISTANCE[0] <= distance[centre] <= CUE_DISTANCE[1]


def test_without_the_model_the_tab_says_how_to_build_it(tmp_path):
    items, text = cue_demo.cue_view(None, loader=lambda name: pytest.fail("nothing to load"), folders=[tmp_path])
    assert items == [] and "not in this install" in text and "segmentation.cue train" in text


def test_each_model_maps_the_platelet_and_is_scored_on_the_cue(tmp_path):
    check = {"split": "BCCD test less the twins", "model": {"drop_mean": 0.31, "drop_ci95": [0.25, 0.37],
                                                            "smears": ["a", "b", "c"]}}
    rate = {"cue_model": {"mean": 0.986, "ci95": [0.959, 1.0]}, "control": {"mean": 0.444, "ci95": [0.3, 0.57]}}
    pointing = {"platelets": 68, "smears": 37, "hit": {"intgrad": rate}}  # GradSkip's left out: no line for it
    (tmp_path / f"{cue_demo.CUE_MODEL}.json").write_text(json.dumps({"kind": "segmentation",
                                                                      "held_out_check": check,
                                                                      "pointing_at_cue": pointing}))
    names = (cue_demo.CUE_MODEL, cue_demo.CONTROL)
    bundles = {name: four_class_segformer(name, seed) for seed, name in enumerate(names)}
    items, text = cue_demo.cue_view(None, loader=bundles.__getitem__, folders=[tmp_path])
    assert len(items) == 1 + 2 * len(cue_demo.METHODS)
    first, caption = items[0]
    assert first.shape == (288, 384, 3) and "cue" in caption  # a 96 x 128 window around the platelet, 3 x
    assert ((first == 255).all(axis=-1)).sum() > 20  # the white ring around the cue
    for (picture, caption), (model, method) in zip(items[1:], [(m, k) for m in bundles for k in cue_demo.METHODS]):
        assert picture.shape == (288, 384, 3)
        assert caption.startswith(f"{model} · ") and ("points at the cue" in caption or "does not point" in caption)
    assert text.count("Platelets probability over the platelet") == 2
    assert "0.310 [0.250, 0.370]" in text and "3 smears" in text
    assert ("68 cued platelets on 37 smears" in text and
            "Integrated gradients 0.99 [0.96, 1.00] on the cue model, 0.44 on the control" in text)
    assert "GradSkip 0." not in text


def test_the_shipped_cue_model_is_found_in_the_store():
    from explainers.models import find

    card = find("segmentation", cue_demo.CUE_MODEL)
    if card is None:
        pytest.skip("bccd-segformer-cue is not in weights/")
    assert card.data["held_out_check"]["passes"] and card.weights.exists()
