"""Paired comparisons and rankings from `python -m explainers evaluate --out` reports (issue #14).

    python bench/compare_reports.py bench/results/evaluate-bloodmnist-vit-mean-100x10.json \
        bench/results/evaluate-bloodmnist-vit-road-100x10.json --pairs aha,rollout gradskip,rollout

For each report: the methods ranked by deletion (lower better), insertion and ins-del (higher better),
with 95% bootstrap intervals, and the paired bootstrap interval (`explainers.statistics.paired_difference`)
of each requested pair on the same images. With two reports on the same files (e.g. the mean-colour and the
ROAD reference), whether the rankings agree, and the per-method Spearman correlation of the per-image scores.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from explainers.statistics import compare_methods, format_comparison, format_interval  # noqa: E402

KEYS = (("deletion_auc", "deletion_ci95", False), ("insertion_auc", "insertion_ci95", True),
        ("ins_minus_del", "ins_minus_del_ci95", True))


def ranking(report: dict, key: str, higher: bool) -> list:
    methods = report["methods"]
    return sorted(methods, key=lambda m: -methods[m][key] if higher else methods[m][key])


def rank_correlation(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+")
    parser.add_argument("--pairs", nargs="*", default=[], metavar="A,B")
    args = parser.parse_args(argv)
    reports = [json.loads(Path(path).read_text()) for path in args.reports]
    for path, report in zip(args.reports, reports):
        print(f"== {path}: {report['model']}, {report['n_images']} images, reference "
              f"{report['protocol']['reference']}, {report['protocol']['steps']} steps")
        for key, ci, higher in KEYS:
            order = ranking(report, key, higher)
            print(f"  {key:<14} " + " > ".join(f"{m} {format_interval(report['methods'][m][key], report['methods'][m][ci], 3)}"
                                             for m in order))
        for pair in args.pairs:
            first, second = pair.split(",")
            print(format_comparison(compare_methods(report, first, second)))
    if len(reports) == 2:
        a, b = reports
        if a["files"] != b["files"]:
            print("the two reports scored different images: no per-image comparison")
            return 0
        print(f"== {a['protocol']['reference']} vs {b['protocol']['reference']} on the same images")
        for key, _, higher in KEYS:
            same = ranking(a, key, higher) == ranking(b, key, higher)
            print(f"  {key:<14} ranking {'the same' if same else 'changes'}")
        for method in a["methods"]:
            if method in b["methods"]:
                da, db = (np.asarray(r["methods"][method]["per_image"]["deletion"]) for r in (a, b))
                print(f"  {method:<10} per-image deletion Spearman {rank_correlation(da, db):.3f}; ms/image "
                      f"(maps only) {a['methods'][method]['ms_per_image']:.1f} / {b['methods'][method]['ms_per_image']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
