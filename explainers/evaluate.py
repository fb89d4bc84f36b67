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
from .data import UNLABELLED, item_names, open_dataset, split_read
from .distributed import gather_items, world
from .engine import explain_batch
from .methods import build_methods
from .metrics import (METRICS, REFERENCES, MapBatch, interval, per_image, pointing_tolerance, score_batch,
                      scored_metrics, summary_value)
from .statistics import N_RESAMPLES, bootstrap_ci, format_interval


def evaluate_methods(bundle, data: str, methods: list, *, split: str = "test", limit: int | None = None,
                     steps: int = 20, reference: str = "mean", seed: int = 0, batch_size: int = 16,
                     method_options: dict | None = None, masks=None, progress: bool = True) -> dict:
    """Every declared per-image metric (`metrics.scored_metrics`: deletion/insertion, the pointing game where masks
    exist, ...) for each method over a data set.

    Targets are the model's predicted classes, so `data` may be a plain folder of images (no labels.csv: the
    report's accuracy is None); each image is read as an upload of the file would be. Where the model has
    familiarity statistics the report's `familiarity` names the images unlike its training images (read in the
    pass that picks the targets). `ms_per_image` is each method's own time to produce maps (curves excluded),
    measured in this run so that methods compare as ratios. The report keeps `files` (the images, in order), each
    method's `per_image` scores in that order (keyed by metric name) and percentile-bootstrap 95% intervals of each mean
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

    totals = {label: {"scores": {}, "seconds": 0.0} for label, _ in method_objects}
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
        batch_masks = None if masks is None else torch.stack([torch.as_tensor(masks[i]) for i in batch_indices])
        for label, method_obj in method_objects:
            batch = explain_batch(bundle, method_obj, images, targets, seed=None)  # seeded once, above
            totals[label]["seconds"] += batch.seconds
            caveats[label] = batch.caveat
            scored = score_batch(MapBatch(bundle, images, batch.maps, targets, steps=steps, reference=reference,
                                          masks=batch_masks, tolerance=tolerance))
            for name, values in scored.items():
                totals[label]["scores"].setdefault(name, []).extend(values.tolist())
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
        "protocol": {"data": str(data), "split": split_read(data, split), "limit": limit, "steps": steps,
                     "reference": reference,
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
        report["methods"][label] = {
            **score_summary(totals[label]["scores"], seed=seed),
            "ms_per_image": 1000.0 * totals[label]["seconds"] / max(n, 1),
            "options": {**method_obj.options, **(getattr(method_obj, "resolved_options", None) or {})},
            **({"caveat": caveats[label]} if caveats.get(label) else {}),
            "per_image": {name: [None if np.isnan(v) else float(v) for v in values]
                          for name, values in totals[label]["scores"].items()},
        }
    return report


def _familiarity_summary(verdicts: list, files: list) -> dict:
    """How many images the unfamiliar-image check flags (`explainers.familiarity`): their scores mean little."""
    flagged = [name for name, verdict in zip(files, verdicts) if verdict["unfamiliar"]]
    return {"threshold": verdicts[0]["threshold"] if verdicts else None, "unfamiliar": len(flagged),
            "unfamiliar_files": flagged, "scores": [verdict["score"] for verdict in verdicts]}


def score_summary(scores: dict, seed: int = 0) -> dict:
    """Per scored metric its mean over the images (NaN left out) and its 95% bootstrap interval; None for a metric
    that was not scored (the pointing game without masks). `scores`: a per-image block (`metrics.per_image`)."""
    named = per_image(scores)
    row = {}
    for metric in scored_metrics():
        values = named.get(metric.name, np.empty(0))
        measured = len(values) > 0 and not np.all(np.isnan(values))
        row[metric.name] = float(np.nanmean(values)) if measured else None
        row[metric.interval_key] = bootstrap_ci(values, seed=seed) if measured else None
    return row


def _gather(totals: dict, correct: int, indices: list, n: int) -> tuple:
    """All processes' per-image scores, put back in image order (every process gets the whole)."""
    keys = [metric.name for metric in scored_metrics()]
    per_item = {(label, key): totals[label]["scores"].get(key, []) for label in totals for key in keys}
    sums = {("seconds", label): totals[label]["seconds"] for label in totals}
    per_item, sums = gather_items(per_item, {**sums, "correct": correct}, indices, n)
    merged = {}
    for label in totals:
        scores = {key: per_item[(label, key)] for key in keys if any(v is not None for v in per_item[(label, key)])}
        merged[label] = {"seconds": sums[("seconds", label)], "scores": scores}
    return merged, sums["correct"]


def format_table(report: dict) -> str:
    """The evaluate table: a column per scored metric (its heading from its declaration), each mean with its 95%
    interval where the report has one."""
    names = [metric.name for metric in scored_metrics()]
    accuracy = ("no labels" if report.get("accuracy") is None else f"accuracy {report['accuracy']:.4f}")
    lines = [f"{report['model']}: {report['n_images']} images, {accuracy}, "
             f"reference {report['protocol']['reference']}, {report['protocol']['steps']} steps"
             + (" (95% bootstrap intervals)" if report["n_images"] > 1 else ""),
             f"{'method':<28}" + "".join(f"{METRICS[name].heading():>27}" for name in names) + f"{'ms/image':>11}"]
    checked = report.get("familiarity")
    if checked and checked["unfamiliar"]:
        lines.insert(1, f"warning: {checked['unfamiliar']} of {report['n_images']} images do not look like the images "
                        f"{report['model']} learned from (the familiarity check; report: familiarity.unfamiliar_files)"
                        ": their predictions, and so their scores, may mean nothing")
    for label, row in report["methods"].items():
        cells = "".join(f"{_cell(summary_value(row, name), interval(row, name)):>27}" for name in names)
        lines.append(f"{label:<28}{cells}{row['ms_per_image']:>11.1f}")
    return "\n".join(lines)


def _cell(mean, ci) -> str:
    return "-" if mean is None else format_interval(mean, ci)
