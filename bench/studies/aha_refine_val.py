"""AHA test-time refinement settings, chosen on validation cells (issue #16: "T=3 improves both deletion and
insertion over T=0").

    python bench/studies/aha_refine_val.py --model bloodmnist-vit --data ../shared/data/bloodmnist/64/val --limit 256 \
        --steps 3 --configs 0.3:1,0.15:1,0.6:1,0.3:2,0.6:2 --out bench/results/aha-refine-vit-val256.json

Each config is `lr:deletion_weight[:grid]`: the step size of the coarse correction the refinement optimises,
the weight of the deletion AUC in its loss (deletion_weight x deletion + 1 - insertion) and the correction's
grid (default: the per-image grid for the input size). For every config: hard deletion / insertion (the
evaluation engine: 21 fractions, mean reference) of the top-1 maps after `--steps` steps on the same cells, and
paired bootstrap 95% intervals of the difference to T=0 (the explainer's one-pass map, the refinement's start)
and to the first config (the current default). Validation data only: the test split is never read here.

`--apply` writes the choice into the explainer's card ("refinement", which the AHA method reads): among the configs
whose paired intervals show T steps improving BOTH deletion and insertion over T=0 (each excludes 0), the highest
mean ins-del (ties: the faster); when none does, the card is left alone.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

from explainers.aha.per_image import optimise_maps
from explainers.aha_training.data import load_eval_images
from explainers.methods import get_method
from explainers.metrics import deletion_insertion
from explainers.models import load_model
from explainers.statistics import bootstrap_ci, paired_difference


def parse_config(text: str) -> dict:
    parts = text.split(":")
    if not 2 <= len(parts) <= 3:
        raise argparse.ArgumentTypeError(f"a config is lr:deletion_weight[:grid], got {text!r}")
    config = {"lr": float(parts[0]), "deletion_weight": float(parts[1])}
    if len(parts) == 3:
        config["grid"] = int(parts[2])
    return config


def scores(bundle, images, maps, targets) -> dict:
    curves = deletion_insertion(bundle, images, maps, targets)
    return {"deletion": curves.deletion_auc, "insertion": curves.insertion_auc, "ins_minus_del": curves.ins_minus_del}


def summary(values: dict) -> dict:
    return {key: {"mean": float(v.mean()), "ci95": bootstrap_ci(v)} for key, v in values.items()}


def paired(a: dict, b: dict) -> dict:
    return {key: paired_difference(a[key], b[key]) for key in a}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model")
    parser.add_argument("--data", help="a validation split (never the test split)")
    parser.add_argument("--limit", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--configs", default="0.3:1", help="comma list of lr:deletion_weight[:grid]; first = default")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="the report (JSON)")
    parser.add_argument("--apply", action="store_true", help="write the chosen settings into the explainer's card")
    parser.add_argument("--apply-from", default=None, help="choose from this earlier --out report and apply (no run)")
    args = parser.parse_args(argv)
    if args.apply_from:
        report = json.loads(Path(args.apply_from).read_text())
        report.setdefault("command", f"python bench/studies/aha_refine_val.py (report {Path(args.apply_from).name})")
        chosen = choose(report)
        if chosen:
            write_card(report["model"], chosen, report)
        return 0
    if not (args.model and args.data and args.out):
        parser.error("--model, --data and --out are needed (or --apply-from)")
    torch.set_num_threads(args.threads)
    configs = [parse_config(c) for c in args.configs.split(",")]
    bundle = load_model(args.model)
    images, _ = load_eval_images(bundle, args.data, args.limit, split="val")
    aha = get_method("aha")
    one_pass, targets = [], []
    for s in range(0, len(images), args.batch):
        _, maps, chosen = aha.predict_and_explain(bundle, images[s:s + args.batch])
        one_pass.append(maps)
        targets.append(chosen)
    one_pass, targets = torch.cat(one_pass), torch.cat(targets)
    base = scores(bundle, images, one_pass, targets)
    report = {"model": args.model, "data": args.data, "cells": len(images), "steps": args.steps,
              "selection": "cells spread evenly over the file (load_eval_images)", "T0": summary(base),
              "command": " ".join(["python bench/studies/aha_refine_val.py"] + sys.argv[1:]),
              "T0_per_cell": {k: [round(float(x), 5) for x in v] for k, v in base.items()}, "configs": []}
    print(f"T=0: {json.dumps({k: round(v['mean'], 4) for k, v in report['T0'].items()})}", flush=True)
    first = None
    for config in configs:
        started = time.time()
        refined = torch.cat([optimise_maps(bundle, images[s:s + args.batch], targets[s:s + args.batch],
                                           steps=args.steps, prior_maps=one_pass[s:s + args.batch], **config)
                             for s in range(0, len(images), args.batch)])
        seconds = (time.time() - started) / len(images)
        result = scores(bundle, images, refined, targets)
        first = first or result
        row = {"config": config, "seconds_per_cell": round(seconds, 3), "scores": summary(result),
               "per_cell": {k: [round(float(x), 5) for x in v] for k, v in result.items()},
               "minus_T0": paired(result, base), "minus_first": paired(result, first)}
        report["configs"].append(row)
        gains = {k: (round(v["mean"], 4), [round(x, 4) for x in v["ci95"]]) for k, v in row["minus_T0"].items()}
        print(f"{config}: {seconds:.2f} s/cell, minus T=0 {gains}", flush=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    chosen = choose(report)
    Path(args.out).write_text(json.dumps(report, indent=1))
    if args.apply and chosen:
        write_card(bundle.name, chosen, report)
    return 0


def choose(report: dict) -> dict | None:
    both = [row for row in report["configs"] if row["minus_T0"]["deletion"]["ci95"][1] < 0
            and row["minus_T0"]["insertion"]["ci95"][0] > 0]
    chosen = max(both, key=lambda r: (r["scores"]["ins_minus_del"]["mean"], -r["seconds_per_cell"])) if both else None
    report["chosen"] = chosen and chosen["config"]
    print("chosen:", report["chosen"], flush=True)
    return chosen


def write_card(model: str, chosen: dict, report: dict) -> None:
    from explainers.aha.store import explainer_stem
    from explainers.atomic import atomic_write_text

    card_file = Path(str(explainer_stem(model)) + ".json")
    card = json.loads(card_file.read_text())
    rows = [{"config": r["config"], "seconds_per_cell": r["seconds_per_cell"],
             **{f"{k}_minus_T0": {"mean": round(v["mean"], 5), "ci95": [round(x, 5) for x in v["ci95"]]}
                for k, v in r["minus_T0"].items()}} for r in report["configs"]]
    card["refinement"] = {
        "lr": chosen["config"]["lr"], "grid": chosen["config"].get("grid"),
        "deletion_weight": chosen["config"]["deletion_weight"],
        "selection": {"data": report["data"], "cells": report["cells"], "steps": report["steps"],
                      "rule": "among the configs whose paired 95% intervals show T steps improving both deletion and "
                              "insertion over T=0, the highest mean ins-del (hard curves, K=20, mean reference)",
                      "T0": {k: round(v["mean"], 5) for k, v in report["T0"].items()}, "rows": rows,
                      "command": report.get("command") or " ".join(["python bench/studies/aha_refine_val.py"] + sys.argv[1:])}}
    atomic_write_text(card_file, json.dumps(card, indent=2))
    print(f"wrote the refinement settings into {card_file}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
