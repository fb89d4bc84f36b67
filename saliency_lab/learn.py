"""The Learn tab: what the methods and the scores mean, the live sanity check, and the decoy BloodMNIST
demonstration (a model that learned the decoy square, before and after CAMAL).

    for pictures, figure in sanity_run(services, "bloodmnist-cnn", ["gradcam", "random"], stages=4):
        ...   # one more stage each time: [(file, caption)] and a plotly figure spec
    pictures, text = decoy_view(services)        # [(file, caption)] and a Markdown paragraph

Sanity check: the model's layers re-initialised stage by stage from the top (`explainers.sanity`, the one
implementation), each method's map redrawn at every stage, and the rank correlation with the trained model's.

Decoy view: per decoy test image, the image, the "before" model's Grad-CAM and prediction, the "after" (CAMAL)
model's. The models are the decoy cards `decoy_model_cards` finds (e.g. weights/decoy-bloodmnist-cnn.json
and its CAMAL fine-tune weights/decoy-bloodmnist-cnn-camal.json); their numbers come from their cards only.
The test images come from a built decoy test split (`decoy-bloodmnist/test` under `services.decoy_roots`),
else they are made here from the cells shipped in assets/bloodmnist: each gets a square whose colour and
corner never match its class (`decoy_test_images`), so a model that reads the square is misled. Without any
decoy model the shipped cells are shown with their own class's square (the training rule).
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from PIL import Image

from explainers import engine
from explainers.data import class_names_for, open_dataset
from explainers.decoy import CORNERS, PALETTE, add_decoy
from explainers.images import load_image
from explainers.methods import METHODS
from explainers.metrics import spearman
from explainers.sanity import randomization_stages

from . import figures, menus, pictures
from .browse import ASSETS, examples_list
from .errors import is_skippable, user_message
from .services import DEVICE, run_method

# What the scores mean (Markdown: the Learn tab, and anywhere else the scores are explained).
METRICS_TEXT = """
**Deletion** removes the pixels the map calls most important first (they take the data set's mean colour)
and plots the model's probability for the target class. A faithful map makes it fall fast: **lower deletion
AUC is better.**

**Insertion** starts from a blank (mean-colour) image and puts the most important pixels back first: a faithful
map makes the probability rise fast: **higher insertion AUC is better.** *Insertion − deletion* sums both up.

**AUC** is the area under each curve (trapezoid rule over 0-100 % of the pixels, 21 points).
**Pointing game**: does the map's peak fall inside the expert's mask (15 px tolerance)? **IoU**: overlap of
the map's top pixels (as many as the mask has) with the mask.

**Sanity check** (Adebayo et al. 2018): re-initialise the model's layers from the top down. A map that barely
changes did not depend on what the model learned; a faithful method's map must change (its rank correlation
with the original falls well below 1).
"""


def sanity_check_stages(bundle, method: str, prepared, target: int, *, stages: int = 4,
                        layers_per_stage: int | None = None, options: dict | None = None, seed: int = engine.SEED):
    """Cascading randomisation (`explainers.sanity.randomization_stages`): yield (stage name, map, Spearman rho
    with the original map) for the original model and then after re-initialising more and more of its top
    layers. Works on a copy: the shared model is never touched."""
    from explainers.methods import get_method

    original = None
    for name, done, maps in randomization_stages(bundle, get_method(method, **(options or {})), prepared.tensor,
                                                 int(target), seed=seed, stages=stages,
                                                 layers_per_stage=layers_per_stage):
        if name is None:
            original = maps
            yield "original model", engine.as_map(maps), 1.0
        else:
            yield (f"top {done} layers randomised (down to {name})", engine.as_map(maps),
                   float(spearman(original[0], maps[0])))


def default_image(bundle) -> str:
    """The first shipped photo for an ImageNet model, else the first shipped blood cell."""
    cells, photos = examples_list()
    return (photos if bundle.num_classes == 1000 else cells or photos)[0]


def sanity_run(services, model_name, methods, stages=4, image_path=None, *, warn=None):
    """Yields ([(file, caption)], figure) after every stage of every method; a method that cannot explain the
    model is skipped (and `warn(text)` called). `image_path` defaults to `default_image`."""
    methods = list(methods or [])
    if not methods:
        raise ValueError("Pick at least one method.")
    bundle = services.bundle(model_name)
    path = image_path or default_image(bundle)
    prepared = engine.prepare_input(load_image(path), bundle)
    target = engine.predict_top(bundle, prepared, 1)[0][0]
    title = f"Sanity check on {bundle.name}"
    items, curves = [], []
    for method in methods:
        try:
            points = []
            for stage_name, stage_map, rho in sanity_check_stages(bundle, method, prepared, target,
                                                                     stages=int(stages)):
                record = engine.result_record(method, target, {}, stage_map, 0.0, None, bundle)
                items.append((pictures.render_overlays(prepared, [record], 0.6, "cividis")[0][0],
                              f"{engine.method_label(method)} · {stage_name} · ρ={rho:.2f}"))
                points.append((stage_name, rho))
                yield services.pictures(items), figures.sanity_figure(curves + [(engine.method_label(method), points)], title)
            curves.append((engine.method_label(method), points))
        except (ValueError, RuntimeError) as error:
            if not is_skippable(error):
                raise
            if warn is not None:
                warn(f"{engine.method_label(method)} skipped: {user_message(error)}")
    yield services.pictures(items), figures.sanity_figure(curves, title)


CELLS = ASSETS / "bloodmnist"
SHOWN = 192  # px: decoy images are shown enlarged (nearest), like the maps
BUILD_HINT = ("Build it with `python -m explainers decoy-bloodmnist --src ../shared/data/bloodmnist/64 --out "
              "data/decoy-bloodmnist`, train a model on it and fine-tune that model with CAMAL (Masks & fine-tune "
              "tab, or `bench/studies/bench_camal.py decoy`) to see its maps before and after here.")


def decoy_test_split(roots) -> Path | None:
    """The first `decoy-bloodmnist/test` folder (with labels.csv) under the roots, or None."""
    return next((Path(root) / "decoy-bloodmnist" / "test" for root in roots
                 if (Path(root) / "decoy-bloodmnist" / "test" / "labels.csv").exists()), None)


def decoy_test_images(count: int = 4, seed: int = 0, folder=CELLS) -> list:
    """[(PIL image, true class, caption)]: `count` cells of different classes from a labelled folder (default
    the shipped BloodMNIST cells), each with a decoy square drawn at random (seeded) among the colours and
    corners that do NOT belong to its class: the training rule is colour PALETTE[class], corner
    CORNERS[class % 4], so the square always points a shortcut-taking model at a wrong class. The square is
    6 px at 64 px (scaled with the image), 2 px from the corner, as in `explainers.decoy`."""
    dataset = open_dataset(folder)
    names = class_names_for(folder) or []
    first = {}
    for index, label in enumerate(dataset.labels):
        first.setdefault(int(label), index)
    rng = np.random.default_rng(seed)
    classes = sorted(first)
    chosen = sorted(rng.choice(classes, size=min(count, len(classes)), replace=False).tolist())
    out = []
    for label in chosen:
        rgb = np.asarray(dataset.image(first[label]).convert("RGB"))
        scale = min(rgb.shape[:2]) / 64
        colour = int(rng.choice([c for c in range(len(PALETTE)) if c != label % len(PALETTE)]))
        corner = int(rng.choice([c for c in range(len(CORNERS)) if c != label % 4]))
        decoyed, _ = add_decoy(rgb, PALETTE[colour], corner, square=max(2, round(6 * scale)),
                               margin=max(1, round(2 * scale)))
        name = names[label] if label < len(names) else f"class {label}"
        misleads = names[colour] if colour < len(names) else f"class {colour}"
        out.append((Image.fromarray(decoyed), label,
                    f"true: {name} · square: {misleads}'s colour, {CORNERS[corner]} (decoy test image)"))
    return out


SET_NAMES = {"test": "decoy test (random squares)", "test-clean": "clean test (no square)"}
SCORES = (("accuracy", "accuracy"), ("iou", "CAM-mask IoU"), ("pointing_game", "pointing game"))


def _number(key: str, value) -> str:
    return f"{value:.1%}" if "accuracy" in key or key == "pointing_game" else f"{value:.3f}"


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _set_line(set_name: str, after: dict, before: dict | None = None) -> str | None:
    """"decoy test (random squares), 800 images: accuracy 38.5% → 82.2%, ..." (before -> after when given)."""
    parts = []
    for key, label in SCORES:
        a, b = (after or {}).get(key), (before or {}).get(key)
        if _is_number(a):
            parts.append(f"{label} {_number(key, b)} → {_number(key, a)}" if _is_number(b)
                         else f"{label} {_number(key, a)}")
    if not parts:
        return None
    count = (after or {}).get("count")
    return f"{SET_NAMES.get(set_name, set_name)}{f', {count} images' if _is_number(count) else ''}: " + ", ".join(parts)


def card_numbers(card: dict) -> list:
    """Short "what it scored" lines from a model card, only from what the card records: a `decoy` record's
    evaluation per test set (`decoy.test`), a CAMAL fine-tune's before -> after per evaluated set (`camal`),
    and the plain test / best validation accuracy (`data`)."""
    lines = []
    decoy = card.get("decoy") if isinstance(card.get("decoy"), dict) else {}
    for set_name, scores in (decoy.get("test") or {}).items():
        if isinstance(scores, dict):
            lines.append(_set_line(set_name, scores))
    camal = card.get("camal") if isinstance(card.get("camal"), dict) else {}
    before = camal.get("before") or {}
    for set_name, scores in (camal.get("after") or {}).items():
        if isinstance(scores, dict):
            lines.append(_set_line(set_name, scores, before.get(set_name)))
    data = card.get("data") if isinstance(card.get("data"), dict) else {}
    if _is_number(data.get("test_accuracy")):
        where = f" on {data['test']}" if data.get("test") else ""
        lines.append(f"test accuracy {data['test_accuracy']:.1%}{where}")
    if _is_number(data.get("val_accuracy_best")):
        lines.append(f"best validation accuracy {data['val_accuracy_best']:.1%}")
    return [line for line in lines if line]


def card_headline(card: dict) -> str | None:
    """The one number for a caption: accuracy on the decoy test set (random squares), else any test accuracy."""
    decoy = (card.get("decoy") or {}).get("test") or {} if isinstance(card.get("decoy"), dict) else {}
    camal = (card.get("camal") or {}).get("after") or {} if isinstance(card.get("camal"), dict) else {}
    for scores in (decoy.get("test"), camal.get("test")):
        if isinstance(scores, dict) and _is_number(scores.get("accuracy")):
            return f"decoy test acc. {scores['accuracy']:.0%}"
    data = card.get("data") if isinstance(card.get("data"), dict) else {}
    if _is_number(data.get("test_accuracy")):
        return f"test acc. {data['test_accuracy']:.0%}"
    return None


def _read_card(path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def _load(services, card: Path):
    from explainers.camal import load_bundle

    key = ("decoy", str(card), card.stat().st_mtime_ns)  # a re-trained model is loaded again
    return services.cached(key, lambda: load_bundle(str(card), device=DEVICE))


def training_rule_examples(services) -> tuple:
    """The fallback without decoy models: the shipped cells with their own class's square (the training rule)."""
    items = []
    cells, _ = examples_list()
    for index, path in enumerate(cells[:8]):
        rgb = np.asarray(load_image(path))
        decoyed, _ = add_decoy(rgb, PALETTE[index % len(PALETTE)], index % 4)
        items.append((Image.fromarray(decoyed).resize((SHOWN, SHOWN), Image.NEAREST),
                      f"class {index}: its square, {CORNERS[index % 4]}"))
    return services.pictures(items, "png"), (
        "The decoy data set is not built here yet: these are the shipped cells with their class's square "
        "added (the training rule). " + BUILD_HINT)


def decoy_view(services, count: int = 4, seed: int = 0) -> tuple:
    """([(file, caption)], Markdown): decoy test images with the before/after models' Grad-CAM and predictions."""
    roots = services.decoy_roots
    split = decoy_test_split(roots)
    before, after = decoy_model_cards([services.weights_dir] + [Path(root) / "weights" for root in roots])
    if split is None and before is None and after is None:
        return training_rule_examples(services)
    if split is not None:
        dataset = open_dataset(split)
        names = class_names_for(split) or []
        images = []
        for index in range(min(count, len(dataset))):
            label = int(dataset.labels[index])
            name = names[label] if label < len(names) else f"class {label}"
            images.append((dataset.image(index), label, f"true: {name} (decoy test image {index})"))
        source = (f"Decoy test split ({split}): the squares are random here, so a model that learned the shortcut "
                  "is misled.")
    else:
        images = decoy_test_images(count, seed)
        source = ("Decoy test images made here from the shipped cells: each carries a square whose colour and "
                  "corner belong to another class, so a model that learned the shortcut is misled.")
    models = []
    for tag, card in (("before", before), ("after CAMAL", after)):
        if card is not None:
            record = _read_card(card)
            models.append((tag, card, _load(services, card), card_numbers(record), card_headline(record)))
    items, right = [], {tag: 0 for tag, *_ in models}
    for picture, label, caption in images:
        items.append((picture.resize((SHOWN, SHOWN), Image.NEAREST), caption))
        for tag, card, bundle, numbers, headline in models:
            prepared = engine.prepare_input(picture, bundle)
            target, name, probability = engine.predict_top(bundle, prepared, 1)[0]
            record = run_method(bundle, prepared, "gradcam", target, {}, services.cache, curves=False)
            right[tag] += int(target == label)
            items.append((pictures.render_overlays(prepared, [record], 0.6, "cividis")[0][0],
                          f"{'✓' if target == label else '✗'} {tag}: {name} {probability:.0%}"))
    lines = [source]
    if not models:
        lines.append("No decoy-trained model found yet. " + BUILD_HINT)
    for tag, card, _, numbers, headline in models:
        scored = f". Its card: {'; '.join(numbers)}" if numbers else ". Its card records no test numbers"
        lines.append(f"{tag[:1].upper() + tag[1:]}{f' ({headline})' if headline else ''}: **{card.stem}**, "
                     f"Grad-CAM of its predicted class (✓ right, ✗ wrong); right on {right[tag]} of these "
                     f"{len(images)} images{scored}.")
    if models and after is None:
        lines.append("No CAMAL fine-tune of it found yet.")
    if models and before is None:
        lines.append("No decoy-trained model found (only its CAMAL fine-tune).")
    return services.pictures(items, "png"), "\n\n".join(lines)


def decoy_model_cards(folders) -> tuple:
    """(before, after) model cards among `*decoy*.json` in the folders (earlier folders first): a classifier
    trained on decoy BloodMNIST and a CAMAL fine-tune (a card with a 'camal' record); None where missing.
    A fine-tune whose `camal.base_model` (a name or a card path) is one of the decoy classifiers is paired
    with it (e.g. decoy-bloodmnist-cnn and decoy-bloodmnist-cnn-camal)."""
    from explainers.models import cards

    befores, afters = [], []
    for folder in folders:
        for card in cards("classifier", folders=[folder], pattern="*decoy*.json"):
            (afters if card.data.get("camal") else befores).append((card.path, card.data))
    for after_file, card in afters:
        base = str((card.get("camal") or {}).get("base_model") or card.get("base_model") or "")
        base_name = Path(base).stem if base.endswith(".json") else Path(base).name
        pair = next((before_file for before_file, _ in befores if before_file.stem == base_name), None)
        if pair is not None:
            return pair, after_file
    return (befores[0][0] if befores else None), (afters[0][0] if afters else None)


# ------------------------------------------------------------------------------------------------ GridPG
# "Why this class and not that one": a 2 x 2 mosaic of four shipped cells of four classes, each class explained
# on the mosaic; a map scores the share of its positive attribution inside its class's quadrant (chance 0.25).
# The computation is the library's (`explainers.gridpg`, the `gridpg` command): the mosaic of seed S is the
# first mosaic `python -m explainers gridpg --data assets/bloodmnist --seed S` scores.
GRID_MODELS = ("bloodmnist-cnn", "bloodmnist-vit-grid")
GRID_DEFAULT_METHODS = {"bloodmnist-cnn": ("gradcam", "random"),
                        "bloodmnist-vit-grid": ("aha", "gradcam", "chefer", "occlusion", "random")}
GRID_SHOWN = 256  # px: the mosaic and its maps are shown enlarged


def grid_method_choices() -> list:
    """(label, name) of the methods the GridPG view offers: the quick ones, and the slow ones that are quick on a
    mosaic on a CPU (occlusion's 226 passes; not RISE's thousands)."""
    mosaic = SimpleNamespace(input_size=(128, 128), device=torch.device("cpu"))
    return [(engine.method_label(n), n) for n in menus.method_order(list(METHODS))
            if not METHODS[n].slow or METHODS[n].quick_on(mosaic)]


def _grid_model(services, model_name):
    """(the bundle, the bundle that takes mosaics, cell size): built once per model (a ViT's copy with
    interpolated position embeddings is made once, not per click)."""
    from explainers.gridpg import mosaic_model

    bundle = services.bundle(model_name)
    mosaic_bundle, cell_size = services.cached(("gridpg-model", model_name, id(bundle.network)),
                                               lambda: mosaic_model(bundle))
    return bundle, mosaic_bundle, cell_size


def grid_default_methods(model_name) -> list:
    """The methods ticked for a model (a ViT gets the ViT methods too)."""
    return list(GRID_DEFAULT_METHODS.get(model_name, ("gradcam", "random")))


def grid_mosaic(services, model_name, seed=0, methods=("gradcam", "random"), folder=None) -> dict:
    """The mosaic of `seed` (from the shipped cells, or a labelled `folder`), each method's maps of its four
    classes with their GridPG scores, and the model's quadrant sensitivity on it. The maps are cached per
    (model, mosaic, method), so asking again, or adding a method, computes only what is new. A plain dict
    (a session's state): `grid_view` draws it for any displayed class without a model pass."""
    from explainers.data import item_names
    from explainers.evaluate import build_methods
    from explainers.gridpg import QUADRANTS, build_mosaics, explain_mosaics, plan_mosaics, quadrant_sensitivity

    methods = list(methods or [])
    if not methods:
        raise ValueError("Pick at least one method.")
    seed = int(seed or 0)
    folder = Path(folder or CELLS)
    dataset = open_dataset(str(folder))
    bundle, mosaic_bundle, cell_size = _grid_model(services, model_name)
    plan = plan_mosaics(dataset.labels, 1, seed)
    cells, classes = plan[0]
    mosaics, class_tensor = build_mosaics(dataset, plan, cell_size, bundle)
    names = item_names(dataset)
    base_key = ("gridpg", bundle.name, id(bundle.network), str(folder), [names[i] for i in cells], classes)
    key = engine.ExplanationCache.key(*base_key, "sensitivity")
    sensitivity = services.cache.get(key)
    if sensitivity is None:
        with mosaic_bundle.lock:
            sensitivity = quadrant_sensitivity(mosaic_bundle, mosaics, class_tensor)[0].tolist()
        services.cache.put(key, sensitivity)
    maps, scores, skipped = {}, {}, {}
    for method in methods:
        key = engine.ExplanationCache.key(*base_key, method)
        found = services.cache.get(key)
        if found is None and DEVICE == "cpu" and method in METHODS and not METHODS[method].quick_on(mosaic_bundle):
            note = METHODS[method].menu_note(mosaic_bundle)
            skipped[method] = (f"too slow for this view on a CPU{f' ({note})' if note else ''}; the `gridpg` command "
                               "scores it.")
            continue
        if found is None:
            try:
                (_, method_obj), = build_methods(mosaic_bundle, [method],
                                                 {method: engine.method_options(method, bundle=mosaic_bundle)})
                with mosaic_bundle.lock:
                    method_maps, method_scores, _ = explain_mosaics(mosaic_bundle, mosaics, class_tensor, method_obj)
            except (ValueError, RuntimeError) as error:
                if not is_skippable(error):
                    raise
                skipped[method] = user_message(error)
                continue
            found = services.cache.put(key, (method_maps[0].float().cpu().numpy(), method_scores[0].tolist()))
        maps[method], scores[method] = found
    picture = Image.fromarray((mosaics[0].permute(1, 2, 0).clamp(0, 1).cpu().numpy() * 255).round().astype(np.uint8))
    class_names = [bundle.class_name(c) for c in classes]
    return {"model": bundle.name, "seed": seed, "files": [names[i] for i in cells], "classes": list(classes),
            "class_names": class_names, "quadrants": list(QUADRANTS), "picture": picture,
            "mosaic_size": list(picture.size[::-1]), "methods": [m for m in methods if m in maps], "maps": maps,
            "scores": scores, "sensitivity": sensitivity, "skipped": skipped}


def grid_class_choices(result) -> list:
    """The displayed-class menu: all four, or one class (its quadrant index)."""
    if not result:
        return [("All four classes", "all")]
    return [("All four classes", "all")] + [(f"{name} ({where})", str(q)) for q, (name, where) in
                                            enumerate(zip(result["class_names"], result["quadrants"]))]


def _shown(picture: Image.Image) -> Image.Image:
    return picture.resize((GRID_SHOWN, GRID_SHOWN), Image.NEAREST)


def _outline(picture: Image.Image, quadrant: int) -> Image.Image:
    """The picture with the quadrant's border drawn (Okabe-Ito orange), so the target is visible on the map."""
    from PIL import ImageDraw

    picture = picture.copy()
    w, h = picture.size
    left, top = (quadrant % 2) * w // 2, (quadrant // 2) * h // 2
    ImageDraw.Draw(picture).rectangle([left + 1, top + 1, left + w // 2 - 2, top + h // 2 - 2],
                                      outline=(230, 159, 0), width=3)
    return picture


def grid_view(services, result, shown="all", opacity=0.6, colormap="cividis") -> tuple:
    """([(file, caption)], Markdown) of a `grid_mosaic` result: the mosaic, then each method's map of the
    displayed class(es) with its score, and the table of every map's score, the means and the model's quadrant
    sensitivity. No model pass: only drawing."""
    from explainers.gridpg import CHANCE
    from explainers.images import overlay

    if not result:
        raise ValueError("Make a mosaic first.")
    quadrants = range(4) if shown in (None, "", "all") else [int(shown)]
    base = _shown(result["picture"])
    items = [(base, "mosaic: " + " · ".join(f"{w}: {n}" for w, n in zip(result["quadrants"], result["class_names"])))]
    for q in quadrants:
        for method in result["methods"]:
            array = np.asarray(Image.fromarray(result["maps"][method][q].astype(np.float32)).resize(
                (GRID_SHOWN, GRID_SHOWN), Image.BILINEAR), dtype=np.float32)
            why = f"why {result['class_names'][q]} ({result['quadrants'][q]})"
            items.append((_outline(overlay(base, array, opacity=float(opacity), colormap=colormap), q),
                          f"{engine.method_label(method)} · {why} · GridPG {result['scores'][method][q]:.2f}"))
    header = [f"{n} ({w})" for n, w in zip(result["class_names"], result["quadrants"])]
    lines = [f"**{result['model']}**, mosaic of seed {result['seed']} ({result['mosaic_size'][0]} × "
             f"{result['mosaic_size'][1]} px; cells {', '.join(result['files'])}). Each score is the share of the "
             f"map's positive attribution inside its class's quadrant (outlined): 1 = all of it, chance "
             f"{CHANCE:.2f}.", "",
             "| | " + " | ".join(header) + " | mean |", "|---|" + "---|" * 5]
    for method in result["methods"]:
        values = result["scores"][method]
        lines.append(f"| {engine.method_label(method)} | " + " | ".join(f"{v:.2f}" for v in values) +
                     f" | **{float(np.mean(values)):.2f}** |")
    sensitivity = result["sensitivity"]
    lines.append("| *model's quadrant sensitivity* | " + " | ".join(f"{v:+.2f}" for v in sensitivity) +
                 f" | **{float(np.mean(sensitivity)):+.2f}** |")
    lines += ["", "*Quadrant sensitivity*: the drop of the class's probability when its own quadrant is painted the "
              "reference colour, minus the mean drop when another quadrant is. Near 0 the model does not read the "
              "class where it is, and no method can point there: judge the methods only where the model does."]
    for method, message in result["skipped"].items():
        lines.append(f"\nSkipped {engine.method_label(method)}: {message}")
    return services.pictures(items, "png"), "\n".join(lines)
