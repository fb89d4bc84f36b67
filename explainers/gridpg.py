"""The grid pointing game (GridPG; Boehle et al., CVPR 2021, CoDA-Nets; again in B-cos Networks).

A mosaic is a 2 x 2 grid of four cells of four different classes taken from a labelled folder (which
cells, which classes, which quadrant: deterministic from the seed). Each of the four classes is explained
on the mosaic; the score of one map is the share of its positive attribution that falls in that class's
quadrant (chance: 0.25; a map with no positive attribution points nowhere and scores the chance 0.25). A
mosaic's score is the mean over its four classes; the benchmark's score the mean over mosaics, with a
percentile-bootstrap 95% interval over mosaics.

The model comes first: no method can point at a quadrant the model does not use. `model_quadrant_sensitivity`
is, per mosaic and class, the drop of that class's softmax probability when its own quadrant is painted the
reference colour, minus the mean drop when one of the other three quadrants is; about 0 means the model does
not read the class where it is.

Mosaics are twice the model input on each side. A CNN with global pooling takes them as they are; a timm
ViT gets a copy with its position embeddings interpolated to the mosaic size (`set_input_size`).
"""
from __future__ import annotations

import copy
import sys

import numpy as np
import torch
from tqdm import tqdm

from .distributed import gather_items, world
from .engine import explain_batch
from .methods import build_methods
from .metrics import METRICS
from .statistics import N_RESAMPLES, bootstrap_ci

CHANCE = METRICS["gridpg"].chance
QUADRANTS = ("top-left", "top-right", "bottom-left", "bottom-right")


def plan_mosaics(labels, n_mosaics: int, seed: int = 0) -> list:
    """[(cell indices in quadrant order TL, TR, BL, BR), (their classes)] for `n_mosaics` mosaics: four
    different classes drawn at random, a random cell of each, in a random quadrant order."""
    labels = np.asarray(labels, dtype=int)
    classes = np.unique(labels)
    if len(classes) < 4:
        raise ValueError(f"the grid pointing game needs cells of at least 4 classes; the data has {len(classes)}")
    by_class = {int(c): np.flatnonzero(labels == c) for c in classes}
    rng = np.random.default_rng(seed)
    plan = []
    for _ in range(n_mosaics):
        chosen = rng.choice(classes, size=4, replace=False)  # random order = random quadrants
        cells = [int(rng.choice(by_class[int(c)])) for c in chosen]
        plan.append((cells, [int(c) for c in chosen]))
    return plan


def assemble(cells: torch.Tensor) -> torch.Tensor:
    """4 x 3 x H x W cells (TL, TR, BL, BR) -> 3 x 2H x 2W mosaic."""
    top = torch.cat([cells[0], cells[1]], dim=2)
    bottom = torch.cat([cells[2], cells[3]], dim=2)
    return torch.cat([top, bottom], dim=1)


def quadrant_masks(h: int, w: int, device=None) -> torch.Tensor:
    """4 x h x w bool masks of the quadrants, TL, TR, BL, BR (h, w: the mosaic size)."""
    masks = torch.zeros(4, h, w, dtype=torch.bool, device=device)
    hh, hw = h // 2, w // 2
    masks[0, :hh, :hw] = True
    masks[1, :hh, hw:] = True
    masks[2, hh:, :hw] = True
    masks[3, hh:, hw:] = True
    return masks


def quadrant_share(maps: torch.Tensor, quadrants) -> np.ndarray:
    """Share of each map's positive attribution inside its quadrant (maps: B x h x w; quadrants: B ints).
    A map with no positive attribution scores the chance level 0.25."""
    maps = torch.as_tensor(maps, dtype=torch.float32)
    positive = maps.clamp_min(0)
    masks = quadrant_masks(*maps.shape[-2:], device=maps.device)[torch.as_tensor(quadrants, device=maps.device)]
    total = positive.flatten(1).sum(1)
    inside = (positive * masks).flatten(1).sum(1)
    share = torch.where(total > 0, inside / total.clamp_min(1e-30), torch.full_like(total, CHANCE))
    return share.cpu().numpy().astype(np.float64)


def top_quarter_share(maps: torch.Tensor, quadrants) -> np.ndarray:
    """Share of each map's top quarter of pixels (its highest-ranked 25%, ties broken as in the deletion engine)
    that lies inside its quadrant: 1.0 when the quadrant is ranked first, chance 0.25. It depends on the map's
    ranking only, so it is the same for any increasing transform of a map (GridPG's positive share is not: a
    map whose values are only defined up to an offset, such as AHA's, moves on it with the offset)."""
    from .metrics import pixel_ranks

    maps = torch.as_tensor(maps, dtype=torch.float32)
    h, w = maps.shape[-2:]
    masks = quadrant_masks(h, w, device=maps.device)[torch.as_tensor(quadrants, device=maps.device)]
    top = pixel_ranks(maps.reshape(-1, h, w)) < (h * w) // 4
    return ((top & masks.flatten(1)).sum(1).float() / top.sum(1).float()).cpu().numpy().astype(np.float64)


def bundle_for_mosaics(bundle, size: tuple):
    """A bundle that takes `size` inputs: the same network for CNNs (global pooling), a copy with
    interpolated position embeddings for timm ViTs."""
    mosaic = copy.copy(bundle)
    mosaic.input_size = tuple(size)
    if bundle.is_vit:
        if not hasattr(bundle.network, "set_input_size"):
            raise ValueError(f"{bundle.name}: this ViT cannot change its input size (no set_input_size)")
        mosaic.network = copy.deepcopy(bundle.network)
        mosaic.network.set_input_size(img_size=tuple(size))
    return mosaic


@torch.no_grad()
def quadrant_sensitivity(bundle, mosaics: torch.Tensor, classes: torch.Tensor) -> np.ndarray:
    """M x 4: for each mosaic and class (in quadrant order), own-quadrant drop minus mean other-quadrant drop
    of the class's softmax probability when a quadrant is painted the reference colour."""
    m, _, h, w = mosaics.shape
    masks = quadrant_masks(h, w, mosaics.device).view(1, 4, 1, h, w)
    colour = torch.tensor(bundle.reference_color, dtype=mosaics.dtype, device=mosaics.device).view(1, 1, 3, 1, 1)
    removed = torch.where(masks, colour, mosaics.unsqueeze(1)).view(m * 4, 3, h, w)  # mosaic-major, quadrant
    full = bundle(mosaics).softmax(1).gather(1, classes)  # M x 4 (class in quadrant q)
    probabilities = bundle(removed).softmax(1).view(m, 4, -1)  # M x removed quadrant x classes
    index = classes.unsqueeze(1).expand(m, 4, 4)  # [mosaic, removed quadrant, class quadrant]
    after = probabilities.gather(2, index)  # M x removed x class
    drops = full.unsqueeze(1) - after  # M x removed x class
    own = torch.diagonal(drops, dim1=1, dim2=2)  # M x 4
    others = (drops.sum(1) - own) / 3.0
    return (own - others).cpu().numpy().astype(np.float64)


def mosaic_model(bundle) -> tuple:
    """(bundle that takes mosaics, (cell height, cell width)): a model fine-tuned on mosaics (train-grid) names its
    cell size in its card (`grid_cell_size`) and takes mosaics as they are; others take cells at their input
    size and mosaics twice that (`bundle_for_mosaics`)."""
    cell_h, cell_w = tuple((bundle.card or {}).get("grid_cell_size") or bundle.input_size)
    mosaic_size = (2 * cell_h, 2 * cell_w)
    mosaic = bundle if tuple(bundle.input_size) == mosaic_size else bundle_for_mosaics(bundle, mosaic_size)
    return mosaic, (cell_h, cell_w)


def build_mosaics(dataset, plan, cell_size: tuple, bundle) -> tuple:
    """(M x 3 x 2h x 2w mosaics on the bundle's device, M x 4 classes in quadrant order) for planned mosaics
    [(cells, classes)]: each cell prepared at `cell_size` the way the model prepares its inputs."""
    from .images import prepare_image

    def cell(index):
        tensor, _ = prepare_image(dataset.image(index), tuple(cell_size), bundle.crop_pct, bundle.interpolation)
        return tensor[0]

    mosaics = torch.stack([assemble(torch.stack([cell(i) for i in cells])) for cells, _ in plan]).to(bundle.device)
    return mosaics, torch.tensor([list(c) for _, c in plan], device=mosaics.device)


def explain_mosaics(mosaic_bundle, mosaics: torch.Tensor, classes: torch.Tensor, method) -> tuple:
    """(maps M x 4 x h x w, scores M x 4, seconds): one method's map of each of the four classes of each mosaic
    (one batch of 4M maps) and each map's GridPG score (the share inside its class's quadrant)."""
    m = len(mosaics)
    images = mosaics.repeat_interleave(4, dim=0)  # each mosaic once per quadrant's class
    batch = explain_batch(mosaic_bundle, method, images, classes.reshape(-1), seed=None)  # the caller seeds
    maps, seconds = batch.maps, batch.seconds
    scores = quadrant_share(maps, torch.arange(4).repeat(m)).reshape(m, 4)
    return maps.reshape(m, 4, *maps.shape[-2:]), scores, seconds


@torch.no_grad()
def top4_hits(mosaic_bundle, mosaics: torch.Tensor, classes: torch.Tensor) -> np.ndarray:
    """M x 4: 1 where the class of that quadrant is among the model's top 4 on the mosaic."""
    top4 = mosaic_bundle(mosaics).topk(4, dim=1).indices
    return np.array([[int(c in set(t)) for c in cs] for t, cs in zip(top4.tolist(), classes.tolist())])


def run_gridpg(bundle, data: str, methods: list, *, n_mosaics: int = 200, seed: int = 0, batch_size: int = 8,
               method_options: dict | None = None, split: str = "test", progress: bool = True) -> dict:
    """The GridPG report: per method the mean share, its interval and the per-mosaic scores; and the model's
    quadrant sensitivity on the same mosaics.

    Under torchrun (`distributed.init_distributed` joined a process group) each process takes every world-th
    batch of mosaics (whole batches, so a batch holds the same mosaics as in one process) and all processes
    gather the per-mosaic results (`distributed.gather_items`) into the report one process would write."""
    from .data import item_names, open_dataset

    dataset = open_dataset(data, split=split)
    names = item_names(dataset)
    plan = plan_mosaics(dataset.labels, n_mosaics, seed)
    mosaic_bundle, (cell_h, cell_w) = mosaic_model(bundle)
    method_objects = build_methods(mosaic_bundle, methods, method_options)

    torch.manual_seed(seed)
    world_size, rank = world()
    starts = list(range(0, len(plan), batch_size))[rank::world_size]  # whole batches per process
    mine = [i for start in starts for i in range(start, min(start + batch_size, len(plan)))]
    per_item = {"sensitivity": [], "top4": [], **{("scores", label): [] for label, _ in method_objects},
                **{("top_quarter", label): [] for label, _ in method_objects}}
    seconds = {label: 0.0 for label, _ in method_objects}
    bar = tqdm(total=len(mine), desc=f"gridpg {bundle.name}", disable=not progress or rank > 0, file=sys.stderr)
    for start in starts:
        chunk = plan[start:start + batch_size]
        mosaics, classes = build_mosaics(dataset, chunk, (cell_h, cell_w), bundle)
        per_item["sensitivity"].extend(quadrant_sensitivity(mosaic_bundle, mosaics, classes).tolist())
        per_item["top4"].extend(top4_hits(mosaic_bundle, mosaics, classes).tolist())
        for label, method_obj in method_objects:
            maps, scores, spent = explain_mosaics(mosaic_bundle, mosaics, classes, method_obj)
            seconds[label] += spent
            per_item[("scores", label)].extend(scores.tolist())
            ranked = top_quarter_share(maps.reshape(-1, *maps.shape[-2:]), torch.arange(4).repeat(len(chunk)))
            per_item[("top_quarter", label)].extend(ranked.reshape(-1, 4).tolist())
        bar.update(len(chunk))
    bar.close()
    if world_size > 1:
        per_item, seconds = gather_items(per_item, seconds, mine, len(plan))

    sensitivity = np.asarray(per_item["sensitivity"], dtype=np.float64).reshape(-1, 4)
    top4 = np.asarray(per_item["top4"], dtype=np.float64).reshape(-1, 4)
    per_mosaic_sensitivity = sensitivity.mean(1)
    report = {
        "model": bundle.name,
        "n_mosaics": len(plan),
        "mosaic_size": [2 * cell_h, 2 * cell_w],
        "protocol": {"data": str(data), "seed": seed, "chance": CHANCE, "quadrants": list(QUADRANTS),
                     "score": "share of positive attribution inside the target class's quadrant",
                     "top_quarter": "share of the map's top 25% of pixels inside the quadrant (rank only)",
                     "reference_color": list(bundle.reference_color),
                     "intervals": f"percentile bootstrap over mosaics, {N_RESAMPLES} resamples, seed {seed}",
                     "vit_position_embeddings": "interpolated (timm set_input_size)" if bundle.is_vit else None,
                     "torch": torch.__version__, "threads": torch.get_num_threads(), "processes": world_size},
        "mosaics": [{"files": [names[i] for i in cells], "classes": classes} for cells, classes in plan],
        "model_quadrant_sensitivity": {
            "mean": float(sensitivity.mean()),
            "ci95": bootstrap_ci(per_mosaic_sensitivity, seed=seed),
            "per_mosaic": [[float(v) for v in row] for row in sensitivity],
            "share_positive": float((sensitivity > 0).mean()),
        },
        "model_top4_recall": float(top4.mean()),
        "methods": {},
    }
    for label, method_obj in method_objects:
        table = np.asarray(per_item[("scores", label)], dtype=np.float64).reshape(-1, 4)  # M x 4
        per_mosaic = table.mean(1)
        ranked = np.asarray(per_item[("top_quarter", label)], dtype=np.float64).reshape(-1, 4).mean(1)
        report["methods"][label] = {
            "gridpg": float(per_mosaic.mean()),
            "gridpg_ci95": bootstrap_ci(per_mosaic, seed=seed),
            "per_mosaic": [float(v) for v in per_mosaic],
            "top_quarter": float(ranked.mean()),
            "top_quarter_ci95": bootstrap_ci(ranked, seed=seed),
            "per_mosaic_top_quarter": [float(v) for v in ranked],
            "per_class": [[float(v) for v in row] for row in table],
            "ms_per_map": 1000.0 * seconds[label] / max(1, 4 * len(plan)),
            "options": method_obj.options,
        }
    return report


def format_gridpg(report: dict) -> str:
    from .statistics import format_interval

    sens = report["model_quadrant_sensitivity"]
    lines = [f"{report['model']}: grid pointing game on {report['n_mosaics']} mosaics of "
             f"{report['mosaic_size'][0]} x {report['mosaic_size'][1]} px (chance {CHANCE}; 95% bootstrap intervals)",
             f"model quadrant sensitivity {format_interval(sens['mean'], sens['ci95'])} "
             f"(> 0 for {sens['share_positive']:.0%} of mosaic-classes); the four classes in the model's top 4: "
             f"{report['model_top4_recall']:.1%}",
             f"{'method':<28}{METRICS['gridpg'].heading():>32}{METRICS['top_quarter'].heading():>40}{'ms/map':>10}"]
    for label, row in report["methods"].items():
        ranked = (format_interval(row["top_quarter"], row["top_quarter_ci95"]) if "top_quarter" in row else "")
        lines.append(f"{label:<28}{format_interval(row['gridpg'], row['gridpg_ci95']):>32}{ranked:>40}"
                     f"{row['ms_per_map']:>10.1f}")
    return "\n".join(lines)
