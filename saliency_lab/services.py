"""What a running Saliency Lab shares between its users: the service container (thread-safe).

    services = Services(default_loader, list_models, "runs/app")
    bundle = services.bundle("bloodmnist-cnn")          # the model zoo's cached loader
    record = run_method(bundle, prepared, "gradcam", target, {}, services.cache)
    paths = services.pictures([(overlay, "Grad-CAM")])   # [(file, caption)], named by content
    runner = services.runner()                           # fine-tune jobs (saliency_lab.jobs)
    segmenters = services.segmenters()                   # SAM (or GrabCut) embeddings per session

`gpu(duration)` is `spaces.GPU(duration=...)` when the app imported `spaces` before torch (ZeroGPU), else a
no-op: the same functions run on a CPU, a GPU or a ZeroGPU Space.
"""
from __future__ import annotations

import hashlib
import io
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path

import torch

from explainers import engine, models
from explainers.images import load_image, png_bytes
from explainers.models import ModelUnavailableError, load_model
from .review_store import ReviewStore


def gpu(duration: int = 60):
    """@spaces.GPU(duration=...) when the `spaces` package was imported (app.py imports it before torch, as
    ZeroGPU requires); otherwise the function itself. Outside ZeroGPU spaces.GPU is a no-op too."""
    spaces = sys.modules.get("spaces")
    if spaces is not None and hasattr(spaces, "GPU"):
        return spaces.GPU(duration=duration)
    return lambda fn: fn


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # ZeroGPU: CUDA is available (lazily attached)


def configure_torch(parallel: int) -> None:
    """On a CPU, `parallel` explanations run side by side, each single-threaded: on a shared 2-vCPU box two
    threads per op are many times slower than one (measured), and requests, not ops, are what is parallel here.
    SALIENCY_LAB_TORCH_THREADS overrides."""
    threads = os.environ.get("SALIENCY_LAB_TORCH_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    elif DEVICE == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, parallel)))


def default_loader(name):
    """The model zoo's cached, thread-safe factory, on the GPU when there is one."""
    return load_model(name, device=DEVICE)


@gpu(60)
def run_method(bundle, prepared, method, target, options, cache, curves=True):
    """`explainers.engine.run_method` as a GPU entry point (one method's map, and its curves unless curves=False)."""
    return engine.run_method(bundle, prepared, method, target, options, cache=cache, curves=curves)


@gpu(60)
def add_curves(bundle, prepared, record, cache):
    """`explainers.engine.add_curves` as a GPU entry point (deletion and insertion curves of one map)."""
    return engine.add_curves(bundle, prepared, record, cache)


class Uploads:
    """Uploaded images decoded once and prepared once per model (prepare once, query many: the shape of SAM's
    predictor). `picture(path)` is the file as `explainers.images.load_image` reads it, decoded on first use (the
    upload check before any handler, the preview, every explanation, redraw and download reuse it);
    `prepared(bundle, path)` is its `engine.PreparedInput` for a model. Keyed by the file's content (hashing is
    far cheaper than decoding), so the same upload is decoded once whatever its path; bounded, least recently
    used out."""

    def __init__(self, pictures: int = 16, prepared: int = 16, max_pixels: int = 64_000_000):
        self.sizes = {"pictures": pictures, "prepared": prepared}
        self.max_pixels = max_pixels  # decoded pictures held at most (about 190 MB of RGB)
        self._pictures: OrderedDict = OrderedDict()
        self._prepared: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    HASHED_BYTES = 64_000_000  # files up to this size are known by their content, larger ones by name and time

    @classmethod
    def _key(cls, path) -> tuple:
        """The file's content (sha256): Gradio writes an upload again under the same name, or under another name
        for another request, and the same bytes are the same picture. A huge file (refused anyway) by its name."""
        path = Path(str(path)).resolve()
        facts = path.stat()
        if facts.st_size > cls.HASHED_BYTES:
            return "file", str(path), facts.st_size, facts.st_mtime_ns
        return "sha256", hashlib.sha256(path.read_bytes()).hexdigest()

    def _get(self, table: OrderedDict, key):
        with self._lock:
            if key in table:
                table.move_to_end(key)
                return table[key]
        return None

    def _put(self, table: OrderedDict, key, value, size: int) -> None:
        with self._lock:
            table[key] = value
            table.move_to_end(key)
            while len(table) > size or (table is self._pictures and len(table) > 1 and self._pixels() > self.max_pixels):
                table.popitem(last=False)

    def _pixels(self) -> int:
        return sum(picture.width * picture.height for picture in self._pictures.values())

    def picture(self, path):
        """The picture of an uploaded file (RGB, as load_image returns it); ImageError for a file it refuses."""
        key = self._key(path)
        found = self._get(self._pictures, key)
        if found is None:
            found = load_image(path)
            self._put(self._pictures, key, found, self.sizes["pictures"])
        return found

    def remember(self, path, picture) -> None:
        """`path` holds `picture` (a normalised copy the app wrote of an upload): no need to decode it again."""
        self._put(self._pictures, self._key(path), picture, self.sizes["pictures"])

    def prepared(self, bundle, path) -> engine.PreparedInput:
        """The prepared input of the file for this model (the bundle itself is part of the key)."""
        key = (self._key(path), id(bundle))
        found = self._get(self._prepared, key)
        if found is not None and found[0] is bundle:  # held, so its id is not reused while cached
            return found[1]
        prepared = engine.prepare_input(self.picture(path), bundle)
        self._put(self._prepared, key, (bundle, prepared), self.sizes["prepared"])
        return prepared


UPLOADS = Uploads()  # one per process: the upload check runs before any handler, without the services


class Services:
    """What the whole app shares (thread-safe): model loader, explanation cache, review store, jobs, SAM.

    `loader` (name -> ModelBundle), `model_names` (list or callable), `state_dir` (SQLite files, exported mask
    sets), `jobs_root` (fine-tune jobs; default state_dir/jobs), `sam_variant` ("auto", "vit_b", "mobile_sam"),
    `weights_dir` (where fine-tuned models are written; default the user's models folder, outside the code), `parallel` (explanations
    run side by side), `decoy_roots` (folders that may hold decoy BloodMNIST and its models; default
    `datasets.decoy_locations()`), `segmentation_names` (list or callable: the segmentation models the Explain menu
    offers besides `model_names`; default `explainers.models.names("segmentation")`)."""

    def __init__(self, loader, model_names, state_dir, jobs_root=None, sam_variant="auto", hf_token=None,
                 weights_dir=None, parallel=1, decoy_roots=None, segmentation_names=None):
        from explainers.paths import user_models_dir

        self.loader = loader
        self.weights_dir = Path(weights_dir or user_models_dir())  # fine-tuned models: never the tracked weights/
        self.model_names = model_names
        self.segmentation_model_names = segmentation_names
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.cache = engine.ExplanationCache(parallel=parallel)
        self.uploads = UPLOADS
        self.store = ReviewStore(self.state_dir / "review.sqlite")
        self.downloads = Path(tempfile.mkdtemp(prefix="saliency-lab-"))
        self.jobs_root = Path(jobs_root or self.state_dir / "jobs")
        self.sam_variant = sam_variant
        self.hf_token = hf_token if hf_token is not None else os.environ.get("HF_TOKEN")
        self._decoy_roots = None if decoy_roots is None else [Path(p) for p in decoy_roots]
        self._runner = None
        self._segmenter_cache = None
        self._objects = {}
        self._written = 0
        self._lock = threading.Lock()

    def served_folders(self) -> list[str]:
        """Every folder whose files the app shows (job results, fine-tuned and imported models' figures, mask sets,
        data sets, exports): Gradio serves a file only from the working directory, its temp folder or a path the
        launch allows, and the default data folder (~/.local/share/saliency-lab) is none of them."""
        from explainers.paths import data_dir

        folders = []
        for folder in (data_dir(), self.state_dir, self.jobs_root, self.weights_dir, self.downloads):
            folder = str(Path(folder).resolve())
            if folder not in folders:
                folders.append(folder)
        return folders

    @property
    def decoy_roots(self) -> list:
        """Folders that may hold `decoy-bloodmnist/` and decoy models in `weights/` (read at each call, so the
        environment variable SALIENCY_LAB_DECOY_DIR applies without a restart, unless given explicitly)."""
        if self._decoy_roots is not None:
            return list(self._decoy_roots)
        from .datasets import decoy_locations

        return decoy_locations()

    def pictures(self, items, fmt: str = "jpeg", names=None) -> list:
        """[(PIL, caption)] -> [(file path, caption)], named by content, so Gradio only copies files instead of
        encoding every overlay as a default-level PNG on each slider move (the largest CPU cost of a redraw on
        2 vCPUs). JPEG quality 92 without chroma subsampling for overlays; downloads are PNG. `names`: one safe file
        stem per item (what a browser saves it as), in a folder named by content; default the content hash."""
        folder = self.downloads / "pictures"
        folder.mkdir(exist_ok=True)
        out = []
        for index, (picture, text) in enumerate(items):
            if fmt == "png":
                data = png_bytes(picture, compress_level=1)
            else:
                buffer = io.BytesIO()
                picture.convert("RGB").save(buffer, format="JPEG", quality=92, subsampling=0)
                data = buffer.getvalue()
            digest, extension = hashlib.sha1(data).hexdigest()[:24], "png" if fmt == "png" else "jpg"
            path = folder / f"{digest}.{extension}"
            if names is not None:
                path = folder / digest / f"{names[index]}.{extension}"
                path.parent.mkdir(exist_ok=True)
            if not path.exists():
                path.write_bytes(data)
            out.append((str(path), text))
        self._written += len(items)
        if self._written > 500:  # keep the folder bounded: drop pictures older than an hour
            self._written = 0
            cutoff = time.time() - 3600
            for old in folder.iterdir():
                try:
                    if old.stat().st_mtime < cutoff:
                        shutil.rmtree(old) if old.is_dir() else old.unlink()
                except OSError:
                    pass
        return out

    def cached(self, key, build):
        """A shared object built once (e.g. a model loaded from a card outside the zoo)."""
        with self._lock:
            if key not in self._objects:
                self._objects[key] = build()
            return self._objects[key]

    def image_seconds(self, bundle, batch: int = 1) -> float:
        """Seconds one image's forward pass takes on this model, here, when it goes through the model in batches of
        `batch` (measured once per model and batch size: two passes, the faster one), for expected times. Batched
        work (RISE's masks, occlusion's windows, the curves' 42 images) costs far less per image than one image
        alone: priced at batch 1 it is over-counted several times."""
        batch = max(1, int(batch))
        key = ("image_seconds", bundle.name, str(bundle.device), batch)
        with self._lock:
            if key in self._objects:
                return self._objects[key]
        images = torch.rand(batch, 3, *bundle.input_size, device=bundle.device)
        times = []
        with bundle.lock, torch.no_grad():
            for _ in range(2):
                started = time.perf_counter()
                bundle(images)
                times.append((time.perf_counter() - started) / batch)
        with self._lock:
            self._objects[key] = min(times)
        return self._objects[key]

    def pass_costs(self, bundle) -> tuple:
        """(seconds per call, seconds per image) of this model's forward pass here: a line through the per-call
        times measured at batches of 1 and 32 (`image_seconds`), so that work of any batch size can be priced."""
        one, many = self.image_seconds(bundle, 1), 32 * self.image_seconds(bundle, 32)
        per_image = min(max((many - one) / 31, 0.0), one)  # a call of 32 no slower than one of 1: all per call
        return one - per_image, per_image

    def record_seconds(self, model: str, method: str, seconds: float, cost: tuple = ()) -> None:
        """Remember how long a map took (the next expected time for this model, method and `cost`: the options
        that change what a map costs, e.g. AHA's refinement steps)."""
        with self._lock:
            self._objects[("map_seconds", model, method, cost)] = float(seconds)

    def measured_seconds(self, model: str, method: str, cost: tuple = ()):
        with self._lock:
            return self._objects.get(("map_seconds", model, method, cost))

    def names(self) -> list:
        return list(self.model_names()) if callable(self.model_names) else list(self.model_names)

    def segmentation_names(self) -> list:
        """The segmentation models to offer (the Explain menu lists them after the classifiers)."""
        names = self.segmentation_model_names
        if names is None:
            return models.names("segmentation")  # the model zoo lists every kind: no tab's service needed
        return list(names()) if callable(names) else list(names)

    @gpu(120)
    def bundle(self, name):
        if not name:
            raise ModelUnavailableError("Pick a model first.")
        return self.loader(name)

    def forget_model(self, name: str) -> None:
        """After a model was imported again or removed: drop its cached copies and the cached explanations
        (keyed by model name, they could belong to the old weights)."""
        from explainers.models import forget

        forget(name)
        self.cache.clear()

    def runner(self):
        """The fine-tune job runner (started on first use), with the 'camal' job kind registered."""
        with self._lock:
            if self._runner is None:
                from .jobs import JobRunner  # registers the 'camal' job kind

                self._runner = JobRunner(self.jobs_root, hf_token=self.hf_token, results_dir=self.weights_dir)
            return self._runner

    def segmenters(self):
        """SAM (or the labelled GrabCut fallback) with one prepared image per session (8 sessions at most)."""
        with self._lock:
            if self._segmenter_cache is None:
                from explainers.masks import SegmenterCache, get_segmenter

                self._segmenter_cache = SegmenterCache(get_segmenter(self.sam_variant), max_sessions=8)
            return self._segmenter_cache

    def forget_session(self, session: str):
        if self._segmenter_cache is not None:
            self._segmenter_cache.discard(session)
