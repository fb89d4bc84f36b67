"""Command-line entries of the segmentation kind: `prepare-seg`, `train-seg` and `evaluate-seg` (added to
`python -m explainers`)."""
from __future__ import annotations

import json


def cmd_train_seg(args) -> int:
    from .train import command_line, train_segformer

    card = train_segformer(args.data, args.out, name=args.name, budget_s=args.budget_s, batch_size=args.batch_size,
                           lr=args.lr, seed=args.seed, work_dir=args.work, device=args.device,
                           eval_every_s=args.eval_every_s, crop=args.crop, command=command_line(),
                           threads=args.threads)
    print(json.dumps({"name": card["name"], "steps": card["training"]["steps"], "val": card["val"],
                      "test": card["test"]}, indent=2))
    return 0


def cmd_evaluate_seg(args) -> int:
    from .evaluate import run_evaluation

    report = run_evaluation(args)
    print(json.dumps(report["summary"], indent=2))
    return 0


def add_segmentation_parsers(commands) -> None:
    from .bccd import add_prepare_arguments, cmd_prepare

    prepare = commands.add_parser("prepare-seg", help="derive per-pixel BCCD masks from the human boxes and write "
                                  "the prepared folder train-seg and evaluate-seg read")
    add_prepare_arguments(prepare)
    prepare.set_defaults(handler=cmd_prepare)

    train = commands.add_parser("train-seg", help="train the bundled SegFormer on prepared BCCD masks "
                                "(time-budgeted, resumable; CUDA when present)")
    train.add_argument("--data", required=True, help="a prepared folder (python -m explainers prepare-seg)")
    train.add_argument("--out", default="weights", help="where NAME.safetensors, NAME.json, NAME-curve.jsonl go")
    train.add_argument("--name", default="bccd-segformer")
    train.add_argument("--budget-s", type=float, default=330.0, help="training wall time in seconds")
    train.add_argument("--batch-size", type=int, default=32)
    train.add_argument("--lr", type=float, default=6e-4)
    train.add_argument("--crop", type=int, default=256, help="square training crop in pixels")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--work", default=None, help="checkpoint folder (default: OUT/.NAME-work); rerun to resume")
    train.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    train.add_argument("--eval-every-s", type=float, default=15.0, help="validation every this many seconds")
    train.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads)")
    train.set_defaults(handler=cmd_train_seg)

    from .evaluate import add_evaluate_arguments

    evaluate = commands.add_parser("evaluate-seg", help="explain a segmentation model's regions on a held-out split "
                                   "and score the maps (PA, mIoU, boxes, deletion/insertion)")
    add_evaluate_arguments(evaluate)
    evaluate.set_defaults(handler=cmd_evaluate_seg)


def main(argv=None) -> int:
    """`python -m explainers.segmentation.cli train-seg ...`: the same commands without loading the rest of the
    command line (a bare GPU machine need not have the app's other dependencies)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m explainers.segmentation.cli")
    add_segmentation_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
