"""Choose, per model, between explainers trained side by side with different scores for the non-top targets
(`device/aha.sh`: log-probability or logit margin), by the class-following rule written before the runs
(docs/aha-explainers.md): each run's exported validation row is ranked with `class_following_key`, the same key
that chose the run's own checkpoint, on the same validation images and baseline floor. The winner's weights, card
(with the choice recorded as "score_choice") and validation plot are copied into the output folder.

    python bench/aha_pick.py --out OUT --model bloodmnist-vit RUN_DIR_A/aha-bloodmnist-vit RUN_DIR_B/aha-bloodmnist-vit
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from explainers.aha_training.validation import class_following_key


def exported_row(card: dict) -> dict:
    step = card["exported_step"]
    rows = [row for row in card.get("validation", []) if row["step"] == step]
    if not rows:
        raise ValueError(f"the card of {card.get('base_model')} has no validation row at its exported step {step}")
    return rows[-1]


def rank(card: dict) -> tuple:
    recipe = card["recipe"]
    row = exported_row(card)
    primary = "gridpg" if "gridpg" in row and recipe.get("val_rho_max") is None else "ins_minus_del"
    gridpg_min = (recipe.get("val_gridpg") or {}).get("min")
    return class_following_key(row, floor=recipe["validation_floor"]["ins_minus_del"], rho_max=recipe.get("val_rho_max"),
                               gridpg_min=gridpg_min, primary=primary)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("stems", nargs="+", help="explainer stems (without .json) of the candidate runs")
    args = parser.parse_args(argv)
    candidates = []
    for stem in args.stems:
        card_file = Path(stem + ".json")
        if not card_file.exists():
            print(f"{args.model}: {stem} produced no explainer (see its log)")
            continue
        card = json.loads(card_file.read_text())
        if card.get("base_model") != args.model:
            raise ValueError(f"{card_file} explains {card.get('base_model')}, not {args.model}")
        candidates.append((rank(card), stem, card))
    if not candidates:
        print(f"{args.model}: no candidate finished")
        return 1
    candidates.sort(key=lambda item: item[0], reverse=True)
    key, stem, card = candidates[0]
    card["score_choice"] = {
        "rule": "class_following_key on each run's exported validation row (docs/aha-explainers.md)",
        "chosen": card["recipe"]["score_of_other_targets"],
        "candidates": [{"score": c["recipe"]["score_of_other_targets"], "exported_step": c["exported_step"],
                        "validation": exported_row(c), "key": [bool(v) for v in k[:3]] + [k[3]]}
                       for k, _, c in candidates]}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = Path(stem).name
    shutil.copyfile(stem + ".safetensors", out / (name + ".safetensors"))
    if card.get("validation_plot"):
        plot = Path(stem).parent / card["validation_plot"]
        if plot.exists():
            shutil.copyfile(plot, out / plot.name)
    (out / (name + ".json")).write_text(json.dumps(card, indent=2))
    print(f"{args.model}: chose score '{card['score_choice']['chosen']}' "
          + "; ".join(f"{c['score']}: step {c['exported_step']} key {c['key']}" for c in card["score_choice"]["candidates"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
