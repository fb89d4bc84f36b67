"""How a trained agent spends its ammunition on defend_the_center: per held-out episode, the kills, the ammo left
when the episode ends, and the step at which the last round was fired (the scenario gives 26 rounds and hides the
count: its status bar is off). An agent that dies with an empty gun after shooting at nothing is short of aim,
not of time; one that dies with rounds left is short of turning or of seeing.

    PYTHONPATH=. python bench/studies/agents_ammo.py --agents CARD.json [CARD.json ...] --episodes 20 \
        --seed-base 10000000 --out bench/results/agents-ammo.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from explainers.agents.checkpoint import load_agent
from explainers.agents.envs import make_env
from explainers.agents.networks import frame_hw_of, hud_of, value_cam
from explainers.statistics import bootstrap_ci


def play(net, seed: int, max_steps: int = 600) -> dict:
    import vizdoom

    env = make_env("defend_the_center", frame_hw=frame_hw_of(net), hud=hud_of(net))
    game = env.env.unwrapped.game
    generator = torch.Generator().manual_seed(seed)
    frame, _ = env.reset(seed=seed)
    ammo, kills, last_shot, steps, done = game.get_game_variable(vizdoom.GameVariable.AMMO2), 0, None, 0, False
    try:
        while not done and steps < max_steps:
            with torch.no_grad():
                _, logits, _ = value_cam(net, torch.from_numpy(frame).unsqueeze(0))
            action = int(torch.multinomial(logits.float().softmax(dim=1), 1, generator=generator))
            frame, _, reward, done, _ = env.step(action)
            steps += 1
            kills += int(reward > 0)
            if not done:
                now = game.get_game_variable(vizdoom.GameVariable.AMMO2)
                if now < ammo:
                    last_shot = steps
                ammo = now
    finally:
        env.close()
    return {"seed": seed, "kills": kills, "ammo_left": int(ammo), "steps": steps, "last_shot_step": last_shot}


def summary(episodes: list) -> dict:
    def mean_ci(values):
        values = np.asarray(values, float)
        low, high = bootstrap_ci(values)
        return {"mean": round(float(values.mean()), 3), "ci95": [round(float(low), 3), round(float(high), 3)]}

    empty = [e["ammo_left"] == 0 for e in episodes]
    return {"episodes": len(episodes), "kills": mean_ci([e["kills"] for e in episodes]),
            "ammo_left": mean_ci([e["ammo_left"] for e in episodes]),
            "share_ending_with_an_empty_gun": mean_ci(empty),
            "kills_per_round_fired": mean_ci([e["kills"] / max(26 - e["ammo_left"], 1) for e in episodes]),
            "steps_alive_after_the_last_round": mean_ci([e["steps"] - e["last_shot_step"] for e in episodes
                                                         if e["ammo_left"] == 0 and e["last_shot_step"]] or [0])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", nargs="+", required=True)
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--seed-base", type=int, default=10_000_000)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {}
    for card_path in args.agents:
        net, card = load_agent(card_path)
        episodes = [play(net, args.seed_base + k) for k in range(args.episodes)]
        results[card["name"]] = {"summary": summary(episodes), "episodes": episodes,
                                 "train_seed": card.get("seed"), "hud": bool(card.get("hud", False))}
        print(card["name"], json.dumps(results[card["name"]]["summary"]), flush=True)
    Path(args.out).write_text(json.dumps({"seed_base": args.seed_base, "rounds": 26, "agents": results},
                                         indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
