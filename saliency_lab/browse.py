"""Browsing labelled image folders safely: which folders may be opened, pages of thumbnails, one image by index.

    choices, value = dataset_menu()                     # the catalogue's data sets (saliency_lab.datasets), a value
    folder = resolve_dataset_choice("bloodmnist-cells") # a name (off a Space also an allowed path), or ValueError
    page = browse("bloodmnist-cells", class_filter="3", page=1)
    page.items[0]                                        # (PIL image, class name)
    picture = pick("bloodmnist-cells", page.indices[0])

A public app must not browse the server's disk: every folder is resolved (symlinks and `..` included) and must
lie inside `data_roots()`: SALIENCY_LAB_DATA_ROOTS (os.pathsep-separated), else assets/, data/ and
../shared/data, plus SALIENCY_LAB_DECOY_DIR. Relative paths are taken from the project root. Errors are ValueError / FileNotFoundError with a message for the user.
"""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path

from explainers.data import class_names_for
from explainers.data import open_dataset

from . import datasets
from .datasets import ASSETS, ROOT, SHARED_DATA, user_datasets

PAGE = 48  # thumbnails per page (the Explain tab's browser and the review gallery)


def data_roots() -> list:
    """Folders whose data sets the app may open (a public Space must not browse the whole disk):
    SALIENCY_LAB_DATA_ROOTS (os.pathsep-separated), else assets/, data/ and ../shared/data; plus
    SALIENCY_LAB_DECOY_DIR. Resolved absolute paths."""
    configured = [Path(p) for p in os.environ.get("SALIENCY_LAB_DATA_ROOTS", "").split(os.pathsep) if p]
    roots = configured or [ASSETS, ROOT / "data", SHARED_DATA, user_datasets()]
    roots += [Path(p) for p in os.environ.get("SALIENCY_LAB_DECOY_DIR", "").split(os.pathsep) if p]
    return [root.expanduser().resolve() for root in roots]


def inside(path, roots) -> bool:
    """True when `path` (resolved: symlinks and `..` followed) is one of `roots` or lies below one."""
    path = Path(path).expanduser().resolve()
    return any(path == Path(r).resolve() or Path(r).resolve() in path.parents for r in roots)


def resolve_folder(folder, roots=None) -> Path:
    """The data folder (or .npz) as an absolute path inside the allowed data roots (default `data_roots()`).
    ValueError when it is empty or outside them, FileNotFoundError when it does not exist."""
    folder = str(folder or "").strip()
    if not folder:
        raise ValueError("Type the path of a labelled folder (with labels.csv) or a MedMNIST .npz file.")
    path = Path(folder).expanduser()
    if not path.is_absolute():
        path = ROOT / path
    path = path.resolve()
    roots = data_roots() if roots is None else [Path(r).expanduser().resolve() for r in roots]
    if not inside(path, roots):
        raise ValueError(f"The folder {folder} is outside the data folders this app may open: "
                         f"{', '.join(str(r) for r in roots)} (set SALIENCY_LAB_DATA_ROOTS to allow others).")
    if not path.exists():
        raise FileNotFoundError(f"The folder {folder} does not exist on the server.")
    return path


def open_folder(folder, roots=None):
    """The data set (explainers.data) of a named data set or an allowed folder; see `resolve_dataset_choice`."""
    return open_dataset(resolve_dataset_choice(folder, roots))


def class_names(folder, dataset) -> list:
    """The class names of a folder (classes.txt beside it or above it), else "0", "1", ... for its labels."""
    names = class_names_for(folder) if Path(folder).is_dir() else None
    count = max(dataset.labels) + 1 if len(dataset) else 0
    return names if names and len(names) >= count else [str(i) for i in range(count)]


def class_filter_choices(names) -> list:
    """[(label, value)] for a class filter menu: "all", then "i: name" -> "i"."""
    return [("All classes", "all")] + [(f"{i}: {n}", str(i)) for i, n in enumerate(names)]


def wants_all(class_filter) -> bool:
    return class_filter in (None, "", "all")


@dataclass
class BrowsePage:
    """One page of thumbnails: `items` [(PIL image, class name)], their data-set `indices`, a one-line `info`."""

    items: list
    indices: list
    info: str
    names: list
    page: int
    pages: int
    class_choices: list = field(default_factory=list)


def browse(folder, class_filter="all", page=1, *, page_size: int = PAGE, roots=None) -> BrowsePage:
    """Thumbnails of one page of a named data set (or an allowed folder, off a Space), filtered by class ("all"
    or a class index)."""
    path = resolve_dataset_choice(folder, roots)
    dataset = open_dataset(path)
    names = class_names(path, dataset)
    indices = [i for i, label in enumerate(dataset.labels)
               if wants_all(class_filter) or int(label) == int(class_filter)]
    pages = max(1, (len(indices) + page_size - 1) // page_size)
    page = min(max(1, int(page or 1)), pages)
    shown = indices[(page - 1) * page_size: page * page_size]
    items = [(dataset.image(i), f"{names[int(dataset.labels[i])]}") for i in shown]
    info = f"{len(indices)} images{'' if wants_all(class_filter) else ' in this class'}; page {page} of {pages}."
    return BrowsePage(items, shown, info, names, page, pages, class_filter_choices(names))


def pick(folder, index, roots=None):
    """The image (PIL) at data-set position `index` of an allowed folder (the API form of a gallery click)."""
    dataset = open_folder(folder, roots)
    index = int(index)
    if not 0 <= index < len(dataset):
        raise ValueError(f"No image {index} in this folder (it has {len(dataset)}).")
    return dataset.image(index)


def examples_list() -> tuple:
    """(blood cell examples: one per class, photo examples) shipped in assets/, as file paths."""
    cells = []
    labels = ASSETS / "bloodmnist" / "labels.csv"
    if labels.exists():
        seen = set()
        with labels.open(newline="") as handle:
            for row in csv.DictReader(handle):
                if row["class_index"] not in seen:  # one per class
                    seen.add(row["class_index"])
                    cells.append(str(ASSETS / "bloodmnist" / row["file"]))
    photos = sorted(str(p) for p in (ASSETS / "photos").glob("*.jpg"))
    return cells, photos


def example_labels(cells, photos) -> tuple:
    """(the class name of each cell example, from assets/bloodmnist's labels.csv and classes.txt; each photo's
    name) for the example galleries' captions."""
    folder = ASSETS / "bloodmnist"
    names = class_names_for(folder) if (folder / "labels.csv").exists() else []
    index = {}
    if (folder / "labels.csv").exists():
        with (folder / "labels.csv").open(newline="") as handle:
            index = {row["file"]: int(row["class_index"]) for row in csv.DictReader(handle)}
    cell_labels = []
    for path in cells:
        k = index.get(Path(path).name)
        cell_labels.append(names[k] if k is not None and k < len(names) else Path(path).stem)
    return cell_labels, [Path(p).stem.replace("-", " ") for p in photos]


def on_space() -> bool:
    """Whether the app runs on a HuggingFace Space (which sets SPACE_ID): no server paths are taken there."""
    return bool(os.environ.get("SPACE_ID"))


def dataset_name(folder) -> str | None:
    """The catalogue's name of the data set at `folder`, or None when it is none of them."""
    return datasets.name_of(folder)


def resolve_dataset_choice(value, roots=None) -> Path:
    """The folder of a data-set menu's value: a name of `dataset_choices()`; off a Space also a typed folder
    path inside the allowed data roots (`resolve_folder`; the advanced form, for scripts and tests). ValueError
    for anything else."""
    value = str(value or "").strip()
    if not value:
        raise ValueError("Pick a data set from the list.")
    looks_like_path = "/" in value or "\\" in value or value.startswith((".", "~"))
    if not looks_like_path:
        return Path(datasets.resolve(value)).resolve()
    if on_space():
        raise ValueError("Pick a data set from the list (or upload one in the review studies panel): this app "
                         "does not open folders by path on a Space.")
    return resolve_folder(value, roots)


def dataset_menu(data_dir=None) -> tuple:
    """(choices, value) of a data-set menu: `datasets.choices()`, the value the name of `data_dir` (default
    `default_data_dir()`). A `data_dir` with no name (a caller's own folder) is listed under its folder's name
    off a Space, and left out on one (the first named data set is picked)."""
    choices = datasets.choices()
    folder = data_dir or default_data_dir()
    name = dataset_name(folder)
    if name is not None:
        return choices, name
    if not on_space():
        return [(f"{Path(folder).name} (this server's folder)", str(folder))] + choices, str(folder)
    return choices, (choices[0][1] if choices else None)


def default_data_dir() -> str:
    """BloodMNIST's test split in ../shared when it exists, else the 24 cells shipped in assets/."""
    test_split = datasets.BLOODMNIST_SPLITS["bloodmnist-64-test"]
    if (test_split / "labels.csv").exists():
        return str(test_split.resolve())
    return str(ASSETS / "bloodmnist")


def dataset_key(folder) -> str:
    """A stable name for a data folder (its resolved path)."""
    return str(Path(folder).expanduser().resolve())


def filter_rows(rows: list, class_index=None, correctness: str = "all") -> list:
    """Rows (dicts with label/prediction) filtered by true class and by correct/incorrect."""
    out = []
    for row in rows:
        if class_index is not None and int(row["label"]) != int(class_index):
            continue
        correct = int(row["label"]) == int(row["prediction"])
        if correctness == "correct" and not correct:
            continue
        if correctness == "incorrect" and correct:
            continue
        out.append(row)
    return out
