"""Per-image scores (every metric `explainers.metrics` scores per image: deletion and insertion AUCs, ...) of every method on the same images under three references (mean colour,
blur, ROAD): the measurements behind the generated scoreboard (`explainers.scoreboard`, docs/scoreboard.md).

Each method's map is computed once per batch and scored under every reference; ROAD (whose imputation runs on the
CPU, one sparse solve per image and step) on a named, evenly spread subset of the images when `--road-limit` is
given. Work is split into shards of whole batches (`--shard r/n`: batches r, r+n, ...), so that several processes
share one GPU and the CPU cores; `merge` puts the shards back in image order. A batch always holds the same images
and each map is drawn with the global RNG seeded by its batch, so the result does not depend on the number of shards.

    python bench/scoreboard_run.py run --model bloodmnist-vit --data ../shared/data/bloodmnist/64/test --limit 500 \\
        --methods aha,gradskip,gradcam,rollout,chefer,occlusion,rise:n_masks=4000,random --road-limit 120 \\
        --device cuda --shard 0/8 --out parts/vit-0.json
    python bench/scoreboard_run.py merge --out bench/results/scoreboard-bloodmnist-vit.json parts/vit-*.json

`replace` puts one method's rows from a new run (a report, or one `run` output) of the SAME images (e.g. a retrained explainer, with
SALIENCY_WEIGHTS_DIR pointing at its weights) into a stored report, so that the new rows are paired with the stored
rows of the other methods; `--as NAME` keeps the stored row and adds the new one beside it, and prints the new row's
paired improvement over the stored one under every reference:

    python bench/scoreboard_run.py replace --base bench/results/scoreboard-bloodmnist-vit-cpu100.json \
        --rows new-aha.json --method aha --out bench/results/scoreboard-bloodmnist-vit-cpu100.json

Targets: the model's predicted class. Weights: whatever `weights/` holds when it runs (the AHA explainers included).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from explainers.atomic import atomic_write_text
from explainers.data import UNLABELLED, item_names, model_batches, open_dataset, spread_indices
from explainers.engine import explain_batch
from explainers.methods import MethodNotApplicable, build_methods, split_method_specs
from explainers.metrics import ROAD_NOISE, MapBatch, score_batch
from explainers.models import load_model

REFERENCES = ("mean", "blur", "road")


def applicable_methods(bundle, specs: list) -> tuple:
    """([(label, method)] that can explain this model, {label: why not} for the others)."""
    built, skipped = [], {}
    for spec in specs:
        try:
            built.extend(build_methods(bundle, [spec]))
        except MethodNotApplicable as error:
            skipped[spec] = str(error)
    return built, skipped


def run_shard(args) -> dict:
    torch.set_num_threads(args.threads)
    bundle = load_model(args.model, device=args.device)
    dataset = open_dataset(args.data, split="test", limit=args.limit, require_labels=False)
    methods, skipped = applicable_methods(bundle, split_method_specs(args.methods))
    references = [r.strip() for r in args.references.split(",") if r.strip()]
    n = len(dataset)
    road_set = set(spread_indices(n, args.road_limit)) if args.road_limit else set(range(n))
    rank, world = (int(part) for part in args.shard.split("/"))
    batches = [list(range(start, min(start + args.batch_size, n))) for start in range(0, n, args.batch_size)]
    mine = list(enumerate(batches))[rank::world]
    scores = {ref: {label: {"index": []} for label, _ in methods} for ref in references}
    seconds = {label: 0.0 for label, _ in methods}
    curve_seconds = {ref: 0.0 for ref in references}
    correct, labelled, indices_done = 0, 0, []
    started = time.perf_counter()
    stopped = None
    for batch_number, batch_indices in mine:
        if args.deadline and time.perf_counter() - started > args.deadline:
            stopped = f"stopped at the {args.deadline:.0f} s deadline after {len(indices_done)} images"
            break
        _, images = next(model_batches(dataset, bundle, batch_indices, batch_size=len(batch_indices)))
        with torch.no_grad():
            targets = bundle(images).argmax(dim=1)
        labels = torch.tensor([int(dataset.labels[i]) for i in batch_indices])
        known = labels != UNLABELLED
        correct += int(((targets.cpu() == labels) & known).sum())
        labelled += int(known.sum())
        indices_done.extend(batch_indices)
        road_rows = [row for row, index in enumerate(batch_indices) if index in road_set]
        for label, method in methods:
            # RISE, the random map: the same draws whatever the shards
            batch = explain_batch(bundle, method, images, targets, seed=args.seed + batch_number)
            maps = batch.maps
            seconds[label] += batch.seconds
            for ref in references:
                rows = road_rows if ref == "road" else list(range(len(batch_indices)))
                if not rows:
                    continue
                tick = time.perf_counter()
                scored = score_batch(MapBatch(bundle, images[rows], maps[rows], targets[rows], steps=args.steps,
                                              reference=ref, curve_batch=args.curve_batch))
                curve_seconds[ref] += time.perf_counter() - tick
                target = scores[ref][label]
                target["index"].extend(batch_indices[row] for row in rows)
                for name, values in scored.items():
                    target.setdefault(name, []).extend(values.tolist())
        print(f"[{args.model} shard {args.shard}] batch {batch_number + 1}/{len(batches)} done "
              f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    return {"model": args.model, "files": item_names(dataset), "indices": indices_done, "correct": correct,
            "labelled": labelled, "scores": scores, "seconds": seconds, "curve_seconds": curve_seconds,
            "stopped": stopped,
            "skipped": skipped,
            "options": {label: {**method.options, **(getattr(method, "resolved_options", None) or {})}
                        for label, method in methods},
            "protocol": protocol(args, bundle, n, road_set)}


def protocol(args, bundle, n: int, road_set: set) -> dict:
    return {"data": str(args.data), "images": n, "limit": args.limit, "steps": args.steps, "seed": args.seed,
            "references": args.references, "road_limit": args.road_limit, "road_images": len(road_set),
            "road_noise": f"N(0, {ROAD_NOISE}) in the model's normalised units (std {list(bundle.std)})",
            "reference_color": list(bundle.reference_color), "blur": "Gaussian, kernel 11, sigma 5",
            "score": "softmax probability of the target", "target": "predicted class",
            "auc": "trapezoid over p in [0, 1]", "methods": args.methods, "device": str(bundle.device),
            "torch": torch.__version__, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d", time.gmtime())}


def merge(parts: list) -> dict:
    """One report from the shards of one model: per reference and method the per-image AUCs in image order, with
    the file names they belong to."""
    first = parts[0]
    files = first["files"]
    report = {"model": first["model"], "protocol": first["protocol"], "files": files, "n_images": len(files),
              "skipped_methods": first["skipped"], "references": {}}
    done = sorted(i for part in parts for i in part["indices"])
    stops = [part["stopped"] for part in parts if part.get("stopped")]
    if done != list(range(len(files))) and not stops:
        raise SystemExit(f"the shards of {first['model']} cover {len(done)} of {len(files)} images: a shard is missing")
    if stops:  # a run cut short by --deadline: the report covers the images done, named in `files`
        report["planned_images"] = len(files)
        report["stopped"] = "; ".join(stops)
        files = report["files"] = [files[i] for i in done]
        report["n_images"] = len(files)
        position = {index: rank for rank, index in enumerate(done)}
    labelled = sum(part["labelled"] for part in parts)
    report["accuracy"] = sum(part["correct"] for part in parts) / labelled if labelled else None
    for ref in first["scores"]:
        methods = {}
        for label in first["scores"][ref]:
            keys = [key for key in first["scores"][ref][label] if key != "index"]  # the metrics scored
            rows = sorted(row for part in parts for row in
                          zip(*(part["scores"][ref][label].get(key, []) for key in ["index", *keys])))
            methods[label] = {"options": first["options"][label],
                              "per_image": {key: [r[1 + k] for r in rows] for k, key in enumerate(keys)},
                              "indices": [r[0] for r in rows]}
        indices = next(iter(methods.values()))["indices"] if methods else []
        for label, row in methods.items():
            if row.pop("indices") != indices:
                raise SystemExit(f"{label} under {ref} was scored on other images than the first method")
        if stops:
            indices = [position[i] for i in indices]
        report["references"][ref] = {"files": [files[i] for i in indices], "methods": methods}
    # summed over the shards, which ran side by side on one machine: where the time went, not method timings
    report["map_seconds"] = {label: sum(part["seconds"][label] for part in parts) for label in first["seconds"]}
    report["curve_seconds"] = {ref: sum(part["curve_seconds"][ref] for part in parts) for ref in first["curve_seconds"]}
    return report


def replace_rows(base: dict, new: dict, method: str, name: str | None = None) -> dict:
    """`base` with `method`'s rows taken from `new` (the same images under every reference, checked), under `name`
    beside the stored row when given; with `name`, `pairs` holds the new row's paired improvement over the stored."""
    from explainers.scoreboard import improvement, method_name

    def rows_of(methods: dict) -> list:  # 'aha:refine_steps=3' is another row than 'aha' (method_name's rule)
        return [label for label in methods if method_name(label) == method_name(method)]

    out = json.loads(json.dumps(base))
    out.setdefault("replaced", []).append({"method": method, "as": name or method, "protocol": new["protocol"]})
    for ref, block in new["references"].items():
        if ref not in out["references"]:
            continue
        if block["files"] != out["references"][ref]["files"]:
            raise SystemExit(f"the new run scored other images than the stored report under {ref}")
        rows = rows_of(block["methods"])
        if len(rows) != 1:
            raise SystemExit(f"the new run has {len(rows)} rows of {method} under {ref} (expected one)")
        label, row = rows[0], block["methods"][rows[0]]
        methods = out["references"][ref]["methods"]
        stored = rows_of(methods)
        if name is not None:
            methods[name] = row
            if stored:
                out.setdefault("pairs", {})[ref] = {metric: improvement(row, methods[stored[0]], metric)
                                                    for metric in row["per_image"]}
        elif stored:  # in the stored row's place, so tables keep their order
            out["references"][ref]["methods"] = {(label if old == stored[0] else old): (row if old == stored[0] else kept)
                                                 for old, kept in methods.items()}
        else:
            methods[label] = row
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="score one shard of one model's images")
    run.add_argument("--model", required=True)
    run.add_argument("--data", required=True, help="a folder of images (labels.csv optional)")
    run.add_argument("--limit", type=int, default=None, help="images spread evenly over the folder (all when unset)")
    run.add_argument("--methods", required=True, help="method specs; those the model cannot use are listed as skipped")
    run.add_argument("--references", default=",".join(REFERENCES))
    run.add_argument("--road-limit", type=int, default=None, help="ROAD on this many of the images, spread evenly")
    run.add_argument("--steps", type=int, default=20)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--batch-size", type=int, default=16, help="images per batch (maps)")
    run.add_argument("--curve-batch", type=int, default=512, help="perturbed images per forward pass (curves)")
    run.add_argument("--device", default="cpu")
    run.add_argument("--threads", type=int, default=1)
    run.add_argument("--deadline", type=float, default=None,
                     help="seconds: start no batch after this (the report then covers the images done, named)")
    run.add_argument("--shard", default="0/1", help="r/n: this process scores batches r, r+n, ...")
    run.add_argument("--out", required=True)
    joined = commands.add_parser("merge", help="merge one model's shards into one report")
    joined.add_argument("--out", required=True)
    joined.add_argument("parts", nargs="+")
    swap = commands.add_parser("replace", help="one method's rows from a new run of the same images into a report")
    swap.add_argument("--base", required=True)
    swap.add_argument("--rows", required=True)
    swap.add_argument("--method", required=True)
    swap.add_argument("--as", dest="name", default=None, help="keep the stored row and add the new one as NAME")
    swap.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.command == "run":
        result = run_shard(args)
    elif args.command == "replace":
        base, rows = (json.loads(Path(p).read_text()) for p in (args.base, args.rows))
        result = replace_rows(*(merge([r]) if "scores" in r else r for r in (base, rows)), args.method, args.name)
        for ref, metrics in result.get("pairs", {}).items():
            print(ref, {m: (round(c["mean"], 4), c["ci95"] and [round(v, 4) for v in c["ci95"]])
                        for m, c in metrics.items()})
    else:
        result = merge([json.loads(Path(p).read_text()) for p in args.parts])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(args.out), json.dumps(result, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
