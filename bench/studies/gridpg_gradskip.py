"""GridPG of every GradSkip W~ option (alpha 0 / 0.5 / 1) next to Chefer, rollout and Grad-CAM on one model
(issue 15: class evidence where four classes share an image). Specs with several options cannot go through
the CLI's comma-separated --methods, so this calls `explainers.gridpg.run_gridpg` directly.

    python bench/studies/gridpg_gradskip.py --model bloodmnist-vit-grid --data ../shared/data/bloodmnist/64/test \
        --mosaics 100 --out bench/results/gridpg-gradskip-vit-grid.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench_gradskip import parse_gates  # beside this script (python puts its folder first on the path)

from explainers.gridpg import format_gridpg, run_gridpg
from explainers.methods.gradskip import ATTENTION_WEIGHTINGS
from explainers.models import load_model

import torch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bloodmnist-vit-grid")
    parser.add_argument("--data", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--mosaics", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alphas", default="0,0.5,1")
    parser.add_argument("--extra", default="chefer,rollout,gradcam,random")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--gates", default="", help="also the class_gated form at these "
                        "gate_sigma:gate_power[:gate_knee[:gate_reference]] (alpha 0.5), e.g. 2:1.5,3:2,3:1.5:1:attention")
    parser.add_argument("--weightings", default=",".join(ATTENTION_WEIGHTINGS))
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    bundle = load_model(args.model)
    specs = [f"gradskip:attention_weighting={w},alpha={a}" for w in args.weightings.split(",") if w
             for a in args.alphas.split(",")]
    specs += [f"gradskip:attention_weighting=class_gated,gate_sigma={s:g},gate_power={p:g},gate_knee={k:g},"
              f"gate_reference={r},alpha=0.5" for s, p, k, r in parse_gates(args.gates)]
    specs += [m for m in args.extra.split(",") if m]
    started = time.time()
    report = run_gridpg(bundle, args.data, specs, n_mosaics=args.mosaics, seed=args.seed, split=args.split)
    report["seconds"] = round(time.time() - started, 1)
    print(format_gridpg(report))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
