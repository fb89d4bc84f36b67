"""Can the unfamiliar-image check (`explainers/familiarity.py`) serve a model trained on few images here, such as
EfficientNet-Lite0 (ImageNet: 1000 classes, 400 training photos in ../shared/data)? Validation data only:

    python bench/studies/familiarity_photo_model.py efficientnet-lite0 TRAIN_PHOTOS VAL_PHOTOS VAL_UNFAMILIAR OUT.json

TRAIN_PHOTOS: the images a score is fitted on; VAL_PHOTOS: images like them, never fitted (the threshold is the 99%
quantile of their scores); VAL_UNFAMILIAR: images the warning is for (e.g. BloodMNIST val cells given to an ImageNet
model). Scores: Mahalanobis distance to the one mean of the training photos (too few per class for class means) at
several shrinkages, and the k-th nearest training photo's cosine distance (k-NN, Sun et al. 2022). Rule, fixed
before the run: ship a check only if some score flags >= 90% of VAL_UNFAMILIAR at that threshold.
"""
import json
import sys
from explainers import familiarity
from explainers.data import open_dataset
from explainers.models import load_model

import torch

SHRINKAGES = (0.001, 0.01, 0.1, 1.0, 10.0)
NEIGHBOURS = (1, 5, 10)
torch.set_num_threads(2)
model, train, val, unfamiliar, out = sys.argv[1:6]
bundle = load_model(model)
feats = {name: familiarity.dataset_features(bundle, open_dataset(path, split="val", require_labels=False,
                                                                  limit=400))[0].double()
         for name, path in (("train", train), ("val", val), ("unfamiliar", unfamiliar))}


def measured(name, score) -> dict:
    val_scores = score(feats["val"])
    threshold = float(torch.quantile(val_scores, familiarity.QUANTILE))
    row = {"score": name, "threshold": threshold,
           "unfamiliar_flagged": float((score(feats["unfamiliar"]) > threshold).double().mean()),
           "val_flagged": float((val_scores > threshold).double().mean())}
    print(row, flush=True)
    return row


rows = []
mean = feats["train"].mean(dim=0, keepdim=True)
centred = feats["train"] - mean
base = centred.T @ centred / (len(centred) - 1)
for shrinkage in SHRINKAGES:
    covariance = base + shrinkage * base.diagonal().mean() * torch.eye(len(base), dtype=base.dtype)
    stats = familiarity.FamiliarityStats(means=mean, precision=torch.linalg.inv(covariance),
                                         val_scores=torch.zeros(0), threshold=0.0, source={})
    rows.append(measured(f"mahalanobis, one mean, shrinkage {shrinkage}", stats.score))
normed = torch.nn.functional.normalize(feats["train"], dim=1)


def neighbour_distance(features, k: int):
    """1 - cosine similarity of the k-th nearest training photo."""
    similarity = torch.nn.functional.normalize(features, dim=1) @ normed.T
    return 1 - similarity.topk(k, dim=1).values[:, -1]


for k in NEIGHBOURS:
    rows.append(measured(f"{k}-NN cosine distance", lambda x, k=k: neighbour_distance(x, k)))
best = max(rows, key=lambda r: r["unfamiliar_flagged"])
report = {"model": model, "train": train, "val": val, "val_unfamiliar": unfamiliar,
          "images": {k: len(v) for k, v in feats.items()}, "rows": rows, "best": best,
          "ship": best["unfamiliar_flagged"] >= 0.9,
          "rule": "ship a check only if some score flags >= 90% of the unfamiliar validation images at the 99% "
                  "quantile of the validation photos' scores"}
json.dump(report, open(out, "w"), indent=2)
print("ship" if report["ship"] else "not shipped", best)
