"""AHA distillation (issue #16): the one-pass explainer learns its own test-time-refined maps.

A trained explainer's T=3 maps beat its one-pass (T=0) maps on both curves. This script (1) writes teacher maps:
the shipped explainer refined for `--refine-steps` steps on training cells (top-1 targets), and (2) fine-tunes
a copy of it towards them (the mean squared difference of the standardised maps; `--objective-weight` adds the
AHA loss), every `--mosaic-every`-th step keeping instead the shipped explainer's own maps of 2 x 2 mosaics of
training cells for each quadrant's class (without this the grid pointing game fell from 0.79 to 0.57 on val),
logging hard deletion / insertion on validation cells and GridPG on validation mosaics, and exporting the best
ins-del among the checkpoints at or above `--gridpg-min`. Training cells for (1) and (2), validation data for
the choice; the test split is never read here. It made the shipped `aha-bloodmnist-cnn` (2026-12-02; the card's
`distillation` holds the commands and the validation trace). Two teachers: `--teacher head` (rounds 1-2) refines the
explainer's output head per image; `--teacher correction` runs the method's own T steps (a G x G correction of the
one-pass map, with the card's refinement settings), a stronger teacher at grid 16 (2026-12-02).
Photos (efficientnet-lite0, 2026-12-03): `targets --holdout 0.1` and `train --val-holdout 0.1 --hflip --cache-encoded`
keep the 40 photos the explainer's training held out for validation and mirror the photos instead of turning them.
`ship` replaces the shipped explainer by a student that passed the validation rule and records the round in the card.

  python bench/aha_distill.py targets --model bloodmnist-cnn --data ../shared/data/bloodmnist/64/train \
      --limit 1200 --part 0/2 --out /tmp/teacher-0.safetensors
  python bench/aha_distill.py targets ... --skip /tmp/teacher-0.safetensors --out /tmp/teacher-2.safetensors  # more, none twice
  python bench/aha_distill.py train --model bloodmnist-cnn --data ../shared/data/bloodmnist/64/train \
      --targets /tmp/teacher-0.safetensors /tmp/teacher-1.safetensors --val-data ../shared/data/bloodmnist/64/val \
      --out /tmp/aha-distilled
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from explainers.aha.network import standardise
from explainers.aha.per_image import optimise_maps
from explainers.aha.refine import refine_maps
from explainers.aha.store import load_explainer, save_explainer
from explainers.aha_training.data import load_eval_images
from explainers.aha_training.validation import validation_gridpg, validation_mosaics, validation_scores
from explainers.methods.aha import AHA
from explainers.models import kept_training_state, load_model

import torch


def trainable_indices(data, holdout) -> list:
    """The images of `data` a teacher or a student may read: all of them, or without the `holdout` fraction that
    `train-aha --val-holdout` kept out of training (the same indices, so the validation photos stay unseen)."""
    from explainers.aha_training.data import holdout_indices
    from explainers.data import open_dataset

    total = len(open_dataset(data, split="train"))
    return list(range(total)) if holdout is None else holdout_indices(total, holdout)[0]


def chosen_cells(args) -> tuple:
    """This part's training cells: `--limit` spread over the trainable images, shifted by `--offset`, less those the
    `--skip` teacher files already hold, every parts-th from `part`."""
    from safetensors.torch import load_file

    from explainers.data import spread_indices

    part, parts = (int(v) for v in args.part.split("/"))
    allowed = trainable_indices(args.data, args.holdout)[args.offset:]
    held = {int(i) for f in (getattr(args, "skip", None) or []) for i in load_file(str(f))["indices"].tolist()}
    spread = [allowed[i] for i in spread_indices(len(allowed), args.limit)]
    return [i for i in spread if i not in held][part::parts], part, parts


def write_in_chunks(out, chosen: list, chunk: int, teach) -> None:
    """Resumable teacher file: `teach(cells, cells_done)` returns {name: per-cell tensor} for a chunk of cell indices;
    the file ({"indices", name...}) is rewritten after every chunk, and a rerun skips the cells it already holds."""
    from safetensors.torch import load_file, save_file

    out = Path(out)
    done = load_file(str(out)) if out.exists() else {}
    indices = done["indices"].tolist() if done else []
    saved = {k: [v] for k, v in done.items() if k != "indices"}
    todo = [i for i in chosen if i not in set(indices)]
    started = time.time()
    for start in range(0, len(todo), chunk):
        batch = todo[start:start + chunk]
        for name, values in teach(batch, len(indices)).items():
            saved.setdefault(name, []).append(values)
        indices += batch
        save_file({"indices": torch.tensor(indices), **{k: torch.cat(v) for k, v in saved.items()}}, str(out))
        rate = (time.time() - started) / (start + len(batch))
        print(f"{len(indices)}/{len(chosen)} images, {rate:.2f} s per image, "
              f"ETA {rate * (len(todo) - start - len(batch)) / 60:.1f} min", flush=True)


def correction_teacher(explainer, bundle, images, targets, steps: int, grid: int = 0) -> torch.Tensor:
    """The method's own T steps: a G x G correction of the explainer's one-pass map, with the card's refinement
    settings (`grid` overrides its grid), for `bundle` (the explainer's classifier, or one with another head)."""
    with torch.inference_mode():
        _, one_pass, _ = explainer.predict_and_explain(images, targets)
    settings = {**AHA().refinement_settings(bundle), **({"grid": grid} if grid else {})}
    return optimise_maps(bundle, images, targets, steps=steps, prior_maps=one_pass.clone(), **settings)


def encode_all(explainer, images: torch.Tensor, batch: int = 16):
    """One `Encoded` for all `images` (the classifier is frozen, so its features can be computed once)."""
    from explainers.aha.network import Encoded

    parts = [explainer.encode(images[s:s + batch]) for s in range(0, len(images), batch)]
    return Encoded(torch.cat([p.logits for p in parts]),
                   [torch.cat([p.levels[k] for p in parts]) for k in range(len(parts[0].levels))],
                   None if parts[0].final_grid is None else torch.cat([p.final_grid for p in parts]),
                   parts[0].image_hw,
                   None if parts[0].class_tokens is None else torch.cat([p.class_tokens for p in parts]))


def teacher_arguments(parser, *, limit: int, chunk: int) -> None:
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--limit", type=int, default=limit)
    parser.add_argument("--part", default="0/1")
    parser.add_argument("--refine-steps", type=int, default=10)
    parser.add_argument("--chunk", type=int, default=chunk)
    parser.add_argument("--grid", type=int, default=0, help="correction teacher: this grid instead of the card's")
    parser.add_argument("--offset", type=int, default=0, help="shift the spread cells by this many (a disjoint set)")
    parser.add_argument("--holdout", type=float, default=None, help="leave out this held-out fraction of --data "
                        "(photos: the explainer's `train-aha --val-holdout` validation images)")
    parser.add_argument("--skip", nargs="*", default=[], help="leave out the cells these teacher files already hold "
                        "(more teachers for the same data without repeating any)")
    parser.add_argument("--out", required=True)


def write_targets(args) -> None:
    bundle = load_model(args.model)
    explainer = load_explainer(bundle)
    chosen, _, _ = chosen_cells(args)

    def teach(batch, _):
        images, _ = load_eval_images(bundle, args.data, None, split="train", indices=batch)
        with torch.no_grad():
            targets = bundle(images).argmax(1)
        if args.teacher == "correction":
            refined = correction_teacher(explainer, bundle, images, targets, args.refine_steps, args.grid)
        else:  # "head": refine the explainer's output head per image (rounds 1 and 2)
            refined = refine_maps(explainer, images, targets, steps=args.refine_steps)
        return {"maps": standardise(refined).half()}

    write_in_chunks(args.out, chosen, args.chunk, teach)


def train(args) -> None:
    """The objective's backward needs no classifier gradients: they are switched off for the run and put back."""
    bundle = load_model(args.model)
    with kept_training_state(bundle.network):
        bundle.network.requires_grad_(False)
        _train(args, bundle)


def _train(args, bundle) -> None:
    from safetensors.torch import load_file

    from explainers.aha.objective import aha_loss, grid_range, reference_batch

    torch.manual_seed(args.seed)
    explainer = load_explainer(bundle)
    indices, maps = [], []
    for path in args.targets:
        part = load_file(path)
        indices += part["indices"].tolist()
        maps.append(part["maps"].float())
    teacher = torch.cat(maps)
    images, labels = load_eval_images(bundle, args.data, None, split="train", indices=indices)
    assert len(images) == len(teacher)  # load_eval_images keeps the order of `indices` (all of them)
    with torch.no_grad():
        targets = torch.cat([bundle(images[s:s + 256]).argmax(1) for s in range(0, len(images), 256)])
    if args.val_holdout is not None:  # photos: the images of --data that the explainer's training held out
        from explainers.aha_training.data import holdout_indices
        from explainers.data import open_dataset

        held = holdout_indices(len(open_dataset(args.data, split="train")), args.val_holdout)[1]
        assert not set(held) & set(indices), "a teacher image is a validation image"
        val_images, _ = load_eval_images(bundle, args.data, None, split="train", indices=held)
    else:
        val_images, _ = load_eval_images(bundle, args.val_data, args.val_limit, split="val")
    mosaics, mosaic_classes = (validation_mosaics(bundle, args.val_data, args.val_mosaics)
                               if args.val_mosaics and args.val_data else (None, None))  # photos: no GridPG
    # the shipped explainer, frozen: its mosaic maps are kept (only the mosaic steps read it)
    keeper = load_explainer(bundle).eval() if args.mosaic_every else None
    cached = None
    if args.cache_encoded:  # photos at 224 px: the classifier pass dominates a step; do it once per view
        if args.flip or args.mosaic_every:
            raise SystemExit("--cache-encoded works with --hflip or no augmentation, without mosaic steps")
        cached = [encode_all(explainer, images)] + ([encode_all(explainer, images.flip(-1))] if args.hflip else [])
    trainable = set(args.trainable.split(",")) if args.trainable else None
    params = [p for name, p in explainer.named_parameters()
              if p.requires_grad and (trainable is None or name.split(".")[0] in trainable)]
    if not params:
        raise SystemExit(f"--trainable {args.trainable}: no such parts of the explainer")
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=1e-3)
    history = []

    def evaluate(step):
        scores = validation_scores(explainer, val_images)
        if mosaics is not None:
            scores["gridpg"] = validation_gridpg(explainer, mosaics, mosaic_classes)
        scores["step"] = step
        scores["seconds"] = round(time.time() - started, 1)
        history.append(scores)
        print(json.dumps(scores), flush=True)
        return (scores.get("gridpg", 1.0) >= args.gridpg_min, scores["ins_minus_del"])

    started = time.time()
    best = evaluate(0)
    best_step = 0
    save_explainer(explainer, args.out, {**explainer.card, "distilled": {"step": 0}})
    generator = torch.Generator().manual_seed(args.seed)
    grid = grid_range(bundle.input_size)[1]
    for step in range(1, args.steps + 1):
        explainer.train()
        if args.mosaic_every and step % args.mosaic_every == 0:
            # keep the shipped explainer's maps of 2 x 2 mosaics for each quadrant's class (its class specificity)
            pick = torch.randint(len(images), (4 * args.mosaics,), generator=generator)
            tiles = images[pick].view(args.mosaics, 4, *images.shape[1:])
            x = torch.cat([torch.cat([tiles[:, 0], tiles[:, 1]], 3), torch.cat([tiles[:, 2], tiles[:, 3]], 3)], 2)
            encoded = explainer.encode(x).select(torch.arange(args.mosaics).repeat_interleave(4))
            t = labels[pick]
            with torch.no_grad():
                goal = standardise(keeper(encoded, t))
            with torch.enable_grad():
                loss = args.mosaic_weight * ((standardise(explainer(encoded, t)) - goal) ** 2).mean()
        else:
            pick = torch.randint(len(images), (args.batch_size,), generator=generator)
            x, t, goal = images[pick], targets[pick], teacher[pick]
            if args.flip:  # flips and quarter turns: the cell has no orientation; the teacher map turns with it
                turns = int(torch.randint(4, (1,), generator=generator))
                x, goal = torch.rot90(x, turns, (-2, -1)), torch.rot90(goal, turns, (-2, -1))
                if int(torch.randint(2, (1,), generator=generator)):
                    x, goal = x.flip(-1), goal.flip(-1)
            mirrored = bool(args.hflip and int(torch.randint(2, (1,), generator=generator)))
            if mirrored:  # photos: mirror images only
                x, goal = x.flip(-1), goal.flip(-1)
            encoded = cached[int(mirrored)].select(pick) if cached else explainer.encode(x)
            with torch.enable_grad():
                out = explainer(encoded, t)
                loss = ((standardise(out) - goal) ** 2).mean()
                if args.objective_weight > 0:
                    terms = aha_loss(bundle, x, out, t, reference_batch(x, "mean", bundle.reference_color),
                                     grid=grid, tau=0.3, noise=False)
                    loss = loss + args.objective_weight * terms.loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if step % 20 == 0:
            print(f"step {step} loss {float(loss.detach()):.4f} {(time.time() - started) / step:.2f} s/step", flush=True)
        if step % args.val_every == 0 or step == args.steps:
            score = evaluate(step)
            if score > best:
                best, best_step = score, step
                save_explainer(explainer, args.out, {**explainer.card, "distilled": {"step": step}})
        if time.time() - started > args.minutes * 60:
            print("time budget reached", flush=True)
            break
    Path(str(args.out) + ".history.json").write_text(json.dumps(
        {"history": history, "best_step": best_step, "steps_done": step, "device": str(bundle.device),
         "args": vars(args)}, indent=1))
    print("best", best_step, best)


def ship(args) -> None:
    """Replace the shipped explainer by a student that passed the rule, and record the round in the card.

    The rule (since round 2): the paired 95% interval of the student's ins-del gain over the shipped explainer on the
    validation cells (`bench/aha_compare_explainers.py`, A = shipped, B = student) excludes 0. The card keeps the
    shipped explainer's training record and gains `distillation_round_N` (teacher, student, validation trace, plot,
    the comparison and the commands); the previous weights stay in git history."""
    import shutil

    from explainers.aha_training.plot import validation_plot
    from explainers.aha.store import explainer_stem

    compare = json.loads(Path(args.compare).read_text())
    gain = compare["B_minus_A"]["ins_minus_del"]
    if not (gain["ci95"][0] > 0):
        raise SystemExit(f"not shipped: the val ins-del gain {gain['mean']:+.4f} has 95% interval "
                         f"[{gain['ci95'][0]:.4f}, {gain['ci95'][1]:.4f}], which does not exclude 0")
    history = json.loads(Path(args.student + ".history.json").read_text())
    stem = explainer_stem(args.model, args.weights_dir)
    if not Path(str(stem) + ".json").exists():
        raise SystemExit(f"no shipped explainer card at {stem}.json")
    card = json.loads(Path(str(stem) + ".json").read_text())
    student_card = json.loads(Path(args.student + ".json").read_text())
    exported = int(student_card.get("distilled", {}).get("step", history["best_step"]))
    plot_name = f"{stem.name}.distillation-{args.round}.png"
    cells = compare.get("images", gain.get("n"))
    validation_plot(history["history"], stem.parent / plot_name, exported_step=exported,
                    title=f"{args.model}: distillation round {args.round}, val (hard AUCs, {cells} cells)")
    train_args = history["args"]
    rounds = sorted(int(k.rsplit("_", 1)[1]) for k in card if k.startswith("distillation_round_"))
    previous = f"round {rounds[-1]}" if rounds else "round 1"
    card[f"distillation_round_{args.round}"] = {
        "what": args.what,
        "script": "bench/aha_distill.py",
        "teacher": json.loads(args.teacher_json),
        "student": {"init": f"{previous} (the shipped explainer before this round)", "lr": train_args["lr"],
                    "batch_size_cells": train_args["batch_size"],
                    "augment": ("quarter turns and flips" if train_args["flip"] else
                                "horizontal flips" if train_args.get("hflip") else "none"),
                    "mosaic_every": train_args["mosaic_every"], "planned_steps": train_args["steps"],
                    "time_budget_minutes": train_args["minutes"], "steps_done": history.get("steps_done"),
                    "device": history.get("device", "cpu"), "threads": train_args.get("threads", 1)},
        "validation_metric": card[f"distillation_round_{rounds[-1]}"]["validation_metric"] if rounds
        else card["distillation"]["validation_metric"],
        "validation": history["history"], "exported_step": exported, "validation_plot": plot_name,
        "rule": f"ship only if the paired 95% interval of the ins-del gain over the shipped explainer on the {cells} "
                "val cells excludes 0",
        f"versus_{previous.replace(' ', '_')}_val{cells}": compare["B_minus_A"],
        "commands": args.commands,
        "previous_weights": f"git history of {stem.name}.safetensors before this round"}
    shutil.copyfile(args.student + ".safetensors", str(stem) + ".safetensors")
    Path(str(stem) + ".json").write_text(json.dumps(card, indent=2))
    print(f"shipped round {args.round}: val ins-del {gain['mean']:+.4f} [{gain['ci95'][0]:.4f}, {gain['ci95'][1]:.4f}]"
          f", exported step {exported}; plot {plot_name}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    t = commands.add_parser("targets")
    teacher_arguments(t, limit=1200, chunk=16)
    t.add_argument("--teacher", choices=("head", "correction"), default="head",
                   help="head: refine the explainer's output head (rounds 1-2); correction: the method's T steps "
                        "(a G x G correction of the one-pass map, the card's refinement settings)")
    r = commands.add_parser("train")
    r.add_argument("--model", required=True)
    r.add_argument("--data", required=True)
    r.add_argument("--targets", nargs="+", required=True)
    r.add_argument("--val-data", default=None)
    r.add_argument("--val-holdout", type=float, default=None, help="instead of --val-data: validate on this held-out "
                   "fraction of --data (photos; the targets must come from `targets --holdout` with the same value)")
    r.add_argument("--val-limit", type=int, default=256)
    r.add_argument("--steps", type=int, default=2000)
    r.add_argument("--batch-size", type=int, default=32)
    r.add_argument("--lr", type=float, default=1e-4)
    r.add_argument("--objective-weight", type=float, default=0.0)
    r.add_argument("--flip", action="store_true", help="quarter turns and flips (cells)")
    r.add_argument("--hflip", action="store_true", help="horizontal flips only (photos)")
    r.add_argument("--trainable", default=None, help="train only these top-level parts of the explainer, e.g. "
                   "head,fusions (default: all; fewer for few teacher images)")
    r.add_argument("--cache-encoded", action="store_true", help="encode every training image (and its mirror "
                   "image) once instead of at every step (memory: about 1 MB per image and view at 224 px)")
    r.add_argument("--mosaic-every", type=int, default=0, help="every k-th step: keep the shipped mosaic maps")
    r.add_argument("--mosaics", type=int, default=8)
    r.add_argument("--mosaic-weight", type=float, default=1.0)
    r.add_argument("--val-mosaics", type=int, default=64, help="0: no GridPG tracking (e.g. a ViT that does not "
                   "read mosaics)")
    r.add_argument("--gridpg-min", type=float, default=0.0, help="a checkpoint is eligible at this val GridPG")
    r.add_argument("--val-every", type=int, default=200)
    r.add_argument("--minutes", type=float, default=60)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--out", required=True)
    r.add_argument("--threads", type=int, default=1)
    s = commands.add_parser("ship", help="replace the shipped explainer by a student that passed the val rule")
    s.add_argument("--model", required=True)
    s.add_argument("--student", required=True, help="the student's stem (train --out)")
    s.add_argument("--compare", required=True, help="bench/aha_compare_explainers.py JSON (A shipped, B student)")
    s.add_argument("--round", type=int, required=True)
    s.add_argument("--what", required=True)
    s.add_argument("--teacher-json", required=True, help="the teacher's description (JSON object)")
    s.add_argument("--commands", nargs="+", required=True)
    s.add_argument("--weights-dir", default=None, help="where the shipped explainer is (default: where the app finds it)")
    args = parser.parse_args(argv)
    if args.command == "train" and (args.val_data is None) == (args.val_holdout is None):
        parser.error("train: give --val-data or --val-holdout (one of them)")
    torch.set_num_threads(getattr(args, "threads", 1))
    {"targets": write_targets, "train": train, "ship": ship}[args.command](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
