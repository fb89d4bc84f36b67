"""Decoy BloodMNIST: BloodMNIST with a known shortcut, and cell masks, for testing CAMAL.

    python -m explainers decoy-bloodmnist --src ../shared/data/bloodmnist/64 --out data/decoy-bloodmnist [--train-limit 2000]

The decoy (choice, after the "decoy MNIST" of Ross et al. 2017): a small filled square (`square` px, default 6
at 64 px, about 0.9% of the image) `margin` px from a corner.
- train and val: its colour is `PALETTE[class]` and its corner is `CORNERS[class % 4]`: a perfect shortcut;
- test: colour and corner drawn at random, independently of the class (seeded): the "decoy-randomised" test;
- test-clean: the same test images without any square (clean accuracy).

Cell masks (choice: a documented classical segmentation, `cell_mask`): the stained cell is darker in the green
channel than the pale background and red cells. Green channel, 3x3 Gaussian blur, Otsu threshold (dark =
foreground), 5x5 elliptic opening; the connected component (>= 0.5% of the image) nearest the centre; its
convex hull, filled, dilated by a 7x7 ellipse (a margin of cytoplasm). If that fails or covers less than 2% or
more than 70% of the image, the central disk (radius 30% of the side) is used instead (`mask_source` says
which). The decoy square is always removed from the mask. `--mask disk` uses the central disk for every image.

Output: one mask set per split (`out/{train,val,test,test-clean}/`, see `explainers.masks`): PNG images,
PNG masks, `labels.csv`, `masks.csv` (file,mask_file,class_index,mask_source), plus `out/decoy.json`
describing the construction and `out/classes.txt`.
"""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

from .masks import write_mask_set

PALETTE = ((255, 0, 0), (0, 200, 0), (0, 0, 255), (255, 255, 0), (0, 255, 255), (255, 0, 255), (255, 128, 0),
           (0, 0, 0))
CORNERS = ("top-left", "top-right", "bottom-left", "bottom-right")
DISK_RADIUS = 0.30


def central_disk(h: int, w: int, radius: float = DISK_RADIUS) -> np.ndarray:
    ys, xs = np.mgrid[0:h, 0:w]
    r = radius * min(h, w)
    return (ys - (h - 1) / 2) ** 2 + (xs - (w - 1) / 2) ** 2 <= r * r


def cell_mask(rgb: np.ndarray, method: str = "segment") -> tuple:
    """(H x W bool mask of the central stained cell, 'segment' or 'disk'); see the module docstring."""
    import cv2

    h, w = rgb.shape[:2]
    if method == "disk":
        return central_disk(h, w), "disk"
    green = cv2.GaussianBlur(np.ascontiguousarray(rgb[..., 1]), (3, 3), 0)
    _, binary = cv2.threshold(green, 0, 255, cv2.THRESH_BINARY_INV + cv2.THRESH_OTSU)
    binary = cv2.morphologyEx(binary, cv2.MORPH_OPEN, cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (5, 5)))
    count, labels, stats, _ = cv2.connectedComponentsWithStats(binary)
    best, best_distance = None, np.inf
    for index in range(1, count):
        if stats[index, cv2.CC_STAT_AREA] < 0.005 * h * w:
            continue
        ys, xs = np.nonzero(labels == index)
        distance = np.min((ys - (h - 1) / 2) ** 2 + (xs - (w - 1) / 2) ** 2)
        if distance < best_distance:
            best, best_distance = index, distance
    if best is None:
        return central_disk(h, w), "disk"
    points = np.argwhere(labels == best)[:, ::-1].astype(np.int32)  # (x, y)
    mask = np.zeros((h, w), np.uint8)
    cv2.fillConvexPoly(mask, cv2.convexHull(points), 1)
    mask = cv2.dilate(mask, cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (7, 7))).astype(bool)
    if not 0.02 <= mask.mean() <= 0.70:
        return central_disk(h, w), "disk"
    return mask, "segment"


def square_box(corner: int, h: int, w: int, square: int, margin: int) -> tuple:
    """(y0, y1, x0, x1) of the decoy square in `CORNERS[corner]`."""
    top = corner in (0, 1)
    left = corner in (0, 2)
    y0 = margin if top else h - margin - square
    x0 = margin if left else w - margin - square
    return y0, y0 + square, x0, x0 + square


def add_decoy(rgb: np.ndarray, colour, corner: int, square: int = 6, margin: int = 2) -> tuple:
    """A copy of the image with the square painted, and the square's H x W bool region."""
    out = rgb.copy()
    h, w = out.shape[:2]
    y0, y1, x0, x1 = square_box(corner, h, w, square, margin)
    out[y0:y1, x0:x1] = colour
    region = np.zeros((h, w), bool)
    region[y0:y1, x0:x1] = True
    return out, region


def _read_split(folder: Path) -> list:
    with (folder / "labels.csv").open(newline="") as handle:
        return [(row["file"], int(row["class_index"])) for row in csv.DictReader(handle)]


def build_decoy_bloodmnist(src, out, *, train_limit: int | None = None, val_limit: int | None = None,
                           test_limit: int | None = None, square: int = 6, margin: int = 2, mask: str = "segment",
                           seed: int = 0, correlation: float = 1.0) -> dict:
    """Build decoy BloodMNIST from the BloodMNIST folders in `src` (train/val/test with labels.csv).

    `correlation`: fraction of train/val images whose square follows the class rule (the rest random).
    Limits take a seeded random subset of each split (in the original order)."""
    src, out = Path(src), Path(out)
    rng = np.random.default_rng(seed)
    summary = {"source": str(src), "square_px": square, "margin_px": margin, "mask_method": mask, "seed": seed,
               "correlation": correlation, "palette": [list(c) for c in PALETTE], "corners": list(CORNERS),
               "rule": "train/val: colour PALETTE[class], corner CORNERS[class % 4]; test: random; "
                       "test-clean: no square", "splits": {}}
    plans = (("train", "train", train_limit, "class"), ("val", "val", val_limit, "class"),
             ("test", "test", test_limit, "random"), ("test-clean", "test", test_limit, "none"))
    subsets = {}
    for out_split, src_split, limit, rule in plans:
        folder = src / src_split
        if not (folder / "labels.csv").exists():
            continue
        if src_split not in subsets:
            rows = _read_split(folder)
            if limit and limit < len(rows):
                keep = np.sort(np.random.default_rng(seed + len(src_split)).choice(len(rows), limit, replace=False))
                rows = [rows[i] for i in keep]
            subsets[src_split] = rows
        rows = subsets[src_split]
        items, sources = [], {"segment": 0, "disk": 0}
        for file_name, label in rows:
            with Image.open(folder / file_name) as handle:
                rgb = np.asarray(handle.convert("RGB"))
            cell, source = cell_mask(rgb, mask)
            image = rgb
            if rule != "none":
                if rule == "class" and rng.random() < correlation:
                    colour, corner = PALETTE[label % len(PALETTE)], label % 4
                else:
                    colour, corner = PALETTE[int(rng.integers(len(PALETTE)))], int(rng.integers(4))
                image, region = add_decoy(rgb, colour, corner, square, margin)
                cell = cell & ~region
            sources[source] += 1
            items.append((Path(file_name).stem, image, cell, label, source))
        write_mask_set(out / out_split, items)
        summary["splits"][out_split] = {"count": len(items), "decoy": rule, "mask_sources": sources}
    if not summary["splits"]:
        raise ValueError(f"No BloodMNIST split (train/, val/ or test/ with labels.csv) under {src}: nothing to build.")
    for candidate in (src / "classes.txt", src.parent / "classes.txt"):
        if candidate.exists():
            shutil.copy(candidate, out / "classes.txt")
            break
    (out / "decoy.json").write_text(json.dumps(summary, indent=2))
    return summary


def add_decoy_parser(commands) -> None:
    parser = commands.add_parser("decoy-bloodmnist", help=__doc__.split("\n\n")[0].replace("%", "%%"))
    parser.add_argument("--src", required=True, help="BloodMNIST folder with train/val/test (labels.csv)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--train-limit", type=int, default=None)
    parser.add_argument("--val-limit", type=int, default=None)
    parser.add_argument("--test-limit", type=int, default=None)
    parser.add_argument("--square", type=int, default=6)
    parser.add_argument("--mask", choices=["segment", "disk"], default="segment")
    parser.add_argument("--correlation", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(handler=cmd_decoy)


def cmd_decoy(args) -> int:
    summary = build_decoy_bloodmnist(args.src, args.out, train_limit=args.train_limit, val_limit=args.val_limit,
                                     test_limit=args.test_limit, square=args.square, mask=args.mask,
                                     seed=args.seed, correlation=args.correlation)
    print(json.dumps(summary["splits"], indent=2))
    return 0
