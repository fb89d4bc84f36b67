"""Command line: `python -m explainers <command>`. The app calls the same library functions."""
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


def _method_options(args) -> dict:
    options = {}
    if getattr(args, "refine_steps", None) is not None:
        options["aha"] = {"refine_steps": args.refine_steps}
    if getattr(args, "alpha", None) is not None:
        options["gradskip"] = {"alpha": args.alpha}
    if getattr(args, "rise_masks", None) is not None:
        options["rise"] = {"n_masks": args.rise_masks}
    return options


def cmd_explain(args) -> int:
    import numpy as np

    from . import engine
    from .evaluate import parse_method_spec, split_method_specs
    from .images import conversion_notes, crop_region, file_facts, load_image, map_to_original, overlay
    from .models import load_model

    specs = [parse_method_spec(spec)[:2] for spec in split_method_specs(args.method)]
    if not specs:
        raise ValueError("--method names no method (e.g. --method gradcam or --method gradcam,aha)")
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
        print(f"{record['method']} for class {target} ({bundle.class_name(target)}): "
              f"deletion AUC {record['deletion_auc']:.4f} (lower is better), insertion AUC "
              f"{record['insertion_auc']:.4f} (higher is better), {1000 * record['seconds']:.1f} ms")
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
    from .evaluate import evaluate_methods, format_table, split_method_specs

    import torch

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
    """(bundle, rank): joins torchrun's process group when there is one (`evaluate.init_distributed`) and
    loads the model on this process's GPU there (CPU otherwise)."""
    import torch

    from .evaluate import init_distributed
    from .models import load_model

    world, rank = init_distributed()
    device = f"cuda:{torch.cuda.current_device()}" if world > 1 and torch.cuda.is_available() else "cpu"
    return load_model(model_name, device=device), rank


def _write_report(report: dict, out) -> None:
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=2))
        print(f"wrote {out}")


def cmd_gridpg(args) -> int:
    from .evaluate import split_method_specs
    from .gridpg import format_gridpg, run_gridpg

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


def _add_method_options(parser) -> None:
    parser.add_argument("--steps", type=int, default=20, help="K: curve points at 0, 1/K, ..., 1 (default 20)")
    parser.add_argument("--reference", choices=["mean", "black", "blur", "road"], default="mean",
                        help="what removed pixels become: the data mean colour, black, a blur, or ROAD's noisy "
                             "linear imputation (needs pip install grad-cam)")
    parser.add_argument("--refine-steps", type=int, default=None, help="AHA test-time refinement steps T")
    parser.add_argument("--alpha", type=float, default=None, help="GradSkip head-weight alpha")
    parser.add_argument("--rise-masks", type=int, default=None, help="RISE: number of masks (default 4000)")


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
    print(f"explain it: python -m explainers explain --model {card['name']} --method gradcam --image IMAGE --out out.png")
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


def build_parser() -> argparse.ArgumentParser:
    from .images import COLORMAPS

    parser = argparse.ArgumentParser(prog="python -m explainers", description="Saliency Lab: faithful visual explanations.")
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train-classifier", help="train a bundled classifier (resumable)")
    train.add_argument("--name", required=True)
    train.add_argument("--data", required=True, help="train folder with labels.csv")
    train.add_argument("--val-data", default=None, help="default: the sibling 'val' folder")
    train.add_argument("--test-data", default=None, help="measured once at the end, on the stored weights")
    train.add_argument("--preset", choices=["vit", "cnn"], default="cnn")
    train.add_argument("--epochs", type=int, default=20)
    train.add_argument("--batch-size", type=int, default=128)
    train.add_argument("--lr", type=float, default=2e-3)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--out-dir", default="weights")
    train.set_defaults(handler=cmd_train_classifier)

    explain = commands.add_parser("explain", help="explain one image: overlay PNG, raw .npy map, or a folder with "
                                                  "the app's download (overlays, curves.csv, report.json)")
    explain.add_argument("--model", required=True)
    explain.add_argument("--method", required=True,
                         help="e.g. gradcam, rise, chefer, gradskip, aha; several comma-separated with a folder --out; "
                              "options as name:key=value (e.g. aha:refine_steps=3)")
    explain.add_argument("--image", required=True)
    explain.add_argument("--target", type=int, default=None, help="class index (default: the prediction)")
    explain.add_argument("--out", required=True,
                         help="FILE.png (overlay), FILE.npy (map at image size) or a FOLDER: an overlay PNG per "
                              "method at the image's size, curves.csv and report.json, as the app's download")
    explain.add_argument("--opacity", type=float, default=0.5)
    explain.add_argument("--colormap", choices=COLORMAPS, default="cividis", help="colour-blind safe by default")
    _add_method_options(explain)
    explain.set_defaults(handler=cmd_explain)

    evaluate = commands.add_parser("evaluate", help="deletion/insertion of several methods over a data set")
    evaluate.add_argument("--model", required=True)
    evaluate.add_argument("--methods", required=True,
                          help="comma-separated; options per method as name:key=value (e.g. aha:refine_steps=3)")
    evaluate.add_argument("--data", required=True,
                          help="a folder of images (with labels.csv, file,class_index, for the accuracy; the "
                               "targets are always the predictions), or a MedMNIST-layout .npz")
    evaluate.add_argument("--split", default="test", help="npz split (or sub-folder)")
    evaluate.add_argument("--limit", type=int, default=None, help="first N images")
    evaluate.add_argument("--seed", type=int, default=0)
    evaluate.add_argument("--batch-size", type=int, default=16)
    evaluate.add_argument("--threads", type=int, default=None)
    evaluate.add_argument("--out", default=None, help="JSON report")
    evaluate.add_argument("--compare", action="append", default=None, metavar="A,B",
                          help="print (and store) the paired bootstrap 95%% interval of A - B on the same images "
                               "for deletion, insertion and ins-del (repeatable)")
    _add_method_options(evaluate)
    evaluate.set_defaults(handler=cmd_evaluate)

    imp = commands.add_parser("import-model", help="import your own model: a timm architecture + safetensors weights")
    imp.add_argument("--arch", required=True, help="a timm architecture name (e.g. resnet50), or hf-hub:org/name")
    imp.add_argument("--weights", default=None, help="FILE.safetensors: the state dict (not needed for hf-hub:)")
    imp.add_argument("--classes", default=None, help="class names: a text file (one per line) or a CSV")
    imp.add_argument("--name", required=True, help="the model's name in the zoo (letters, digits, . - _)")
    imp.add_argument("--input-size", type=int, nargs=2, metavar=("H", "W"), default=None,
                     help="default: timm's pretrained config for the architecture")
    imp.add_argument("--mean", type=float, nargs=3, default=None, help="normalisation mean, R G B in [0, 1]")
    imp.add_argument("--std", type=float, nargs=3, default=None, help="normalisation std, R G B")
    imp.add_argument("--crop-pct", type=float, default=None, help="centre-crop fraction (1 = none; default: timm's)")
    imp.add_argument("--interpolation", choices=["bicubic", "bilinear", "nearest"], default=None)
    imp.add_argument("--model-args", default=None, metavar="JSON",
                     help='timm keyword arguments of the architecture, e.g. \'{"depth": 6, "embed_dim": 192}\'')
    imp.add_argument("--test-image", default=None, help="an image for the check forward pass (default: a gradient)")
    imp.add_argument("--by", default=None, help="who imports it (default: the login name)")
    imp.add_argument("--replace", action="store_true", help="replace an imported model of the same name")
    imp.set_defaults(handler=cmd_import_model)

    rm = commands.add_parser("remove-model", help="remove an imported model (and its AHA explainer)")
    rm.add_argument("--name", required=True)
    rm.set_defaults(handler=cmd_remove_model)

    gridpg = commands.add_parser("gridpg", help="grid pointing game: 2x2 mosaics of four classes, "
                                                "share of each class's attribution in its quadrant")
    gridpg.add_argument("--model", required=True)
    gridpg.add_argument("--methods", required=True, help="comma-separated, options as name:key=value")
    gridpg.add_argument("--data", required=True, help="labelled folder (labels.csv) of held-out cells")
    gridpg.add_argument("--split", default="test", help="sub-folder or npz split")
    gridpg.add_argument("--mosaics", type=int, default=200)
    gridpg.add_argument("--seed", type=int, default=0, help="which cells, classes and quadrants")
    gridpg.add_argument("--batch-size", type=int, default=8, help="mosaics per batch (4 maps each)")
    gridpg.add_argument("--threads", type=int, default=None)
    gridpg.add_argument("--out", default=None, help="JSON report")
    gridpg.add_argument("--refine-steps", type=int, default=None, help="AHA test-time refinement steps T")
    gridpg.add_argument("--alpha", type=float, default=None, help="GradSkip head-weight alpha")
    gridpg.add_argument("--rise-masks", type=int, default=None, help="RISE: number of masks (default 4000)")
    gridpg.set_defaults(handler=cmd_gridpg)

    grid = commands.add_parser("train-grid", help="fine-tune a ViT at 2x its size on 2x2 mosaics (multi-label) "
                                                  "mixed with single cells; time-budgeted, resumable")
    grid.add_argument("--base", default="bloodmnist-vit")
    grid.add_argument("--name", default="bloodmnist-vit-grid")
    grid.add_argument("--data", required=True, help="train folder with labels.csv")
    grid.add_argument("--val-data", default=None)
    grid.add_argument("--test-data", default=None)
    grid.add_argument("--minutes", type=float, default=30.0, help="training time budget of this and earlier runs")
    grid.add_argument("--max-steps", type=int, default=2000, help="the learning-rate schedule's length")
    grid.add_argument("--batch-size", type=int, default=32)
    grid.add_argument("--single-fraction", type=float, default=0.25, help="share of single cells in a batch")
    grid.add_argument("--lr", type=float, default=3e-4)
    grid.add_argument("--seed", type=int, default=0)
    grid.add_argument("--threads", type=int, default=None)
    grid.add_argument("--out-dir", default="weights")
    grid.set_defaults(handler=cmd_train_grid)

    camal = commands.add_parser("camal", help="CAMAL: fine-tune a model so its CAM lies inside trusted masks")
    camal.add_argument("--model", required=True, help="model-zoo name, or a card NAME.json")
    camal.add_argument("--data", required=True, help="training images: a folder (a mask set's folder)")
    camal.add_argument("--masks", default=None, help="mask set: masks.csv or its folder (default: --data)")
    camal.add_argument("--eval-data", action="append", default=None,
                       help="mask set evaluated before and after (repeatable; default: the sibling 'val')")
    camal.add_argument("--out", required=True, help="weights/NAME: where the fine-tuned model is written")
    camal.add_argument("--push-to", default=None, metavar="REPO",
                       help="upload the fine-tuned model to this HF model repo when done (HF Jobs runs; needs HF_TOKEN)")
    camal.add_argument("--epochs", type=int, default=3)
    camal.add_argument("--lambda", dest="lam", type=float, default=16.0,
                       help="weight of mean_b (beta_b - alpha_b), per image (the paper's sum_b is this / batch size); "
                            "0 = plain fine-tuning")
    camal.add_argument("--lr", type=float, default=None, help="default 3e-4 (explainers.camal.DEFAULT_LR)")
    camal.add_argument("--weight-decay", type=float, default=0.05)
    camal.add_argument("--batch-size", type=int, default=32, help="global batch size (all ranks together)")
    camal.add_argument("--cam-mode", choices=["differentiable", "detach-weights"], default="differentiable")
    camal.add_argument("--freeze-early", type=float, default=0.0, help="fraction of early units frozen (0 = none)")
    camal.add_argument("--no-augment", dest="augment", action="store_false")
    camal.add_argument("--bn-train", action="store_true", help="update BatchNorm statistics (default: keep them)")
    camal.add_argument("--limit", type=int, default=None, help="use the first N training images")
    camal.add_argument("--eval-limit", type=int, default=512)
    camal.add_argument("--curve-limit", type=int, default=128, help="images with deletion/insertion curves")
    camal.add_argument("--device", default=None)
    camal.add_argument("--no-bf16", dest="bf16", action="store_false")
    camal.add_argument("--checkpoint", default=None, help="resume file (default: OUT.camal.ckpt)")
    camal.add_argument("--seed", type=int, default=0)
    camal.set_defaults(handler=cmd_camal)

    report = commands.add_parser("review-report", help="a review study's results (agreement, ratings) as JSON")
    report.add_argument("--db", required=True, help="the review store's SQLite file (review.sqlite)")
    report.add_argument("--study", required=True, help="the study's name")
    report.add_argument("--out", required=True, help="report.json")
    report.add_argument("--csv", default=None, help="also write the responses as a spreadsheet-safe CSV (as the app)")
    report.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the 95%% intervals")
    report.add_argument("--seed", type=int, default=0)
    report.set_defaults(handler=cmd_review_report)

    from .aha.output_blur import add_output_blur_parser  # AHA explainers (explainers/aha/)
    from .aha.train import add_aha_figures_parser, add_train_aha_parser

    add_train_aha_parser(commands)
    add_aha_figures_parser(commands)
    add_output_blur_parser(commands)
    from .familiarity import add_familiarity_parser  # the unfamiliar-image warning's statistics

    add_familiarity_parser(commands)
    from .sanity import add_class_dependence_parser  # does a method's map change with the class asked about?

    add_class_dependence_parser(commands)
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
