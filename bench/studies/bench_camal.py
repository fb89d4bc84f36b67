"""CAMAL benchmarks (issue #5; spec: docs/methods.md sections 1 and 4).

    # 1. batch-level vs per-sample Grad-CAM extraction (B = 32, eval mode): identical maps and the speed ratio
    python bench/studies/bench_camal.py cam-speed --models bloodmnist-cnn,bloodmnist-vit \
        --data ../shared/data/bloodmnist/64/test --out bench/results/camal-cam-speed.json

    # 2. decoy BloodMNIST: a vanilla model trained on decoy train, then vanilla fine-tuning vs CAMAL from that start
    python bench/studies/bench_camal.py decoy --src ../shared/data/bloodmnist/64 --work /tmp/decoy-bench \
        --train-limit 2000 --start-epochs 4 --epochs 1 --lambda 1 --out bench/results/camal-decoy.json

    # 3. BCCD with box masks: IoU and pointing game before and after CAMAL (pseudo-labels: BCCD has no subtypes)
    python bench/studies/bench_camal.py bccd --model bloodmnist-cnn --bccd ../shared/data/bccd --work /tmp/bccd-bench \
        --epochs 1 --lambda 1 --out bench/results/camal-bccd.json

Timing on a shared CPU is noisy: `--threads` (default 1) pins torch's thread count; maps are compared in fp32
eval mode. `--models random-cnn,random-vit` use the bundled architectures with random weights (to check the
script before trained weights exist).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

from explainers import camal as C
from explainers.masks import load_mask_set
from explainers.methods.gradcam import gradcam_maps


def random_bundle(kind: str, num_classes: int = 8):
    import timm

    from explainers.models import bundle_from_timm
    from explainers.training import PRESETS

    timm_name, kwargs = PRESETS[kind]
    torch.manual_seed(0)
    network = timm.create_model(timm_name, pretrained=False, num_classes=num_classes, **kwargs)
    bundle = bundle_from_timm(f"random-{kind}", network, input_size=(64, 64))
    bundle.card = {"timm_name": timm_name, "timm_kwargs": dict(kwargs, num_classes=num_classes)}
    return bundle


NORM_DATA = None  # --norm-data


def get_bundle(name: str):
    """A zoo name or card path; 'random-cnn' / 'random-vit'; or 'cnn@FILE.pt' / 'vit@FILE.pt': a preset architecture
    with a training checkpoint's state dict (e.g. weights/bloodmnist-cnn.best.pt while training still runs;
    normalisation is then ImageNet's, which does not matter for the map identity and timing)."""
    if name.startswith("random-"):
        return random_bundle(name.split("-", 1)[1])
    if "@" in name:
        preset, path = name.split("@", 1)
        bundle = random_bundle(preset)
        bundle.network.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        bundle.name = name
        if NORM_DATA:  # the training's normalisation: the train split's mean and std
            from explainers.training import load_into_memory

            images = load_into_memory(NORM_DATA)[0].float() / 255
            bundle.mean = bundle.reference_color = tuple(images.mean(dim=(0, 2, 3)).tolist())
            bundle.std = tuple(images.std(dim=(0, 2, 3)).tolist())
        return bundle
    return C.load_bundle(name)


def load_images(data: str, count: int, size: tuple) -> torch.Tensor:
    from explainers.data import open_dataset

    dataset = open_dataset(data, limit=count)
    images = torch.stack([dataset[i][0] for i in range(len(dataset))])
    if tuple(images.shape[-2:]) != tuple(size):
        images = torch.nn.functional.interpolate(images, size=size, mode="bilinear", align_corners=False)
    return images


# ------------------------------------------------------------------------------------------ 1. CAM speed
def cam_speed(args) -> dict:
    results = {}
    for name in args.models.split(","):
        bundle = get_bundle(name)
        bundle.network.eval()
        images = load_images(args.data, args.batch, bundle.input_size)
        with torch.no_grad():
            targets = bundle(images).argmax(1)

        def batch_level():
            return gradcam_maps(bundle, images, targets)

        def per_sample():
            return torch.cat([gradcam_maps(bundle, images[i:i + 1], targets[i:i + 1]) for i in range(len(images))])

        batch_maps, single_maps = batch_level(), per_sample()  # also the warm-up
        difference = float((batch_maps - single_maps).abs().max())
        times = {"batch": [], "per_sample": []}
        for _ in range(args.repeats):  # interleaved, so load changes hit both alike
            for key, fn in (("batch", batch_level), ("per_sample", per_sample)):
                start = time.perf_counter()
                fn()
                times[key].append(time.perf_counter() - start)
        batch_s, single_s = statistics.median(times["batch"]), statistics.median(times["per_sample"])
        results[name] = {"batch_size": len(images), "max_abs_diff": difference, "identical": difference <= 1e-5,
                         "batch_level_ms": round(1000 * batch_s, 2), "per_sample_ms": round(1000 * single_s, 2),
                         "speedup": round(single_s / batch_s, 2), "family": bundle.family,
                         "cam_layer": bundle.cam_layer_name}
        print(f"{name}: {json.dumps(results[name])}", flush=True)
    return results


# ------------------------------------------------------------------------------------------ 2. decoy
def _metrics_table(rows: dict) -> str:
    keys = ("accuracy", "iou", "pointing_game", "energy_inside", "deletion_auc", "insertion_auc")
    lines = ["| model | split | " + " | ".join(keys) + " |", "|" + "---|" * (len(keys) + 2)]
    for model, splits in rows.items():
        for split, metrics in splits.items():
            lines.append(f"| {model} | {split} | " + " | ".join(f"{metrics[k]:.4f}" for k in keys) + " |")
    return "\n".join(lines) + "\n(lower deletion AUC is better, higher insertion AUC is better)"


def decoy(args) -> dict:
    from explainers.decoy import build_decoy_bloodmnist
    from explainers.training import export_classifier

    work = Path(args.work)
    decoy_root = work / "decoy-bloodmnist"
    if not (decoy_root / "decoy.json").exists():
        started = time.time()
        build_decoy_bloodmnist(args.src, decoy_root, train_limit=args.train_limit, val_limit=args.val_limit,
                               test_limit=args.test_limit, seed=args.seed, mask=args.mask)
        print(f"built decoy BloodMNIST in {time.time() - started:.0f} s", flush=True)
    train = load_mask_set(decoy_root / "train", image_hw=(64, 64))
    evals = {split: load_mask_set(decoy_root / split, image_hw=(64, 64), limit=args.eval_limit)
             for split in ("test", "test-clean")}

    # the common start: a vanilla model trained on decoy train (cross-entropy only)
    start_card = work / "weights" / "decoy-start.json"
    if not start_card.exists():
        bundle = random_bundle(args.preset) if args.init == "scratch" else C.private_copy(get_bundle(args.init))
        started = time.time()
        C.finetune(bundle, train, epochs=args.start_epochs, lam=0.0, lr=args.start_lr, batch_size=args.batch_size,
                   seed=args.seed, bn_train=True)
        name, kwargs = C._timm_spec(bundle)
        (work / "weights").mkdir(parents=True, exist_ok=True)
        mean = tuple((train.images.float() / 255).mean(dim=(0, 2, 3)).tolist())
        export_classifier(bundle.network, name="decoy-start", out_dir=work / "weights", timm_name=name,
                          timm_kwargs=kwargs, mean=bundle.mean, std=bundle.std, class_names=bundle.class_names,
                          data=str(decoy_root / "train"), val_accuracy=None, test_data=None, seed=args.seed,
                          history=[], epochs=args.start_epochs, train_seconds=time.time() - started, input_size=64,
                          extra={"reference_color": list(mean)})
        print(f"start model trained in {time.time() - started:.0f} s", flush=True)

    table, timing = {}, {}
    start = C.load_bundle(str(start_card))
    table["start"] = {split: C.evaluate(start, data, curve_limit=args.curve_limit) for split, data in evals.items()}
    print("start:", json.dumps(table["start"]), flush=True)
    for arm, lam in (("vanilla", 0.0), ("camal", args.lam)):
        if arm not in args.arms:
            continue
        bundle = C.load_bundle(str(start_card))
        result = C.finetune(bundle, train, epochs=args.epochs, lam=lam, lr=args.lr, batch_size=args.batch_size,
                            seed=args.seed, cam_mode=args.cam_mode, bn_train=args.bn_train)
        timing[arm] = result["seconds"]
        table[arm] = {split: C.evaluate(bundle, data, curve_limit=args.curve_limit) for split, data in evals.items()}
        print(f"{arm}:", json.dumps(table[arm]), flush=True)
        if args.export_dir and arm == "camal":
            export_decoy_models(args, start, bundle, table, decoy_root, result["seconds"])
    print(_metrics_table(table))
    return {"table": table, "train_seconds": timing, "markdown": _metrics_table(table),
            "decoy": json.loads((decoy_root / "decoy.json").read_text())}


BLOODMNIST_CLASSES = ["basophil", "eosinophil", "erythroblast", "immature granulocyte", "lymphocyte", "monocyte",
                      "neutrophil", "platelet"]


def export_decoy_models(args, start, camal_bundle, table, decoy_root, camal_seconds) -> None:
    """Ship the decoy demo (the app's Learn tab): the shortcut model and its CAMAL fine-tune, with their
    measured decoy-test figures in the cards (`decoy-bloodmnist-cnn`, `decoy-bloodmnist-cnn-camal`)."""
    from explainers.training import export_classifier

    out = Path(args.export_dir)
    out.mkdir(parents=True, exist_ok=True)
    about = json.loads((decoy_root / "decoy.json").read_text())
    for name, bundle, extra in (
            ("decoy-bloodmnist-cnn", start, {"decoy": {"what": "trained on decoy BloodMNIST: every training image "
                                                       "carries a coloured square that gives its class away",
                                                       "test": table["start"], "build": about}}),
            ("decoy-bloodmnist-cnn-camal", camal_bundle, {"camal": {
                "base_model": "decoy-bloodmnist-cnn", "lambda": args.lam, "epochs": args.epochs, "lr": args.lr,
                "cam_mode": args.cam_mode, "train_seconds": camal_seconds, "masks": "cell masks (decoy build)",
                "before": table["start"], "after": table["camal"]}})):
        name_, kwargs = C._timm_spec(bundle)
        bundle.network.to("cpu")
        export_classifier(bundle.network, name=name, out_dir=out, timm_name=name_, timm_kwargs=kwargs,
                          mean=bundle.mean, std=bundle.std, class_names=BLOODMNIST_CLASSES,
                          data="decoy BloodMNIST train (built by explainers.decoy from BloodMNIST 64 px train)",
                          val_accuracy=None, test_data=None, seed=args.seed, history=[], epochs=args.epochs,
                          train_seconds=camal_seconds if "camal" in extra else 0.0, input_size=64,
                          extra={**extra, "reference_color": list(bundle.reference_color),
                                 "bench_command": " ".join(["python bench/studies/bench_camal.py"] + sys.argv[1:])})
        print(f"exported {out / name}.json", flush=True)


# ------------------------------------------------------------------------------------------ 3. BCCD
def bccd(args) -> dict:
    from explainers.masks import build_bccd_mask_set

    work = Path(args.work)
    for split in ("train", "test"):
        if not (work / split / "masks.csv").exists():
            print(json.dumps(build_bccd_mask_set(args.bccd, work / split, split=split, size=args.size,
                                                 seed=args.seed)), flush=True)
    bundle = C.private_copy(get_bundle(args.model))
    size = bundle.input_size
    train = C.resolve_labels(bundle, load_mask_set(work / "train", image_hw=size))
    test = C.resolve_labels(bundle, load_mask_set(work / "test", image_hw=size))
    before = C.evaluate(bundle, test, curve_limit=args.curve_limit)
    print("before:", json.dumps(before), flush=True)
    result = C.finetune(bundle, train, epochs=args.epochs, lam=args.lam, lr=args.lr, batch_size=args.batch_size,
                        seed=args.seed, cam_mode=args.cam_mode, bn_train=args.bn_train)
    after = C.evaluate(bundle, test, curve_limit=args.curve_limit)
    print("after:", json.dumps(after), flush=True)
    return {"model": args.model, "train_count": len(train), "test_count": len(test), "before": before,
            "after": after, "train_seconds": result["seconds"],
            "note": "labels are the base model's predictions (BCCD has no white-cell subtypes): 'accuracy' is "
                    "agreement with the base model"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    speed = commands.add_parser("cam-speed")
    speed.add_argument("--models", default="bloodmnist-cnn,bloodmnist-vit")
    speed.add_argument("--data", required=True)
    speed.add_argument("--batch", type=int, default=32)
    speed.add_argument("--repeats", type=int, default=5)
    for sub in (commands.add_parser("decoy"), commands.add_parser("bccd")):
        sub.add_argument("--work", required=True)
        sub.add_argument("--epochs", type=int, default=1)
        sub.add_argument("--lambda", dest="lam", type=float, default=1.0)
        sub.add_argument("--lr", type=float, default=3e-4)
        sub.add_argument("--batch-size", type=int, default=32)
        sub.add_argument("--cam-mode", choices=C.CAM_MODES, default="differentiable")
        sub.add_argument("--curve-limit", type=int, default=128)
        sub.add_argument("--seed", type=int, default=0)
        sub.add_argument("--bn-train", action="store_true", help="update BatchNorm statistics while fine-tuning")
        if sub.prog.endswith("decoy"):
            sub.add_argument("--src", required=True, help="BloodMNIST folder with train/val/test")
            sub.add_argument("--train-limit", type=int, default=2000)
            sub.add_argument("--val-limit", type=int, default=200)
            sub.add_argument("--test-limit", type=int, default=None)
            sub.add_argument("--eval-limit", type=int, default=None)
            sub.add_argument("--mask", choices=["segment", "disk"], default="segment")
            sub.add_argument("--init", default="scratch", help="'scratch' (preset architecture) or a model name")
            sub.add_argument("--preset", choices=["cnn", "vit"], default="cnn")
            sub.add_argument("--start-epochs", type=int, default=4)
            sub.add_argument("--start-lr", type=float, default=2e-3)
            sub.add_argument("--arms", default="vanilla,camal", type=lambda v: v.split(","),
                             help="fine-tuning arms from the common start (vanilla = lambda 0)")
            sub.add_argument("--export-dir", default=None, help="also export the start model and the CAMAL "
                                                                "model as decoy-bloodmnist-cnn(-camal) here")
        else:
            sub.add_argument("--model", default="bloodmnist-cnn")
            sub.add_argument("--bccd", required=True, help="BCCD folder (with Annotations/, JPEGImages/)")
            sub.add_argument("--size", type=int, default=64)
    for sub in commands.choices.values():
        sub.add_argument("--threads", type=int, default=1)
        sub.add_argument("--norm-data", default=None, help="for PRESET@FILE.pt models: the train folder whose "
                                                           "mean/std the training used")
        sub.add_argument("--out", default=None, help="JSON results")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    global NORM_DATA
    NORM_DATA = args.norm_data
    started = time.time()
    results = {"cam-speed": cam_speed, "decoy": decoy, "bccd": bccd}[args.command](args)
    report = {"command": args.command, "args": vars(args), "results": results,
              "seconds": round(time.time() - started, 1),
              "machine": {"python": platform.python_version(), "torch": torch.__version__,
                          "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine()}}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
