"""The AHA trainer's commands: `train-aha` (with the hub hand-back of an HF Jobs run) and `aha-figures`."""
from __future__ import annotations

import argparse
import json
import sys

from ..aha.network import DEFAULT_ARCH
from ..aha.objective import NUM_FRACTIONS, PEAK_WEIGHT, SCORES
from ..aha.store import explainer_stem, stem_from_out
from ..stopping import stop_on_signals
from .data import AUGMENTS, TARGET_MODES
from .figures import refresh_held_out
from .loop import train_aha
from .validation import SELECT_RULES


def add_aha_figures_parser(commands) -> None:
    p = commands.add_parser("aha-figures", help="measure a trained AHA explainer's held-out figures into its card")
    p.add_argument("--model", required=True)
    p.add_argument("--val-data", required=True, help="held-out images (never trained on)")
    p.add_argument("--val-limit", type=int, default=256)
    p.add_argument("--explainer", default=None, help="explainer stem (default weights/aha-<model>)")
    p.set_defaults(handler=lambda args: print(json.dumps(refresh_held_out(
        args.model, args.val_data, stem=args.explainer, val_limit=args.val_limit), indent=2)) or 0)


def add_train_aha_parser(commands) -> None:
    """Register `train-aha` on an argparse subparsers object (explainers/cli.py)."""
    p = commands.add_parser("train-aha", help="train an AHA explainer for a model (resumable, torchrun for DDP)")
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True, help="training images (folder with labels.csv, or .npz)")
    p.add_argument("--out", default=None, help="output stem, default weights/aha-<model>")
    p.add_argument("--val-data", default=None, help="held-out images for the card's figures (never trained on)")
    p.add_argument("--val-limit", type=int, default=256)
    p.add_argument("--steps", type=int, default=None, help="optimisation steps (default: --epochs worth)")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=32, help="global batch (images; pairs with two targets)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--weight-decay", type=float, default=1e-3)
    p.add_argument("--warmup", type=float, default=0.06)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--targets", choices=TARGET_MODES, default="top1+second")
    p.add_argument("--fractions", type=int, default=NUM_FRACTIONS)
    p.add_argument("--fraction-samples", type=int, default=None, help="random interior fractions per step (all)")
    p.add_argument("--peak-weight", type=float, default=PEAK_WEIGHT)
    p.add_argument("--grid-min", type=int, default=None)
    p.add_argument("--grid-max", type=int, default=None)
    p.add_argument("--augment", choices=AUGMENTS, default="auto")
    p.add_argument("--subset", type=int, default=None, help="train on a random subset of N images")
    p.add_argument("--width", type=int, default=DEFAULT_ARCH["width"])
    p.add_argument("--fusion-units", type=int, choices=[1, 2], default=2,
                   help="residual conv units per fusion level: 2 = DPT, 1 = lighter decoder")
    p.add_argument("--time-budget-minutes", type=float, default=None)
    p.add_argument("--checkpoint-every", type=int, default=25)
    p.add_argument("--val-every", type=int, default=0,
                   help="measure the validation metric every N steps and export the best checkpoint (needs --val-data)")
    p.add_argument("--val-track", type=int, default=64, help="validation images tracked during training")
    p.add_argument("--val-holdout", type=float, default=None,
                   help="without --val-data: hold this fraction of --data out of training and validate on it")
    p.add_argument("--mosaic-every", type=int, default=0,
                   help="every N-th step on 2 x 2 mosaics of the batch (globally pooled CNNs; 0: never)")
    p.add_argument("--deletion-weight", type=float, default=1.0,
                   help="weight of the deletion AUC in the loss (and the checkpoint choice): w * deletion + 1 - insertion")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--val-gridpg-min", type=float, default=None,
                   help="export only checkpoints whose grid pointing game on --val-mosaics val mosaics is at least this "
                        "(globally pooled networks; e.g. Grad-CAM's share there)")
    p.add_argument("--val-mosaics", type=int, default=16)
    p.add_argument("--score", choices=SCORES, default="prob",
                   help="score of targets other than the top class (runner-up, random classes, mosaic targets)")
    p.add_argument("--class-input", choices=["none", "token_logits"], default="none",
                   help="a class-specific input beside a class-blind prior (class-token ViTs)")
    p.add_argument("--select-rule", choices=SELECT_RULES, default="ins-del")
    p.add_argument("--val-rho-max", type=float, default=None,
                   help="class-following rule: the largest class dependence (top vs runner-up rho) that follows the class")
    p.add_argument("--val-baseline", default=None, help="class-following rule: the method whose val ins-del is the floor")
    p.add_argument("--mosaic-classes", type=int, default=1, help="quadrants' classes explained per mosaic (1-4)")
    p.add_argument("--time-schedule", action="store_true",
                   help="tau and the learning rate follow the time budget where it runs out before the steps")
    p.add_argument("--compare", default="gradcam,random", help="methods beside AHA in the card's held-out figures")
    p.add_argument("--log-every", type=int, default=5, help="steps between the card's history rows")
    p.add_argument("--class-input-lr-scale", type=float, default=1.0,
                   help="learning rate of the class input's weights, as a multiple of --lr")
    p.add_argument("--init", default=None, help="start from this explainer stem of the same model (warm start; "
                   "its architecture, a new schedule, no output blur)")
    p.add_argument("--push-to", default=None, help=argparse.SUPPRESS)  # an HF Jobs run: the explainer goes back
    p.set_defaults(handler=cmd_train_aha)


def cmd_train_aha(args) -> int:
    card = train_aha(model=args.model, data=args.data, out=args.out, val_data=args.val_data, val_limit=args.val_limit,
                     steps=args.steps, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                     weight_decay=args.weight_decay, warmup=args.warmup, clip=args.clip, targets=args.targets,
                     fractions=args.fractions, fraction_samples=args.fraction_samples, peak_weight=args.peak_weight,
                     grid_min=args.grid_min, grid_max=args.grid_max, augment=args.augment, subset=args.subset,
                     width=args.width, fusion_units=args.fusion_units, time_budget_minutes=args.time_budget_minutes,
                     checkpoint_every=args.checkpoint_every, seed=args.seed, val_every=args.val_every,
                     val_track=args.val_track, val_holdout=args.val_holdout, mosaic_every=args.mosaic_every,
                     deletion_weight=args.deletion_weight, init=args.init, val_gridpg_min=args.val_gridpg_min,
                     val_mosaics=args.val_mosaics, score=args.score, class_input=args.class_input,
                     select_rule=args.select_rule, val_rho_max=args.val_rho_max, val_baseline=args.val_baseline,
                     mosaic_classes=args.mosaic_classes, time_schedule=args.time_schedule,
                     log_every=args.log_every, class_input_lr_scale=args.class_input_lr_scale,
                     compare=tuple(m for m in args.compare.split(",") if m), cancelled=stop_on_signals())
    if card is not None and card.get("cancelled"):
        print(f"[train-aha] stopped at step {card['step']} of {card['total_steps']} with a checkpoint; "
              "run the same command to continue", file=sys.stderr, flush=True)
        return 0
    if card is not None:
        summary = {k: card[k] for k in ("base_model", "weights_file", "train_seconds")}
        summary["held_out"] = card.get("held_out")
        print(json.dumps(summary, indent=2))
        if args.push_to:  # inside an HF Job: hand the explainer (weights, card, plot) back through the hub
            from ..hub import push_result

            stem = stem_from_out(args.out) if args.out else explainer_stem(args.model)
            push_result(stem, args.push_to)
            print(f"[train-aha] pushed {stem.name} to {args.push_to}", file=sys.stderr, flush=True)
    return 0
