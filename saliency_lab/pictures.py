"""The app's pictures: maps blended over the displayed image with their captions, and the mask editor's views
(a mask tinted over the image with SAM's clicked points and box, small images enlarged for clicking).
"""
from __future__ import annotations

import numpy as np
from PIL import Image

from explainers.engine import PreparedInput
from explainers.images import crop_region, map_to_original, overlay
from explainers.methods import METHODS
from explainers.metrics import METRICS


def map_to_display(record: dict, prepared: PreparedInput) -> np.ndarray:
    """The record's map in the display image's size, as its method colours it (`Method.display_map`)."""
    shown = map_to_original(record["map"], prepared.display_geometry)
    method = METHODS.get(record.get("method"))
    return method.display_map(shown) if method is not None else shown


OUTLINE = (213, 94, 0)  # Okabe-Ito vermillion: stands out on cividis, viridis and grey


def outline_top(picture: Image.Image, record: dict, geometry, fraction: float) -> Image.Image:
    """The picture with the top `fraction` of the record's map outlined (the pixels the deletion curve removes
    first: `explainers.metrics.top_fraction` on the model-input map, mapped to the picture by `geometry`).
    No model pass: the map is the record's."""
    from explainers.metrics import top_fraction

    top = top_fraction(record["map"], fraction)
    inside = map_to_original(top.astype(np.float32), geometry) >= 0.5
    pad = np.pad(inside, 1)  # the picture's border closes a region that touches it
    edge = inside & ~(pad[:-2, 1:-1] & pad[2:, 1:-1] & pad[1:-1, :-2] & pad[1:-1, 2:])
    width = max(1, round(max(inside.shape) / 256))
    for _ in range(width - 1):  # thicker on large pictures, inwards
        pad = np.pad(edge, 1)
        edge = inside & (pad[:-2, 1:-1] | pad[2:, 1:-1] | pad[1:-1, :-2] | pad[1:-1, 2:] | edge)
    pixels = np.asarray(picture.convert("RGB")).copy()
    pixels[edge] = OUTLINE
    return Image.fromarray(pixels, "RGB")


def render_overlays(prepared: PreparedInput, results: list, opacity: float = 0.5, colormap: str = "cividis",
                    outline: float = 0.0) -> list:
    """[(PIL overlay, caption)] in the display image's size, one per result. A model with a centre crop
    (efficientnet-lite0 keeps 87.5%) never saw the margin: each overlay shows the crop it saw (`crop_region`),
    not the whole picture with the margin painted in the colour of "least important", which drew a square
    around the crop (`crop_note` says so)."""
    region = crop_region(prepared.display_geometry)
    box = None if region.all() else _bounding_box(region)
    items = []
    for record in results:
        picture = overlay(prepared.display, map_to_display(record, prepared), opacity=float(opacity),
                          colormap=colormap, region=region)
        if outline and float(outline) > 0:  # `outline`: the fraction of the top pixels outlined (0: none)
            picture = outline_top(picture, record, prepared.display_geometry, float(outline))
        items.append((picture if box is None else picture.crop(box), caption(record)))
    return items


def _bounding_box(region: np.ndarray) -> tuple:
    """(left, top, right, bottom) of the True pixels (PIL's crop box)."""
    rows, cols = np.flatnonzero(region.any(axis=1)), np.flatnonzero(region.any(axis=0))
    return int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1


def crop_note(prepared: PreparedInput, bundle=None) -> str:
    """A line for the status when the model sees only a centre crop of the image (else ""): the legend of the
    uncoloured margin."""
    if crop_region(prepared.geometry).all():
        return ""
    pct = getattr(bundle, "crop_pct", None)
    share = f" ({pct:.1%} of the shorter side)" if pct and pct < 1 else ""
    return (f"This model sees only the centre crop{share}: the maps show that crop (the downloads at the "
            "image's size leave the margin it never saw uncoloured).")


def colour_bar_html(colormap: str = "cividis") -> str:
    """A colour scale for the heatmaps: the colour map's gradient, labelled (each map is stretched from its own
    minimum to its own maximum, so the ends mean "least" and "most" important for that map)."""
    from explainers.images import colormap_lut

    lut = colormap_lut(colormap)
    stops = ", ".join(f"rgb({r},{g},{b}) {100 * i / 10:.0f}%" for i, (r, g, b) in
                      enumerate(lut[np.linspace(0, 255, 11).astype(int)]))
    return ('<div class="colour-bar" role="img" aria-label="colour scale: left least important, right most '
            f'important"><div class="colour-bar-strip" style="background: linear-gradient(to right, {stops})"></div>'
            '<div class="colour-bar-labels"><span>least important</span><span>each map scaled to its own range'
            '</span><span>most important</span></div></div>')


def options_text(record: dict) -> str:
    """A result's options as `name=value`, each named as its method declares it (Option.short), else by keyword.
    Grouped settings (a dict, e.g. AHA's `refinement`) stay out of this one-line text: report.json has them."""
    declared = METHODS[record["method"]].user_options_by_name() if record.get("method") in METHODS else {}
    return ", ".join(f"{getattr(declared.get(k), 'short', '') or k}={v}" for k, v in record["options"].items()
                     if not isinstance(v, dict))


def caption(record: dict) -> str:
    text = f"{record['label']} · {record['target_name']}"
    option_text = options_text(record)
    if option_text:
        text += f" ({option_text})"
    if record.get("deletion_auc") is not None:
        text += (f" · del {record['deletion_auc']:.3f} {METRICS['deletion_auc'].arrow} · ins "
                 f"{record['insertion_auc']:.3f} {METRICS['insertion_auc'].arrow}")
    return text



def mask_overlay(image: np.ndarray, mask: np.ndarray, points=None, box=None) -> Image.Image:
    """The image with the mask tinted blue (Okabe-Ito), clicked points (green: object, orange: background) and a box."""
    base = Image.fromarray(np.asarray(image, dtype=np.uint8)).convert("RGB")
    tint = np.asarray(base, dtype=np.float32).copy()
    colour = np.array([0, 114, 178], dtype=np.float32)  # Okabe-Ito blue
    tint[mask] = 0.45 * tint[mask] + 0.55 * colour
    picture = Image.fromarray(tint.astype(np.uint8))
    if points or box:
        from PIL import ImageDraw

        draw = ImageDraw.Draw(picture)
        radius = max(3, round(0.015 * max(picture.size)))
        for (x, y), lab in zip(*(points or ([], []))):
            fill = (0, 158, 115) if lab else (213, 94, 0)
            draw.ellipse([x - radius, y - radius, x + radius, y + radius], fill=fill, outline=(255, 255, 255), width=2)
        if box:
            draw.rectangle(box, outline=(230, 159, 0), width=max(2, radius // 2))
    return picture


def display_rgb(rgb, minimum: int = 320) -> np.ndarray:
    """Small images (BloodMNIST's 64 px) enlarged so that points can be clicked precisely (H x W x 3 uint8)."""
    rgb = np.asarray(rgb, dtype=np.uint8)
    longest = max(rgb.shape[:2])
    if longest >= minimum:
        return rgb
    scale = minimum / longest
    size = (round(rgb.shape[1] * scale), round(rgb.shape[0] * scale))
    return np.asarray(Image.fromarray(rgb).resize(size, Image.Resampling.LANCZOS))


def editor_background(value):
    """The uploaded picture inside a gr.ImageEditor / gr.ImageMask value (or the value itself), or None."""
    if value is None:
        return None
    if isinstance(value, dict):
        background = value.get("background")
        if background is None:
            background = value.get("composite")
        return None if background is None else np.asarray(background)
    return np.asarray(value)


def as_rgb(array) -> np.ndarray:
    """H x W, H x W x 3 or H x W x 4 (alpha over white) -> H x W x 3 uint8."""
    array = np.asarray(array)
    if array.ndim == 2:
        array = np.repeat(array[..., None], 3, axis=2)
    if array.shape[-1] == 4:
        rgb = array[..., :3].astype(np.float32)
        alpha = array[..., 3:4].astype(np.float32) / 255.0
        array = (rgb * alpha + 255.0 * (1 - alpha)).round().astype(np.uint8)
    return np.ascontiguousarray(array[..., :3].astype(np.uint8))



STEP_PX = 256  # the step viewer's pictures: the model's input enlarged to at least this size


def curve_step_images(tensor, attribution, step: int, steps: int, reference_color) -> tuple:
    """(deleted, inserted) PIL pictures of a 1 x 3 x H x W [0, 1] model input at curve step `step` of `steps`: the
    deletion image has the map's top step/steps pixels replaced by `reference_color`, the insertion image is that
    colour with them restored (explainers.metrics' ranks and counts, so the pixels are the curve's)."""
    import torch

    from explainers.metrics import fraction_counts, pixel_ranks, reference_images

    image = tensor[:1].detach().float().cpu()
    _, _, h, w = image.shape
    grid = torch.as_tensor(np.asarray(attribution, dtype=np.float32)).reshape(1, h, w)
    _, counts = fraction_counts(steps, h * w)
    top = (pixel_ranks(grid)[0] < counts[step]).view(1, 1, h, w).float()
    reference = reference_images(image, "mean", reference_color)
    deleted = image * (1 - top) + reference * top
    inserted = reference * (1 - top) + image * top
    scale = max(1, -(-STEP_PX // max(h, w)))
    return tuple(Image.fromarray((t[0].permute(1, 2, 0).clamp(0, 1).numpy() * 255).round().astype(np.uint8))
                 .resize((w * scale, h * scale), Image.Resampling.NEAREST) for t in (deleted, inserted))
