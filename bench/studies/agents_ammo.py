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

import torch

from explainers.agents.checkpoint import load_agent
from explainers.agents.evaluate import play_episode
from explainers.statistics import mean_with_ci


def play(net, seed: int, max_steps: int = 600) -> dict:
    """One sampled episode (the evaluation's own loop and generator), read for kills and the ammunition."""
    record = play_episode(net, "defend_the_center", seed, max_steps=max_steps, game_variables=("AMMO2",))
    ammo = record["game_variables"]["AMMO2"]
    shots = [step for step in range(1, len(ammo)) if ammo[step] < ammo[step - 1]]  # steps after which a round went
    return {"seed": seed, "kills": sum(reward > 0 for reward in record["rewards"]), "ammo_left": int(ammo[-1]),
            "steps": record["length"], "last_shot_step": shots[-1] if shots else None}


def summary(episodes: list) -> dict:
    def mean_ci(values):
        return mean_with_ci(values, digits=3)

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
