"""Run any `python -m explainers` command with an AHA explainer taken from a given stem instead of the shipped one
(a candidate measured before it ships): the explainer is loaded for the model's cached bundle and registered for
it, so every AHA map in the command comes from it (`store.register_explainer`); nothing in weights/ changes. Its
card is the one the method's caveat reads.

    python bench/aha_with_explainer.py --model bloodmnist-vit-grid --explainer /tmp/run/aha-bloodmnist-vit-grid \
        -- gridpg --model bloodmnist-vit-grid --methods aha --data ../shared/data/bloodmnist/64/test --mosaics 200
"""
from __future__ import annotations

import argparse
import sys

import torch


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        raise SystemExit("usage: aha_with_explainer.py --model M --explainer STEM -- COMMAND ...")
    split = argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--explainer", required=True)
    args = parser.parse_args(argv[:split])
    torch.set_num_threads(1)
    from explainers.aha.store import load_explainer, register_explainer
    from explainers.cli import main as cli_main
    from explainers.models import load_model

    bundle = load_model(args.model)
    register_explainer(bundle, load_explainer(bundle, args.explainer))
    return cli_main(argv[split + 1:])


if __name__ == "__main__":
    raise SystemExit(main())
