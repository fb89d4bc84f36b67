"""`python -m explainers class-dependence` with scipy's Spearman (average ranks for tied pixels), the definition the
scoreboard uses (issue 39), until `explainers.metrics.spearman` itself averages ties: same images, same maps, same
card rows. A map with many tied pixels (rollout's upsampled patches) otherwise gets a rank order from the jitter.

    python bench/aha_class_dependence_ties.py --model bloodmnist-vit --methods aha,gradcam,rollout \
        --data ../shared/data/bloodmnist/64/val --limit 256 --out bench/results/x.json [--into-card]
"""
from __future__ import annotations

import sys

import torch
from scipy.stats import spearmanr

import explainers.metrics as metrics


def tie_averaged_spearman(a, b) -> float:
    first = torch.as_tensor(a).double().cpu().numpy().ravel()
    second = torch.as_tensor(b).double().cpu().numpy().ravel()
    return float(spearmanr(first, second)[0])


if __name__ == "__main__":
    torch.set_num_threads(1)
    metrics.spearman = tie_averaged_spearman  # class_dependence imports it at call time
    from explainers.cli import main

    raise SystemExit(main(["class-dependence", *sys.argv[1:]]))
