"""What an agent must beat, with no trained agent: the scripted policies' returns and the IoU reference points.

    PYTHONPATH=. python bench/agents_baselines.py --frame-hw 100 156 --episodes 100 \
        --grids 9x16 25x39 --out bench/results/agents-baselines-100x156.json \
        --prior-out bench/results/agents-mask-prior-100x156.npy

- Returns: `random`, `blind` (TURN_LEFT / ATTACK alternating) and `aimed` (privileged: aims with the labels mask)
  on held-out reset seeds SEED_BASE + k (k < episodes), mean with a 95% bootstrap interval, and steps alive.
- The fixed prior map: the mean mask over the frames of `--prior-episodes` episodes of the random and the aimed
  script on TRAINING reset seeds (1000 + k), saved as .npy for `evaluate-agent --prior`.
- `--choose-blind` (health_gathering): plays every blind candidate on TRAINING reset seeds 1-20 and writes the
  best mean return's name, to be set as the scenario's `CHOSEN_BLIND` before any agent is read.
- IoU reference points on the held-out frames of the blind and the aimed scripts: a random map, the prior map, and
  the ceiling of each CAM grid (the mask average-pooled to the grid and upsampled), mean and 95% interval over
  episodes (an episode's score is its frames' mean).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np


from explainers.agents.baselines import iou_references, play_scripted
from explainers.agents.envs import make_env
from explainers.agents.train import EVAL_SEED_BASE
from explainers.statistics import mean_with_ci


summary = mean_with_ci


def choose_blind(args, episodes: int = 20) -> int:
    """The blind candidates on training reset seeds 1..episodes: the best mean return is the scenario's blind."""
    from explainers.agents.baselines import BLIND_CANDIDATES

    candidates = BLIND_CANDIDATES.get(args.scenario)
    if not candidates:
        raise SystemExit(f"{args.scenario} has one blind script; there is nothing to choose.")
    env = make_env(args.scenario, frame_hw=tuple(args.frame_hw), hud=args.hud)
    try:
        table = {name: summary([play_scripted(name, args.scenario, 1 + k, frame_hw=tuple(args.frame_hw),
                                              env=env)["return"] for k in range(episodes)])
                 for name in candidates}
    finally:
        env.close()
    chosen = max(table, key=lambda name: table[name]["mean"])
    Path(args.out).write_text(json.dumps({
        "command": "python bench/agents_baselines.py " + " ".join(sys.argv[1:]), "scenario": args.scenario,
        "rule": f"the blind candidate with the highest mean return on training reset seeds 1-{episodes}",
        "candidates": table, "chosen": chosen}, indent=1))
    print(json.dumps({name: row["mean"] for name, row in table.items()}), "chosen:", chosen, file=sys.stderr)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="defend_the_center")
    parser.add_argument("--frame-hw", type=int, nargs=2, default=(100, 156))
    parser.add_argument("--hud", action="store_true",
                        help="the status bar drawn, as agents trained with --hud see the game (the view above it is "
                             "shorter, so the masks and the prior map differ)")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--seed-base", type=int, default=EVAL_SEED_BASE)
    parser.add_argument("--prior-episodes", type=int, default=20)
    parser.add_argument("--grids", nargs="+", default=["9x16", "25x39"], help="CAM grids, HxW")
    parser.add_argument("--out", required=True)
    parser.add_argument("--prior-out", default=None)
    parser.add_argument("--choose-blind", action="store_true",
                        help="choose the scenario's blind script on training seeds 1-20 and stop")
    args = parser.parse_args(argv)
    if args.choose_blind:
        return choose_blind(args)
    if not args.prior_out:
        parser.error("--prior-out is needed (where the fixed prior map is saved)")
    frame_hw = tuple(args.frame_hw)
    grids = [tuple(int(v) for v in g.split("x")) for g in args.grids]
    started = time.time()
    env = make_env(args.scenario, frame_hw=frame_hw, hud=args.hud)
    try:
        training = [play_scripted(policy, args.scenario, 1000 + k, frame_hw=frame_hw, env=env, keep_masks=True)
                    for policy in ("random", "aimed") for k in range(args.prior_episodes)]
        prior = np.concatenate([r["masks"] for r in training]).mean(axis=0).astype(np.float32)
        np.save(args.prior_out, prior.astype(np.float16))
        policies, references = {}, {}
        for policy in ("random", "blind", "aimed"):
            records = [play_scripted(policy, args.scenario, args.seed_base + k, frame_hw=frame_hw, env=env,
                                     keep_masks=policy in ("blind", "aimed")) for k in range(args.episodes)]
            policies[policy] = {"return": summary([r["return"] for r in records]),
                                "steps_alive": summary([r["length"] for r in records]),
                                "returns": [r["return"] for r in records]}
            print(f"{policy}: return {policies[policy]['return']}", file=sys.stderr, flush=True)
            if policy == "random":
                continue
            for grid in grids:
                per_episode = {"random": [], "prior": [], "ceiling": []}
                for r in records:
                    scores = iou_references(r["masks"], grid, prior, seed=r["seed"])
                    for key, values in scores.items():
                        per_episode[key].append(float(np.mean(values)) if values else None)
                references[f"{policy}_frames_grid_{grid[0]}x{grid[1]}"] = {k: summary(v)
                                                                          for k, v in per_episode.items()}
    finally:
        env.close()
    result = {"command": "python bench/agents_baselines.py " + " ".join(argv or sys.argv[1:]),
              "scenario": args.scenario, "frame_hw": list(frame_hw), "episode_seeds": [args.seed_base,
                                                                                         args.seed_base + args.episodes - 1],
              "prior_from": f"mean mask over {len(training)} episodes of the random and aimed scripts on training "
                            f"reset seeds 1000-{999 + args.prior_episodes}",
              "policies": policies, "iou_references": references, "seconds": round(time.time() - started, 1),
              "python": platform.python_version()}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v["return"] for k, v in policies.items()}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
