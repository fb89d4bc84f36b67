"""The Masks tab's logic: a mask from the brush, SAM prompts (object/background points, a box from two clicks or
from the bounding box of a painted stroke) and the user's mask sets.

    picture, view = load_picture("cell.png")             # the image, and the (enlarged) copy SAM is clicked on
    prompts = empty_prompts()
    shown = click(services, view, prompts, "object", 160, 160, session="s1", original=picture)
    shown = box_prompt(services, view, shown.prompts, [40, 40, 280, 280], session="s1", original=picture)
    box = box_from_stroke(editor_value, view.shape[:2])   # a rough stroke around or over the object -> a box
    entry = add_to_mask_set(services.store, "my-masks", "3", shown.mask_state)

Coordinates are (x, y) = (column, row) pixels of the SAM view, SAM's `point_coords` order; boxes are
[x0, y0, x1, y1]. SAM is `services.segmenters()` (or the labelled GrabCut fallback when SAM's weights are not
available offline). Masks are stored at the image's own size.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
from PIL import Image

from . import pictures
from explainers.images import load_image
from explainers.masks import MaskError, drawn_pixels, mask_from_drawing, resize_mask

EMPTY_PROMPTS = {"points": [], "labels": [], "box_corner": None, "box": None}
MODES = ("object", "background", "box")
NO_IMAGE = "Load an image first (upload it in the editor or use the Explain tab's image)."
NO_STROKE = ("Paint a rough stroke around (or over) the object in the mask editor first, then press "
             "'Box from my stroke → SAM'.")


def empty_prompts() -> dict:
    """No points, no box, no pending box corner."""
    return copy.deepcopy(EMPTY_PROMPTS)


def copy_prompts(prompts) -> dict:
    """A private copy of a prompts dict (a session's state is never changed in place); missing keys filled."""
    out = empty_prompts()
    out.update(copy.deepcopy(prompts or {}))
    return out


def add_click(prompts, mode: str, x: float, y: float) -> tuple:
    """(new prompts, ready): a click in `mode` "object" / "background" adds a point (label 1 / 0); "box" sets
    the first corner (ready False: wait for the opposite one) or, with a corner pending, the box
    [min x, min y, max x, max y] of the two corners."""
    if mode not in MODES:
        raise ValueError(f"Unknown click mode {mode!r}: use one of {', '.join(MODES)}.")
    prompts = copy_prompts(prompts)
    x, y = float(x), float(y)
    if mode == "box":
        if prompts.get("box_corner") is None:
            prompts["box_corner"], prompts["box"] = [x, y], None
            return prompts, False
        x0, y0 = prompts["box_corner"]
        prompts["box_corner"] = None
        prompts["box"] = [min(x0, x), min(y0, y), max(x0, x), max(y0, y)]
        return prompts, True
    prompts["points"].append([x, y])
    prompts["labels"].append(1 if mode == "object" else 0)
    return prompts, True


def clip_box(box, hw) -> list:
    """[x0, y0, x1, y1] ordered and clipped to an image of `hw` (H, W); ValueError when it has no area."""
    if box is None or len(box) != 4:
        raise ValueError("A box needs four numbers: x0, y0, x1, y1 (pixels of the image shown for SAM).")
    h, w = hw
    x0, y0, x1, y1 = (float(v) for v in box)
    x0, x1 = sorted((min(max(x0, 0.0), w), min(max(x1, 0.0), w)))
    y0, y1 = sorted((min(max(y0, 0.0), h), min(max(y1, 0.0), h)))
    if x1 - x0 < 1 or y1 - y0 < 1:
        raise ValueError("The box has no area inside the image: drag from one corner of the object to the "
                         "opposite one.")
    return [x0, y0, x1, y1]


def stroke_mask(value) -> np.ndarray | None:
    """The union of the painted pixels of a gr.ImageMask / gr.ImageEditor value (`{"background", "layers",
    "composite"}`, or one layer), in the editor's pixel grid; None when nothing is painted."""
    if value is None:
        return None
    layers = [layer for layer in (value.get("layers") or []) if layer is not None] if isinstance(value, dict) \
        else [value]
    painted = None
    for layer in layers:
        alpha = drawn_pixels(layer)
        painted = alpha if painted is None else painted | resize_mask(alpha, painted.shape)
    return painted if painted is not None and painted.any() else None


def box_from_stroke(value, view_hw) -> list:
    """SAM's box prompt from a rough stroke: the bounding box of the painted pixels, mapped from the editor's
    pixel grid to the SAM view's (`view_hw`, H x W; the view may be an enlarged copy of the image, but the
    editor's layers cover the same image). A pixel (column c) of the editor covers [c, c + 1) there, so the
    box spans whole pixels: [x0, y0, x1, y1] in view pixels."""
    painted = stroke_mask(value)
    if painted is None:
        raise MaskError(NO_STROKE)
    ys, xs = np.nonzero(painted)
    h, w = painted.shape
    view_h, view_w = (int(v) for v in view_hw[:2])
    sx, sy = view_w / w, view_h / h
    box = [xs.min() * sx, ys.min() * sy, (xs.max() + 1) * sx, (ys.max() + 1) * sy]
    return clip_box([round(v, 2) for v in box], (view_h, view_w))


def segment_prompts(services, image, points, labels, box, session="api"):
    """SAM's (or the labelled GrabCut fallback's) MaskResult for explicit prompts, reusing the session's
    image embedding: the logic behind every click."""
    if image is None:
        raise ValueError("Load an image into the mask editor first.")
    rgb = pictures.as_rgb(image)
    prepared = services.segmenters().get(rgb, session)
    return prepared.segment(points or None, labels or None, box)


def prompt_summary(prompts) -> str:
    """"2 object points, 1 background point and a box" (what SAM was given)."""
    objects = sum(1 for label in prompts["labels"] if label)
    backgrounds = len(prompts["labels"]) - objects
    parts = [f"{n} {kind} point{'s' if n > 1 else ''}" for n, kind in ((objects, "object"), (backgrounds, "background"))
             if n]
    if prompts.get("box") is not None:
        parts.append("a box")
    return " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts) or "no prompt"


@dataclass
class PromptView:
    """What the Masks tab shows after a prompt: the SAM view with the mask, points and box (`view`), the new
    `prompts`, the mask alone over the image (`preview`), the mask to add to a set (`mask_state`), a Markdown
    `note`. `ready` is False after a first box corner: no mask yet (`preview` and `mask_state` are None)."""

    view: Image.Image
    prompts: dict
    preview: Image.Image | None
    mask_state: dict | None
    note: str
    ready: bool = True


def segment_view(services, picture, prompts, session="api", original=None) -> PromptView:
    """Segment with the prompts' points and box and draw the result."""
    result = segment_prompts(services, picture, prompts["points"], prompts["labels"], prompts["box"], session)
    rgb = pictures.as_rgb(picture)
    view = pictures.mask_overlay(rgb, result.mask, (prompts["points"], prompts["labels"]), prompts["box"])
    note = f"Mask by **{result.source}** from {prompt_summary(prompts)}: {result.area_fraction:.0%} of the image."
    if result.is_fallback:
        note += " SAM's weights are not available offline here, so OpenCV GrabCut stands in for it."
    state = {"mask": result.mask, "source": result.source, "image": rgb, "original": original}
    return PromptView(view, prompts, pictures.mask_overlay(rgb, result.mask), state, note)


def click(services, picture, prompts, mode, x, y, session="api", original=None) -> PromptView:
    """A click at (x, y) of the SAM view in `mode` (see `add_click`), then SAM's mask for all prompts."""
    if picture is None:
        raise ValueError(NO_IMAGE)
    prompts, ready = add_click(prompts, mode, x, y)
    if not ready:
        rgb = pictures.as_rgb(picture)
        view = pictures.mask_overlay(rgb, np.zeros(rgb.shape[:2], bool), (prompts["points"], prompts["labels"]))
        return PromptView(view, prompts, None, None, "First corner set: click the opposite corner.", ready=False)
    return segment_view(services, picture, prompts, session, original)


def box_prompt(services, picture, prompts, box, session="api", original=None) -> PromptView:
    """A box [x0, y0, x1, y1] of the SAM view (clipped to it) replaces any box (or pending corner); the
    clicked points are kept; then SAM's mask for all prompts."""
    if picture is None:
        raise ValueError(NO_IMAGE)
    prompts = copy_prompts(prompts)
    prompts["box"], prompts["box_corner"] = clip_box(box, np.asarray(picture).shape[:2]), None
    return segment_view(services, picture, prompts, session, original)


def stroke_box_prompt(services, editor_value, picture, prompts, session="api", original=None) -> PromptView:
    """The drag form of a box: the bounding box of the stroke painted in the editor becomes SAM's box."""
    if picture is None:
        raise ValueError(NO_IMAGE)
    return box_prompt(services, picture, prompts, box_from_stroke(editor_value, np.asarray(picture).shape[:2]),
                      session, original)


def load_picture(path) -> tuple:
    """(the image as H x W x 3 uint8, the copy shown for SAM clicks: small images enlarged to 320 px)."""
    if not path:
        raise ValueError("The Explain tab has no image yet.")
    picture = np.asarray(load_image(path))
    return picture, pictures.display_rgb(picture)


def editor_picture(value) -> tuple | None:
    """(image, SAM view) of the picture uploaded into the editor, or None when it holds none."""
    background = pictures.editor_background(value)
    if background is None:
        return None
    rgb = pictures.as_rgb(background)
    return rgb, pictures.display_rgb(rgb)


def drawn_mask(value) -> tuple:
    """(preview, mask_state, note) of the mask painted with the brush, at the editor image's size."""
    background = pictures.editor_background(value)
    if background is None:
        raise ValueError("Upload an image into the editor first, then paint over the region.")
    rgb = pictures.as_rgb(background)
    result = mask_from_drawing(value, rgb.shape[:2])
    return pictures.mask_overlay(rgb, result.mask), {"mask": result.mask, "source": "drawn", "image": rgb}, \
        f"Drawn mask: {result.area_fraction:.0%} of the image."


def label_choices(services, model_name) -> list:
    """[(label, value)] of a model's classes for the class-label menu, plus "unlabelled" ("-1")."""
    try:
        bundle = services.bundle(model_name)
    except Exception:  # noqa: BLE001 - no model yet: the menu fills when one loads
        return [("unlabelled (use the model's prediction)", "-1")]
    choices = [(f"{i}: {n}", str(i)) for i, n in enumerate(bundle.class_names[:1000])]
    return choices + [("unlabelled (use the model's prediction)", "-1")]


def add_to_mask_set(store, name, label, mask_state) -> int:
    """Store the mask (resized back to the image's own size when it was made on an enlarged view) with its
    class label ("3", "3: name" or "-1" = unlabelled) in the named mask set; returns the entry id."""
    if not mask_state:
        raise ValueError("Make a mask first: paint and press 'Use my drawing', or click for SAM.")
    if label in (None, ""):
        raise ValueError("Pick the class label of this image.")
    try:
        int(str(label).split(":")[0])
    except ValueError as error:
        raise ValueError(f"The class label must be a class index, got {label!r}.") from error
    label = str(label).split(":")[0].strip()
    picture, mask = mask_state["image"], mask_state["mask"]
    original = mask_state.get("original")
    if original is not None and np.asarray(original).shape[:2] != np.asarray(mask).shape:
        picture = np.asarray(original)
        mask = resize_mask(mask, picture.shape[:2])  # back to the image's own size
    return store.add_mask(name, picture, mask, label, source=mask_state["source"])


def mask_set_view(store, name, last: int = 24) -> tuple:
    """([(image with its mask, caption)] of the set's last entries, a Markdown line listing every set)."""
    try:
        entries = store.masks(name)
    except Exception:  # noqa: BLE001 - an unknown or invalid name shows an empty set
        entries = []
    items = []
    for entry in entries[-last:]:
        picture, mask, label = store.mask_item(entry["id"])
        items.append((pictures.mask_overlay(np.asarray(picture), mask), f"class {label} · {entry['source']}"))
    summary = ", ".join(f"**{n}** ({c})" for n, c in store.mask_sets()) or "none yet"
    return items, f"Mask sets: {summary}."
