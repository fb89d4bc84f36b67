"""How a class term added to AHA's one pass trades class dependence against faithfulness:
map(lambda) = the explainer's standardised map + lambda * a class term, for a few lambdas. Two terms:
- `boost`: the class input (`AHAExplainer.class_token_map`, the final patch tokens read through the head, log-softmax
  at the target class), added for every class, the predicted one included;
- `contrast`: `AHAExplainer.class_contrast_map`, each token's logit for the target minus its logit for the predicted
  class: 0 for the predicted class, so its map (the one the top-1 curves read) is the trained one.
Per lambda: the class rho (top class vs runner-up, scipy Spearman, average ranks for ties), the top-1 ins-del and the
runner-up's ins-del (its map scored on the runner-up's softmax probability), engine, K = 20, mean reference; beside
them the runner-up's ins-del for attention rollout (class-blind), Grad-CAM, GradSkip, AHA with T refinement steps and a
random map, all of the runner-up, and paired intervals against lambda 0 (the map that ignores the class).

    python bench/studies/aha_class_mix_val.py --model bloodmnist-vit --explainer weights/aha-bloodmnist-vit \
        --data ../shared/data/bloodmnist/64/val --limit 128 --term contrast --out bench/results/x.json
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from scipy.stats import spearmanr

RUNNER_UP_BASELINES = ("rollout", "gradcam", "gradskip")


def ins_minus_del(bundle, images, maps, targets, against=None) -> list:
    """Per image ins-del of the maps for `targets`, read by the targets' softmax probability or, with `against`
    (the predicted classes), by the two-way contrast sigmoid(z_target - z_against)."""
    from explainers.metrics import deletion_insertion
    from explainers.targets import ContrastTarget

    if against is not None:
        targets = ContrastTarget(targets, against)
    curves = deletion_insertion(bundle, images, maps, targets, steps=20, reference="mean")
    return (np.asarray(curves.insertion_auc) - np.asarray(curves.deletion_auc)).tolist()


def class_terms(explainer, probe, images, targets, term: str):
    """The class term (B x H x W, standardised) for each target tensor in `targets`, from one probe pass."""
    encoded = probe.encode(images)
    terms = []
    for t in targets:
        small = probe.class_token_map(encoded, t) if term == "boost" else probe.class_contrast_map(encoded, t)
        terms.append(torch.nn.functional.interpolate(small.unsqueeze(1), size=images.shape[-2:], mode="bilinear",
                                                     align_corners=False)[:, 0])
    return terms


def main(argv=None) -> int:
    from explainers.aha.network import AHAExplainer, standardise
    from explainers.aha.store import load_explainer
    from explainers.aha_training.data import load_eval_images
    from explainers.methods import get_method
    from explainers.models import load_model
    from explainers.statistics import paired_difference, rounded

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--explainer", required=True, help="explainer stem")
    parser.add_argument("--data", required=True)
    parser.add_argument("--limit", type=int, default=128)
    parser.add_argument("--lambdas", default="0,0.25,0.5,1,2")
    parser.add_argument("--term", choices=("boost", "contrast"), default="boost")
    parser.add_argument("--refine-steps", type=int, default=0, help="also AHA with this many refinement steps (0: not)")
    parser.add_argument("--mosaics", type=int, default=0, help="also GridPG on this many val mosaics (seed 0)")
    parser.add_argument("--runner-up-score", choices=("probability", "contrast"), default="probability",
                        help="what the runner-up's curves read: its softmax probability, or sigmoid(z_runner-up - "
                             "z_predicted) (`targets.ContrastTarget`: not flat where the runner-up is far behind)")
    parser.add_argument("--warm-start", action="store_true",
                        help="the explainer was trained for another model with the same decoder shapes (bloodmnist-vit's "
                             "for bloodmnist-vit-grid): its weights as they are, no step trained for this model")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    bundle = load_model(args.model)
    if args.warm_start:
        from explainers.aha_training.loop import warm_start

        explainer = warm_start(bundle, args.explainer)[0].eval()
    else:
        explainer = load_explainer(bundle, args.explainer)
    if explainer.class_boost or explainer.class_contrast:
        raise SystemExit("give an explainer without a class term of its own (the lambdas add it here)")
    probe = AHAExplainer(bundle, width=8, embed_dim=8, class_input="token_logits", class_contrast=1.0).eval()
    images, _ = load_eval_images(bundle, args.data, args.limit)
    lambdas = [float(v) for v in args.lambdas.split(",")]
    if 0.0 not in lambdas:
        lambdas = [0.0] + lambdas
    rows = {lam: {"rho": [], "top1": [], "runner_up": []} for lam in lambdas}
    baselines = {name: {"top1": [], "runner_up": []} for name in RUNNER_UP_BASELINES + ("random",)}
    refined = {"rho": [], "top1": [], "runner_up": []}
    generator = torch.Generator().manual_seed(0)
    for start in range(0, len(images), 32):
        x = images[start:start + 32]

        def against(k):  # the runner-up (k = 1) read against the prediction, if asked (top2: this batch's)
            return top2[:, 0] if k == 1 and args.runner_up_score == "contrast" else None

        with torch.no_grad():
            encoded = explainer.encode(x)
            top2 = encoded.logits.topk(2, dim=1).indices
            maps = [standardise(explainer(encoded, top2[:, k])) for k in (0, 1)]
            extra = class_terms(explainer, probe, x, [top2[:, 0], top2[:, 1]], args.term)
        for lam in lambdas:
            first, second = (standardise(maps[k] + lam * extra[k]) for k in (0, 1))
            for a, b in zip(first.numpy(), second.numpy()):
                rows[lam]["rho"].append(float(spearmanr(a.ravel(), b.ravel())[0]))
            rows[lam]["top1"].extend(ins_minus_del(bundle, x, first, top2[:, 0]))
            rows[lam]["runner_up"].extend(ins_minus_del(bundle, x, second, top2[:, 1], against(1)))
        for name in RUNNER_UP_BASELINES:
            method = get_method(name)
            for key, k in (("top1", 0), ("runner_up", 1)):
                baseline = method.attribute(bundle, x, top2[:, k]).detach()
                baselines[name][key].extend(ins_minus_del(bundle, x, baseline, top2[:, k], against(k)))
        if args.runner_up_score == "contrast":  # Grad-CAM of the contrast itself, the class-contrastive peer
            from explainers.targets import ContrastTarget

            gradcam = get_method("gradcam")
            baselines.setdefault("gradcam_of_the_contrast", {"top1": [], "runner_up": []})
            row = baselines["gradcam_of_the_contrast"]
            row["top1"].extend(ins_minus_del(bundle, x, gradcam.attribute(bundle, x, top2[:, 0]).detach(), top2[:, 0]))
            maps_c = gradcam.attribute(bundle, x, ContrastTarget(top2[:, 1], top2[:, 0])).detach()
            row["runner_up"].extend(ins_minus_del(bundle, x, maps_c, top2[:, 1], against(1)))
        for key, k in (("top1", 0), ("runner_up", 1)):
            noise = torch.rand(x.shape[0], *x.shape[-2:], generator=generator)
            baselines["random"][key].extend(ins_minus_del(bundle, x, noise, top2[:, k], against(k)))
        if args.refine_steps:  # the registry's explainer for the model (weights/), refined: not --explainer's
            method = get_method("aha", refine_steps=args.refine_steps)
            pair = [method.attribute(bundle, x, top2[:, k]).detach() for k in (0, 1)]
            for a, b in zip(pair[0].numpy(), pair[1].numpy()):
                refined["rho"].append(float(spearmanr(a.ravel(), b.ravel())[0]))
            refined["top1"].extend(ins_minus_del(bundle, x, pair[0], top2[:, 0]))
            refined["runner_up"].extend(ins_minus_del(bundle, x, pair[1], top2[:, 1], against(1)))
        print(f"[class-mix] {start + len(x)}/{len(images)} images", flush=True)

    blind = rows[0.0]
    report = {"model": args.model, "explainer": args.explainer, "data": args.data, "images": len(images),
              "term": args.term, "curves": "engine, K = 20, mean reference; runner-up maps read " + (
                  "sigmoid(z_runner-up - z_predicted)" if args.runner_up_score == "contrast"
                  else "the runner-up's softmax probability"), "rollout_ins_minus_del": float(np.mean(baselines["rollout"]["top1"])),
              "by_lambda": {}, "runner_up_baselines": {}}
    for lam, r in rows.items():
        report["by_lambda"][str(lam)] = {
            "class_rho": float(np.mean(r["rho"])), "ins_minus_del": float(np.mean(r["top1"])),
            "lead_over_rollout": float(np.mean(np.subtract(r["top1"], baselines["rollout"]["top1"]))),
            "runner_up_ins_minus_del": float(np.mean(r["runner_up"])),
            "runner_up_minus_lambda_0": rounded(paired_difference(r["runner_up"], blind["runner_up"])),
            "top1_minus_lambda_0": rounded(paired_difference(r["top1"], blind["top1"])),
            "runner_up_minus": {name: rounded(paired_difference(r["runner_up"], b["runner_up"]))
                                for name, b in baselines.items()},
            "per_image": {"class_rho": rounded(r["rho"]), "top1": rounded(r["top1"]),
                          "runner_up": rounded(r["runner_up"])}}
    for name, b in list(baselines.items()) + ([(f"aha_t{args.refine_steps}", refined)] if args.refine_steps else []):
        report["runner_up_baselines"][name] = {
            "ins_minus_del": float(np.mean(b["top1"])), "runner_up_ins_minus_del": float(np.mean(b["runner_up"])),
            **({"class_rho": float(np.mean(b["rho"]))} if b.get("rho") else {}),
            "per_image": {"top1": rounded(b["top1"]), "runner_up": rounded(b["runner_up"])}}
    if args.mosaics:
        report["gridpg_by_lambda"] = mosaic_shares(explainer, probe, args.data, args.mosaics, lambdas, args.term)
    summary = {lam: {k: v for k, v in row.items() if k != "per_image"} for lam, row in report["by_lambda"].items()}
    print(json.dumps(summary, indent=1))
    with open(args.out, "w") as handle:
        json.dump(report, handle, indent=2)
    return 0


def mosaic_shares(explainer, probe, data, count: int, lambdas: list, term: str) -> dict:
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
            base = standardise(explainer(explainer.encode(x), asked))
            extra = class_terms(explainer, probe, x, [asked], term)[0]
        for lam in lambdas:
            maps = standardise(base + lam * extra)
            shares[lam].extend(quadrant_share(maps, torch.arange(4).repeat(len(x) // 4)).tolist())
    return {str(lam): float(np.mean(v)) for lam, v in shares.items()}


if __name__ == "__main__":
    raise SystemExit(main())
