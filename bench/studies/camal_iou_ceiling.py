"""How high can CAMAL's CAM-in-mask IoU go on BloodMNIST cells? (issue #11, item 5)

The IoU CAMAL reports is `metrics.top_pixel_iou`: the map's top-k pixels (k = the mask's area) against the
cell mask. This measures, on the decoy set's cell masks (`explainers.decoy.cell_mask`, the same segmentation),
what maps that are not a model's CAM score:
- the ideal map at a CAM grid: the mask average-pooled to g x g and upsampled bilinearly (the best a g x g CAM
  can draw, up to how it is upsampled), for the CAM grid of the model and a few others;
- a data-independent centre Gaussian (sigma = 3/16 of the side): the location prior of centred cells;
- a random map (chance), and the model's Grad-CAM for its top-1 class.

    python bench/studies/camal_iou_ceiling.py --data ../shared/data/bloodmnist/64 --split val --limit 800 \
        --model bloodmnist-cnn --out bench/results/camal-iou-ceiling-val.json
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


from explainers.data import item_names, open_dataset
from explainers.decoy import cell_mask
from explainers.methods.gradcam import gradcam_maps
from explainers.metrics import top_pixel_iou
from explainers.models import load_model
from explainers.statistics import bootstrap_ci


def centre_gaussian(count: int, height: int, width: int, sigma_fraction: float = 3 / 16) -> torch.Tensor:
    yy, xx = torch.meshgrid(torch.arange(height, dtype=torch.float32), torch.arange(width, dtype=torch.float32),
                            indexing="ij")
    sigma = sigma_fraction * min(height, width)
    blob = torch.exp(-((yy - (height - 1) / 2) ** 2 + (xx - (width - 1) / 2) ** 2) / (2 * sigma ** 2))
    return blob.expand(count, height, width)


def ideal_map(masks: torch.Tensor, grid: tuple) -> torch.Tensor:
    low = F.adaptive_avg_pool2d(masks.float().unsqueeze(1), grid)
    return F.interpolate(low, size=tuple(masks.shape[-2:]), mode="bilinear", align_corners=False).squeeze(1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="labelled BloodMNIST folder (its split sub-folders)")
    parser.add_argument("--split", default="val")
    parser.add_argument("--limit", type=int, default=800, help="images spread evenly over the split")
    parser.add_argument("--model", default="bloodmnist-cnn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    dataset = open_dataset(args.data, split=args.split)
    names = item_names(dataset)
    picked = np.linspace(0, len(dataset.labels) - 1, min(args.limit, len(dataset.labels))).astype(int)
    images, masks = [], []
    for index in picked:
        rgb = np.array(dataset.image(int(index)).convert("RGB"))
        mask, _ = cell_mask(rgb)
        masks.append(torch.from_numpy(np.asarray(mask, dtype=bool)))
        images.append(torch.from_numpy(rgb).permute(2, 0, 1).float() / 255)
    images, masks = torch.stack(images), torch.stack(masks)
    count, height, width = masks.shape

    bundle = load_model(args.model)
    shapes = []
    handle = bundle.cam_layer.register_forward_hook(lambda module, inputs, output: shapes.append(output.shape))
    with torch.no_grad():
        bundle(images[:1])
    handle.remove()
    cam_grid = tuple(int(v) for v in shapes[0][-2:])

    maps = {f"ideal at {g[0]}x{g[1]}" + (" (the model's CAM grid)" if g == cam_grid else ""): ideal_map(masks, g)
            for g in sorted({cam_grid, (4, 4), (16, 16)})}
    maps["centre Gaussian (no data)"] = centre_gaussian(count, height, width)
    maps["random"] = torch.rand(count, height, width, generator=torch.Generator().manual_seed(args.seed))
    cams = []
    for start in range(0, count, 100):
        chunk = images[start:start + 100]
        with torch.no_grad():
            top1 = bundle(chunk).argmax(1)
        cams.append(gradcam_maps(bundle, chunk, top1))
    maps[f"Grad-CAM of {args.model} (top-1)"] = torch.cat(cams)

    rows = {}
    for label, values in maps.items():
        ious = top_pixel_iou(values, masks)
        ious = ious[~np.isnan(ious)]
        rows[label] = {"iou": float(ious.mean()), "iou_ci95": bootstrap_ci(ious, seed=args.seed)}
        print(f"{label:45s} IoU {ious.mean():.3f} [{rows[label]['iou_ci95'][0]:.3f}, {rows[label]['iou_ci95'][1]:.3f}]")
    report = {
        "what": "CAM-in-mask IoU (top-k pixels, k = mask area) of reference maps on BloodMNIST cell masks",
        "command": "python bench/studies/camal_iou_ceiling.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "data": str(Path(args.data) / args.split), "files": [names[i] for i in picked],
        "mask": "explainers.decoy.cell_mask (the decoy set's masks, without a decoy square)",
        "mask_area_mean": float(masks.float().mean()), "cam_grid": list(cam_grid), "maps": rows,
        "software": {"torch": torch.__version__, "python": platform.python_version()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
