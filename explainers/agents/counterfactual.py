"""The counterfactual test of a critic (after Atrey et al., "Exploratory not explanatory", ICLR 2020): does V(s)
depend on the monsters?

On evaluation frames, the monsters are removed (their pixels, the labels-buffer mask grown by one pixel, filled in
from the surrounding wall and floor by inpainting) and, as the control, a region of the same shape and area is
removed the same way at a place away from them (the mask shifted sideways on the same rows, so it covers the same
band of wall and floor, and overlaps no monster pixel). The drop V(s) - V(s without the region) is divided by the
critic's spread (the standard deviation of V(s) over the evaluation frames), so agents with different value scales
compare. A critic that ignores the monsters scores 0 on both, up to the inpainting's own effect, which the control
measures. Summaries: medians, and the median of the paired difference (monsters - control) with a bootstrap
interval that resamples episodes (frames of one episode are not independent).

    result = counterfactual_drops(net, frames, masks, episodes=episode_ids)
    summary = summarise_drops(result)
"""
from __future__ import annotations

import numpy as np
import torch

INPAINT_RADIUS = 3
GROW = 1  # pixels added around the mask before filling: no rim of monster colour is left
N_RESAMPLES = 5000
LEVEL = 0.95


def grow(mask: np.ndarray, pixels: int = GROW) -> np.ndarray:
    import cv2

    if pixels <= 0:
        return mask.astype(bool)
    kernel = np.ones((2 * pixels + 1, 2 * pixels + 1), np.uint8)
    return cv2.dilate(mask.astype(np.uint8), kernel) > 0


def fill_from_surroundings(frame: np.ndarray, region: np.ndarray) -> np.ndarray:
    """3 x h x w uint8 frame with `region` (h x w bool) filled in from the pixels around it (Telea inpainting)."""
    import cv2

    if not region.any():
        return frame.copy()
    image = np.ascontiguousarray(frame.transpose(1, 2, 0))
    filled = cv2.inpaint(image, region.astype(np.uint8), INPAINT_RADIUS, cv2.INPAINT_TELEA)
    return np.ascontiguousarray(filled.transpose(2, 0, 1))


def control_region(region: np.ndarray, rng: np.random.Generator, margin: int = 2) -> np.ndarray | None:
    """The region shifted sideways (same rows, wrapping round the frame's width) to a place where it and a
    `margin`-pixel border around it overlap none of the original; a random one among the shifts that qualify,
    None when no shift does (the monsters span the frame's width)."""
    width = region.shape[1]
    keep_out = grow(region, margin)
    shifts = [s for s in range(1, width) if not (np.roll(region, s, axis=1) & keep_out).any()]
    if not shifts:
        return None
    return np.roll(region, int(rng.choice(shifts)), axis=1)


@torch.no_grad()
def _values(net, frames: np.ndarray, batch: int = 256) -> np.ndarray:
    device = next(net.parameters()).device
    out = [net(torch.from_numpy(frames[i:i + batch]).to(device))[1].float().cpu().numpy()
           for i in range(0, len(frames), batch)]
    return np.concatenate(out).astype(np.float64)


def counterfactual_drops(net, frames: np.ndarray, masks: np.ndarray, *, episodes=None, seed: int = 0) -> dict:
    """Per-frame drops of V(s) (scaled by the critic's spread over all the frames given) when the monsters are
    removed and when the control region is. Frames without monsters, or where no control place exists, are left
    out of the drops (counted in `skipped`)."""
    rng = np.random.default_rng(seed)
    frames, masks = np.asarray(frames), np.asarray(masks, bool)
    episodes = np.zeros(len(frames), int) if episodes is None else np.asarray(episodes)
    values = _values(net, frames)
    spread = float(values.std())
    removed, controls, kept = [], [], []
    for i, (frame, mask) in enumerate(zip(frames, masks)):
        if not mask.any():
            continue
        region = grow(mask)
        control = control_region(region, rng)
        if control is None:
            continue
        removed.append(fill_from_surroundings(frame, region))
        controls.append(fill_from_surroundings(frame, control))
        kept.append(i)
    kept = np.array(kept, int)
    if not len(kept):
        return {"spread": spread, "frames": 0, "skipped": int(len(frames)), "monsters": [], "control": [],
                "episodes": []}
    scale = spread if spread > 0 else 1.0
    monsters = (values[kept] - _values(net, np.stack(removed))) / scale
    control = (values[kept] - _values(net, np.stack(controls))) / scale
    return {"spread": spread, "frames": int(len(kept)), "skipped": int(len(frames) - len(kept)),
            "monsters": monsters.tolist(), "control": control.tolist(), "episodes": episodes[kept].tolist()}


def median_interval(values, groups=None, *, n_resamples: int = N_RESAMPLES, level: float = LEVEL,
                    seed: int = 0) -> dict:
    """Median and a percentile bootstrap interval that resamples whole groups (episodes) with replacement."""
    values = np.asarray(values, np.float64)
    if not len(values):
        return {"median": None, "interval": None, "n": 0}
    groups = np.zeros(len(values), int) if groups is None else np.asarray(groups)
    labels = np.unique(groups)
    if len(labels) < 2:  # one episode: resample frames instead
        members, labels = [np.array([i]) for i in range(len(values))], np.arange(len(values))
    else:
        members = [np.flatnonzero(groups == g) for g in labels]
    rng = np.random.default_rng(seed)
    medians = np.empty(n_resamples)
    for r in range(n_resamples):
        picked = rng.integers(0, len(members), len(members))
        medians[r] = np.median(values[np.concatenate([members[p] for p in picked])])
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(medians, [tail, 100 - tail])
    return {"median": float(np.median(values)), "interval": [float(low), float(high)], "n": int(len(values))}


def summarise_drops(result: dict, what: str = "the monsters", **options) -> dict:
    """Medians of the scaled drops (monsters, control) and of their paired difference, with intervals. The keys
    say "monsters" in every scenario (the stored results read them); `what` names the masked objects in words."""
    monsters, control = np.asarray(result["monsters"]), np.asarray(result["control"])
    groups = result.get("episodes") or None
    return {"spread": result["spread"], "frames": result["frames"], "skipped": result["skipped"],
            "monsters": median_interval(monsters, groups, **options),
            "control": median_interval(control, groups, **options),
            "monsters_minus_control": median_interval(monsters - control, groups, **options),
            "ignoring_critic": f"a critic that ignores {what} scores a difference of 0"}


def paired_arm_difference(first: dict, second: dict, **options) -> dict:
    """(monsters - control) of `first` minus that of `second`, on the same frames and episodes (both results
    from `counterfactual_drops` on the same frames with the same seed, so the same control regions)."""
    a = np.asarray(first["monsters"]) - np.asarray(first["control"])
    b = np.asarray(second["monsters"]) - np.asarray(second["control"])
    if len(a) != len(b):
        raise ValueError("the two agents' counterfactual drops are not on the same frames")
    return median_interval(a - b, first.get("episodes") or None, **options)
