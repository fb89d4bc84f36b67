"""Trusted masks for CAMAL: where the model *should* look.

Four sources, one result type (`MaskResult`: a boolean H x W mask plus a label saying where it came from):

- a drawing: the Gradio editor's value (`{"background", "layers", "composite"}`) or a raw array, any size,
  resized (nearest) to the image: `mask_from_drawing(value, image_hw)`;
- SAM, from clicks and/or a box: `load_sam()` builds a `SamSegmenter`; `segmenter.prepare(image)` computes the
  image embedding ONCE and returns a `SegmenterImage` whose `segment(points, labels, box)` is cheap and can be
  called for every click. `SegmenterCache` keeps a few prepared images (LRU, keyed by session and image hash)
  so an app never recomputes an embedding for a new click on the same image;
- the offline fallback when no SAM weights can be had: OpenCV GrabCut seeded by the same points/box, with the
  same interface, labelled "GrabCut (offline fallback, not SAM)" in every result;
- data sets: Pascal VOC boxes (BCCD): `read_voc_boxes`, `boxes_to_mask`, `build_bccd_mask_set`.

Every mask goes through `validate_mask`, which refuses an empty mask, a full mask and a mask whose size does not
match the image, with a message a user can act on.

Mask sets on disk (what `python -m explainers camal --masks` reads and `explainers.decoy` writes): a folder with
`masks.csv`, columns `file,mask_file,class_index` (extra columns are ignored):
- `file`: the image, relative to the data folder (by default the folder holding masks.csv);
- `mask_file`: a PNG relative to the folder holding masks.csv, same width and height as the image, nonzero = inside;
- `class_index`: the class whose CAM must lie inside the mask; -1 = unlabelled (CAMAL then uses the base
  model's own prediction as the target, a pseudo-label fixed before fine-tuning).
Writers also put a `labels.csv` (`file,class_index`) beside it, so the folder is an ordinary labelled folder.
"""
from __future__ import annotations

import csv
import importlib
import threading
import xml.etree.ElementTree as ET
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from .images import image_digest, load_image

GRABCUT_LABEL = "GrabCut (offline fallback, not SAM)"
SAM_WEIGHTS = {
    # variant: (hub repo, file in the repo, registry key, label)
    "vit_b": ("ybelkada/segment-anything", "checkpoints/sam_vit_b_01ec64.pth", "vit_b", "SAM ViT-B"),
    "mobile_sam": ("dhkim2810/MobileSAM", "mobile_sam.pt", "vit_t", "MobileSAM"),
}


class MaskError(ValueError):
    """A mask cannot be used (empty, full, wrong size, unreadable): the message says what to do."""


class SamUnavailableError(RuntimeError):
    """SAM cannot be loaded here (no package, no cached weights and no network)."""


@dataclass
class MaskResult:
    mask: np.ndarray  # H x W bool
    source: str  # "drawing", "SAM ViT-B", "MobileSAM", GRABCUT_LABEL, "box", ...
    score: float | None = None
    candidates: list = field(default_factory=list)  # SAM's other masks, best first: [(mask, score)]

    @property
    def is_fallback(self) -> bool:
        return self.source == GRABCUT_LABEL

    @property
    def area_fraction(self) -> float:
        return float(self.mask.mean())


# ------------------------------------------------------------------------------------------ checks
def _hw(image_hw) -> tuple:
    if isinstance(image_hw, (Image.Image,)):
        return image_hw.size[1], image_hw.size[0]
    if isinstance(image_hw, np.ndarray) and image_hw.ndim >= 2 and image_hw.size > 2:
        return tuple(int(v) for v in image_hw.shape[:2])
    h, w = (int(v) for v in image_hw)
    return h, w


def validate_mask(mask, image_hw=None, *, what: str = "The mask") -> np.ndarray:
    """A boolean H x W copy of `mask`, or MaskError if it is empty, full, not 2-D or not the image's size."""
    if isinstance(mask, torch.Tensor):
        mask = mask.detach().cpu().numpy()
    array = np.asarray(mask)
    if array.ndim == 3 and array.shape[-1] in (1, 3, 4):
        array = array[..., -1] if array.shape[-1] == 4 else array[..., 0]
    if array.ndim != 2:
        raise MaskError(f"{what} must be a 2-D H x W array, got shape {tuple(array.shape)}.")
    array = array > 0 if array.dtype != bool else array.copy()
    if image_hw is not None:
        h, w = _hw(image_hw)
        if array.shape != (h, w):
            raise MaskError(f"{what} is {array.shape[0]} x {array.shape[1]} (H x W) but the image is {h} x {w}: "
                            "masks must match their image pixel for pixel (resize the drawing to the image, or "
                            "regenerate the mask for this image).")
    if not array.any():
        raise MaskError(f"{what} is empty: mark the region the model should look at (draw on it, click it "
                        "for SAM, or give a box).")
    if array.all():
        raise MaskError(f"{what} covers the whole image: CAMAL needs an inside and an outside, so leave out "
                        "the background the model should ignore.")
    return array


def resize_mask(mask, image_hw) -> np.ndarray:
    """Nearest-neighbour resize of a 2-D mask to (H, W), as bool."""
    h, w = _hw(image_hw)
    array = np.asarray(mask)
    if array.dtype == bool:
        array = array.astype(np.uint8) * 255
    if array.shape[:2] == (h, w):
        return array > 0
    resized = Image.fromarray(np.ascontiguousarray(array.astype(np.uint8))).resize((w, h), Image.NEAREST)
    return np.asarray(resized) > 0


# ------------------------------------------------------------------------------------------ drawings
def mask_from_drawing(value, image_hw) -> MaskResult:
    """The mask a user drew, resized to the image.

    `value`: the Gradio ImageEditor / ImageMask value (`{"background", "layers", "composite"}`: the drawing is
    the union of the layers' alpha > 0; `layers == []` means nothing was drawn), an RGBA layer (H x W x 4:
    alpha > 0), a 2-D array (nonzero = inside), or a PIL image (its alpha if it has one, else nonzero).
    Any size: the drawing is resized to `image_hw` (nearest).
    """
    if value is None:
        raise MaskError("No mask drawn: paint over the region the model should look at.")
    if isinstance(value, dict):
        layers = [layer for layer in (value.get("layers") or []) if layer is not None]
        if not layers:
            raise MaskError("No mask drawn (the editor has no layer): paint over the region the model should "
                            "look at.")
        drawn = None
        for layer in layers:
            alpha = drawn_pixels(layer)
            drawn = alpha if drawn is None else drawn | resize_mask(alpha, drawn.shape)
    else:
        drawn = drawn_pixels(value)
    mask = resize_mask(drawn, image_hw)
    return MaskResult(validate_mask(mask, image_hw, what="The drawn mask"), source="drawing")


def drawn_pixels(layer) -> np.ndarray:
    """The painted pixels of one editor layer (RGBA: alpha > 0; RGB or grey: nonzero), as H x W bool."""
    if isinstance(layer, (str, Path)):
        with Image.open(layer) as image:
            layer = image.copy()
    if isinstance(layer, Image.Image):
        layer = np.asarray(layer.convert("RGBA") if "A" in layer.getbands() else layer.convert("L"))
    array = np.asarray(layer)
    if array.ndim == 3 and array.shape[-1] == 4:
        return array[..., 3] > 0
    if array.ndim == 3:
        return array.max(axis=-1) > 0
    if array.ndim == 2:
        return array > 0
    raise MaskError(f"Cannot read a mask from an array of shape {tuple(array.shape)}: expected H x W or "
                    "H x W x 4 (RGBA, alpha = drawn).")


# ------------------------------------------------------------------------------------------ boxes
def boxes_to_mask(boxes, image_hw) -> np.ndarray:
    """Union of [x0, y0, x1, y1] boxes (pixel corners, x1/y1 exclusive, clipped) as an H x W bool mask."""
    h, w = _hw(image_hw)
    mask = np.zeros((h, w), dtype=bool)
    for box in boxes:
        x0, y0, x1, y1 = (int(round(float(v))) for v in box)
        x0, x1 = max(0, min(x0, x1)), min(w, max(x0, x1))
        y0, y1 = max(0, min(y0, y1)), min(h, max(y0, y1))
        mask[y0:y1, x0:x1] = True
    return mask


def mask_from_box(box, image_hw) -> MaskResult:
    return MaskResult(validate_mask(boxes_to_mask([box], image_hw), image_hw, what="The box mask"), source="box")


def read_voc_boxes(xml_path, classes=None) -> tuple:
    """Pascal VOC annotation -> ((width, height), [(class name, (x0, y0, x1, y1))]).

    VOC boxes are 1-based inclusive pixel indices; they are returned as 0-based [x0, x1) half-open boxes."""
    root = ET.parse(xml_path).getroot()
    size = root.find("size")
    width = int(float(size.findtext("width"))) if size is not None else None
    height = int(float(size.findtext("height"))) if size is not None else None
    boxes = []
    for obj in root.iter("object"):
        name = (obj.findtext("name") or "").strip()
        if classes and name not in classes:
            continue
        bb = obj.find("bndbox")
        if bb is None:
            continue
        x0, y0, x1, y1 = (float(bb.findtext(k)) for k in ("xmin", "ymin", "xmax", "ymax"))
        boxes.append((name, (max(0.0, x0 - 1), max(0.0, y0 - 1), x1, y1)))
    return (width, height), boxes


def build_bccd_mask_set(bccd_root, out_dir, *, split: str = "test", classes=("WBC",), size: int = 64,
                        context: float = 2.0, jitter: float = 0.25, seed: int = 0, limit: int | None = None) -> dict:
    """A mask set of crops around BCCD cells, the cell's VOC box as the (coarse) mask.

    For every box of `classes` in the split's images: a square window of side `context` x the box's longer side,
    centred on the box and shifted at random by up to `jitter` x side (so the cell is not always centred),
    clipped to the image, resized to `size`; the box inside that window is the mask. Labels are -1
    (BCCD has no cell subtype labels): CAMAL uses the base model's prediction as the target class.
    """
    bccd_root = Path(bccd_root)
    if (bccd_root / "BCCD").is_dir():
        bccd_root = bccd_root / "BCCD"
    ids_file = bccd_root / "ImageSets" / "Main" / f"{split}.txt"
    if ids_file.exists():
        ids = [line.strip() for line in ids_file.read_text().split() if line.strip()]
    else:
        ids = sorted(p.stem for p in (bccd_root / "Annotations").glob("*.xml"))
    rng = np.random.default_rng(seed)
    items = []
    for image_id in ids:
        xml = bccd_root / "Annotations" / f"{image_id}.xml"
        jpg = bccd_root / "JPEGImages" / f"{image_id}.jpg"
        if not xml.exists() or not jpg.exists():
            continue
        (_, _), boxes = read_voc_boxes(xml, classes)
        if not boxes:
            continue
        with Image.open(jpg) as handle:
            image = handle.convert("RGB")
        w, h = image.size
        for index, (_, (x0, y0, x1, y1)) in enumerate(boxes):
            side = min(max(x1 - x0, y1 - y0) * context, w, h)
            cx = (x0 + x1) / 2 + rng.uniform(-jitter, jitter) * side
            cy = (y0 + y1) / 2 + rng.uniform(-jitter, jitter) * side
            left = int(round(min(max(cx - side / 2, 0), w - side)))
            top = int(round(min(max(cy - side / 2, 0), h - side)))
            side_px = int(round(side))
            crop = image.crop((left, top, left + side_px, top + side_px)).resize((size, size), Image.BICUBIC)
            scale = size / side_px
            box = ((x0 - left) * scale, (y0 - top) * scale, (x1 - left) * scale, (y1 - top) * scale)
            mask = boxes_to_mask([box], (size, size))
            if not mask.any() or mask.all():
                continue
            items.append((f"{image_id}_{index}.png", np.asarray(crop), mask, -1, "voc-box"))
            if limit and len(items) >= limit:
                break
        if limit and len(items) >= limit:
            break
    write_mask_set(out_dir, items)
    return {"out": str(out_dir), "count": len(items), "split": split, "classes": list(classes)}


# ------------------------------------------------------------------------------------------ mask sets
def write_mask_set(out_dir, items) -> Path:
    """Write images, masks, `labels.csv` and `masks.csv`.

    `items`: iterable of (file name, H x W x 3 uint8 image, H x W bool mask, class index[, mask source]).
    Images go to `images/` (PNG: lossless, so decoy colours stay exact), masks to `masks/` (PNG, 0/255)."""
    out_dir = Path(out_dir)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    (out_dir / "masks").mkdir(parents=True, exist_ok=True)
    rows = []
    for item in items:
        name, image, mask, label = item[:4]
        source = item[4] if len(item) > 4 else ""
        image = np.asarray(image, dtype=np.uint8)
        mask = validate_mask(mask, image.shape[:2], what=f"The mask of {name}")
        stem = Path(name).stem
        image_file, mask_file = f"images/{stem}.png", f"masks/{stem}.png"
        Image.fromarray(image).save(out_dir / image_file)
        Image.fromarray(mask.astype(np.uint8) * 255).save(out_dir / mask_file)
        rows.append((image_file, mask_file, int(label), source))
    with (out_dir / "masks.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["file", "mask_file", "class_index", "mask_source"])
        writer.writerows(rows)
    with (out_dir / "labels.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["file", "class_index"])
        writer.writerows((row[0], row[2]) for row in rows)
    return out_dir


@dataclass
class MaskSet:
    """Images (N x 3 x H x W uint8), masks (N x H x W bool) and labels (N, -1 = unlabelled), in csv order."""

    images: torch.Tensor
    masks: torch.Tensor
    labels: torch.Tensor
    files: list
    root: str = ""

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, index) -> "MaskSet":
        index = torch.as_tensor(index, dtype=torch.long)
        return MaskSet(self.images[index], self.masks[index], self.labels[index],
                       [self.files[i] for i in index.tolist()], self.root)

    def float_images(self, index=slice(None)) -> torch.Tensor:
        return self.images[index].float() / 255


def _safe_relative(name: str, what: str) -> str:
    if Path(name).is_absolute() or ".." in Path(name).parts:
        raise MaskError(f"masks.csv names a {what} outside its folder: {name}")
    return name


def find_masks_csv(path) -> Path:
    path = Path(path)
    candidate = path if path.suffix == ".csv" else path / "masks.csv"
    if not candidate.exists():
        raise FileNotFoundError(f"No mask set at {path}: expected a folder with masks.csv "
                                "(columns file,mask_file,class_index) or the masks.csv itself")
    return candidate


def load_mask_set(masks, data=None, *, image_hw=None, limit: int | None = None) -> MaskSet:
    """Read a mask set (see the module docstring). Images and masks are resized to `image_hw` if given
    (bilinear / nearest); a mask whose size differs from its image, or that is empty or full (also after the
    resize), is refused with its file name."""
    masks_csv = find_masks_csv(masks)
    mask_root = masks_csv.parent
    data_root = Path(data) if data else mask_root
    with masks_csv.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = {"file", "mask_file", "class_index"} - set(reader.fieldnames or [])
        if missing:
            raise MaskError(f"{masks_csv} lacks the column(s) {', '.join(sorted(missing))} "
                            "(expected file,mask_file,class_index)")
        rows = list(reader)
    if limit:
        rows = rows[:limit]
    if not rows:
        raise MaskError(f"{masks_csv} lists no images")
    images, mask_list, labels, files = [], [], [], []
    for row in rows:
        image_path = data_root / _safe_relative(row["file"], "file")
        mask_path = mask_root / _safe_relative(row["mask_file"], "mask file")
        image = load_image(image_path)  # as the app showed it when the mask was drawn (EXIF rotation, alpha)
        with Image.open(mask_path) as handle:
            mask = np.asarray(handle.convert("L")) > 0
        validate_mask(mask, (image.size[1], image.size[0]), what=f"The mask {row['mask_file']}")
        if image_hw is not None and (image.size[1], image.size[0]) != tuple(image_hw):
            image = image.resize((image_hw[1], image_hw[0]), Image.BILINEAR)
            mask = validate_mask(resize_mask(mask, image_hw), image_hw,
                                 what=f"The mask {row['mask_file']} resized to {image_hw[0]} x {image_hw[1]}")
        images.append(torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1))
        mask_list.append(torch.from_numpy(mask))
        labels.append(int(row["class_index"]))
        files.append(row["file"])
    return MaskSet(torch.stack(images), torch.stack(mask_list), torch.tensor(labels, dtype=torch.long), files,
                   str(mask_root))


# ------------------------------------------------------------------------------------------ SAM
def _as_rgb_uint8(image) -> np.ndarray:
    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"))
    if isinstance(image, torch.Tensor):
        from .images import image_to_uint8
        return image_to_uint8(image)
    array = np.asarray(image)
    if array.ndim != 3 or array.shape[2] != 3 or array.dtype != np.uint8:
        raise MaskError(f"Expected an H x W x 3 uint8 RGB image, got {array.dtype} with shape {tuple(array.shape)}")
    return array


def _prompt_arrays(points, point_labels, box):
    coords = labels = box_array = None
    if points is not None and len(points):
        coords = np.asarray(points, dtype=np.float32).reshape(-1, 2)  # (x, y) = (column, row)
        labels = (np.ones(len(coords), dtype=np.int64) if point_labels is None
                  else np.asarray(point_labels, dtype=np.int64).reshape(-1))
        if len(labels) != len(coords):
            raise MaskError(f"{len(coords)} points but {len(labels)} point labels (1 = object, 0 = background)")
    if box is not None:
        box_array = np.asarray(box, dtype=np.float32).reshape(4)
    if coords is None and box_array is None:
        raise MaskError("Click at least one point on the object, or draw a box around it.")
    return coords, labels, box_array


class SegmenterImage:
    """One image whose SAM embedding is computed; `segment` runs only the prompt encoder and mask decoder."""

    def __init__(self, segmenter, predictor, image: np.ndarray, key: str):
        self.segmenter, self.predictor, self.image, self.key = segmenter, predictor, image, key
        self.lock = threading.Lock()

    @property
    def hw(self) -> tuple:
        return self.image.shape[:2]

    def segment(self, points=None, point_labels=None, box=None, *, multimask: bool = True,
                validate: bool = True) -> MaskResult:
        """SAM's mask for these prompts: points N x 2 as (x, y) image pixels, labels 1 = object / 0 = background,
        box [x0, y0, x1, y1]. The best-scoring candidate that is neither empty nor full is returned."""
        coords, labels, box_array = _prompt_arrays(points, point_labels, box)
        with self.lock, torch.inference_mode():
            masks, scores, _ = self.predictor.predict(point_coords=coords, point_labels=labels, box=box_array,
                                                      multimask_output=multimask)
        order = np.argsort(-scores)
        candidates = [(np.asarray(masks[i], dtype=bool), float(scores[i])) for i in order]
        usable = [c for c in candidates if c[0].any() and not c[0].all()]
        if not validate:
            best = (usable or candidates)[0]
            return MaskResult(best[0], self.segmenter.label, best[1], candidates)
        if not usable:
            raise MaskError(f"{self.segmenter.label} found no usable region at these prompts (every candidate "
                            "was empty or the whole image): add object/background clicks or draw a box.")
        mask, score = usable[0]
        return MaskResult(validate_mask(mask, self.hw), self.segmenter.label, score, candidates)


class SamSegmenter:
    """A SAM model (segment-anything's `Sam`, or MobileSAM's) ready to prepare images."""

    is_sam = True

    def __init__(self, sam_model, label: str = "SAM", predictor_cls=None):
        if predictor_cls is None:
            from segment_anything import SamPredictor as predictor_cls
        self.model, self.label, self.predictor_cls = sam_model.eval(), label, predictor_cls
        self.embeddings_computed = 0
        self._lock = threading.Lock()

    def prepare(self, image) -> SegmenterImage:
        """Compute the image embedding (the expensive part: ~2 s MobileSAM, ~22 s ViT-B on 2 CPU cores)."""
        array = _as_rgb_uint8(image)
        predictor = self.predictor_cls(self.model)
        with self._lock, torch.inference_mode():
            predictor.set_image(array, image_format="RGB")
            self.embeddings_computed += 1
        return SegmenterImage(self, predictor, array, image_digest(array))


class GrabCutSegmenter:
    """The offline fallback: OpenCV GrabCut seeded by the same prompts. Not SAM, and labelled so.

    Seeds: a box -> outside it is background, inside probable foreground; object points -> sure foreground
    disks (radius 2% of the image's shorter side) inside probable-foreground disks (radius 15%); background
    points -> sure background disks. With points and no box, the image border is probable background."""

    is_sam = False
    label = GRABCUT_LABEL

    def __init__(self, iterations: int = 5, reason: str = ""):
        self.iterations, self.reason = iterations, reason
        self.embeddings_computed = 0

    def prepare(self, image) -> SegmenterImage:
        array = _as_rgb_uint8(image)
        return SegmenterImage(self, _GrabCutPredictor(array, self.iterations), array, image_digest(array))


class _GrabCutPredictor:
    """SamPredictor's `predict` signature over cv2.grabCut."""

    def __init__(self, image: np.ndarray, iterations: int):
        self.image, self.iterations = image, iterations

    def predict(self, point_coords=None, point_labels=None, box=None, multimask_output=True):
        import cv2

        h, w = self.image.shape[:2]
        seed = np.full((h, w), cv2.GC_PR_BGD, dtype=np.uint8)
        if box is not None:
            seed[:] = cv2.GC_BGD
            region = boxes_to_mask([box], (h, w))
            seed[region] = cv2.GC_PR_FGD
        small, large = max(1, int(round(0.02 * min(h, w)))), max(2, int(round(0.15 * min(h, w))))
        if point_coords is not None:
            if box is None:
                border = max(1, int(round(0.02 * min(h, w))))
                seed[:border], seed[-border:], seed[:, :border], seed[:, -border:] = (cv2.GC_BGD,) * 4
                for (x, y), label in zip(point_coords, point_labels):
                    if label > 0:
                        cv2.circle(seed, (int(round(x)), int(round(y))), large, int(cv2.GC_PR_FGD), -1)
            for (x, y), label in zip(point_coords, point_labels):
                value = cv2.GC_FGD if label > 0 else cv2.GC_BGD
                cv2.circle(seed, (int(round(x)), int(round(y))), small, int(value), -1)
        seeded = np.isin(seed, (cv2.GC_FGD, cv2.GC_PR_FGD))
        mask = seed.copy()
        background_model, foreground_model = np.zeros((1, 65), np.float64), np.zeros((1, 65), np.float64)
        try:
            if seeded.any() and not seeded.all():
                cv2.grabCut(cv2.cvtColor(self.image, cv2.COLOR_RGB2BGR), mask, None, background_model,
                            foreground_model, self.iterations, cv2.GC_INIT_WITH_MASK)
            result = np.isin(mask, (cv2.GC_FGD, cv2.GC_PR_FGD))
        except cv2.error:
            result = seeded  # GrabCut needs both classes in the seeds; the seed region is the honest answer
        if not result.any() or result.all():
            result = seeded
        masks = np.stack([result, seeded])
        scores = np.array([1.0, 0.5], dtype=np.float32)
        return masks, scores, None


def _sam_weights(variant: str, cache_dir=None) -> Path:
    from huggingface_hub import hf_hub_download

    repo, filename, _, label = SAM_WEIGHTS[variant]
    if cache_dir is None:
        from .models import HUB_CACHE_DIR
        cache_dir = HUB_CACHE_DIR
    try:
        return Path(hf_hub_download(repo, filename, cache_dir=str(cache_dir), local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached: try the network below
        pass
    try:
        return Path(hf_hub_download(repo, filename, cache_dir=str(cache_dir)))
    except Exception as error:  # noqa: BLE001 - offline, blocked, missing: all mean "no SAM here"
        raise SamUnavailableError(
            f"{label} weights ({repo}/{filename}) are not cached in {cache_dir} and could not be downloaded "
            f"from the HuggingFace hub: {type(error).__name__}: {str(error)[:200]}") from error


def load_sam(variant: str = "auto", device=None, cache_dir=None) -> SamSegmenter:
    """Build SAM with hub weights. `variant`: 'auto' (ViT-B on GPU; on CPU MobileSAM when the `mobile_sam`
    package is installed, else ViT-B), 'vit_b' or 'mobile_sam'. Raises SamUnavailableError, fast, offline."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if variant == "auto":
        variant = "vit_b"
        if device.type == "cpu":
            try:
                importlib.import_module("mobile_sam")  # MobileSAM's package: TinyViT encoder, same predictor API
                variant = "mobile_sam"
            except ImportError:
                pass
    if variant not in SAM_WEIGHTS:
        raise ValueError(f"Unknown SAM variant {variant!r}: choose auto, {', '.join(SAM_WEIGHTS)}")
    _, _, registry_key, label = SAM_WEIGHTS[variant]
    if variant == "mobile_sam":
        try:
            from mobile_sam import SamPredictor, sam_model_registry
        except ImportError as error:
            raise SamUnavailableError("MobileSAM needs the `mobile_sam` package (MobileSAM's own repository); "
                                      "segment-anything 1.0 has no TinyViT encoder.") from error
    else:
        from segment_anything import SamPredictor, sam_model_registry
    path = _sam_weights(variant, cache_dir)
    model = sam_model_registry[registry_key]()
    state = torch.load(path, map_location="cpu", weights_only=True)  # a plain state dict
    model.load_state_dict(state)
    return SamSegmenter(model.to(device), label=label, predictor_cls=SamPredictor)


def get_segmenter(variant: str = "auto", device=None, cache_dir=None):
    """SAM if it can be had here, else the GrabCut fallback (whose `.reason` says why)."""
    try:
        return load_sam(variant, device, cache_dir)
    except SamUnavailableError as error:
        return GrabCutSegmenter(reason=str(error))


class SegmenterCache:
    """Prepared images (embeddings) per session, least recently used dropped first.

    `get(image, session)` returns the session's SegmenterImage for this image, computing the embedding only when
    the session shows a new image. One entry per session; at most `max_sessions` sessions."""

    def __init__(self, segmenter, max_sessions: int = 4):
        self.segmenter, self.max_sessions = segmenter, max_sessions
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, image, session: str = "default") -> SegmenterImage:
        array = _as_rgb_uint8(image)
        key = image_digest(array)
        with self._lock:
            entry = self._entries.get(session)
            if entry is not None and entry.key == key:
                self._entries.move_to_end(session)
                return entry
        prepared = self.segmenter.prepare(array)
        with self._lock:
            self._entries[session] = prepared
            self._entries.move_to_end(session)
            while len(self._entries) > self.max_sessions:
                self._entries.popitem(last=False)
        return prepared

    def discard(self, session: str) -> None:
        with self._lock:
            self._entries.pop(session, None)

    def __len__(self) -> int:
        return len(self._entries)


def segment(image, points=None, point_labels=None, box=None, *, segmenter=None, cache: SegmenterCache | None = None,
            session: str = "default") -> MaskResult:
    """One call for an app handler: reuse `cache`'s embedding for this session's image, else prepare it."""
    if cache is not None:
        prepared = cache.get(image, session)
    else:
        prepared = (segmenter or get_segmenter()).prepare(image)
    return prepared.segment(points, point_labels, box)


def add_bccd_masks_parser(commands) -> None:
    """`python -m explainers bccd-masks --root .../bccd --out DIR [--split test]`: a BCCD box mask set."""
    parser = commands.add_parser("bccd-masks", help="a mask set of crops around BCCD cells, their VOC boxes as masks")
    parser.add_argument("--root", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--classes", default="WBC", help="comma-separated VOC classes")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--context", type=float, default=2.0)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(handler=cmd_bccd_masks)


def cmd_bccd_masks(args) -> int:
    import json

    info = build_bccd_mask_set(args.root, args.out, split=args.split, classes=tuple(args.classes.split(",")),
                               size=args.size, context=args.context, seed=args.seed, limit=args.limit)
    print(json.dumps(info))
    return 0
