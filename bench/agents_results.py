"""Held-out results of the vanilla / CAMAL agents trained by device/agents.sh, and the shipped pair.

Reads the device run's tar (or its extracted folder): eval-s*.json (per-episode records of each vanilla/CAMAL
pair on held-out episode seeds), the agents' cards, agents-cost.json. Writes
- bench/results/agents-defend_the_center.json: per arm (5 training seeds) the mean IoU of the V(s)-CAM with the
  masks, the mean return and the V(s) deletion / insertion AUC (normalised), each with its stratified bootstrap
  95% interval over training seeds, the difference CAMAL - vanilla with its interval and the probability of
  improvement (rliable), plus the paired per-frame fidelity comparison and the update cost;
- bench/results/agents-eval/*.json: the per-episode records as evaluated (values rounded to 4 digits);
- weights/agents/defend_the_center-{vanilla,camal}.{safetensors,json}: the pair of training seed SHIPPED_SEED
  (fixed before the results were seen), cards with the command, steps, time, device and held-out figures.

    python bench/agents_results.py agents-results.tar     # from device/agents.sh
"""
from __future__ import annotations

import argparse
import datetime
import json
import shutil
import tarfile
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

from explainers.agents.stats import compare_arms, compare_arms_rliable
from explainers.statistics import bootstrap_ci, paired_difference, rounded

SHIPPED_SEED = 1
SCENARIO = "defend_the_center"
# what produced the results: bench/agents_cpu_run.sh (not device/agents.sh: see device/agents.md)
TRAIN_COMMAND = ("nice -n 10 python -m explainers train-agent --scenario defend_the_center --seed {seed} "
                 "--lambda {lam} "
                 "--steps {steps}{budget} --num-envs 4 --rollout-steps 128 --minibatch 128 --width 8 "
                 "--hidden 64 --device cpu --out weights --name dtc-{arm}-s{seed}")
EVAL_COMMAND = ("nice -n 10 python -m explainers evaluate-agent --agents weights/dtc-vanilla-s{seed}.json "
                "weights/dtc-camal-s{seed}.json --episodes 10 --device cpu --out eval-s{seed}.json")


def extract(source: Path) -> Path:
    if source.is_dir():
        return source
    folder = Path(tempfile.mkdtemp(prefix="agents-results-"))
    with tarfile.open(source) as archive:
        archive.extractall(folder, filter="data")
    return folder


def run_scores(evaluations: list) -> dict:
    """{arm: {train_seed: {"iou": ..., "return": ..., "deletion": ..., "insertion": ...}}} (means over episodes
    and, for the curves, over the pair's pooled frames)."""
    runs = {"vanilla": {}, "camal": {}}
    for evaluation in evaluations:
        for name in evaluation["agents"]:
            episodes = [e for e in evaluation["episodes"] if e["agent"] == name]
            arm = "camal" if episodes[0]["lambda"] else "vanilla"
            ious = [e["iou"] for e in episodes if e["iou"] is not None]
            curves = evaluation["fidelity"][name]
            runs[arm][episodes[0]["train_seed"]] = {
                "name": name, "episodes": len(episodes), "return": float(np.mean([e["return"] for e in episodes])),
                "iou": float(np.mean(ious)) if ious else float("nan"),
                "deletion": float(np.nanmean(curves["deletion_auc_norm"])),
                "insertion": float(np.nanmean(curves["insertion_auc_norm"])),
                "episode_returns": [e["return"] for e in episodes], "episode_ious": [e["iou"] for e in episodes]}
    return runs


def arm_comparisons(runs: dict, reps: int) -> dict:
    seeds = sorted(set(runs["camal"]) & set(runs["vanilla"]))
    out = {"train_seeds": seeds}
    for metric in ("iou", "return", "deletion", "insertion"):
        camal = np.array([[runs["camal"][s][metric]] for s in seeds])
        vanilla = np.array([[runs["vanilla"][s][metric]] for s in seeds])
        try:
            result = compare_arms_rliable(camal, vanilla, reps=reps)
        except ImportError:
            result = compare_arms(camal, vanilla, reps=reps)
        out[metric] = {"camal": result["x_mean"], "camal_ci": result["x_ci"], "vanilla": result["y_mean"],
                       "vanilla_ci": result["y_ci"], "difference": result["difference"],
                       "difference_ci": result["difference_ci"], "poi": result["poi"], "poi_ci": result["poi_ci"],
                       "implementation": result["implementation"], "reps": reps,
                       "per_seed": {"camal": camal[:, 0].tolist(), "vanilla": vanilla[:, 0].tolist()}}
    return out


def paired_fidelity(evaluations: list) -> dict:
    """CAMAL - vanilla deletion / insertion AUC (normalised) on the same pooled frames, over all pairs."""
    out = {}
    for metric in ("deletion_auc_norm", "insertion_auc_norm"):
        differences = []
        for evaluation in evaluations:
            names = {("camal" if any(e["lambda"] for e in evaluation["episodes"] if e["agent"] == n) else "vanilla"): n
                     for n in evaluation["agents"]}
            camal = np.array(evaluation["fidelity"][names["camal"]][metric], dtype=float)
            vanilla = np.array(evaluation["fidelity"][names["vanilla"]][metric], dtype=float)
            keep = np.isfinite(camal) & np.isfinite(vanilla)
            differences.append((camal[keep], vanilla[keep]))
        camal = np.concatenate([d[0] for d in differences])
        vanilla = np.concatenate([d[1] for d in differences])
        out[metric] = {"camal": float(camal.mean()), "vanilla": float(vanilla.mean()),
                       "camal_minus_vanilla": paired_difference(camal, vanilla), "frames": int(len(camal))}
    return out


def ship_pair(folder: Path, runs: dict, comparisons: dict, machine: str, budget, date: str, report: str) -> list:
    target = ROOT / "weights" / "agents"
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for arm in ("vanilla", "camal"):
        source = folder / "weights" / f"dtc-{arm}-s{SHIPPED_SEED}.json"
        card = json.loads(source.read_text())
        run = runs[arm][SHIPPED_SEED]
        name = f"{SCENARIO}-{arm}"
        shutil.copyfile(folder / "weights" / card["weights_file"], target / f"{name}.safetensors")
        returns = np.array(run["episode_returns"], dtype=float)
        ious = np.array([v for v in run["episode_ious"] if v is not None], dtype=float)
        card.update({
            "name": name, "weights_file": f"{name}.safetensors", "trained_as": card["name"],
            "command": TRAIN_COMMAND.format(seed=SHIPPED_SEED, lam=card["lambda"], steps=card["steps"], arm=arm,
                                            budget="" if budget == "?" else f" --budget-s {budget}"),
            "machine": machine, "date": date,
            "held_out": {"episode_seeds": "10000000-10000009 (reset seeds never used in training)",
                         "episodes": run["episodes"], "mean_return": float(returns.mean()),
                         "mean_return_ci95": bootstrap_ci(returns), "mean_iou": float(ious.mean()),
                         "mean_iou_ci95": bootstrap_ci(ious), "deletion_auc_norm": run["deletion"],
                         "insertion_auc_norm": run["insertion"],
                         "note": "intervals over this agent's episodes; the arm comparison over 5 training seeds "
                                 f"is in {report}"},
            "arm_comparison": {k: comparisons[k] for k in ("iou", "return", "deletion")},
        })
        card["history"] = card.get("history", [])[-5:]  # the full training log is in the device run's logs
        (target / f"{name}.json").write_text(json.dumps(rounded(card), indent=2))
        written.append(str(target / f"{name}.json"))
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("source", help="agents-results.tar from device/agents.sh, or its extracted folder")
    # rliable's default is 50,000; 2,000 (the project's default, explainers.statistics) keeps this CPU run in minutes
    parser.add_argument("--reps", type=int, default=2_000)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "agents-defend_the_center.json"))
    parser.add_argument("--no-ship", action="store_true", help="do not write weights/agents/")
    parser.add_argument("--episodes-dir", default=str(ROOT / "bench" / "results" / "agents-eval"),
                        help="where the per-episode records are copied (with the shipped pair)")
    parser.add_argument("--date", default=str(datetime.date.today()), help="when the runs were made")
    args = parser.parse_args(argv)
    folder = extract(Path(args.source))
    evaluations = [json.loads(p.read_text()) for p in sorted(folder.glob("eval-s*.json"))]
    if not evaluations:
        raise SystemExit(f"no eval-s*.json in {args.source}")
    runs = run_scores(evaluations)
    comparisons = arm_comparisons(runs, args.reps)
    machine = (folder / "logs" / "machine.txt").read_text() if (folder / "logs" / "machine.txt").exists() else ""
    cards = {p.stem: json.loads(p.read_text()) for p in (folder / "weights").glob("dtc-*.json")
             if not p.name.endswith(".ckpt.json")}
    budget = next((line.split("budget_s=")[1].split()[0] for line in machine.splitlines() if "budget_s=" in line), "?")
    result = {
        "scenario": SCENARIO, "date": args.date, "machine": machine,
        "split": "held-out episode reset seeds 10000000.. (training used seed*1000+i and the envs' own draws)",
        "commands": {"train": TRAIN_COMMAND.replace("{budget}", ""), "evaluate": EVAL_COMMAND, "run": "WORK=... bash bench/agents_cpu_run.sh"},
        "training": {name: {k: card.get(k) for k in ("lambda", "seed", "steps", "updates", "train_seconds",
                                                     "device")} for name, card in sorted(cards.items())},
        "arms": comparisons, "paired_fidelity_frames": paired_fidelity(evaluations),
        "runs": {arm: {str(seed): {k: v for k, v in run.items() if not k.startswith("episode_")}
                       for seed, run in sorted(seeds.items())} for arm, seeds in runs.items()},
        "per_episode_files": [f"{Path(args.episodes_dir).resolve().relative_to(ROOT)}/{p.name}"
                              for p in sorted(folder.glob("eval-s*.json"))],
    }
    cost = folder / "agents-cost.json"
    if cost.exists():
        result["cost"] = json.loads(cost.read_text())
    if not args.no_ship:
        result["shipped"] = ship_pair(folder, runs, comparisons, machine, budget, args.date,
                                      str(Path(args.out).resolve().relative_to(ROOT)))
        episodes_dir = Path(args.episodes_dir)
        episodes_dir.mkdir(parents=True, exist_ok=True)
        for evaluation, path in zip(evaluations, sorted(folder.glob("eval-s*.json"))):
            (episodes_dir / path.name).write_text(json.dumps(rounded(evaluation)))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rounded(result), indent=2))
    print(json.dumps(rounded({"arms": {k: {kk: vv for kk, vv in v.items() if kk != "per_seed"}
                                       for k, v in comparisons.items() if isinstance(v, dict)},
                              "paired": result["paired_fidelity_frames"]}), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
