"""Can the segmentation known-answer test be passed at all? Occlusion at the cue's own scale, near the platelet.

Issue 46's known-answer test asks each map of a cued platelet's region to point at the planted cue. The default
occlusion window (30 x 40 px) covers the platelet with the 7 px cue, so it cannot resolve it, and a cue-sized window
over the whole smear is ~1,000 passes a map. This study occludes only the neighbourhood the cue can be in: 8 x 8 px
windows moved by 4 px over the platelet's bounding box grown by `--margin` px (the cue's centre lies 6-10 px from the
platelet, its disc 3 px wide), painted the mean colour (the reference of the drop), each window's value the fall in
the region's mean Platelets probability, each pixel the mean over the windows that cover it (0 outside the box).
It knows where to look (the box), so it is a reference for what a perturbation at the right scale finds, not a
method for the view.

Every map is read inside the same box and outside the platelet grown by 3 px (`pointing_at_cue` with the box as the
allowed area): hit, mass on the cue, and the cue model's drop at the cue's budget there (`budget_drops`). Rows, for
the cue model and for the control (never shown the cue): local occlusion, GradSkip, gradient rollout; and the answers
that need no model: nearest-first and a random map. Same smears, platelets and placements as `seg_cue_pointing.py`.
One JSON line per platelet, resumable; `--table` prints means over smears with 95% bootstrap intervals and paired
differences (cue model minus control; local occlusion minus every row).

    python bench/studies/seg_cue_local_occlusion.py --data PREPARED --model weights/bccd-segformer-cue.json \
        --control weights/bccd-segformer.json --out bench/results/seg-cue-local-occlusion.jsonl
    python bench/studies/seg_cue_local_occlusion.py --table bench/results/seg-cue-local-occlusion.jsonl
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

WINDOW, STRIDE = 8, 4


def box_around(piece: np.ndarray, margin: int) -> np.ndarray:
    """The piece's bounding box grown by `margin` px (clipped to the image), as a boolean mask."""
    rows, cols = np.nonzero(piece)
    box = np.zeros_like(piece, dtype=bool)
    box[max(0, rows.min() - margin):rows.max() + margin + 1, max(0, cols.min() - margin):cols.max() + margin + 1] = True
    return box


def local_occlusion(bundle, image: torch.Tensor, target, box: np.ndarray) -> torch.Tensor:
    """H x W: the library's occlusion (`occlusion_maps`, the region's mean class probability) with WINDOW-px windows
    every STRIDE px inside `box` only; 0 outside it."""
    from explainers.methods.occlusion import occlusion_maps

    rows, cols = np.nonzero(box)
    top, bottom, left, right = rows.min(), rows.max() + 1, cols.min(), cols.max() + 1
    corners = [(int(y), int(x)) for y in range(top, max(top, bottom - WINDOW) + 1, STRIDE)
               for x in range(left, max(left, right - WINDOW) + 1, STRIDE)]
    return occlusion_maps(bundle, image, target, (WINDOW, WINDOW), corners, probability=True, batch_size=32)[0]


def score_platelet(models: dict, image, piece, cue, margin: int) -> dict:
    from explainers.segmentation import context
    from explainers.segmentation.cue import PLATELETS, cue_rows
    from explainers.segmentation.methods import explain_region
    from explainers.segmentation.targets import RegionTarget

    region = torch.from_numpy(piece)
    target = RegionTarget(region[None], [PLATELETS])
    box = box_around(piece, margin)
    allowed = (~context.dilate(region)).numpy() & box
    maps, seconds = {}, {}
    for label, bundle in models.items():
        started = time.perf_counter()
        maps[f"{label}: local occlusion"] = local_occlusion(bundle, image, target, box)
        seconds[f"{label}: local occlusion"] = time.perf_counter() - started
        for name in ("gradskip", "gradrollout"):
            maps[f"{label}: {name}"] = explain_region(bundle, image, target, name).maps[0].float().cpu()
    distance = torch.from_numpy(context.distance_to(piece))
    maps["answer: nearest first"] = distance.max() - distance
    maps["answer: random map"] = torch.rand(piece.shape, generator=torch.Generator().manual_seed(0))
    rows, budget = cue_rows(models["cue model"], image, target, maps, allowed, cue)
    return {"rows": rows, "seconds": seconds, "box_pixels": int(box.sum()), "cue_budget": budget}


def run(args) -> int:
    from explainers.models import load_bundle
    from explainers.segmentation.cue import cued_platelets

    torch.set_num_threads(1)
    models = {"cue model": load_bundle(args.model), "control": load_bundle(args.control)}
    out = Path(args.out)
    done = {(r["image"], r["platelet"]) for r in map(json.loads, out.read_text().splitlines())} if out.exists() \
        else set()
    started = time.perf_counter()
    for name, number, image, piece, cue in cued_platelets(args.data, "test"):  # the held-out check's placements
        if (name, number) in done:
            continue
        if args.time_budget_s and time.perf_counter() - started > args.time_budget_s:
            print("time budget spent", flush=True)
            return 0
        record = score_platelet(models, image, piece, cue, args.margin)
        record.update(image=name, platelet=number, margin=args.margin)
        with out.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        done.add((name, number))
        print(f"{name} platelet {number} ({time.perf_counter() - started:.0f} s)", flush=True)
    return 0


def table(path) -> str:
    from explainers.statistics import bootstrap_ci, paired_difference

    records = [json.loads(line) for line in Path(path).read_text().splitlines()]
    smears = sorted({r["image"] for r in records})
    rows = list(records[0]["rows"])

    def per_smear(row, key):
        return np.array([np.mean([float(r["rows"][row][key]) for r in records if r["image"] == smear])
                         for smear in smears])

    def interval(values):
        bounds = bootstrap_ci(values)
        return f"{values.mean():.3f}" + (f" [{bounds[0]:.3f}, {bounds[1]:.3f}]" if bounds is not None else "")

    def difference(a, b):
        d = paired_difference(a, b)
        return f"{d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"

    chance = np.mean([r["rows"][rows[0]]["chance"] for r in records])
    lines = [f"{len(records)} cued platelets on {len(smears)} smears, box margin {records[0]['margin']} px; chance "
             f"mass {chance:.3f}. Mean over smears [95% CI].", "",
             "| row | hit rate | mass on the cue | drop at the cue's budget | local occlusion (cue model) minus row: drop |",
             "|---|---|---|---|---|"]
    best = per_smear("cue model: local occlusion", "drop")
    for row in rows:
        versus = "" if row == "cue model: local occlusion" else difference(best, per_smear(row, "drop"))
        lines.append(f"| {row} | {interval(per_smear(row, 'hit'))} | {interval(per_smear(row, 'mass'))} | "
                     f"{interval(per_smear(row, 'drop'))} | {versus} |")
    lines += ["", "| method | cue model minus control: hit | mass | drop |", "|---|---|---|---|"]
    for name in ("local occlusion", "gradskip", "gradrollout"):
        cells = [difference(per_smear(f"cue model: {name}", key), per_smear(f"control: {name}", key))
                 for key in ("hit", "mass", "drop")]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data")
    parser.add_argument("--model", help="the cue-using model's card")
    parser.add_argument("--control", help="a model never shown the cue (its card)")
    parser.add_argument("--out")
    parser.add_argument("--margin", type=int, default=20, help="px around the platelet's bounding box")
    parser.add_argument("--time-budget-s", type=float, default=None)
    parser.add_argument("--table", help="print the table of a results file and stop")
    args = parser.parse_args()
    if args.table:
        print(table(args.table))
        return 0
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
