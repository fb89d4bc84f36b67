"""How much of a trained AHA explainer's prior skip it should keep: the output with cam_weight x s for several s,
on validation images (issue #16; a selection run, never on test images).

    python bench/aha_prior_scale.py --model bloodmnist-cnn --data ../shared/data/bloodmnist/64/val --limit 256 \
        --scales 0,0.5,1,1.5,2,3,5 --out bench/results/aha-prior-scale-cnn-val256.json
    python bench/aha_prior_scale.py --model efficientnet-lite0 --data ../shared/data/imagenet-train --held-out \
        --scales 0,0.5,1,1.5,2,3,5 --out bench/results/aha-prior-scale-effnet-val40.json

`--held-out`: the images the explainer's training held out (named in its card) instead of `--limit` images spread
over `--data`. Hard deletion / insertion (the evaluation engine: K=20, mean reference, top-1 targets), with Grad-CAM
on the same images; paired bootstrap intervals against s = 1 (the trained explainer).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from explainers.aha.store import get_explainer  # noqa: E402
from explainers.aha.train import load_eval_images  # noqa: E402
from explainers.methods import get_method  # noqa: E402
from explainers.metrics import deletion_insertion  # noqa: E402
from explainers.models import load_model  # noqa: E402
from explainers.statistics import bootstrap_ci, paired_difference  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--limit", type=int, default=256)
    parser.add_argument("--held-out", action="store_true")
    parser.add_argument("--scales", default="0,0.5,1,1.5,2,3,5")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    bundle = load_model(args.model)
    explainer = get_explainer(bundle)
    indices = explainer.card["recipe"]["held_out_indices"] if args.held_out else None
    images, _ = load_eval_images(bundle, args.data, args.limit if indices is None else len(indices), indices=indices)
    scales = sorted({float(s) for s in args.scales.split(",")} | {1.0})
    scores = {s: {"deletion": [], "insertion": []} for s in scales}
    scores["gradcam"] = {"deletion": [], "insertion": []}
    for start in range(0, len(images), args.batch_size):
        x = images[start:start + args.batch_size]
        with torch.no_grad():
            encoded = explainer.encode(x)
            targets = encoded.logits.argmax(1)
            fused, cam = explainer.trunk(encoded, targets)
            params = dict(explainer.head.named_parameters())
            candidates = {s: explainer.head_output(fused, cam, encoded.image_hw,
                                                   dict(params, cam_weight=params["cam_weight"] * s)) for s in scales}
        candidates["gradcam"] = get_method("gradcam").attribute(bundle, x, targets).detach()
        for key, maps in candidates.items():
            curves = deletion_insertion(bundle, x, maps.float(), targets)
            scores[key]["deletion"] += list(curves.deletion_auc)
            scores[key]["insertion"] += list(curves.insertion_auc)
        print(f"{min(start + args.batch_size, len(images))}/{len(images)} images", file=sys.stderr, flush=True)
    base = {k: np.array(v) for k, v in scores[1.0].items()}
    rows = {}
    for key, row in scores.items():
        d, i = np.array(row["deletion"]), np.array(row["insertion"])
        rows[str(key)] = {"deletion_auc": float(d.mean()), "insertion_auc": float(i.mean()),
                          "ins_minus_del": float((i - d).mean()), "ins_minus_del_ci95": bootstrap_ci(i - d),
                          "deletion_vs_trained": paired_difference(d, base["deletion"]),
                          "insertion_vs_trained": paired_difference(i, base["insertion"])}
        print(f"{key!s:>8}  deletion {d.mean():.4f}  insertion {i.mean():.4f}  ins-del {(i - d).mean():.4f}")
    result = {"model": args.model, "data": args.data, "images": int(len(images)),
              "held_out_indices": indices, "trained_cam_weight": float(explainer.head.cam_weight),
              "prior": explainer.prior, "rows": rows, "command": " ".join(["python"] + sys.argv)}
    Path(args.out).write_text(json.dumps(result, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
