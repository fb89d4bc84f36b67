"""The held-out table of scores a copy of the region cannot win (explainers/segmentation/context.py), one JSON line
per region, resumable (a rerun skips the regions already in --out) and time-budgeted.

    PYTHONPATH=. python bench/seg_context_eval.py --data PREPARED --split test --classes WBC Platelets \
        --out bench/results/seg-context-test.jsonl --time-budget-s 2400

`--methods M --add-to STORED` adds the rows of M to a stored file's regions (their answer rows and orders are
not recomputed).

Smears: the split's smears in name order, less the five test smears that repeat a train or val field of view
(`--twins` scores only those, to report them apart). Per smear and class (predicted, and in the derived mask), the
target is the class over its predicted region. Rows:
- methods: GradSkip (the options chosen on val), gradient rollout, attention rollout, Seg-Grad-CAM;
- answer rows: the predicted region blurred (Gaussian, sigma 2 px), the class probability map, and GradSkip on
  the model with every weight re-initialised;
- orders that need no map: random, nearest-first (out of the region), centre-first (in it); the class probability
  order is the confidence order.
Per row: out-of-region deletion AUC under the mean and blur references, in-region deletion AUC (mean reference),
the map's mass outside the dilated region (and where), PA / IoU of the above-mean pixels against the class's
derived mask, and for the methods the Spearman and IoU with their map on the model whose decode head is
re-initialised (the first cascade step), over the whole map and outside the dilated region. Also the model's own
IoU for the class on the smear.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


from explainers.metrics import spearman
from explainers.models import load_model
from explainers.segmentation import context
from explainers.segmentation.checks import compare_maps, randomised_bundles
from explainers.segmentation.cue import TWIN_SMEARS
from explainers.segmentation.methods import explain_region, get_segmentation_method
from explainers.segmentation.scoring import pa_iou
from explainers.segmentation.targets import RegionTarget, background_classes
from explainers.segmentation.train import load_prepared

METHODS = ("gradskip", "gradrollout", "rollout", "gradcam")


def answer_maps(bundle, random_model, image, target, region, class_index, gradskip_options) -> dict:
    with torch.no_grad():
        probability = bundle(image).softmax(dim=1)[0, class_index]
    blurred = context.region_copy(region)
    randomised = explain_region(random_model, image, target, "gradskip", **gradskip_options).maps[0]
    return {"region blurred": blurred, "class probability": probability, "GradSkip, random model": randomised}


def score_region(bundle, random_head, random_model, image, truth, valid, prediction, class_index, args,
                 methods=METHODS, answers: bool = True) -> dict:
    """`answers`: False for a method's rows added to a stored record (`--add-to`: its answer rows and orders
    are already there)."""
    region = prediction == class_index
    target = RegionTarget(region[None], [class_index])
    grown = context.dilate(region)
    outside = ~grown
    maps, seconds, randomisation = {}, {}, {}
    for name in methods:
        method = get_segmentation_method(name, bundle, **(args.gradskip if name == "gradskip" else {}))
        batch = explain_region(bundle, image, target, method)
        maps[name], seconds[name] = batch.maps[0], batch.seconds
        other = explain_region(random_head, image, target, method).maps[0]
        randomisation[name] = {**compare_maps(maps[name], other),
                               "spearman_outside": spearman(maps[name][outside], other[outside])}
    if answers:
        maps.update(answer_maps(bundle, random_model, image, target, region, class_index, args.gradskip))
    out_orders = {name: context.order_by_values(heat, outside) for name, heat in maps.items()}
    in_orders = {name: context.order_by_values(heat, region) for name, heat in maps.items()}
    if answers:
        out_orders["random order"] = context.random_order(outside)
        out_orders["nearest first"] = context.nearest_first_order(region, outside)
        in_orders["random order"] = context.random_order(region)
        in_orders["centre first"] = context.centre_first_order(region)
    curves = {reference: context.deletion_curves(bundle, image, target, out_orders, steps=args.steps,
                                                 reference=reference) for reference in context.REFERENCES}
    inside = context.deletion_curves(bundle, image, target, in_orders, steps=args.steps)
    background = background_classes(bundle)
    rows = {}
    for name in out_orders:
        row = {f"out_{reference}": context.curve_auc(curves[reference][name]) for reference in context.REFERENCES}
        row["in_mean"] = context.curve_auc(inside[name]) if name in inside else None
        if name in maps:
            row.update({f"mass_{k}": v for k, v in context.mass_outside(maps[name], grown, prediction, class_index,
                                                                        background).items()})
            row["pa"], row["iou"] = context.fixed_pa_iou(maps[name], truth, valid)
        rows[name] = row
    if answers:
        rows["centre first"] = {"in_mean": context.curve_auc(inside["centre first"])}
    _, model_iou = pa_iou(region, truth, valid)
    return {"rows": rows, "randomisation": randomisation, "seconds": seconds, "model_iou": model_iou,
            "start_probability": float(next(iter(curves["mean"].values()))[0]), "region_pixels": int(region.sum())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bccd-segformer")
    parser.add_argument("--data", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--classes", nargs="+", default=["RBC", "WBC", "Platelets"])
    parser.add_argument("--twins", action="store_true", help="score only the twin smears")
    parser.add_argument("--gradskip-options", default="{}", help="JSON: the options chosen on val")
    parser.add_argument("--steps", type=int, default=context.STEPS)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--out", required=True)
    parser.add_argument("--time-budget-s", type=float, default=None)
    parser.add_argument("--methods", nargs="+", default=None, help="these methods' rows only (default: METHODS)")
    parser.add_argument("--with-answers", action="store_true",
                        help="with --add-to: make the answer rows again too (after GradSkip's default changed: "
                             "its random-model row)")
    parser.add_argument("--add-to", default=None, metavar="STORED",
                        help="a stored results file: its regions' records with --methods' rows added, to --out")
    args = parser.parse_args()
    args.gradskip = json.loads(args.gradskip_options)
    torch.set_num_threads(1)
    bundle = load_model(args.model)
    _, random_head = next(randomised_bundles(bundle, steps=1))
    *_, (_, random_model) = randomised_bundles(bundle)
    images, masks, names = load_prepared(args.data, args.split, "cpu")
    order = sorted((i for i in range(len(names)) if (names[i] in TWIN_SMEARS) == args.twins), key=lambda i: names[i])
    order = order[:args.limit] if args.limit else order
    stored = {(r["image"], r["class"]): r for r in map(json.loads, Path(args.add_to).read_text().splitlines())} \
        if args.add_to else None
    out = Path(args.out)
    done = {(r["image"], r["class"]) for r in map(json.loads, out.read_text().splitlines())} if out.exists() else set()
    started = time.perf_counter()
    for index in order:
        image = images[index:index + 1].float() / 255
        with torch.no_grad():
            prediction = bundle(image)[0].argmax(0)
        valid = masks[index] != int(bundle.card.get("ignore_index", 255))
        for class_name in args.classes:
            class_index = bundle.class_names.index(class_name)
            if (names[index], class_name) in done or not (prediction == class_index).any() \
                    or not (masks[index] == class_index).any() \
                    or (stored is not None and (names[index], class_name) not in stored):
                continue
            if args.time_budget_s and time.perf_counter() - started > args.time_budget_s:
                print("time budget spent", flush=True)
                return 0
            truth = (masks[index] == class_index) & valid
            record = score_region(bundle, random_head, random_model, image, truth, valid, prediction, class_index,
                                  args, **({"methods": tuple(args.methods)} if args.methods else {}),
                                  answers=stored is None or args.with_answers)
            if stored is not None:  # the stored record with the new methods' rows added (the same region's maps)
                old = stored[(names[index], class_name)]
                record = {**old, **{key: {**old[key], **record[key]} for key in ("rows", "randomisation", "seconds")}}
            record.update(image=names[index], **{"class": class_name}, gradskip_options=args.gradskip,
                          steps=args.steps)
            with out.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
            print(f"{names[index]} {class_name} ({time.perf_counter() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
