"""The counterfactual test (explainers/agents/counterfactual.py) on frames and critics with a known answer."""
import numpy as np
import pytest
import torch
import torch.nn as nn

from explainers.agents.counterfactual import (control_region, counterfactual_drops, fill_from_surroundings,
                                              median_interval, paired_arm_difference, summarise_drops)

HW = (30, 40)


class RedCritic(nn.Module):
    """V(s) = the number of strongly red pixels / 10: a critic that looks at the monsters."""

    def __init__(self):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(1))

    def forward(self, frames):
        f = frames.float()
        red = ((f[:, 0] - f[:, 1]) > 80).float().flatten(1).sum(dim=1) / 10
        return torch.zeros(len(frames), 3), red + self.dummy


class WallCritic(RedCritic):
    """V(s) = the brightness of the top band of wall: a critic that ignores the monsters."""

    def forward(self, frames):
        return torch.zeros(len(frames), 3), frames[:, :, :4].float().mean(dim=(1, 2, 3)) / 10 + self.dummy


def scenes(count=24, seed=0):
    """Grey wall over a darker floor (brightness varying per frame) with 1-3 red monsters of 4 x 3 pixels."""
    rng = np.random.default_rng(seed)
    frames = np.zeros((count, 3, *HW), np.uint8)
    masks = np.zeros((count, *HW), bool)
    for i in range(count):
        wall = rng.integers(80, 140)
        frames[i, :, :15] = wall
        frames[i, :, 15:] = wall // 2
        for _ in range(rng.integers(1, 4)):
            y, x = rng.integers(10, 20), rng.integers(2, 16)
            frames[i, 0, y:y + 4, x:x + 3], frames[i, 1:, y:y + 4, x:x + 3] = 200, 30
            masks[i, y:y + 4, x:x + 3] = True
    return frames, masks


def test_filling_removes_the_monster_and_keeps_the_rest():
    frames, masks = scenes(1)
    grown = np.pad(masks[0], 1)[:-2, 1:-1] | masks[0]  # any region works; the fill only touches it
    filled = fill_from_surroundings(frames[0], grown | masks[0])
    assert np.array_equal(filled[:, ~(grown | masks[0])], frames[0][:, ~(grown | masks[0])])
    assert ((filled[0].astype(int) - filled[1].astype(int)) < 40).all()  # no red left


def test_control_region_has_the_same_area_and_keeps_away_from_the_monsters():
    _, masks = scenes(5, seed=3)
    rng = np.random.default_rng(0)
    for mask in masks:
        control = control_region(mask, rng)
        assert control is not None and control.sum() == mask.sum() and not (control & mask).any()
    full_width = np.zeros(HW, bool)
    full_width[10:12] = True
    assert control_region(full_width, rng) is None


def test_a_critic_that_reads_the_monsters_drops_and_one_that_ignores_them_does_not():
    frames, masks = scenes(24)
    episodes = np.arange(24) // 4  # 6 episodes of 4 frames
    red = summarise_drops(counterfactual_drops(RedCritic(), frames, masks, episodes=episodes), n_resamples=500)
    wall = summarise_drops(counterfactual_drops(WallCritic(), frames, masks, episodes=episodes), n_resamples=500)
    assert red["frames"] == 24 and red["monsters"]["median"] > 0.5
    assert red["control"]["median"] == pytest.approx(0.0, abs=1e-9)
    assert red["monsters_minus_control"]["interval"][0] > 0
    assert abs(wall["monsters_minus_control"]["median"]) < 0.05 and abs(wall["monsters"]["median"]) < 0.05
    paired = paired_arm_difference(counterfactual_drops(RedCritic(), frames, masks, episodes=episodes),
                                   counterfactual_drops(WallCritic(), frames, masks, episodes=episodes),
                                   n_resamples=500)
    assert paired["interval"][0] > 0


def test_median_interval_resamples_episodes():
    values = np.r_[np.zeros(10), np.ones(10)]
    by_frame = median_interval(values, n_resamples=400)
    by_episode = median_interval(values, np.r_[np.zeros(10), np.ones(10)], n_resamples=400)
    assert by_frame["n"] == by_episode["n"] == 20
    # two episodes: a resample is often one episode twice, so the interval spans 0 to 1
    assert by_episode["interval"] == [0.0, 1.0]
