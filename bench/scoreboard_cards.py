"""Store class-dependence results measured elsewhere (`python -m explainers class-dependence ... --out F.json`, e.g.
on a GPU machine, which brings back the JSON but not the card) in the AHA explainer cards, as `--into-card` would
have stored them, and copy the JSON to bench/results/.

    python bench/scoreboard_cards.py OUTPUT_FOLDER/class-dependence-bloodmnist-vit-val64.json \\
        --data BLOODMNIST/64/val

`--data` names the data as this checkout knows it (the GPU machine read a copy of the same files).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from explainers.aha.store import store_class_dependence
from explainers.models import load_model

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", help="a class-dependence JSON (written with --out)")
    parser.add_argument("--data", default=None, help="the data's name here (default: the report's)")
    parser.add_argument("--copy-to", default=str(ROOT / "bench" / "results"), help="folder to copy the JSON into")
    args = parser.parse_args(argv)
    report = json.loads(Path(args.report).read_text())
    data = args.data or report["data"]
    report["data"] = data
    report["measured_on"] = report.get("measured_on", "a copy of the same files (see command)")
    bundle = load_model(report["model"])
    specs = list(report["methods"])
    card = store_class_dependence(bundle, specs, report["methods"], data=data, images=report["images"],
                                  command=report["command"])
    print(f"stored the AHA rows in {card}")
    target = Path(args.copy_to) / Path(args.report).name
    if Path(args.report).resolve() != target.resolve():
        target.write_text(json.dumps(report, indent=2))
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
