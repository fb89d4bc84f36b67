"""The segmentation known-answer test (issue 46, item 3): do the maps of a cued platelet point at its cue?

    python bench/seg_cue_pointing.py --data PREPARED --model weights/bccd-segformer-cue.json \
        --control weights/bccd-segformer.json --out bench/results/seg-cue-pointing.jsonl
    python bench/seg_cue_pointing.py --table bench/results/seg-cue-pointing.jsonl

Smears: BCCD's test split less the five twins (`--split val`: the val smears, to choose options on), the cue
planted beside every platelet that can carry it (placements drawn once, seed 0: the held-out check's own smears,
`explainers/segmentation/cue.py`). Per cued
platelet, the target is the Platelets class over that platelet's derived-mask piece; each map is scored outside
the piece grown by 3 px (the piece itself is what the segmentation shows) by `pointing_at_cue`: a hit when the
map's largest value there lies on the platelet's own cue (grown 2 px), and the map's mass on it.

Rows: GradSkip (the default options), gradient rollout, attention rollout and Seg-Grad-CAM on the cue-using model
(occlusion with `--slow`); the same methods on `--control`, a model never shown the cue, explaining the same
cued smear (its maps should not point there); and the answers that need no explanation: the region blurred, the
class probability map, a random map, nearest-first (the distance to the region, nearest highest) and GradSkip on
the cue model with every weight re-initialised. `--methods M --add-to STORED` adds the rows of M to a stored
file's records (same platelets, same placements; the answers are not recomputed). One JSON line per platelet,
resumable; `--table` prints hit rate
and mass per row with 95% bootstrap intervals over smears (a smear's platelets averaged first) and GradSkip's
paired difference to every row.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from explainers.models import load_bundle
from explainers.segmentation import context
from explainers.segmentation.checks import randomised_bundles
from explainers.segmentation.cue import PLATELETS, cue_rows, cued_platelets
from explainers.segmentation.methods import explain_region
from explainers.segmentation.targets import RegionTarget
from explainers.statistics import bootstrap_ci, paired_difference

METHODS = ("gradskip", "gradrollout", "rollout", "gradcam")
SLOW_METHODS = ("occlusion",)
# GradSkip's other options (`--gradskip-variants`: all on the cue model only; `--gradskip-variants LABEL ...`: those,
# on the cue model and the control, so each has its cue-minus-control contrast): for choosing options on val smears
GRADSKIP_VARIANTS = {"ffn=conv": {"ffn_spread": "conv"},
                     "start=decoder": {"start": "decoder"}, "beta=layer": {"beta_reduction": "layer"},
                     "weighting=gradient": {"attention_weighting": "gradient"},
                     "weighting=attention": {"attention_weighting": "attention"},
                     "alpha=0": {"alpha": 0.0}, "alpha=1": {"alpha": 1.0}, "start=signed": {"start": "decoder_signed"},
                     "keys=conv": {"key_spread": "conv"}, "pixels=input_gradient": {"pixel_step": "input_gradient"},
                     "pixels=sum": {"pixel_step": "upsample_and_input_gradient"}, "stages=conv": {"stage_spread": "conv"},
                     "keys=conv,stages=conv": {"key_spread": "conv", "stage_spread": "conv"}}


def answer_maps(bundle, random_model, image, target, region) -> dict:
    """The maps that need no explanation of the model (or no trained model)."""
    with torch.no_grad():
        probability = bundle(image).softmax(dim=1)[0, PLATELETS]
    distance = torch.from_numpy(context.distance_to(region.numpy()))  # 0 on the region, growing outward
    generator = torch.Generator().manual_seed(0)
    return {"answer: region blurred": context.region_copy(region), "answer: class probability": probability,
            "answer: random map": torch.rand(region.shape, generator=generator),
            "answer: nearest first": distance.max() - distance,
            "answer: GradSkip, random model": explain_region(random_model, image, target, "gradskip").maps[0]}


def score_platelet(models: dict, random_model, image, piece, cue, methods, variants: dict | None = None,
                   answers: bool = True, variants_on_control: bool = False) -> dict:
    """`answers`: False for rows added to a stored record (`--add-to`), whose answers are already there."""
    region = torch.from_numpy(piece)
    target = RegionTarget(region[None], [PLATELETS])
    outside = (~context.dilate(region)).numpy()
    maps, seconds = {}, {}
    runs = [(f"{label}: {name}", bundle, name, {}) for label, bundle in models.items() for name in methods]
    variant_models = models if variants_on_control else {"cue model": models["cue model"]}
    runs += [(f"{who}: gradskip ({label})", bundle, "gradskip", options)
             for label, options in (variants or {}).items() for who, bundle in variant_models.items()]
    for row, bundle, name, options in runs:
        batch = explain_region(bundle, image, target, name, **options)
        maps[row], seconds[row] = batch.maps[0], batch.seconds
    if answers:
        maps.update(answer_maps(models["cue model"], random_model, image, target, region))
    maps = {name: heat.detach().float().cpu() for name, heat in maps.items()}
    # the cue model's region score when each map's top pixels outside the region, as many as the grown cue has,
    # are painted the mean colour; "the cue itself" paints exactly the grown cue (the most a map can show)
    rows, budget = cue_rows(models["cue model"], image, target, maps, outside, cue)
    if not answers:
        rows.pop("answer: the cue itself")
    return {"rows": rows, "seconds": seconds, "platelet_pixels": int(piece.sum()), "cue_budget": budget}


def run(args) -> int:
    torch.set_num_threads(1)
    models = {"cue model": load_bundle(args.model), "control": load_bundle(args.control)}
    *_, (_, random_model) = randomised_bundles(models["cue model"])
    methods = tuple(args.methods) if args.methods is not None else METHODS + (SLOW_METHODS if args.slow else ())
    variants = None
    if args.gradskip_variants is not None:
        unknown = set(args.gradskip_variants) - set(GRADSKIP_VARIANTS)
        if unknown:
            raise SystemExit(f"unknown variants {sorted(unknown)}; known: {', '.join(GRADSKIP_VARIANTS)}")
        variants = {label: GRADSKIP_VARIANTS[label] for label in args.gradskip_variants} or GRADSKIP_VARIANTS
    stored = {(r["image"], r["platelet"]): r for r in map(json.loads, Path(args.add_to).read_text().splitlines())} \
        if args.add_to else None
    out = Path(args.out)
    done = {(r["image"], r["platelet"]) for r in map(json.loads, out.read_text().splitlines())} if out.exists() \
        else set()
    started = time.perf_counter()
    for position, (name, number, image, piece, cue) in enumerate(cued_platelets(args.data, args.split)):
        if position < args.skip:  # the platelets a probe has seen: a rule reads the others
            continue
        if (name, number) in done or (stored is not None and (name, number) not in stored):
            continue
        if args.limit is not None and len(done) >= args.limit:
            return 0
        if args.time_budget_s and time.perf_counter() - started > args.time_budget_s:
            print("time budget spent", flush=True)
            return 0
        record = score_platelet(models, random_model, image, piece, cue, methods, variants,
                                answers=stored is None or args.with_answers, variants_on_control=bool(args.gradskip_variants))
        if stored is not None:  # the stored record with the new methods' rows added (the same platelet's maps)
            old = stored[(name, number)]
            record = {**old, "rows": {**old["rows"], **record["rows"]},
                      "seconds": {**old.get("seconds", {}), **record["seconds"]}}
        record.update(image=name, platelet=number)
        with out.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        done.add((name, number))
        print(f"{name} platelet {number} ({time.perf_counter() - started:.0f} s)", flush=True)
    return 0


def table(path) -> str:
    """Hit rate, mass and (where measured) the drop at the cue's budget per row, mean over smears [95% CI], and
    GradSkip's paired difference to every row."""
    records = [json.loads(line) for line in Path(path).read_text().splitlines()]
    smears = sorted({r["image"] for r in records})
    rows = [row for row in records[0]["rows"] if all(row in r["rows"] for r in records)]
    scores = [score for score in ("hit", "mass", "drop") if all(score in r["rows"][rows[0]] for r in records)]
    per_smear = {score: {row: np.array([np.mean([float(r["rows"][row].get(score, np.nan)) for r in records
                                                 if r["image"] == s]) for s in smears]) for row in rows}
                 for score in scores}
    chance = np.mean([r["rows"][rows[0]]["chance"] for r in records])
    headings = {"hit": "hit rate", "mass": "mass on the cue", "drop": "drop at the cue's budget"}
    lines = [f"{len(records)} cued platelets on {len(smears)} held-out smears; a uniform map's mass on the cue "
             f"(chance): {chance:.3f}", "",
             "| row | " + " | ".join(headings[s] for s in scores) + " | "
             + " | ".join(f"GradSkip minus row: {s}" for s in scores) + " |",
             "|---" * (1 + 2 * len(scores)) + "|"]
    ours = "cue model: gradskip"
    for row in rows:
        cells = [row]
        for score in scores:
            values = per_smear[score][row]
            if np.isnan(values).any():
                cells.append("")
                continue
            low, high = bootstrap_ci(values)
            cells.append(f"{values.mean():.3f} [{low:.3f}, {high:.3f}]")
        for score in scores:
            if row == ours or np.isnan(per_smear[score][row]).any():
                cells.append("")
                continue
            diff = paired_difference(per_smear[score][ours], per_smear[score][row])
            cells.append(f"{diff['mean']:+.3f} [{diff['ci95'][0]:+.3f}, {diff['ci95'][1]:+.3f}]")
        lines.append("| " + " | ".join(cells) + " |")
    # the known answer's own contrast: the same method on the same cued smear, the model that uses the cue minus
    # the model never shown it (a map that reads the model, not the picture, moves towards the cue)
    pairs = [row.removeprefix("cue model: ") for row in rows if row.startswith("cue model: ")
             and row.replace("cue model: ", "control: ", 1) in rows]
    if pairs:
        lines += ["", "Cue model minus control, the same method on the same smears (paired over smears):", "",
                  "| method | " + " | ".join(headings[s] for s in scores) + " |", "|---" * (1 + len(scores)) + "|"]
        for method in pairs:
            cells = [method]
            for score in scores:
                diff = paired_difference(per_smear[score][f"cue model: {method}"],
                                         per_smear[score][f"control: {method}"])
                cells.append(f"{diff['mean']:+.3f} [{diff['ci95'][0]:+.3f}, {diff['ci95'][1]:+.3f}]")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def card_summary(path, methods=("intgrad", "gradskip", "gradrollout", "gradcam")) -> dict:
    """The pointing figures a model card carries (the Learn tab reads them): per method, the hit rate on the cue
    model and on the control, mean over smears with its 95% interval, and how many platelets' maps peak on the cue."""
    records = [json.loads(line) for line in Path(path).read_text().splitlines()]
    smears = sorted({r["image"] for r in records})

    def rate(row):
        values = np.array([np.mean([float(r["rows"][row]["hit"]) for r in records if r["image"] == s])
                           for s in smears])
        low, high = bootstrap_ci(values)
        return {"mean": round(float(values.mean()), 3), "ci95": [round(float(low), 3), round(float(high), 3)],
                "platelets_hit": int(sum(bool(r["rows"][row]["hit"]) for r in records))}

    return {"split": "BCCD test less the twins", "platelets": len(records), "smears": len(smears),
            "score": "hit: the map's largest value outside the platelet (grown 3 px) lies on its cue",
            "source": str(Path(path).with_suffix(".md")),
            "hit": {m: {"cue_model": rate(f"cue model: {m}"), "control": rate(f"control: {m}")} for m in methods
                    if all(f"{who}: {m}" in records[0]["rows"] for who in ("cue model", "control"))}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data")
    parser.add_argument("--model", help="the cue-using model's card")
    parser.add_argument("--control", help="a model never shown the cue (its card)")
    parser.add_argument("--out")
    parser.add_argument("--slow", action="store_true", help="occlusion too (tens of seconds a map on a CPU)")
    parser.add_argument("--time-budget-s", type=float, default=None)
    parser.add_argument("--split", choices=["test", "val"], default="test",
                        help="val: for choosing GradSkip's options (with --gradskip-variants) before the test runs")
    parser.add_argument("--gradskip-variants", nargs="*", default=None, metavar="LABEL",
                        help="GradSkip's other options as extra rows: with no LABEL all of them on the cue model; "
                             f"with LABELs ({', '.join(GRADSKIP_VARIANTS)}) those, on both models")
    parser.add_argument("--limit", type=int, default=None, help="stop after this many platelets")
    parser.add_argument("--skip", type=int, default=0, help="leave out the split's first SKIP platelets")
    parser.add_argument("--with-answers", action="store_true",
                        help="with --add-to: make the answer rows again too (after GradSkip's default changed: "
                             "its random-model row)")
    parser.add_argument("--methods", nargs="*", default=None,
                        help="these methods' rows only (default: METHODS; none: only --gradskip-variants)")
    parser.add_argument("--add-to", default=None, metavar="STORED",
                        help="a stored results file: its records with --methods' rows added, written to --out")
    parser.add_argument("--table", help="print the table of a results file and stop")
    parser.add_argument("--to-card", metavar="CARD", help="with --table: write the hit rates into the cue model's card")
    args = parser.parse_args()
    if args.table:
        print(table(args.table))
        if args.to_card:
            card = json.loads(Path(args.to_card).read_text())
            card["pointing_at_cue"] = card_summary(args.table)
            Path(args.to_card).write_text(json.dumps(card, indent=2) + "\n")
        return 0
    if not (args.data and args.model and args.control and args.out):
        parser.error("--data, --model, --control and --out are needed (or --table FILE)")
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
