"""Every kind of file the app shows is served from the DEFAULT data folder (~/.local/share/saliency-lab), through
the real server. Other tests put the data folder under /tmp, which Gradio always serves, so they never saw that a
finished fine-tune's pictures in the default folder were refused (InvalidPathError: an empty result panel)."""
from __future__ import annotations

import os
import shutil
import tempfile
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from PIL import Image

from conftest import launch_for_test, tiny_cnn

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def default_data_home(monkeypatch):
    """XDG_DATA_HOME in the user's home (outside the temp folder and the working directory, as on a fresh
    machine), with nothing overriding the default data folder or the state folder."""
    home = Path.home() / ".cache" / f"saliency-lab-test-{uuid.uuid4().hex[:8]}"
    home.mkdir(parents=True)
    assert not str(home.resolve()).startswith(str(Path(tempfile.gettempdir()).resolve()))
    assert not str(home.resolve()).startswith(str(Path.cwd().resolve()))
    for name in ("SALIENCY_DATA_DIR", "SALIENCY_LAB_STATE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(home))
    yield home
    shutil.rmtree(home, ignore_errors=True)


def _png(path: Path, colour) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), colour).save(path)
    return path.read_bytes()


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, b""


def test_every_file_kind_is_served_from_the_default_data_folder(default_data_home):
    import app
    from explainers.models import register_bundle
    from explainers.paths import data_dir, user_dir

    assert data_dir() == default_data_home / "saliency-lab"  # the default rule, not an override
    register_bundle(tiny_cnn(num_classes=4))
    demo = app.build_app(model_names=["tiny-cnn"], default_model="tiny-cnn",
                         data_dir=str(ROOT / "assets" / "bloodmnist"))  # state, jobs, models: all default
    services = demo.services
    # where each kind of shown file is written (the writers' own folders, read from the services)
    files = {
        "CAMAL before/after figure beside the fine-tuned model's card": services.weights_dir / "ft.camal.png",
        "AHA training job's validation plot beside the explainer": services.weights_dir / "aha-x.validation.png",
        "a job's own work folder": services.jobs_root / "job-1" / "loss.png",
        "a saved mask set": user_dir("mask-sets") / "set-1" / "mask_0.png",
        "an uploaded data set's image": user_dir("datasets") / "mine" / "cell_0.png",
        "an export (study, verdicts, overlays)": services.downloads / "study-x.png",
    }
    for folder in (services.weights_dir, services.jobs_root, services.state_dir):
        assert str(folder.resolve()).startswith(str(data_dir().resolve())), folder
    expected = {label: _png(path, (i * 40, 10, 200)) for i, (label, path) in enumerate(files.items())}
    url = launch_for_test(demo, **app.launch_kwargs(demo))
    try:
        for label, path in files.items():
            status, body = _get(f"{url.rstrip('/')}/gradio_api/file={path.resolve()}")
            assert status == 200, f"{label}: HTTP {status} for {path}"
            assert body == expected[label], label
        # and a file outside every served folder stays refused
        outside = default_data_home / "not-served.png"
        _png(outside, (0, 0, 0))
        assert _get(f"{url.rstrip('/')}/gradio_api/file={outside.resolve()}")[0] in (403, 404)
    finally:
        demo.close()


def test_launch_allows_the_services_folders(default_data_home, tmp_path):
    import app
    from explainers.models import register_bundle

    register_bundle(tiny_cnn(num_classes=4))
    weights = default_data_home / "elsewhere-models"
    demo = app.build_app(model_names=["tiny-cnn"], default_model="tiny-cnn", weights_dir=weights,
                         data_dir=str(ROOT / "assets" / "bloodmnist"))
    allowed = app.launch_kwargs(demo)["allowed_paths"]
    assert str(weights.resolve()) in allowed
    assert str((default_data_home / "saliency-lab").resolve()) in allowed
    assert os.path.isabs(allowed[0])
