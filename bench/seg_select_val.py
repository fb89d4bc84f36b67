"""Choose GradSkip's segmentation options on the val split (never on test): one capture per region, every
variant read from it (`SegGradSkipState.map(...)`), scored by mIoU against the derived masks (the evaluate-seg
protocol: binarised at half the maximum, ignored pixels left out, mean over images per class then classes).

    python bench/seg_select_val.py --data /work/devdata/bccd-seg --out bench/results/seg-gradskip-val.json

Rule fixed before running: the variant with the highest val mIoU becomes the default; ties (within 0.001) go to
the paper's settings (alpha 0.5, "gradient" weighting, the first variant). The IoU here is the primary rule of
evaluate-seg (top-k pixels, k = the class's mask area); the half-maximum rule's figures are kept beside it.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from explainers.atomic import atomic_write_text  # noqa: E402
from explainers.models import load_model  # noqa: E402
from explainers.segmentation.evaluate import _bootstrap, _class_means  # noqa: E402
from explainers.segmentation.methods import SegGradSkip  # noqa: E402
from explainers.segmentation.scoring import binarise, binarise_top, pa_iou  # noqa: E402
from explainers.segmentation.targets import RegionTarget, background_classes  # noqa: E402
from explainers.segmentation.train import load_prepared  # noqa: E402


def variants() -> list:
    grid = [dict(alpha=0.5, attention_weighting=w, key_spread=k, start=s, stage_spread=t)
            for w, k, s, t in itertools.product(("gradient", "attention", "gradient_residual"), ("conv", "even"),
                                                ("decoder", "region"), ("even", "conv"))]
    grid += [dict(alpha=a, attention_weighting="gradient", key_spread="conv", start="decoder", stage_spread="even")
             for a in (0.0, 1.0)]
    return grid


def label(options: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in options.items())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bccd-segformer")
    parser.add_argument("--data", required=True)
    parser.add_argument("--split", default="val", choices=("train", "val"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--time-budget-s", type=float, default=None)
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    bundle = load_model(args.model).to(device)
    images, masks, names = load_prepared(args.data, args.split, "cpu")
    names = names[:args.limit] if args.limit else names
    ignore = int(bundle.card.get("ignore_index", 255))
    records, done, started = [], [], time.perf_counter()
    for index, name in enumerate(names):
        if args.time_budget_s and time.perf_counter() - started > args.time_budget_s:
            break
        image = (images[index:index + 1].float() / 255).to(device)
        with torch.no_grad():
            prediction = bundle(image)[0].argmax(0).cpu()
        valid = masks[index] != ignore
        for class_index, class_name in enumerate(bundle.class_names):
            truth = (masks[index] == class_index) & valid
            region = prediction == class_index
            if class_index in background_classes(bundle) or not region.any() or not truth.any():
                continue
            state = SegGradSkip().prepare(bundle, image, RegionTarget(region[None].to(device), [class_index]))
            for options in variants():
                heat = state.map(**options)[0].cpu()
                top = binarise_top(torch.where(valid, heat, torch.full_like(heat, -1.0))[None], [int(truth.sum())])
                pa, iou = pa_iou(top[0], truth, valid)
                pa_half, iou_half = pa_iou(binarise(heat[None])[0], truth, valid)
                records.append({"image": name, "class": class_name, "method": label(options), "iou": iou, "pa": pa,
                                "iou_half": iou_half, "pa_half": pa_half})
        done.append(name)
        print(f"{index + 1}/{len(names)} {name} ({time.perf_counter() - started:.0f} s)", flush=True)
    results = {}
    for options in variants():
        rows = [r for r in records if r["method"] == label(options)]
        results[label(options)] = {"iou": round(_class_means(rows, "iou", done), 4),
                                   "iou_ci95": _bootstrap(rows, "iou", done, 1000, 0),
                                   "pa": round(_class_means(rows, "pa", done), 4),
                                   "iou_half": round(_class_means(rows, "iou_half", done), 4)}
    paper = label(variants()[0])
    best = max(results, key=lambda k: results[k]["iou"])
    if results[best]["iou"] - results[paper]["iou"] <= 0.001:
        best = paper
    report = {"model": args.model, "split": args.split, "images": done, "device": str(device),
              "rule": "highest val mIoU; ties within 0.001 go to the paper's settings", "chosen": best,
              "variants": results, "records": records}
    atomic_write_text(args.out, json.dumps(report, indent=1))
    print(json.dumps({"chosen": best, "variants": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
