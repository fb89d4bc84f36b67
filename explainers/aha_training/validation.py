"""Validation during AHA training: the fixed metric (hard deletion/insertion on held-out images), the peer
method's floor, class dependence, the grid pointing game on mosaics, and the rule that ranks checkpoints."""
from __future__ import annotations

import numpy as np
import torch

from ..aha.network import AHAExplainer
from ..metrics import METRICS
from .data import mosaic_cell_size, to_input_size


SELECT_RULES = ("ins-del", "class-following")


def validation_scores(explainer: AHAExplainer, images: torch.Tensor, *, batch_size: int = 32,
                      steps: int = 20) -> dict:
    """The fixed validation metric logged during training: hard deletion / insertion AUCs (the evaluation
    engine, mean reference, K = `steps`) of the explainer's top-1 maps on fixed held-out images."""
    from ..metrics import deletion_insertion

    bundle = explainer.bundle
    was_training = explainer.training
    explainer.eval()
    deletion, insertion = [], []
    try:
        for start in range(0, len(images), batch_size):
            x = images[start:start + batch_size].to(bundle.device)
            with torch.no_grad():
                _, maps, targets = explainer.predict_and_explain(x)
            curves = deletion_insertion(bundle, x, maps.float(), targets, steps=steps, reference="mean")
            deletion.append(np.asarray(curves.deletion_auc))
            insertion.append(np.asarray(curves.insertion_auc))
    finally:
        explainer.train(was_training)
    deletion, insertion = np.concatenate(deletion), np.concatenate(insertion)
    return {"deletion_auc": round(float(deletion.mean()), 5), "insertion_auc": round(float(insertion.mean()), 5),
            "ins_minus_del": round(float((insertion - deletion).mean()), 5)}


def validation_mosaics(bundle, data, count: int, split: str = "val") -> tuple:
    """(mosaics, classes): `count` fixed 2 x 2 mosaics of four classes of `data` (seed 0, as `gridpg` draws them),
    cells at `mosaic_cell_size`."""
    from ..data import open_dataset
    from ..gridpg import build_mosaics, plan_mosaics

    dataset = open_dataset(data, split=split)
    plan = plan_mosaics(dataset.labels, count, 0)
    mosaics, classes = build_mosaics(dataset, plan, mosaic_cell_size(bundle), bundle)
    return to_input_size(mosaics, bundle), classes


def validation_class_dependence(explainer: AHAExplainer, images: torch.Tensor, batch_size: int = 32) -> float:
    """Mean Spearman rho (scipy's, average ranks for ties) between the explainer's one-pass maps for the top class
    and for the runner-up of each image: 1 = the same map whatever the class."""
    from scipy.stats import spearmanr

    was_training = explainer.training
    explainer.eval()
    rhos = []
    try:
        for start in range(0, len(images), batch_size):
            x = images[start:start + batch_size].to(explainer.bundle.device)
            with torch.no_grad():
                logits = explainer.encode(x).logits
                top2 = logits.topk(2, dim=1).indices
                first = explainer.predict_and_explain(x, top2[:, 0])[1].float().cpu().numpy()
                second = explainer.predict_and_explain(x, top2[:, 1])[1].float().cpu().numpy()
            for a, b in zip(first, second):
                if np.ptp(a) > 0 and np.ptp(b) > 0:
                    rhos.append(float(spearmanr(a.ravel(), b.ravel())[0]))
    finally:
        explainer.train(was_training)
    return round(float(np.mean(rhos)), 5) if rhos else float("nan")


def baseline_scores(bundle, method: str, images: torch.Tensor, *, batch_size: int = 16, steps: int = 20) -> dict:
    """Per-image hard deletion / insertion AUCs (mean-colour reference) of a method's maps of the top-1 classes:
    {"deletion": array, "insertion": array}. A method that cannot explain the model is refused (`check`)."""
    from ..engine import explain_batch
    from ..methods import get_method
    from ..metrics import deletion_insertion

    peer = get_method(method)
    peer.check(bundle)
    scores = {"deletion": [], "insertion": []}
    for start in range(0, len(images), batch_size):
        x = images[start:start + batch_size].to(bundle.device)
        with torch.no_grad():
            targets = bundle(x).argmax(1)
        maps = explain_batch(bundle, peer, x, targets, seed=None).maps.float()
        curves = deletion_insertion(bundle, x, maps, targets, steps=steps, reference="mean")
        scores["deletion"].append(np.asarray(curves.deletion_auc))
        scores["insertion"].append(np.asarray(curves.insertion_auc))
    return {k: np.concatenate(v) for k, v in scores.items()}


def baseline_validation(bundle, images: torch.Tensor, method: str, batch_size: int = 32, steps: int = 20) -> dict:
    """The same validation metric as `validation_scores` for a baseline method's top-1 maps (the floor the
    class-following rule asks a checkpoint to keep)."""
    scores = baseline_scores(bundle, method, images, batch_size=batch_size, steps=steps)
    deletion, insertion = scores["deletion"], scores["insertion"]
    return {"method": method, "deletion_auc": round(float(deletion.mean()), 5),
            "insertion_auc": round(float(insertion.mean()), 5), "ins_minus_del": round(float((insertion - deletion).mean()), 5)}


def class_following_key(scores: dict, *, floor: float, rho_max: float | None, gridpg_min: float | None,
                        primary: str) -> tuple:
    """The rule (docs/aha-explainers.md, written before the runs) that ranks validation checkpoints: `follows` =
    class dependence at most `rho_max` and GridPG at least `gridpg_min` (each where set), `faithful` = ins-del at
    least the baseline's `floor` on the same images; a checkpoint meeting both beats one meeting only `follows`,
    which beats one meeting only `faithful`; ties are broken by `primary` ("ins_minus_del" or "gridpg")."""
    follows = True  # each bound is read the way its metric's declaration says is better
    if rho_max is not None:
        rho = scores.get("class_rho", np.nan)
        follows = follows and bool(np.isfinite(rho)) and METRICS["spearman_top1_top2"].meets(rho, rho_max)
    if gridpg_min is not None:
        follows = follows and "gridpg" in scores and METRICS["gridpg"].meets(scores["gridpg"], gridpg_min)
    faithful = METRICS["ins_minus_del"].meets(scores["ins_minus_del"], floor)
    return (follows and faithful, follows, faithful, float(METRICS[primary].gain(scores[primary], 0.0)))


def validation_gridpg(explainer: AHAExplainer, mosaics: torch.Tensor, classes: torch.Tensor,
                      batch_size: int = 8) -> float:
    """Mean GridPG share (positive attribution in the asked class's quadrant) of the explainer's maps of each
    mosaic's four classes."""
    from ..gridpg import quadrant_share

    was_training = explainer.training
    explainer.eval()
    shares = []
    try:
        for start in range(0, len(mosaics), batch_size):
            chunk, asked = mosaics[start:start + batch_size], classes[start:start + batch_size]
            with torch.no_grad():
                _, maps, _ = explainer.predict_and_explain(chunk.repeat_interleave(4, dim=0), asked.reshape(-1))
            shares.append(quadrant_share(maps, torch.arange(4).repeat(len(chunk))))
    finally:
        explainer.train(was_training)
    return round(float(np.concatenate(shares).mean()), 5)
