"""Writing files atomically: the one helper every writer uses (checkpoints, cards, job records).

    atomic_write_bytes(path, data)   # unique temp file beside it, fsync, os.replace
    atomic_write_text(path, text)    # the same for text
    atomic_torch_save(obj, path)     # torch.save through the same path

Every writer takes the destination first (as `Path.write_text` takes its text after the path's own object).
"""
from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path


def atomic_write_bytes(path, data: bytes) -> None:
    """Unique temp file in the same folder, fsync, os.replace: readers see the old file or the new one, and
    concurrent writers of the same file never share a temp file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_torch_save(obj, path) -> None:
    import torch
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def atomic_write_text(path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
