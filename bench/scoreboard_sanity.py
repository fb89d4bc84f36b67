"""The model-randomisation sanity check (Adebayo et al.) with the tie-correct Spearman: per image, the rank
correlation of each method's map with its map after the classifier head (and then more top layers) is re-initialised
(`explainers.sanity.randomization_stages`, seed 0), with bootstrap intervals over the images.

    python bench/scoreboard_sanity.py --model bloodmnist-vit --data ../shared/data/bloodmnist/64/test --limit 16 \\
        --methods aha,aha:refine_steps=3,aha:mode=per-image,gradskip,gradcam --layers 1 --out F.json

Targets: the model's predicted class. `--layers N`: the first N layers from the top, one at a time (1 = the head).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]

from explainers.atomic import atomic_write_text
from explainers.data import item_names, model_batches, open_dataset
from explainers.evaluate import build_methods
from explainers.methods import split_method_specs
from explainers.metrics import spearman
from explainers.models import load_model
from explainers.sanity import randomization_stages
from explainers.statistics import bootstrap_ci


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--methods", required=True)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    bundle = load_model(args.model, device=args.device)
    dataset = open_dataset(args.data, split=args.split, limit=args.limit, require_labels=False)
    images = torch.cat([batch for _, batch in model_batches(dataset, bundle)])
    with torch.no_grad():
        targets = bundle(images).argmax(dim=1)
    results = {}
    for label, method in build_methods(bundle, split_method_specs(args.methods)):
        started = time.perf_counter()
        stages = randomization_stages(bundle, method, images, targets, seed=args.seed, max_layers=args.layers)
        _, _, original = next(stages)
        rows = []
        for layer, done, maps in stages:
            rhos = [spearman(original[i].cpu(), maps[i].cpu()) for i in range(images.shape[0])]
            rows.append({"layers_reinitialised": done, "last_layer": layer, "spearman": float(np.mean(rhos)),
                         "ci95": bootstrap_ci(rhos, seed=args.seed), "per_image": rhos})
        results[label] = rows
        shown = [f"{row['last_layer']}: {row['spearman']:.3f}"
                 + (f" [{row['ci95'][0]:.3f}, {row['ci95'][1]:.3f}]" if row["ci95"] else "") for row in rows]
        print(f"{label:<28} " + "  ".join(shown) + f"  ({time.perf_counter() - started:.0f} s)", flush=True)
    report = {"what": "per image, Spearman rho (ties: average ranks) of the method's map with its map after the top "
                      "layers are re-initialised, one more each stage (explainers.sanity, cascading); mean and 95% "
                      "percentile bootstrap interval over the images", "model": args.model, "data": args.data,
              "split": args.split, "images": len(dataset), "files": item_names(dataset), "seed": args.seed,
              "target": "predicted class", "command": " ".join(["python bench/scoreboard_sanity.py"] + sys.argv[1:]),
              "methods": results}
    atomic_write_text(Path(args.out), json.dumps(report, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
