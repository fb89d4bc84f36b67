"""Choose a trained explainer's output blur on held-out images (`python -m explainers aha-output-blur`).

The loss ranks cells of a grid, so a trained explainer's map can be rougher than its curves need: on ImageNet
photos a Gaussian blur of the map removed whole regions sooner and lowered deletion (the validation runs are in
bench/results/README.md). This measures hard deletion / insertion (the evaluation engine) of the explainer's maps
under each candidate sigma on held-out images the training never saw, picks the highest mean ins-del among the
sigmas whose paired gain over no blur is beyond chance there (its 95% interval excludes 0; otherwise no blur:
a first version took the highest mean, and on EfficientNet-Lite0's 40 held-out photos that chose a gain of noise)
and writes the choice into the card's architecture. The weights are not touched; the table,
with bootstrap intervals and paired differences to no blur, goes into the card beside it.

With `baseline` (e.g. "gradcam") the rule asks what the product promises instead: the blur trades insertion for
deletion, so among the sigmas (no blur included) whose mean deletion is below AND mean insertion above the
baseline's on the same held-out images, the one with the largest smaller lead (the lead most likely to hold on
both curves on new images); when none is ahead on both, the rule above.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..metrics import METRICS
from ..smoothing import gaussian_smooth
from ..statistics import bootstrap_ci, paired_difference
from ..aha.network import check_output_blur
from .data import load_eval_images
from .validation import baseline_scores

DEFAULT_SIGMAS = (0.0, 2.0, 4.0, 8.0, 16.0)


def _held_out(card: dict, val_data):
    """(data, indices) to measure on: --val-data, else the images the training held out (from the card)."""
    if val_data:
        return str(val_data), None
    recipe = card.get("recipe") or {}
    indices = recipe.get("held_out_indices")
    if not indices:
        raise ValueError("this explainer's card names no held-out images (it was trained with --val-data): give "
                         "--val-data, e.g. the validation split the training used")
    return str(recipe["data"]), [int(i) for i in indices]


def measure_output_blur(explainer, images: torch.Tensor, sigmas, *, batch_size: int = 16, steps: int = 20,
                        progress: bool = False) -> dict:
    """Per-image hard deletion / insertion AUCs of the explainer's top-1 maps under each blur sigma:
    {sigma: {"deletion": array, "insertion": array}}. One classifier pass and one decoder pass per batch."""
    from ..metrics import deletion_insertion

    bundle = explainer.bundle
    scores = {float(s): {"deletion": [], "insertion": []} for s in sigmas}
    bar = tqdm(total=len(images), desc=f"output blur ({len(scores)} sigmas)", unit="image", file=sys.stderr,
               disable=not progress)
    for start in range(0, len(images), batch_size):
        x = images[start:start + batch_size].to(bundle.device)
        with torch.no_grad():
            encoded = explainer.encode(x)
            targets = encoded.logits.argmax(1)
            fused, cam = explainer.trunk(encoded, targets)
            raw = explainer.head(fused, cam, encoded.image_hw)  # before any blur the card may already name
            for sigma, row in scores.items():
                maps = gaussian_smooth(raw.unsqueeze(1), sigma).squeeze(1) if sigma > 0 else raw
                curves = deletion_insertion(bundle, x, maps.float(), targets, steps=steps, reference="mean")
                row["deletion"].append(np.asarray(curves.deletion_auc))
                row["insertion"].append(np.asarray(curves.insertion_auc))
        bar.update(len(x))
    bar.close()
    return {s: {k: np.concatenate(v) for k, v in row.items()} for s, row in scores.items()}


def _leads(row: dict, baseline: dict) -> list:
    """The row's lead over the baseline's mean on each curve (positive: better, by each metric's declaration)."""
    return [float(METRICS[name].gain(row[name], np.mean(baseline[key])))
            for key, name in (("deletion", "deletion_auc"), ("insertion", "insertion_auc"))]


def summarise(scores: dict, baseline: dict | None = None) -> tuple:
    """(table rows, chosen sigma): mean deletion / insertion / ins-del with 95% intervals, paired to sigma 0; the
    chosen sigma has the best mean ins-del among those with a significant paired gain (0 when none has one).
    `baseline` ({"deletion": array, "insertion": array} of a peer method on the same images): first, among the
    sigmas ahead of it on both mean curves, the one whose smaller lead (in deletion or in insertion) is largest."""
    base = scores.get(0.0)
    rows = []
    for sigma, row in sorted(scores.items()):
        ins_del = row["insertion"] - row["deletion"]
        entry = {"sigma_px": sigma, "deletion_auc": round(float(row["deletion"].mean()), 5),
                 "insertion_auc": round(float(row["insertion"].mean()), 5),
                 "ins_minus_del": round(float(ins_del.mean()), 5),
                 "ins_minus_del_ci95": [round(v, 5) for v in bootstrap_ci(ins_del)]}
        if base is not None and sigma != 0.0:
            for key in ("deletion", "insertion"):
                diff = paired_difference(row[key], base[key])
                entry[f"{key}_vs_no_blur"] = {"mean": round(diff["mean"], 5),
                                               "ci95": [round(v, 5) for v in diff["ci95"]]}
            diff = paired_difference(ins_del, base["insertion"] - base["deletion"])
            entry["ins_minus_del_vs_no_blur"] = {"mean": round(diff["mean"], 5),
                                                 "ci95": [round(v, 5) for v in diff["ci95"]]}
        rows.append(entry)
    if baseline is not None:
        ahead = [r for r in rows if min(_leads(r, baseline)) > 0]
        if ahead:  # the most robust lead: the largest of the smaller margins (deletion's, insertion's)
            return rows, max(ahead, key=lambda r: (min(_leads(r, baseline)), -r["sigma_px"]))["sigma_px"]
    # only a gain the held-out images show beyond chance: a blur whose paired interval includes 0 is noise
    gains = [r for r in rows if r["sigma_px"] > 0 and r["ins_minus_del_vs_no_blur"]["ci95"][0] > 0]
    if not gains:
        return rows, 0.0
    ins_del = METRICS["ins_minus_del"]
    best = max(gains, key=lambda r: (ins_del.gain(r["ins_minus_del"], 0.0), -r["sigma_px"]))  # ties: the smaller blur
    return rows, best["sigma_px"]


def select_output_blur(model: str | None = None, *, bundle=None, sigmas=DEFAULT_SIGMAS, val_data=None,
                       val_limit: int = 256, stem=None, apply: bool = True, batch_size: int = 16,
                       progress: bool = False, baseline: str | None = None) -> dict:
    """Measure `sigmas` on held-out images and (with `apply`) store the best in the explainer's card
    (`baseline`: the rule that asks to be ahead of that method on both curves, see the module's note)."""
    from ..models import load_model
    from ..atomic import atomic_write_text
    from ..aha.store import explainer_stem, forget_explainers, load_explainer, stem_from_out

    sigmas = sorted({check_output_blur(s) for s in sigmas} | {0.0})
    bundle = bundle or load_model(model)
    model = bundle.name
    stem = stem_from_out(stem) if stem else explainer_stem(model)
    explainer = load_explainer(bundle, stem).eval()
    data, indices = _held_out(explainer.card, val_data)
    images, _ = load_eval_images(bundle, data, val_limit, split="val", indices=indices)
    peer = baseline_scores(bundle, baseline, images, batch_size=batch_size) if baseline else None
    rows, chosen = summarise(measure_output_blur(explainer, images, sigmas, batch_size=batch_size,
                                                 progress=progress), peer)
    rule = ("the highest mean ins-del (hard curves, K=20, mean reference, top-1 targets) among the sigmas whose "
            "paired 95% interval of the ins-del gain over no blur excludes 0; none: no blur. Ties: the smaller sigma")
    if baseline:
        rule = (f"among the sigmas (0 included) with a lower mean deletion AND a higher mean insertion than {baseline} "
                "on these images, the one whose smaller lead (deletion's or insertion's) is largest; when none, " + rule)
    selection = {"data": data if indices is None else f"the {len(indices)} images of {data} held out of training",
                 "images": int(len(images)), "rule": rule, "rows": rows, "chosen_sigma_px": chosen,
                 "command": " ".join(["python -m explainers"] + sys.argv[1:])}
    if peer is not None:
        selection["baseline"] = {"method": baseline, "deletion_auc": round(float(peer["deletion"].mean()), 5),
                                 "insertion_auc": round(float(peer["insertion"].mean()), 5)}
    if apply:
        card_file = Path(str(stem) + ".json")
        card = json.loads(card_file.read_text())
        card["architecture"]["output_blur"] = chosen
        card["output_blur_selection"] = selection
        if isinstance(card.get("held_out"), dict):  # those figures were measured on the maps before this choice
            card["held_out"].setdefault("output_blur_px", 0.0)
        atomic_write_text(card_file, json.dumps(card, indent=2))
        forget_explainers(model)  # the next explanation loads the card again
    return selection


def add_output_blur_parser(commands) -> None:
    p = commands.add_parser("aha-output-blur", help="choose a trained AHA explainer's output blur on held-out images")
    p.add_argument("--model", required=True)
    p.add_argument("--val-data", default=None,
                   help="held-out images (default: the images the training held out, named in the card)")
    p.add_argument("--val-limit", type=int, default=256)
    p.add_argument("--sigmas", default=",".join(f"{s:g}" for s in DEFAULT_SIGMAS), help="candidate sigmas, pixels")
    p.add_argument("--explainer", default=None, help="explainer stem (default weights/aha-<model>)")
    p.add_argument("--dry-run", action="store_true", help="measure and print only; the card is not changed")
    p.add_argument("--baseline", default=None,
                   help="a method (e.g. gradcam): choose among the sigmas ahead of it on both curves first")
    p.set_defaults(handler=lambda args: print(json.dumps(select_output_blur(
        args.model, sigmas=[float(s) for s in args.sigmas.split(",") if s.strip()], val_data=args.val_data,
        val_limit=args.val_limit, stem=args.explainer, apply=not args.dry_run, progress=True,
        baseline=args.baseline), indent=2)) or 0)
