"""Shared fixtures: tiny models built in the test (no network, no ../shared)."""
import contextlib
import os
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
if "SALIENCY_DATA_DIR" not in os.environ:  # user data (models, mask sets, databases) never in the real home
    import tempfile

    os.environ["SALIENCY_DATA_DIR"] = tempfile.mkdtemp(prefix="saliency-data-")

# the test-only job kinds (job_kinds.py) are imported by name in each job's own process, as any kind's module
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [TESTS_DIR, os.environ.get("PYTHONPATH")]))

import importlib  # noqa: E402

importlib.import_module("job_kinds")  # registers sleep-steps and tiny-train with the app's job runner
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import timm  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from explainers.masks import write_mask_set  # noqa: E402
from explainers.models import ModelBundle, bundle_from_timm  # noqa: E402

DATA_DIR = os.path.join(os.path.dirname(__file__), "data")


def tiny_vit(name="tiny-vit", seed=0, **kwargs):
    torch.manual_seed(seed)
    options = dict(img_size=32, patch_size=8, depth=2, num_heads=2, embed_dim=32, num_classes=4)
    options.update(kwargs)
    model_name = options.pop("timm_name", "vit_tiny_patch16_224")
    network = timm.create_model(model_name, pretrained=False, **options)
    size = options["img_size"] if isinstance(options["img_size"], tuple) else (options["img_size"],) * 2
    return bundle_from_timm(name, network, input_size=size)


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height and which carries (almost) no pixel data: a decompression bomb
    that nothing must ever decode."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00" * 16))
            + chunk(b"IEND", b""))


TINY_SEGFORMER = dict(hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_attention_heads=[1, 2, 2, 4],
                      decoder_hidden_size=16)
TINY_SEGFORMER_SIZE = (64, 128)  # token grids 16x32 ... 2x4: every side divisible by its reduction ratio (8, 4, 2, 1)


def tiny_segformer(name="tiny-seg", seed=0, size=TINY_SEGFORMER_SIZE):
    """A three-class SegFormer built from a config (needs transformers; nothing downloaded)."""
    from explainers.segmentation.model import bundle_from_segformer, build_segformer, segformer_config

    torch.manual_seed(seed)
    network = build_segformer(segformer_config(3, **TINY_SEGFORMER))
    return bundle_from_segformer(name, network, class_names=["background", "round", "square"],
                                 class_colours=[(0, 0, 0), (200, 0, 0), (0, 0, 200)], input_size=size)


def tiny_cnn(name="tiny-cnn", seed=0, size=32, num_classes=4):
    torch.manual_seed(seed)
    network = timm.create_model("resnet18", pretrained=False, num_classes=num_classes, channels=(8, 16, 16, 16),
                                output_stride=8)
    return bundle_from_timm(name, network, input_size=(size, size))


class QuadrantNet(nn.Module):
    """Class 0's logit depends only on the top-left quadrant's brightness (a known answer)."""

    def __init__(self, size=32, scale=8.0):
        super().__init__()
        self.layer4 = nn.Conv2d(3, 2, 1, bias=False)
        with torch.no_grad():
            self.layer4.weight.fill_(1.0)
        mask = torch.zeros(1, 1, size, size)
        mask[..., : size // 2, : size // 2] = 1
        self.register_buffer("quadrant", mask)
        self.scale = scale

    def forward(self, x):  # x normalised with mean 0.5, std 1: x = image - 0.5
        features = self.layer4(x)
        evidence = (features * self.quadrant).sum(dim=(2, 3)) / self.quadrant.sum()
        logit = self.scale * evidence[:, :1]
        return torch.cat([logit, -logit], dim=1)


def quadrant_bundle(size=32, scale=8.0):
    return ModelBundle(name="quadrant", network=QuadrantNet(size, scale).eval(), mean=(0.5, 0.5, 0.5), std=(1.0, 1.0, 1.0),
                       input_size=(size, size), class_names=["top-left bright", "not"], family="cnn",
                       reference_color=(0.5, 0.5, 0.5), cam_layer_name="layer4")


@pytest.fixture
def vit_bundle():
    return tiny_vit()


@pytest.fixture
def cnn_bundle():
    return tiny_cnn()


@pytest.fixture
def quadrant():
    return quadrant_bundle()


@pytest.fixture
def images():
    generator = torch.Generator().manual_seed(1)
    return torch.rand(3, 3, 32, 32, generator=generator)


def preload_hf_cache(cache, repo_id: str, state: dict, config: dict | None = None) -> None:
    """Lay out a Hub repository (model.safetensors, and config.json when given) the way huggingface_hub caches
    it (and so a Space's `preload_from_hub`): what offline loading finds."""
    import json
    from pathlib import Path

    from safetensors.torch import save_file

    commit = "0123456789abcdef0123456789abcdef01234567"
    folder = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    if config is not None:
        (snapshot / "config.json").write_text(json.dumps(config))
    save_file(state, str(snapshot / "model.safetensors"))


def cli_in_one_and_two_processes(tmp_path, name: str, args: list, timing_key: str) -> tuple:
    """`python -m explainers ARGS` in one process and under `torchrun --nproc-per-node 2` (gloo), with a tiny
    4-class ViT named `name` registered in every process (same weights): the two reports (two, one), their
    process counts checked and dropped, their timings (`timing_key` per method) dropped."""
    import json
    import os
    import subprocess
    import sys

    from safetensors.torch import save_file

    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    bundle = tiny_vit(name=name, num_classes=4)
    weights = tmp_path / f"{name}.safetensors"
    save_file({k: v.contiguous() for k, v in bundle.network.state_dict().items()}, weights)
    script = tmp_path / f"run_{name}.py"  # registers the tiny model in each process, then runs the CLI
    script.write_text(
        "import sys, torch\n"
        f"sys.path[:0] = [{str(root)!r}, {str(root / 'tests')!r}]\n"
        "from safetensors.torch import load_file\n"
        "from conftest import tiny_vit\n"
        "from explainers import models\n"
        "from explainers.cli import main\n"
        f"bundle = tiny_vit(name={name!r}, num_classes=4)\n"
        f"bundle.network.load_state_dict(load_file({str(weights)!r}))\n"
        "models.register_bundle(bundle)\n"
        "sys.exit(main(sys.argv[1:]))\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(root))
    reports = []
    for label, launcher in (("two", [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                     "--nproc_per_node", "2"]), ("one", [sys.executable])):
        run = subprocess.run([*launcher, str(script), *args, "--out", str(tmp_path / f"{label}.json")],
                             env=env, capture_output=True, text=True, timeout=300, cwd=root)
        assert run.returncode == 0, run.stderr[-4000:]
        reports.append(json.loads((tmp_path / f"{label}.json").read_text()))
    two, one = reports
    assert two["protocol"].pop("processes") == 2 and one["protocol"].pop("processes") == 1
    for report in reports:
        for row in report["methods"].values():
            row.pop(timing_key)
    return two, one


def wait_until(predicate, timeout=20.0):
    """Poll `predicate` until it returns something true (returned) or `timeout` seconds pass (AssertionError)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.03)
    raise AssertionError("condition not reached")


def write_labelled_folder(folder, items):
    """A labelled image folder as the trainers read it: each (file name, image, class index) of `items` written
    into `folder` (made if missing) and listed in its labels.csv. `image`: an H x W x 3 uint8 array, or the path
    of a file to copy."""
    import csv
    import shutil

    from PIL import Image

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "labels.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["file", "class_index"])
        for file_name, image, label in items:
            if isinstance(image, (str, os.PathLike)):
                shutil.copy(image, folder / file_name)
            else:
                Image.fromarray(image).save(folder / file_name)
            writer.writerow([file_name, label])
    return folder


def as_uint8(image: torch.Tensor) -> np.ndarray:
    """A 3 x H x W image in [0, 1] as an H x W x 3 uint8 array (rounded)."""
    return (image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)


@pytest.fixture
def tiny_folder(tmp_path):
    """A labelled folder: the 6 shipped test cells (tests/data) with labels.csv, classes c % 4."""
    return write_labelled_folder(tmp_path / "cells", ((f"cell_{c}.jpg", f"{DATA_DIR}/cell_{c}.jpg", c % 4)
                                                      for c in range(6)))


def train_tiny_agents(folder, agents, *, seed: int, steps: int, num_envs: int):
    """Tiny PPO agents on defend_the_center in `folder` (needs ViZDoom): `agents` = ((name, lambda), ...)."""
    from explainers.agents.ppo import PPOConfig
    from explainers.agents.train import train_agent

    for name, lam in agents:
        train_agent(scenario_name="defend_the_center", out_dir=folder, name=name, seed=seed, lam=lam, steps=steps,
                    config=PPOConfig(num_envs=num_envs, rollout_steps=32, minibatch=32, epochs=1),
                    net_options={"width": 8, "hidden": 32})
    return folder


def free_port() -> int:
    """A free loopback port, so a test app (or a torchrun rendezvous) never takes 7860 or another's port."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_for_test(demo, **launch_kwargs) -> str:
    """Serve a built app in this process on a free loopback port (queue on, no SSR unless the kwargs say) and
    return its URL; the caller closes it with `demo.close()`."""
    launch_kwargs.setdefault("ssr_mode", False)
    _, url, _ = demo.queue().launch(prevent_thread_lock=True, server_port=free_port(), quiet=True, **launch_kwargs)
    return url


def verdict_stats(bundle, flag_all: bool):
    """Familiarity statistics with a known verdict for `bundle`: one mean at 0, identity precision, so every score
    is >= 0; threshold -1 flags every image, +inf none (tests of where the warning is said)."""
    from explainers import familiarity

    width = familiarity.logits_and_features(bundle, torch.rand(1, 3, *bundle.input_size))[1].shape[1]
    return familiarity.FamiliarityStats(means=torch.zeros(1, width, dtype=torch.float64),
                                        precision=torch.eye(width, dtype=torch.float64),
                                        val_scores=torch.zeros(1, dtype=torch.float64),
                                        threshold=-1.0 if flag_all else float("inf"), source={})


# --- helpers several test files share (kept here: test files never import each other) ---------------------
def same(a, b, where="report"):
    assert type(a) is type(b) or {type(a), type(b)} <= {int, float}, where
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert a == pytest.approx(b, abs=1e-6), where
    else:
        assert a == b, where


class FakeHub:
    """The huggingface_hub functions the HF Jobs backend calls, recorded; repos are folders under `root`."""

    def __init__(self, monkeypatch, root):
        import huggingface_hub

        self.root, self.calls, self.stages = root, [], {}
        for name in ("run_job", "inspect_job", "cancel_job", "whoami", "create_repo", "upload_folder",
                     "snapshot_download"):
            monkeypatch.setattr(huggingface_hub, name, getattr(self, name))

    def run_job(self, **kwargs):
        self.calls.append(("run", kwargs))
        return SimpleNamespace(id=f"hf-{sum(1 for c in self.calls if c[0] == 'run')}")

    def inspect_job(self, *, job_id, token=None):
        stage, message = self.stages.get(job_id, ("RUNNING", None))
        return SimpleNamespace(id=job_id, status=SimpleNamespace(stage=stage, message=message))

    def cancel_job(self, *, job_id, token=None):
        self.calls.append(("cancel", job_id))

    def whoami(self, token=None):
        assert token == "hf_secret"
        return {"name": "alice"}

    def create_repo(self, repo_id, *, repo_type=None, private=None, exist_ok=False, token=None):
        self.calls.append(("create", repo_id, repo_type, private))
        (self.root / repo_id).mkdir(parents=True, exist_ok=True)

    def upload_folder(self, *, repo_id, folder_path, repo_type=None, path_in_repo=None, token=None, **kwargs):
        import fnmatch
        import shutil

        self.calls.append(("upload", repo_id, repo_type, path_in_repo, str(folder_path)))
        target = self.root / repo_id / (path_in_repo or "")
        for file in Path(folder_path).rglob("*"):
            relative = file.relative_to(folder_path).as_posix()
            allowed = kwargs.get("allow_patterns") or ["*"]
            ignored = kwargs.get("ignore_patterns") or []
            if file.is_file() and any(fnmatch.fnmatch(relative, p) for p in allowed) and not any(
                    fnmatch.fnmatch(relative, p) for p in ignored):
                (target / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(file, target / relative)

    def snapshot_download(self, *, repo_id, repo_type=None, local_dir=None, token=None, allow_patterns=None):
        import shutil

        self.calls.append(("download", repo_id, str(local_dir)))
        for file in (self.root / repo_id).iterdir():
            shutil.copy(file, Path(local_dir) / file.name)
        return str(local_dir)


MASK_SET_COLOURS = ((220, 30, 30), (30, 180, 30), (40, 40, 220))


def make_mask_set(path, count=24, seed=0, decoy="class", size=32):
    """Class = colour of a disk somewhere in the image (the mask) AND of a square in a corner (the decoy)."""
    rng = np.random.default_rng(seed)
    items = []
    ys, xs = np.mgrid[0:size, 0:size]
    for i in range(count):
        label = i % 3
        image = rng.integers(150, 200, (size, size, 3)).astype(np.uint8)
        cy, cx = rng.integers(11, size - 10, 2)
        disk = (ys - cy) ** 2 + (xs - cx) ** 2 <= 36
        image[disk] = MASK_SET_COLOURS[label]
        square = MASK_SET_COLOURS[label] if decoy == "class" else MASK_SET_COLOURS[int(rng.integers(3))]
        image[:4, :4] = square
        mask = disk.copy()
        mask[:4, :4] = False
        items.append((f"{i}.png", image, mask, label))
    write_mask_set(path, items)
    return path


def screenshot_folder(tmp_path_factory, name: str):
    """Where a browser test's screenshots go: SALIENCY_LAB_SCREENSHOTS when set (to look at them), else a temporary
    folder named `name`."""
    import os

    folder = os.environ.get("SALIENCY_LAB_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp(name)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def forward_passes(module):
    """The batch size of every forward pass `module` makes inside the block (a list, filled as they happen)."""
    sizes = []
    handle = module.register_forward_hook(lambda _module, inputs, _output: sizes.append(len(inputs[0])))
    try:
        yield sizes
    finally:
        handle.remove()
