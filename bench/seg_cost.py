"""GradSkip's cost on SegFormer against its floor (one forward and one backward pass of the region score) and
against Seg-Grad-CAM (ours and pytorch-grad-cam's, a test-only peer), and the agreement of our Seg-Grad-CAM with
pytorch-grad-cam's on real smears (Spearman of the two maps).

    python bench/seg_cost.py --data .devdata/bccd-seg --out bench/results/seg-cost.json

Per smear (the first N of the split): the target is its largest predicted object class over its predicted region.
Timing: `--warmup` untimed rounds, then the median of `--repeats` timed runs of each, the four interleaved round by
round (on a busy CPU the load falls on all alike), batch 1, CUDA synchronised.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch


from explainers.atomic import atomic_write_text
from explainers.metrics import spearman
from explainers.models import load_model
from explainers.methods.gradcam import GradCAM as RegionGradCAM
from explainers.segmentation.methods import SegGradSkip
from explainers.segmentation.targets import RegionTarget, background_classes
from explainers.segmentation.train import load_prepared


def timed(functions: dict, device, warmup: int, repeats: int) -> dict:
    """Median seconds of each function, the functions interleaved round by round (a busy machine's load then
    falls on all of them alike)."""
    for _ in range(warmup):
        for function in functions.values():
            function()
    times = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            function()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in times.items()}


class _Wrapped(torch.nn.Module):
    def __init__(self, bundle):
        super().__init__()
        self.bundle = bundle
        self.network = bundle.network

    def forward(self, x):
        return self.bundle(x)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bccd-segformer")
    parser.add_argument("--data", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--options", default="{}", help="GradSkip options as JSON (the chosen defaults if empty)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.model_targets import SemanticSegmentationTarget

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    bundle = load_model(args.model).to(device)
    images, _, names = load_prepared(args.data, args.split, "cpu")
    gradskip, ours = SegGradSkip(**json.loads(args.options)), RegionGradCAM()
    peer = GradCAM(model=_Wrapped(bundle), target_layers=[bundle.network.segformer.decode_head.linear_fuse])
    rows = []
    for index in range(min(args.images, len(names))):
        image = (images[index:index + 1].float() / 255).to(device)
        with torch.no_grad():
            prediction = bundle(image)[0].argmax(0)
        counts = torch.bincount(prediction.flatten(), minlength=bundle.num_classes)
        for skipped in background_classes(bundle):
            counts[skipped] = 0
        class_index = int(counts.argmax())
        region = prediction == class_index
        target = RegionTarget(region[None], [class_index])

        def floor():
            x = image.detach().requires_grad_(True)
            target(bundle(x)).sum().backward(inputs=[x])

        peer_target = [SemanticSegmentationTarget(class_index, region.float().cpu().numpy())]
        row = {"image": names[index], "class": bundle.class_names[class_index], "region_pixels": int(region.sum())}
        row.update(timed({"floor_s": floor,
                          "gradskip_s": lambda: gradskip.attribute(bundle, image, target),
                          "seggradcam_s": lambda: ours.attribute(bundle, image, target),
                          "pytorch_grad_cam_s": lambda: peer(input_tensor=image, targets=peer_target)},
                         device, args.warmup, args.repeats))
        theirs = torch.from_numpy(peer(input_tensor=image, targets=peer_target)[0])
        row["spearman_vs_pytorch_grad_cam"] = spearman(ours.attribute(bundle, image, target)[0].cpu(), theirs)
        row["gradskip_over_floor"] = row["gradskip_s"] / row["floor_s"]
        row["gradskip_over_pytorch_grad_cam"] = row["gradskip_s"] / row["pytorch_grad_cam_s"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {key: round(statistics.median(r[key] for r in rows), 4)
               for key in ("floor_s", "gradskip_s", "seggradcam_s", "pytorch_grad_cam_s", "gradskip_over_floor",
                           "gradskip_over_pytorch_grad_cam")}
    summary["spearman_min"] = round(min(r["spearman_vs_pytorch_grad_cam"] for r in rows), 4)
    summary["spearman_median"] = round(statistics.median(r["spearman_vs_pytorch_grad_cam"] for r in rows), 4)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    report = {"model": args.model, "split": args.split, "device": device_name, "batch": 1, "input_size":
              list(bundle.input_size), "warmup": args.warmup, "repeats": args.repeats, "summary": summary,
              "gradskip_options": gradskip.options, "rows": rows,
              "floor": "one forward and one backward pass of the region score (gradient to the input only)"}
    atomic_write_text(args.out, json.dumps(report, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
