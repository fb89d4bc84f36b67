"""How few integrated-gradients steps still find the planted cue (docs/segmentation.md section 8)? On the cued val
platelets of a stored val file (`bench/results/seg-cue-pointing-val-intgrad.jsonl`: 16 steps), the same rows at
fewer steps: hit, mass and the cue model's drop at the cue's budget, for the cue model and the control. One JSON
line per platelet, resumable; `--table` prints hit rates per step count with the cue-minus-control difference.

    python bench/studies/seg_cue_intgrad_steps.py --data PREPARED \
        --stored bench/results/seg-cue-pointing-val-intgrad.jsonl --out bench/results/seg-cue-intgrad-steps-val.jsonl
    python bench/studies/seg_cue_intgrad_steps.py --table bench/results/seg-cue-intgrad-steps-val.jsonl \
        --stored bench/results/seg-cue-pointing-val-intgrad.jsonl
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

STEPS = (4, 8)


def run(args) -> int:
    from explainers.models import load_bundle
    from explainers.segmentation import context
    from explainers.segmentation.cue import PLATELETS, cue_rows, cued_platelets
    from explainers.segmentation.methods import explain_region
    from explainers.segmentation.targets import RegionTarget

    torch.set_num_threads(1)
    models = {"cue model": load_bundle(args.model), "control": load_bundle(args.control)}
    wanted = {(r["image"], r["platelet"]) for r in map(json.loads, Path(args.stored).read_text().splitlines())}
    out = Path(args.out)
    done = {(r["image"], r["platelet"]) for r in map(json.loads, out.read_text().splitlines())} if out.exists() \
        else set()
    for name, number, image, piece, cue in cued_platelets(args.data, "val"):
        if (name, number) not in wanted or (name, number) in done:
            continue
        region = torch.from_numpy(piece)
        target = RegionTarget(region[None], [PLATELETS])
        maps = {f"{label}: intgrad {steps}": explain_region(bundle, image, target, "intgrad", steps=steps).maps[0]
                for label, bundle in models.items() for steps in STEPS}
        rows, _ = cue_rows(models["cue model"], image, target, maps, (~context.dilate(region)).numpy(), cue)
        rows.pop("answer: the cue itself")
        with out.open("a") as handle:
            handle.write(json.dumps({"image": name, "platelet": number, "rows": rows}) + "\n")
        print(name, number, flush=True)
    return 0


def table(path, stored) -> str:
    from explainers.statistics import bootstrap_ci, paired_difference

    records = {(r["image"], r["platelet"]): r for r in map(json.loads, Path(path).read_text().splitlines())}
    for r in map(json.loads, Path(stored).read_text().splitlines()):
        if (r["image"], r["platelet"]) in records:
            for who in ("cue model", "control"):
                records[(r["image"], r["platelet"])]["rows"][f"{who}: intgrad 16"] = r["rows"][f"{who}: intgrad"]
    smears = sorted({image for image, _ in records})

    def per_smear(row):
        return np.array([np.mean([float(r["rows"][row]["hit"]) for (image, _), r in records.items() if image == s])
                         for s in smears])

    lines = [f"{len(records)} cued val platelets on {len(smears)} smears; hit rate, mean over smears [95% CI]", "",
             "| steps | cue model | control | cue model minus control |", "|---|---|---|---|"]
    for steps in (*STEPS, 16):
        cue, control = per_smear(f"cue model: intgrad {steps}"), per_smear(f"control: intgrad {steps}")
        difference = paired_difference(cue, control)
        cells = [f"{v.mean():.3f} [{bootstrap_ci(v)[0]:.3f}, {bootstrap_ci(v)[1]:.3f}]" for v in (cue, control)]
        lines.append(f"| {steps} | {cells[0]} | {cells[1]} | {difference['mean']:+.3f} "
                     f"[{difference['ci95'][0]:+.3f}, {difference['ci95'][1]:+.3f}] |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data")
    parser.add_argument("--model", default="weights/bccd-segformer-cue.json")
    parser.add_argument("--control", default="weights/bccd-segformer.json")
    parser.add_argument("--stored", required=True, help="the val file with 16 steps' rows")
    parser.add_argument("--out")
    parser.add_argument("--table", help="print the table of a results file and stop")
    args = parser.parse_args()
    if args.table:
        print(table(args.table, args.stored))
        return 0
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
