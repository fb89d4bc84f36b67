"""The one catalogue of named data sets, for every tab and job: the Explain tab's browser, the quick review,
review studies and AHA training take labelled image sets; CAMAL fine-tuning takes mask sets. Menus show names,
never server paths.

    choices()                       # [(label, name)]: shipped cells, BloodMNIST's splits here, the data folder's
    resolve("bloodmnist-cells")     # its folder (or .npz); ValueError for anything that is not a listed name
    mask_set_choices()              # [(label, "ready:decoy" | "build:bccd" ...)]: ready-made mask sets
    ready_folder("decoy")           # a built mask set's folder (with masks.csv), or None
    image_count(folder)             # the images of a labelled folder (rows of its labels.csv)

Where they come from: the cells shipped in assets/, BloodMNIST's 64 px splits in the shared data folder when this
machine has it, and every labelled folder or MedMNIST .npz in the user's data folder (`user_datasets()`: uploads
from the Review tab, sets the app builds).
"""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "assets"
SHARED_DATA = ROOT / ".." / "shared" / "data"
SHIPPED = {"bloodmnist-cells": ASSETS / "bloodmnist"}
# BloodMNIST's splits of the shared data folder, when this machine has one (named: the path stays on the server)
BLOODMNIST_SPLITS = {f"bloodmnist-64-{split}": SHARED_DATA / "bloodmnist" / "64" / split
                     for split in ("train", "val", "test")}
ALIASES = {"bloodmnist-test": "bloodmnist-64-test"}  # the name the browser once gave the test split
BLOODMNIST_SOURCE = SHARED_DATA / "bloodmnist" / "64"
BCCD_SOURCE = SHARED_DATA / "bccd"
# ready-made mask sets: (label, folder under a decoy location, kind, the raw data it is built from)
READY_SETS = (("Decoy BloodMNIST, train (cell masks)", "decoy-bloodmnist/train", "decoy", BLOODMNIST_SOURCE / "train"),
              ("BCCD white-cell boxes", "bccd-masks", "bccd", BCCD_SOURCE))


def user_datasets() -> Path:
    """Data sets the app builds or receives (uploads, decoy BloodMNIST, BCCD masks): the user's data folder,
    outside the code."""
    from explainers.paths import user_dir

    return user_dir("datasets")


def decoy_locations() -> list:
    """Folders that may hold decoy BloodMNIST (`decoy-bloodmnist/`) and its models (`weights/`):
    SALIENCY_LAB_DECOY_DIR (os.pathsep-separated) first, then the user's data sets, data/, ../shared/data and
    the project root."""
    roots = [Path(p) for p in os.environ.get("SALIENCY_LAB_DECOY_DIR", "").split(os.pathsep) if p]
    return roots + [user_datasets(), ROOT / "data", SHARED_DATA, ROOT]


def image_count(folder) -> int:
    """Images listed in a labelled folder's labels.csv (0 when it cannot be read)."""
    try:
        with (Path(folder) / "labels.csv").open(newline="") as handle:
            return max(0, sum(1 for _ in handle) - 1)
    except OSError:
        return 0


def _labelled(folder: Path) -> bool:
    return (folder / "labels.csv").exists()


def catalogue() -> dict:
    """{name: (label, folder or .npz)} of every labelled image set here, in menu order."""
    out = {}
    for name, folder in SHIPPED.items():
        if _labelled(folder):
            out[name] = (f"{name} (shipped, {image_count(folder)} images)", folder)
    for name, folder in BLOODMNIST_SPLITS.items():
        if _labelled(folder):
            split = name.rsplit("-", 1)[1]
            out[name] = (f"BloodMNIST 64 px, {split} split ({image_count(folder)} images)", folder)
    root = user_datasets()
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if path.name.startswith(".") or path.name in out:
            continue
        if path.is_dir() and _labelled(path):
            out[path.name] = (f"{path.name} ({image_count(path)} images)", path)
        elif path.suffix == ".npz" and path.is_file():
            out[path.name] = (f"{path.name} (MedMNIST .npz)", path)
    return out


def choices() -> list:
    """[(label, name)] of every labelled image set, for a data-set menu."""
    return [(label, name) for name, (label, _) in catalogue().items()]


def resolve(name) -> Path:
    """The folder (or .npz) of a named data set; ValueError for a name that is not one (paths included)."""
    name = ALIASES.get(str(name or "").strip(), str(name or "").strip())
    if not name or name.startswith(".") or "/" in name or "\\" in name or ".." in name:
        raise ValueError("Pick a data set from the list (or upload one).")
    if name in SHIPPED or name in BLOODMNIST_SPLITS:
        folder = {**SHIPPED, **BLOODMNIST_SPLITS}[name]
        if _labelled(folder):
            return folder.resolve()
    path = user_datasets() / name
    if (path.is_dir() and _labelled(path)) or (path.suffix == ".npz" and path.is_file()):
        return path
    raise ValueError(f"There is no data set named '{name}': pick one from the list or upload it.")


def name_of(folder) -> str | None:
    """The catalogue's name of the data set at `folder`, or None when it is none of them."""
    path = Path(folder).expanduser().resolve()
    return next((name for name, (_, found) in catalogue().items() if Path(found).resolve() == path), None)


# ------------------------------------------------------------------------------------------------ mask sets
def ready_folder(kind: str, locations=None) -> Path | None:
    """The folder (with masks.csv) of a ready-made mask set ('decoy', 'bccd') in `locations` (default
    `decoy_locations()`), or None when it is not built here."""
    locations = decoy_locations() if locations is None else [Path(p) for p in locations]
    relative = next((rel for _, rel, k, _ in READY_SETS if k == kind), None)
    if relative is None:
        return None
    return next(((root / relative).resolve() for root in locations if (root / relative / "masks.csv").exists()),
                None)


def mask_set_choices(locations=None) -> list:
    """[(label, value)] of ready-made mask sets, by name (no server path): built ('ready:decoy', 'ready:bccd',
    found in `locations`, default `decoy_locations()`), or buildable from the raw data here ('build:decoy',
    'build:bccd')."""
    found = []
    for label, _, kind, source in READY_SETS:
        if ready_folder(kind, locations) is not None:
            found.append((label, f"ready:{kind}"))
        elif source.exists():
            found.append((f"{label}: build it now (takes a minute)", f"build:{kind}"))
    return found


def build_mask_set(kind: str, out_root=None) -> str:
    """Build decoy BloodMNIST (2,000 train images) or the BCCD box mask set under `out_root` (default the user's
    data-sets folder, outside the code); returns the folder to train on."""
    out_root = Path(out_root) if out_root is not None else user_datasets()
    sources = {k: source for _, _, k, source in READY_SETS}
    if kind in sources and not sources[kind].exists():  # a typed or stale choice: the menu offers it only if present
        raise ValueError(f"The {kind} mask set cannot be built on this server: its raw data is not here. Pick one "
                         "of the listed mask sets.")
    if kind == "decoy":
        from explainers.decoy import build_decoy_bloodmnist

        out = out_root / "decoy-bloodmnist"
        build_decoy_bloodmnist(BLOODMNIST_SOURCE, out, train_limit=2000, val_limit=400, test_limit=400)
        return str(out / "train")
    if kind == "bccd":
        from explainers.masks import build_bccd_mask_set

        out = out_root / "bccd-masks"
        build_bccd_mask_set(BCCD_SOURCE, out, split="trainval")
        return str(out)
    raise ValueError(f"Unknown data set {kind!r}.")
