"""A CAMAL variant's runs beside the comparison's (bench/agents_comparison.py), e.g. `--camal-norm-every 8`.

    PYTHONPATH=. python bench/agents_variant_results.py --variant-work WORK_NE8 --variant camal-ne8 \
        --work WORK --out bench/results/agents-camal-norm-every-8.json

The variant's runs (VARIANT-sSEED in `--variant-work`, each evaluated by the comparison's own evaluation on its 100
held-out episodes, sampled and greedy) are scored as the comparison scores its runs. Per seed, its return and
V(s)-CAM IoU paired over those episodes against the comparison's camal-sSEED and vanilla-sSEED (the same training
seed, the same episodes; the interval is over episodes, not seeds). Over the seeds that all three have, the variant
minus each arm as the comparison compares its arms (rliable's definitions: intervals over seeds, which mean little
under three seeds). A `.md` table beside the `.json`.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from bench.agents_comparison_results import _seed_scores, evaluated_runs
from explainers.agents.stats import compare_arms
from explainers.statistics import paired_difference, rounded

ARMS = ("camal", "vanilla")
METRICS = ("return", "return_greedy", "iou", "counterfactual_gap")


def episodes(work: Path, name: str) -> list:
    return json.loads((work / "eval" / f"{name}.json").read_text())["episodes"]


def paired_over_episodes(mine: list, theirs: list) -> dict:
    """Return and IoU differences over the same episodes (matched by reset seed)."""
    by_seed = {episode["seed"]: episode for episode in theirs}
    pairs = [(episode, by_seed[episode["seed"]]) for episode in mine if episode["seed"] in by_seed]
    iou_pairs = [(a["iou"], b["iou"]) for a, b in pairs if a["iou"] is not None and b["iou"] is not None]
    result = {"episodes": len(pairs),
              "return": paired_difference([a["return"] for a, _ in pairs], [b["return"] for _, b in pairs])}
    if iou_pairs:
        result["iou"] = paired_difference(*zip(*iou_pairs))
    return rounded(result)


def variant_results(variant_work: Path, variant: str, work: Path) -> dict:
    runs = [name for name in evaluated_runs(variant_work) if name.rsplit("-s", 1)[0] == variant]
    seeds = sorted(int(name.rsplit("-s", 1)[1]) for name in runs)
    compared = set(evaluated_runs(work))
    per_seed = {}
    for seed in seeds:
        name = f"{variant}-s{seed}"
        scores = _seed_scores(variant_work, name)
        scores["paired_over_episodes"] = {
            f"{arm}-s{seed}": paired_over_episodes(episodes(variant_work, name), episodes(work, f"{arm}-s{seed}"))
            for arm in ARMS if f"{arm}-s{seed}" in compared}
        per_seed[seed] = scores
    over_seeds = {}
    for arm in ARMS:
        shared = [seed for seed in seeds if f"{arm}-s{seed}" in compared]
        if len(shared) >= 2:
            theirs = {seed: _seed_scores(work, f"{arm}-s{seed}") for seed in shared}
            over_seeds[arm] = {"seeds": shared, **{metric: compare_arms([per_seed[s][metric] for s in shared],
                                                                        [theirs[s][metric] for s in shared])
                                                   for metric in METRICS}}
    camal_runs = [(per_seed[s]["iou"], per_seed[s]["return"]) for s in seeds]
    camal_runs += [(scores["iou"], scores["return"]) for scores in
                   (_seed_scores(work, name) for name in sorted(compared) if name.rsplit("-s", 1)[0] == "camal")]
    return {"variant": variant, "seeds": seeds, "per_seed": per_seed, "variant_minus_arm_over_seeds": over_seeds,
            "iou_and_return": association(camal_runs),
            "caution": "intervals per seed are over episodes; over seeds they need more seeds than these to mean much"}


def association(runs: list) -> dict:
    """Across the CAMAL runs of both updates (one (IoU, return) pair per run): Spearman's rho and its two-sided
    p-value, whether a run whose V(s)-CAM sits more inside the masks plays better or worse. Runs, not a cause."""
    from scipy.stats import spearmanr

    if len(runs) < 3:
        return {"runs": len(runs), "spearman": None, "p": None}
    rho, p = spearmanr([iou for iou, _ in runs], [ret for _, ret in runs])
    return {"runs": len(runs), "spearman": float(rho), "p": float(p)}


def markdown(result: dict) -> str:
    def pm(d):
        return f"{d['mean']:+.2f} [{d['ci95'][0]:+.2f}, {d['ci95'][1]:+.2f}]"

    lines = [f"{result['variant']}: {len(result['seeds'])} training seed(s); the comparison's 100 held-out episodes.",
             "", "| seed | return sampled | greedy | IoU | counterfactual gap | explained variance (end) | "
                 "return minus camal (paired episodes) | minus vanilla | IoU minus camal | minus vanilla |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for seed, scores in sorted(result["per_seed"].items()):
        paired = scores["paired_over_episodes"]
        cells = [pm(paired[f"{arm}-s{seed}"][key]) if f"{arm}-s{seed}" in paired else "-"
                 for key in ("return", "iou") for arm in ARMS]
        lines.append(f"| {seed} | {scores['return']:.2f} | {scores['return_greedy']:.2f} | {scores['iou']:.3f} | "
                     f"{scores['counterfactual_gap']:+.3f} | {scores['explained_variance_end']:.2f} | "
                     + " | ".join(cells) + " |")
    for arm, comparison in result["variant_minus_arm_over_seeds"].items():
        lines += ["", f"Over seeds {comparison['seeds']}, {result['variant']} minus {arm} (rliable's definitions):", ""]
        for metric in METRICS:
            c = comparison[metric]
            lines.append(f"- {metric}: {c['difference']:+.3f} [{c['difference_ci'][0]:+.3f}, "
                         f"{c['difference_ci'][1]:+.3f}], probability of improvement {c['poi']:.2f}")
    link = result.get("iou_and_return") or {}
    if link.get("spearman") is not None:
        lines += ["", f"Across the {link['runs']} CAMAL runs of both updates (the variant's and the comparison's "
                      f"camal arm), held-out IoU against return: Spearman {link['spearman']:+.2f} (p {link['p']:.3f})."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant-work", required=True, help="the folder of the variant's runs and evaluations")
    parser.add_argument("--variant", required=True, help="the runs' name before -sSEED")
    parser.add_argument("--work", required=True, help="the comparison's folder")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    result = variant_results(Path(args.variant_work), args.variant, Path(args.work))
    out = Path(args.out)
    out.write_text(json.dumps(rounded(result), indent=1))
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
