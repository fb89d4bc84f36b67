"""Command line: `python -m explainers <command>`. The app calls the same library functions.

One way to add a command: a function `add_<command>_parser(commands)` that adds its sub-parser and sets its
`handler` (here for the commands that only wire library calls together; beside the code for a feature's own
commands, e.g. `familiarity.add_familiarity_parser`), named once in `REGISTRARS` below. The flags of the methods'
options (`--refine-steps`, `--alpha`, `--rise-masks`, ...) are made from each method's declared options.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def cmd_train_classifier(args) -> int:
    from .data import class_names_for
    from .training import train_classifier

    card = train_classifier(name=args.name, data=args.data, preset=args.preset, epochs=args.epochs,
                            batch_size=args.batch_size, lr=args.lr, seed=args.seed, out_dir=args.out_dir,
                            test_data=args.test_data, val_data=args.val_data,
                            class_names=class_names_for(args.data))
    print(json.dumps({k: card[k] for k in ("name", "data", "epochs", "seed")}, indent=2))
    return 0


# --- the methods' options as flags, made from their declarations ----------------------------------------------
def _option_flags() -> list:
    """[(method name, Option, flag without dashes, argparse dest)] for every declared option of every method."""
    from .methods import METHODS, list_methods

    flags = []
    for name in list_methods():
        for option in METHODS[name].declared_options():
            flag = option.flag or f"{name}-{option.name}".replace("_", "-")
            flags.append((name, option, flag, f"option__{name}__{option.name}"))
    return flags


def add_method_flags(parser) -> None:
    """A flag per declared method option: its range and default from the Option, checked by the method itself."""
    for name, option, flag, dest in _option_flags():
        info = f" {option.info}" if option.info else ""
        parser.add_argument(f"--{flag}", dest=dest, type=option.kind, default=None, metavar=option.kind.__name__.upper(),
                            help=(f"{option.label} ({name}).{info} Range {option.minimum:g}..{option.maximum:g}, "
                                  f"default {option.default:g}.").replace("%", "%%"))


def _spec_help(what: str = "comma-separated") -> str:
    """The --method(s) help, from the registry: the names, and a spec with one declared option as the example."""
    from .methods import METHODS, list_methods

    names = list_methods()
    example = next((f"{name}:{option.name}={option.default:g}" for name in names
                    for option in METHODS[name].declared_options()), None)
    return (f"{what}, of {', '.join(names)}; options per method as name:key=value"
            + (f" (e.g. {example})" if example else ""))


def _method_options(args) -> dict:
    """{method: {option: value}} of the method flags given on the command line."""
    options = {}
    for name, option, _, dest in _option_flags():
        if getattr(args, dest, None) is not None:
            options.setdefault(name, {})[option.name] = getattr(args, dest)
    return options


def cmd_explain(args) -> int:
    import numpy as np

    from . import engine
    from .images import conversion_notes, crop_region, file_facts, load_image, map_to_original, overlay
    from .methods import parse_method_spec, split_method_specs
    from .metrics import CURVE_METRICS, METRICS, summary_value
    from .models import load_model

    specs = [parse_method_spec(spec)[:2] for spec in split_method_specs(args.method)]
    if not specs:
        raise ValueError(f"--method names no method: {_spec_help('one or several, comma-separated')}")
    names = [name for name, _ in specs]
    if len(set(names)) < len(names):
        raise ValueError(f"--method names a method twice ({', '.join(names)}): one run per method; run it again "
                         "for other options")
    out = Path(args.out)
    one_file = out.suffix.lower() in (".png", ".npy")
    if out.suffix and not one_file and not out.is_dir():
        raise ValueError(f"--out {out.name}: give FILE.png (overlay), FILE.npy (map) or a folder")
    if one_file and len(specs) > 1:
        raise ValueError(f"--out {out.name} is one file, but {len(specs)} methods were asked for: give a folder "
                         "(overlay PNG per method, curves.csv, report.json)")
    bundle = load_model(args.model)
    original = load_image(args.image)
    for note in conversion_notes(file_facts(args.image)):
        print(f"note: {note}")
    prepared = engine.prepare_input(original, bundle)  # the app's path: the same cached run_method
    top, verdict = engine.predict_and_check(bundle, prepared)
    if verdict and verdict["unfamiliar"]:
        print(f"warning: {verdict['message']}")
    target = top[0][0] if args.target is None else int(args.target)
    records = []
    for name, options in specs:
        options = {**_method_options(args).get(name, {}), **options}
        records.append(engine.run_method(bundle, prepared, name, target, options, steps=args.steps,
                                         reference=args.reference))
    print(f"model {bundle.name}; prediction: " + ", ".join(f"{n} {p:.3f}" for _, n, p in top[:3]))
    for record in records:
        scores = [f"{METRICS[name].phrase} {summary_value(record, name):.4f} ({METRICS[name].better_text})"
                  for name in CURVE_METRICS if summary_value(record, name) is not None]
        print(f"{record['method']} for class {target} ({bundle.class_name(target)}): "
              + ", ".join(scores + [f"{1000 * record['seconds']:.1f} ms"]))
        if record.get("caveat"):
            print(f"note: {record['caveat']}")
    if not one_file:  # the app's download: overlay-<method>.png each, curves.csv, report.json
        paths = engine.write_downloads(out, bundle.name, prepared, records, opacity=args.opacity,
                                       colormap=args.colormap, prediction=top, image_name=Path(args.image).name,
                                       steps=args.steps, reference=args.reference, familiarity=verdict)
        print(f"wrote {', '.join(path.name for path in paths)} to {out}")
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    attribution = map_to_original(records[0]["map"], prepared.geometry)
    if out.suffix.lower() == ".npy":
        np.save(out, attribution)
    else:
        overlay(original, attribution, opacity=args.opacity, colormap=args.colormap,
                region=crop_region(prepared.geometry)).save(out)
    print(f"wrote {out}")
    return 0


def cmd_evaluate(args) -> int:
    import torch

    from .evaluate import evaluate_methods, format_table
    from .methods import split_method_specs

    if args.threads:
        torch.set_num_threads(args.threads)
    bundle, rank = _load_distributed(args.model)
    report = evaluate_methods(bundle, args.data, split_method_specs(args.methods), split=args.split,
                              limit=args.limit, steps=args.steps, reference=args.reference, seed=args.seed,
                              batch_size=args.batch_size, method_options=_method_options(args))
    if rank > 0:  # under torchrun, process 0 prints and writes the whole report
        return 0
    print(format_table(report))
    if args.compare:
        from .statistics import compare_methods, format_comparison

        report["comparisons"] = []
        for pair in args.compare:
            first, _, second = pair.partition(",")
            if not first or not second:
                raise ValueError(f"--compare takes two evaluated methods as A,B; got '{pair}'")
            comparison = compare_methods(report, first, second, seed=args.seed)
            report["comparisons"].append(comparison)
            print(format_comparison(comparison))
    _write_report(report, args.out)
    return 0


def _load_distributed(model_name: str) -> tuple:
    """(bundle, rank): joins torchrun's process group when there is one (`distributed.init_distributed`) and
    loads the model on this process's GPU there (CPU otherwise)."""
    import torch

    from .distributed import init_distributed
    from .models import load_model

    world, rank = init_distributed()
    device = f"cuda:{torch.cuda.current_device()}" if world > 1 and torch.cuda.is_available() else "cpu"
    return load_model(model_name, device=device), rank


def _write_report(report: dict, out) -> None:
    if out:
        from .atomic import atomic_write_text

        atomic_write_text(out, json.dumps(report, indent=2))
        print(f"wrote {out}")


def cmd_gridpg(args) -> int:
    from .gridpg import format_gridpg, run_gridpg
    from .methods import split_method_specs

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.mosaics < 1:
        raise ValueError("--mosaics must be at least 1")
    bundle, rank = _load_distributed(args.model)
    report = run_gridpg(bundle, args.data, split_method_specs(args.methods), n_mosaics=args.mosaics,
                        seed=args.seed, batch_size=args.batch_size, method_options=_method_options(args),
                        split=args.split)
    if rank > 0:  # under torchrun, process 0 prints and writes the whole report
        return 0
    print(format_gridpg(report))
    _write_report(report, args.out)
    return 0


def cmd_train_grid(args) -> int:
    import torch

    from .grid_training import train_grid

    if args.threads:
        torch.set_num_threads(args.threads)
    card = train_grid(base=args.base, name=args.name, data=args.data, val_data=args.val_data, test_data=args.test_data,
                      minutes=args.minutes, max_steps=args.max_steps, batch_size=args.batch_size,
                      single_fraction=args.single_fraction, lr=args.lr, seed=args.seed, out_dir=args.out_dir)
    print(json.dumps({k: card[k] for k in ("name", "steps", "train_seconds", "grid")}, indent=2))
    return 0


def _add_curve_options(parser) -> None:
    from .metrics import REFERENCES

    parser.add_argument("--steps", type=int, default=20, help="K: curve points at 0, 1/K, ..., 1 (default 20)")
    parser.add_argument("--reference", choices=list(REFERENCES), default="mean",
                        help="what removed pixels become: the data mean colour, black, a blur, or ROAD's noisy "
                             "linear imputation")


def cmd_class_dependence(args) -> int:
    import torch

    from .data import item_names, model_batches, open_dataset, split_read
    from .methods import build_methods, parse_method_spec, split_method_specs
    from .metrics import CLASS_BLIND_RHO
    from .models import load_model
    from .sanity import class_dependence

    bundle = load_model(args.model, device=args.device)
    specs = split_method_specs(args.methods)
    methods = build_methods(bundle, specs)
    dataset = open_dataset(args.data, split=args.split, limit=args.limit, require_labels=False)
    images = torch.cat([batch for _, batch in model_batches(dataset, bundle)])  # as the app reads each file
    results = {}
    print(f"class dependence on {args.model}, {len(dataset)} images of {args.data} (Spearman rho between the maps "
          f"for the top two classes; >= {CLASS_BLIND_RHO}: the two maps agree)")
    for label, method in methods:
        row = class_dependence(bundle, method, images, seed=args.seed)
        results[label] = row
        interval = f" [{row['ci95'][0]:.3f}, {row['ci95'][1]:.3f}]" if row["ci95"] else ""
        print(f"  {label:<32} {row['spearman_top1_top2']:.3f}{interval}"
              + ("   the two maps agree" if row["maps_agree"] else ""), flush=True)
    command = " ".join(["python -m explainers"] + sys.argv[1:])
    report = {"model": args.model, "data": str(args.data), "split": split_read(args.data, args.split),
              "images": len(dataset),
              "files": item_names(dataset),
              "what": "per image, Spearman rho between the method's map for the predicted class and for the "
                      "runner-up class; mean with a 95% percentile bootstrap interval over the images",
              "class_blind_rho": CLASS_BLIND_RHO, "ties": "average ranks (as scipy.stats.spearmanr)",
              "command": command, "methods": results}
    _write_report(report, args.out)
    if args.into_card:
        from .aha.store import store_class_dependence

        card_file = store_class_dependence(bundle, [parse_method_spec(spec) for spec in specs], results,
                                           data=str(args.data), images=len(dataset), command=command)
        print(f"stored the AHA rows in {card_file}")
    return 0


def cmd_import_model(args) -> int:
    from .import_model import import_model

    started = time.perf_counter()
    card = import_model(arch=args.arch, name=args.name, weights=args.weights, classes=args.classes,
                        input_size=args.input_size, mean=args.mean, std=args.std, crop_pct=args.crop_pct,
                        interpolation=args.interpolation, model_args=args.model_args,
                        test_image=args.test_image, imported_by=args.by, replace=args.replace)
    print(f"imported '{card['name']}': {card['timm_name']}, {len(card['class_names'])} classes, input "
          f"{card['input_size'][0]}x{card['input_size'][1]} (crop {card['crop_pct']}, {card['interpolation']}), mean {[round(v, 4) for v in card['mean']]}, std "
          f"{[round(v, 4) for v in card['std']]}, sha256 {card['weights_sha256'][:16]}..., "
          f"{time.perf_counter() - started:.1f} s")
    from .models import card_path

    print(f"card: {card_path(card['name'])}")
    print(f"explain it: python -m explainers explain --model {card['name']} --method METHOD --image IMAGE "
          "--out out.png (the methods: python -m explainers explain --help)")
    return 0


def cmd_remove_model(args) -> int:
    from .import_model import remove_imported_model

    removed = remove_imported_model(args.name)
    print(f"removed '{args.name}': " + ", ".join(Path(p).name for p in removed))
    return 0


def cmd_camal(args) -> int:
    from .camal import cli_main

    return cli_main(args)


def cmd_review_report(args) -> int:
    from .review_report import StudyNotFound, write_report, write_rows

    try:
        out = write_report(args.db, args.study, args.out, n_boot=args.bootstrap, seed=args.seed)
        if args.csv:
            write_rows(args.db, args.study, args.csv)
    except StudyNotFound as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote the results of study '{args.study}' to {out}" + (f" and its responses to {args.csv}" if args.csv
                                                                    else ""))
    return 0


def add_train_classifier_parser(commands) -> None:
    parser = commands.add_parser("train-classifier", help="train a bundled classifier (resumable)")
    parser.add_argument("--name", required=True)
    parser.add_argument("--data", required=True, help="train folder with labels.csv")
    parser.add_argument("--val-data", default=None, help="default: the sibling 'val' folder")
    parser.add_argument("--test-data", default=None, help="measured once at the end, on the stored weights")
    parser.add_argument("--preset", choices=["vit", "cnn"], default="cnn")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default="weights")
    parser.set_defaults(handler=cmd_train_classifier)


def add_explain_parser(commands) -> None:
    from .images import COLORMAPS

    parser = commands.add_parser("explain", help="explain one image: overlay PNG, raw .npy map, or a folder with "
                                                  "the app's download (overlays, curves.csv, report.json)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--method", required=True,
                        help=_spec_help("one, or several comma-separated with a folder --out"))
    parser.add_argument("--image", required=True)
    parser.add_argument("--target", type=int, default=None, help="class index (default: the prediction)")
    parser.add_argument("--out", required=True,
                         help="FILE.png (overlay), FILE.npy (map at image size) or a FOLDER: an overlay PNG per "
                              "method at the image's size, curves.csv and report.json, as the app's download")
    parser.add_argument("--opacity", type=float, default=0.5)
    parser.add_argument("--colormap", choices=COLORMAPS, default="cividis", help="colour-blind safe by default")
    _add_curve_options(parser)
    add_method_flags(parser)
    parser.set_defaults(handler=cmd_explain)


def add_evaluate_parser(commands) -> None:
    parser = commands.add_parser("evaluate", help="deletion/insertion of several methods over a data set")
    parser.add_argument("--model", required=True)
    parser.add_argument("--methods", required=True,
                          help=_spec_help())
    parser.add_argument("--data", required=True,
                          help="a folder of images (with labels.csv, file,class_index, for the accuracy; the "
                               "targets are always the predictions), or a MedMNIST-layout .npz")
    parser.add_argument("--split", default="test", help="npz split (or sub-folder)")
    parser.add_argument("--limit", type=int, default=None, help="first N images")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=None, help="JSON report")
    parser.add_argument("--compare", action="append", default=None, metavar="A,B",
                          help="print (and store) the paired bootstrap 95%% interval of A - B on the same images "
                               "for every metric scored per image (repeatable)")
    _add_curve_options(parser)
    add_method_flags(parser)
    parser.set_defaults(handler=cmd_evaluate)


def add_import_model_parser(commands) -> None:
    parser = commands.add_parser("import-model", help="import your own model: a timm architecture + safetensors weights")
    parser.add_argument("--arch", required=True, help="a timm architecture name (e.g. resnet50), or hf-hub:org/name")
    parser.add_argument("--weights", default=None, help="FILE.safetensors: the state dict (not needed for hf-hub:)")
    parser.add_argument("--classes", default=None, help="class names: a text file (one per line) or a CSV")
    parser.add_argument("--name", required=True, help="the model's name in the zoo (letters, digits, . - _)")
    parser.add_argument("--input-size", type=int, nargs=2, metavar=("H", "W"), default=None,
                     help="default: timm's pretrained config for the architecture")
    parser.add_argument("--mean", type=float, nargs=3, default=None, help="normalisation mean, R G B in [0, 1]")
    parser.add_argument("--std", type=float, nargs=3, default=None, help="normalisation std, R G B")
    parser.add_argument("--crop-pct", type=float, default=None, help="centre-crop fraction (1 = none; default: timm's)")
    parser.add_argument("--interpolation", choices=["bicubic", "bilinear", "nearest"], default=None)
    parser.add_argument("--model-args", default=None, metavar="JSON",
                     help='timm keyword arguments of the architecture, e.g. \'{"depth": 6, "embed_dim": 192}\'')
    parser.add_argument("--test-image", default=None, help="an image for the check forward pass (default: a gradient)")
    parser.add_argument("--by", default=None, help="who imports it (default: the login name)")
    parser.add_argument("--replace", action="store_true", help="replace an imported model of the same name")
    parser.set_defaults(handler=cmd_import_model)


def add_remove_model_parser(commands) -> None:
    parser = commands.add_parser("remove-model", help="remove an imported model (and its AHA explainer)")
    parser.add_argument("--name", required=True)
    parser.set_defaults(handler=cmd_remove_model)


def add_gridpg_parser(commands) -> None:
    parser = commands.add_parser("gridpg", help="grid pointing game: 2x2 mosaics of four classes, "
                                                "share of each class's attribution in its quadrant")
    parser.add_argument("--model", required=True)
    parser.add_argument("--methods", required=True, help=_spec_help())
    parser.add_argument("--data", required=True, help="labelled folder (labels.csv) of held-out cells")
    parser.add_argument("--split", default="test", help="sub-folder or npz split")
    parser.add_argument("--mosaics", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0, help="which cells, classes and quadrants")
    parser.add_argument("--batch-size", type=int, default=8, help="mosaics per batch (4 maps each)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=None, help="JSON report")
    add_method_flags(parser)
    parser.set_defaults(handler=cmd_gridpg)


def add_train_grid_parser(commands) -> None:
    parser = commands.add_parser("train-grid", help="fine-tune a ViT at 2x its size on 2x2 mosaics (multi-label) "
                                                  "mixed with single cells; time-budgeted, resumable")
    parser.add_argument("--base", default="bloodmnist-vit")
    parser.add_argument("--name", default="bloodmnist-vit-grid")
    parser.add_argument("--data", required=True, help="train folder with labels.csv")
    parser.add_argument("--val-data", default=None)
    parser.add_argument("--test-data", default=None)
    parser.add_argument("--minutes", type=float, default=30.0, help="training time budget of this and earlier runs")
    parser.add_argument("--max-steps", type=int, default=2000, help="the learning-rate schedule's length")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--single-fraction", type=float, default=0.25, help="share of single cells in a batch")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out-dir", default="weights")
    parser.set_defaults(handler=cmd_train_grid)


def add_camal_parser(commands) -> None:
    parser = commands.add_parser("camal", help="CAMAL: fine-tune a model so its CAM lies inside trusted masks")
    parser.add_argument("--model", required=True, help="model-zoo name, or a card NAME.json")
    parser.add_argument("--data", required=True, help="training images: a folder (a mask set's folder)")
    parser.add_argument("--masks", default=None, help="mask set: masks.csv or its folder (default: --data)")
    parser.add_argument("--eval-data", action="append", default=None,
                       help="mask set evaluated before and after (repeatable; default: the sibling 'val')")
    parser.add_argument("--out", required=True, help="weights/NAME: where the fine-tuned model is written")
    parser.add_argument("--push-to", default=None, metavar="REPO",
                       help="upload the fine-tuned model to this HF model repo when done (HF Jobs runs; needs HF_TOKEN)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lambda", dest="lam", type=float, default=16.0,
                       help="weight of mean_b (beta_b - alpha_b), per image (the paper's sum_b is this / batch size); "
                            "0 = plain fine-tuning")
    parser.add_argument("--lr", type=float, default=None, help="default 3e-4 (explainers.camal.DEFAULT_LR)")
    parser.add_argument("--weight-decay", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=32, help="global batch size (all ranks together)")
    parser.add_argument("--cam-mode", choices=["differentiable", "detach-weights"], default="differentiable")
    parser.add_argument("--freeze-early", type=float, default=0.0, help="fraction of early units frozen (0 = none)")
    parser.add_argument("--no-augment", dest="augment", action="store_false")
    parser.add_argument("--bn-train", action="store_true", help="update BatchNorm statistics (default: keep them)")
    parser.add_argument("--limit", type=int, default=None, help="use the first N training images")
    parser.add_argument("--eval-limit", type=int, default=512)
    parser.add_argument("--curve-limit", type=int, default=128, help="images with deletion/insertion curves")
    parser.add_argument("--device", default=None)
    parser.add_argument("--no-bf16", dest="bf16", action="store_false")
    parser.add_argument("--checkpoint", default=None, help="resume file (default: OUT.camal.ckpt)")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(handler=cmd_camal)


def add_review_report_parser(commands) -> None:
    parser = commands.add_parser("review-report", help="a review study's results (agreement, ratings) as JSON")
    parser.add_argument("--db", required=True, help="the review store's SQLite file (review.sqlite)")
    parser.add_argument("--study", required=True, help="the study's name")
    parser.add_argument("--out", required=True, help="report.json")
    parser.add_argument("--csv", default=None, help="also write the responses as a spreadsheet-safe CSV (as the app)")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the 95%% intervals")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(handler=cmd_review_report)


def add_class_dependence_parser(commands) -> None:
    parser = commands.add_parser("class-dependence", help="how much each method's map changes with the class asked "
                                 "about (Spearman rho of the maps for the top two classes)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--methods", required=True,
                        help=_spec_help())
    parser.add_argument("--data", required=True, help="images (a folder, with or without labels.csv, or an .npz)")
    parser.add_argument("--split", default="val", help="npz split")
    parser.add_argument("--limit", type=int, default=64, help="images spread evenly over the file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the results as JSON")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--into-card", action="store_true",
                        help="store the results of 'aha' (one pass and refinement steps, compared with 'gradcam', "
                             "which --methods must name) in the model's AHA explainer card, where the app reads them "
                             "(its caveat for a class-blind one pass)")
    parser.set_defaults(handler=cmd_class_dependence)


def _registrars() -> tuple:
    """Every command's `add_<command>_parser(commands)`, in the order `--help` lists them."""
    from .agents.cli import add_agent_parsers  # train-agent, evaluate-agent (explainers/agents/)
    from .aha_training.output_blur import add_output_blur_parser
    from .aha_training.cli import add_aha_figures_parser, add_train_aha_parser
    from .decoy import add_decoy_parser
    from .familiarity import add_familiarity_parser
    from .masks import add_bccd_masks_parser
    from .segmentation.cli import add_segmentation_parsers  # train-seg, evaluate-seg

    return (add_train_classifier_parser, add_explain_parser, add_evaluate_parser, add_import_model_parser,
            add_remove_model_parser, add_gridpg_parser, add_train_grid_parser, add_camal_parser,
            add_review_report_parser, add_train_aha_parser, add_aha_figures_parser, add_output_blur_parser,
            add_familiarity_parser, add_class_dependence_parser, add_bccd_masks_parser, add_decoy_parser,
            add_segmentation_parsers, add_agent_parsers)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m explainers", description="Saliency Lab: faithful visual explanations.")
    commands = parser.add_subparsers(dest="command", required=True)
    for register in _registrars():
        register(commands)
    return parser


def main(argv=None) -> int:
    from .aha.store import ExplainerUnavailable
    from .images import ImageError
    from .methods import MethodNotApplicable
    from .models import ModelUnavailableError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except (ModelUnavailableError, MethodNotApplicable, ImageError, FileNotFoundError, KeyError, ValueError,
            ImportError, ExplainerUnavailable) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    finally:
        _end_process_group()


def _end_process_group() -> None:
    """End a torchrun process group a command joined (evaluate, gridpg, ...): a gloo group left alive at
    interpreter exit can abort a rank after its work is done, which torchrun reports as a failure."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
