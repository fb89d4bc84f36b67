"""Benchmark AHA against the other methods (issue #4): deletion / insertion with the one evaluation engine
(methods.md section 1: 21 fractions, mean-colour reference, softmax of the predicted class, trapezoid AUC)
and speed ratios measured in one run.

    python bench/studies/bench_aha.py --out /tmp/bench_aha.json
    python bench/studies/bench_aha.py --models bloodmnist-cnn --limit 500 --t3-limit 100 --rise-limit 16

Per model, three tiers on the first N test images each (paired comparisons within a tier): the fast
methods (aha T=0, gradcam, chefer / gradskip where they apply, random) on `--limit` images; AHA T=3 with
T=0 on `--t3-limit`; RISE (4000 masks) with AHA T=0 and Grad-CAM on `--rise-limit` (RISE costs 4000
forward passes per image: on a 2-core CPU only a few images). Speed: batch-1 time per image, median over
`--timing-images` images, methods interleaved in one process (AHA T=0 vs a plain forward and Grad-CAM,
RISE vs AHA T=0 on `--rise-timing-images`).
Lower deletion is better, higher insertion is better.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch


from explainers.evaluate import evaluate_methods
from explainers.statistics import compare_methods, format_comparison
from explainers.methods import METHODS, get_method
from explainers.models import load_model

DATA = {
    "bloodmnist-vit": "../shared/data/bloodmnist/64/test",
    "bloodmnist-cnn": "../shared/data/bloodmnist/64/test",
    "efficientnet-lite0": "../shared/data/imagenet-samples",
}
LIMITS = {"bloodmnist-vit": 500, "bloodmnist-cnn": 500, "efficientnet-lite0": 200}
T3_LIMITS = {"bloodmnist-vit": 100, "bloodmnist-cnn": 100, "efficientnet-lite0": 8}
RISE_LIMITS = {"bloodmnist-vit": 16, "bloodmnist-cnn": 16, "efficientnet-lite0": 4}
PER_IMAGE_LIMITS = {"bloodmnist-vit": 64, "bloodmnist-cnn": 100, "efficientnet-lite0": 8}


def applicable(bundle, name: str) -> bool:
    if name not in METHODS:
        return False
    try:
        get_method(name).check(bundle)
        return True
    except Exception:  # MethodNotApplicable and friends
        return False


def load_images(bundle, data: str, count: int) -> torch.Tensor:
    from explainers.data import open_dataset
    from explainers.images import prepare_image

    dataset = open_dataset(data, split="test", limit=count)
    return torch.cat([prepare_image(dataset.image(i), bundle.input_size, bundle.crop_pct, bundle.interpolation)[0]
                      for i in range(len(dataset))])


def timing(bundle, images: torch.Tensor, rise_images: int, threads: int | None = 1, repeats: int = 3) -> dict:
    """Batch-1 milliseconds per image: for each image the best of `repeats` runs (robust to other processes
    on a shared CPU), then the median over images; methods interleaved image by image, one thread count."""
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        methods = {"aha": get_method("aha"), "gradcam": get_method("gradcam"), "rise": get_method("rise")}
        times = {name: [] for name in ("forward", *methods, "aha_runner_up")}
        for index in range(images.shape[0]):
            x = images[index:index + 1]
            with torch.no_grad():
                top2 = bundle(x).topk(2, dim=1).indices
            target, runner_up = top2[:, 0], top2[:, 1]
            runs = {"forward": lambda: bundle(x)}  # a plain classifier forward: AHA T=0 should cost about this
            runs.update({name: (lambda m=method: m.attribute(bundle, x, target)) for name, method in methods.items()})
            # another class than the prediction (an explainer's class contrast is computed only then)
            runs["aha_runner_up"] = lambda: methods["aha"].attribute(bundle, x, runner_up)
            for name, run in runs.items():
                if name == "rise" and index >= rise_images:
                    continue
                if index == 0:
                    with torch.no_grad() if name == "forward" else torch.enable_grad():
                        run()  # warm-up
                best = float("inf")
                for _ in range(1 if name == "rise" else repeats):
                    started = time.perf_counter()
                    with torch.no_grad() if name == "forward" else torch.enable_grad():
                        run()
                    best = min(best, 1000 * (time.perf_counter() - started))
                times[name].append(best)
        result = {f"{name}_ms": statistics.median(values) for name, values in times.items() if values}
        result["images"] = {name: len(values) for name, values in times.items()}
        result["aha_over_gradcam"] = result["aha_ms"] / result["gradcam_ms"]
        result["aha_runner_up_over_gradcam"] = result["aha_runner_up_ms"] / result["gradcam_ms"]
        if "rise_ms" in result:  # --rise-timing-images 0 skips RISE (minutes per photo on a 224 px model)
            result["rise_over_aha"] = result["rise_ms"] / result["aha_ms"]
        result["aha_over_forward"] = result["aha_ms"] / result["forward_ms"]
        result["threads"] = torch.get_num_threads()
        return result
    finally:
        torch.set_num_threads(previous)


def bench_model(name: str, args) -> dict:
    bundle = load_model(name)
    data = args.data or DATA[name]
    limits = {"all": args.limit or LIMITS[name], "t3": args.t3_limit or T3_LIMITS[name],
              "rise": args.rise_limit or RISE_LIMITS[name],
              "per_image": args.per_image_limit or PER_IMAGE_LIMITS[name]}
    baselines = ["gradcam"] + [m for m in ("chefer", "gradskip", "rollout") if applicable(bundle, m)]
    tiers = {
        "all": ["aha"] + baselines + ["random"],
        # T=3 with T=0 and the baselines on the same images (the best baseline is read from "all")
        "t3": ["aha", "aha:refine_steps=3"] + baselines,
        # AHA as on a model with no trained explainer (the shipped one is not used), next to the baselines
        "per_image": ["aha:mode=per-image", "aha"] + baselines,
        "rise": ["aha", "gradcam", "rise"],
    }
    result = {"model": name, "data": data, "limits": limits}
    for tier, methods in tiers.items():
        if not limits[tier] or tier not in args.tiers:
            continue
        started = time.time()
        result[tier] = evaluate_methods(bundle, data, methods, split="test", limit=limits[tier],
                                        batch_size=args.batch_size, progress=not args.quiet)
        result[f"{tier}_seconds"] = round(time.time() - started, 1)
        # paired bootstrap intervals of each AHA variant minus each other method on the same images
        variants = [m for m in result[tier]["methods"] if m.startswith("aha")]
        result[f"{tier}_comparisons"] = [compare_methods(result[tier], variant, other) for variant in variants
                                         for other in result[tier]["methods"] if other != variant]
        for comparison in result[f"{tier}_comparisons"]:
            print(format_comparison(comparison), file=sys.stderr, flush=True)
        print(f"{name} {tier}: {json.dumps({k: (round(v['deletion_auc'], 4), round(v['insertion_auc'], 4)) for k, v in result[tier]['methods'].items()})}",
              file=sys.stderr, flush=True)
    if "timing" in args.tiers:
        images = load_images(bundle, data, args.timing_images)
        result["timing"] = timing(bundle, images, args.rise_timing_images, threads=args.timing_threads)
        print(f"{name} timing: {json.dumps(result['timing'])}", file=sys.stderr, flush=True)
    return result


def table(results: list) -> str:
    lines = ["| model | images | method | deletion AUC (lower better) | insertion AUC (higher better) | ins - del | ms/image |",
             "|---|---|---|---|---|---|---|"]
    for result in results:
        for part in ("all", "t3", "per_image", "rise"):
            report = result.get(part)
            if not report:
                continue
            for label, row in report["methods"].items():
                lines.append(f"| {result['model']} | {report['n_images']} | {label} | {row['deletion_auc']:.4f} | "
                             f"{row['insertion_auc']:.4f} | {row['ins_minus_del']:.4f} | {row['ms_per_image']:.1f} |")
    lines.append("")
    lines.append("| model | forward ms | AHA T=0 ms | Grad-CAM ms | RISE (4000) ms | AHA / forward | AHA / Grad-CAM (<= 1.2) "
                 "| RISE / AHA (>= 100) |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for result in [r for r in results if "timing" in r]:
        t = result["timing"]
        rise, ratio = (f"{t['rise_ms']:.0f}", f"{t['rise_over_aha']:.0f}") if "rise_ms" in t else ("not run", "-")
        lines.append(f"| {result['model']} | {t['forward_ms']:.1f} | {t['aha_ms']:.1f} | {t['gradcam_ms']:.1f} | "
                     f"{rise} | {t['aha_over_forward']:.2f} | {t['aha_over_gradcam']:.2f} | {ratio} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bloodmnist-vit,bloodmnist-cnn,efficientnet-lite0")
    parser.add_argument("--data", default=None, help="override the data set (one model at a time)")
    parser.add_argument("--limit", type=int, default=None, help="images for the fast methods")
    parser.add_argument("--t3-limit", type=int, default=None, help="images for AHA T=3 (paired with T=0)")
    parser.add_argument("--rise-limit", type=int, default=None, help="images for RISE (paired with AHA, Grad-CAM)")
    parser.add_argument("--timing-images", type=int, default=8)
    parser.add_argument("--rise-timing-images", type=int, default=2)
    parser.add_argument("--timing-threads", type=int, default=1, help="torch threads for the timing (0: leave)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--per-image-limit", type=int, default=None, help="images for AHA's per-image mode")
    parser.add_argument("--tiers", default="all,t3,per_image,rise,timing", type=lambda s: s.split(","),
                        help="which parts to run (default all,t3,rise,timing)")
    parser.add_argument("--out", default=None, help="JSON results file")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    results = []
    for name in [m for m in args.models.split(",") if m]:
        results.append(bench_model(name, args))
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=2))
        print(f"done {name}", file=sys.stderr)
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
