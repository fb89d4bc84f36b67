"""Two trained explainers of one model on the same held-out images, each with its card's output blur (issue #16):
hard deletion / insertion (the engine, K=20, mean reference, top-1 targets) and the paired bootstrap 95% interval
of B - A. Used to decide whether a new training run replaces the shipped explainer (on val, never test).

    python bench/aha_compare_explainers.py bloodmnist-cnn weights/aha-bloodmnist-cnn NEW_STEM \
        ../shared/data/bloodmnist/64/val 256 OUT.json
    python bench/aha_compare_explainers.py efficientnet-lite0 weights/aha-efficientnet-lite0 NEW_STEM \
        ../shared/data/imagenet-train 40 OUT.json 0.1   # the 10% of the photos its training held out
"""
import json
import sys
from explainers.aha_training.output_blur import measure_output_blur
from explainers.aha.store import load_explainer
from explainers.aha_training.data import load_eval_images
from explainers.models import load_model
from explainers.statistics import bootstrap_ci, paired_difference

import torch

torch.set_num_threads(1)
model, stem_a, stem_b, data, limit, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6]
bundle = load_model(model)
if len(sys.argv) > 7:  # photos: the images of DATA the explainer's training held out (train-aha --val-holdout F)
    from explainers.aha_training.data import holdout_indices
    from explainers.data import open_dataset

    held = holdout_indices(len(open_dataset(data, split="train")), float(sys.argv[7]))[1]
    images, _ = load_eval_images(bundle, data, limit, split="train", indices=held)
else:
    images, _ = load_eval_images(bundle, data, limit, split="val")
scores = {}
for label, stem in (("A", stem_a), ("B", stem_b)):
    explainer = load_explainer(bundle, stem).eval()
    sigma = explainer.output_blur
    row = measure_output_blur(explainer, images, [sigma], progress=True)[sigma]
    scores[label] = {"stem": stem, "output_blur_px": sigma, **row}
report = {"model": model, "data": data, "images": int(len(images)), "explainers": {}}
for label, row in scores.items():
    ins_del = row["insertion"] - row["deletion"]
    report["explainers"][label] = {"stem": row["stem"], "output_blur_px": row["output_blur_px"],
                                   "deletion_auc": float(row["deletion"].mean()),
                                   "insertion_auc": float(row["insertion"].mean()),
                                   "ins_minus_del": float(ins_del.mean()), "ins_minus_del_ci95": bootstrap_ci(ins_del)}
a, b = scores["A"], scores["B"]
report["B_minus_A"] = {
    "deletion": paired_difference(b["deletion"], a["deletion"]),
    "insertion": paired_difference(b["insertion"], a["insertion"]),
    "ins_minus_del": paired_difference(b["insertion"] - b["deletion"], a["insertion"] - a["deletion"])}
print(json.dumps({k: v for k, v in report.items()}, indent=1, default=float))
with open(out, "w") as handle:
    json.dump(report, handle, indent=1, default=float)
