"""The held-out figures of a trained AHA explainer stored in its card (`python -m explainers aha-figures`)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from ..aha.network import AHAExplainer
from ..aha.objective import NUM_FRACTIONS, TAU_END, aha_loss, grid_range, reference_batch
from ..aha.store import explainer_stem, load_explainer, stem_from_out
from .data import load_eval_images


def held_out_figures(explainer: AHAExplainer, images: torch.Tensor, labels: torch.Tensor, *,
                     batch_size: int = 16, compare: tuple = ("gradcam", "random"), seed: int = 0) -> dict:
    """Hard (the evaluation engine: 21 fractions, mean reference) and soft (the training loss without noise,
    tau 0.3, finest grid, 16 fractions, mean reference) deletion / insertion AUCs of the explainer's top-1
    maps, next to the same images explained by an untrained explainer (the class activation map it starts
    from) and by the `compare` methods."""
    from ..engine import explain_batch
    from ..metrics import deletion_insertion

    bundle = explainer.bundle
    device = bundle.device
    torch.manual_seed(seed)
    untrained = AHAExplainer(bundle, **{k: explainer.arch[k] for k in ("width", "embed_dim", "gain_init",
                                                                      "class_embedding", "use_cam", "indices", "scales",
                                                                      "fusion_units", "prior", "class_input")
                                  if k in explainer.arch})
    untrained.to(device).eval()
    rows = {"aha": [], "aha_untrained": []}
    rows.update({name: [] for name in compare})
    soft_del, soft_ins, correct = [], [], 0
    grid = grid_range(bundle.input_size)[1]
    for start in range(0, len(images), batch_size):
        x = images[start:start + batch_size].to(device)
        logits, maps, targets = explainer.predict_and_explain(x)
        correct += int((logits.argmax(1).cpu() == labels[start:start + batch_size]).sum())
        with torch.no_grad():
            terms = aha_loss(bundle, x, maps, targets, reference_batch(x, "mean", bundle.reference_color),
                             grid=grid, tau=TAU_END, noise=False, reduce=False)
        soft_del.append(terms.deletion_auc.cpu())
        soft_ins.append(terms.insertion_auc.cpu())
        candidates = {"aha": maps, "aha_untrained": untrained(x, targets).detach()}
        for name in compare:
            candidates[name] = explain_batch(bundle, name, x, targets, seed=None).maps  # seeded above
        for name, method_maps in candidates.items():
            curves = deletion_insertion(bundle, x, method_maps, targets, steps=20, reference="mean")
            rows[name].append(np.stack([curves.deletion_auc, curves.insertion_auc], 1))
    figures = {"images": int(len(images)), "targets": "top-1 prediction", "classifier_accuracy": correct / len(images),
               "hard": "deletion_insertion engine: 21 fractions (K=20), mean-colour reference, softmax of the target",
               "soft": f"training loss without noise: tau {TAU_END}, G={grid}, {NUM_FRACTIONS} fractions, mean reference",
               "soft_deletion_auc": float(torch.cat(soft_del).mean()),
               "soft_insertion_auc": float(torch.cat(soft_ins).mean())}
    for name, chunks in rows.items():
        values = np.concatenate(chunks)
        figures[f"{name}_deletion_auc"] = float(values[:, 0].mean())
        figures[f"{name}_insertion_auc"] = float(values[:, 1].mean())
    return figures


def refresh_held_out(model: str, val_data: str, *, stem=None, val_limit: int = 256,
                     compare: tuple = ("gradcam", "random")) -> dict:
    """Measure a trained explainer's held-out figures again (e.g. on another sample) and store them in its card;
    the weights are untouched. Returns the figures."""
    from ..models import load_model

    bundle = load_model(model)
    stem = stem_from_out(stem) if stem else explainer_stem(model)
    explainer = load_explainer(bundle, stem).eval()
    x_val, y_val = load_eval_images(bundle, val_data, val_limit)
    figures = held_out_figures(explainer, x_val, y_val, compare=tuple(compare))
    figures.update({"data": str(val_data), "sample": f"{len(x_val)} images spread evenly over the file",
                    "command": " ".join(["python -m explainers"] + sys.argv[1:])})
    card_file = Path(str(stem) + ".json")
    card = json.loads(card_file.read_text())
    card["held_out"] = figures
    from ..atomic import atomic_write_text

    atomic_write_text(card_file, json.dumps(card, indent=2))  # the same card writer as save_explainer
    return figures
