"""Pick CAMAL's lambda from the training runs of bench/agents_lambda_sweep.sh (training seeds only, no held-out
episode), by the rule fixed before the runs:

    among lambda > 0, the highest mean training-frame IoU at the end of training (over the seeds) whose mean final
    return_100 is at least vanilla's minus RETURN_SLACK; if none is, the lambda with the highest return_100.

    python bench/agents_lambda_pick.py /tmp/agents-lambda --out bench/results/agents-lambda-sweep.json
"""
from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

RETURN_SLACK = 0.5


def final_rows(folder: Path) -> dict:
    """{lambda: {seed: last history row with an IoU}} from the sweep's cards."""
    rows = defaultdict(dict)
    for card_path in sorted((folder / "weights").glob("sweep-l*-s*.json")):
        if card_path.name.endswith(".ckpt.json"):
            continue
        match = re.fullmatch(r"sweep-l(.+)-s(\d+)\.json", card_path.name)
        card = json.loads(card_path.read_text())
        measured = [row for row in card.get("history", []) if row.get("iou") is not None]
        if not measured:
            raise SystemExit(f"{card_path}: no IoU in its history")
        last = card["history"][-1]
        rows[float(match.group(1))][int(match.group(2))] = {
            "steps": card["steps"], "return_100": last["return_100"], "iou": measured[-1]["iou"],
            "iou_at_steps": measured[-1]["steps"], "explained_variance": last.get("explained_variance")}
    return dict(rows)


def pick(rows: dict, slack: float = RETURN_SLACK) -> tuple[float, dict]:
    """(chosen lambda, per-lambda means) by the rule in the module's docstring."""
    means = {lam: {"iou": sum(r["iou"] for r in seeds.values()) / len(seeds),
                   "return_100": sum(r["return_100"] for r in seeds.values()) / len(seeds),
                   "seeds": sorted(seeds)} for lam, seeds in sorted(rows.items())}
    if 0.0 not in means:
        raise SystemExit("the sweep has no vanilla run (lambda 0)")
    floor = means[0.0]["return_100"] - slack
    allowed = [lam for lam in means if lam > 0 and means[lam]["return_100"] >= floor]
    if allowed:
        return max(allowed, key=lambda lam: (means[lam]["iou"], -lam)), means
    return max((lam for lam in means if lam > 0), key=lambda lam: means[lam]["return_100"]), means


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    rows = final_rows(folder)
    chosen, means = pick(rows)
    machine = folder / "logs" / "machine.txt"
    result = {"rule": __doc__.split("\n\n")[1].strip(), "return_slack": RETURN_SLACK, "chosen_lambda": chosen,
              "means": {str(k): v for k, v in means.items()},
              "runs": {str(k): {str(s): r for s, r in v.items()} for k, v in rows.items()},
              "machine": machine.read_text() if machine.exists() else "",
              "command": "WORK=/tmp/agents-lambda bash bench/agents_lambda_sweep.sh"}
    Path(args.out).write_text(json.dumps(result, indent=2))
    for lam, mean in means.items():
        print(f"lambda {lam:g}: IoU {mean['iou']:.3f}, return_100 {mean['return_100']:.2f} (seeds {mean['seeds']})")
    print(f"chosen: lambda {chosen:g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
