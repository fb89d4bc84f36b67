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


@pytest.mark.parametrize("corner", [(2, 3), (110, 150), (60, 70)])
def test_a_training_window_keeps_the_platelet_and_its_cue_in_view(corner):
    from explainers.segmentation.cue import CUE_RADIUS, window_around

    mask = np.zeros((120, 160), np.uint8)
    y, x = corner
    mask[y:y + 6, x:x + 6] = PLATELETS
    piece = mask == PLATELETS
    rows, cols = np.nonzero(piece)
    reach = int(CUE_DISTANCE[1]) + CUE_RADIUS  # the farthest cue pixel from the platelet
    must_see = (max(0, rows.min() - reach), min(119, rows.max() + reach),
                max(0, cols.min() - reach), min(159, cols.max() + reach))
    rng = np.random.default_rng(0)
    for _ in range(100):
        top, left = window_around(piece, mask.shape, 80, 80 // 6, rng)
        assert 0 <= top <= 120 - 80 and 0 <= left <= 160 - 80  # inside the smear
        assert top <= must_see[0] and must_see[1] < top + 80
        assert left <= must_see[2] and must_see[3] < left + 80


def test_the_card_keeps_the_command_without_machine_paths():
    from explainers.segmentation.train import command_line

    program = "python -m explainers.segmentation.cue"
    line = command_line(["train", "--data", "/home/me/bccd", "--base", "weights/bccd-segformer.json", "--out",
                          "/tmp/x", "--work", "/srv/run", "--window", "160"], program)
    assert line == ("python -m explainers.segmentation.cue train --data DIR --base weights/bccd-segformer.json "
                    "--out OUT --work RUN_FOLDER --window 160")
    assert "--out weights" in command_line(["train", "--out", "weights"], program)


def test_pointing_at_the_cue_reads_only_outside_the_region():
    from explainers.segmentation.cue import pointing_at_cue

    outside = np.ones((40, 40), bool)
    outside[10:20, 10:20] = False  # the region, grown
    cue = np.zeros((40, 40), bool)
    cue[14:17, 24:27] = True
    on_cue = np.zeros((40, 40))
    on_cue[10:20, 10:20] = 5.0  # the region's own values do not count
    on_cue[15, 25] = 1.0
    scores = pointing_at_cue(on_cue, outside, cue)
    assert scores["hit"] and scores["mass"] == pytest.approx(1.0)
    elsewhere = np.zeros((40, 40))
    elsewhere[35, 35] = 1.0
    assert pointing_at_cue(elsewhere, outside, cue) == {"hit": False, "mass": 0.0, "chance": scores["chance"]}
    flat = pointing_at_cue(np.ones((40, 40)), outside, cue)
    assert flat["mass"] == pytest.approx(flat["chance"]) and 0 < flat["chance"] < 0.1  # chance: 7 x 7 of 1500


def test_each_cued_platelet_keeps_its_own_cue():
    image, mask = smear()
    mask[40:46, 10:16] = 0
    mask[2:6, 60:64] = PLATELETS  # a second platelet with room
    _, _, pairs = CuePlanter(mask).plant_pairs(image, np.random.default_rng(1), probability=1.0)
    assert len(pairs) == 2
    for piece, disc in pairs:
        far = [other for other, _ in pairs if other is not piece][0]
        import cv2

        near = cv2.distanceTransform((~piece).astype(np.uint8), cv2.DIST_L2, 5)[disc].max()
        away = cv2.distanceTransform((~far).astype(np.uint8), cv2.DIST_L2, 5)[disc].min()
        assert near <= CUE_DISTANCE[1] + 3 < away


def test_the_drop_at_the_cues_budget_rewards_the_map_that_deletes_the_cue():
    """A stand-in segmenter that calls the region platelet only while a green cue sits at a known place: deleting
    the map's top pixels outside the region (as many as the grown cue has) takes the whole effect for a map on the
    cue, none for a map elsewhere, and the region's own pixels are never deleted."""
    import torch

    from explainers.segmentation.cue import budget_drops, grow
    from explainers.targets import RegionTarget

    cue = np.zeros((40, 40), bool)
    cue[14:17, 24:27] = True

    class CueReader:  # platelet logit = 8 x (the cue's mean green - 0.5), everywhere
        reference_color = (0.5, 0.5, 0.5)

        def __call__(self, images):
            green = images[:, 1, 14:17, 24:27].mean(dim=(1, 2))
            logits = torch.zeros(images.shape[0], 4, 40, 40)
            logits[:, PLATELETS] = 8 * (green - 0.5)[:, None, None]
            return logits

    image = torch.full((1, 3, 40, 40), 0.5)
    image[0, 1][torch.from_numpy(cue)] = 1.0
    region = torch.zeros(40, 40, dtype=torch.bool)
    region[12:18, 12:18] = True
    outside = ~grow(region.numpy(), 3)
    target = RegionTarget(region[None], [PLATELETS])
    on_cue = np.zeros((40, 40), np.float32)
    on_cue[14:17, 24:27] = 1.0
    elsewhere = np.zeros((40, 40), np.float32)
    elsewhere[30:35, 30:35] = 1.0
    in_region = np.zeros((40, 40), np.float32)
    in_region[12:18, 12:18] = 9.0  # inside the region: never ranked
    budget = int((grow(cue, 2) & outside).sum())
    drops = budget_drops(CueReader(), image, target, {"on cue": torch.from_numpy(on_cue),
                                                      "elsewhere": torch.from_numpy(elsewhere),
                                                      "in region": torch.from_numpy(in_region)}, outside, budget)
    start = float(target.probability(CueReader()(image))[0])
    assert start > 0.9 and drops["on cue"] == pytest.approx(start - 0.25, abs=1e-4)  # all 4 logits 0: p = 1/4
    assert drops["elsewhere"] == pytest.approx(0.0, abs=1e-6)
    assert drops["in region"] < drops["on cue"]
    # the benches' rows: pointing and drop per map, and the cue itself as the ceiling
    from explainers.segmentation.cue import cue_rows

    rows, rows_budget = cue_rows(CueReader(), image, target, {"on cue": torch.from_numpy(on_cue),
                                                              "elsewhere": torch.from_numpy(elsewhere)}, outside, cue)
    assert rows_budget == budget and rows["on cue"]["hit"] and not rows["elsewhere"]["hit"]
    assert rows["on cue"]["drop"] == pytest.approx(drops["on cue"], abs=1e-6)
    ceiling = rows["answer: the cue itself"]
    assert ceiling["hit"] and ceiling["mass"] == 1.0 and ceiling["drop"] == pytest.approx(drops["on cue"], abs=1e-4)
