"""The deletion/insertion engine and the other faithfulness and localisation metrics (spec section 1).

Deletion: replace the top-p pixels (by the map) with the reference and watch the target's softmax
probability fall; insertion: start from the reference and restore the top-p pixels. All 2(K+1)
images of all B curves go through the model in as few batched forward passes as `batch_size` allows.
AUC by the trapezoid rule over p in [0, 1]. Which way each score is better: `METRICS` (declared once, below).

ROAD (`reference="road"`, Rong et al. ICML 2022): the removed pixels are not painted with a colour but
filled by noisy linear imputation from the pixels that remain (each removed pixel = the weighted mean of
its 8 neighbours, solved as one sparse system, plus N(0, 0.01) noise in the model's normalised input units, as
Rong et al.'s code and pytorch-grad-cam add it to the normalised tensor: 0.01 x the channel's std in [0, 1]
space), so that removal does not push the image out of distribution. Deletion is then ROAD's MoRF curve (most relevant removed first); insertion
keeps the top-p pixels and imputes the rest, i.e. ROAD's LeRF curve read from the other end (LeRF at
q removed = insertion at p = 1 - q, so the two AUCs are equal). Where every pixel is removed there is
nothing to impute from: the image is the bundle's reference colour plus the same noise. The imputer
(`LinearImputer`) solves ROAD's system (each removed pixel = the mean of its in-image neighbours, weight 1/6 for
the 4 direct and 1/12 for the 4 diagonal ones) with scipy; the tests hold it to the ROAD authors' implementation as
pytorch-grad-cam ships it (`pytorch_grad_cam.metrics.road.NoisyLinearImputer`), which is not needed at run time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .targets import as_target

REFERENCES = ("mean", "black", "blur", "road")
TIE_BREAK_SEED = 0
ROAD_NOISE = 0.01  # in normalised input units (the model's mean/std), as ROAD's authors add it
ROAD_SEED = 0


@dataclass
class Curves:
    fractions: np.ndarray  # K+1
    deletion: np.ndarray  # B x (K+1)
    insertion: np.ndarray  # B x (K+1)

    @property
    def deletion_auc(self) -> np.ndarray:
        return trapezoid_auc(self.deletion, self.fractions)

    @property
    def insertion_auc(self) -> np.ndarray:
        return trapezoid_auc(self.insertion, self.fractions)

    @property
    def ins_minus_del(self) -> np.ndarray:
        return self.insertion_auc - self.deletion_auc

    def average_drop(self, keep_fraction: float = 0.5) -> np.ndarray:
        """Average drop % (ADP) when only the top `keep_fraction` of pixels is kept (the insertion image)."""
        index = int(np.argmin(np.abs(self.fractions - keep_fraction)))
        full = self.insertion[:, -1]
        kept = self.insertion[:, index]
        return 100.0 * np.clip(full - kept, 0, None) / np.clip(full, 1e-12, None)

    def summary(self) -> dict:
        return {"deletion_auc": float(self.deletion_auc.mean()), "insertion_auc": float(self.insertion_auc.mean()),
                "ins_minus_del": float(self.ins_minus_del.mean())}


def trapezoid_auc(scores: np.ndarray, fractions: np.ndarray) -> np.ndarray:
    scores = np.asarray(scores, dtype=np.float64)
    widths = np.diff(fractions)
    return ((scores[..., 1:] + scores[..., :-1]) * 0.5 * widths).sum(axis=-1)


def gaussian_blur(images: torch.Tensor, kernel_size: int = 11, sigma: float = 5.0) -> torch.Tensor:
    """Separable Gaussian blur with reflect padding (RISE/TIS's reference: kernel 11, sigma 5)."""
    radius = kernel_size // 2
    coords = torch.arange(kernel_size, dtype=images.dtype, device=images.device) - radius
    kernel = torch.exp(-(coords ** 2) / (2 * sigma ** 2))
    kernel = kernel / kernel.sum()
    channels = images.shape[1]
    pad_mode = "reflect" if min(images.shape[-2:]) > radius else "replicate"
    out = F.pad(images, (radius, radius, 0, 0), mode=pad_mode)
    out = F.conv2d(out, kernel.view(1, 1, 1, -1).repeat(channels, 1, 1, 1), groups=channels)
    out = F.pad(out, (0, 0, radius, radius), mode=pad_mode)
    return F.conv2d(out, kernel.view(1, 1, -1, 1).repeat(channels, 1, 1, 1), groups=channels)


def reference_images(images: torch.Tensor, reference: str = "mean", mean_color=(0.5, 0.5, 0.5)) -> torch.Tensor:
    """The image every deleted pixel takes (in [0, 1] space, before normalisation)."""
    if reference == "mean":
        color = torch.tensor(mean_color, dtype=images.dtype, device=images.device).view(1, 3, 1, 1)
        return color.expand_as(images)
    if reference == "black":
        return torch.zeros_like(images)
    if reference == "blur":
        return gaussian_blur(images)
    if reference == "road":  # what a fully removed image becomes; partial removals are imputed
        return reference_images(images, "mean", mean_color)
    raise ValueError(f"Unknown reference '{reference}': choose one of {', '.join(REFERENCES)}")


def pixel_ranks(maps: torch.Tensor) -> torch.Tensor:
    """B x (H*W) rank of each pixel (0 = most important). Ties are broken by a fixed-seed random order."""
    b, h, w = maps.shape
    generator = torch.Generator().manual_seed(TIE_BREAK_SEED)
    tie_order = torch.randperm(h * w, generator=generator).to(maps.device)
    flat = maps.reshape(b, h * w).float()[:, tie_order]
    order = torch.argsort(flat, dim=1, descending=True, stable=True)
    order = tie_order[order]  # pixel indices, most important first
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(h * w, device=maps.device).expand(b, -1))
    return ranks


def top_fraction(attribution, fraction: float) -> np.ndarray:
    """H x W bool: the `fraction` of a map's pixels that the deletion curve removes first (the same ranks,
    ties broken the same way; round(fraction x H x W) pixels), e.g. 0.1 for the top 10%."""
    grid = torch.as_tensor(np.asarray(attribution, dtype=np.float32))
    while grid.dim() > 2 and grid.shape[0] == 1:
        grid = grid[0]
    if grid.dim() != 2:
        raise ValueError(f"The map must be H x W, got shape {tuple(grid.shape)}.")
    if not 0.0 <= float(fraction) <= 1.0:
        raise ValueError(f"The fraction must be in [0, 1], got {fraction}.")
    h, w = grid.shape
    count = int(np.round(float(fraction) * h * w))
    ranks = pixel_ranks(torch.nan_to_num(grid, nan=0.0)[None])[0]
    return (ranks < count).view(h, w).numpy()


# ROAD's neighbourhood: (row offset, column offset), weight
ROAD_NEIGHBOURS = (((0, 1), 1 / 6), ((0, -1), 1 / 6), ((1, 0), 1 / 6), ((-1, 0), 1 / 6),
                   ((1, 1), 1 / 12), ((1, -1), 1 / 12), ((-1, 1), 1 / 12), ((-1, -1), 1 / 12))


class LinearImputer:
    """ROAD's linear imputation without noise (the caller adds seeded noise): `imputer(image C x H x W, keep H x W)`
    returns the image with every pixel where `keep` is 0 replaced by the solution of the sparse system "each removed
    pixel equals the weighted mean of its in-image neighbours" (kept neighbours enter as constants)."""

    def __call__(self, image: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        from scipy.sparse import csc_matrix
        from scipy.sparse.linalg import spsolve

        channels, h, w = image.shape
        removed = (torch.as_tensor(keep).reshape(-1) < 0.5).numpy()
        unknown = np.flatnonzero(removed)
        out = image.detach().reshape(channels, -1).clone()
        if len(unknown) == 0:
            return out.view(channels, h, w)
        values = image.detach().reshape(channels, -1).double().numpy()
        position = np.full(h * w, -1, dtype=np.int64)
        position[unknown] = np.arange(len(unknown))
        ys, xs = np.divmod(unknown, w)
        diagonal = np.zeros(len(unknown))
        right_side = np.zeros((len(unknown), channels))
        rows, cols, weights = [], [], []
        for (dy, dx), weight in ROAD_NEIGHBOURS:
            ny, nx = ys + dy, xs + dx
            inside = np.flatnonzero((ny >= 0) & (ny < h) & (nx >= 0) & (nx < w))
            diagonal[inside] += weight  # the weights of the neighbours that exist
            neighbour = ny[inside] * w + nx[inside]
            missing = removed[neighbour]
            rows.append(inside[missing])
            cols.append(position[neighbour[missing]])
            weights.append(np.full(int(missing.sum()), -weight))
            right_side[inside[~missing]] += weight * values[:, neighbour[~missing]].T
        rows.append(np.arange(len(unknown)))
        cols.append(np.arange(len(unknown)))
        weights.append(diagonal)
        system = csc_matrix((np.concatenate(weights), (np.concatenate(rows), np.concatenate(cols))),
                            shape=(len(unknown), len(unknown)))
        solution = np.asarray(spsolve(system, right_side)).reshape(len(unknown), channels)
        out[:, torch.as_tensor(unknown)] = torch.as_tensor(solution.T, dtype=out.dtype)
        return out.view(channels, h, w)


def road_imputer():
    """The imputer ROAD's removal uses (noise off: `road_fill` adds seeded noise)."""
    return LinearImputer()


def road_fill(images: torch.Tensor, removed: torch.Tensor, fill: torch.Tensor, generators: list,
              imputer=None, noise=ROAD_NOISE) -> torch.Tensor:
    """ROAD's removal: N x 3 x H x W images whose `removed` (N x H x W bool) pixels are replaced by noisy
    linear imputation from the kept ones. `fill`: the image used where nothing is kept; `generators`: one
    torch.Generator per image for the noise (seeded by the caller, so results do not depend on batching);
    `noise`: the noise's standard deviation in the images' units, a number or one per channel
    (`road_noise_scale` gives ROAD's for a model)."""
    imputer = imputer or road_imputer()
    noise = torch.as_tensor(noise, dtype=images.dtype, device=images.device).reshape(-1, 1, 1)
    out = images.clone()
    for index in range(images.shape[0]):
        mask = removed[index]
        count = int(mask.sum())
        if count == 0:
            continue
        if count == mask.numel():
            filled = fill[index].clone()
        else:
            keep = (~mask).float().cpu()
            filled = imputer(images[index].detach().float().cpu(), keep).to(images.device, images.dtype)
        shape = (images.shape[1], *mask.shape)
        noise_field = noise * torch.randn(shape, generator=generators[index]).to(images.device, images.dtype)
        out[index] = torch.where(mask.unsqueeze(0), filled + noise_field, images[index])
    return out


def road_noise_scale(bundle) -> torch.Tensor:
    """ROAD's noise for this model in [0, 1] image units, one per channel: N(0, 0.01) in the normalised units the
    model reads (the ROAD authors' and pytorch-grad-cam's convention) is 0.01 x the channel's std here."""
    return ROAD_NOISE * torch.as_tensor(bundle.std, dtype=torch.float32).reshape(-1)


def fraction_counts(steps: int, num_pixels: int) -> tuple:
    fractions = np.linspace(0.0, 1.0, steps + 1)
    counts = torch.as_tensor(np.round(fractions * num_pixels).astype(np.int64))
    return fractions, counts


@torch.no_grad()
def deletion_insertion(bundle, images: torch.Tensor, maps: torch.Tensor, targets, *, steps: int = 20,
                       reference: str = "mean", batch_size: int = 256) -> Curves:
    """Deletion and insertion curves for B images at once (spec section 1). `targets`: class indices or any
    `explainers.targets.Target` (a region): each perturbed image is read by its image's target (`curve_score`:
    its probability form, a class's softmax share or a region's mean class probability)."""

    b, _, h, w = images.shape
    maps = torch.as_tensor(maps, device=images.device)
    if maps.shape != (b, h, w):
        raise ValueError(f"maps must be B x H x W = {(b, h, w)}, got {tuple(maps.shape)}")
    target = as_target(targets, b, images.device)
    fractions, counts = fraction_counts(steps, h * w)
    counts = counts.to(images.device)
    ranks = pixel_ranks(maps)  # B x HW
    base = reference_images(images, reference, bundle.reference_color)
    imputer = road_imputer() if reference == "road" else None
    points = steps + 1
    total = b * points * 2
    scores = torch.empty(total, device=images.device)

    def make(indices: torch.Tensor) -> torch.Tensor:
        """Build the perturbed images for flat indices over (image, curve, step) without storing them all."""
        image_index = indices // (2 * points)
        curve = (indices // points) % 2  # 0 = deletion, 1 = insertion
        step = indices % points
        if reference == "road":
            top = (ranks[image_index] < counts[step].unsqueeze(1)).view(-1, h, w)
            removed = torch.where((curve == 1).view(-1, 1, 1), ~top, top)
            generators = [torch.Generator().manual_seed(ROAD_SEED + 2 * points * int(i) + int(c) * points + int(s))
                          for i, c, s in zip(image_index, curve, step)]
            return road_fill(images[image_index], removed, base[image_index], generators, imputer,
                             noise=road_noise_scale(bundle)), image_index
        top = (ranks[image_index] < counts[step].unsqueeze(1)).view(-1, 1, h, w).to(images.dtype)
        original, ref = images[image_index], base[image_index]
        deleted = original * (1 - top) + ref * top
        inserted = ref * (1 - top) + original * top
        is_insertion = (curve == 1).view(-1, 1, 1, 1)
        return torch.where(is_insertion, inserted, deleted), image_index

    for start in range(0, total, batch_size):
        indices = torch.arange(start, min(start + batch_size, total), device=images.device)
        batch, image_index = make(indices)
        scores[indices] = target.take(image_index).curve_score(bundle(batch))
    scores = scores.view(b, 2, points).cpu().numpy().astype(np.float64)
    return Curves(fractions=fractions, deletion=scores[:, 0], insertion=scores[:, 1])


POINTING_TOLERANCE_PX, POINTING_TOLERANCE_AT = 15, 224


def pointing_tolerance(image_hw) -> int:
    """TorchRay's 15 px tolerance is for 224 px images: scaled to this image's shorter side (4 px at 64 px,
    9 px at 128 px), at least 1 px."""
    return max(1, int(round(POINTING_TOLERANCE_PX * min(image_hw) / POINTING_TOLERANCE_AT)))


def pointing_game(maps: torch.Tensor, masks: torch.Tensor, tolerance: int | None = None) -> np.ndarray:
    """1 where the map's maximum falls inside the mask or within `tolerance` px of it (TorchRay's convention;
    default: `pointing_tolerance` of the map size, i.e. 15 px at 224 px)."""
    maps = torch.as_tensor(maps, dtype=torch.float32)
    masks = torch.as_tensor(masks).bool()
    b, h, w = maps.shape
    if tolerance is None:
        tolerance = pointing_tolerance((h, w))
    peaks = maps.view(b, -1).argmax(dim=1)
    ys, xs = peaks // w, peaks % w
    hits = []
    for index in range(b):
        mask_ys, mask_xs = torch.nonzero(masks[index], as_tuple=True)
        if len(mask_ys) == 0:
            hits.append(np.nan)
            continue
        distance = torch.sqrt(((mask_ys - ys[index]) ** 2 + (mask_xs - xs[index]) ** 2).float()).min()
        hits.append(float(distance <= tolerance))
    return np.array(hits)


def top_pixel_iou(maps: torch.Tensor, masks: torch.Tensor) -> np.ndarray:
    """IoU between the map's top-k pixels (k = mask area) and the mask."""
    maps = torch.as_tensor(maps, dtype=torch.float32)
    masks = torch.as_tensor(masks).bool()
    ranks = pixel_ranks(maps)
    ious = []
    for index in range(maps.shape[0]):
        mask = masks[index].flatten()
        area = int(mask.sum())
        if area == 0:
            ious.append(np.nan)
            continue
        top = ranks[index] < area
        ious.append(float((top & mask).sum()) / float((top | mask).sum()))
    return np.array(ious)


def average_ranks(values: torch.Tensor) -> torch.Tensor:
    """Ranks (0 = smallest) of a flat tensor with tied values sharing the mean of their ranks (scipy's
    'average' method)."""
    unique, inverse, counts = torch.unique(values, sorted=True, return_inverse=True, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    return (starts.double() + (counts.double() - 1) / 2)[inverse]


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman rank correlation of two maps, tied pixels given their average rank (as scipy.stats.spearmanr).
    Not the deletion engine's fixed tie-break: one shared order would rank the pixels tied in both maps (a
    ReLU's zeros, a flat region) identically and read agreement where there is none. 0 where a map is constant."""
    ra = average_ranks(torch.nan_to_num(torch.as_tensor(a).detach().double().flatten().cpu(), nan=0.0))
    rb = average_ranks(torch.nan_to_num(torch.as_tensor(b).detach().double().flatten().cpu(), nan=0.0))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()).clamp_min(1e-12))


# ------------------------------------------------------------------------------------------------
# What each metric is: declared once, as data, with the scorer that computes it. Every table, arrow, interval and
# comparison that names a metric (evaluate, statistics, the scoreboard, the CLI, the app's figures) loops over the
# declarations; adding a metric is one `Metric(...)` in `METRICS` below.
# ------------------------------------------------------------------------------------------------
class MapBatch:
    """What a per-image scorer reads for B images: the model, the images, the maps (B x H x W), the targets, the
    masks (B x H x W or None) and the curve protocol; `curves` (deletion/insertion, `curve_batch` perturbed images
    per forward pass) is computed once, on first use."""

    def __init__(self, bundle, images, maps, targets, *, steps: int = 20, reference: str = "mean", masks=None,
                 tolerance: int | None = None, curve_batch: int = 256):
        self.bundle, self.images, self.maps, self.targets = bundle, images, maps, targets
        self.steps, self.reference, self.masks, self.tolerance = steps, reference, masks, tolerance
        self.curve_batch = curve_batch
        self._curves = None

    @property
    def curves(self) -> Curves:
        if self._curves is None:
            self._curves = deletion_insertion(self.bundle, self.images, self.maps, self.targets, steps=self.steps,
                                              reference=self.reference, batch_size=self.curve_batch)
        return self._curves


@dataclass(frozen=True)
class Metric:
    """A metric's facts and its computation. `name`: its key everywhere (a report's mean, `<name>_ci95` its
    interval, `per_image[name]` its per-image scores); `better`: "higher" or "lower" (the only place a direction is
    written); `low`, `high`: its range; `chance`: what a map that knows nothing scores (None where there is no such
    level); `short`: its column title in narrow tables; `colour`: its line in figures; `score`: the per-image scorer,
    `score(MapBatch) -> B values` (None where it cannot be scored on that batch, e.g. no masks), or None for a metric
    measured by its own protocol (GridPG's mosaics, the sanity checks) rather than per image by `evaluate`."""
    name: str
    label: str
    better: str
    low: float
    high: float
    what: str
    short: str = ""
    chance: float | None = None
    colour: str = "#000000"
    score: Callable | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.better not in ("higher", "lower"):
            raise ValueError(f"metric {self.name}: better must be 'higher' or 'lower', got {self.better!r}")

    @property
    def arrow(self) -> str:
        return "\u2191" if self.better == "higher" else "\u2193"

    @property
    def better_text(self) -> str:
        return f"{self.better} is better"

    @property
    def phrase(self) -> str:
        """The label inside a sentence: 'deletion AUC'."""
        return self.label[0].lower() + self.label[1:]

    @property
    def interval_key(self) -> str:
        """Where a report keeps this metric's 95% interval: 'deletion_auc_ci95'."""
        return f"{self.name}_ci95"

    def heading(self) -> str:
        """A table column's title: 'deletion (lower better)'."""
        return f"{self.short or self.label} ({self.better} better)"

    def title(self) -> str:
        """A narrow column's title: 'deletion \u2193'."""
        return f"{self.short or self.label} {self.arrow}"

    def is_better(self, a: float, b: float) -> bool:
        """Whether score `a` is better than score `b`."""
        return a > b if self.better == "higher" else a < b

    def meets(self, value: float, bound: float) -> bool:
        """Whether `value` is at least as good as `bound` (a floor where higher is better, a ceiling otherwise)."""
        return not self.is_better(bound, value)

    def gain(self, a, b):
        """How much better `a` is than `b` (positive: better), elementwise: a - b, or b - a where lower is better."""
        return np.subtract(a, b) if self.better == "higher" else np.subtract(b, a)

    def best(self, items, key=lambda item: item):
        """The item whose `key` scores best."""
        return (max if self.better == "higher" else min)(items, key=key)

    def ranked(self, items, key=lambda item: item) -> list:
        """The items, best score first."""
        return sorted(items, key=key, reverse=self.better == "higher")


def _curve_score(attribute: str) -> Callable:
    return lambda batch: np.asarray(getattr(batch.curves, attribute), dtype=np.float64)


def _pointing_score(batch: "MapBatch"):
    if batch.masks is None:
        return None
    return pointing_game(torch.as_tensor(batch.maps).cpu(), batch.masks, batch.tolerance)


METRICS = {metric.name: metric for metric in (
    Metric("deletion_auc", "Deletion AUC", "lower", 0.0, 1.0, short="deletion", colour="#D55E00",
           score=_curve_score("deletion_auc"),
           what="the target's probability as the map's top pixels are removed first, area under the curve: it falls "
                "fast when the map found the evidence"),
    Metric("insertion_auc", "Insertion AUC", "higher", 0.0, 1.0, short="insertion", colour="#0072B2",
           score=_curve_score("insertion_auc"),
           what="the target's probability as the map's top pixels come back first, area under the curve: it rises "
                "fast when the map found the evidence"),
    Metric("ins_minus_del", "Insertion \u2212 deletion", "higher", -1.0, 1.0, short="ins-del", colour="#009E73",
           score=_curve_score("ins_minus_del"), what="insertion AUC minus deletion AUC: both curves in one number"),
    Metric("pointing_game", "Pointing game", "higher", 0.0, 1.0, short="pointing", score=_pointing_score,
           what="share of maps whose peak falls inside the object's mask (within a tolerance)"),
    Metric("top_pixel_iou", "Top-pixel IoU", "higher", 0.0, 1.0, short="IoU",
           what="overlap of the map's top pixels (as many as the mask has) with the mask"),
    Metric("gridpg", "Grid pointing game", "higher", 0.0, 1.0, short="GridPG", chance=0.25,
           what="share of a map's positive attribution inside its class's quadrant of a 2 x 2 mosaic"),
    Metric("top_quarter", "Top quarter in quadrant", "higher", 0.0, 1.0, short="top quarter (rank only)",
           chance=0.25, what="share of the map's top 25% of pixels inside its class's quadrant (ranks only)"),
    Metric("spearman_top1_top2", "Class dependence (Spearman)", "lower", -1.0, 1.0, short="rho top1/top2",
           what="rank correlation of the maps for the predicted and the runner-up class: 1 is the same map "
                "whatever the class"),
    Metric("randomisation_spearman", "Model randomisation (Spearman)", "lower", -1.0, 1.0, short="rho vs trained",
           what="rank correlation of the map with the trained model's after its top layers are re-initialised: a "
                "faithful map changes"),
)}
CURVE_METRICS = ("deletion_auc", "insertion_auc", "ins_minus_del")  # what one image's two curves give


def scored_metrics() -> list:
    """The metrics `evaluate` scores per image (those with a scorer), in declaration order."""
    return [metric for metric in METRICS.values() if metric.score is not None]


def score_batch(batch: MapBatch) -> dict:
    """{metric name: B values} of every per-image metric that can be scored on this batch."""
    out = {}
    for metric in scored_metrics():
        values = metric.score(batch)
        if values is not None:
            out[metric.name] = np.asarray(values, dtype=np.float64).reshape(-1)
    return out


# the per-image keys and interval keys of reports written before one name per metric
LEGACY_KEYS = {"deletion": "deletion_auc", "insertion": "insertion_auc", "pointing": "pointing_game"}
LEGACY_INTERVALS = {"deletion_auc": "deletion_ci95", "insertion_auc": "insertion_ci95"}


def per_image(scores: dict) -> dict:
    """{metric name: array} from a per-image block (a report row's `per_image`, or {key: values} built by a caller),
    in declaration order; reads the older keys ('deletion', 'insertion', 'pointing') and derives ins-del from the
    two curves where the block does not carry it. Keys that name no metric are left out."""
    named = {LEGACY_KEYS.get(key, key): value for key, value in scores.items()}
    if "ins_minus_del" not in named and {"deletion_auc", "insertion_auc"} <= set(named):
        named["ins_minus_del"] = np.subtract(np.asarray(named["insertion_auc"], dtype=np.float64),
                                             np.asarray(named["deletion_auc"], dtype=np.float64))
    return {name: np.asarray([np.nan if v is None else v for v in np.asarray(named[name], dtype=object).reshape(-1)],
                             dtype=np.float64)
            for name in METRICS if name in named}


def summary_value(row: dict, name: str):
    """A record's or report row's value of a curve metric (ins-del derived from the two AUCs where absent)."""
    if row.get(name) is None and name == "ins_minus_del" and None not in (row.get("deletion_auc"),
                                                                           row.get("insertion_auc")):
        return row["insertion_auc"] - row["deletion_auc"]
    return row.get(name)


def interval(row: dict, name: str):
    """A report row's 95% interval of a metric (older reports: 'deletion_ci95' for deletion_auc)."""
    return row.get(METRICS[name].interval_key, row.get(LEGACY_INTERVALS.get(name, "")))


def register(metric: Metric) -> Metric:
    """Add a metric to the declarations (what a plug-in or a test does; the built-in ones are declared above)."""
    if metric.name in METRICS:
        raise ValueError(f"a metric named '{metric.name}' is already declared")
    METRICS[metric.name] = metric
    return metric


def unregister(name: str) -> None:
    METRICS.pop(name, None)


# A method whose maps for the two top classes correlate this much (mean Spearman rho) draws nearly the same map
# whatever the class: it shows where the evidence lies, not which class it supports (ours; rollout, which never
# reads the class, scores 1.0, Grad-CAM about -0.25 on bloodmnist-vit)
CLASS_BLIND_RHO = 0.8
# ... and when it is that much above Grad-CAM's rho on the same images (paired interval above 0): two classes whose
# evidence lies in the same place (two dog breeds) give every method two similar maps, which is not class-blindness
CLASS_BLIND_MARGIN = 0.3


def metric(name: str) -> Metric:
    if name not in METRICS:
        raise KeyError(f"Unknown metric '{name}'. Known: {', '.join(METRICS)}")
    return METRICS[name]


def better_arrow(name: str) -> str:
    """'\u2191' (higher is better) or '\u2193' (lower is better) for a declared metric."""
    return metric(name).arrow


def better_text(name: str) -> str:
    """'higher is better' or 'lower is better' for a declared metric."""
    return metric(name).better_text


def curve_note() -> str:
    """One sentence on reading deletion and insertion AUCs, from their declarations."""
    deletion, insertion = METRICS["deletion_auc"], METRICS["insertion_auc"]
    return (f"{deletion.better.capitalize()} {deletion.phrase} is better "
            "(the score falls fast when the top pixels go); "
            f"{insertion.better} {insertion.phrase} is better "
            "(the score rises fast when they come back).")
