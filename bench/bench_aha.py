"""Benchmark AHA against the other methods (issue #4): deletion / insertion with the one evaluation engine
(methods.md section 1: 21 fractions, mean-colour reference, softmax of the predicted class, trapezoid AUC)
and speed ratios measured in one run.

    python bench/bench_aha.py --out /tmp/bench_aha.json
    python bench/bench_aha.py --models bloodmnist-cnn --limit 500 --slow-limit 100

Per model: the fast methods (aha T=0, gradcam, chefer / gradskip where they apply, random, and aha T=3
where `--t3-on-all` holds for the model) on `--limit` images; the slow ones (RISE with 4000 masks, and aha
T=3 otherwise) on the first `--slow-limit` images, re-evaluated there with aha T=0 and gradcam so that
every comparison is paired. Speed: batch-1 time per image, median over `--timing-images` images, methods
interleaved in one process (AHA T=0 vs Grad-CAM, RISE vs AHA T=0).
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from explainers.evaluate import evaluate_methods  # noqa: E402
from explainers.methods import METHODS, get_method  # noqa: E402
from explainers.models import load_model  # noqa: E402

DATA = {
    "bloodmnist-vit": "../shared/data/bloodmnist/64/test",
    "bloodmnist-cnn": "../shared/data/bloodmnist/64/test",
    "efficientnet-lite0": "../shared/data/imagenet-samples",
}
LIMITS = {"bloodmnist-vit": 500, "bloodmnist-cnn": 500, "efficientnet-lite0": 200}
SLOW_LIMITS = {"bloodmnist-vit": 100, "bloodmnist-cnn": 100, "efficientnet-lite0": 12}
T3_ON_ALL = {"bloodmnist-vit": True, "bloodmnist-cnn": True, "efficientnet-lite0": False}


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


def timing(bundle, images: torch.Tensor, rise_images: int) -> dict:
    """Batch-1 milliseconds per image (median), methods interleaved image by image."""
    methods = {"aha": get_method("aha"), "gradcam": get_method("gradcam"), "rise": get_method("rise")}
    times = {name: [] for name in methods}
    times["forward"] = []
    for index in range(images.shape[0]):
        x = images[index:index + 1]
        with torch.no_grad():
            target = bundle(x).argmax(1)
            started = time.perf_counter()
            bundle(x)  # one plain classifier forward: AHA T=0 should cost about this
            times["forward"].append(1000 * (time.perf_counter() - started))
        for name, method in methods.items():
            if name == "rise" and index >= rise_images:
                continue
            if index == 0:
                method.attribute(bundle, x, target)  # warm-up
            started = time.perf_counter()
            method.attribute(bundle, x, target)
            times[name].append(1000 * (time.perf_counter() - started))
    result = {f"{name}_ms": statistics.median(values) for name, values in times.items() if values}
    result["images"] = {name: len(values) for name, values in times.items()}
    result["aha_over_gradcam"] = result["aha_ms"] / result["gradcam_ms"]
    result["rise_over_aha"] = result["rise_ms"] / result["aha_ms"]
    result["aha_over_forward"] = result["aha_ms"] / result["forward_ms"]
    result["threads"] = torch.get_num_threads()
    return result


def bench_model(name: str, args) -> dict:
    bundle = load_model(name)
    data = getattr(args, "data", None) or DATA[name]
    limit = args.limit or LIMITS[name]
    slow_limit = args.slow_limit or SLOW_LIMITS[name]
    t3_on_all = T3_ON_ALL[name] if args.t3_on_all is None else args.t3_on_all
    fast = ["aha"] + (["aha:refine_steps=3"] if t3_on_all else []) + ["gradcam"]
    fast += [m for m in ("chefer", "gradskip") if applicable(bundle, m)] + ["random"]
    slow = ["aha", "gradcam", "rise"] + ([] if t3_on_all else ["aha:refine_steps=3"])
    result = {"model": name, "data": data}
    started = time.time()
    result["all"] = evaluate_methods(bundle, data, fast, split="test", limit=limit, batch_size=args.batch_size,
                                     progress=not args.quiet)
    result["all_seconds"] = round(time.time() - started, 1)
    if slow_limit:
        started = time.time()
        result["subset"] = evaluate_methods(bundle, data, slow, split="test", limit=slow_limit,
                                            batch_size=args.batch_size, progress=not args.quiet)
        result["subset_seconds"] = round(time.time() - started, 1)
    images = load_images(bundle, data, args.timing_images)
    result["timing"] = timing(bundle, images, args.rise_timing_images)
    return result


def table(results: list) -> str:
    lines = ["| model | images | method | deletion AUC (lower better) | insertion AUC (higher better) | ins - del | ms/image |",
             "|---|---|---|---|---|---|---|"]
    for result in results:
        for part in ("all", "subset"):
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
    for result in results:
        t = result["timing"]
        lines.append(f"| {result['model']} | {t['forward_ms']:.1f} | {t['aha_ms']:.1f} | {t['gradcam_ms']:.1f} | "
                     f"{t['rise_ms']:.0f} | {t['aha_over_forward']:.2f} | {t['aha_over_gradcam']:.2f} | "
                     f"{t['rise_over_aha']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bloodmnist-vit,bloodmnist-cnn,efficientnet-lite0")
    parser.add_argument("--data", default=None, help="override the data set (one model at a time)")
    parser.add_argument("--limit", type=int, default=None, help="images for the fast methods")
    parser.add_argument("--slow-limit", type=int, default=None, help="images for RISE (and AHA T=3 on big models)")
    parser.add_argument("--t3-on-all", type=lambda s: s.lower() in ("1", "true", "yes"), default=None)
    parser.add_argument("--timing-images", type=int, default=8)
    parser.add_argument("--rise-timing-images", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
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
