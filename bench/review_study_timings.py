"""Timings of a review study on real data (not a test): upload 500 BloodMNIST test images as a zip with
labels.csv (each image validated and stored), create a 500-image study (the model predicts each image once),
open one image with its maps, and save a rating / a verdict (one SQLite commit each).

    SALIENCY_DATA_DIR=/tmp/bench OMP_NUM_THREADS=1 python bench/review_study_timings.py \
        --data ../shared/data/bloodmnist/64/test --model bloodmnist-cnn --images 500
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="../shared/data/bloodmnist/64/test")
    parser.add_argument("--model", default="bloodmnist-cnn")
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--writes", type=int, default=200)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from explainers.data import spread_indices
    from saliency_lab import review_data, studies
    from saliency_lab.services import Services, default_loader

    source = Path(args.data)
    with (source / "labels.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    rows = [rows[i] for i in spread_indices(len(rows), args.images)]
    work = Path(tempfile.mkdtemp(prefix="review-bench-"))
    archive = work / "cells.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("labels.csv", "file,class_index\n" + "".join(f"{r['file']},{r['class_index']}\n" for r in rows))
        for r in rows:
            z.write(source / r["file"], r["file"])
    stamp = time.strftime("%H%M%S")
    started = time.perf_counter()
    result = review_data.import_upload([str(archive)], f"bench-{stamp}")
    upload_s = time.perf_counter() - started

    services = Services(default_loader, [args.model], work / "state")
    services.bundle(args.model)  # model load not counted
    started = time.perf_counter()
    code, owner, _ = studies.create_study(services, f"bench-{stamp}", result.name, args.model, ["gradcam", "aha"], ["a"],
                                   "blinded", count=args.images)
    create_s = time.perf_counter() - started
    state, _ = studies.open_study(services, f"bench-{stamp}", code, "a")
    started = time.perf_counter()
    shown = studies.show_item(services, state, 0, "a")
    show_s = time.perf_counter() - started
    state = shown.state
    rate_ms, verdict_ms = [], []
    for i in range(args.writes):
        started = time.perf_counter()
        studies.rate(services, {**state, "position": i % args.images}, "a", "A", 1 + i % 5)
        rate_ms.append(1000 * (time.perf_counter() - started))
        started = time.perf_counter()
        services.store.set_study_verdict(f"bench-{stamp}", i % args.images, "b", "plausible")
        verdict_ms.append(1000 * (time.perf_counter() - started))
    started = time.perf_counter()
    studies.study_results(services, f"bench-{stamp}", owner, faithfulness=False, n_boot=1000)
    report_s = time.perf_counter() - started
    out = {"images": result.loaded, "skipped": len(result.skipped), "model": args.model,
           "upload_validate_store_s": round(upload_s, 2), "create_study_predict_s": round(create_s, 2),
           "open_one_image_with_2_maps_and_curves_s": round(show_s, 2),
           "save_rating_ms_median": round(statistics.median(rate_ms), 2),
           "save_rating_ms_p95": round(sorted(rate_ms)[int(0.95 * len(rate_ms))], 2),
           "save_verdict_ms_median": round(statistics.median(verdict_ms), 2),
           "save_verdict_ms_p95": round(sorted(verdict_ms)[int(0.95 * len(verdict_ms))], 2),
           "report_1000_bootstrap_s": round(report_s, 2)}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
