"""One training seed per arm on a scenario, judged by the rule written before its runs (docs/agents.md, "A second
scenario"): does each agent play (its held-out return above the blind script's, paired over the same episodes,
lower bound > 0), and for agents that play, CAMAL against vanilla and against what needs no model.

    PYTHONPATH=. python bench/agents_scenario_results.py --scenario health_gathering \\
        --baselines bench/results/agents-baselines-health_gathering-100x156.json \\
        --agent vanilla RUNS/hg-vanilla-s101.json RUNS/eval/hg-vanilla-s101.json RUNS/eval/hg-vanilla-s101-greedy.json \\
        --agent camal RUNS/hg-camal-s101.json RUNS/eval/hg-camal-s101.json RUNS/eval/hg-camal-s101-greedy.json \\
        --out bench/results/agents-health_gathering

Writes OUT.json (every figure with its interval) and OUT.md (the table a person reads). Episodes are paired by
their reset seed: the scripts of bench/agents_baselines.py played the same seeds, in order from its seed base.
With one seed per arm, CAMAL minus vanilla is over episodes of one training run each: it says nothing about
training seeds. An agent given without evaluations (its run not finished) is listed as not judged.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from explainers.agents.counterfactual import summarise_drops
from explainers.agents.envs import SCENARIOS
from explainers.statistics import mean_with_ci, paired_difference, rounded

EV_UPDATES, EV_FLOOR = 5, 0.5  # explained variance: mean of the last 5 updates, >= 0.5 asked (as the comparison)


def by_seed(evaluation: dict) -> dict:
    return {e["seed"]: e for e in evaluation["episodes"]}


def script_returns(baselines: dict) -> dict:
    """{policy: {reset seed: return}} from bench/agents_baselines.py's per-episode returns."""
    first = baselines["episode_seeds"][0]
    return {name: {first + k: value for k, value in enumerate(policy["returns"])}
            for name, policy in baselines["policies"].items()}


mean_ci = mean_with_ci


def judge_agent(card: dict, sampled: dict, greedy: dict | None, scripts: dict) -> dict:
    episodes = by_seed(sampled)
    seeds = sorted(episodes)
    missing = [s for s in seeds if s not in scripts["blind"]]
    if missing:
        raise SystemExit(f"the scripts did not play seeds {missing[:3]}...: use the baselines of the same episodes")
    returns = [episodes[s]["return"] for s in seeds]
    row = {"return": mean_ci(returns),
           "minus_blind": paired_difference(returns, [scripts["blind"][s] for s in seeds]),
           "minus_random": paired_difference(returns, [scripts["random"][s] for s in seeds]),
           "minus_aimed": paired_difference(returns, [scripts["aimed"][s] for s in seeds]),
           "steps_alive": mean_ci([episodes[s]["length"] for s in seeds])}
    row["plays"] = bool(row["minus_blind"]["ci95"] and row["minus_blind"]["ci95"][0] > 0)
    if greedy is not None:
        row["return_greedy"] = mean_ci([e["return"] for e in greedy["episodes"]])
    ious = {s: episodes[s].get("iou") for s in seeds}
    references = {s: episodes[s].get("iou_reference") or {} for s in seeds}
    kept = [s for s in seeds if ious[s] is not None]
    row["iou"] = mean_ci([ious[s] for s in kept])
    for key in ("random", "prior", "ceiling"):
        pairs = [s for s in kept if references[s].get(key) is not None]
        row[f"iou_{key}"] = mean_ci([references[s][key] for s in pairs])
        if key != "ceiling" and pairs:
            row[f"iou_minus_{key}"] = paired_difference([ious[s] for s in pairs], [references[s][key] for s in pairs])
    drops = next(iter((sampled.get("counterfactual") or {}).values()), None)
    if drops:
        row["counterfactual"] = summarise_drops(drops, SCENARIOS[card["scenario"]].what_matters, n_resamples=2000)
    history = card.get("history") or []
    tail = [h["explained_variance"] for h in history[-EV_UPDATES:] if h.get("explained_variance") is not None]
    row["explained_variance_end"] = float(np.mean(tail)) if tail else None
    row["training"] = {"steps": card.get("steps"), "seconds": card.get("train_seconds"), "lambda": card.get("lambda"),
                       "seed": card.get("seed")}
    return row


def arm_difference(first: dict, second: dict, key: str) -> dict | None:
    a, b = by_seed(first), by_seed(second)
    seeds = sorted(set(a) & set(b))
    pairs = [(a[s].get(key), b[s].get(key)) for s in seeds]
    pairs = [(x, y) for x, y in pairs if x is not None and y is not None]
    return paired_difference([x for x, _ in pairs], [y for _, y in pairs]) if pairs else None


def table(result: dict) -> str:
    def cell(summary, digits=1):
        if not summary or summary.get("mean") is None:
            return ""
        low, high = summary.get("ci95") or (None, None)
        interval = f" [{low:.{digits}f}, {high:.{digits}f}]" if low is not None else ""
        return f"{summary['mean']:.{digits}f}{interval}"

    lines = ["| agent | plays (minus blind, lower bound > 0) | return (sampled) | greedy | minus blind | "
             "V(s)-CAM IoU | IoU: random / prior / ceiling | counterfactual gap | explained variance (end) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, row in result["agents"].items():
        if not row.get("judged", True):
            lines.append(f"| {name} | not judged: {row['why']} | | | | | | | |")
            continue
        gap = (row.get("counterfactual") or {}).get("monsters_minus_control") or {}
        gap_text = (f"{gap['median']:+.3f} [{gap['interval'][0]:+.3f}, {gap['interval'][1]:+.3f}]"
                    if gap.get("interval") else "")
        references = " / ".join(f"{row[f'iou_{k}']['mean']:.3f}" if row[f"iou_{k}"]["mean"] is not None else "-"
                                for k in ("random", "prior", "ceiling"))
        ev = row["explained_variance_end"]
        lines.append(f"| {name} | {'yes' if row['plays'] else 'no'} | {cell(row['return'])} | "
                     f"{cell(row.get('return_greedy'))} | {cell(row['minus_blind'])} | {cell(row['iou'], 3)} | "
                     f"{references} | {gap_text} | {'' if ev is None else f'{ev:.2f}'} |")
    for name, value in result["scripts"].items():
        lines.append(f"| *{name} script* | | {cell(value, 1)} | | | | | | |")
    if result.get("camal_minus_vanilla"):
        lines += ["", "| CAMAL minus vanilla, paired over the same episodes (one training seed each) | "
                      "difference [95% CI] |", "|---|---|"]
        for key, value in result["camal_minus_vanilla"].items():
            if value is None:
                continue
            if "median" in value:
                text = (f"{value['median']:+.3f} [{value['interval'][0]:+.3f}, {value['interval'][1]:+.3f}] "
                        "(median over frames)")
            else:
                text = f"{value['mean']:+.3f} [{value['ci95'][0]:+.3f}, {value['ci95'][1]:+.3f}]"
            lines.append(f"| {key.replace('_', ' ')} | {text} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--baselines", required=True)
    parser.add_argument("--agent", nargs="+", action="append", required=True,
                        metavar="ARM CARD [SAMPLED_EVAL GREEDY_EVAL]")
    parser.add_argument("--out", required=True, help="OUT.json and OUT.md are written")
    args = parser.parse_args(argv)
    baselines = json.loads(Path(args.baselines).read_text())
    if baselines.get("scenario") != args.scenario:
        raise SystemExit(f"the baselines are of {baselines.get('scenario')}, not {args.scenario}")
    scripts = script_returns(baselines)
    result = {"command": "python bench/agents_scenario_results.py " + " ".join(argv or sys.argv[1:]),
              "scenario": args.scenario, "rule": "docs/agents.md, 'A second scenario': an agent plays when its "
              "mean held-out return (sampled) is above the blind script's, paired over the episodes, lower bound of "
              "the 95% interval > 0",
              "episode_seeds": baselines["episode_seeds"], "blind_script": baselines.get("blind", "blind"),
              "scripts": {name: policy["return"] for name, policy in baselines["policies"].items()},
              "agents": {}}
    evaluations = {}
    for arm, card_path, *evals in args.agent:
        card = json.loads(Path(card_path).read_text())
        if card.get("scenario") != args.scenario:
            raise SystemExit(f"{card_path} is a {card.get('scenario')} agent")
        if len(evals) < 1 or not Path(evals[0]).exists():
            result["agents"][arm] = {"judged": False, "why": f"no evaluation yet ({card.get('steps')} steps trained)"}
            continue
        sampled = json.loads(Path(evals[0]).read_text())
        greedy = json.loads(Path(evals[1]).read_text()) if len(evals) > 1 and Path(evals[1]).exists() else None
        evaluations[arm] = sampled
        result["agents"][arm] = judge_agent(card, sampled, greedy, scripts)
    if {"camal", "vanilla"} <= set(evaluations):
        first, second = evaluations["camal"], evaluations["vanilla"]
        result["camal_minus_vanilla"] = {"return": arm_difference(first, second, "return"),
                                         "iou": arm_difference(first, second, "iou")}
        # the counterfactual gap is not differenced here: each agent plays its own frames, so its frames do not
        # pair (each arm's gap, with its interval, is in its row)
    Path(args.out + ".json").write_text(json.dumps(rounded(result), indent=1))
    Path(args.out + ".md").write_text(table(result))
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
