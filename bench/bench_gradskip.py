"""GradSkip benchmark (issue #3; spec: docs/methods.md sections 1 and 3).

    python bench/bench_gradskip.py --model bloodmnist-vit --data ../shared/data/bloodmnist/64/test \
        --limit 500 --out bench/results/gradskip-bloodmnist-vit.json

Measures, on one model and one data set, in one run:
1. the evaluation table (deletion, insertion, ins-del; lower deletion / higher insertion are better) for
   gradskip, chefer, rollout, gradcam, random through `explainers.evaluate.evaluate_methods` (the protocol
   `python -m explainers evaluate` uses);
2. the paper's ablations on the same images and targets: alpha in {0, 0.25, 0.5, 0.75, 1}, and keeping only
   the 25% sparsest vs the 25% least sparse heads (one GradSkip capture per batch serves all of them:
   `GradSkipState.map` needs no model pass);
3. cost: FLOPs per map (torch.utils.flop_counter, batch 1) and time per map (median of interleaved repeats,
   batch 1 and batch `--batch-size`) as ratios to Grad-CAM on the same model in the same run, with the
   forward + full backward floor for context; the target is <= 1.5x Grad-CAM's time;
4. FLOPs per map on vit_base_patch16_224 with random weights (the paper: 69.39 GFLOPs);
5. the model-randomisation sanity check (Adebayo et al. 2018): Spearman correlation of each map with the
   original as layers are re-initialised from the top; a faithful method's maps must decorrelate.

`--model random-vit-tiny` uses bloodmnist-vit's architecture with random weights (for checking the script
before the trained weights exist). Timing on a shared CPU is noisy: `--threads` (default 1) pins torch's
thread count so the ratios are stable.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from explainers.data import mean_colour, open_dataset  # noqa: E402
from explainers.evaluate import evaluate_methods, format_table  # noqa: E402
from explainers.statistics import compare_methods, format_comparison  # noqa: E402
from explainers.images import prepare_image  # noqa: E402
from explainers.methods import get_method  # noqa: E402
from explainers.methods.gradskip import GradSkip  # noqa: E402
from explainers.metrics import deletion_insertion, randomization_sanity_check  # noqa: E402
from explainers.models import bundle_from_timm, load_model  # noqa: E402

METHODS = ("gradskip", "chefer", "rollout", "gradcam", "random")
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
PAPER_GFLOPS = 69.39


def build_bundle(name: str, data: str, device: str):
    if name == "random-vit-tiny":  # bloodmnist-vit's architecture (training preset "vit"), random weights
        import timm

        from explainers.training import PRESETS

        timm_name, kwargs = PRESETS["vit"]
        dataset = open_dataset(data)
        classes = len(set(dataset.labels))
        torch.manual_seed(0)
        network = timm.create_model(timm_name, pretrained=False, num_classes=classes,
                                    **{k: v for k, v in kwargs.items() if k != "drop_path_rate"})
        size = kwargs["img_size"]
        return bundle_from_timm(name, network, input_size=(size, size),
                                reference_color=mean_colour(dataset, limit=500)).to(device)
    return load_model(name, device=device)


def load_images(bundle, data: str, limit: int | None):
    dataset = open_dataset(data, limit=limit)
    images = [prepare_image(dataset.image(i), bundle.input_size, bundle.crop_pct, bundle.interpolation)[0][0]
              for i in range(len(dataset))]
    return torch.stack(images).to(bundle.device), torch.tensor(dataset.labels[: len(images)])


def ablations(bundle, images, batch_size: int, steps: int, reference: str) -> dict:
    """Alpha and head-selection ablations: one GradSkip capture per batch, every variant recombined from it."""
    variants = {f"alpha={alpha:g}": {"alpha": alpha} for alpha in ALPHAS}
    variants["sparsest 25% heads"] = {"alpha": 0.5, "head_selection": "sparsest", "head_fraction": 0.25}
    variants["least sparse 25% heads"] = {"alpha": 0.5, "head_selection": "least_sparse", "head_fraction": 0.25}
    scores = {label: {"deletion": [], "insertion": []} for label in variants}
    method = GradSkip()
    for start in range(0, images.shape[0], batch_size):
        batch = images[start:start + batch_size]
        with torch.no_grad():
            targets = bundle(batch).argmax(dim=1)
        state = method.prepare(bundle, batch, targets)
        for label, options in variants.items():
            options = dict(options)
            maps = state.map(options.pop("alpha"), **options)
            curves = deletion_insertion(bundle, batch, maps, targets, steps=steps, reference=reference)
            scores[label]["deletion"].extend(curves.deletion_auc.tolist())
            scores[label]["insertion"].extend(curves.insertion_auc.tolist())
    table = {}
    for label, values in scores.items():
        deletion, insertion = float(np.mean(values["deletion"])), float(np.mean(values["insertion"]))
        table[label] = {"deletion_auc": deletion, "insertion_auc": insertion, "ins_minus_del": insertion - deletion,
                        "options": variants[label]}
    return table


def flops_of(function) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        function()
    return int(counter.get_total_flops())


def floor_pass(bundle, images, targets):
    """Forward + full backward (parameters' gradients included): the floor of a one-pass gradient method."""
    with torch.enable_grad():
        logits = bundle(images.detach().requires_grad_(True))
        logits.gather(1, targets.view(-1, 1)).sum().backward()
    bundle.network.zero_grad(set_to_none=True)


def cost(bundle, images, batch_size: int, repeats: int) -> dict:
    """FLOPs and time per map, GradSkip vs Grad-CAM (and the floor), on the same model in the same run."""
    gradskip, gradcam = GradSkip(), get_method("gradcam")
    runs = {
        "gradskip": lambda x, t: gradskip.prepare(bundle, x, t).map(0.5),
        "gradcam": lambda x, t: gradcam.attribute(bundle, x, t),
        "forward+backward": lambda x, t: floor_pass(bundle, x, t),
        "gradskip map only (new alpha)": None,
    }
    result = {"flops_per_map": {}, "ms_per_map": {}}
    one = images[:1]
    with torch.no_grad():
        one_target = bundle(one).argmax(dim=1)
    state = gradskip.prepare(bundle, one, one_target)
    runs["gradskip map only (new alpha)"] = lambda x, t: state.map(0.25)
    for label, run in runs.items():
        result["flops_per_map"][label] = flops_of(lambda: run(one, one_target))
    for size in sorted({1, min(batch_size, images.shape[0])}):
        batch = images[:size]
        with torch.no_grad():
            targets = bundle(batch).argmax(dim=1)
        if size > 1:
            state_batch = gradskip.prepare(bundle, batch, targets)
            runs["gradskip map only (new alpha)"] = lambda x, t: state_batch.map(0.25)
        else:
            runs["gradskip map only (new alpha)"] = lambda x, t: state.map(0.25)
        times = {label: [] for label in runs}
        for label, run in runs.items():  # warm-up
            run(batch, targets)
        for _ in range(repeats):  # interleaved, so that load changes hit every method alike
            for label, run in runs.items():
                started = time.perf_counter()
                run(batch, targets)
                times[label].append((time.perf_counter() - started) / size)
        result["ms_per_map"][f"batch {size}"] = {label: 1000 * statistics.median(v) for label, v in times.items()}
    reference_flops = result["flops_per_map"]["gradcam"]
    result["flops_ratio_to_gradcam"] = {k: v / reference_flops for k, v in result["flops_per_map"].items()}
    result["time_ratio_to_gradcam"] = {
        batch: {k: v / row["gradcam"] for k, v in row.items()} for batch, row in result["ms_per_map"].items()}
    result["gflops_per_map"] = {k: v / 1e9 for k, v in result["flops_per_map"].items()}
    return result


def vit_base_flops(repeats: int) -> dict:
    """FLOPs per map on vit_base_patch16_224 with random weights, batch 1, 224 x 224 (the paper: 69.39 GFLOPs)."""
    import timm

    torch.manual_seed(0)
    bundle = bundle_from_timm("vit_base_patch16_224 (random)", timm.create_model("vit_base_patch16_224",
                                                                                 pretrained=False))
    image = torch.rand(1, 3, 224, 224)
    target = torch.tensor([0])
    gradskip, gradcam = GradSkip(), get_method("gradcam")
    flops = {
        "gradskip": flops_of(lambda: gradskip.prepare(bundle, image, target).map(0.5)),
        "gradcam": flops_of(lambda: gradcam.attribute(bundle, image, target)),
        "forward": flops_of(lambda: torch.no_grad()(bundle)(image)),
        "forward+backward": flops_of(lambda: floor_pass(bundle, image, target)),
    }
    times = {"gradskip": [], "gradcam": []}
    for _ in range(repeats):
        for label, run in (("gradskip", lambda: gradskip.prepare(bundle, image, target).map(0.5)),
                           ("gradcam", lambda: gradcam.attribute(bundle, image, target))):
            started = time.perf_counter()
            run()
            times[label].append(time.perf_counter() - started)
    ms = {k: 1000 * statistics.median(v) for k, v in times.items()} if repeats else {}
    return {"gflops_per_map": {k: v / 1e9 for k, v in flops.items()},
            "gradskip_vs_paper": flops["gradskip"] / 1e9 / PAPER_GFLOPS, "paper_gflops": PAPER_GFLOPS,
            "ms_per_map": ms, "time_ratio_gradskip_to_gradcam": (ms["gradskip"] / ms["gradcam"]) if ms else None}


def sanity(bundle, images, count: int) -> dict:
    images = images[:count]
    with torch.no_grad():
        targets = bundle(images).argmax(dim=1)
    report = {}
    for name in ("gradskip", "gradcam"):
        rows = randomization_sanity_check(bundle, get_method(name), images, targets)
        report[name] = {"layers": [{"layer": layer or "(embeddings)", "spearman": rho} for layer, rho in rows],
                        "final_spearman": rows[-1][1], "min_spearman": min(r for _, r in rows)}
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bloodmnist-vit", help="a zoo name, or random-vit-tiny")
    parser.add_argument("--data", default=str(ROOT.parent / "shared/data/bloodmnist/64/test"))
    parser.add_argument("--limit", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--reference", default="mean")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: leave torch's default)")
    parser.add_argument("--repeats", type=int, default=15, help="timing repeats per method")
    parser.add_argument("--sanity-images", type=int, default=16)
    parser.add_argument("--vit-base-repeats", type=int, default=3, help="timing repeats on ViT-B/16 (0: FLOPs only)")
    parser.add_argument("--skip", default="", help="comma list of parts to skip: table,ablations,cost,vit_base,sanity")
    parser.add_argument("--out", default=None, help="JSON report path")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    skip = set(filter(None, args.skip.split(",")))

    bundle = build_bundle(args.model, args.data, args.device)
    images, _labels = load_images(bundle, args.data, args.limit)
    report = {"model": args.model, "data": args.data, "limit": args.limit, "n_images": int(images.shape[0]),
              "device": args.device, "threads": torch.get_num_threads(), "torch": torch.__version__,
              "python": platform.python_version(), "gradskip_defaults": GradSkip().options}
    started = time.perf_counter()

    if "table" not in skip:
        table = evaluate_methods(bundle, args.data, list(METHODS), limit=args.limit, steps=args.steps,
                                 reference=args.reference, batch_size=args.batch_size, progress=False)
        report["table"] = table
        print(format_table(table), flush=True)
        # paired bootstrap intervals of GradSkip minus each other method on the same images
        report["comparisons"] = [compare_methods(table, "gradskip", other) for other in table["methods"]
                                 if other != "gradskip"]
        for comparison in report["comparisons"]:
            print(format_comparison(comparison), flush=True)
    if "ablations" not in skip:
        report["ablations"] = ablations(bundle, images, args.batch_size, args.steps, args.reference)
        print("\nablations (GradSkip, same images and targets)")
        for label, row in report["ablations"].items():
            print(f"  {label:<26} deletion {row['deletion_auc']:.4f}  insertion {row['insertion_auc']:.4f}  "
                  f"ins-del {row['ins_minus_del']:.4f}", flush=True)
    if "cost" not in skip:
        report["cost"] = cost(bundle, images, args.batch_size, args.repeats)
        print("\ncost per map on", args.model)
        for label, gflops in report["cost"]["gflops_per_map"].items():
            print(f"  {label:<32} {gflops:.4f} GFLOPs ({report['cost']['flops_ratio_to_gradcam'][label]:.2f}x Grad-CAM)")
        for batch, row in report["cost"]["ms_per_map"].items():
            ratios = report["cost"]["time_ratio_to_gradcam"][batch]
            print(f"  {batch}: " + ", ".join(f"{k} {v:.2f} ms ({ratios[k]:.2f}x)" for k, v in row.items()), flush=True)
    if "vit_base" not in skip:
        report["vit_base_random"] = vit_base_flops(args.vit_base_repeats)
        vb = report["vit_base_random"]
        print("\nvit_base_patch16_224 (random weights), per map: " + ", ".join(
            f"{k} {v:.2f} GFLOPs" for k, v in vb["gflops_per_map"].items())
            + f"; GradSkip / paper's {PAPER_GFLOPS} = {vb['gradskip_vs_paper']:.3f}"
            + (f"; time GradSkip/Grad-CAM {vb['time_ratio_gradskip_to_gradcam']:.2f}x" if vb["ms_per_map"] else ""),
            flush=True)
    if "sanity" not in skip:
        report["sanity"] = sanity(bundle, images, args.sanity_images)
        print("\nmodel randomisation (Spearman with the original map; cascading from the top)")
        for name, row in report["sanity"].items():
            picks = row["layers"][:: max(1, len(row["layers"]) // 6)]
            print(f"  {name}: " + ", ".join(f"{p['layer']} {p['spearman']:.3f}" for p in picks)
                  + f"; all layers {row['final_spearman']:.3f}", flush=True)
    report["seconds"] = time.perf_counter() - started
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2, default=str))
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
