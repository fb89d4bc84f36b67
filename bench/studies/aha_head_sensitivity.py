"""AHA that reacts to the classifier's head (issue #16, the sanity target: after the head is re-initialised the
one-pass map's Spearman rho with the original should fall to <= 0.5; the shipped ViT explainer keeps 0.98).

The explainer reads the head only through the class embedding (the normalised weight row of the target), and its
training only ever showed it the real head's eight rows, so it learnt to ignore them. Here it is shown other heads:
  teachers: chunks of training cells, each chunk with a freshly re-initialised head (`explainers.sanity.reinitialise`,
            seeds from --seed-base, never the sanity check's seed 0); the explainer's one-pass map under that head,
            refined --refine-steps by the method's own correction (grid 16) for the SAME classifier with that head,
            so each teacher is what deletion / insertion ask for under that head. Saved with each cell's head row.
  train:    warm start from the shipped explainer; every step one batch of teacher cells (class rows = their random
            rows) and one batch of training cells under the real head keeping the shipped explainer's own maps
            (its faithfulness there). Validation: hard ins-del on val cells (real head), and on 16 val cells the
            sanity rho (the seed-0 head, as `explainers.sanity` draws it) with the deletion / insertion of the maps
            under that head. Every evaluated checkpoint is kept.
  signals:  can a class signal from the classifier's pass predict what a teacher changed? Per teacher cell, the Pearson
            r between (teacher - one-pass map) under its head and candidate signals computed with that head's row:
            <token, row> per decoder level, direct logit attribution, gradient x activation and Grad-CAM at the last
            block's input; "null": the same signals with another cell's head row (what r is by chance).
  check:    shipped vs a student on val or test cells: paired deletion / insertion under the real head, sanity rho,
            and deletion / insertion under the re-initialised head (is the changed map faithful to the changed
            model, or only different?).
Training cells for teachers and training, validation cells for the choice; `check` on test only for the shipped one.

  python bench/studies/aha_head_sensitivity.py teachers --model bloodmnist-vit --data ../shared/data/bloodmnist/64/train \
      --limit 800 --part 0/2 --out heads-0.safetensors
  python bench/studies/aha_head_sensitivity.py train --model bloodmnist-vit --data ../shared/data/bloodmnist/64/train \
      --teachers heads-0.safetensors heads-1.safetensors --val-data ../shared/data/bloodmnist/64/val --out DIR/student
  python bench/studies/aha_head_sensitivity.py check --model bloodmnist-vit --data ../shared/data/bloodmnist/64/val \
      --split val --limit 64 --students weights/aha-bloodmnist-vit DIR/student-step400 --out OUT.json
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from explainers.aha.network import standardise
from explainers.aha.store import load_explainer, save_explainer
from explainers.aha_training.data import load_eval_images
from explainers.aha_training.validation import validation_scores


def _bench_tool(name: str):
    """A script of bench/ ('studies/NAME' for a study; scripts, not a package) loaded by its path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(Path(name).name, Path(__file__).resolve().parents[1] / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_distill = _bench_tool("aha_distill")  # the teacher files are written as bench/aha_distill.py writes them
chosen_cells, correction_teacher = _distill.chosen_cells, _distill.correction_teacher
teacher_arguments, write_in_chunks = _distill.teacher_arguments, _distill.write_in_chunks
from explainers.attention import model_lock
from explainers.metrics import deletion_insertion, spearman
from explainers.models import kept_training_state, load_model
from explainers.sanity import parameter_layers, reinitialise
from explainers.statistics import bootstrap_ci, paired_difference

SANITY_SEED = 0  # explainers.sanity's default: the head the check draws; teachers never use it


def reinitialised_head(bundle, seed: int):
    """A copy of `bundle` whose classifier head alone is re-initialised as the sanity check does (its first stage)."""
    randomized = copy.copy(bundle)
    randomized.network = copy.deepcopy(bundle.network)
    randomized.lock = threading.RLock()
    name, module = parameter_layers(randomized.network)[0]
    if module is not randomized.network.get_classifier():
        raise SystemExit(f"the top parameter layer of {bundle.name} is '{name}', not its classifier head")
    reinitialise(name, module, torch.Generator().manual_seed(seed))
    return randomized


def head_rows(bundle, targets: torch.Tensor) -> torch.Tensor:
    return bundle.network.get_classifier().weight.detach()[targets].float()


def write_teachers(args) -> None:
    bundle = load_model(args.model)
    chosen, part, parts = chosen_cells(args)

    def teach(batch, cells_done):
        seed = args.seed_base + part + parts * (cells_done // args.chunk)  # one head per chunk
        assert seed != SANITY_SEED
        randomized = reinitialised_head(bundle, seed)
        images, _ = load_eval_images(bundle, args.data, None, split="train", indices=batch)
        with torch.no_grad():
            targets = bundle(images).argmax(1)  # the real model's class, as the sanity check keeps it
        refined = correction_teacher(load_explainer(randomized), randomized, images, targets, args.refine_steps,
                                     args.grid)
        return {"maps": standardise(refined).half(), "rows": head_rows(randomized, targets),
                "seeds": torch.full((len(batch),), seed, dtype=torch.long)}

    write_in_chunks(args.out, chosen, args.chunk, teach)


def sanity_scores(explainer, randomized, images: torch.Tensor) -> tuple:
    """Sanity rho of the one-pass maps (real head vs `randomized`'s head) and the deletion / insertion of both maps
    under the randomized model (the re-initialised head's own curves); with (top-1 targets, original maps, changed
    maps), from one classifier pass."""
    was_training = explainer.training
    explainer.eval()
    try:
        with torch.no_grad():
            encoded = explainer.encode(images)
            targets = encoded.logits.argmax(1)
            original = standardise(explainer(encoded, targets))
            changed = standardise(explainer(encoded, targets, class_rows=head_rows(randomized, targets)))
    finally:
        explainer.train(was_training)
    rho = np.array([spearman(original[i], changed[i]) for i in range(len(images))])
    kept = deletion_insertion(randomized, images, original, targets, steps=20, reference="mean")
    moved = deletion_insertion(randomized, images, changed, targets, steps=20, reference="mean")
    return {"rho": rho, "changed_deletion": np.asarray(moved.deletion_auc),
            "changed_insertion": np.asarray(moved.insertion_auc), "kept_deletion": np.asarray(kept.deletion_auc),
            "kept_insertion": np.asarray(kept.insertion_auc)}, (targets, original, changed)


def train(args) -> None:
    bundle = load_model(args.model)
    torch.set_num_threads(args.threads)
    with kept_training_state(bundle.network):
        bundle.network.requires_grad_(False)
        _train(args, bundle)


def _train(args, bundle) -> None:
    from safetensors.torch import load_file

    from explainers.data import open_dataset

    torch.manual_seed(args.seed)
    explainer = load_explainer(bundle, args.init)  # the shipped explainer unless --init names another start
    keeper = load_explainer(bundle).eval()  # the shipped explainer, frozen: the real head's maps are kept
    parts = [load_file(path) for path in args.teachers]
    indices = sum((p["indices"].tolist() for p in parts), [])
    teacher, rows = torch.cat([p["maps"].float() for p in parts]), torch.cat([p["rows"] for p in parts])
    images, _ = load_eval_images(bundle, args.data, None, split="train", indices=indices)
    with torch.no_grad():
        targets = torch.cat([bundle(images[s:s + 256]).argmax(1) for s in range(0, len(images), 256)])
    taken = set(indices)  # real-head cells: other training cells
    others = [i for i in range(0, len(open_dataset(args.data, split="train")), 7) if i not in taken][:args.real_cells]
    real_images, _ = load_eval_images(bundle, args.data, None, split="train", indices=others)
    val_images, _ = load_eval_images(bundle, args.val_data, args.val_limit, split="val")
    sanity_images = val_images[torch.linspace(0, len(val_images) - 1, args.sanity_cells).long()]
    randomized = reinitialised_head(bundle, SANITY_SEED)
    params = [p for p in explainer.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=1e-3)
    history = []
    out = Path(args.out)

    def evaluate(step):
        row = {"step": step, **validation_scores(explainer, val_images)}
        sanity = sanity_scores(explainer, randomized, sanity_images)[0]
        row.update({"sanity_rho": round(float(sanity["rho"].mean()), 4),
                    "randomized_ins_minus_del_changed": round(float(
                        (sanity["changed_insertion"] - sanity["changed_deletion"]).mean()), 4),
                    "randomized_ins_minus_del_kept": round(float(
                        (sanity["kept_insertion"] - sanity["kept_deletion"]).mean()), 4),
                    "seconds": round(time.time() - started, 1)})
        history.append(row)
        print(json.dumps(row), flush=True)
        save_explainer(explainer, f"{out}-step{step}", {**explainer.card, "head_sensitivity": {"step": step}})

    started = time.time()
    evaluate(0)
    generator = torch.Generator().manual_seed(args.seed)
    step = 0
    for step in range(1, args.steps + 1):
        explainer.train()
        pick = torch.randint(len(images), (args.batch_size,), generator=generator)
        encoded = explainer.encode(images[pick])
        t = targets[pick]
        real_pick = torch.randint(len(real_images), (args.batch_size,), generator=generator)
        x = real_images[real_pick]
        turns = int(torch.randint(4, (1,), generator=generator))
        x = torch.rot90(x, turns, (-2, -1))
        real_encoded = explainer.encode(x)
        real_t = real_encoded.logits.argmax(1)
        with torch.no_grad():
            keep = standardise(keeper(real_encoded, real_t))
        with torch.enable_grad():
            moved = standardise(explainer(encoded, t, class_rows=rows[pick]))
            loss_heads = ((moved - teacher[pick]) ** 2).mean()
            loss_real = ((standardise(explainer(real_encoded, real_t)) - keep) ** 2).mean()
            loss = args.head_weight * loss_heads + loss_real
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if step % 20 == 0:
            print(f"step {step} heads {float(loss_heads):.4f} real {float(loss_real):.4f} "
                  f"{(time.time() - started) / step:.2f} s/step", flush=True)
        if step % args.val_every == 0 or step == args.steps:
            evaluate(step)
        if time.time() - started > args.minutes * 60:
            print("time budget reached", flush=True)
            if history[-1]["step"] != step:
                evaluate(step)
            break
    Path(f"{out}.history.json").write_text(json.dumps(
        {"history": history, "steps_done": step, "device": str(bundle.device), "args": vars(args)}, indent=1))


def check(args) -> None:
    bundle = load_model(args.model)
    torch.set_num_threads(args.threads)
    images, _ = load_eval_images(bundle, args.data, args.limit, split=args.split)
    randomized = reinitialised_head(bundle, SANITY_SEED)
    report = {"model": args.model, "data": args.data, "split": args.split, "images": int(len(images)),
              "sanity_seed": SANITY_SEED, "explainers": {}}
    scores = {}
    for stem in args.students:
        explainer = load_explainer(bundle, stem).eval()
        on_randomized = load_explainer(randomized, stem).eval()  # the method's own path on the re-initialised model
        real_del, real_ins, sanity = [], [], {}
        for s in range(0, len(images), 32):
            x = images[s:s + 32]
            batch_scores, (targets, maps, changed) = sanity_scores(explainer, randomized, x)
            for key, value in batch_scores.items():
                sanity.setdefault(key, []).append(value)
            curves = deletion_insertion(bundle, x, maps.float(), targets, steps=20, reference="mean")
            real_del.append(np.asarray(curves.deletion_auc))
            real_ins.append(np.asarray(curves.insertion_auc))
            with torch.no_grad():  # class_rows stands in for the re-initialised head exactly (the features are the same)
                direct = on_randomized.predict_and_explain(x, targets)[1]
            assert torch.allclose(direct, changed, atol=1e-4), float((direct - changed).abs().max())
        row = {"deletion": np.concatenate(real_del), "insertion": np.concatenate(real_ins),
               **{k: np.concatenate(v) for k, v in sanity.items()}}
        scores[stem] = row
        report["explainers"][stem] = {
            "deletion_auc": float(row["deletion"].mean()), "insertion_auc": float(row["insertion"].mean()),
            "ins_minus_del": float((row["insertion"] - row["deletion"]).mean()),
            "sanity_rho": float(row["rho"].mean()),
            "randomized_model": {
                "changed_map_deletion": float(row["changed_deletion"].mean()),
                "changed_map_insertion": float(row["changed_insertion"].mean()),
                "original_map_deletion": float(row["kept_deletion"].mean()),
                "original_map_insertion": float(row["kept_insertion"].mean()),
                "changed_minus_original_ins_minus_del": paired_difference(
                    row["changed_insertion"] - row["changed_deletion"], row["kept_insertion"] - row["kept_deletion"])}}
        print(stem, json.dumps(report["explainers"][stem], default=float), flush=True)
    first = args.students[0]
    a = scores[first]
    report["minus_first"] = {stem: {
        "deletion": paired_difference(b["deletion"], a["deletion"]),
        "insertion": paired_difference(b["insertion"], a["insertion"]),
        "ins_minus_del": paired_difference(b["insertion"] - b["deletion"], a["insertion"] - a["deletion"]),
        "sanity_rho": paired_difference(b["rho"], a["rho"])} for stem, b in scores.items() if stem != first}
    Path(args.out).write_text(json.dumps(report, indent=1, default=float))
    print(json.dumps(report["minus_first"], indent=1, default=float))


def teacher_gain(args) -> None:
    """Is a teacher better than the one-pass map under its own head? Paired hard deletion / insertion (K=20) of both
    maps under each teacher cell's re-initialised head (rebuilt from its seed). And is that gain specific to the head:
    under the real head, the teacher against the real head's own one-pass map."""
    bundle = load_model(args.model)
    torch.set_num_threads(args.threads)
    explainer = load_explainer(bundle)
    rows = {name: {"deletion": [], "insertion": []} for name in ("teacher", "one_pass", "teacher_under_real_head",
                                                                 "real_one_pass_under_real_head")}
    for part, picked, all_images in teacher_batches(args, bundle):
        for seed in sorted(set(part["seeds"][picked].tolist())):
            mask = part["seeds"][picked] == seed
            chosen, images = picked[mask], all_images[mask]
            randomized = reinitialised_head(bundle, int(seed))
            with torch.no_grad():  # one classifier pass; class_rows gives exactly the re-initialised model's map
                encoded = explainer.encode(images)
                targets = encoded.logits.argmax(1)
                real_one_pass = standardise(explainer(encoded, targets))
                one_pass = standardise(explainer(encoded, targets, class_rows=head_rows(randomized, targets)))
            for name, model, maps in (("teacher", randomized, part["maps"][chosen].float()),
                                      ("one_pass", randomized, one_pass),
                                      ("teacher_under_real_head", bundle, part["maps"][chosen].float()),
                                      ("real_one_pass_under_real_head", bundle, real_one_pass)):
                curves = deletion_insertion(model, images, maps, targets, steps=20, reference="mean")
                rows[name]["deletion"].append(np.asarray(curves.deletion_auc))
                rows[name]["insertion"].append(np.asarray(curves.insertion_auc))
    scores = {name: {k: np.concatenate(v) for k, v in row.items()} for name, row in rows.items()}
    t, o = scores["teacher"], scores["one_pass"]
    report = {"model": args.model, "teachers": args.teachers, "cells": int(len(t["deletion"])),
              "under": "each cell's own re-initialised head", **{
                  name: {"deletion_auc": float(v["deletion"].mean()), "insertion_auc": float(v["insertion"].mean())}
                  for name, v in scores.items()},
              "teacher_minus_one_pass": {
                  "deletion": paired_difference(t["deletion"], o["deletion"]),
                  "insertion": paired_difference(t["insertion"], o["insertion"]),
                  "ins_minus_del": paired_difference(t["insertion"] - t["deletion"], o["insertion"] - o["deletion"])},
              "under_real_head_teacher_minus_real_one_pass": paired_difference(
                  scores["teacher_under_real_head"]["insertion"] - scores["teacher_under_real_head"]["deletion"],
                  scores["real_one_pass_under_real_head"]["insertion"]
                  - scores["real_one_pass_under_real_head"]["deletion"])}
    Path(args.out).write_text(json.dumps(report, indent=1, default=float))
    print(json.dumps(report, indent=1, default=float))


def pearson(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    a, b = a.detach().flatten(1).double(), b.detach().flatten(1).double()
    a, b = a - a.mean(1, keepdim=True), b - b.mean(1, keepdim=True)
    return ((a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1)).clamp_min(1e-12)).numpy()


def row_signals(explainer, images: torch.Tensor, encoded, row_sets: list) -> list:
    """For each B x D set of stand-in head rows, B x H x W class signals of those rows for these images (the
    explainer's levels). The passes that do not depend on the rows are made once for all sets."""
    attribution = _bench_tool("studies/aha_vit_logit_attribution_val")
    dla_read, dla_record = attribution.dla_read, attribution.dla_record

    bundle, network = explainer.bundle, explainer.bundle.network
    size = tuple(images.shape[-2:])
    up = lambda m: F.interpolate(m.unsqueeze(1).float(), size=size, mode="bilinear", align_corners=False).squeeze(1)  # noqa: E731
    recorded = dla_record(bundle, images)
    kept = {}

    def keep(module, inputs):
        kept["tokens"] = inputs[0]

    with model_lock(bundle):  # the hook and the gradient switch are on the shared model
        handle = network.blocks[-1].register_forward_pre_hook(keep)
        try:
            with torch.enable_grad(), kept_training_state(network):
                network.requires_grad_(False)
                pre_logits = network.forward_head(
                    network.forward_features(bundle.normalize(images).requires_grad_(True)), pre_logits=True)
                grads = [torch.autograd.grad((pre_logits * rows).sum(), kept["tokens"], retain_graph=True)[0]
                         for rows in row_sets]
        finally:
            handle.remove()
    prefix = int(getattr(network, "num_prefix_tokens", 1))
    tokens = kept["tokens"][:, prefix:].detach()
    grid = encoded.levels[-1].shape[-2:]
    as_map = lambda m: up(m.reshape(-1, *grid))  # noqa: E731
    out = []
    for rows, grad in zip(row_sets, grads):
        unit = rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-6)
        found = {f"row_dot_token_level{i}": up(torch.einsum("bchw,bc->bhw", level.float(), unit))
                 for i, level in enumerate(encoded.levels)}
        for layers in ("last", "all"):
            found[f"logit_attribution_{layers}"] = dla_read(bundle, recorded, rows, layers)
        grad = grad[:, prefix:]
        found["gradient_x_activation"] = as_map((grad * tokens).sum(-1))
        found["gradcam_last_block"] = as_map(torch.relu((grad.mean(1, keepdim=True) * tokens).sum(-1)))
        out.append(found)
    return out


def teacher_batches(args, bundle, batch_size: int | None = None):
    """(teacher file, picked positions, training images) for `--limit` cells spread over each teacher file, in
    batches (None: the whole pick of a file at once)."""
    from safetensors.torch import load_file

    for path in args.teachers:
        part = load_file(path)
        picked = torch.linspace(0, len(part["indices"]) - 1, min(args.limit, len(part["indices"]))).long()
        step = batch_size or len(picked)
        for start in range(0, len(picked), step):
            chosen = picked[start:start + step]
            images, _ = load_eval_images(bundle, args.data, None, split="train", indices=part["indices"][chosen].tolist())
            yield part, chosen, images


def signals(args) -> None:
    bundle = load_model(args.model)
    torch.set_num_threads(args.threads)
    explainer = load_explainer(bundle)
    found = {"own_head": {}, "null_other_head": {}}
    cells = 0
    for part, chosen, images in teacher_batches(args, bundle, batch_size=16):
        rows, teacher = part["rows"][chosen].float(), part["maps"][chosen].float()
        with torch.no_grad():
            encoded = explainer.encode(images)
            targets = encoded.logits.argmax(1)
            one_pass = standardise(explainer(encoded, targets, class_rows=rows))  # the map under that head
        correction = teacher - one_pass
        other = rows.roll(1, dims=0) if len(rows) > 1 else -rows  # another cell's head row: chance level
        for name, table in zip(("own_head", "null_other_head"),
                               row_signals(explainer, images, encoded, [rows, other])):
            for signal, maps in table.items():
                found[name].setdefault(signal, []).append(pearson(maps, correction))
        cells += len(chosen)
    report = {"model": args.model, "teachers": args.teachers, "cells": cells, "split": "train (teacher cells)",
              "what": "per-cell Pearson r between (teacher - one-pass map under the cell's re-initialised head) and "
                      "each signal computed with that head's row (own_head) or another cell's (null_other_head); "
                      "mean and bootstrap 95% interval over cells"}
    for name, table in found.items():
        report[name] = {}
        for signal, values in table.items():
            values = np.concatenate(values)
            report[name][signal] = {"mean_r": round(float(values.mean()), 4),
                                    "ci95": [round(float(v), 4) for v in bootstrap_ci(values)],
                                    "mean_abs_r": round(float(np.abs(values).mean()), 4)}
            print(f"{name:16s} {signal:26s} r {values.mean():+.4f} {report[name][signal]['ci95']} "
                  f"|r| {np.abs(values).mean():.4f}", flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    t = commands.add_parser("teachers")
    teacher_arguments(t, limit=800, chunk=8)  # --chunk: cells per re-initialised head
    t.add_argument("--seed-base", type=int, default=1000)
    r = commands.add_parser("train")
    r.add_argument("--model", required=True)
    r.add_argument("--data", required=True)
    r.add_argument("--teachers", nargs="+", required=True)
    r.add_argument("--val-data", required=True)
    r.add_argument("--val-limit", type=int, default=256)
    r.add_argument("--sanity-cells", type=int, default=16)
    r.add_argument("--real-cells", type=int, default=2000)
    r.add_argument("--steps", type=int, default=2000)
    r.add_argument("--batch-size", type=int, default=16)
    r.add_argument("--lr", type=float, default=1e-4)
    r.add_argument("--init", default=None, help="start from this explainer stem (default: the shipped one)")
    r.add_argument("--head-weight", type=float, default=1.0)
    r.add_argument("--val-every", type=int, default=200)
    r.add_argument("--minutes", type=float, default=30)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--out", required=True)
    c = commands.add_parser("check")
    c.add_argument("--model", required=True)
    c.add_argument("--data", required=True)
    c.add_argument("--split", default="val")
    c.add_argument("--limit", type=int, default=64)
    c.add_argument("--students", nargs="+", required=True, help="explainer stems; the first is the reference")
    c.add_argument("--threads", type=int, default=1)
    c.add_argument("--out", required=True)
    for name in ("teacher-gain", "signals"):  # both read teacher files
        g = commands.add_parser(name)
        g.add_argument("--model", required=True)
        g.add_argument("--data", required=True)
        g.add_argument("--teachers", nargs="+", required=True)
        g.add_argument("--limit", type=int, default=64, help="teacher cells per file, spread over it")
        g.add_argument("--threads", type=int, default=1)
        g.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    {"teachers": write_teachers, "train": train, "check": check, "teacher-gain": teacher_gain,
     "signals": signals}[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
