"""`python -m explainers evaluate-seg`: explain a segmentation model's regions on a held-out split and score the
maps.

For every image of the split and every object class c (not the background) that the model predicts there and
the derived mask contains, the target is c over its predicted region (`RegionTarget`), and each method draws a
map. Scores per (image, class, method) record:
- PA and IoU of the binarised map against the class's derived mask (ignored pixels left out): primary, its
  pixels above its mean (`checks.mean_threshold`, Chefer et al.'s rule, fixed in advance: never k = the mask's
  area, which hands a map the answer's size); secondary, the pixels at least half its maximum
  (`scoring.binarise`); and against the predicted region (above the mean);
- against the human boxes: the map's energy inside the class's boxes and the pointing game (its maximum within
  15 px at 224 px, scaled, of a box);
- deletion and insertion AUC of the region score in probability form (K = 20 steps, the mean-colour reference);
- the seconds the map took.
PA and mIoU: the mean over images per class, then over classes. Intervals: 95% percentile bootstrap over images
(2,000 draws, seed 0: the per-class-then-classes mean recomputed on each resample); the paired comparison of two
methods resamples the same images for both. Slow methods can be limited to the first N images (`--slow-limit`):
the report names the images each method saw, and a paired comparison uses the images both saw.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from ..atomic import atomic_write_text
from ..engine import explain_batch
from ..statistics import N_RESAMPLES
from .checks import mean_threshold
from .scoring import BINARY_THRESHOLD, binarise, box_energy, box_mask, pa_iou, region_curves

DEFAULT_METHODS = "gradskip,gradcam,gradrollout,rollout,occlusion,rise,aha,random"
SLOW = ("occlusion", "rise", "aha")


def add_evaluate_arguments(parser) -> None:
    parser.add_argument("--model", default="bccd-segformer")
    parser.add_argument("--data", required=True, help="a prepared folder (images/, masks/, boxes.json, splits.json)")
    parser.add_argument("--split", default="test", choices=("train", "val", "test"))
    parser.add_argument("--methods", default=DEFAULT_METHODS,
                        help="comma-separated; options as name:key=value (e.g. gradskip:alpha=0.3)")
    parser.add_argument("--out", required=True, help="the report (JSON with per-image records)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N images of the split")
    parser.add_argument("--slow-limit", type=int, default=None,
                        help="occlusion, RISE and AHA on the first N images only")
    parser.add_argument("--curve-steps", type=int, default=20, help="deletion/insertion steps K (0: no curves)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--bootstrap", type=int, default=N_RESAMPLES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-budget-s", type=float, default=None,
                        help="stop taking new images after this many seconds (the report names the images done)")


def _labelled(name: str, options: dict) -> str:
    return name if not options else name + ":" + ",".join(f"{k}={v}" for k, v in sorted(options.items()))


def run_evaluation(args) -> dict:
    from ..methods import parse_method_spec, split_method_specs
    from ..models import load_model
    from .methods import get_segmentation_method
    from .targets import RegionTarget, background_classes
    from .train import load_prepared

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    bundle = load_model(args.model).to(device)
    specs = [parse_method_spec(spec)[:2] for spec in split_method_specs(args.methods)]
    methods = [(_labelled(name, options), name, get_segmentation_method(name, bundle, **options))
               for name, options in specs]
    folder = Path(args.data)
    images, masks, names = load_prepared(folder, args.split, "cpu")
    if args.limit:
        images, masks, names = images[:args.limit], masks[:args.limit], names[:args.limit]
    boxes = json.loads((folder / "boxes.json").read_text())
    ignore = int(bundle.card.get("ignore_index", 255))
    skipped = {i for i in background_classes(bundle)}
    records, missing, done = [], [], []
    started = time.perf_counter()
    for index, name in enumerate(names):
        if args.time_budget_s is not None and time.perf_counter() - started > args.time_budget_s:
            break
        image = (images[index:index + 1].float() / 255).to(device)
        mask = masks[index]
        with torch.no_grad():
            prediction = bundle(image)[0].argmax(dim=0).cpu()
        valid = mask != ignore
        for class_index, class_name in enumerate(bundle.class_names):
            if class_index in skipped:
                continue
            region = prediction == class_index
            truth = (mask == class_index) & valid
            if not bool(region.any()) or not bool(truth.any()):
                if bool(region.any()) != bool(truth.any()):
                    missing.append({"image": name, "class": class_name, "predicted_pixels": int(region.sum()),
                                    "mask_pixels": int(truth.sum())})
                continue
            target = RegionTarget(region.unsqueeze(0).to(device), [class_index])
            records.extend(_score_region(bundle, methods, image, target, name, class_name, index, args, truth,
                                         valid, region, boxes.get(name, [])))
        done.append(name)
        print(f"{index + 1}/{len(names)} {name} ({time.perf_counter() - started:.0f} s)", flush=True)
    report = summarise(records, [label for label, _, _ in methods], n_resamples=args.bootstrap, seed=args.seed)
    report.update({
        "model": args.model, "model_card_test": bundle.card.get("test"), "split": args.split,
        "data": str(folder), "images": done, "images_in_split": len(names), "device": str(device),
        "protocol": {"target": "each object class over its predicted region; score = mean class logit there",
                     "binarisation": "primary (iou, pa): the map's pixels above its mean (fixed in advance); "
                                     f"secondary (iou_half, pa_half): map >= {BINARY_THRESHOLD} x its maximum; "
                                     "against the predicted region: above the mean",
                     "pa_iou": "against the class's derived mask, ignored pixels left out; mean over images per "
                               "class, then over classes",
                     "boxes": "energy inside the class's human boxes; pointing game with 15 px at 224 px, scaled",
                     "curves": f"region score's mean class probability, K = {args.curve_steps}, mean-colour reference",
                     "slow_limit": args.slow_limit, "interval": "95% percentile bootstrap over images"},
        "regions_without_match": missing, "records": records,
    })
    atomic_write_text(args.out, json.dumps(report, indent=1))
    return report


def _score_region(bundle, methods, image, target, name, class_name, index, args, truth, valid, region, boxes):
    from ..metrics import pointing_game

    rows, maps, labels = [], [], []
    box = box_mask(boxes, class_name, tuple(truth.shape))
    for label, method_name, method in methods:
        if method_name in SLOW and args.slow_limit is not None and index >= args.slow_limit:
            continue
        if bundle.device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        found = explain_batch(bundle, method, image, target).maps.float()  # the one run path: lock, seed, checks
        if bundle.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        heat = found[0].cpu()
        half = binarise(heat[None])[0]
        above_mean = mean_threshold(heat[None])[0]  # fixed in advance: never as many pixels as the mask has
        pa, iou = pa_iou(above_mean, truth, valid)
        pa_half, iou_half = pa_iou(half, truth, valid)
        pa_region, iou_region = pa_iou(above_mean, region)
        row = {"image": name, "class": class_name, "method": label, "pa": pa, "iou": iou, "pa_half": pa_half,
               "iou_half": iou_half, "pa_predicted": pa_region, "iou_predicted": iou_region,
               "seconds": round(seconds, 4),
               "region_pixels": int(region.sum()), "mask_pixels": int(truth.sum())}
        if bool(box.any()):
            row["box_energy"] = box_energy(heat, box)
            row["pointing"] = float(pointing_game(heat[None], box[None])[0])
        rows.append(row)
        maps.append(found[0])
        labels.append(label)
    if args.curve_steps and maps:
        curves = region_curves(bundle, image, torch.stack(maps), target, steps=args.curve_steps)
        for row, deletion, insertion in zip(rows, curves.deletion_auc, curves.insertion_auc):
            row["deletion_auc"], row["insertion_auc"] = float(deletion), float(insertion)
    return rows


def _class_means(records: list, key: str, images: list) -> float:
    """Mean over images per class, then over classes, of `key` on the given images (repeats count)."""
    per_class = {}
    for row in records:
        value = row.get(key)
        if value is None or not np.isfinite(value):
            continue
        per_class.setdefault(row["class"], {}).setdefault(row["image"], value)
    means = []
    for values in per_class.values():
        picked = [values[name] for name in images if name in values]
        if picked:
            means.append(float(np.mean(picked)))
    return float(np.mean(means)) if means else float("nan")


def _bootstrap(records: list, key: str, images: list, n_resamples: int, seed: int, other: list | None = None):
    """Percentile interval of the class-mean of `key` (or of its difference with `other`'s) over image resamples."""
    if len(images) < 2:
        return None
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n_resamples):
        sample = [images[i] for i in rng.integers(0, len(images), len(images))]
        value = _class_means(records, key, sample)
        if other is not None:
            value -= _class_means(other, key, sample)
        draws.append(value)
    draws = np.asarray(draws)
    draws = draws[np.isfinite(draws)]
    if not len(draws):
        return None
    low, high = np.percentile(draws, [2.5, 97.5])
    return [float(low), float(high)]


def summarise(records: list, labels: list, *, n_resamples: int = N_RESAMPLES, seed: int = 0) -> dict:
    """Per method: PA, mIoU (with intervals), per class IoU, box energy, pointing, curves, seconds; and the paired
    comparison of GradSkip with the best other method on mIoU and PA."""
    methods = {}
    for label in labels:
        rows = [row for row in records if row["method"] == label]
        images = sorted({row["image"] for row in rows})
        if not rows:
            continue
        entry = {"regions": len(rows), "images": len(images)}
        for key in ("iou", "pa", "iou_half", "pa_half", "iou_predicted", "pa_predicted", "box_energy", "pointing",
                    "deletion_auc", "insertion_auc"):
            value = _class_means(rows, key, images)
            if np.isfinite(value):
                entry[key] = round(value, 4)
                entry[f"{key}_ci95"] = _bootstrap(rows, key, images, n_resamples, seed)
        entry["per_class_iou"] = {name: round(float(np.nanmean([r["iou"] for r in rows if r["class"] == name])), 4)
                                  for name in sorted({r["class"] for r in rows})}
        entry["seconds_per_map"] = round(float(np.median([r["seconds"] for r in rows])), 4)
        methods[label] = entry
    comparisons = {}
    leader = next((label for label in labels if label.split(":")[0] == "gradskip"), None)
    others = [label for label in labels if label != leader and label in methods]
    if leader in methods and others:
        best = max(others, key=lambda label: methods[label].get("iou", -1))
        for key in ("iou", "pa", "iou_half"):
            comparisons[f"gradskip_minus_best_{key}"] = _paired(records, leader, best, key, n_resamples, seed)
        comparisons["best_baseline_by_iou"] = best
        for label in others:
            comparisons[f"gradskip_minus_{label}_iou"] = _paired(records, leader, label, "iou", n_resamples, seed)
    summary = {label: {k: entry.get(k) for k in ("iou", "iou_ci95", "pa", "pa_ci95", "iou_half", "pa_half",
                                                   "box_energy", "pointing",
                                                   "deletion_auc", "insertion_auc", "seconds_per_map", "images")}
               for label, entry in methods.items()}
    return {"methods": methods, "comparisons": comparisons, "summary": {"methods": summary,
                                                                       "comparisons": comparisons}}


def _paired(records, first, second, key, n_resamples, seed) -> dict:
    rows_a = [r for r in records if r["method"] == first]
    rows_b = [r for r in records if r["method"] == second]
    shared = sorted({r["image"] for r in rows_a} & {r["image"] for r in rows_b})
    difference = _class_means(rows_a, key, shared) - _class_means(rows_b, key, shared)
    interval = _bootstrap(rows_a, key, shared, n_resamples, seed, other=rows_b)
    return {"first": first, "second": second, "key": key, "images": len(shared), "mean": round(difference, 4),
            "ci95": interval, "above_zero": interval is not None and interval[0] > 0}
