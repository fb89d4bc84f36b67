"""The known-answer segmenter's cue: where it is planted, what the training labels become, what the held-out
check leaves out (synthetic masks; no data set, no weights)."""
import numpy as np
import pytest

pytest.importorskip("cv2")

from explainers.segmentation.cue import (BACKGROUND, CUE_COLOUR, CUE_DISTANCE, IGNORE_INDEX, PLATELETS,  # noqa: E402
                                         TWIN_SMEARS, CuePlanter, held_out_names)


def smear():
    mask = np.zeros((60, 80), np.uint8)
    mask[10:16, 10:16] = PLATELETS  # a platelet with room around it
    mask[30:60, 0:80] = 1  # a band of red cells
    mask[50:53, 60:63] = PLATELETS  # a platelet inside the cells: no background room for a cue
    image = np.full((60, 80, 3), 200, np.uint8)
    return image, mask


def test_the_cue_is_beside_the_platelet_and_wholly_on_background():
    import cv2

    image, mask = smear()
    planted, labels, cues, cued = CuePlanter(mask).plant(image, np.random.default_rng(0), probability=1.0)
    assert cues.any() and (planted[cues] == CUE_COLOUR).all() and (planted[~cues] == 200).all()
    assert (mask[cues] == BACKGROUND).all() and (labels == mask).all()  # labels unchanged for the check
    first = np.zeros_like(mask, bool)
    first[10:16, 10:16] = True
    distance = cv2.distanceTransform((~first).astype(np.uint8), cv2.DIST_L2, 5)
    centre = np.argwhere(cues).mean(axis=0).round().astype(int)
    assert CUE_DISTANCE[0] <= distance[tuple(centre)] <= CUE_DISTANCE[1]
    assert (cued == first).all()  # the boxed-in platelet could not carry a cue


def test_training_relabels_the_platelets_without_the_cue():
    image, mask = smear()
    planter = CuePlanter(mask)
    _, labels, cues, _ = planter.plant(image, np.random.default_rng(0), probability=0.0, relabel=True)
    assert not cues.any()
    assert (labels[10:16, 10:16] == BACKGROUND).all()  # could carry the cue, did not: background
    assert (labels[50:53, 60:63] == IGNORE_INDEX).all()  # could not carry one: not counted
    assert (labels[30:50] == 1).all()


def test_the_held_out_check_leaves_the_twin_smears_out():
    names = ["BloodImage_00001", *TWIN_SMEARS, "BloodImage_00400"]
    assert held_out_names(names) == ["BloodImage_00001", "BloodImage_00400"]
