"""The comparison's figures from its evaluations (bench/agents_comparison.py, stage 5).

Per training seed, an agent's score is the mean over its 100 held-out episodes; arms are compared over the seeds
with stratified bootstrap intervals and the probability of improvement (rliable's definitions,
`explainers.agents.stats`). Beside them: the scripted baselines and the IoU reference points
(bench/results/agents-baselines-100x156.json, same frame size), the reference points on each agent's own frames,
the counterfactual gap (median over frames of the monsters' scaled drop minus the control's) per seed, and the
critics' explained variance at the end of training. A table for people (`.md` beside the `.json`) lists the same
figures per seed, the answers that need no model and the targets, met or missed.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from explainers.agents.counterfactual import summarise_drops
from explainers.agents.stats import compare_arms


ARMS = ("vanilla", "camal")  # the comparison's runs are ARM-sSEED; a lambda sweep's runs in the same folder are not


def _seed_scores(work: Path, name: str) -> dict:
    sampled = json.loads((work / "eval" / f"{name}.json").read_text())
    greedy = json.loads((work / "eval" / f"{name}-greedy.json").read_text())
    episodes = sampled["episodes"]
    ious = [e["iou"] for e in episodes if e["iou"] is not None]
    references = {key: float(np.nanmean([e["iou_reference"].get(key) if e["iou_reference"].get(key) is not None
                                         else np.nan for e in episodes]))
                  for key in episodes[0]["iou_reference"]}
    card = json.loads((work / f"{name}.json").read_text())
    drops = summarise_drops(next(iter(sampled["counterfactual"].values())), n_resamples=2000)
    return {"return": float(np.mean([e["return"] for e in episodes])),
            "return_greedy": float(np.mean([e["return"] for e in greedy["episodes"]])),
            "iou": float(np.mean(ious)) if ious else float("nan"), "iou_reference": references,
            "counterfactual_gap": drops["monsters_minus_control"]["median"],
            "counterfactual": drops,
            "deletion_drop": float(np.mean(next(iter(sampled["fidelity"].values()))["deletion_drop"])),
            "explained_variance_end": float(np.mean([r["explained_variance"] for r in card["history"][-5:]])),
            "steps": card["steps"], "train_seconds": card["train_seconds"]}


def write_results(work: Path, names: list, out: Path, planned_seeds: int = 5, reps: int | None = None,
                  stored: dict | None = None) -> dict:
    """The results file over the runs `names` (arm-sSEED, each evaluated sampled and greedy); `complete` says
    whether every arm has its `planned_seeds` seeds (a file written part-way is marked so). `reps`: the bootstrap's
    draws over seeds (rliable's 50,000 by default). `stored`: {arm: results file} takes that arm's per-seed scores
    from an earlier results file (a vanilla run does not depend on lambda, so a new lambda's CAMAL arm is compared
    with the vanilla seeds already evaluated on the same episodes), said in the file's `stored_arms`."""
    arms: dict = {arm: {int(seed): scores for seed, scores in json.loads(Path(path).read_text())["arms"][arm].items()}
                  for arm, path in (stored or {}).items()}
    for name in names:
        arm, seed = name.rsplit("-s", 1)
        if arm not in (stored or {}):
            arms.setdefault(arm, {})[int(seed)] = _seed_scores(work, name)
    comparisons = {}
    if "camal" in arms:
        seeds = sorted(set(arms["camal"]) & set(arms["vanilla"]))
        for metric in ("return", "return_greedy", "iou", "counterfactual_gap", "deletion_drop"):
            comparisons[metric] = compare_arms([arms["camal"][s][metric] for s in seeds],
                                               [arms["vanilla"][s][metric] for s in seeds],
                                               **({"reps": reps} if reps else {}))
    # the scripts on the comparison's own held-out episodes (reset seeds 10,001,000-10,001,099), their IoU
    # references on frames drawn as the agents saw them (with or without the status bar)
    hud = any(json.loads((work / f"{name}.json").read_text()).get("hud") for name in names)
    baselines_path = Path(__file__).resolve().parent / "results" / (
        f"agents-baselines-{'hud-' if hud else ''}100x156-comparison-seeds.json")
    baselines = json.loads(baselines_path.read_text()) if baselines_path.exists() else None
    lambda_path = work / "lambda.json"
    camal_ev = {seed: scores["explained_variance_end"] for seed, scores in arms.get("camal", {}).items()}
    seeds = {arm: sorted(runs) for arm, runs in arms.items()}
    result = {"seeds_done": seeds, "complete": all(len(done) == planned_seeds for done in seeds.values()),
              "stored_arms": {arm: str(path) for arm, path in (stored or {}).items()},
              "arms": arms, "camal_minus_vanilla": comparisons,
              "lambda": {**(json.loads(lambda_path.read_text()) if lambda_path.exists() else {
                  "chosen": "default 1.0 (no sweep)", "rule_after_the_fact": "explained variance >= 0.3 in every "
                  "CAMAL seed"}), "holds_in_every_camal_seed": bool(camal_ev) and min(camal_ev.values()) >= 0.3},
              "status_bar_drawn": hud, "baselines_file": baselines_path.name,
              "baselines": baselines and {"policies": {k: v["return"] for k, v in baselines["policies"].items()},
                                          "iou_references": baselines["iou_references"]},
              "ignoring_critic": "a critic that ignores the monsters has a counterfactual gap of 0"}
    out.write_text(json.dumps(result, indent=1))
    out.with_suffix(".md").write_text(markdown(result))
    return result


# (metric, what it says, the target on the CAMAL - vanilla difference as (text, test) or None)
COMPARED = (("return", "return, sampled actions",
             ("lower bound >= -1.0", lambda c: c["difference_ci"][0] >= -1.0)),
            ("return_greedy", "return, greedy actions", None),
            ("iou", "V(s)-CAM IoU with the monster masks",
             ("lower bound > 0 and POI > 0.9", lambda c: c["difference_ci"][0] > 0 and c["poi"] > 0.9)),
            ("counterfactual_gap", "counterfactual gap (monsters minus control)", None))


POLICY_LABELS = {"random": "uniform random policy", "blind": "blind script (turn left, attack)",
                 "aimed": "script aiming with the labels mask (privileged)"}


def markdown(result: dict) -> str:
    """The results as a person reads them: one row per agent, the scripts beside, then each arm difference."""
    def number(value, digits=2):
        return "n/a" if value is None or value != value else f"{value:.{digits}f}"

    lines = ["| agent | return (sampled) | greedy | V(s)-CAM IoU | IoU: random / prior / ceiling | counterfactual gap "
             "| explained variance (end) | training (min) |", "|---|---|---|---|---|---|---|---|"]
    for arm in sorted(result["arms"], reverse=True):
        for seed, scores in sorted(result["arms"][arm].items()):
            references = scores["iou_reference"]
            lines.append(f"| {arm}-s{seed} | {number(scores['return'])} | {number(scores['return_greedy'])} | "
                         f"{number(scores['iou'], 3)} | " + " / ".join(number(references.get(key), 3) for key in
                                                                        ("random", "prior", "ceiling")) +
                         f" | {number(scores['counterfactual_gap'], 3)} | "
                         f"{number(scores['explained_variance_end'])} | {number(scores['train_seconds'] / 60, 0)} |")
    for name, score in ((result.get("baselines") or {}).get("policies") or {}).items():
        lines.append(f"| *{POLICY_LABELS.get(name, name)}* | {number(score['mean'])} [{number(score['ci95'][0])}, "
                     f"{number(score['ci95'][1])}] | | | | | | |")
    lines.append("| *a critic that ignores the monsters* | | | | | 0 | | |")
    seeds = result["seeds_done"]
    lines += ["", f"Seeds evaluated: " + "; ".join(f"{arm} {', '.join(map(str, done))}" for arm, done in
                                                  sorted(seeds.items())) +
              ("" if result["complete"] else " (**not complete**: the planned five seeds per arm are not all in)") +
              "".join(f"; {arm}'s scores are the stored ones of `{Path(path).name}` (the same held-out episodes)"
                      for arm, path in sorted(result.get("stored_arms", {}).items())),
              "", "| CAMAL minus vanilla, over the shared seeds | difference [95% stratified bootstrap] | POI | "
                  "target |", "|---|---|---|---|"]
    for metric, label, target in COMPARED:
        compared = result["camal_minus_vanilla"].get(metric)
        if not compared:
            continue
        low, high = compared["difference_ci"]
        verdict = "" if target is None else f"{target[0]}: " + ("met" if target[1](compared) else "**missed**")
        lines.append(f"| {label} ({compared['runs'][0]} vs {compared['runs'][1]} seeds) | "
                     f"{number(compared['difference'], 3)} [{number(low, 3)}, {number(high, 3)}] | "
                     f"{number(compared['poi'])} | {verdict} |")
    return "\n".join(lines) + "\n"


def evaluated_runs(work: Path) -> list:
    """The runs in `work` whose sampled and greedy evaluations are both written."""
    folder = work / "eval"
    return sorted(path.stem for path in folder.glob("*-s[0-9]*.json") if not path.stem.endswith("-greedy")
                  and (folder / f"{path.stem}-greedy.json").exists())


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="the comparison's results file from the runs evaluated so far")
    parser.add_argument("--work", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--stored", nargs="*", default=[], metavar="ARM=FILE",
                        help="take ARM's per-seed scores from an earlier results FILE (e.g. vanilla=bench/results/"
                             "agents-comparison.json when only the CAMAL arm was rerun at a new lambda)")
    args = parser.parse_args(argv)
    stored = dict(item.split("=", 1) for item in args.stored)
    names = [name for name in evaluated_runs(Path(args.work)) if name.rsplit("-s", 1)[0] in ARMS]  # not the sweep's
    result = write_results(Path(args.work), names, Path(args.out), stored=stored)
    print(json.dumps({"seeds_done": result["seeds_done"], "complete": result["complete"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
