"""Pictures of derived BCCD masks beside their photographs, for checking the mask rule by eye (docs/seg-masks*.png).

    python bench/seg_mask_sheet.py --data .devdata/bccd-seg --out docs/seg-masks-1.png --names BloodImage_00007,...

Left: the photograph (prepared size). Right: the derived mask over it (RBC red, WBC blue, platelets yellow,
ignored stained pixels green) and the human boxes as outlines in their class's colour.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

IGNORE_COLOUR = (0, 200, 0)


def tile(folder: Path, name: str, meta: dict, boxes: dict) -> Image.Image:
    image = np.asarray(Image.open(folder / "images" / f"{name}.jpg").convert("RGB")).astype(np.float32)
    mask = np.asarray(Image.open(folder / "masks" / f"{name}.png"))
    colours = np.array(meta["colours"], np.float32)
    over = image.copy()
    for index in range(1, len(colours)):
        over[mask == index] = 0.45 * image[mask == index] + 0.55 * colours[index]
    ignored = mask == meta["ignore_index"]
    over[ignored] = 0.5 * image[ignored] + 0.5 * np.array(IGNORE_COLOUR, np.float32)
    left, right = Image.fromarray(image.astype(np.uint8)), Image.fromarray(over.astype(np.uint8))
    draw = ImageDraw.Draw(right)
    class_index = {name: i for i, name in enumerate(meta["classes"])}
    for class_name, x0, y0, x1, y1 in boxes.get(name, []):
        draw.rectangle([x0, y0, x1, y1], outline=tuple(meta["colours"][class_index[class_name]]), width=1)
    draw.text((4, 4), name, fill=(0, 0, 0))
    out = Image.new("RGB", (left.width * 2 + 4, left.height), "white")
    out.paste(left, (0, 0))
    out.paste(right, (left.width + 4, 0))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a prepared folder (python -m explainers prepare-seg)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--names", required=True, help="comma-separated image names")
    args = parser.parse_args()
    folder = Path(args.data)
    meta = json.loads((folder / "meta.json").read_text())
    boxes = json.loads((folder / "boxes.json").read_text())
    tiles = [tile(folder, name, meta, boxes) for name in args.names.split(",")]
    sheet = Image.new("RGB", (tiles[0].width, sum(t.height + 4 for t in tiles) - 4), "white")
    top = 0
    for part in tiles:
        sheet.paste(part, (0, top))
        top += part.height + 4
    sheet.save(args.out, optimize=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
