"""A markdown table of an evaluate-seg report (per method: mIoU and PA with intervals, the half-maximum rule,
per class IoU, boxes, curves, seconds), and its paired comparisons.

    python bench/seg_table.py bench/results/seg-eval-test-fast.json
"""
from __future__ import annotations

import json
import sys


def interval(entry: dict, key: str) -> str:
    value, ci = entry.get(key), entry.get(f"{key}_ci95")
    if value is None:
        return "–"
    return f"{value:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def main(path: str) -> int:
    report = json.load(open(path))
    methods = report["methods"]
    classes = sorted({c for entry in methods.values() for c in entry["per_class_iou"]})
    print(f"{report['split']} split, {len(report['images'])} of {report['images_in_split']} smears "
          f"({report['images'][0]} ... {report['images'][-1]}), device {report['device']}\n")
    head = ["method", "mIoU [95% CI]", "PA [95% CI]", "mIoU (half max)", *[f"IoU {c}" for c in classes],
            "box energy", "pointing", "deletion AUC ↓", "insertion AUC ↑", "s / map"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for label, entry in sorted(methods.items(), key=lambda kv: -kv[1].get("iou", 0)):
        cells = [label, interval(entry, "iou"), interval(entry, "pa"), f"{entry.get('iou_half', float('nan')):.3f}",
                 *[f"{entry['per_class_iou'].get(c, float('nan')):.3f}" for c in classes],
                 f"{entry.get('box_energy', float('nan')):.3f}", f"{entry.get('pointing', float('nan')):.3f}",
                 f"{entry['deletion_auc']:.3f}" if "deletion_auc" in entry else "–",
                 f"{entry['insertion_auc']:.3f}" if "insertion_auc" in entry else "–",
                 f"{entry['seconds_per_map']:.2f}"]
        print("| " + " | ".join(cells) + " |")
    print()
    for name, comparison in report["comparisons"].items():
        if isinstance(comparison, dict):
            ci = comparison["ci95"]
            text = f"[{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "(no interval)"
            print(f"- {comparison['first']} − {comparison['second']} ({comparison['key']}, {comparison['images']} "
                  f"smears): {comparison['mean']:+.3f} {text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
