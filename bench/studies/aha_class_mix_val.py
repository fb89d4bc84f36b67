"""How the one pass's class input trades class dependence against faithfulness, on validation cells only:
map(lambda) = the explainer's standardised map + lambda * its class input (`AHAExplainer.class_token_map`, the final
patch tokens read through the head row), for a few lambdas: the class rho (top class vs runner-up, scipy Spearman,
average ranks for ties) and the top-1 ins-del (engine, K = 20, mean reference) beside attention rollout's.

    python bench/studies/aha_class_mix_val.py --model bloodmnist-vit --explainer weights/aha-bloodmnist-vit \
        --data ../shared/data/bloodmnist/64/val --limit 128 --out bench/results/x.json
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from scipy.stats import spearmanr


def main(argv=None) -> int:
    from explainers.aha.network import AHAExplainer, standardise
    from explainers.aha.store import load_explainer
    from explainers.aha_training.data import load_eval_images
    from explainers.methods import get_method
    from explainers.metrics import deletion_insertion
    from explainers.models import load_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--explainer", required=True, help="explainer stem")
    parser.add_argument("--data", required=True)
    parser.add_argument("--limit", type=int, default=128)
    parser.add_argument("--lambdas", default="0,0.25,0.5,1,2")
    parser.add_argument("--mosaics", type=int, default=0, help="also GridPG on this many val mosaics (seed 0)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    bundle = load_model(args.model)
    explainer = load_explainer(bundle, args.explainer)
    probe = explainer
    if explainer.class_input == "none":  # the same class input, read by a probe explainer
        probe = AHAExplainer(bundle, width=8, embed_dim=8, class_input="token_logits").eval()
    images, _ = load_eval_images(bundle, args.data, args.limit)
    lambdas = [float(v) for v in args.lambdas.split(",")]
    rows = {lam: {"rho": [], "insdel": []} for lam in lambdas}
    rollout = []
    for start in range(0, len(images), 32):
        x = images[start:start + 32]
        with torch.no_grad():
            encoded = explainer.encode(x)
            top2 = encoded.logits.topk(2, dim=1).indices
            probe_encoded = encoded if probe is explainer else probe.encode(x)
            maps = [standardise(explainer(encoded, top2[:, k])) for k in (0, 1)]
            extra = [probe.class_token_map(probe_encoded, top2[:, k]) for k in (0, 1)]
            extra = [torch.nn.functional.interpolate(e.unsqueeze(1), size=x.shape[-2:], mode="bilinear",
                                                     align_corners=False)[:, 0] for e in extra]
        for lam in lambdas:
            first, second = (maps[k] + lam * extra[k] for k in (0, 1))
            for a, b in zip(first.numpy(), second.numpy()):
                rows[lam]["rho"].append(float(spearmanr(a.ravel(), b.ravel())[0]))
            curves = deletion_insertion(bundle, x, first, top2[:, 0], steps=20, reference="mean")
            rows[lam]["insdel"].extend((np.asarray(curves.insertion_auc) - np.asarray(curves.deletion_auc)).tolist())
        baseline = get_method("rollout").attribute(bundle, x, top2[:, 0]).detach()
        curves = deletion_insertion(bundle, x, baseline, top2[:, 0], steps=20, reference="mean")
        rollout.extend((np.asarray(curves.insertion_auc) - np.asarray(curves.deletion_auc)).tolist())
    report = {"model": args.model, "explainer": args.explainer, "data": args.data, "images": len(images),
              "rollout_ins_minus_del": float(np.mean(rollout)),
              "by_lambda": {str(lam): {"class_rho": float(np.mean(r["rho"])), "ins_minus_del": float(np.mean(r["insdel"])),
                                       "lead_over_rollout": float(np.mean(np.subtract(r["insdel"], rollout)))}
                            for lam, r in rows.items()}}
    if args.mosaics:
        report["gridpg_by_lambda"] = mosaic_shares(explainer, probe, args.data, args.mosaics, lambdas)
    print(json.dumps(report, indent=1))
    with open(args.out, "w") as handle:
        json.dump(report, handle, indent=2)
    return 0


def mosaic_shares(explainer, probe, data, count: int, lambdas: list) -> dict:
    """GridPG (positive share in the asked quadrant) of map(lambda) on `count` val mosaics, four classes each."""
    from explainers.aha.network import standardise
    from explainers.aha_training.validation import validation_mosaics
    from explainers.gridpg import quadrant_share

    mosaics, classes = validation_mosaics(explainer.bundle, data, count)
    shares = {lam: [] for lam in lambdas}
    for start in range(0, len(mosaics), 8):
        x = mosaics[start:start + 8].repeat_interleave(4, dim=0)
        asked = classes[start:start + 8].reshape(-1)
        with torch.no_grad():
            encoded = explainer.encode(x)
            base = standardise(explainer(encoded, asked))
            extra = probe.class_token_map(encoded if probe is explainer else probe.encode(x), asked)
            extra = torch.nn.functional.interpolate(extra.unsqueeze(1), size=x.shape[-2:], mode="bilinear",
                                                    align_corners=False)[:, 0]
        for lam in lambdas:
            maps = standardise(base + lam * extra)
            shares[lam].extend(quadrant_share(maps, torch.arange(4).repeat(len(x) // 4)).tolist())
    return {str(lam): float(np.mean(v)) for lam, v in shares.items()}


if __name__ == "__main__":
    raise SystemExit(main())
