"""Image sets: a folder with `labels.csv` (`file,class_index`), or a MedMNIST-layout npz; for evaluation (targets are
the model's predictions) also a plain folder of images without labels.

Both yield (image in [0, 1] as 3 x H x W float tensor, class index; UNLABELLED where there is none), in file order.
A folder's images are read by `explainers.images.load_image`, exactly as an upload of the same file: EXIF rotation
applied, transparency composed on white, 16-bit scaled, sizes checked.
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset


def spread_indices(total: int, limit: int | None) -> list:
    """`limit` indices spread evenly over 0..total-1 (every k-th item, first included), in order.

    Data files are often sorted by class (BloodMNIST's labels.csv is): taking the first N would evaluate a
    few classes only; an even spread keeps every class in proportion and stays deterministic."""
    if not limit or limit >= total:
        return list(range(total))
    return sorted({int(round(i * (total - 1) / max(1, limit - 1))) for i in range(limit)}) if limit > 1 else [0]


UNLABELLED = -1
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".webp", ".bmp", ".gif")


class LabelledFolder(Dataset):
    """A folder of images with labels.csv, processed in the csv's order (`limit`: an even spread, see
    `spread_indices`). With `require_labels=False` a folder without labels.csv is read too: its image files
    (IMAGE_SUFFIXES, not sub-folders) in name order, each labelled UNLABELLED."""

    def __init__(self, root, transform=None, limit: int | None = None, require_labels: bool = True):
        self.root = Path(root)
        labels = self.root / "labels.csv"
        if labels.exists():
            with labels.open(newline="") as handle:
                rows = [(r["file"], int(r["class_index"])) for r in csv.DictReader(handle)]
        elif require_labels:
            raise FileNotFoundError(f"{self.root} has no labels.csv (expected columns: file,class_index)")
        else:
            rows = [(f.name, UNLABELLED) for f in sorted(self.root.iterdir())
                    if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES]
            if not rows:
                raise FileNotFoundError(f"{self.root} has no labels.csv and no images "
                                        f"({', '.join(IMAGE_SUFFIXES)})")
        for file_name, _ in rows:
            if Path(file_name).is_absolute() or ".." in Path(file_name).parts:
                raise ValueError(f"labels.csv names a path outside the folder: {file_name}")
        self.items = [rows[i] for i in spread_indices(len(rows), limit)]
        self.transform = transform

    def __len__(self):
        return len(self.items)

    @property
    def labels(self) -> list:
        return [label for _, label in self.items]

    def path(self, index: int) -> Path:
        return self.root / self.items[index][0]

    def image(self, index: int) -> Image.Image:
        from .images import load_image

        return load_image(self.path(index))  # what the app shows and explains for the same file

    def __getitem__(self, index):
        image = self.image(index)
        tensor = self.transform(image) if self.transform else pil_to_tensor(image)
        return tensor, self.items[index][1]


class NpzSplit(Dataset):
    """MedMNIST's npz layout: keys `{split}_images` (N x H x W [x 3] uint8) and `{split}_labels` (N x 1)."""

    def __init__(self, path, split: str = "test", transform=None, limit: int | None = None):
        with np.load(path, allow_pickle=False) as data:
            key = f"{split}_images"
            if key not in data:
                raise KeyError(f"{path} has no '{key}'; keys: {sorted(data.keys())}")
            keep = spread_indices(len(data[key]), limit)
            self.split, self.indices = split, keep
            self.images = data[key][keep]
            self.labels = data[f"{split}_labels"].reshape(-1)[keep].astype(int)
        self.transform = transform

    def __len__(self):
        return len(self.images)

    def image(self, index: int) -> Image.Image:
        array = self.images[index]
        return Image.fromarray(array).convert("RGB")

    def __getitem__(self, index):
        image = self.image(index)
        tensor = self.transform(image) if self.transform else pil_to_tensor(image)
        return tensor, int(self.labels[index])


def item_names(dataset) -> list:
    """A name per item, in order: the file name for a folder, `{split}_images[i]` (i in the whole split) for an npz."""
    if hasattr(dataset, "items"):
        return [file_name for file_name, _ in dataset.items]
    if hasattr(dataset, "indices"):
        return [f"{dataset.split}_images[{i}]" for i in dataset.indices]
    return [str(i) for i in range(len(dataset))]


def pil_to_tensor(image: Image.Image) -> torch.Tensor:
    array = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def open_dataset(path, split: str = "test", transform=None, limit: int | None = None,
                 require_labels: bool = True) -> Dataset:
    """A folder with labels.csv (or its `split` sub-folder with one), or a MedMNIST npz's `split`. With
    `require_labels=False` a plain folder of images is taken too (LabelledFolder; labels UNLABELLED)."""
    path = Path(path)
    if path.suffix == ".npz":
        return NpzSplit(path, split=split, transform=transform, limit=limit)
    if path.is_dir():
        if split_read(path, split):
            path = path / split
        return LabelledFolder(path, transform=transform, limit=limit, require_labels=require_labels)
    raise FileNotFoundError(f"No data set at {path}: expected a folder with labels.csv or a .npz file")


def split_read(path, split: str) -> str | None:
    """The split `open_dataset(path, split)` reads, or None where the path is itself the images' folder (the split
    is then whatever that folder holds, and a report should not name the default it was not given)."""
    path = Path(path)
    if path.suffix == ".npz":
        return split
    return split if not (path / "labels.csv").exists() and (path / split / "labels.csv").exists() else None


def model_batches(dataset, bundle, indices=None, batch_size: int = 64):
    """Yields (indices, B x 3 x H x W on the bundle's device): a data set's images in batches, each prepared as the
    app prepares an upload of the file (`images.prepare_image`)."""
    from .images import prepare_image

    indices = list(range(len(dataset))) if indices is None else list(indices)
    for start in range(0, len(indices), batch_size):
        chunk = indices[start:start + batch_size]
        tensors = [prepare_image(dataset.image(i), bundle.input_size, bundle.crop_pct, bundle.interpolation)[0][0]
                   for i in chunk]
        yield chunk, torch.stack(tensors).to(bundle.device)


def mean_colour(dataset: Dataset, limit: int = 2000) -> tuple:
    """The data set's mean RGB in [0, 1]: the default deletion/insertion reference."""
    total = torch.zeros(3)
    count = min(limit, len(dataset))
    for index in range(count):
        image, _ = dataset[index]
        total += image.mean(dim=(1, 2))
    return tuple((total / max(count, 1)).tolist())


def class_names_for(folder) -> list | None:
    """The class names in classes.txt beside a data folder or up to two levels above it, else None."""
    folder = Path(folder)
    for candidate in (folder / "classes.txt", folder.parent / "classes.txt", folder.parent.parent / "classes.txt"):
        if candidate.exists():
            return [line.strip() for line in candidate.read_text().splitlines() if line.strip()]
    return None
