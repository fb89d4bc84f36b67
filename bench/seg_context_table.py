"""The table of bench/seg_context_eval.py's records: per row (method, answer row, order), the mean over images of
each score (an image's regions averaged first) with its 95% bootstrap interval, and GradSkip minus each row
paired over the same images.

    PYTHONPATH=. python bench/seg_context_table.py bench/results/seg-context-test.jsonl \
        --out bench/results/seg-context-test.md

`--versus OTHER`: a second file of the same regions with GradSkip under other options (`--gradskip-options`):
the table ends with this file's GradSkip minus OTHER's, paired over smears.
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from explainers.atomic import atomic_write_text
from explainers.statistics import bootstrap_ci, paired_difference

COLUMNS = (("out_mean", "out-of-region deletion, mean ref. ↓"), ("out_blur", "out-of-region deletion, blur ref. ↓"),
           ("in_mean", "in-region deletion ↓"), ("mass_outside", "mass outside"), ("iou", "IoU (above mean)"),
           ("pa", "PA (above mean)"))
FIRST = "gradskip"


def per_image(records: list, row: str, key: str) -> dict:
    """{image: mean of `key` over its regions} for one row (regions without the value left out)."""
    values = {}
    for record in records:
        value = record["rows"].get(row, {}).get(key)
        if value is not None and np.isfinite(value):
            values.setdefault(record["image"], []).append(value)
    return {image: float(np.mean(v)) for image, v in values.items()}


def cell(values: dict) -> str:
    if not values:
        return "–"
    numbers = list(values.values())
    interval = bootstrap_ci(numbers)
    return f"{np.mean(numbers):.3f}" + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")


def paired(records: list, row: str, key: str, other_records: list | None = None) -> str:
    first, other = per_image(records, FIRST, key), per_image(other_records or records, row, key)
    shared = sorted(set(first) & set(other))
    if (row == FIRST and other_records is None) or len(shared) < 2:
        return "–"
    result = paired_difference([first[i] for i in shared], [other[i] for i in shared])
    low, high = result["ci95"]
    return f"{result['mean']:+.3f} [{low:+.3f}, {high:+.3f}]"


def randomisation_rows(records: list) -> list:
    lines = ["| method | Spearman, decode head random | Spearman outside the region | IoU (above mean) |",
             "|---|---|---|---|"]
    for method in records[0]["randomisation"]:
        cells = []
        for key in ("spearman", "spearman_outside", "iou"):
            values = {}
            for record in records:
                values.setdefault(record["image"], []).append(record["randomisation"][method][key])
            cells.append(cell({k: float(np.mean(v)) for k, v in values.items()}))
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records")
    parser.add_argument("--out", default=None)
    parser.add_argument("--versus", default=None, metavar="OTHER",
                        help="the same regions with GradSkip under other options: this GradSkip minus that one")
    args = parser.parse_args()
    records = [json.loads(line) for line in open(args.records) if line.strip()]
    images = sorted({r["image"] for r in records})
    classes = sorted({r["class"] for r in records})
    rows = list(records[0]["rows"])
    lines = [f"{len(records)} regions ({', '.join(classes)}) on {len(images)} smears ({images[0]} ... {images[-1]}); "
             f"{records[0]['steps']} deletion steps; GradSkip options {json.dumps(records[0]['gradskip_options'])}. "
             "Mean over smears (a smear's regions averaged first) [95% bootstrap interval over smears].", "",
             "| row | " + " | ".join(title for _, title in COLUMNS) + " |", "|---|" + "---|" * len(COLUMNS)]
    for row in rows:
        lines.append(f"| {row} | " + " | ".join(cell(per_image(records, row, key)) for key, _ in COLUMNS) + " |")
    lines += ["", "GradSkip minus each row, paired over smears (negative = GradSkip lower):", "",
              "| row | " + " | ".join(title for _, title in COLUMNS[:3]) + " |", "|---|---|---|---|"]
    for row in rows:
        if row != FIRST:
            lines.append(f"| {row} | " + " | ".join(paired(records, row, key) for key, _ in COLUMNS[:3]) + " |")
    model_iou = {}
    for record in records:
        model_iou.setdefault(record["image"], []).append(record["model_iou"])
    lines += ["", f"The model's own IoU with the derived masks on these regions: "
              f"{cell({k: float(np.mean(v)) for k, v in model_iou.items()})}.", "",
              "Cascading randomisation, first step (decode head re-initialised), map vs the trained model's map:", ""]
    lines += randomisation_rows(records)
    seconds = {m: np.median([r["seconds"][m] for r in records]) for m in records[0]["seconds"]}
    lines += ["", "Median seconds per map (this CPU, shared): " + ", ".join(f"{m} {s:.2f}" for m, s in seconds.items())]
    if args.versus:
        others = [json.loads(line) for line in open(args.versus) if line.strip()]
        keys = ("out_mean", "out_blur", "in_mean")
        lines += ["", f"GradSkip ({json.dumps(records[0]['gradskip_options'])}) minus GradSkip "
                  f"({json.dumps(others[0]['gradskip_options'])}) of {args.versus}, paired over smears:", "",
                  "| " + " | ".join(title for key, title in COLUMNS if key in keys) + " | Spearman, decode head random "
                  "(this file) |", "|---|---|---|---|",
                  "| " + " | ".join(paired(records, FIRST, key, others) for key in keys) + " | "
                  + cell({image: float(np.mean([r["randomisation"][FIRST]["spearman"] for r in records
                                                if r["image"] == image])) for image in images}) + " |"]
    text = "\n".join(lines) + "\n"
    if args.out:
        atomic_write_text(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
