"""What AHA's one pass and its refinement cost, as ratios measured in one run (issue #16).

    python bench/studies/aha_refine_cost.py --models bloodmnist-vit,bloodmnist-cnn,efficientnet-lite0 --images 6 \
        --out bench/results/aha-refine-cost.json

Batch 1, one thread, methods interleaved image by image; per image the best of `--repeats` runs (robust to other
processes on a shared CPU), then the median over images. Per model: Grad-CAM, AHA T=0 with the card's output blur
and without any (`output_blur=0`), and AHA T=3 with the card's refinement settings and with the grid left at the
per-image default (where the card names another grid). Images: the model's evaluation data (`--data` to change).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from explainers.aha_training.data import load_eval_images
from explainers.methods import get_method
from explainers.models import load_model

import torch

DATA = {"bloodmnist-vit": "../shared/data/bloodmnist/64/val", "bloodmnist-cnn": "../shared/data/bloodmnist/64/val",
        "efficientnet-lite0": "../shared/data/imagenet-samples"}


def runs_for(bundle) -> dict:
    aha = get_method("aha", refine_steps=3)
    settings = aha.refinement_settings(bundle)
    runs = {"gradcam": get_method("gradcam"), "aha_t0": get_method("aha"),
            "aha_t0_no_blur": get_method("aha", output_blur=0), "aha_t3": aha}
    if settings["grid"] is not None:  # the same refinement on the per-image grid, for the ratio
        class DefaultGrid(type(aha)):
            def refinement_settings(self, bundle):
                return {**super().refinement_settings(bundle), "grid": None}
        runs["aha_t3_default_grid"] = DefaultGrid(refine_steps=3)
    return runs, settings


def time_model(name: str, data: str | None, count: int, repeats: int) -> dict:
    bundle = load_model(name)
    images, _ = load_eval_images(bundle, data or DATA[name], count, split="val")
    runs, settings = runs_for(bundle)
    times = {key: [] for key in runs}
    for index in range(len(images)):
        x = images[index:index + 1]
        with torch.no_grad():
            target = bundle(x).argmax(1)
        for key, method in runs.items():
            if index == 0:
                method.attribute(bundle, x, target)  # warm-up
            best = float("inf")
            for _ in range(repeats):
                started = time.perf_counter()
                method.attribute(bundle, x, target)
                best = min(best, 1000 * (time.perf_counter() - started))
            times[key].append(best)
    result = {f"{key}_ms": round(statistics.median(v), 2) for key, v in times.items()}
    result["aha_t0_over_gradcam"] = round(result["aha_t0_ms"] / result["gradcam_ms"], 3)
    result["blur_over_no_blur"] = round(result["aha_t0_ms"] / result["aha_t0_no_blur_ms"], 3)
    result["t3_ms_per_step"] = round((result["aha_t3_ms"] - result["aha_t0_ms"]) / 3, 1)
    if "aha_t3_default_grid_ms" in result:
        result["t3_over_default_grid"] = round(result["aha_t3_ms"] / result["aha_t3_default_grid_ms"], 3)
    result.update(images=len(images), repeats=repeats, refinement=settings, threads=torch.get_num_threads())
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="bloodmnist-vit,bloodmnist-cnn,efficientnet-lite0")
    parser.add_argument("--data", default=None)
    parser.add_argument("--images", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    report = {}
    for name in args.models.split(","):
        report[name] = time_model(name, args.data, args.images, args.repeats)
        print(name, json.dumps(report[name]), flush=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
