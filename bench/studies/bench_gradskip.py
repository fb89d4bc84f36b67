"""GradSkip benchmark (issues #3 and #15; spec: docs/methods.md sections 1 and 3).

    # choose the W~ form on validation cells (never the test split):
    python bench/studies/bench_gradskip.py --parts weightings --data ../shared/data/bloodmnist/64/val --limit 256 \
        --out bench/results/gradskip-weightings-val.json
    # the chosen default against rollout and Chefer on test cells, paired intervals; cost in the same run:
    python bench/studies/bench_gradskip.py --parts paired,cost --data ../shared/data/bloodmnist/64/test --limit 500 \
        --out bench/results/gradskip-test.json

Parts (`--parts`, comma list; `--skip` removes from it):
- `weightings`: deletion, insertion and ins-del (lower deletion / higher insertion are better), each with a
  seeded 95% bootstrap interval over the images, for every GradSkip `attention_weighting` x alpha in
  {0, 0.5, 1} (one capture per batch serves them all: `GradSkipState.map` needs no model pass), plus rollout,
  Chefer and Grad-CAM on the same images and targets (the predicted classes), with ms per map;
- `paired`: GradSkip with its defaults vs rollout and Chefer on the same images: per-method intervals and
  paired bootstrap intervals of the differences (GradSkip - peer);
- `cost`: time per map (median of interleaved repeats, batch 1 and `--batch-size`) of GradSkip against its
  floor (one forward + one backward to the activations through every block, no parameter gradients), the
  forward + full backward with parameter gradients, our Grad-CAM, pytorch-grad-cam's GradCAM on the same ViT
  (with its documented ViT reshape_transform) and Chefer before (`.backward()`) / after (`autograd.grad`);
  FLOPs per map (torch.utils.flop_counter, batch 1);
- `table`: `explainers.evaluate.evaluate_methods` for gradskip, chefer, rollout, gradcam, random;
- `ablations`: alpha in {0, 0.25, 0.5, 0.75, 1} and the 25% sparsest / least sparse heads;
- `vit_base`: FLOPs per map on vit_base_patch16_224 with random weights (the paper: 69.39 GFLOPs);
- `sanity`: model randomisation (Adebayo et al. 2018), Spearman with the original map as layers reset.

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

ROOT = Path(__file__).resolve().parents[2]

from explainers.data import mean_colour, open_dataset
from explainers.evaluate import build_methods, evaluate_methods, format_table
from explainers.statistics import compare_methods, format_comparison
from explainers.images import prepare_image
from explainers.methods import get_method
from explainers.methods.gradskip import ATTENTION_WEIGHTINGS, GradSkip, capture
from explainers.metrics import deletion_insertion
from explainers.sanity import randomization_sanity_check
from explainers.models import bundle_from_timm, load_model

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


WEIGHTING_ALPHAS = (0.0, 0.5, 1.0)
PEERS = ("rollout", "chefer", "gradcam")


# --- intervals ------------------------------------------------------------------------------------
def bootstrap_interval(values, *, resamples: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """Mean of per-image values with a seeded percentile bootstrap interval (images resampled with replacement)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("bootstrap_interval needs at least one value")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(resamples, values.size))].mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return {"mean": float(values.mean()), "low": float(low), "high": float(high), "level": level,
            "resamples": resamples, "seed": seed, "n": int(values.size)}


def paired_interval(a, b, **kwargs) -> dict:
    """Mean of a - b over the same images with a bootstrap interval that resamples the image pairs jointly."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired_interval needs scores on the same images, got {a.shape} and {b.shape}")
    return bootstrap_interval(a - b, **kwargs)


def summarize(scores: dict, seconds: float, n: int, **kwargs) -> dict:
    """Per-method row: deletion, insertion and ins-del, each with its interval, and ms per map."""
    deletion, insertion = np.asarray(scores["deletion"]), np.asarray(scores["insertion"])
    return {"deletion": bootstrap_interval(deletion, **kwargs), "insertion": bootstrap_interval(insertion, **kwargs),
            "ins_minus_del": bootstrap_interval(insertion - deletion, **kwargs), "ms_per_map": 1000 * seconds / n}


def _fmt(row: dict) -> str:
    return f"{row['mean']:.4f} [{row['low']:.4f}, {row['high']:.4f}]"


def print_rows(rows: dict) -> None:
    print(f"  {'variant':<34}{'deletion':>26}{'insertion':>26}{'ins-del':>26}{'ms/map':>9}")
    for label, row in rows.items():
        print(f"  {label:<34}{_fmt(row['deletion']):>26}{_fmt(row['insertion']):>26}"
              f"{_fmt(row['ins_minus_del']):>26}{row['ms_per_map']:>9.2f}", flush=True)


def _score(bundle, batch, maps, targets, steps, reference, into: dict) -> None:
    curves = deletion_insertion(bundle, batch, maps, targets, steps=steps, reference=reference)
    into["deletion"].extend(curves.deletion_auc.tolist())
    into["insertion"].extend(curves.insertion_auc.tolist())


def _timed(function):
    started = time.perf_counter()
    value = function()
    return value, time.perf_counter() - started


def parse_gates(text: str) -> list:
    """'3:2,2:1.5:0.5,3:1.5:1:attention' -> [(3.0, 2.0, 1.0, 'none'), (2.0, 1.5, 0.5, 'none'),
    (3.0, 1.5, 1.0, 'attention')]: class_gated (gate_sigma, gate_power, gate_knee, gate_reference) to add (power 1,
    knee 1 and reference "none" when left out)."""
    gates = []
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        sigma, power, knee, reference = (item.split(":") + ["", "", ""])[:4]
        gates.append((float(sigma), float(power or 1.0), float(knee or 1.0), reference or "none"))
    return gates


def gate_variants(gates, alpha: float = 0.5) -> dict:
    """Labelled GradSkip options of the class_gated form for every (gate_sigma, gate_power, gate_knee,
    gate_reference)."""
    return {f"gradskip class_gated sigma={sigma:g} power={power:g}" + (f" knee={knee:g}" if knee != 1 else "")
            + (f" reference={reference}" if reference != "none" else "") + f" alpha={alpha:g}":
            {"attention_weighting": "class_gated", "gate_sigma": sigma, "gate_power": power, "gate_knee": knee,
             "gate_reference": reference, "alpha": alpha}
            for sigma, power, knee, reference in gates}


def weightings(bundle, images, batch_size: int, steps: int, reference: str, peers=PEERS, gates=(),
               forms=ATTENTION_WEIGHTINGS, alphas=WEIGHTING_ALPHAS) -> dict:
    """Every attention_weighting x alpha from one GradSkip capture per batch, plus the peers, same images/targets.

    ms per map of a GradSkip variant = the capture's time per image + that variant's own map time per image
    (what a single run of that variant costs)."""
    variants = {f"gradskip {w} alpha={alpha:g}": {"attention_weighting": w, "alpha": alpha}
                for w in forms for alpha in alphas}
    variants.update(gate_variants(gates))
    labels = list(variants) + list(peers)
    scores = {label: {"deletion": [], "insertion": []} for label in labels}
    seconds = dict.fromkeys(labels, 0.0)
    capture_seconds = 0.0
    method = GradSkip()
    peer_methods = {name: get_method(name) for name in peers}
    all_targets = []
    for start in range(0, images.shape[0], batch_size):
        batch = images[start:start + batch_size]
        with torch.no_grad():
            targets = bundle(batch).argmax(dim=1)
        all_targets.extend(targets.tolist())
        state, elapsed = _timed(lambda: method.prepare(bundle, batch, targets))
        capture_seconds += elapsed
        for label, options in variants.items():
            options = dict(options)
            maps, elapsed = _timed(lambda: state.map(options.pop("alpha"), **options))
            seconds[label] += elapsed
            _score(bundle, batch, maps, targets, steps, reference, scores[label])
        for name, peer in peer_methods.items():
            maps, elapsed = _timed(lambda: peer.attribute(bundle, batch, targets).detach())
            seconds[name] += elapsed
            _score(bundle, batch, maps, targets, steps, reference, scores[name])
        print(f"  weightings: {min(start + batch_size, images.shape[0])}/{images.shape[0]} images", flush=True)
    n = images.shape[0]
    rows = {}
    for label in labels:
        extra = capture_seconds if label in variants else 0.0
        rows[label] = summarize(scores[label], seconds[label] + extra, n)
        rows[label]["options"] = variants.get(label, {})
    return {"rows": rows, "targets": all_targets, "capture_ms_per_image": 1000 * capture_seconds / n,
            "per_image": {label: {k: [round(v, 6) for v in vals] for k, vals in s.items()}
                          for label, s in scores.items()}}


def paired(bundle, images, batch_size: int, steps: int, reference: str, options: dict | None = None,
           peers=("rollout", "chefer")) -> dict:
    """GradSkip (its defaults, or `options`) vs the peers on the same images and targets, paired intervals.
    A peer is a method spec ('name' or 'name:key=value', e.g. GradSkip with another option)."""
    methods = {"gradskip": GradSkip(**(options or {}))}
    methods.update(build_methods(bundle, peers))
    scores = {label: {"deletion": [], "insertion": []} for label in methods}
    seconds = dict.fromkeys(methods, 0.0)
    for start in range(0, images.shape[0], batch_size):
        batch = images[start:start + batch_size]
        with torch.no_grad():
            targets = bundle(batch).argmax(dim=1)
        for label, method in methods.items():
            maps, elapsed = _timed(lambda: method.attribute(bundle, batch, targets).detach())
            seconds[label] += elapsed
            _score(bundle, batch, maps, targets, steps, reference, scores[label])
        if (start // batch_size) % 8 == 0:
            print(f"  paired: {min(start + batch_size, images.shape[0])}/{images.shape[0]} images", flush=True)
    n = images.shape[0]
    rows = {label: summarize(scores[label], seconds[label], n) for label in methods}
    rows["gradskip"]["options"] = methods["gradskip"].options
    differences = {}
    for peer in peers:
        ours, theirs = scores["gradskip"], scores[peer]
        differences[f"gradskip - {peer}"] = {
            "deletion": paired_interval(ours["deletion"], theirs["deletion"]),
            "insertion": paired_interval(ours["insertion"], theirs["insertion"]),
            "ins_minus_del": paired_interval(np.subtract(ours["insertion"], ours["deletion"]),
                                             np.subtract(theirs["insertion"], theirs["deletion"])),
        }
    return {"rows": rows, "differences": differences,
            "per_image": {label: {k: [round(v, 6) for v in vals] for k, vals in s.items()}
                          for label, s in scores.items()}}


# --- cost -----------------------------------------------------------------------------------------
def flops_of(function) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        function()
    return int(counter.get_total_flops())


def floor_pass(bundle, images, targets):
    """Forward + full backward (parameters' gradients included), as a `.backward()` method pays."""
    with torch.enable_grad():
        logits = bundle(images.detach().requires_grad_(True))
        logits.gather(1, targets.view(-1, 1)).sum().backward()
    bundle.network.zero_grad(set_to_none=True)


def activation_floor_pass(bundle, images, targets):
    """GradSkip's floor: one forward and one backward to the activations through every block (to the first
    block's input), no parameter gradient, the model as it is (fused attention left on)."""
    with torch.enable_grad():
        captured = {}
        handle = bundle.blocks[0].register_forward_pre_hook(lambda _m, args: captured.setdefault("x", args[0]))
        try:
            logits = bundle(images.detach().requires_grad_(True))
        finally:
            handle.remove()
        score = logits.gather(1, targets.view(-1, 1)).sum()
        return torch.autograd.grad(score, captured["x"])[0]


def chefer_backward_reference(bundle, images, targets):
    """Chefer as it was before issue #15: `.backward()` (every parameter gradient), then zero `.grad`."""
    from explainers.attention import AttentionRecorder, class_token_relevance, tokens_to_map
    from explainers.methods.base import normalize_max, upsample

    with AttentionRecorder(bundle, gradients=True) as recorder:
        with torch.enable_grad():
            logits = bundle(images.detach().requires_grad_(True))
            logits.gather(1, targets.view(-1, 1)).sum().backward()
    bundle.network.zero_grad(set_to_none=True)
    with torch.no_grad():
        first = recorder.attentions[0]
        tokens = first.shape[-1]
        relevance = torch.eye(tokens, device=first.device).expand(first.shape[0], tokens, tokens).clone()
        for attention, gradient in zip(recorder.attentions, recorder.gradients):
            relevance = relevance + (gradient * attention).clamp_min(0).mean(dim=1) @ relevance
        row = class_token_relevance(relevance, bundle)
        if not bundle.has_class_token:
            row = row - row.min(dim=1, keepdim=True).values
        maps = tokens_to_map(row, bundle, tuple(images.shape[-2:]))
        return normalize_max(upsample(maps, tuple(images.shape[-2:])).clamp_min(0))


def peer_gradcam(bundle):
    """pytorch-grad-cam's GradCAM on the bundle's ViT layer with the library's documented ViT reshape_transform."""
    from pytorch_grad_cam import GradCAM as PeerGradCAM
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    def reshape(tokens):
        grid = tokens[:, bundle.num_prefix_tokens:, :]
        gh, gw = bundle.patch_grid()
        return grid.reshape(grid.shape[0], gh, gw, grid.shape[2]).permute(0, 3, 1, 2)

    cam = PeerGradCAM(model=bundle.network, target_layers=[bundle.cam_layer],
                      reshape_transform=reshape if bundle.is_vit else None)

    def run(images, targets):
        return cam(input_tensor=bundle.normalize(images), targets=[ClassifierOutputTarget(int(t)) for t in targets])

    return cam, run


def cost(bundle, images, batch_size: int, repeats: int) -> dict:
    """Time (and FLOPs) per map of GradSkip vs its floor and peers on the same model, interleaved, in one run."""
    gradskip, gradcam, chefer = GradSkip(), get_method("gradcam"), get_method("chefer")
    peer, peer_run = peer_gradcam(bundle)
    runs = {
        "floor: forward + backward to activations": lambda x, t: activation_floor_pass(bundle, x, t),
        "forward + full backward (parameter grads)": lambda x, t: floor_pass(bundle, x, t),
        "gradskip": lambda x, t: gradskip.prepare(bundle, x, t).map(),
        "gradskip capture only (prepare)": lambda x, t: gradskip.prepare(bundle, x, t),
        "gradskip capture, fused attention kept, A rebuilt (the GPU default)":
            lambda x, t: capture(bundle, x, t, rebuild_attention=True),
        "gradskip capture, unfused attention (the CPU default)":
            lambda x, t: capture(bundle, x, t, rebuild_attention=False),
        "gradskip map only (new alpha)": None,
        "gradcam (ours)": lambda x, t: gradcam.attribute(bundle, x, t),
        "pytorch-grad-cam GradCAM": peer_run,
        "chefer before (.backward)": lambda x, t: chefer_backward_reference(bundle, x, t),
        "chefer after (autograd.grad)": lambda x, t: chefer.attribute(bundle, x, t),
    }
    result = {"flops_per_map": {}, "ms_per_map": {}, "repeats": repeats}
    try:
        for size in sorted({1, min(batch_size, images.shape[0])}):
            batch = images[:size]
            with torch.no_grad():
                targets = bundle(batch).argmax(dim=1)
            state = gradskip.prepare(bundle, batch, targets)
            runs["gradskip map only (new alpha)"] = lambda x, t, state=state: state.map(0.25)
            if size == 1:
                for label, run in runs.items():
                    result["flops_per_map"][label] = flops_of(lambda: run(batch, targets))
            times = {label: [] for label in runs}
            for label, run in runs.items():  # warm-up
                run(batch, targets)
            for _ in range(repeats):  # interleaved, so that load changes hit every method alike
                for label, run in runs.items():
                    started = time.perf_counter()
                    run(batch, targets)
                    times[label].append((time.perf_counter() - started) / size)
            result["ms_per_map"][f"batch {size}"] = {label: 1000 * statistics.median(v) for label, v in times.items()}
    finally:
        peer.__exit__(None, None, None)
    floor = "floor: forward + backward to activations"
    result["ratios"] = {
        batch: {"gradskip / floor": row["gradskip"] / row[floor],
                "gradskip / forward+full backward": row["gradskip"] / row["forward + full backward (parameter grads)"],
                "gradskip / pytorch-grad-cam GradCAM": row["gradskip"] / row["pytorch-grad-cam GradCAM"],
                "gradskip / gradcam (ours)": row["gradskip"] / row["gradcam (ours)"],
                "floor / gradcam (ours)": row[floor] / row["gradcam (ours)"],
                "chefer before / after": row["chefer before (.backward)"] / row["chefer after (autograd.grad)"],
                "chefer after / gradcam (ours)": row["chefer after (autograd.grad)"] / row["gradcam (ours)"]}
        for batch, row in result["ms_per_map"].items()}
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
        "gradskip": flops_of(lambda: gradskip.prepare(bundle, image, target).map()),
        "gradcam": flops_of(lambda: gradcam.attribute(bundle, image, target)),
        "forward": flops_of(lambda: torch.no_grad()(bundle)(image)),
        "forward+backward": flops_of(lambda: floor_pass(bundle, image, target)),
    }
    times = {"gradskip": [], "gradcam": []}
    for _ in range(repeats):
        for label, run in (("gradskip", lambda: gradskip.prepare(bundle, image, target).map()),
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


PARTS = ("weightings", "paired", "cost", "table", "ablations", "vit_base", "sanity")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bloodmnist-vit", help="a zoo name, or random-vit-tiny")
    parser.add_argument("--data", default=str(ROOT.parent / "shared/data/bloodmnist/64/test"))
    parser.add_argument("--limit", type=int, default=500, help="images spread evenly over the csv (all classes)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--reference", default="mean")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: leave torch's default)")
    parser.add_argument("--repeats", type=int, default=15, help="timing repeats per method")
    parser.add_argument("--sanity-images", type=int, default=16)
    parser.add_argument("--vit-base-repeats", type=int, default=3, help="timing repeats on ViT-B/16 (0: FLOPs only)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma list of parts to run: {','.join(PARTS)}")
    parser.add_argument("--skip", default="", help="comma list of parts to leave out of --parts")
    parser.add_argument("--gradskip-options", default="{}",
                        help='JSON options for GradSkip in the paired part (default: its defaults), e.g. '
                             '\'{"attention_weighting": "attention"}\'')
    parser.add_argument("--gates", default="", help="weightings part: also the class_gated form at these "
                        "gate_sigma:gate_power[:gate_knee[:gate_reference]] (alpha 0.5), e.g. 2:1.5,3:2:0.5,"
                        "3:1.5:1:attention")
    parser.add_argument("--paired-peers", nargs="+", default=["rollout", "chefer"],
                        help="paired part: the methods GradSkip is paired with, as specs (each its own argument, "
                             "e.g. rollout gradskip:gate_reference=none,gate_power=1.5)")
    parser.add_argument("--weightings", default=",".join(ATTENTION_WEIGHTINGS),
                        help="weightings part: the attention_weighting forms to run")
    parser.add_argument("--alphas", default=",".join(f"{a:g}" for a in WEIGHTING_ALPHAS),
                        help="weightings part: the alphas of each form")
    parser.add_argument("--peers", default=",".join(PEERS), help="weightings part: other methods on the same images")
    parser.add_argument("--out", default=None, help="JSON report path")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    parts = [p for p in filter(None, args.parts.split(",")) if p not in set(args.skip.split(","))]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown part(s) {sorted(unknown)}; choose from {', '.join(PARTS)}")

    bundle = build_bundle(args.model, args.data, args.device)
    images, _labels = load_images(bundle, args.data, args.limit)
    report = {"command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])),
              "model": args.model, "data": args.data, "limit": args.limit, "n_images": int(images.shape[0]),
              "classes": {str(k): int(v) for k, v in zip(*np.unique(_labels.numpy(), return_counts=True))},
              "steps": args.steps, "reference": args.reference, "device": args.device,
              "threads": torch.get_num_threads(), "torch": torch.__version__,
              "python": platform.python_version(), "gradskip_defaults": GradSkip().options,
              "intervals": "95% percentile bootstrap over images, 2000 resamples, seed 0 (paired: the same "
                           "resampled images for both methods)"}
    started = time.perf_counter()

    if "weightings" in parts:
        print(f"\nW~ options x alpha on {images.shape[0]} images of {args.data} (means, 95% bootstrap intervals)")
        report["weightings"] = weightings(bundle, images, args.batch_size, args.steps, args.reference,
                                          gates=parse_gates(args.gates), peers=tuple(filter(None, args.peers.split(","))),
                                          forms=tuple(filter(None, args.weightings.split(","))),
                                          alphas=tuple(float(a) for a in args.alphas.split(",")))
        print_rows(report["weightings"]["rows"])
    if "paired" in parts:
        options = json.loads(args.gradskip_options)
        print(f"\nGradSkip {GradSkip(**options).options} vs rollout and Chefer on {images.shape[0]} images")
        report["paired"] = paired(bundle, images, args.batch_size, args.steps, args.reference, options,
                                  peers=tuple(args.paired_peers))
        print_rows(report["paired"]["rows"])
        for label, row in report["paired"]["differences"].items():
            print(f"  {label:<34}" + "".join(f"{_fmt(row[k]):>26}" for k in ("deletion", "insertion", "ins_minus_del")))
    if "table" in parts:
        table = evaluate_methods(bundle, args.data, list(METHODS), limit=args.limit, steps=args.steps,
                                 reference=args.reference, batch_size=args.batch_size, progress=False)
        report["table"] = table
        print(format_table(table), flush=True)
        # paired bootstrap intervals of GradSkip minus each other method on the same images
        report["comparisons"] = [compare_methods(table, "gradskip", other) for other in table["methods"]
                                 if other != "gradskip"]
        for comparison in report["comparisons"]:
            print(format_comparison(comparison), flush=True)
    if "ablations" in parts:
        report["ablations"] = ablations(bundle, images, args.batch_size, args.steps, args.reference)
        print("\nablations (GradSkip, same images and targets)")
        for label, row in report["ablations"].items():
            print(f"  {label:<26} deletion {row['deletion_auc']:.4f}  insertion {row['insertion_auc']:.4f}  "
                  f"ins-del {row['ins_minus_del']:.4f}", flush=True)
    if "cost" in parts:
        report["cost"] = cost(bundle, images, args.batch_size, args.repeats)
        print("\ncost per map on", args.model)
        for label, gflops in report["cost"]["gflops_per_map"].items():
            print(f"  {label:<44} {gflops:.4f} GFLOPs (batch 1)")
        for batch, row in report["cost"]["ms_per_map"].items():
            print(f"  {batch}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in row.items()))
            print(f"  {batch} ratios: " + ", ".join(f"{k} {v:.3f}" for k, v in report["cost"]["ratios"][batch].items()),
                  flush=True)
    if "vit_base" in parts:
        report["vit_base_random"] = vit_base_flops(args.vit_base_repeats)
        vb = report["vit_base_random"]
        print("\nvit_base_patch16_224 (random weights), per map: " + ", ".join(
            f"{k} {v:.2f} GFLOPs" for k, v in vb["gflops_per_map"].items())
            + f"; GradSkip / paper's {PAPER_GFLOPS} = {vb['gradskip_vs_paper']:.3f}"
            + (f"; time GradSkip/Grad-CAM {vb['time_ratio_gradskip_to_gradcam']:.2f}x" if vb["ms_per_map"] else ""),
            flush=True)
    if "sanity" in parts:
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
