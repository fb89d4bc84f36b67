"""Images in and out: loading, model-input geometry, mapping explanations back, colouring.

The life of an image in Saliency Lab:

1. `load_image(source)` turns whatever the user gave (a path, uploaded bytes, a file object, a numpy
   array, a PIL image) into a plain 8-bit RGB `PIL.Image`, or refuses it with an `ImageError` whose
   message can be shown to the user as is.
2. `prepare_image(image, input_size, crop_pct, interpolation)` (or `prepare_for_model(image, bundle)`)
   applies the timm evaluation transform (resize the shorter side, centre crop) and returns a
   1 x 3 x H x W float tensor in [0, 1] plus a `Geometry` that records where the crop came from.
3. Methods produce H x W maps in model-input space; `map_to_original(map, geometry)` pastes a map back
   onto the original image (zero outside the crop).
4. `colorize` and `overlay` draw maps with colour-blind-safe colour maps (cividis, viridis, gray)
   built from small anchor tables, so no matplotlib is needed.
"""
from __future__ import annotations

import hashlib
import io
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import numpy as np
import torch
from PIL import Image, ImageOps

__all__ = [
    "ImageError",
    "Geometry",
    "COLORMAPS",
    "MIN_SIDE",
    "load_image",
    "prepare_image",
    "prepare_for_model",
    "map_to_original",
    "colorize",
    "overlay",
    "image_to_uint8",
    "to_pil",
    "map_array",
    "image_digest",
    "png_bytes",
]

MIN_SIDE = 8  # images smaller than MIN_SIDE x MIN_SIDE are refused
DEFAULT_MAX_BYTES = 20_000_000
DEFAULT_MAX_PIXELS = 40_000_000

# Decoders we let PIL use. Restricting the list keeps exotic plugins (EPS runs Ghostscript, for
# instance) away from user uploads. Formats missing from this Pillow build are skipped at call time.
_ALLOWED_FORMATS = ("PNG", "JPEG", "MPO", "BMP", "DIB", "TIFF", "GIF", "WEBP", "PPM", "TGA", "ICO")

# PIL modes that carry an alpha channel (composited over white).
_ALPHA_MODES = {"RGBA", "RGBa", "LA", "La", "PA"}
# PIL modes with more than 8 bits per sample (scaled to 8 bits).
_HIGH_DEPTH_MODES = {"I", "F", "I;16", "I;16L", "I;16B", "I;16N"}

ImageSource = Union[str, os.PathLike, bytes, bytearray, memoryview, io.IOBase, np.ndarray, Image.Image]


class ImageError(ValueError):
    """An image was refused or cannot be processed; the message is meant for the user."""


# ------------------------------------------------------------------------------------------------
# Loading
# ------------------------------------------------------------------------------------------------
def load_image(
    source: ImageSource,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> Image.Image:
    """Load `source` as an 8-bit RGB PIL image, or raise `ImageError`.

    Args:
        source: a path (str or `os.PathLike`), the encoded file as bytes, a binary file-like object,
            a numpy array (H x W, H x W x 1/2/3/4; uint8, uint16, other integers, bool or float) or a
            PIL image.
        max_bytes: encoded files (path, bytes, file object) larger than this are refused.
        max_pixels: images with more than this many pixels are refused. For encoded files this is
            checked from the header, before any pixel is decoded, so decompression bombs never
            allocate memory. (PIL's own global bomb limit still applies on top; it is never modified.)

    Returns:
        A fully loaded RGB `PIL.Image.Image`, independent of the source (no open file behind it).

    Conversions: EXIF orientation is applied; transparency (RGBA, LA, PA, palettes with a
    transparent entry, H x W x 4 arrays) is composited over white; grayscale, bilevel, palette and
    CMYK images are converted to RGB; 16-bit data is divided by 257; 32-bit integer and float data
    are scaled by their range (see `_scale_to_uint8`). Animated or multi-page files give their first
    frame.
    """
    if source is None:
        raise ImageError("No image was given.")
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ImageError(f"max_bytes must be a positive integer, got {max_bytes!r}.")
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels <= 0:
        raise ImageError(f"max_pixels must be a positive integer, got {max_pixels!r}.")

    if isinstance(source, Image.Image):
        return _from_pil(source, "The image", max_pixels)
    if isinstance(source, np.ndarray):
        return _from_array(source, max_pixels)
    if isinstance(source, torch.Tensor):
        raise ImageError("load_image takes encoded files, numpy arrays or PIL images; "
                         "use to_pil() for a tensor.")

    data, name = _read_encoded(source, max_bytes)
    return _decode(data, name, max_pixels)


def _read_encoded(source, max_bytes: int) -> tuple[bytes, str]:
    """Read an encoded image from a path, bytes or a file object, enforcing `max_bytes`."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        name = path.name or str(path)
        if not path.exists():
            raise ImageError(f"{name} does not exist.")
        if not path.is_file():
            raise ImageError(f"{name} is not a file.")
        size = path.stat().st_size
        if size > max_bytes:
            raise ImageError(f"{name} is too large: {_fmt_bytes(size)} (the limit is {_fmt_bytes(max_bytes)}).")
        try:
            with open(path, "rb") as handle:
                data = handle.read(max_bytes + 1)
        except OSError as error:
            raise ImageError(f"{name} cannot be read: {error}") from error
    elif isinstance(source, (bytes, bytearray, memoryview)):
        name = "The uploaded data"
        data = bytes(source)
    elif hasattr(source, "read"):
        raw_name = getattr(source, "name", None)
        name = Path(raw_name).name if isinstance(raw_name, (str, os.PathLike)) and str(raw_name) else "The uploaded file"
        try:
            data = source.read(max_bytes + 1)
        except Exception as error:  # noqa: BLE001 - any read failure is the user's file failing
            raise ImageError(f"{name} cannot be read: {error}") from error
        if isinstance(data, str):
            raise ImageError(f"{name} was opened in text mode; open it in binary mode ('rb').")
        data = bytes(data or b"")
    else:
        raise ImageError(
            f"Cannot load an image from a {type(source).__name__}: give a path, bytes, a binary file, "
            "a numpy array or a PIL image.")

    if len(data) > max_bytes:
        raise ImageError(f"{name} is too large: more than {_fmt_bytes(max_bytes)} (the limit).")
    if not data:
        raise ImageError(f"{name} is empty.")
    return data, name


def _decode(data: bytes, name: str, max_pixels: int) -> Image.Image:
    """Decode encoded bytes with PIL, checking the header size before decoding any pixel."""
    head = data[:512].lstrip().lower()
    if head.startswith(b"<svg") or (head.startswith(b"<?xml") and b"<svg" in data[:4096].lower()):
        raise ImageError(f"{name} is an SVG drawing: upload a picture (PNG, JPEG, TIFF, WebP...) instead.")
    Image.init()
    formats = [f for f in _ALLOWED_FORMATS if f in Image.OPEN]
    try:
        image = Image.open(io.BytesIO(data), formats=formats)  # lazy: reads the header only
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise ImageError(_too_large(name, error, max_pixels)) from error
    except Exception as error:  # noqa: BLE001 - PIL raises many types for bad input
        raise ImageError(f"{name} is not a readable image: {_reason(error)}") from error

    try:
        _check_size(image.size, name, max_pixels)
        try:
            image.load()  # first frame of animated / multi-page files
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
            raise ImageError(_too_large(name, error, max_pixels)) from error
        except Exception as error:  # noqa: BLE001 - truncated / corrupt data: OSError, ValueError, ...
            raise ImageError(f"{name} is not a readable image: {_reason(error)}") from error
        return _to_rgb(_exif_transpose(image), name)
    finally:
        image.close()


def _from_pil(image: Image.Image, name: str, max_pixels: int) -> Image.Image:
    """Validate and normalise an already opened PIL image (loading it if it is still lazy)."""
    _check_size(image.size, name, max_pixels)
    try:
        image.load()
    except Exception as error:  # noqa: BLE001
        raise ImageError(f"{name} is not a readable image: {_reason(error)}") from error
    return _to_rgb(_exif_transpose(image), name)


def _from_array(array: np.ndarray, max_pixels: int) -> Image.Image:
    """Turn an H x W (x C) numpy array into an RGB image, compositing alpha over white."""
    name = "The image array"
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] not in (2, 3, 4)):
        raise ImageError(
            f"{name} has shape {tuple(array.shape)}; expected H x W (grayscale), H x W x 3 (RGB) "
            "or H x W x 4 (RGBA).")
    height, width = array.shape[:2]
    _check_size((width, height), name, max_pixels)
    if array.dtype.kind not in "biuf":
        raise ImageError(f"{name} has unsupported dtype {array.dtype}; use uint8, uint16 or float.")
    if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
        raise ImageError(f"{name} contains NaN or infinite values.")

    pixels = _scale_to_uint8(array)
    if pixels.ndim == 2:
        return Image.fromarray(pixels, "L").convert("RGB")
    channels = pixels.shape[2]
    if channels == 3:
        return Image.fromarray(np.ascontiguousarray(pixels), "RGB")
    if channels == 2:  # gray + alpha
        gray, alpha = pixels[:, :, 0], pixels[:, :, 1]
        rgb = np.repeat(gray[:, :, None], 3, axis=2)
    else:
        rgb, alpha = pixels[:, :, :3], pixels[:, :, 3]
    rgba = np.concatenate([rgb, alpha[:, :, None]], axis=2)
    return _composite_over_white(Image.fromarray(np.ascontiguousarray(rgba), "RGBA"))


def _scale_to_uint8(array: np.ndarray) -> np.ndarray:
    """Scale pixel data of any depth to uint8.

    - uint8: unchanged; bool: 0 / 255;
    - uint16: divided by 257 (65535 -> 255), whatever the values;
    - other integers: unchanged if within [0, 255], divided by 257 if within [0, 65535], otherwise
      stretched from their min..max;
    - floats: x 255 if within [0, 1], unchanged if within [0, 255], otherwise stretched min..max.
    """
    if array.dtype.byteorder not in ("=", "|"):  # e.g. big-endian 16-bit TIFF data
        array = array.astype(array.dtype.newbyteorder("="))
    kind = array.dtype.kind
    if array.dtype == np.uint8:
        return array
    if kind == "b":
        return array.astype(np.uint8) * 255
    if array.dtype == np.uint16:
        return np.round(array.astype(np.float32) / 257.0).astype(np.uint8)
    values = array.astype(np.float64)
    low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    if kind == "f" and low >= 0.0 and high <= 1.0:
        scaled = values * 255.0
    elif low >= 0.0 and high <= 255.0:
        scaled = values
    elif kind in "iu" and low >= 0.0 and high <= 65535.0:
        scaled = values / 257.0
    elif high > low:
        scaled = (values - low) * (255.0 / (high - low))
    else:
        scaled = np.zeros_like(values)
    return np.clip(np.round(scaled), 0, 255).astype(np.uint8)


def _to_rgb(image: Image.Image, name: str) -> Image.Image:
    """Convert a loaded PIL image of any mode to 8-bit RGB (a new image, never the input)."""
    mode = image.mode
    try:
        if mode in _HIGH_DEPTH_MODES:
            pixels = _scale_to_uint8(np.asarray(image))
            if pixels.ndim == 3:  # defensive: multi-channel high-depth data
                pixels = pixels[:, :, 0]
            return Image.fromarray(np.ascontiguousarray(pixels), "L").convert("RGB")
        if mode == "P":
            if "transparency" in image.info or image.palette is not None and image.palette.mode == "RGBA":
                return _composite_over_white(image.convert("RGBA"))
            return image.convert("RGB")
        if mode in _ALPHA_MODES:
            return _composite_over_white(image.convert("RGBA"))
        if mode == "RGB":
            return image.copy()
        return image.convert("RGB")  # 1, L, CMYK, YCbCr, HSV, ...
    except ImageError:
        raise
    except Exception as error:  # noqa: BLE001 - e.g. modes PIL cannot convert
        raise ImageError(f"{name} has an unsupported colour mode ({mode}): {_reason(error)}") from error


COMPOSED_NOTE = "Transparent parts are composed on white: the picture shown is the one the model sees."
FIRST_FRAME_NOTE = ("This file has {frames} frames (an animation or a multi-page file): only its first frame is "
                    "shown and explained.")


def file_facts(path) -> tuple:
    """(plain, transparent, frames) of an image file: `plain` when a browser shows it exactly as `load_image`
    reads it (8-bit RGB PNG or JPEG, one frame, no EXIF rotation; anything else - 16-bit, CMYK, alpha, grayscale,
    TIFF, GIF, EXIF-rotated... - reaches the model converted), whether it has transparency, its frame count. A file
    PIL cannot open gives (False, False, 1): `load_image` says what is wrong with it."""
    try:
        with Image.open(path) as picture:
            frames = int(getattr(picture, "n_frames", 1) or 1)
            transparent = picture.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in picture.info
            plain = (picture.format in ("PNG", "JPEG") and picture.mode == "RGB" and not transparent
                     and frames == 1 and picture.getexif().get(274, 1) == 1)
            return plain, transparent, frames
    except Exception:  # noqa: BLE001 - load_image gives the message
        return False, False, 1


def conversion_notes(facts: tuple) -> list:
    """What `load_image` changed in a file that a person would not guess from it, in words for them, from its
    `file_facts`: transparency composed on white, only the first of several frames. Empty when nothing such."""
    _, transparent, frames = facts
    return ([COMPOSED_NOTE] if transparent else []) + ([FIRST_FRAME_NOTE.format(frames=frames)] if frames > 1 else [])


def _composite_over_white(rgba: Image.Image) -> Image.Image:
    """Composite an RGBA image over an opaque white background."""
    background = Image.new("RGB", rgba.size, (255, 255, 255))
    background.paste(rgba.convert("RGB"), mask=rgba.getchannel("A"))
    return background


def _exif_transpose(image: Image.Image) -> Image.Image:
    """Apply the EXIF orientation tag; a malformed EXIF block leaves the image as stored."""
    try:
        transposed = ImageOps.exif_transpose(image)
    except Exception:  # noqa: BLE001 - broken EXIF is not worth refusing the picture
        return image
    return image if transposed is None else transposed


def _check_size(size: tuple, name: str, max_pixels: int) -> None:
    """Refuse images below MIN_SIDE x MIN_SIDE or above max_pixels (size is (width, height))."""
    width, height = int(size[0]), int(size[1])
    if width * height > max_pixels:
        raise ImageError(
            f"{name} is too large: {width} × {height} = {_megapixels(width * height)} "
            f"(the limit is {_megapixels(max_pixels)}).")
    if width < MIN_SIDE or height < MIN_SIDE:
        raise ImageError(
            f"{name} is too small: {width} x {height} pixels (at least {MIN_SIDE} x {MIN_SIDE} is needed).")


def _megapixels(count: int) -> str:
    return f"{count / 1e6:,.1f} MP".replace(".0 MP", " MP")


def _too_large(name: str, error: Exception, max_pixels: int) -> str:
    """Pillow's own bomb guard fired (far above our limit): say so in our words, with our limit."""
    found = re.search(r"\((\d+) pixels\)", str(error))
    size = f" ({_megapixels(int(found.group(1)))})" if found else ""
    return f"{name} is too large{size}: the limit is {_megapixels(max_pixels)}."


def _reason(error: Exception) -> str:
    """Why PIL could not read a file, in our words (never a Python object's repr such as <_io.BytesIO ...>)."""
    if isinstance(error, Image.UnidentifiedImageError):
        return "its content is not an image format we read (PNG, JPEG, TIFF, GIF, WebP, BMP, PPM, TGA, ICO)."
    text = re.sub(r"\s*<[^<>]* at 0x[0-9a-fA-F]+>", "", str(error)).strip()
    if isinstance(error, (OSError, SyntaxError, EOFError)) and "truncated" in text.lower():
        return "the file is cut short (truncated)."
    if not text:
        return type(error).__name__
    return text[:1].lower() + text[1:] + ("" if text.endswith(".") else ".")


def _fmt_bytes(count: int) -> str:
    if count >= 1_000_000:
        return f"{count / 1_000_000:.1f} MB"
    if count >= 1_000:
        return f"{count / 1_000:.1f} kB"
    return f"{count} bytes"


# ------------------------------------------------------------------------------------------------
# Model-input geometry
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Geometry:
    """How an original image was resized and centre-cropped into the model input.

    Attributes:
        original_size: (width, height) of the original image, in pixels.
        resized_size: (width, height) after the resize, before the crop.
        crop_box: (left, top, right, bottom) of the model input in original pixel coordinates
            (floats: the crop is made after resizing, so its edges need not fall on original pixels).
        input_size: (height, width) of the model input (the crop).
    """

    original_size: tuple
    resized_size: tuple
    crop_box: tuple
    input_size: tuple


_INTERPOLATIONS = {
    "bicubic": Image.Resampling.BICUBIC,
    "bilinear": Image.Resampling.BILINEAR,
    "nearest": Image.Resampling.NEAREST,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


def _input_hw(input_size) -> tuple:
    if isinstance(input_size, (int, np.integer)) and not isinstance(input_size, bool):
        input_size = (int(input_size), int(input_size))
    try:
        height, width = (int(v) for v in input_size)
    except (TypeError, ValueError) as error:
        raise ImageError(f"input_size must be an int or (height, width), got {input_size!r}.") from error
    if height <= 0 or width <= 0:
        raise ImageError(f"input_size must be positive, got {(height, width)}.")
    return height, width


def compute_geometry(original_size: tuple, input_size=(224, 224), crop_pct: float = 1.0) -> Geometry:
    """The timm evaluation geometry for an image of `original_size` = (width, height).

    Mirrors `timm.data.transforms_imagenet_eval` with crop_mode 'center': the target is
    scale = floor(input / crop_pct) per dimension; a square target resizes the shorter side to
    `scale` (torchvision `Resize(int)`, longer side truncated), a non-square target scales by the
    smaller ratio so that both sides cover it (timm `ResizeKeepRatio`); then a centre crop of
    `input_size`. crop_pct above 1 (timm would pad) is treated as 1, so the crop never leaves the
    image.
    """
    height, width = _input_hw(input_size)
    try:
        crop_pct = float(crop_pct)
    except (TypeError, ValueError) as error:
        raise ImageError(f"crop_pct must be a number, got {crop_pct!r}.") from error
    if not (crop_pct > 0.0) or not math.isfinite(crop_pct):
        raise ImageError(f"crop_pct must be in (0, 1], got {crop_pct!r}.")
    crop_pct = min(crop_pct, 1.0)
    orig_w, orig_h = int(original_size[0]), int(original_size[1])
    if orig_w <= 0 or orig_h <= 0:
        raise ImageError(f"The image has no pixels ({orig_w} x {orig_h}).")

    scale_h, scale_w = math.floor(height / crop_pct), math.floor(width / crop_pct)
    if scale_h == scale_w:
        size = scale_h
        if orig_w <= orig_h:
            new_w, new_h = size, int(size * orig_h / orig_w)
        else:
            new_w, new_h = int(size * orig_w / orig_h), size
    else:
        ratio = min(orig_h / scale_h, orig_w / scale_w)
        new_h, new_w = round(orig_h / ratio), round(orig_w / ratio)
    new_h, new_w = max(new_h, height), max(new_w, width)  # guard against rounding below the crop

    top = int(round((new_h - height) / 2.0))
    left = int(round((new_w - width) / 2.0))
    sx, sy = orig_w / new_w, orig_h / new_h
    box = (left * sx, top * sy, (left + width) * sx, (top + height) * sy)
    return Geometry(
        original_size=(orig_w, orig_h),
        resized_size=(new_w, new_h),
        crop_box=tuple(float(v) for v in box),
        input_size=(height, width),
    )


def prepare_image(
    image: Image.Image,
    input_size=(224, 224),
    crop_pct: float = 1.0,
    interpolation: str = "bicubic",
) -> tuple[torch.Tensor, Geometry]:
    """Apply the timm evaluation transform (without normalisation) to an image.

    Args:
        image: a PIL image (any mode is converted to RGB as in `load_image`); anything else that
            `load_image` accepts (path, bytes, array) is loaded first.
        input_size: model input (height, width), or an int for a square input.
        crop_pct: the fraction of the resized image kept by the centre crop (timm's crop_pct).
        interpolation: 'bicubic', 'bilinear', 'nearest', 'lanczos', 'box' or 'hamming'.

    Returns:
        (tensor of shape 1 x 3 x H x W, float32 in [0, 1]; the `Geometry` of the crop).
    """
    if isinstance(image, Image.Image):
        rgb = image if image.mode == "RGB" else _to_rgb(image, "The image")
    else:
        rgb = load_image(image)
    key = str(interpolation).lower()
    if key not in _INTERPOLATIONS:
        raise ImageError(f"Unknown interpolation {interpolation!r}; use one of {', '.join(_INTERPOLATIONS)}.")
    geometry = compute_geometry(rgb.size, input_size, crop_pct)
    new_w, new_h = geometry.resized_size
    resized = rgb if (new_w, new_h) == rgb.size else rgb.resize((new_w, new_h), _INTERPOLATIONS[key])
    height, width = geometry.input_size
    top = int(round((new_h - height) / 2.0))
    left = int(round((new_w - width) / 2.0))
    cropped = resized.crop((left, top, left + width, top + height))
    pixels = np.asarray(cropped, dtype=np.float32) / 255.0
    tensor = torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1))).unsqueeze(0)
    return tensor, geometry


def prepare_for_model(image: Image.Image, bundle) -> tuple[torch.Tensor, Geometry]:
    """`prepare_image` with the input size, crop_pct and interpolation of a `ModelBundle`."""
    return prepare_image(
        image,
        input_size=tuple(bundle.input_size),
        crop_pct=getattr(bundle, "crop_pct", 1.0),
        interpolation=getattr(bundle, "interpolation", "bicubic"),
    )


# ------------------------------------------------------------------------------------------------
# Maps back to the original image
# ------------------------------------------------------------------------------------------------
def _squeezed_array(attribution, dtype) -> np.ndarray:
    """A map given as a tensor or an array, as a numpy array of `dtype` with its leading 1-dims dropped."""
    if isinstance(attribution, torch.Tensor):
        array = attribution.detach().to("cpu", torch.float64 if dtype == np.float64 else torch.float32).numpy()
    else:
        array = np.asarray(attribution, dtype=dtype)
    while array.ndim > 2 and array.shape[0] == 1:
        array = array[0]
    return array


def map_array(attribution, what: str = "The map") -> np.ndarray:
    """A float32 H x W numpy copy of a map given as numpy array or tensor (leading 1-dims dropped; NaN and
    infinities become 0): the one tensor-to-array converter for maps."""
    array = _squeezed_array(attribution, np.float32)
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise ImageError(f"{what} must be a non-empty H x W array, got shape {tuple(array.shape)}.")
    return np.nan_to_num(array.astype(np.float32, copy=False), nan=0.0, posinf=0.0, neginf=0.0)


def _bilinear_weights(count: int, start: float, stop: float, cells: int):
    """For output pixel centres 0.5 .. count-0.5 inside [start, stop): the covered index range and
    the source indices / weights of a half-pixel-aligned bilinear resize of `cells` cells onto it."""
    first = max(0, int(math.ceil(start - 0.5)))
    last = min(count, int(math.ceil(stop - 0.5)))  # exclusive: centres < stop
    if last <= first:
        return first, first, None, None, None
    centres = np.arange(first, last, dtype=np.float64) + 0.5
    source = (centres - start) / (stop - start) * cells - 0.5
    source = np.clip(source, 0.0, cells - 1)
    low = np.floor(source).astype(np.int64)
    high = np.minimum(low + 1, cells - 1)
    weight = (source - low).astype(np.float32)
    return first, last, low, high, weight


def map_to_original(attribution, geometry: Geometry) -> np.ndarray:
    """Paste a model-input map back onto the original image.

    Args:
        attribution: H x W map (numpy or tensor; leading singleton dims are dropped) covering the
            model input, i.e. `geometry.crop_box`. Usually H x W equals `geometry.input_size`, but
            any grid (e.g. a 14 x 14 token map) is taken to cover the crop box. NaN / inf become 0.
        geometry: the `Geometry` returned by `prepare_image`.

    Returns:
        float32 array of shape (original height, original width): the map resized bilinearly
        (half-pixel aligned) into the crop box, 0 outside it.
    """
    grid = map_array(attribution)
    orig_w, orig_h = geometry.original_size
    left, top, right, bottom = geometry.crop_box
    out = np.zeros((orig_h, orig_w), dtype=np.float32)
    x0, x1, xl, xh, wx = _bilinear_weights(orig_w, left, right, grid.shape[1])
    y0, y1, yl, yh, wy = _bilinear_weights(orig_h, top, bottom, grid.shape[0])
    if wx is None or wy is None:
        return out
    rows = grid[yl] * (1.0 - wy)[:, None] + grid[yh] * wy[:, None]  # (y1-y0) x W
    out[y0:y1, x0:x1] = rows[:, xl] * (1.0 - wx)[None, :] + rows[:, xh] * wx[None, :]
    return out


# ------------------------------------------------------------------------------------------------
# Colour maps
# ------------------------------------------------------------------------------------------------
# Anchors (LUT index 0..255, R, G, B) sampled from the published 256-entry cividis and viridis
# tables (Nunez et al. 2018; van der Walt & Smith 2015, as shipped in matplotlib). The anchors are
# placed where the curves bend, so linear interpolation stays within about 2/255 of the originals.
_CIVIDIS_ANCHORS = (
    (0, 0, 34, 78), (21, 0, 49, 112), (23, 1, 50, 113), (28, 18, 53, 112), (34, 30, 58, 111),
    (52, 54, 70, 108), (84, 86, 92, 109), (126, 123, 122, 120), (148, 144, 139, 120),
    (179, 174, 163, 113), (205, 201, 185, 101), (232, 231, 209, 80), (242, 242, 218, 68),
    (251, 253, 227, 52), (255, 254, 232, 56),
)
_VIRIDIS_ANCHORS = (
    (0, 68, 1, 84), (15, 72, 23, 105), (29, 72, 41, 121), (42, 68, 57, 131), (57, 62, 74, 137),
    (91, 46, 110, 142), (129, 32, 146, 140), (143, 31, 159, 136), (154, 35, 169, 131),
    (170, 53, 183, 121), (188, 86, 198, 103), (208, 132, 212, 75), (238, 210, 226, 27),
    (246, 231, 228, 25), (255, 253, 231, 37),
)


def _lut_from_anchors(anchors) -> np.ndarray:
    table = np.asarray(anchors, dtype=np.float64)
    index = np.arange(256, dtype=np.float64)
    channels = [np.interp(index, table[:, 0], table[:, c]) for c in (1, 2, 3)]
    return np.clip(np.round(np.stack(channels, axis=1)), 0, 255).astype(np.uint8)


_LUTS = {
    "cividis": _lut_from_anchors(_CIVIDIS_ANCHORS),
    "viridis": _lut_from_anchors(_VIRIDIS_ANCHORS),
    "gray": np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, axis=1),
}
for _lut in _LUTS.values():
    _lut.setflags(write=False)
COLORMAPS = tuple(_LUTS)


def colormap_lut(colormap: str = "cividis") -> np.ndarray:
    """The 256 x 3 uint8 lookup table of a colour map ('cividis', 'viridis' or 'gray'); read-only."""
    key = str(colormap).lower()
    if key in ("grey", "greys", "grays"):
        key = "gray"
    if key not in _LUTS:
        raise ImageError(f"Unknown colour map {colormap!r}; use one of {', '.join(COLORMAPS)}.")
    return _LUTS[key]


def colorize(attribution, colormap: str = "cividis") -> np.ndarray:
    """Colour an H x W map: min..max is stretched to the colour map's ends.

    A constant map (or one with no finite value) gets the colour of the low end everywhere; NaN and
    infinite entries are treated as the minimum. Accepts numpy arrays and tensors.

    Returns:
        H x W x 3 uint8 array.
    """
    lut = colormap_lut(colormap)
    values = _squeezed_array(attribution, np.float64)
    if values.ndim != 2:
        raise ImageError(f"The map must be H x W, got shape {tuple(values.shape)}.")
    finite = np.isfinite(values)
    if not finite.any():
        return np.broadcast_to(lut[0], values.shape + (3,)).copy()
    low, high = float(values[finite].min()), float(values[finite].max())
    values = np.where(finite, values, low)
    if high > low:
        scaled = (values - low) / (high - low)
    else:
        scaled = np.zeros_like(values)
    index = np.clip(np.round(scaled * 255.0), 0, 255).astype(np.uint8)
    return lut[index]


def crop_region(geometry: Geometry) -> np.ndarray:
    """H x W bool array of the original image: True at the pixels whose centre lies inside the model input's
    crop box (what the model saw; the pixels `map_to_original` fills), False in the margin a centre crop cut
    away."""
    width, height = geometry.original_size
    left, top, right, bottom = geometry.crop_box
    xs, ys = np.arange(width) + 0.5, np.arange(height) + 0.5
    return ((ys >= top) & (ys < bottom))[:, None] & ((xs >= left) & (xs < right))[None, :]  # as map_to_original


def overlay(image, attribution, opacity: float = 0.5, colormap: str = "cividis", region=None) -> Image.Image:
    """Blend a coloured map over an image: out = (1 - opacity) * image + opacity * colour.

    Args:
        image: PIL image (any mode, converted to RGB) or H x W x 3 uint8 array.
        attribution: H x W map of the same height and width as the image (see `map_to_original`).
        opacity: weight of the map in [0, 1]; 0 returns the image unchanged, 1 the coloured map.
        colormap: 'cividis', 'viridis' or 'gray'.
        region: optional H x W bool array (e.g. `crop_region`): the map is coloured (and stretched) inside it
            only; outside it the image is left as it is (no square of "least important" colour around a
            centre crop the model never saw).

    Returns:
        An RGB PIL image.
    """
    if isinstance(image, Image.Image):
        base = np.asarray(image if image.mode == "RGB" else _to_rgb(image, "The image"), dtype=np.uint8)
    else:
        base = np.asarray(image)
        if base.ndim != 3 or base.shape[2] != 3 or base.dtype != np.uint8:
            raise ImageError(f"The image must be an RGB PIL image or an H x W x 3 uint8 array, "
                             f"got {base.dtype} with shape {tuple(base.shape)}.")
    try:
        opacity = float(opacity)
    except (TypeError, ValueError) as error:
        raise ImageError(f"opacity must be a number in [0, 1], got {opacity!r}.") from error
    if not (0.0 <= opacity <= 1.0):
        raise ImageError(f"opacity must be in [0, 1], got {opacity}.")
    if region is not None:
        region = np.asarray(region, dtype=bool)
        values = map_array(attribution).astype(np.float64)
        if region.shape != values.shape:
            raise ImageError(f"The region is {region.shape[0]} x {region.shape[1]} but the map is "
                             f"{values.shape[0]} x {values.shape[1]}.")
        attribution = np.where(region, values, np.nan)  # the stretch is over the region only
    colours = colorize(attribution, colormap)
    if colours.shape[:2] != base.shape[:2]:
        raise ImageError(
            f"The map is {colours.shape[0]} x {colours.shape[1]} (H x W) but the image is "
            f"{base.shape[0]} x {base.shape[1]}; map it to the image first (map_to_original).")
    if opacity == 0.0:
        blended = base.copy()
    elif opacity == 1.0:
        blended = colours
    else:
        mixed = base.astype(np.float32) * (1.0 - opacity) + colours.astype(np.float32) * opacity
        blended = np.clip(np.round(mixed), 0, 255).astype(np.uint8)
    if region is not None and not region.all():
        blended = np.where(region[..., None], blended, base)
    return Image.fromarray(np.ascontiguousarray(blended), "RGB")


# ------------------------------------------------------------------------------------------------
# Tensors back to pictures
# ------------------------------------------------------------------------------------------------
def image_to_uint8(tensor) -> np.ndarray:
    """A 3 x H x W (or 1 x 3 x H x W) image in [0, 1] as an H x W x 3 uint8 array (clamped, rounded)."""
    if isinstance(tensor, torch.Tensor):
        array = tensor.detach().to("cpu", torch.float32).numpy()
    else:
        array = np.asarray(tensor, dtype=np.float32)
    if array.ndim == 4 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 3 or array.shape[0] != 3:
        raise ImageError(f"Expected a 3 x H x W image tensor, got shape {tuple(array.shape)}.")
    array = np.nan_to_num(array, nan=0.0, posinf=1.0, neginf=0.0)
    return np.ascontiguousarray(np.clip(np.round(array.transpose(1, 2, 0) * 255.0), 0, 255).astype(np.uint8))


def to_pil(tensor) -> Image.Image:
    """A 3 x H x W (or 1 x 3 x H x W) image tensor in [0, 1] as an RGB PIL image."""
    return Image.fromarray(image_to_uint8(tensor), "RGB")


def image_digest(image) -> str:
    """A content hash of a PIL image (mode, size, pixels) or an array (dtype, shape, values): cache keys."""
    digest = hashlib.blake2b(digest_size=16)
    if isinstance(image, Image.Image):
        digest.update(f"{image.mode}{image.size}".encode())
        digest.update(image.tobytes())
    else:
        array = np.ascontiguousarray(image)
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def png_bytes(image: Image.Image, compress_level: int = 6) -> bytes:
    """The image encoded as PNG."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=compress_level)
    return buffer.getvalue()
