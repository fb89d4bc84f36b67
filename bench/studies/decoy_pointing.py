"""Pointing at the decoy square: the classifiers' test with a known answer (docs/method-notes.md, the rule).

On the decoy test split (square colour and corner random), the square-led images are those whose prediction by
`--model` is the class of the square's colour and differs from its prediction without the square (`test-clean`).
Per square-led image, each method's map of the predicted class: a hit when its largest value lies on the square
grown by 1 px, and its mass there; the same for the answers that need no model (a random map, centre-first, the
four corner squares) and, as a contrast, the same methods on `--contrast` (the CAMAL fine-tune) for the same
images and its own predicted class. Writes a JSON summary (means over images with 95% bootstrap intervals, paired
differences to the answers) and a Markdown table.

    python bench/studies/decoy_pointing.py --data DECOY --model weights/decoy-bloodmnist-cnn.json \
        --contrast weights/decoy-bloodmnist-cnn-camal.json --out bench/results/decoy-pointing.json
DECOY: a folder built by `python -m explainers decoy-bloodmnist` (its test and test-clean splits).
"""
from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

METHODS = {"gradcam": {}, "occlusion": {}, "rise": {"n_masks": 1000, "batch_size": 250}, "intgrad": {"steps": 16}}
ANSWERS = ("random map", "centre first", "the four corners")


def _images(folder: Path) -> tuple:
    rows = list(csv.DictReader((folder / "labels.csv").open()))
    pictures = np.stack([np.asarray(Image.open(folder / row["file"]).convert("RGB")) for row in rows])
    return [row["file"] for row in rows], pictures, np.array([int(row["class_index"]) for row in rows])


def square_colour_class(picture: np.ndarray, square: np.ndarray) -> int | None:
    """The palette class whose colour the square's pixels have (None: no palette colour)."""
    from explainers.decoy import PALETTE

    colour = np.median(picture[square], axis=0)
    distances = [float(np.abs(colour - np.array(p)).sum()) for p in PALETTE]
    return int(np.argmin(distances)) if min(distances) < 60 else None


def answer_maps(shape, square_size: int, margin: int) -> dict:
    height, width = shape
    rows, cols = np.mgrid[0:height, 0:width]
    centre = -np.hypot(rows - (height - 1) / 2, cols - (width - 1) / 2)
    corners = np.zeros(shape, np.float32)
    for top in (margin, height - margin - square_size):
        for left in (margin, width - margin - square_size):
            corners[top:top + square_size, left:left + square_size] = 1
    return {"random map": np.random.default_rng(0).random(shape), "centre first": centre,
            "the four corners": corners}


def scores(heat: np.ndarray, grown: np.ndarray) -> dict:
    flat = int(np.argmax(heat))
    positive = np.clip(heat, 0, None)
    total = float(positive.sum())
    return {"hit": bool(grown.flat[flat]), "mass": float(positive[grown].sum() / total) if total > 0 else 0.0}


def run(args) -> dict:
    from explainers.engine import explain_batch
    from explainers.methods import get_method
    from explainers.models import load_bundle
    from explainers.segmentation.context import dilate

    torch.set_num_threads(1)
    models = {"model": load_bundle(args.model), "contrast": load_bundle(args.contrast)}
    names, decoyed, labels = _images(Path(args.data) / "test")
    clean_names, clean, _ = _images(Path(args.data) / "test-clean")
    assert names == clean_names, "test and test-clean must list the same images"
    squares = (np.abs(decoyed.astype(int) - clean.astype(int)).sum(axis=-1) > 0)
    to_tensor = lambda x: torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255  # noqa: E731
    with torch.no_grad():
        predicted = {key: bundle(to_tensor(decoyed)).argmax(1).numpy() for key, bundle in models.items()}
        predicted_clean = models["model"](to_tensor(clean)).argmax(1).numpy()
    colour_class = [square_colour_class(decoyed[i], squares[i]) if squares[i].any() else None
                    for i in range(len(names))]
    led_all = [i for i in range(len(names)) if colour_class[i] is not None
               and predicted["model"][i] == colour_class[i] and predicted_clean[i] != predicted["model"][i]]
    led = led_all[:args.limit]  # the first ones in file order
    answers = answer_maps(decoyed.shape[1:3], 6 * decoyed.shape[1] // 64, 2 * decoyed.shape[1] // 64)
    records, seconds = [], {}
    started = time.perf_counter()
    for i in led:
        grown = dilate(torch.from_numpy(squares[i]), 1).numpy()
        row = {"image": names[i], "label": int(labels[i]), "predicted": int(predicted["model"][i]),
               "predicted_clean": int(predicted_clean[i]), "contrast_predicted": int(predicted["contrast"][i]),
               "square_share": float(grown.mean()), "rows": {}}
        image = to_tensor(decoyed[i:i + 1])
        for key, bundle in models.items():
            for name, options in METHODS.items():
                batch = explain_batch(bundle, get_method(name, **options), image, [int(predicted[key][i])])
                row["rows"][f"{key}: {name}"] = scores(batch.maps[0].float().numpy(), grown)
                seconds.setdefault(name, []).append(batch.seconds)
        for name, heat in answers.items():
            row["rows"][f"answer: {name}"] = scores(heat, grown)
        records.append(row)
    summary = summarise(records)
    summary.update(images=len(names), square_led_all=len(led_all), square_led=len(led),
                   seconds_total=round(time.perf_counter() - started, 1),
                   median_seconds=({k: round(float(np.median(v)), 3) for k, v in seconds.items()}),
                   model=Path(args.model).stem, contrast=Path(args.contrast).stem,
                   data="decoy test split built by `python -m explainers decoy-bloodmnist --src "
                        "../shared/data/bloodmnist/64 --test-limit 800`", records=records)
    return summary


def summarise(records: list) -> dict:
    from explainers.statistics import bootstrap_ci, paired_difference

    rows = list(records[0]["rows"])
    out = {"rows": {}, "minus_answers": {}}
    for row in rows:
        out["rows"][row] = {}
        for key in ("hit", "mass"):
            values = np.array([float(r["rows"][row][key]) for r in records])
            low, high = bootstrap_ci(values)
            out["rows"][row][key] = {"mean": round(float(values.mean()), 3), "ci95": [round(float(low), 3),
                                                                                      round(float(high), 3)]}
    for row in [r for r in rows if r.startswith("model: ")]:
        values = np.array([float(r["rows"][row]["hit"]) for r in records])
        out["minus_answers"][row] = {}
        for answer in ANSWERS + (row.replace("model: ", "contrast: "),):
            other = np.array([float(r["rows"][f"answer: {answer}" if answer in ANSWERS else answer]["hit"])
                              for r in records])
            d = paired_difference(values, other)
            out["minus_answers"][row][answer] = {"mean": round(float(d["mean"]), 3),
                                                 "ci95": [round(float(v), 3) for v in d["ci95"]]}
    return out


def markdown(summary: dict) -> str:
    lines = [f"The first {summary['square_led']} (in file order) of the {summary['square_led_all']} square-led "
             f"images of {summary['images']} decoy test images ({summary['model']}; "
             f"contrast: {summary['contrast']}). Mean over images [95% bootstrap interval].", "",
             "| row | hit rate | mass on the square |", "|---|---|---|"]
    for row, values in summary["rows"].items():
        lines.append(f"| {row} | " + " | ".join(f"{values[k]['mean']:.3f} [{values[k]['ci95'][0]:.3f}, "
                                                f"{values[k]['ci95'][1]:.3f}]" for k in ("hit", "mass")) + " |")
    lines += ["", "Hit rate, the method on the model minus each answer (paired over images):", "",
              "| method | " + " | ".join(list(ANSWERS) + ["same method on the contrast"]) + " |",
              "|---" * (len(ANSWERS) + 2) + "|"]
    for row, differences in summary["minus_answers"].items():
        lines.append(f"| {row.removeprefix('model: ')} | " + " | ".join(
            f"{d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]" for d in differences.values()) + " |")
    lines += ["", "Median seconds per map (one thread): " + ", ".join(f"{k} {v}" for k, v in
                                                                      summary["median_seconds"].items())]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--model", default="weights/decoy-bloodmnist-cnn.json")
    parser.add_argument("--contrast", default="weights/decoy-bloodmnist-cnn-camal.json")
    parser.add_argument("--limit", type=int, default=None, help="at most this many square-led images")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    summary = run(args)
    Path(args.out).write_text(json.dumps(summary, indent=1))
    Path(args.out).with_suffix(".md").write_text(markdown(summary) + "\n")
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
