"""The segmentation view's service layer (no Gradio): a segmentation model's prediction as an overlay with a
legend, the region to explain (a class, a clicked piece, a drawn region), each method's map with its IoU and PA
against the predicted region (and the ground truth where the example has one), and the region score's deletion
and insertion curves.

    view = SegmentationView(bundle)
    shown = view.predict(image)                  # overlay, legend, notes
    region = view.region(shown, class_name="WBC")   # or click=(x, y), or drawing=array
    results = view.explain(shown, region, ["gradskip", "seggradcam"])
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from explainers.engine import explain_batch
from explainers.images import ImageError, colorize, load_image
from explainers.segmentation.methods import SEGMENTATION_METHODS, get_segmentation_method, list_segmentation_methods
from explainers.segmentation.model import (BUNDLED_SEGMENTATION_MODELS, HUB_SEGMENTATION_MODELS, class_colours,
                                           is_segmentation)
from explainers.segmentation.familiarity import forward_and_check
from explainers.segmentation.scoring import binarise_top, pa_iou, region_curves
from explainers.segmentation.targets import RegionError, RegionTarget, clicked_region, drawn_region, predicted_region

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "explainers" / "segmentation" / "examples"
LARGE_PHOTO_FACTOR = 4  # a photo over 4x the model's side is reduced with a note (detail is lost)
DEFAULT_METHODS = ("gradskip", "seggradcam", "gradrollout", "rollout")
# the methods from cheapest to dearest on a CPU (bccd-segformer, one 320 x 240 smear, one thread: Seg-Grad-CAM and
# attention rollout ~0.13 s, gradient rollout ~0.28 s, GradSkip ~0.32 s; occlusion, RISE and AHA many seconds)
COST_ORDER = ("random", "seggradcam", "rollout", "gradrollout", "gradskip", "occlusion", "rise", "aha")
REGION_WORDS = {"predicted": "predicted region", "clicked": "clicked region", "drawn": "drawn region"}


def segmentation_models() -> list:
    """The segmentation models to offer: the bundled ones whose card is present, the user's segmentation cards,
    then the default hub names."""
    from explainers.models import model_cards, model_dirs

    names = []
    for folder in model_dirs():
        for name, card in model_cards(folder):
            if card.get("kind") == "segmentation" and name not in names:
                names.append(name)
    bundled = [n for n in BUNDLED_SEGMENTATION_MODELS if n in names]
    return bundled + [n for n in names if n not in bundled] + list(HUB_SEGMENTATION_MODELS)


def is_segmentation_model(name, known=()) -> bool:
    """Whether a model name is a segmentation model, without loading it: one of `known` (the names offered as
    such), a bundled or default hub segmentation model, a hub SegFormer name (`owner/...segformer...`, as the
    model zoo reads it), or a model whose card says `"kind": "segmentation"`."""
    if not name:
        return False
    name = str(name)
    if name in known or name in BUNDLED_SEGMENTATION_MODELS or name in HUB_SEGMENTATION_MODELS:
        return True
    if "segformer" in name.lower() and "/" in name:
        return True
    from explainers.models import card_path

    try:
        return json.loads(card_path(name).read_text()).get("kind") == "segmentation"
    except (OSError, ValueError, AttributeError):
        return False


def model_label(name: str) -> str:
    """A segmentation model's label in a model menu beside classifiers: it says that the model segments."""
    if name in BUNDLED_SEGMENTATION_MODELS:
        where = "bundled"
    elif "/" in name:
        where = "hub, downloads on first use"
    else:
        where = "yours"
    return f"{name} · segmentation ({where})"


def model_choices(names) -> list:
    """[(label, name)] of segmentation models for a model menu."""
    return [(model_label(n), n) for n in names]


def examples() -> list:
    """[(image path, mask path or None)] of the shipped example smears."""
    found = []
    for image in sorted(EXAMPLES_DIR.glob("*.jpg")):
        mask = image.with_name(image.stem + ".mask.png")
        found.append((str(image), str(mask) if mask.exists() else None))
    return found


def example_mask(image_path) -> np.ndarray | None:
    """The derived mask of a shipped example (by its file name), else None."""
    name = Path(str(image_path)).stem
    mask = EXAMPLES_DIR / f"{name}.mask.png"
    return np.asarray(Image.open(mask)) if mask.exists() and (EXAMPLES_DIR / f"{name}.jpg").exists() else None


@dataclass
class Shown:
    """One image as the model sees it, and its prediction."""
    image: torch.Tensor  # 1 x 3 x H x W in [0, 1], at the model's input size
    prediction: torch.Tensor  # H x W class indices
    rgb: np.ndarray  # H x W x 3 uint8 (the model's input)
    overlay: np.ndarray  # the prediction over the image
    legend: list  # [(class name, "#rrggbb", share of pixels)]
    notes: list = field(default_factory=list)
    truth: np.ndarray | None = None  # H x W class indices (255 ignored), where the example has a mask
    familiarity: dict | None = None  # the unfamiliar-photo check's verdict (None: the model has no statistics)


def hex_colour(colour) -> str:
    return "#" + "".join(f"{int(v):02x}" for v in colour)


class SegmentationView:
    def __init__(self, bundle):
        if not is_segmentation(bundle):
            raise ValueError(f"'{bundle.name}' is a classifier: the segmentation view needs a segmentation model.")
        self.bundle = bundle
        self.colours = class_colours(bundle)

    # --- the prediction ------------------------------------------------------------------------
    def prepare(self, source) -> tuple:
        """(1 x 3 x H x W tensor at the model's size, notes). The whole photo is resized (no crop: every pixel
        is segmented); a very large photo is reduced with a note; one over the loader's limit is refused."""
        picture = load_image(source)
        height, width = self.bundle.input_size
        notes = []
        if picture.width > LARGE_PHOTO_FACTOR * width or picture.height > LARGE_PHOTO_FACTOR * height:
            notes.append(f"The photo is {picture.width} x {picture.height} pixels; the model sees it reduced to "
                         f"{width} x {height}, so details smaller than about "
                         f"{max(picture.width / width, picture.height / height):.0f} pixels of the photo are lost.")
        if abs(picture.width / picture.height - width / height) > 0.05:
            notes.append(f"The photo's shape ({picture.width} x {picture.height}) differs from the model's "
                         f"({width} x {height}); it is stretched to fit.")
        resized = picture.resize((width, height), Image.BILINEAR)
        rgb = np.array(resized, dtype=np.uint8)
        tensor = torch.from_numpy(rgb).permute(2, 0, 1).float().div(255).unsqueeze(0)
        return tensor.to(self.bundle.device), notes

    def predict(self, source, truth=None) -> Shown:
        image, notes = self.prepare(source)
        logits, verdicts = forward_and_check(self.bundle, image)  # the check is read in the prediction's pass
        prediction = logits[0].argmax(dim=0).cpu()
        rgb = (image[0].permute(1, 2, 0).cpu().numpy() * 255).round().astype(np.uint8)
        shares = torch.bincount(prediction.flatten(), minlength=self.bundle.num_classes).float()
        shares = (shares / shares.sum()).tolist()
        legend = [(name, hex_colour(self.colours[i]), shares[i]) for i, name in enumerate(self.bundle.class_names)]
        if truth is not None:
            truth = np.asarray(truth)
            if truth.shape != tuple(self.bundle.input_size):
                truth = np.asarray(Image.fromarray(truth.astype(np.uint8)).resize(
                    (self.bundle.input_size[1], self.bundle.input_size[0]), Image.NEAREST))
        return Shown(image=image, prediction=prediction, rgb=rgb, overlay=self.paint(rgb, prediction.numpy()),
                     legend=legend, notes=notes, truth=truth, familiarity=verdicts[0] if verdicts else None)

    def paint(self, rgb: np.ndarray, labels: np.ndarray, opacity: float = 0.5, outline=None) -> np.ndarray:
        """The class colours over the image (the background class left unpainted), optionally a region outline."""
        from explainers.segmentation.targets import background_classes

        out = rgb.astype(np.float32).copy()
        skip = background_classes(self.bundle)
        for index, colour in enumerate(self.colours):
            if index in skip:
                continue
            where = labels == index
            out[where] = (1 - opacity) * out[where] + opacity * np.asarray(colour, np.float32)
        if outline is not None:
            out[_edges(outline)] = (255, 255, 255)
        return out.clip(0, 255).astype(np.uint8)

    def legend_markdown(self, shown: Shown) -> str:
        rows = [f"<span style='color:{colour}'>■</span> **{name}**: {100 * share:.1f}% of the pixels"
                for name, colour, share in shown.legend]
        return "  \n".join(rows)

    def classes_present(self, shown: Shown) -> list:
        from explainers.segmentation.targets import background_classes

        skip = background_classes(self.bundle)
        present = set(torch.unique(shown.prediction).tolist())
        return [name for i, name in enumerate(self.bundle.class_names) if i in present and i not in skip]

    # --- the region --------------------------------------------------------------------------------
    def region(self, shown: Shown, *, class_name: str | None = None, click=None, drawing=None) -> RegionTarget:
        """The target: a click (x, y) picks the connected piece under it; a drawing (any array, non-zero = the
        region) with `class_name` explains that class there; else `class_name` over its predicted region."""
        if click is not None:
            column, row = (int(v) for v in click)
            class_index, region = clicked_region(self.bundle, shown.prediction, row, column)
        elif drawing is not None:
            class_index = self._class_index(class_name)
            region = drawn_region(self.bundle, drawing, class_index, tuple(self.bundle.input_size))
        else:
            class_index = self._class_index(class_name)
            region = predicted_region(self.bundle, shown.prediction, class_index)
        return RegionTarget(region.unsqueeze(0).to(self.bundle.device), [class_index])

    def _class_index(self, class_name) -> int:
        if class_name is None:
            raise RegionError("Pick a class to explain (or click on a coloured region).")
        if class_name not in self.bundle.class_names:
            raise RegionError(f"'{class_name}' is not a class of {self.bundle.name}: its classes are "
                              f"{', '.join(self.bundle.class_names)}.")
        return self.bundle.class_names.index(class_name)

    # --- the explanations ----------------------------------------------------------------------
    def explain(self, shown: Shown, target: RegionTarget, methods, *, options: dict | None = None,
                curve_steps: int | None = None, region: str = "predicted") -> list:
        """One record per method: its map, overlay, IoU / PA against the explained region (and the ground truth
        where `shown.truth` is known) and, unless `curve_steps` is 0, the region score's curves. The last records
        of `explain_stream`."""
        records = []
        for records in self.explain_stream(shown, target, methods, options=options, curve_steps=curve_steps,
                                           region=region):
            pass
        return records

    def explain_stream(self, shown: Shown, target: RegionTarget, methods, *, options: dict | None = None,
                       curve_steps: int | None = None, region: str = "predicted"):
        """The explanation as it is made: yields the records so far (in `methods` order) after each map and after
        each method's curves. The quick methods' maps come first, cheapest first, then their curves in the same
        order; then each slow method's map and its curves (a slow method never holds back the others' curves).
        `region`: what the region is ("predicted", "clicked", "drawn"), said in the captions and the table."""
        if not methods:
            raise ValueError("Pick at least one explanation method.")
        steps = curve_steps if curve_steps is not None else (20 if self.bundle.device.type == "cuda" else 10)
        class_index = int(target.classes[0])
        done, known = {}, {}  # the curves' shared end points (the whole image, the all-reference one)

        def in_order():
            return [done[name] for name in methods if name in done]

        def add_map(name):
            method_options = {**interactive_options(name, self.bundle), **(options or {}).get(name, {})}
            method = get_segmentation_method(name, self.bundle, **method_options)
            batch = explain_batch(self.bundle, method, shown.image, target)  # the one run path: lock, seed, checks
            heat = batch.maps.float()[0].cpu()
            done[name] = self._record(name, method, heat, batch.seconds, shown, target, class_index)
            done[name]["region"] = REGION_WORDS.get(region, region)

        quick, slow = cost_groups(methods)
        for name in quick:
            add_map(name)
            yield in_order()
        for name in quick if steps else ():
            self._add_curves(done[name], shown, target, steps, known)
            yield in_order()
        for name in slow:
            add_map(name)
            yield in_order()
            if steps:
                self._add_curves(done[name], shown, target, steps, known)
                yield in_order()

    def _add_curves(self, record: dict, shown: Shown, target: RegionTarget, steps: int, known: dict) -> None:
        started = time.perf_counter()
        maps = torch.from_numpy(record["map"]).unsqueeze(0).to(self.bundle.device)
        curves = region_curves(self.bundle, shown.image, maps, target, steps=steps, known=known)
        record.update({"fractions": curves.fractions.tolist(), "deletion": curves.deletion[0].tolist(),
                       "insertion": curves.insertion[0].tolist(), "deletion_auc": float(curves.deletion_auc[0]),
                       "insertion_auc": float(curves.insertion_auc[0]),
                       "curve_seconds": time.perf_counter() - started})

    def _record(self, name, method, heat, seconds, shown, target, class_index) -> dict:
        region = target.masks[0].cpu()
        binary = binarise_top(heat[None], [int(region.sum())])[0]  # as many pixels as the region has
        pa, iou = pa_iou(binary, region)
        record = {"method": name, "label": method.label, "map": heat.numpy(), "seconds": seconds,
                  "iou_predicted": iou, "pa_predicted": pa, "class": self.bundle.class_names[class_index],
                  "target_name": f"{self.bundle.class_names[class_index]} (region)",
                  "overlay": overlay_map(shown.rgb, heat.numpy(), binary.numpy(), region.numpy())}
        if shown.truth is not None:
            truth = torch.from_numpy(shown.truth.astype(np.int64))
            valid = truth != int(self.bundle.card.get("ignore_index", 255))
            mask = (truth == class_index) & valid
            if bool(mask.any()):
                counted = torch.where(valid, heat, torch.full_like(heat, -1.0))
                top = binarise_top(counted[None], [int(mask.sum())])[0]
                record["pa_truth"], record["iou_truth"] = pa_iou(top, mask, valid)
        return record


def cost_groups(methods) -> list:
    """[quick methods, slow methods], each cheapest first (COST_ORDER; unknown methods after the known ones)."""
    def rank(name):
        return COST_ORDER.index(name) if name in COST_ORDER else len(COST_ORDER)

    ordered = sorted(methods, key=rank)
    slow = [name for name in ordered if getattr(SEGMENTATION_METHODS.get(name), "slow", False)]
    return [[name for name in ordered if name not in slow], slow]


def interactive_options(name: str, bundle) -> dict:
    cls = SEGMENTATION_METHODS.get(name)
    return cls.interactive_options(bundle) if cls is not None else {}


def overlay_map(rgb: np.ndarray, heat: np.ndarray, binary: np.ndarray, region: np.ndarray,
                opacity: float = 0.55) -> np.ndarray:
    """The heatmap over the image, the binarised map's edge in white and the explained region's in black."""
    coloured = colorize(heat)
    out = (1 - opacity) * rgb.astype(np.float32) + opacity * coloured.astype(np.float32)
    out[_edges(binary)] = (255, 255, 255)
    out[_edges(region)] = (0, 0, 0)
    return out.clip(0, 255).astype(np.uint8)


def _edges(mask) -> np.ndarray:
    mask = np.asarray(mask, bool)
    edge = np.zeros_like(mask)
    edge[1:, :] |= mask[1:, :] != mask[:-1, :]
    edge[:, 1:] |= mask[:, 1:] != mask[:, :-1]
    return edge & mask


def scores_markdown(records: list) -> str:
    """A table: method, IoU and PA against the explained region (and the ground truth), the curves' AUCs, seconds.
    Short headers (eight columns fit a phone's width), each explained in the line under the table; a curve not
    computed yet reads "…"."""
    if not records:
        return ""
    region = records[0].get("region", REGION_WORDS["predicted"])
    truth = any("iou_truth" in r for r in records)
    columns = [("Method", lambda r: r["label"]), ("IoU", lambda r: _number(r.get("iou_predicted"))),
               ("PA", lambda r: _number(r.get("pa_predicted")))]
    if truth:
        columns += [("IoU truth", lambda r: _number(r.get("iou_truth"))),
                    ("PA truth", lambda r: _number(r.get("pa_truth")))]
    columns += [("Del. AUC ↓", lambda r: _curve_number(r, "deletion_auc")),
                ("Ins. AUC ↑", lambda r: _curve_number(r, "insertion_auc")),
                ("Map s", lambda r: f"{r['seconds']:.2f}")]
    rows = ["| " + " | ".join(name for name, _ in columns) + " |", "|---" * len(columns) + "|"]
    rows += ["| " + " | ".join(cell(r) for _, cell in columns) + " |" for r in records]
    key = (f"IoU, PA: the map's top pixels (as many as the region has) against the {region}"
           + ("; truth: against the example's derived mask" if truth else "")
           + ". Del. / Ins. AUC: area under the region's class probability as the map's top pixels are deleted "
           "(lower is better) / inserted (higher is better). Map s: seconds to draw the map.")
    return "\n".join(rows) + "\n\n" + key


def _curve_number(record: dict, key: str) -> str:
    return _number(record[key]) if key in record else "…"


def _number(value) -> str:
    return "–" if value is None or not np.isfinite(value) else f"{value:.3f}"


def method_choices() -> list:
    """(label, name) of the segmentation methods, in menu order."""
    return [(SEGMENTATION_METHODS[name].label, name) for name in list_segmentation_methods()]


def report_json(records: list) -> str:
    keep = ("method", "label", "class", "iou_predicted", "pa_predicted", "iou_truth", "pa_truth", "deletion_auc",
            "insertion_auc", "seconds")
    return json.dumps([{k: r[k] for k in keep if k in r} for r in records], indent=1)


__all__ = ["SegmentationView", "Shown", "segmentation_models", "examples", "example_mask", "scores_markdown",
           "method_choices", "DEFAULT_METHODS", "RegionError", "ImageError", "report_json"]
