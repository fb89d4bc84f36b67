"""What needs no trained agent: scripted policies (the return an agent must beat) and the IoU reference points
(the IoU a map must beat, and the best a CAM grid can reach).

Policies (`SCRIPTS[scenario]`), each a function (frame, mask, step, rng, buttons) -> button name:
- "random": a uniformly random action (both scenarios);
- defend_the_center: "blind", TURN_LEFT and ATTACK alternating (sees nothing); "aimed", privileged: reads the
  labels mask, turns toward the monster nearest the centre column and fires when one covers it (an upper
  reference, not a fair opponent);
- health_gathering: the blind candidates "forward" (MOVE_FORWARD always) and "forward-turn-N" (TURN_LEFT every Nth
  step, N = 2, 4, 8), of which `bench/agents_baselines.py --choose-blind` names the best on training seeds before
  any agent is read ("blind" is that choice); "aimed", privileged: turns toward the lowest (nearest) medkit in the
  mask and walks forward when it is near the centre column.
IoU references per frame with a non-empty mask (`metrics.top_pixel_iou`, as the agents' V(s)-CAM is scored):
- "random": a random map (uniform noise, seeded);
- "prior": a fixed map, the mean mask over training-seed frames (where monsters tend to be, from no frame);
- "ceiling": the mask itself average-pooled to the CAM grid and upsampled bilinearly: the best map a CAM at that
  grid can draw, up to how it is upsampled.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..metrics import top_pixel_iou
from .envs import FRAME_HW, make_env

CENTRE_TOLERANCE = 0.04  # of the frame's width: a monster this close to the centre column is fired at


def _random(frame, mask, step, rng, buttons):
    return buttons[int(rng.integers(0, len(buttons)))]


def _blind(frame, mask, step, rng, buttons):
    return "TURN_LEFT" if step % 2 == 0 else "ATTACK"


def _aimed(frame, mask, step, rng, buttons):
    columns = np.flatnonzero(mask.any(axis=0))
    if not len(columns):
        return "TURN_LEFT"
    centre = (mask.shape[1] - 1) / 2
    nearest = columns[np.argmin(np.abs(columns - centre))]
    if abs(nearest - centre) <= CENTRE_TOLERANCE * mask.shape[1] or mask[:, int(round(centre))].any():
        return "ATTACK"
    return "TURN_RIGHT" if nearest > centre else "TURN_LEFT"


def _forward_turning(every: int):
    def policy(frame, mask, step, rng, buttons):
        return "TURN_LEFT" if every and step % every == every - 1 else "MOVE_FORWARD"
    return policy


def _walk_to_medkit(frame, mask, step, rng, buttons):
    rows = np.flatnonzero(mask.any(axis=1))
    if not len(rows):
        return "TURN_LEFT"  # none in sight: look around
    columns = np.flatnonzero(mask[rows[-1]])  # the lowest medkit in the frame is the nearest on the floor
    target = columns[np.argmin(np.abs(columns - (mask.shape[1] - 1) / 2))]
    offset = target - (mask.shape[1] - 1) / 2
    if abs(offset) <= MEDKIT_TOLERANCE * mask.shape[1]:
        return "MOVE_FORWARD"
    return "TURN_RIGHT" if offset > 0 else "TURN_LEFT"


MEDKIT_TOLERANCE = 0.08  # of the frame's width: a medkit this close to the centre column is walked to
BLIND_CANDIDATES = {"health_gathering": {"forward": 0, "forward-turn-2": 2, "forward-turn-4": 4, "forward-turn-8": 8}}
# The blind script of each scenario; health_gathering's is the candidate `bench/agents_baselines.py --choose-blind`
# chose on 20 training-seed episodes (bench/results/agents-health_gathering-blind-choice.json).
CHOSEN_BLIND = {"health_gathering": "forward-turn-2"}
SCRIPTS = {
    "defend_the_center": {"random": _random, "blind": _blind, "aimed": _aimed},
    "health_gathering": {"random": _random, "aimed": _walk_to_medkit,
                         **{name: _forward_turning(every)
                            for name, every in BLIND_CANDIDATES["health_gathering"].items()}},
}
for _scenario, _name in CHOSEN_BLIND.items():
    SCRIPTS[_scenario]["blind"] = SCRIPTS[_scenario][_name]

def script(scenario_name: str, policy: str):
    scripts = SCRIPTS.get(scenario_name, {})
    if policy not in scripts:
        raise ValueError(f"No script '{policy}' for {scenario_name}. Available: {', '.join(scripts) or 'none'}.")
    return scripts[policy]


def button_actions(env) -> dict:
    """{button name: action index} of the actions that press one button (and "NOOP" for none)."""
    game = env.env.unwrapped.game
    names = [str(button).split(".")[-1] for button in game.get_available_buttons()]
    actions = {}
    for index, pressed in enumerate(env.env.unwrapped.button_map):
        pressed = np.asarray(pressed)
        if pressed.sum() == 0:
            actions["NOOP"] = index
        elif pressed.sum() == 1:
            actions[names[int(np.argmax(pressed))]] = index
    return actions


def play_scripted(policy: str, scenario_name: str, seed: int, *, frame_hw=FRAME_HW, max_steps: int = 600,
                  keep_masks: bool = False, env=None) -> dict:
    """One episode of a scripted policy from reset seed `seed`: return, length, and the masks if asked."""
    own_env = env is None
    env = env or make_env(scenario_name, frame_hw=frame_hw)
    rng = np.random.default_rng(seed)
    actions = button_actions(env)
    choose = script(scenario_name, policy)
    buttons = sorted(name for name in actions if name != "NOOP")
    try:
        frame, mask = env.reset(seed=seed)
        total, steps, done, masks = 0.0, 0, False, []
        while not done and steps < max_steps:
            if keep_masks:
                masks.append(mask)
            frame, mask, reward, done, _ = env.step(actions[choose(frame, mask, steps, rng, buttons)])
            total += reward / env.scenario.reward_scale
            steps += 1
    finally:
        if own_env:
            env.close()
    record = {"policy": policy, "seed": seed, "return": total, "length": steps, "capped": not done}
    if keep_masks:
        record["masks"] = np.stack(masks) if masks else np.zeros((0, *frame_hw), bool)
    return record


def ceiling_maps(masks: torch.Tensor, grid) -> torch.Tensor:
    """The best map a CAM at `grid` (h x w) can draw for each mask: area-pooled to the grid, upsampled back."""
    pooled = F.adaptive_avg_pool2d(masks.float()[:, None], tuple(grid))
    return F.interpolate(pooled, size=masks.shape[-2:], mode="bilinear", align_corners=False)[:, 0]


def iou_references(masks, grid, prior=None, seed: int = 0) -> dict:
    """Per-frame IoU of the reference maps with the masks (frames with an empty mask left out)."""
    masks = torch.as_tensor(np.asarray(masks, bool))
    masks = masks[masks.flatten(1).any(dim=1)]
    if not len(masks):
        return {"random": [], "ceiling": [], **({"prior": []} if prior is not None else {})}
    generator = torch.Generator().manual_seed(seed)
    out = {"random": top_pixel_iou(torch.rand(masks.shape, generator=generator), masks).tolist(),
           "ceiling": top_pixel_iou(ceiling_maps(masks, grid), masks).tolist()}
    if prior is not None:
        # ties broken by a tiny seeded noise: a flat prior would otherwise pick pixels in memory order
        prior = torch.as_tensor(np.asarray(prior, np.float32)).expand_as(masks)
        noise = 1e-6 * torch.rand(masks.shape, generator=generator)
        out["prior"] = top_pixel_iou(prior + noise, masks).tolist()
    return out


def cam_grid(net, frame_hw) -> tuple:
    """The CAM layer's grid for frames of this size."""
    from .networks import value_cam

    with torch.no_grad():
        frames = torch.zeros((1, 3, *frame_hw), dtype=torch.uint8, device=next(net.parameters()).device)
    return tuple(value_cam(net, frames, at_grid=True)[0].shape[-2:])
