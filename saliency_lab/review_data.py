"""Uploaded data sets, stored by name in the user-data folder, where the one catalogue of data sets
(`saliency_lab.datasets`) lists them for every tab and job.

    result = import_upload(["cells.zip"], "ward-7")   # zip with labels.csv, images, or a MedMNIST .npz
    result.loaded, result.skipped                     # 58, [("bad.png", "not an image ...")]

Every uploaded image goes through `explainers.images.load_image` (the Explain tab's checks: allowed decoders,
header-first pixel limit, minimum size) and is stored re-encoded as PNG; a bad file is listed and skipped, the
rest load. Limits (`UploadLimits`): files per upload, bytes per image, bytes in all, and for a zip the
uncompressed size (checked from the zip's directory before anything is read, so a zip bomb is refused). Uploads
land in `explainers.paths.user_dir("datasets")/<name>/` (images, labels.csv, classes.txt), never elsewhere:
the name is checked and every file is written under our own names.
"""
from __future__ import annotations

import csv
import io
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import numpy as np

from explainers.images import ImageError, load_image
from . import datasets
from .review_store import ReviewError, safe_set_name

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".gif", ".webp", ".ppm"}


@dataclass(frozen=True)
class UploadLimits:
    max_files: int = 2000
    max_image_bytes: int = 10_000_000
    max_total_bytes: int = 300_000_000
    max_pixels: int = 4_000_000


@dataclass
class ImportResult:
    """An imported data set: its `name`, `folder`, images `loaded`, `skipped` [(file, reason)], `labelled`."""

    name: str
    folder: Path
    loaded: int
    skipped: list = field(default_factory=list)
    labelled: bool = True

    def message(self) -> str:
        text = (f"Data set **{self.name}**: {self.loaded} image{'s' if self.loaded != 1 else ''} loaded"
                f"{'' if self.labelled else ' (no labels: predictions only)'}")
        if self.skipped:
            shown = "; ".join(f"{f}: {r}" for f, r in self.skipped[:10])
            more = f" and {len(self.skipped) - 10} more" if len(self.skipped) > 10 else ""
            text += f"; {len(self.skipped)} skipped: {shown}{more}"
        return text + "."


# ------------------------------------------------------------------------------------------------ uploads
class _Writer:
    """Collects validated images into a temporary folder beside the destination, then renames it into place."""

    def __init__(self, name: str, limits: UploadLimits):
        self.name = safe_set_name(name)
        self.limits = limits
        root = datasets.user_datasets()
        self.dest = root / self.name
        taken = self.name in datasets.catalogue() or self.name in datasets.ALIASES
        if taken or self.dest.exists() or (root / f"{self.name}.npz").exists():
            raise ReviewError(f"A data set named '{self.name}' exists already: choose another name.")
        self.tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{self.name}.upload-"))
        self.rows = []
        self.skipped = []
        self.used = set()
        self.total = 0

    def add(self, label: str, data, class_index: int) -> None:
        """Validate one image (encoded bytes or an array) and keep it as PNG; a bad one is listed as skipped."""
        if len(self.rows) >= self.limits.max_files:
            self.skipped.append((label, f"over the limit of {self.limits.max_files} images per upload"))
            return
        if isinstance(data, (bytes, bytearray)):
            if len(data) > self.limits.max_image_bytes:
                self.skipped.append((label, f"{len(data) / 1e6:.1f} MB is over the limit of "
                                            f"{self.limits.max_image_bytes / 1e6:.0f} MB per image"))
                return
            self.total += len(data)
            if self.total > self.limits.max_total_bytes:
                raise ReviewError(f"The upload is over the limit of {self.limits.max_total_bytes / 1e6:.0f} MB in "
                                  "all: split it into smaller data sets.")
        try:
            image = load_image(bytes(data) if isinstance(data, (bytes, bytearray)) else data,
                               max_bytes=self.limits.max_image_bytes, max_pixels=self.limits.max_pixels)
        except ImageError as error:
            self.skipped.append((label, str(error)))
            return
        stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in PurePosixPath(label).stem)[:60] or "image"
        file_name = f"{stem}.png"
        k = 1
        while file_name in self.used:
            k += 1
            file_name = f"{stem}-{k}.png"
        self.used.add(file_name)
        image.save(self.tmp / file_name, format="PNG")
        self.rows.append((file_name, int(class_index)))

    def finish(self, labelled: bool, class_names=None) -> ImportResult:
        if not self.rows:
            self.abort()
            reasons = "; ".join(f"{f}: {r}" for f, r in self.skipped[:5])
            raise ReviewError("No usable image in the upload" + (f" ({reasons})." if reasons else "."))
        with (self.tmp / "labels.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["file", "class_index"])
            writer.writerows(self.rows)
        if class_names:
            (self.tmp / "classes.txt").write_text("\n".join(class_names) + "\n")
        os.replace(self.tmp, self.dest)
        return ImportResult(self.name, self.dest, len(self.rows), self.skipped, labelled)

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def _read_labels(text: str, where: str) -> tuple:
    """{file: class_index} from a labels.csv text, and the rows it refused [(file, reason)]."""
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames or not {"file", "class_index"} <= {f.strip() for f in reader.fieldnames}:
        raise ReviewError(f"{where} needs the columns file,class_index (found: {', '.join(reader.fieldnames or [])}).")
    labels, refused = {}, []
    for row in reader:
        row = {k.strip(): (v or "").strip() for k, v in row.items() if k}
        try:
            index = int(row["class_index"])
            if index < 0:
                raise ValueError
        except ValueError:
            refused.append((row["file"] or "?", f"class_index {row['class_index']!r} in labels.csv is not a "
                                                "whole number >= 0"))
            continue
        labels[PurePosixPath(row["file"]).as_posix()] = index
    return labels, refused


def _import_zip(path: Path, writer: _Writer) -> ImportResult:
    limits = writer.limits
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise ReviewError(f"{path.name} is not a readable zip file.") from None
    with archive:
        members = [m for m in archive.infolist() if not m.is_dir() and not m.filename.startswith("__MACOSX/")
                   and not PurePosixPath(m.filename).name.startswith(".")]
        uncompressed = sum(m.file_size for m in members)
        if uncompressed > limits.max_total_bytes:
            raise ReviewError(f"{path.name} unpacks to {uncompressed / 1e6:.0f} MB, over the limit of "
                              f"{limits.max_total_bytes / 1e6:.0f} MB.")
        csvs = sorted((m for m in members if PurePosixPath(m.filename).name == "labels.csv"),
                      key=lambda m: len(PurePosixPath(m.filename).parts))
        if not csvs:
            raise ReviewError(f"{path.name} has no labels.csv (columns file,class_index): add one, or upload the "
                              "images themselves for predictions only.")
        base = PurePosixPath(csvs[0].filename).parent
        labels, refused = _read_labels(archive.read(csvs[0]).decode("utf-8-sig", errors="replace"), "labels.csv")
        writer.skipped.extend(refused)
        by_name = {}
        for member in members:
            relative = PurePosixPath(member.filename)
            try:
                relative = relative.relative_to(base) if str(base) != "." else relative
            except ValueError:
                continue
            by_name[relative.as_posix()] = member
        names_member = next((m for m in members if PurePosixPath(m.filename).name == "classes.txt"), None)
        class_names = None
        if names_member is not None:
            class_names = [x.strip() for x in archive.read(names_member).decode("utf-8", errors="replace")
                           .splitlines() if x.strip()]
        if len(labels) > limits.max_files:
            raise ReviewError(f"labels.csv lists {len(labels)} images, over the limit of {limits.max_files}.")
        for file_name, index in labels.items():
            member = by_name.get(file_name)
            if member is None:
                writer.skipped.append((file_name, "listed in labels.csv but not in the zip"))
                continue
            if member.file_size > limits.max_image_bytes:
                writer.skipped.append((file_name, f"{member.file_size / 1e6:.1f} MB is over the limit of "
                                                  f"{limits.max_image_bytes / 1e6:.0f} MB per image"))
                continue
            writer.add(file_name, archive.read(member), index)
    return writer.finish(True, class_names)


def _import_npz(path: Path, writer: _Writer) -> ImportResult:
    try:
        data = np.load(path, allow_pickle=False)
    except (ValueError, OSError, zipfile.BadZipFile):
        raise ReviewError(f"{path.name} is not a readable .npz file.") from None
    with data:
        keys = list(data.keys())
        split = next((s for s in ("test", "val", "train") if f"{s}_images" in keys), None)
        if split is None or f"{split}_labels" not in keys:
            raise ReviewError(f"{path.name} is not in the MedMNIST layout (test_images and test_labels, or val_/train_); "
                              f"keys: {', '.join(keys)}.")
        images, labels = data[f"{split}_images"], data[f"{split}_labels"].reshape(-1)
        if len(images) != len(labels):
            raise ReviewError(f"{path.name}: {len(images)} images but {len(labels)} labels.")
        if len(images) > writer.limits.max_files:
            raise ReviewError(f"{path.name} holds {len(images)} images, over the limit of {writer.limits.max_files}: "
                              "keep a subset.")
        for i, (array, label) in enumerate(zip(images, labels)):
            writer.add(f"{split}_{i:05d}", np.asarray(array), int(label))
    return writer.finish(True)


def import_upload(files, name: str, limits: UploadLimits | None = None) -> ImportResult:
    """Store an upload as the data set `name`: one .zip (images + labels.csv), one MedMNIST .npz, or image files
    (with a labels.csv among them, or without: predictions only). ReviewError for what cannot be used at all."""
    limits = limits or UploadLimits()
    paths = [Path(f) if isinstance(f, (str, os.PathLike)) else Path(f.name) for f in (files or []) if f]
    if not paths:
        raise ReviewError("Choose the files to upload: a zip with labels.csv, a MedMNIST .npz or images.")
    total = sum(p.stat().st_size for p in paths)
    if total > limits.max_total_bytes:
        raise ReviewError(f"The upload is {total / 1e6:.0f} MB, over the limit of {limits.max_total_bytes / 1e6:.0f} MB.")
    writer = _Writer(name, limits)
    try:
        archives = [p for p in paths if p.suffix.lower() in (".zip", ".npz")]
        if archives:
            if len(paths) != 1:
                raise ReviewError("Upload one zip or one .npz at a time (or image files without an archive).")
            return (_import_zip if archives[0].suffix.lower() == ".zip" else _import_npz)(archives[0], writer)
        # a picked folder brings its labels.csv, classes.txt and hidden files (.DS_Store) along with the images
        paths = [p for p in paths if not p.name.startswith(".")]
        names_files = [p for p in paths if p.name.lower() == "classes.txt"]
        class_names = None
        if names_files:
            class_names = [x.strip() for x in names_files[0].read_text(encoding="utf-8-sig", errors="replace")
                           .splitlines() if x.strip()] or None
            paths = [p for p in paths if p not in names_files]
        csv_files = [p for p in paths if p.name.lower().endswith(".csv")]
        if len(paths) - len(csv_files) > limits.max_files:
            raise ReviewError(f"{len(paths) - len(csv_files)} images is over the limit of {limits.max_files} "
                              "per upload: split them into several data sets.")
        labels = None
        if csv_files:
            labels, refused = _read_labels(csv_files[0].read_text(encoding="utf-8-sig", errors="replace"),
                                           csv_files[0].name)
            labels = {PurePosixPath(k).name: v for k, v in labels.items()}
            writer.skipped.extend(refused)
        for path in paths:
            if path in csv_files:
                continue
            display = path.name
            if labels is not None and display not in labels:
                writer.skipped.append((display, "not listed in labels.csv"))
                continue
            if path.stat().st_size > limits.max_image_bytes:
                writer.skipped.append((display, f"{path.stat().st_size / 1e6:.1f} MB is over the limit of "
                                                f"{limits.max_image_bytes / 1e6:.0f} MB per image"))
                continue
            writer.add(display, path.read_bytes(), labels[display] if labels is not None else -1)
        return writer.finish(labels is not None, class_names if labels is not None else None)
    except BaseException:
        writer.abort()
        raise

