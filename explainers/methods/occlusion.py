"""Occlusion (Zeiler & Fergus, ECCV 2014; Captum's `Occlusion`): slide a square window over the image, paint it
the reference colour, and credit each pixel with the mean drop of the class score over the windows that cover it.

The window is a share of the image side (1/8 by default) and moves by half its size, so every model gets the
same number of passes (15 x 15 = 225 at the default) whatever its input size. Passes are batched, and one
image explained for several classes (the grid pointing game's four, a class picker) is occluded and classified
once: each pass gives every class's score. The score is the class logit by default (a softmax probability
saturates near 1 and then barely moves when a window covers part of the evidence); `score="probability"`
uses the softmax instead."""
from __future__ import annotations

import torch

from . import register
from ..targets import as_target
from .base import ANY_TARGET_FAMILIES, Method, Option, repeated_runs

SCORES = ("logit", "probability")


def window_positions(size: int, window: int, stride: int) -> list:
    """Start offsets along one side: every `stride` pixels, plus a last one flush with the border."""
    if window >= size:
        return [0]
    starts = list(range(0, size - window + 1, stride))
    if starts[-1] != size - window:
        starts.append(size - window)
    return starts


def occlusion_windows(height: int, width: int, window_fraction: float) -> tuple:
    """(window height, window width, [(top, left)]) for an image of this size."""
    window_h = max(1, round(height * window_fraction))
    window_w = max(1, round(width * window_fraction))
    stride_h, stride_w = max(1, window_h // 2), max(1, window_w // 2)
    corners = [(top, left) for top in window_positions(height, window_h, stride_h)
               for left in window_positions(width, window_w, stride_w)]
    return window_h, window_w, corners


@register
class Occlusion(Method):
    name = "occlusion"
    label = "Occlusion"
    description = ("Paints a sliding window the background colour and records how much the class score drops: "
                   "model-agnostic and easy to read, one forward pass per window position (225 by default).")
    colour = "#332288"
    order = 6
    families = ANY_TARGET_FAMILIES
    any_target = True
    slow = True
    quick_pixels = 128 * 128  # 226 passes of a 128 px mosaic take about 3 s on 2 CPU cores (tiny ViT)
    user_options = (
        Option("window_fraction", "Occlusion window (share of the side)", 0.125, 0.0625, 0.5, 0.0625,
               info="The painted square, as a share of the image side; it moves by half its size. Smaller: "
                    "finer maps and more passes.", rank=40, short="window"),
    )

    @classmethod
    def model_passes(cls, bundle, options: dict | None = None) -> int:
        height, width = bundle.input_size
        window = float((options or {}).get("window_fraction", cls.user_options[0].default))
        return 1 + len(occlusion_windows(height, width, window)[2])

    def __init__(self, window_fraction: float = 0.125, score: str = "logit", batch_size: int = 128):
        if score not in SCORES:
            raise ValueError(f"occlusion: score must be one of {', '.join(SCORES)}, got {score!r}")
        super().__init__(window_fraction=float(window_fraction), score=score, batch_size=int(batch_size))
        self.window_fraction, self.score, self.batch_size = float(window_fraction), score, int(batch_size)

    @torch.no_grad()
    def attribute(self, bundle, images, targets, progress=None):
        """`targets`: class indices or any `Target` (a region: the drop of its score)."""
        height, width = images.shape[-2:]
        window_h, window_w, corners = occlusion_windows(height, width, self.window_fraction)
        return occlusion_maps(bundle, images, targets, (window_h, window_w), corners,
                              probability=self.score == "probability", batch_size=self.batch_size, progress=progress)


@torch.no_grad()
def occlusion_maps(bundle, images, targets, window: tuple, corners: list, *, probability: bool = False,
                   batch_size: int = 128, progress=None) -> torch.Tensor:
    """B x H x W: each pixel's mean drop of the target's score (logit, or `probability`) over the `window` (h, w)
    squares at `corners` [(top, left)] that cover it, painted the bundle's reference colour; 0 where none does.
    The method's windows tile the image; a study may pass windows of its own (e.g. only near a region)."""
    b, _, height, width = images.shape
    window_h, window_w = window
    target = as_target(targets, b, images.device)
    reference = torch.tensor(bundle.reference_color, dtype=images.dtype, device=images.device).view(1, 3, 1, 1)
    runs = repeated_runs(images)  # an image asked about several targets is occluded and scored once
    rows = {run: target.rows(*run) for run in runs}
    chunk = max(1, batch_size)
    chunks = [corners[start:start + chunk] for start in range(0, len(corners), chunk)]
    saliency = torch.zeros(b, height * width, device=images.device)
    covered = torch.zeros(height * width, device=images.device)
    full = {run: rows[run].copies(bundle(images[run[0]:run[0] + 1]), probability)[0]
            for run in runs}  # each run's unoccluded scores, one per row
    steps = 0
    for part in chunks:
        windows = torch.zeros(len(part), 1, height, width, dtype=images.dtype, device=images.device)
        for k, (top, left) in enumerate(part):
            windows[k, :, top:top + window_h, left:left + window_w] = 1
        flat = windows.view(len(part), -1)
        covered += flat.sum(0)
        for start, stop in runs:
            occluded = images[start:start + 1] * (1 - windows) + reference * windows
            drops = full[(start, stop)].view(1, -1) - rows[(start, stop)].copies(bundle(occluded), probability)
            saliency[start:stop] += drops.T @ flat  # windows x rows above
            steps += 1
            if progress is not None:
                progress(steps / (len(chunks) * len(runs)))
    return (saliency / covered.clamp_min(1)).view(b, height, width)
