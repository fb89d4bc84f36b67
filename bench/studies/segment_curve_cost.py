"""Where the segmentation view's time goes on a CPU (issue 47: every fast method's map and curves in <= 3 s).

In the library, without a browser: the bundled example smear, its WBC region, the view's default methods, the
view's own model copies (one per core, as the app makes them) and one torch thread per request (as the app sets it).
Reports the cost of one SegFormer curve pass (`fast_logits`) at the batch sizes the curves could use, one method's
deletion and insertion curves alone, and the stream's timeline (seconds from the call to each update: maps in,
curves in) over `--repeats` calls. The floor it implies: (curve passes x pass cost + the maps' time) / cores.
`--steps-check`: what fewer passes would cost in accuracy: the default maps' deletion and insertion AUCs at 8 and 10
steps against 20, on the WBC and platelet regions of the first two bundled examples.

    PYTHONPATH=. python bench/studies/segment_curve_cost.py --out bench/results/segment-curve-cost.json
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch


def per_image_ms(fn, images: torch.Tensor, batch: int, repeats: int = 3) -> float:
    block = images.expand(batch, -1, -1, -1).contiguous()
    fn(block)  # warm-up
    started = time.perf_counter()
    for _ in range(repeats):
        fn(block)
    return (time.perf_counter() - started) / repeats / batch * 1000


def steps_check(view, methods) -> dict:
    """Mean and largest |AUC at k steps - AUC at 20 steps| over the default maps, for k = 8 and 10."""
    import numpy as np

    from explainers.segmentation.scoring import region_curves
    from saliency_lab import segmentation as service

    gaps = {k: {"deletion": [], "insertion": []} for k in (8, 10)}
    regions = 0
    for example in service.examples()[:2]:
        shown = view.predict(example[0])
        for class_name in [c for c in view.classes_present(shown) if c in ("WBC", "Platelets")]:
            target = view.region(shown, class_name=class_name)
            records = view.explain(shown, target, methods, curve_steps=0)
            maps = torch.stack([torch.from_numpy(r["map"]) for r in records])
            curves = {k: region_curves(view.bundle, shown.image, maps, target, steps=k) for k in (8, 10, 20)}
            for k in (8, 10):
                for name in ("deletion", "insertion"):
                    gap = np.abs(np.asarray(getattr(curves[k], f"{name}_auc")) -
                                 np.asarray(getattr(curves[20], f"{name}_auc")))
                    gaps[k][name] += gap.tolist()
            regions += 1
    return {"regions": regions, "maps": regions * len(methods),
            **{f"steps_{k}_vs_20": {name: {"mean_abs": round(float(np.mean(v)), 4), "max_abs": round(float(np.max(v)), 4)}
                                    for name, v in gaps[k].items()} for k in gaps}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bccd-segformer")
    parser.add_argument("--class-name", default="WBC")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps-check", action="store_true", help="also: AUCs at 8 and 10 steps against 20")
    parser.add_argument("--out")
    args = parser.parse_args(argv)

    from explainers.engine import ReplicaPool
    from explainers.models import load_model
    from explainers.segmentation.model import fast_logits
    from explainers.segmentation.scoring import region_curves
    from saliency_lab import segmentation as service

    torch.set_num_threads(1)
    cores = os.cpu_count() or 1
    bundle = load_model(args.model)
    view = service.SegmentationView(bundle, replicas=ReplicaPool(cores))
    shown = view.predict(service.examples()[0][0])
    target = view.region(shown, class_name=args.class_name)
    methods = list(service.DEFAULT_METHODS)
    with torch.no_grad():
        pass_ms = {batch: round(per_image_ms(lambda x: fast_logits(bundle, x), shown.image, batch), 1)
                   for batch in (1, 2, 4, 8)}
    records = view.explain(shown, target, methods, curve_steps=0)
    started = time.perf_counter()
    region_curves(bundle, shown.image, torch.from_numpy(records[0]["map"])[None], target, steps=10)
    one_method = time.perf_counter() - started
    timelines = []
    for _ in range(args.repeats):
        started, marks = time.perf_counter(), []
        for records in view.explain_stream(shown, target, methods):
            marks.append({"seconds": round(time.perf_counter() - started, 2), "maps": len(records),
                          "curves": sum("deletion" in r for r in records)})
        timelines.append(marks)
    maps_in = [next(m["seconds"] for m in marks if m["maps"] == len(methods)) for marks in timelines]
    result = {"model": args.model, "image": "the first bundled example", "class": args.class_name,
              "methods": methods, "cores": cores, "torch_threads": 1, "curve_steps": 10,
              "curve_passes_per_method": 18, "pass_ms_by_batch": pass_ms,
              "one_methods_curves_s": round(one_method, 2), "timelines": timelines,
              "maps_in_s": maps_in, "all_curves_in_s": [marks[-1]["seconds"] for marks in timelines],
              "load_average": os.getloadavg()[0]}
    if args.steps_check:
        result["steps_check"] = steps_check(view, methods)
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
