"""Fit and measure the segmentation model's unfamiliar-photo check (`explainers/segmentation/familiarity.py`):

    python bench/familiarity_segmentation.py --data ../shared/data/bccd --model bccd-segformer \
        --out weights/bccd-segformer.familiarity.safetensors --check photos=assets/photos \
        --check imagenet=../shared/data/imagenet-samples --check bloodmnist-cells=../shared/data/bloodmnist/64/test

Fitted on BCCD's train smears (every 32 x 32 pixel cell of the last encoder stage), threshold at the 99% quantile
of the val smears' scores; then counted: the test smears flagged (should be few: about 1 in 100 smears like the
training ones) and each --check folder's photos flagged (with Wilson 95% intervals). Each photo is prepared as the
segmentation view prepares an upload (the whole photo resized to the model's input, no crop). Writes the statistics
and a JSON card beside them (`.json`).
"""
import argparse
import json
import sys
from pathlib import Path

import torch

from explainers import familiarity
from explainers.models import load_model
from explainers.segmentation import familiarity as seg_familiarity
from explainers.statistics import wilson_interval
from saliency_lab.segmentation import SegmentationView

SUFFIXES = (".jpg", ".jpeg", ".png")


def split_files(data: Path, split: str) -> list:
    names = (data / "BCCD" / "ImageSets" / "Main" / f"{split}.txt").read_text().split()
    return [data / "BCCD" / "JPEGImages" / f"{name}.jpg" for name in names]


def folder_files(folder: Path, limit: int) -> list:
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in SUFFIXES)
    step = max(1, len(files) // limit) if limit else 1
    return files[::step][:limit] if limit else files


def tensors(view, files):
    for path in files:
        yield view.prepare(str(path))[0]


def check(bundle, view, stats, name, files) -> dict:
    found = [seg_familiarity.scores(stats, seg_familiarity.logits_and_cells(bundle, t)[1]).item()
             for t in tensors(view, files)]
    values = torch.tensor(found)
    flagged = int((values > stats.threshold).sum())
    row = {"name": name, "images": len(found), "flagged": flagged, "share": flagged / max(1, len(found)),
           "share_ci95": list(wilson_interval(flagged, len(found))), "median_score": float(values.median()),
           "scores": {Path(f).name: round(s, 2) for f, s in zip(files, found)} if len(found) <= 10 else None}
    low, high = row["share_ci95"]
    print(f"  {name}: {flagged}/{len(found)} flagged ({row['share']:.1%}, 95% [{low:.1%}, {high:.1%}]), median "
          f"score {row['median_score']:.2f}", flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="the BCCD folder (BCCD/JPEGImages, BCCD/ImageSets/Main)")
    parser.add_argument("--model", default="bccd-segformer")
    parser.add_argument("--out", required=True)
    parser.add_argument("--check", action="append", default=[], metavar="NAME=FOLDER")
    parser.add_argument("--limit", type=int, default=200, help="at most N photos per --check folder (spread)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bundle = load_model(args.model)
    view = SegmentationView(bundle)
    data = Path(args.data)
    stats = seg_familiarity.fit(bundle, tensors(view, split_files(data, "train")),
                                tensors(view, split_files(data, "val")),
                                source={"train": "BCCD train split", "val": "BCCD val split"})
    out = familiarity.save(stats, args.out)
    print(f"{bundle.name}: threshold {stats.threshold:.2f} (the {stats.source['quantile']:.0%} quantile of "
          f"{len(stats.val_scores)} val smears); wrote {out}", flush=True)
    report = {"kind": "familiarity-statistics", **stats.source, "threshold": stats.threshold,
              "checks": [check(bundle, view, stats, "bccd-test", split_files(data, "test"))]}
    for spec in args.check:
        name, _, folder = spec.rpartition("=")
        report["checks"].append(check(bundle, view, stats, name or Path(folder).name,
                                      folder_files(Path(folder), args.limit)))
    report["command"] = "python bench/familiarity_segmentation.py " + " ".join(sys.argv[1:])
    Path(out).with_suffix(".json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
