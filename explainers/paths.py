"""Where user data lives: models a user imports or fine-tunes, mask sets, data sets and databases go to a data
folder outside the code, never into the tracked `weights/` (which holds only the shipped models).

    SALIENCY_DATA_DIR        if set
    /data/saliency-lab       on a HuggingFace Space with persistent storage (/data exists and is writable)
    ~/.local/share/saliency-lab   otherwise (XDG_DATA_HOME respected)
"""
from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """The user-data folder (created on first use)."""
    configured = os.environ.get("SALIENCY_DATA_DIR")
    if configured:
        folder = Path(configured).expanduser()
    elif Path("/data").is_dir() and os.access("/data", os.W_OK):
        folder = Path("/data") / "saliency-lab"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
        folder = base / "saliency-lab"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def user_dir(kind: str) -> Path:
    """A sub-folder of the data folder: 'models', 'mask-sets', 'datasets', 'jobs', 'reviews'."""
    if kind not in ("models", "mask-sets", "datasets", "jobs", "reviews"):
        raise ValueError(f"Unknown kind of user data '{kind}'")
    folder = data_dir() / kind
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def user_models_dir() -> Path:
    """Imported and fine-tuned models (safetensors + JSON card), listed by the model zoo next to the shipped ones."""
    return user_dir("models")
