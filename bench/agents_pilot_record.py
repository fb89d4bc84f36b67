"""The pilots' record (bench/results/agents-pilots.json) from their gate evaluations (`evaluate-agent` JSON on
100 held-out episodes) and their training checkpoints' histories: the gate of bench/agents_recipe_gate.md,
per pilot the mean return with its 95% bootstrap interval, the IoU of the V(s)-CAM with its reference points on
the same frames, the counterfactual test, the training curve, and which recipe the comparison uses.

    PYTHONPATH=. python bench/agents_pilot_record.py --pilot A EVAL_A.json CKPT_A.json --pilot B EVAL_B.json \
        CKPT_B.json --out bench/results/agents-pilots.json
    PYTHONPATH=. python bench/agents_pilot_record.py --unfinished CKPT.json --out RECORD.json   # a run's curve

The second round (the spread between seeds; its gate in bench/agents_recipe_gate.md): one change, two fresh
training seeds, accepted when every seed returns >= SECOND_ROUND_EACH and their mean >= GATE_RETURN:

    PYTHONPATH=. python bench/agents_pilot_record.py --change "--lr-schedule linear" --seed-run 6 EVAL_6.json \
        CKPT_6.json --seed-run 7 EVAL_7.json CKPT_7.json --out bench/results/agents-pilots-lr-schedule.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


from agents_comparison import GATE_RETURN, NETWORKS, PREFERENCE, RECIPE, STEPS
from explainers.agents.counterfactual import summarise_drops
from explainers.statistics import mean_with_ci


def _mean_ci(values) -> dict:
    return mean_with_ci(values, digits=4)


SECOND_ROUND_EACH = 12.0
# recipe A's held-out returns per training seed (the gate's seed 1, then the comparison's 101-105), for the record
RECIPE_A_SEEDS = {1: 15.15, 101: 13.24, 102: 8.48, 103: 12.36, 104: 14.77, 105: 14.52}


def pilot(evaluation: dict, state: dict, key: str) -> dict:
    episodes = evaluation["episodes"]
    returns = [e["return"] for e in episodes]
    references = {k: _mean_ci([e["iou_reference"].get(k) for e in episodes]) for k in episodes[0]["iou_reference"]}
    drops = summarise_drops(next(iter(evaluation["counterfactual"].values())), n_resamples=5000)
    fidelity = next(iter(evaluation["fidelity"].values()))
    history = state["history"]
    curve = training_curve(history[3::4])
    return {"network": NETWORKS[key], "train_seed": 1, "steps": state["steps"], "train_seconds": state["seconds"],
            "return": _mean_ci(returns), "passed": float(np.mean(returns)) >= GATE_RETURN,
            "steps_alive": _mean_ci([e["length"] for e in episodes]),
            "episode_seeds": [evaluation["episode_seeds"][0], evaluation["episode_seeds"][-1]],
            "iou": _mean_ci([e["iou"] for e in episodes]), "iou_reference": references,
            "counterfactual": drops, "deletion_drop": _mean_ci(fidelity["deletion_drop"]),
            "explained_variance_last5": round(float(np.mean([r["explained_variance"] for r in history[-5:]])), 3),
            "training_curve": curve}


def seed_run(evaluation: dict, state: dict, seed: int) -> dict:
    """One training seed's figures in the second round: `pilot`'s, with the run's peak and final training return
    (mean of the last 100 training episodes: whether it fell from its peak at the end)."""
    figures = pilot(evaluation, state, "A")
    returns = [r["return_100"] for r in state["history"] if r.get("return_100") is not None]
    figures.update(train_seed=seed, training_return_peak=round(max(returns), 3),
                   training_return_final=round(returns[-1], 3))
    return figures


def second_round(change: str, runs: dict) -> dict:
    means = {seed: run["return"]["mean"] for seed, run in runs.items()}
    passed = min(means.values()) >= SECOND_ROUND_EACH and float(np.mean(list(means.values()))) >= GATE_RETURN
    return {"gate": f"every seed >= {SECOND_ROUND_EACH} and their mean >= {GATE_RETURN} on the gate's 100 held-out "
                    "episodes (bench/agents_recipe_gate.md, second round)",
            "recipe": RECIPE + NETWORKS["A"], "change": change, "steps_cap": STEPS, "runs": runs,
            "mean_over_seeds": round(float(np.mean(list(means.values()))), 3), "passed": passed,
            "recipe_a_by_seed": RECIPE_A_SEEDS}


def training_curve(rows) -> list:
    keys = ("steps", "return_100", "explained_variance", "entropy", "ppo_grad_norm", "camal_grad_norm", "iou",
            "camal_gap", "seconds")
    return [{k: round(r[k], 4) for k in keys if isinstance(r.get(k), (int, float))} for r in rows]


def unfinished(state: dict) -> dict:
    """The training curve of a run that has not finished (no held-out episode played)."""
    return {"run": state.get("run"), "steps": state["steps"], "train_seconds": state["seconds"],
            "note": "training-frame figures only (return_100: the last 100 training episodes; iou: the V(s)-CAM "
                    "on the rollout's frames); not judged on held-out episodes",
            "training_curve": training_curve(state["history"])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pilot", nargs=3, action="append", metavar=("KEY", "EVAL", "CHECKPOINT_JSON"))
    parser.add_argument("--unfinished", metavar="CHECKPOINT_JSON")
    parser.add_argument("--change", help="second round: the one change to recipe A, as its flags")
    parser.add_argument("--seed-run", nargs=3, action="append", metavar=("SEED", "EVAL", "CHECKPOINT_JSON"))
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.unfinished:
        Path(args.out).write_text(json.dumps(unfinished(json.loads(Path(args.unfinished).read_text())), indent=1))
        return 0
    if args.seed_run:
        runs = {int(seed): seed_run(json.loads(Path(e).read_text()), json.loads(Path(c).read_text()), int(seed))
                for seed, e, c in args.seed_run}
        record = second_round(args.change, runs)
        Path(args.out).write_text(json.dumps(record, indent=1))
        print(json.dumps({"passed": record["passed"], **{s: r["return"] for s, r in runs.items()}}))
        return 0
    pilots = {key: pilot(json.loads(Path(e).read_text()), json.loads(Path(c).read_text()), key)
              for key, e, c in args.pilot}
    passed = [key for key in PREFERENCE if key in pilots and pilots[key]["passed"]]
    record = {"gate": f"mean return >= {GATE_RETURN} on 100 held-out episodes within 200k steps "
                      "(bench/agents_recipe_gate.md)", "recipe": RECIPE, "steps_cap": STEPS,
              "pilots": pilots, "chosen": passed[0] if passed else None}
    Path(args.out).write_text(json.dumps(record, indent=1))
    print(json.dumps({k: (v["return"], v["passed"]) for k, v in pilots.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
