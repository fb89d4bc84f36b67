"""The segmentation view's service layer (no Gradio): a segmentation model's prediction as an overlay with a
legend, the region to explain (a class, a clicked piece, a drawn region), each method's map with its IoU and PA
against the predicted region (and the ground truth where the example has one), and the region score's deletion
and insertion curves.

    view = SegmentationView(bundle)
    shown = view.predict(image)                  # overlay, legend, notes
    region = view.region(shown, class_name="WBC")   # or click=(x, y), or drawing=array
    results = view.explain(shown, region, ["gradskip", "gradcam"])
"""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from explainers.engine import ReplicaPool, explain_batch
from explainers.images import ImageError, colorize, load_image
from explainers.segmentation.capture import CaptureCache
from explainers.segmentation.methods import (SEGMENTATION_METHODS, SegmentationMethod, get_segmentation_method,
                                          list_segmentation_methods)
from explainers.segmentation.model import BUNDLED_SEGMENTATION_MODELS, class_colours, is_segmentation
from explainers.segmentation.checks import mean_threshold
from explainers.segmentation.context import (curve_auc, deletion_curves, dilate, mass_outside, nearest_first_order,
                                             order_by_values, random_order, region_copy)
from explainers.segmentation.familiarity import forward_and_check
from explainers.segmentation.scoring import pa_iou, region_curves
from explainers.segmentation.targets import (RegionError, RegionTarget, background_classes, clicked_region,
                                             drawn_region, predicted_region)

from .explain import UPDATE_SECONDS
from .figures import FigureSpec, color_for

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "explainers" / "segmentation" / "examples"
LARGE_PHOTO_FACTOR = 4  # a photo over 4x the model's side is reduced with a note (detail is lost)
DEFAULT_METHODS = ("gradskip", "gradcam", "gradrollout", "rollout")
# the methods from cheapest to dearest on a CPU (bccd-segformer, one 320 x 240 smear, one thread: Seg-Grad-CAM
# ~0.19 s; attention rollout, gradient rollout and GradSkip ~0.34 s each alone, 95% of it their one shared forward
# and backward pass (`CaptureCache`), so the first of them pays ~0.34 s and the others ~0.02 s; integrated gradients
# 16 forward and backward passes; occlusion, RISE and AHA many seconds)
COST_ORDER = ("random", "gradcam", "rollout", "gradrollout", "gradskip", "intgrad", "occlusion", "rise", "aha")
REGION_WORDS = {"predicted": "predicted region", "clicked": "clicked region", "drawn": "drawn region"}


def segmentation_models() -> list:
    """The segmentation models to offer: the bundled ones whose card is present, the user's segmentation cards,
    then the default hub names (`explainers.models.names`)."""
    from explainers.models import names

    return names("segmentation")


def is_segmentation_model(name, known=()) -> bool:
    """Whether a model name is a segmentation model, without loading it: one of `known` (the names offered as
    such), or of the segmentation kind by its card or its hub name (`explainers.models.kind_of`)."""
    from explainers.models import kind_of

    return bool(name) and (str(name) in known or kind_of(str(name)) == "segmentation")


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
    """`replicas`: the app's pool of private model copies for plain forward passes (the curves). With copies, a
    method's map and the previous method's curves are computed side by side; without (one copy, the default),
    the curves take the model's lock, as a method does: another request's hooks never see their passes."""

    def __init__(self, bundle, replicas: ReplicaPool | None = None):
        if not is_segmentation(bundle):
            raise ValueError(f"'{bundle.name}' is a classifier: the segmentation view needs a segmentation model.")
        self.bundle = bundle
        self.replicas = replicas or ReplicaPool(1)
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
        """The explanation as it is made: yields the records so far (in `methods` order) as maps and curves come
        in (gathered: what comes within a second of the last update waits for the next). The quick methods' maps
        come first, cheapest first, each method's curves made beside the next map; then each slow method's map and
        its curves (a slow method never holds back the others' curves).
        `region`: what the region is ("predicted", "clicked", "drawn"), said in the captions and the table."""
        if not methods:
            raise ValueError("Pick at least one explanation method.")
        steps = curve_steps if curve_steps is not None else (20 if self.bundle.device.type == "cuda" else 10)
        class_index = int(target.classes[0])
        # the curves' shared end points (the whole image, the all-reference one): only ever added to, so two
        # workers at worst compute one twice
        done, known = {}, {}
        # GradSkip and both rollouts read one forward and backward pass of this region: made once, for all three
        captures = CaptureCache()

        def in_order():
            return [done[name] for name in methods if name in done]

        def add_map(name):
            method_options = {**interactive_options(name, self.bundle), **(options or {}).get(name, {})}
            method = get_segmentation_method(name, self.bundle, **method_options)
            if isinstance(method, SegmentationMethod):
                method.share_captures(captures)
            batch = explain_batch(self.bundle, method, shown.image, target)  # the one run path: lock, seed, checks
            heat = batch.maps.float()[0].cpu()
            done[name] = self._record(name, method, heat, batch.seconds, shown, target, class_index)
            done[name]["region"] = REGION_WORDS.get(region, region)

        quick, slow = cost_groups(methods)
        # the curves (most of the time) go to workers on model copies, one per copy, while the next map is made;
        # their records are merged here, in this thread, so a yielded record never changes while it is read
        worker = ThreadPoolExecutor(max_workers=self.replicas.size, thread_name_prefix="segment-curves")
        pending = {}

        def submit(name):
            if steps:
                pending[name] = worker.submit(self._curves, done[name]["map"], shown, target, steps, known)

        def merge(wait_for=None) -> bool:
            """The finished curves (and `wait_for`'s, waited for) into their records; whether any came."""
            merged = False
            for name in list(pending):  # in submission order
                if name == wait_for or pending[name].done():
                    done[name].update(pending.pop(name).result())
                    merged = True
            return merged

        # every update costs the page a round trip and a redraw of the gallery and the plot (as the classifier
        # view's, `explain.UPDATE_SECONDS`): after the first map, what comes within a second of the last update
        # waits for the next, and the last quick map's and the last quick curves' updates always go
        last_update, last_shown = None, None

        def progress():  # what an update would show: maps in, curves in
            return len(done), sum("deletion" in record for record in done.values())

        def due(final: bool) -> bool:
            return bool(done) and progress() != last_shown and (
                final or last_update is None or time.perf_counter() - last_update >= UPDATE_SECONDS)

        try:
            for index, name in enumerate(quick):
                add_map(name)
                submit(name)
                merge()
                if due(index == len(quick) - 1):
                    yield in_order()
                    last_update, last_shown = time.perf_counter(), progress()
            for name in quick:
                if name in pending and merge(wait_for=name) and due(not pending):
                    yield in_order()
                    last_update, last_shown = time.perf_counter(), progress()
            if due(True):  # nothing finished is held back while a slow method runs, or at the end
                yield in_order()
            for name in slow:
                add_map(name)
                submit(name)
                merge()
                yield in_order()
                if merge(wait_for=name):
                    yield in_order()
        finally:  # a closed stream (a new click, a closed page) drops the curves not yet started
            worker.shutdown(wait=False, cancel_futures=True)
            captures.clear()

    def _curves(self, heat: np.ndarray, shown: Shown, target: RegionTarget, steps: int, known: dict) -> dict:
        """The region score's deletion and insertion curves of one map (on a model copy, or under the lock)."""
        started = time.perf_counter()
        maps = torch.from_numpy(heat).unsqueeze(0).to(self.bundle.device)
        with self.replicas.lease(self.bundle) as model:
            curves = region_curves(model, shown.image, maps, target, steps=steps, known=known)
        return {"fractions": curves.fractions.tolist(), "deletion": curves.deletion[0].tolist(),
                "insertion": curves.insertion[0].tolist(), "deletion_auc": float(curves.deletion_auc[0]),
                "insertion_auc": float(curves.insertion_auc[0]), "curve_seconds": time.perf_counter() - started}

    def _record(self, name, method, heat, seconds, shown, target, class_index) -> dict:
        """IoU and PA of the map's above-mean pixels (the rule fixed in advance, never as many pixels as the
        region has) against the predicted region and, for an example, its derived mask; the map over the image,
        whole and outside the region only."""
        region = target.masks[0].cpu()
        binary = mean_threshold(heat[None])[0]
        pa, iou = pa_iou(binary, region)
        outside = ~dilate(region)
        record = {"method": name, "label": method.label_for(self.bundle), "map": heat.numpy(), "seconds": seconds,
                  "iou_predicted": iou, "pa_predicted": pa, "class": self.bundle.class_names[class_index],
                  "target_name": f"{self.bundle.class_names[class_index]} (region)",
                  "overlay": overlay_map(shown.rgb, method.display_map(heat.numpy()),
                                         binary.numpy() if method.outline_binarised else None, region.numpy()),
                  "overlay_context": overlay_map(shown.rgb, method.display_map(context_only(heat, outside).numpy()),
                                                 np.zeros(region.shape, bool), region.numpy()),
                  "mass_outside": mass_outside(heat, ~outside, shown.prediction, class_index,
                                               background_classes(self.bundle))["outside"]}
        if shown.truth is not None:
            truth = torch.from_numpy(shown.truth.astype(np.int64))
            valid = truth != int(self.bundle.card.get("ignore_index", 255))
            mask = (truth == class_index) & valid
            if bool(mask.any()):
                record["pa_truth"], record["iou_truth"] = pa_iou(binary, mask, valid)
        return record

    def context(self, shown: Shown, target: RegionTarget, records: list, steps: int | None = None) -> dict:
        """The out-of-region deletion curve of each record's map (added to the record), and what needs no map:
        a copy of the region (the region blurred 2 px: its IoU with the region, its region and out-of-region
        deletion AUCs), a random order and nearest-first, for the caption."""
        steps = steps or (10 if self.bundle.device.type == "cuda" else 5)
        region = target.masks[0].cpu()
        outside = ~dilate(region)
        copy = region_copy(region)
        orders = {r["method"]: order_by_values(torch.from_numpy(r["map"]), outside) for r in records}
        orders.update({COPY: order_by_values(copy, outside), RANDOM_ORDER: random_order(outside),
                       NEAREST_FIRST: nearest_first_order(region, outside)})

        # ~45 model passes: the orders split over the model copies (one per core), the copy's own curves beside
        def outside_curves(part):
            with self.replicas.lease(self.bundle) as model:
                return deletion_curves(model, shown.image, target, part, steps=steps)

        def copy_curves():
            with self.replicas.lease(self.bundle) as model:
                return region_curves(model, shown.image, copy[None].to(self.bundle.device), target, steps=steps)

        names = list(orders)
        parts = [{name: orders[name] for name in names[i::self.replicas.size]} for i in range(self.replicas.size)]
        with ThreadPoolExecutor(max_workers=self.replicas.size, thread_name_prefix="segment-context") as pool:
            futures = [pool.submit(outside_curves, part) for part in parts if part]
            own_future = pool.submit(copy_curves)
            curves = {name: curve for future in futures for name, curve in future.result().items()}
            own = own_future.result()
        fractions = np.linspace(0, 1, steps + 1).tolist()
        for record in records:
            curve = curves[record["method"]]
            record.update(outside_fractions=fractions, outside_deletion=curve.tolist(),
                          outside_auc=curve_auc(curve))
        _, copy_iou = pa_iou(mean_threshold(copy[None])[0], region)
        return {"fractions": fractions, "curves": {name: curves[name].tolist() for name in (COPY, RANDOM_ORDER,
                                                                                            NEAREST_FIRST)},
                "copy_iou": copy_iou, "copy_deletion_auc": float(own.deletion_auc[0]),
                "copy_insertion_auc": float(own.insertion_auc[0]),
                "auc": {name: curve_auc(curves[name]) for name in (COPY, RANDOM_ORDER, NEAREST_FIRST)}}


COPY, RANDOM_ORDER, NEAREST_FIRST = "a copy of the region", "random order", "nearest first"


def context_only(heat: torch.Tensor, outside: torch.Tensor) -> torch.Tensor:
    """The map outside the (dilated) region, rescaled to its own maximum there (inside: 0)."""
    kept = torch.where(outside, heat.float(), torch.zeros_like(heat, dtype=torch.float32))
    peak = float(kept.max())
    return kept / peak if peak > 0 else kept


def copy_caption(reference: dict) -> str:
    """What a map that copies the region would score: the bar every method's numbers stand beside."""
    auc = reference["auc"]
    return (f"**A map that copies the region** (the region blurred 2 px) would score IoU "
            f"{_number(reference['copy_iou'])} with the predicted region and region deletion AUC "
            f"{_number(reference['copy_deletion_auc'])}: it gives back the answer, not an explanation. Outside the "
            f"region it ranks nothing: deleting the pixels outside the region in its order gives AUC "
            f"{_number(auc[COPY])}, against {_number(auc[RANDOM_ORDER])} for a random order and "
            f"{_number(auc[NEAREST_FIRST])} for the nearest pixels first. A map that found the context the region's "
            f"score leans on goes below both (lower is better); the IoU column alone cannot tell it from a copy.")


def context_curves_figure(records: list, reference: dict) -> FigureSpec:
    """The region's class probability as the pixels outside the region are deleted in each map's order, beside
    the orders that need no map (dashed, grey)."""
    data = []
    for index, record in enumerate(r for r in records if r.get("outside_deletion") is not None):
        data.append({"type": "scatter", "x": [100 * f for f in record["outside_fractions"]],
                     "y": record["outside_deletion"], "mode": "lines+markers", "name":
                     f"{record['label']}: AUC {record['outside_auc']:.3f}",
                     "line": {"color": color_for(record["method"], index), "width": 2.5}})
    for dash, name in zip(("dot", "dash", "dashdot"), (COPY, RANDOM_ORDER, NEAREST_FIRST)):
        data.append({"type": "scatter", "x": [100 * f for f in reference["fractions"]],
                     "y": reference["curves"][name], "mode": "lines", "name": f"{name}: AUC "
                     f"{reference['auc'][name]:.3f}", "line": {"color": "#777777", "width": 2, "dash": dash}})
    # one legend entry a line under the axis title, with room made for them: a legend laid across the plot's foot
    # covered the axis title at 1280 px (entries wrap differently at every width)
    plot_px, axis_px, entry_px, top_px = 240, 52, 19, 78  # three title lines: a phone cannot fit the second on one
    bottom_px = axis_px + entry_px * len(data) + 8
    layout = {"title": {"text": "Deleting only the pixels outside the region<br>(the region's class probability;<br>"
                                "lower = the map found context that matters)", "font": {"size": 13}},
              "height": top_px + plot_px + bottom_px, "margin": {"l": 50, "r": 12, "t": top_px, "b": bottom_px},
              "xaxis": {"title": {"text": "% of the pixels outside the region deleted", "standoff": 4},
                        "range": [0, 100]},
              "yaxis": {"title": {"text": "p(class) over the region"}, "range": [0, 1.02]},
              "legend": {"orientation": "v", "x": 0, "xanchor": "left", "y": -axis_px / plot_px, "yanchor": "top",
                         "font": {"size": 11}},
              "template": "plotly_white"}
    return FigureSpec(data, layout)


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


def overlay_map(rgb: np.ndarray, heat: np.ndarray, binary: np.ndarray | None, region: np.ndarray,
                opacity: float = 0.55) -> np.ndarray:
    """The heatmap over the image, the binarised map's edge in white (none for `binary` None) and the explained
    region's in black."""
    coloured = colorize(heat)
    out = (1 - opacity) * rgb.astype(np.float32) + opacity * coloured.astype(np.float32)
    if binary is not None:
        out[_edges(binary)] = (255, 255, 255)
    out[_edges(region)] = (0, 0, 0)
    return out.clip(0, 255).astype(np.uint8)


def _edges(mask) -> np.ndarray:
    mask = np.asarray(mask, bool)
    edge = np.zeros_like(mask)
    edge[1:, :] |= mask[1:, :] != mask[:-1, :]
    edge[:, 1:] |= mask[:, 1:] != mask[:, :-1]
    return edge & mask


NON_BREAKING_HYPHEN = "\u2011"
SCORE_KEYS = ("outside_auc", "mass_outside", "iou_predicted", "pa_predicted", "iou_truth", "pa_truth",
              "deletion_auc", "insertion_auc")


def scores_markdown(records: list) -> str:
    """A table: method, the out-of-region deletion AUC and the map's mass outside the region, IoU and PA against
    the explained region (and the ground truth), the region's own curves' AUCs, seconds. Short headers (they fit a
    phone's width), each explained in the line under the table; a curve not computed yet reads "…"."""
    if not records:
        return ""
    region = records[0].get("region", REGION_WORDS["predicted"])
    truth = any("iou_truth" in r for r in records)
    # non-breaking hyphens: on a phone the eight columns squeezed "Grad-CAM" into "Grad-" over "CAM"
    columns = [("Method", lambda r: r["label"].replace("-", NON_BREAKING_HYPHEN))]
    if any("outside_auc" in r for r in records):  # once the deletion outside the region is in
        columns += [("Out del. ↓", lambda r: _curve_number(r, "outside_auc"))]
    columns += [("Mass out", lambda r: _number(r.get("mass_outside"))),
                ("IoU", lambda r: _number(r.get("iou_predicted"))), ("PA", lambda r: _number(r.get("pa_predicted")))]
    if truth:
        columns += [("IoU truth", lambda r: _number(r.get("iou_truth"))),
                    ("PA truth", lambda r: _number(r.get("pa_truth")))]
    columns += [("Del. AUC ↓", lambda r: _curve_number(r, "deletion_auc")),
                ("Ins. AUC ↑", lambda r: _curve_number(r, "insertion_auc")),
                ("Map s", lambda r: f"{r['seconds']:.2f}")]
    rows = ["| " + " | ".join(name for name, _ in columns) + " |", "|---" * len(columns) + "|"]
    rows += ["| " + " | ".join(cell(r) for _, cell in columns) + " |" for r in records]
    key = ("Out del.: area under the region's class probability as only the pixels outside the region (grown 3 px) "
           "are deleted in the map's order (lower: the map found context the score leans on). Mass out: the share "
           f"of the map outside the region. IoU, PA: the map's above-mean pixels against the {region}"
           + ("; truth: against the example's derived mask" if truth else "")
           + ". Del. / Ins. AUC: area under the region's class probability as the map's top pixels are deleted "
           "(lower is better) / inserted (higher is better). Map s: seconds to draw the map (GradSkip and the rollouts "
           "share one forward and backward pass: the first of them drawn counts it).")
    return "\n".join(rows) + "\n\n" + key


def _curve_number(record: dict, key: str) -> str:
    return _number(record[key]) if key in record else "…"


def _number(value) -> str:
    return "–" if value is None or not np.isfinite(value) else f"{value:.3f}"


def method_choices() -> list:
    """(label, name) of the segmentation methods, in menu order."""
    return [(SEGMENTATION_METHODS[name].label_for(None), name) for name in list_segmentation_methods()]


def report_json(records: list) -> str:
    keep = ("method", "label", "class", *SCORE_KEYS, "seconds")
    return json.dumps([{k: r[k] for k in keep if k in r} for r in records], indent=1)


__all__ = ["SegmentationView", "Shown", "segmentation_models", "examples", "example_mask", "scores_markdown",
           "method_choices", "DEFAULT_METHODS", "RegionError", "ImageError", "report_json", "copy_caption",
           "context_curves_figure"]
