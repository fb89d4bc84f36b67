"""Evaluation over a data set (deletion / insertion with intervals): what the CLI and the benchmarks run. The
maps come from the engine's one run path (`engine.explain_batch`); the table's headings from the metrics'
declarations (`metrics.METRICS`)."""
from __future__ import annotations

import platform
import sys

import numpy as np
import torch
from tqdm import tqdm

from . import familiarity
from .data import UNLABELLED, item_names, open_dataset
from .distributed import gather_items, world
from .engine import explain_batch
from .methods import build_methods
from .metrics import METRICS, REFERENCES, deletion_insertion, pointing_game, pointing_tolerance
from .statistics import N_RESAMPLES, format_interval, method_intervals


def evaluate_methods(bundle, data: str, methods: list, *, split: str = "test", limit: int | None = None,
                     steps: int = 20, reference: str = "mean", seed: int = 0, batch_size: int = 16,
                     method_options: dict | None = None, masks=None, progress: bool = True) -> dict:
    """Deletion/insertion (and pointing game where masks exist) for each method over a data set.

    Targets are the model's predicted classes, so `data` may be a plain folder of images (no labels.csv: the
    report's accuracy is None); each image is read as an upload of the file would be. Where the model has
    familiarity statistics the report's `familiarity` names the images unlike its training images (read in the
    pass that picks the targets). `ms_per_image` is each method's own time to produce maps (curves excluded),
    measured in this run so that methods compare as ratios. The report keeps `files` (the images, in order), each
    method's `per_image` scores in that order and percentile-bootstrap 95% intervals of each mean
    (`statistics.bootstrap_ci`, `bootstrap_resamples` resamples, seeded by `seed`).
    """
    if reference not in REFERENCES:
        raise ValueError(f"reference must be one of {REFERENCES}")
    torch.manual_seed(seed)
    dataset = open_dataset(data, split=split, limit=limit, require_labels=False)  # targets: the predictions
    size = bundle.input_size

    def load(index):
        from .images import prepare_image

        tensor, _ = prepare_image(dataset.image(index), size, bundle.crop_pct, bundle.interpolation)
        return tensor[0]

    method_objects = build_methods(bundle, methods, method_options)

    totals = {label: {"deletion": [], "insertion": [], "seconds": 0.0, "pointing": []} for label, _ in method_objects}
    correct = 0
    tolerance = pointing_tolerance(size)  # 15 px at 224 px, scaled
    all_indices = list(range(len(dataset)))
    world_size, rank = world()
    # under torchrun each process scores every world-th batch: whole batches, so that a batch holds the same
    # images as in one process (a method whose map depends on the batch, like the random map, gives the same)
    batches = [all_indices[start:start + batch_size] for start in range(0, len(all_indices), batch_size)][rank::world_size]
    indices = [i for batch in batches for i in batch]
    bar = tqdm(total=len(indices), desc=f"evaluate {bundle.name}", disable=not progress or rank > 0, file=sys.stderr)
    check = familiarity.get_stats(bundle) is not None
    caveats = {}  # what a reader of each method's maps on this model should know (`Method.caveat`)
    verdicts = []  # familiarity verdicts of this process's images, in `indices` order
    for batch_indices in batches:
        images = torch.stack([load(i) for i in batch_indices]).to(bundle.device)
        labels = torch.tensor([int(dataset.labels[i]) for i in batch_indices])
        logits, checked = familiarity.forward_and_check(bundle, images)  # the pass that picks the targets
        verdicts.extend(checked or [])
        targets = logits.argmax(dim=1)
        correct += int(((targets.cpu() == labels) & (labels != UNLABELLED)).sum())
        for label, method_obj in method_objects:
            batch = explain_batch(bundle, method_obj, images, targets, seed=None)  # seeded once, above
            maps = batch.maps
            totals[label]["seconds"] += batch.seconds
            caveats[label] = batch.caveat
            curves = deletion_insertion(bundle, images, maps, targets, steps=steps, reference=reference)
            totals[label]["deletion"].extend(curves.deletion_auc.tolist())
            totals[label]["insertion"].extend(curves.insertion_auc.tolist())
            if masks is not None:
                batch_masks = torch.stack([torch.as_tensor(masks[i]) for i in batch_indices])
                totals[label]["pointing"].extend(pointing_game(maps.cpu(), batch_masks, tolerance).tolist())
        bar.update(len(batch_indices))
    bar.close()

    if world_size > 1:
        totals, correct = _gather(totals, correct, indices, len(all_indices))
        if check:
            verdicts = gather_items({"verdicts": verdicts}, {}, indices, len(all_indices))[0]["verdicts"]
    n = len(all_indices)
    labelled = sum(1 for label in dataset.labels if int(label) != UNLABELLED)
    report = {
        "model": bundle.name,
        "n_images": n,
        "files": item_names(dataset),
        "accuracy": correct / labelled if labelled else None,  # None: a folder without labels.csv
        "labelled_images": labelled,
        "protocol": {"data": str(data), "split": split, "limit": limit, "steps": steps, "reference": reference,
                     "reference_color": list(bundle.reference_color), "score": "softmax probability of the target",
                     "target": "predicted class", "auc": "trapezoid over p in [0, 1]", "seed": seed,
                     "torch": torch.__version__, "python": platform.python_version(),
                     "threads": torch.get_num_threads(), "device": str(bundle.device), "processes": world_size,
                     "pointing_tolerance_px": tolerance if masks is not None else None,
                     "intervals": f"percentile bootstrap over images, {N_RESAMPLES} resamples, seed {seed}"},
        "familiarity": _familiarity_summary(verdicts, item_names(dataset)) if check else None,
        "methods": {},
    }
    for label, method_obj in method_objects:
        stats = totals[label]
        deletion, insertion = np.mean(stats["deletion"]), np.mean(stats["insertion"])
        report["methods"][label] = {
            "deletion_auc": float(deletion),
            "insertion_auc": float(insertion),
            "ins_minus_del": float(insertion - deletion),
            **method_intervals(stats["deletion"], stats["insertion"], seed=seed),
            "pointing_game": float(np.nanmean(stats["pointing"])) if stats["pointing"] else None,
            "ms_per_image": 1000.0 * stats["seconds"] / max(n, 1),
            "options": {**method_obj.options, **(getattr(method_obj, "resolved_options", None) or {})},
            **({"caveat": caveats[label]} if caveats.get(label) else {}),
            "per_image": {"deletion": [float(v) for v in stats["deletion"]],
                          "insertion": [float(v) for v in stats["insertion"]]},
        }
        if stats["pointing"]:
            report["methods"][label]["per_image"]["pointing"] = [None if np.isnan(v) else float(v)
                                                                 for v in stats["pointing"]]
    return report


def _familiarity_summary(verdicts: list, files: list) -> dict:
    """How many images the unfamiliar-image check flags (`explainers.familiarity`): their scores mean little."""
    flagged = [name for name, verdict in zip(files, verdicts) if verdict["unfamiliar"]]
    return {"threshold": verdicts[0]["threshold"] if verdicts else None, "unfamiliar": len(flagged),
            "unfamiliar_files": flagged, "scores": [verdict["score"] for verdict in verdicts]}


def _gather(totals: dict, correct: int, indices: list, n: int) -> tuple:
    """All processes' per-image scores, put back in image order (every process gets the whole)."""
    keys = ("deletion", "insertion", "pointing")
    per_item = {(label, key): totals[label][key] for label in totals for key in keys}
    sums = {("seconds", label): totals[label]["seconds"] for label in totals}
    per_item, sums = gather_items(per_item, {**sums, "correct": correct}, indices, n)
    merged = {}
    for label in totals:
        row = {"seconds": sums[("seconds", label)]}
        for key in keys:
            values = per_item[(label, key)]
            row[key] = values if any(v is not None for v in values) else []
        merged[label] = row
    return merged, sums["correct"]


TABLE_SCORES = ("deletion_auc", "insertion_auc", "ins_minus_del")  # with intervals; then the pointing game


def interval_key(score: str) -> str:
    """Where a report keeps a score's interval: 'deletion_auc' -> 'deletion_ci95' (`statistics.method_intervals`)."""
    return f"{score.removesuffix('_auc')}_ci95"


def format_table(report: dict) -> str:
    """The evaluate table; each AUC with its 95% interval where the report has one."""
    accuracy = ("no labels" if report.get("accuracy") is None else f"accuracy {report['accuracy']:.4f}")
    lines = [f"{report['model']}: {report['n_images']} images, {accuracy}, "
             f"reference {report['protocol']['reference']}, {report['protocol']['steps']} steps"
             + (" (95% bootstrap intervals)" if report["n_images"] > 1 else ""),
             f"{'method':<28}" + "".join(f"{METRICS[key].heading():>27}" for key in TABLE_SCORES)
             + f"{METRICS['pointing_game'].heading():>26}{'ms/image':>11}"]
    checked = report.get("familiarity")
    if checked and checked["unfamiliar"]:
        lines.insert(1, f"warning: {checked['unfamiliar']} of {report['n_images']} images do not look like the images "
                        f"{report['model']} learned from (the familiarity check; report: familiarity.unfamiliar_files)"
                        ": their predictions, and so their scores, may mean nothing")
    for label, row in report["methods"].items():
        pointing = "-" if row["pointing_game"] is None else f"{row['pointing_game']:.3f}"
        cells = "".join(f"{format_interval(row[key], row.get(interval_key(key))):>27}" for key in TABLE_SCORES)
        lines.append(f"{label:<28}{cells}{pointing:>26}{row['ms_per_image']:>11.1f}")
    return "\n".join(lines)
