"""Evaluate agents on held-out episode seeds: return, IoU of the V(s)-CAM with the masks, and the deletion /
insertion curves of V(s) (the fidelity measure: the value should fall fast when the top pixels go).

    python -m explainers evaluate-agent --agents weights/dtc-vanilla.json weights/dtc-camal.json \
        --episodes 10 --out results.json

Episodes: reset seeds EVAL_SEED_BASE + k (never used in training), actions sampled from the policy with a
generator seeded by the episode seed (the same seed replays the same episode), or the most probable action
(`greedy`), capped at `max_steps`.
IoU: per frame whose mask is non-empty, the CAM's top pixels (as many as the mask has) against the mask
(`metrics.top_pixel_iou`, the classification CAMAL's binarisation); an episode's IoU is its frames' mean.
Beside each episode's IoU, the IoU reference points on the same frames (`baselines.iou_references`): a random
map, and the best map the agent's CAM grid can draw (the ceiling); a fixed prior map too when one is given.
Fidelity, paired: every `curve_every`-th frame of every agent's episodes is pooled, and on the SAME pooled frames
- the deletion and insertion curves of each agent's own V(s) under its own V(s)-CAM, 20 steps, towards an
  in-distribution reference (the frame blurred, Gaussian sigma 5 px: black is far from any Doom frame). A curve is
  read as the drop V(frame) - V(p) divided by the critic's spread (the standard deviation of V over the pooled
  frames), so agents with different value scales compare without dividing by V(0) - V(1), which is near zero on
  many frames;
- the counterfactual test (`counterfactual.py`): the monsters removed vs an equal-area control region removed,
  with the same control regions for every agent.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ..metrics import fraction_counts, gaussian_blur, pixel_ranks, top_pixel_iou, trapezoid_auc
from .baselines import cam_grid, iou_references
from .checkpoint import load_agent
from .counterfactual import counterfactual_drops
from .envs import make_env
from .networks import frame_hw_of, hud_of, value_cam
from .train import EVAL_SEED_BASE

MAX_EPISODE_STEPS = 600  # defend_the_center and health_gathering time out at 2100 tics = 525 steps
CURVE_STEPS = 20


def play_episode(net, scenario_name: str, seed: int, *, device="cpu", max_steps: int = MAX_EPISODE_STEPS,
                 keep_frames: bool = False, keep_screens: bool = False, env=None, greedy: bool = False,
                 game_variables: tuple = ()) -> dict:
    """One episode from reset seed `seed`: per-step value, action, reward, mask area and IoU; the frames, masks and
    CAMs too when `keep_frames`. Stops at `max_steps` with `capped` set. `game_variables` (ViZDoom's names, e.g.
    "AMMO2"): each one's value after the reset and after every step the episode goes on, in
    `record["game_variables"][name]` (a study of what the agent does, beyond its reward)."""
    own_env = env is None
    env = env or make_env(scenario_name, keep_screen=keep_screens, frame_hw=frame_hw_of(net), hud=hud_of(net))
    generator = torch.Generator().manual_seed(seed)
    frame, mask = env.reset(seed=seed)
    record = {"seed": seed, "values": [], "actions": [], "rewards": [], "ious": [], "mask_area": []}
    kept = {"frames": [], "masks": [], "cams": [], "screens": []}
    done, steps = False, 0
    watched = _game_variable_reader(env, game_variables)
    if watched:
        record["game_variables"] = {name: [value] for name, value in watched().items()}
    try:
        while not done and steps < max_steps:
            frames = torch.from_numpy(frame).unsqueeze(0).to(device)
            cams, logits, values = value_cam(net, frames)
            probabilities = logits.detach().float().softmax(dim=1).cpu()
            action = int(probabilities.argmax(dim=1)[0]) if greedy else \
                int(torch.multinomial(probabilities, 1, generator=generator))
            cam = cams[0].detach().cpu()
            iou = float(top_pixel_iou(cam[None], torch.from_numpy(mask)[None])[0]) if mask.any() else None
            record["values"].append(float(values[0].detach()))
            record["actions"].append(action)
            record["ious"].append(iou)
            record["mask_area"].append(float(mask.mean()))
            if keep_frames:
                kept["frames"].append(frame)
                kept["masks"].append(mask)
                kept["cams"].append(cam.numpy())
                if keep_screens and env.screen is not None:
                    kept["screens"].append(env.screen)
            frame, mask, reward, done, info = env.step(action)
            record["rewards"].append(reward / env.scenario.reward_scale)
            steps += 1
            if watched and not done:  # a finished episode's game has no state left to read
                for name, value in watched().items():
                    record["game_variables"][name].append(value)
    finally:
        if own_env:
            env.close()
    ious = [i for i in record["ious"] if i is not None]
    record.update({"return": float(sum(record["rewards"])), "length": steps, "capped": not done,
                   "iou": float(np.mean(ious)) if ious else None, "iou_frames": len(ious)})
    if keep_frames:
        record.update({key: np.stack(value) for key, value in kept.items() if value})
    return record


def _game_variable_reader(env, names: tuple):
    """A function reading the named ViZDoom game variables now, or None when none are asked for."""
    if not names:
        return None
    import vizdoom

    game = env.env.unwrapped.game
    variables = {name: getattr(vizdoom.GameVariable, name) for name in names}
    return lambda: {name: float(game.get_game_variable(variable)) for name, variable in variables.items()}


@torch.no_grad()
def value_curves(net, frames: torch.Tensor, cams: torch.Tensor, *, steps: int = CURVE_STEPS, batch: int = 512,
                 reference: str = "blur"):
    """Deletion and insertion curves of V(s): B x (steps + 1) each, and the fractions. Reference: the frame blurred
    ("blur", sigma 5 px) or "black"."""
    b, _, h, w = frames.shape
    fractions, counts = fraction_counts(steps, h * w)
    ranks = pixel_ranks(cams.float()).cpu()
    points = steps + 1
    total = b * points * 2
    scores = torch.empty(total)
    images = frames.float().cpu()
    fills = gaussian_blur(images) if reference == "blur" else torch.zeros_like(images)
    for start in range(0, total, batch):
        index = torch.arange(start, min(start + batch, total))
        image_index, curve, step = index // (2 * points), (index // points) % 2, index % points
        top = (ranks[image_index] < counts[step].unsqueeze(1)).view(-1, 1, h, w).float()
        original = images[image_index]
        kept = torch.where((curve == 1).view(-1, 1, 1, 1), top, 1 - top)  # insertion keeps the top pixels
        perturbed = (original * kept + fills[image_index] * (1 - kept)).round().clamp(0, 255).to(torch.uint8)
        scores[index] = net(perturbed.to(next(net.parameters()).device))[1].float().cpu()
    scores = scores.view(b, 2, points).numpy().astype(np.float64)
    return fractions, scores[:, 0], scores[:, 1]


def fidelity(net, frames: np.ndarray, device="cpu") -> dict:
    """Per-frame deletion / insertion AUC of V(s) under the agent's own V(s)-CAM (raw), and the same curves read
    as drops from V(frame) scaled by the critic's spread over these frames (`deletion_drop` higher = V falls
    sooner when the top pixels go; `insertion_drop` lower = V comes back sooner when they return)."""
    tensor = torch.from_numpy(frames).to(device)
    cams = torch.cat([value_cam(net, tensor[i:i + 256])[0].detach() for i in range(0, len(tensor), 256)])
    fractions, deletion, insertion = value_curves(net, tensor, cams)
    full = deletion[:, :1]
    spread = float(full.std()) or 1.0
    return {"deletion_auc": trapezoid_auc(deletion, fractions).tolist(),
            "insertion_auc": trapezoid_auc(insertion, fractions).tolist(), "value_spread": spread,
            "deletion_drop": trapezoid_auc((full - deletion) / spread, fractions).tolist(),
            "insertion_drop": trapezoid_auc((full - insertion) / spread, fractions).tolist()}


def evaluate_agents(card_paths: list, *, episodes: int = 10, seed_base: int = EVAL_SEED_BASE, device="cpu",
                    max_steps: int = MAX_EPISODE_STEPS, curve_every: int = 10, greedy: bool = False, prior=None,
                    log=None) -> dict:
    """Per-episode records for every agent on the same held-out seeds, and the paired fidelity on pooled frames.
    The agents must play the same scenario."""
    agents = [load_agent(path, device) for path in card_paths]
    scenarios = {card["scenario"] for _, card in agents}
    if len(scenarios) != 1:
        raise ValueError(f"the agents play different scenarios ({', '.join(sorted(scenarios))}): compare agents of "
                         "one scenario")
    scenario_name = scenarios.pop()
    seeds = [seed_base + k for k in range(episodes)]
    sizes = {frame_hw_of(net) for net, _ in agents}
    if len(sizes) != 1:
        raise ValueError("the agents read frames of different sizes: compare agents of one frame size")
    records, pooled, pooled_masks, pooled_episodes, started = [], [], [], [], time.time()
    for (net, card), path in zip(agents, card_paths):
        grid = cam_grid(net, frame_hw_of(net))
        for seed in seeds:
            episode = play_episode(net, scenario_name, seed, device=device, max_steps=max_steps, keep_frames=True,
                                   greedy=greedy)
            pooled.append(episode["frames"][::curve_every])
            pooled_masks.append(episode["masks"][::curve_every])
            pooled_episodes.append(np.full(len(pooled[-1]), seed))
            references = {k: float(np.mean(v)) if v else None
                          for k, v in iou_references(episode["masks"], grid, prior, seed=seed).items()}
            records.append({"agent": card["name"], "card": str(path), "lambda": card["lambda"],
                            "train_seed": card["seed"], "iou_reference": references,
                            **{k: v for k, v in episode.items() if k not in ("frames", "masks", "cams", "screens")}})
            if log:
                log(f"[evaluate-agent] {card['name']} seed {seed}: return {episode['return']:.1f}, "
                    f"IoU {episode['iou'] if episode['iou'] is not None else float('nan'):.3f}, "
                    f"{episode['length']} steps")
    frames, masks, episode_ids = np.concatenate(pooled), np.concatenate(pooled_masks), np.concatenate(pooled_episodes)
    paired = {card["name"]: fidelity(net, frames, device) for net, card in agents}
    counterfactual = {card["name"]: counterfactual_drops(net, frames, masks, episodes=episode_ids)
                      for net, card in agents}
    return {"scenario": scenario_name, "episode_seeds": seeds, "max_steps": max_steps, "curve_every": curve_every,
            "curve_reference": "blur", "curve_steps": CURVE_STEPS, "fidelity_frames": int(len(frames)),
            "agents": [card["name"] for _, card in agents], "episodes": records, "fidelity": paired,
            "counterfactual": counterfactual, "greedy": greedy,
            "seconds": round(time.time() - started, 1)}
