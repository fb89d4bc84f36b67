"""Compare two arms of agents evaluated in separate `evaluate-agent` files (the arms' episodes on the same held-out
seeds, one file per agent or per pair): per training seed the mean IoU, return and V(s) deletion / insertion AUC,
then the arms' stratified bootstrap intervals, their difference and the probability of improvement (rliable).

Used where one arm was retrained after a change that leaves the other arm's training untouched (a vanilla agent
never reads the CAMAL term), so the other arm's earlier evaluation still stands:

    python bench/agents_compare_runs.py --camal /tmp/agents-grid/eval-camal-s*.json \
        --vanilla bench/results/agents-eval/eval-s*.json --out bench/results/agents-camal-grid-term-20k.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from agents_results import arm_comparisons, run_scores  # beside this script
from explainers.statistics import rounded


def arm_runs(files: list, arm: str) -> dict:
    """{train_seed: scores} of the agents of `arm` ("camal": lambda > 0) in the files."""
    runs = run_scores([json.loads(Path(f).read_text()) for f in files])
    if not runs[arm]:
        raise SystemExit(f"no {arm} agent in {', '.join(map(str, files))}")
    return runs[arm]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--camal", nargs="+", required=True)
    parser.add_argument("--vanilla", nargs="+", required=True)
    parser.add_argument("--reps", type=int, default=2_000)
    parser.add_argument("--note", default="")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    runs = {"camal": arm_runs(args.camal, "camal"), "vanilla": arm_runs(args.vanilla, "vanilla")}
    result = {"note": args.note, "camal_files": args.camal, "vanilla_files": args.vanilla,
              "arms": arm_comparisons(runs, args.reps),
              "runs": {arm: {str(s): {k: v for k, v in run.items() if not k.startswith("episode_")}
                             for s, run in sorted(seeds.items())} for arm, seeds in runs.items()}}
    Path(args.out).write_text(json.dumps(rounded(result), indent=2))
    for metric in ("iou", "return", "deletion", "insertion"):
        m = result["arms"][metric]
        print(f"{metric}: camal {m['camal']:.3f} {m['camal_ci']} vanilla {m['vanilla']:.3f} {m['vanilla_ci']} "
              f"diff {m['difference']:+.3f} {m['difference_ci']} POI {m['poi']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
