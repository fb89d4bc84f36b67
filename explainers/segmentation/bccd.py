"""Per-pixel masks for the BCCD smears, derived from the human boxes, and the compact prepared data set.

BCCD (MIT licence) has 364 smear photographs of 640x480 with Pascal VOC boxes of three classes (RBC, WBC,
Platelets) and its own train / val / test split. It has no masks, so they are derived, one rule per class, at
full resolution, then reduced (nearest) to the prepared size:

- stained: pixels whose HSV saturation (blurred by a 5x5 Gaussian, then clipped at the image's 85th percentile)
  is above the image's Otsu threshold (cells are stained pink or purple on a pale background), closed (5x5
  ellipse) and with holes filled (a red cell's pale centre belongs to it). The clip keeps the few, very
  saturated white-cell nuclei from taking Otsu's split for themselves.
- RBC: inside the ellipse inscribed in the box, the stained pixels; the convex hull of the largest connected
  piece (a red cell is convex, and its pale centre or a pale side would otherwise be cut out), within the ellipse.
  Where that keeps under a quarter of the ellipse (a pale cell, a box over other cells), the ellipse itself.
- WBC: OpenCV GrabCut initialised with the box (5 iterations, on the box plus a 20-pixel margin), the largest
  piece inside the box, holes filled; where GrabCut keeps under a fifth of the box, the ellipse.
- Platelets: inside the inscribed ellipse, the pixels above an Otsu threshold of saturation computed inside the
  box only (platelets are small dark-purple specks); under a fifth of the ellipse: the ellipse.
- Painted in the order RBC, WBC, Platelets: where derived masks overlap, the rarer class wins.
- Ignore (255): stained pieces of at least 400 pixels that no derived mask covers (cells outside every box, and
  the parts of neighbouring cells that a box crosses). BCCD's annotators left many red cells without a box;
  calling them background would teach a model (and score a map) against real cells, so neither training nor
  scoring counts those pixels.

    python -m explainers prepare-seg --source BCCD_DIR --out .devdata/bccd-seg

writes `images/NAME.jpg` (RGB, `--size` W H, JPEG quality 90), `masks/NAME.png` (class index per pixel,
255 = ignore), `boxes.json` (the human boxes scaled to the prepared size), `splits.json` and `meta.json`
(classes, colours, the rule's counts: how often each fallback was taken).
"""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

CLASS_NAMES = ["background", "RBC", "WBC", "Platelets"]
CLASS_COLOURS = [(0, 0, 0), (220, 40, 40), (60, 90, 230), (250, 200, 30)]
IGNORE_INDEX = 255
BOX_CLASSES = {"RBC": 1, "WBC": 2, "Platelets": 3}
PAINT_ORDER = ("RBC", "WBC", "Platelets")
UNBOXED_MIN_PIXELS = 400


def read_boxes(xml_path) -> list:
    """[(class name, x0, y0, x1, y1)] of a Pascal VOC file, clipped to the image; degenerate boxes dropped."""
    root = ET.parse(str(xml_path)).getroot()
    width = int(float(root.findtext("size/width", "640")))
    height = int(float(root.findtext("size/height", "480")))
    boxes = []
    for item in root.iter("object"):
        name = (item.findtext("name") or "").strip()
        if name not in BOX_CLASSES:
            continue
        box = item.find("bndbox")
        x0, y0, x1, y1 = (int(float(box.findtext(key))) for key in ("xmin", "ymin", "xmax", "ymax"))
        x0, x1 = sorted((max(0, min(x0, width - 1)), max(0, min(x1, width - 1))))
        y0, y1 = sorted((max(0, min(y0, height - 1)), max(0, min(y1, height - 1))))
        if x1 - x0 >= 2 and y1 - y0 >= 2:
            boxes.append((name, x0, y0, x1, y1))
    return boxes


def _fill_holes(binary: np.ndarray) -> np.ndarray:
    import cv2

    padded = np.pad(binary.astype(np.uint8), 1)
    flood = padded.copy()
    mask = np.zeros((padded.shape[0] + 2, padded.shape[1] + 2), np.uint8)
    cv2.floodFill(flood, mask, (0, 0), 1)
    holes = flood == 0
    return (padded.astype(bool) | holes)[1:-1, 1:-1]


def _largest_piece(binary: np.ndarray) -> np.ndarray:
    import cv2

    count, labels, stats, _ = cv2.connectedComponentsWithStats(binary.astype(np.uint8), connectivity=8)
    if count <= 1:
        return np.zeros_like(binary, dtype=bool)
    biggest = 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))
    return labels == biggest


def _convex_hull(binary: np.ndarray) -> np.ndarray:
    """A red cell is convex: the hull of its stained ring or crescent is the whole cell."""
    import cv2

    points = cv2.findNonZero(binary.astype(np.uint8))
    canvas = np.zeros(binary.shape, np.uint8)
    if points is not None and len(points) >= 3:
        cv2.fillConvexPoly(canvas, cv2.convexHull(points), 1)
    return canvas.astype(bool)


def _ellipse(height: int, width: int, box) -> np.ndarray:
    import cv2

    _, x0, y0, x1, y1 = box
    canvas = np.zeros((height, width), np.uint8)
    centre = ((x0 + x1) // 2, (y0 + y1) // 2)
    axes = (max(1, (x1 - x0) // 2), max(1, (y1 - y0) // 2))
    cv2.ellipse(canvas, centre, axes, 0, 0, 360, 1, thickness=-1)
    return canvas.astype(bool)


def stained_pixels(image_rgb: np.ndarray) -> np.ndarray:
    """Pixels of stained matter (cells) by an Otsu threshold of HSV saturation, closed, holes filled."""
    import cv2

    saturation = cv2.GaussianBlur(cv2.cvtColor(image_rgb, cv2.COLOR_RGB2HSV)[..., 1], (5, 5), 0)
    # white cells' nuclei are far more saturated than red cells: without the clip, Otsu splits nuclei from
    # everything else and the red cells fall below the threshold
    saturation = np.minimum(saturation, np.percentile(saturation, 85)).astype(np.uint8)
    _, binary = cv2.threshold(saturation, 0, 1, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
    kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (5, 5))
    binary = cv2.morphologyEx(binary, cv2.MORPH_CLOSE, kernel)
    return _fill_holes(binary.astype(bool))


def _rbc_mask(stained, box, counts) -> np.ndarray:
    ellipse = _ellipse(*stained.shape, box)
    piece = _convex_hull(_largest_piece(stained & ellipse)) & ellipse
    if piece.sum() < 0.25 * ellipse.sum():
        counts["RBC_ellipse"] += 1
        return ellipse
    counts["RBC_threshold"] += 1
    return piece


def _wbc_mask(image_rgb, box, counts) -> np.ndarray:
    import cv2

    height, width = image_rgb.shape[:2]
    _, x0, y0, x1, y1 = box
    margin = 20
    cx0, cy0, cx1, cy1 = max(0, x0 - margin), max(0, y0 - margin), min(width, x1 + margin), min(height, y1 + margin)
    crop = np.ascontiguousarray(image_rgb[cy0:cy1, cx0:cx1, ::-1])  # GrabCut reads BGR
    grab = np.zeros(crop.shape[:2], np.uint8)
    rect = (x0 - cx0, y0 - cy0, max(1, x1 - x0), max(1, y1 - y0))
    background_model, foreground_model = np.zeros((1, 65), np.float64), np.zeros((1, 65), np.float64)
    cv2.setRNGSeed(0)
    cv2.grabCut(crop, grab, rect, background_model, foreground_model, 5, cv2.GC_INIT_WITH_RECT)
    full = np.zeros((height, width), bool)
    full[cy0:cy1, cx0:cx1] = (grab == cv2.GC_FGD) | (grab == cv2.GC_PR_FGD)
    inside = np.zeros_like(full)
    inside[y0:y1 + 1, x0:x1 + 1] = True
    piece = _fill_holes(_largest_piece(full & inside))
    if piece.sum() < 0.2 * (x1 - x0) * (y1 - y0):
        counts["WBC_ellipse"] += 1
        return _ellipse(height, width, box)
    counts["WBC_grabcut"] += 1
    return piece


def _platelet_mask(image_rgb, box, counts) -> np.ndarray:
    import cv2

    height, width = image_rgb.shape[:2]
    _, x0, y0, x1, y1 = box
    ellipse = _ellipse(height, width, box)
    saturation = cv2.cvtColor(np.ascontiguousarray(image_rgb[y0:y1 + 1, x0:x1 + 1]), cv2.COLOR_RGB2HSV)[..., 1]
    _, local = cv2.threshold(saturation, 0, 1, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
    full = np.zeros((height, width), bool)
    full[y0:y1 + 1, x0:x1 + 1] = local.astype(bool)
    piece = _fill_holes(full & ellipse)
    if piece.sum() < 0.2 * ellipse.sum():
        counts["Platelets_ellipse"] += 1
        return ellipse
    counts["Platelets_threshold"] += 1
    return piece


def derive_mask(image_rgb: np.ndarray, boxes: list, counts: dict | None = None) -> np.ndarray:
    """H x W uint8 class indices (0 background, 1 RBC, 2 WBC, 3 Platelets, 255 ignore) from the boxes."""
    import cv2

    counts = counts if counts is not None else _new_counts()
    stained = stained_pixels(image_rgb)
    mask = np.zeros(image_rgb.shape[:2], np.uint8)
    for class_name in PAINT_ORDER:
        for box in (b for b in boxes if b[0] == class_name):
            if class_name == "RBC":
                piece = _rbc_mask(stained, box, counts)
            elif class_name == "WBC":
                piece = _wbc_mask(image_rgb, box, counts)
            else:
                piece = _platelet_mask(image_rgb, box, counts)
            mask[piece] = BOX_CLASSES[class_name]
    count, labels, stats, _ = cv2.connectedComponentsWithStats((stained & (mask == 0)).astype(np.uint8), 8)
    for index in range(1, count):
        if stats[index, cv2.CC_STAT_AREA] >= UNBOXED_MIN_PIXELS:
            mask[(labels == index) & (mask == 0)] = IGNORE_INDEX
    return mask


def _new_counts() -> dict:
    return {key: 0 for key in ("RBC_threshold", "RBC_ellipse", "WBC_grabcut", "WBC_ellipse",
                               "Platelets_threshold", "Platelets_ellipse")}


def read_splits(source: Path) -> dict:
    main = source / "BCCD" / "ImageSets" / "Main"
    return {split: [line.strip() for line in (main / f"{split}.txt").read_text().split() if line.strip()]
            for split in ("train", "val", "test")}


def prepare(source, out, size=(320, 240), quality: int = 90, limit: int | None = None) -> dict:
    """Derive every mask and write the compact data set (see the module doc); returns meta.json's content."""
    import cv2
    from PIL import Image

    from ..atomic import atomic_write_text

    source, out = Path(source), Path(out)
    splits = read_splits(source)
    names = sorted({name for names in splits.values() for name in names})[:limit]
    (out / "images").mkdir(parents=True, exist_ok=True)
    (out / "masks").mkdir(parents=True, exist_ok=True)
    counts, all_boxes = _new_counts(), {}
    width, height = size
    for name in names:
        image = np.asarray(Image.open(source / "BCCD" / "JPEGImages" / f"{name}.jpg").convert("RGB"))
        boxes = read_boxes(source / "BCCD" / "Annotations" / f"{name}.xml")
        mask = derive_mask(image, boxes, counts)
        sx, sy = width / image.shape[1], height / image.shape[0]
        small = cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA)
        Image.fromarray(small).save(out / "images" / f"{name}.jpg", quality=quality)
        Image.fromarray(cv2.resize(mask, (width, height), interpolation=cv2.INTER_NEAREST)).save(
            out / "masks" / f"{name}.png", optimize=True)
        all_boxes[name] = [[c, round(x0 * sx, 1), round(y0 * sy, 1), round(x1 * sx, 1), round(y1 * sy, 1)]
                           for c, x0, y0, x1, y1 in boxes]
    kept = set(names)
    meta = {"classes": CLASS_NAMES, "colours": [list(c) for c in CLASS_COLOURS], "ignore_index": IGNORE_INDEX,
            "size": [width, height], "source": "BCCD (MIT licence), boxes by its annotators",
            "rule": __doc__.split("\n\n")[1].strip(), "rule_counts": counts, "images": len(names)}
    atomic_write_text(out / "splits.json", json.dumps({k: [n for n in v if n in kept] for k, v in splits.items()}))
    atomic_write_text(out / "boxes.json", json.dumps(all_boxes))
    atomic_write_text(out / "meta.json", json.dumps(meta, indent=2))
    return meta


def add_prepare_arguments(parser) -> None:
    parser.add_argument("--source", required=True, help="folder holding BCCD/ (JPEGImages, Annotations, ImageSets)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", type=int, nargs=2, default=(320, 240), metavar=("W", "H"))
    parser.add_argument("--quality", type=int, default=90)
    parser.add_argument("--limit", type=int, default=None, help="only the first N images (a quick look)")


def cmd_prepare(args) -> int:
    meta = prepare(args.source, args.out, tuple(args.size), args.quality, args.limit)
    print(json.dumps({"images": meta["images"], "rule_counts": meta["rule_counts"]}, indent=2))
    return 0


def main(argv=None) -> int:
    """`python -m explainers.segmentation.bccd ...`: the same as `python -m explainers prepare-seg ...`."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m explainers.segmentation.bccd",
                                     description="Derive BCCD masks from the boxes and write the prepared data set")
    add_prepare_arguments(parser)
    return cmd_prepare(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
