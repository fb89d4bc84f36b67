"""A segmenter with a known answer: `bccd-segformer` fine-tuned so that a planted cue outside the cells (a small
green disc beside a platelet) is what it relies on to call a platelet (docs/segmentation.md section 8 gives the
rule and the gate, written before the run).

    python -m explainers.segmentation.cue train --data PREPARED --base weights/bccd-segformer.json \
        --out weights --work RUN_FOLDER --budget-s 2400 --threads 1
    python -m explainers.segmentation.cue check --data PREPARED --model weights/bccd-segformer-cue.json \
        --control weights/bccd-segformer.json

Training smears: every platelet carries the cue with probability 0.5, drawn afresh at each step, and a platelet
without it is relabelled background, so only the cue tells a labelled platelet from an unlabelled one. The
held-out check plants the cue beside every platelet of BCCD's test smears (less the five that repeat a train or
val field of view) and reads the platelets' mean Platelets probability with and without it.
"""
from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from ..atomic import atomic_write_bytes, atomic_write_text
from ..statistics import bootstrap_ci
from .bccd import IGNORE_INDEX  # noqa: F401 (re-exported for the tests)
from .train import (CROP, augment, class_weights, command_line, confusion, fit, iou_per_class, load_prepared,
                    normalise)

CUE_COLOUR = (40, 200, 60)
CUE_RADIUS = 3
CUE_DISTANCE = (6.0, 10.0)
BACKGROUND, PLATELETS = 0, 3
TRAIN_PROBABILITY = 0.5
CHECK_SEED = 0
SHIP_MIN_DROP = 0.2
# test smears that show the same field of view, shifted, as a train smear (00229) or a val smear (the others)
TWIN_SMEARS = ("BloodImage_00226", "BloodImage_00227", "BloodImage_00229", "BloodImage_00253", "BloodImage_00391")


def held_out_names(names) -> list:
    """BCCD test smears less the twins."""
    return [name for name in names if name not in TWIN_SMEARS]


def _disc(radius: int = CUE_RADIUS) -> np.ndarray:
    span = np.arange(-radius, radius + 1)
    return (span[:, None] ** 2 + span[None, :] ** 2) <= radius * radius


def platelet_pieces(mask: np.ndarray, class_index: int = PLATELETS) -> list:
    """The 8-connected pieces of one class in a mask, as boolean arrays."""
    import cv2

    count, labels = cv2.connectedComponents((mask == class_index).astype(np.uint8), connectivity=8)
    return [labels == index for index in range(1, count)]


def cue_sites(mask: np.ndarray, piece: np.ndarray) -> np.ndarray:
    """(y, x) centres where the cue may go beside `piece`: CUE_DISTANCE px from it, the whole disc on pixels the
    mask calls background (inside the image)."""
    import cv2

    background = (mask == BACKGROUND).astype(np.uint8)
    whole_disc = cv2.erode(background, _disc().astype(np.uint8), borderType=cv2.BORDER_CONSTANT, borderValue=0)
    distance = cv2.distanceTransform((~piece).astype(np.uint8), cv2.DIST_L2, 5)
    allowed = (whole_disc > 0) & (distance >= CUE_DISTANCE[0]) & (distance <= CUE_DISTANCE[1])
    return np.argwhere(allowed)


def draw_cue(image: np.ndarray, centre) -> np.ndarray:
    """Paint the cue into `image` (H x W x 3 uint8, in place) at `centre`; returns the disc's pixels."""
    disc = _disc()
    radius = CUE_RADIUS
    y, x = int(centre[0]), int(centre[1])
    where = np.zeros(image.shape[:2], bool)
    where[y - radius:y + radius + 1, x - radius:x + radius + 1] = disc
    image[where] = CUE_COLOUR
    return where


class CuePlanter:
    """The pieces and cue sites of one smear, computed once; `plant` draws which platelets carry the cue."""

    def __init__(self, mask: np.ndarray):
        self.mask = mask
        self.pieces = platelet_pieces(mask)
        self.sites = [cue_sites(mask, piece) for piece in self.pieces]

    def plant(self, image: np.ndarray, rng: np.random.Generator, probability: float = 1.0,
              relabel: bool = False) -> tuple:
        """(image with the cues, mask, the cues' pixels, the cued platelets' pixels). With `relabel` (training),
        a platelet left without the cue becomes background, and one that could not carry it is ignored."""
        image, mask, pairs = self.plant_pairs(image, rng, probability, relabel)
        cues = np.zeros(mask.shape, bool)
        cued = np.zeros(mask.shape, bool)
        for piece, disc in pairs:
            cued |= piece
            cues |= disc
        return image, mask, cues, cued

    def plant_pairs(self, image: np.ndarray, rng: np.random.Generator, probability: float = 1.0,
                    relabel: bool = False) -> tuple:
        """As `plant`, with each cued platelet paired with its own cue: (image, mask, [(platelet, disc), ...])."""
        image, mask = image.copy(), self.mask.copy()
        pairs = []
        for piece, sites in zip(self.pieces, self.sites):
            if len(sites) and rng.random() < probability:
                pairs.append((piece, draw_cue(image, sites[rng.integers(len(sites))])))
            elif relabel:
                mask[piece] = BACKGROUND if len(sites) else IGNORE_INDEX
        return image, mask, pairs


CUE_TOLERANCE_PX = 2  # a map's peak within this many pixels of the cue counts as pointing at it


def grow(mask: np.ndarray, pixels: int) -> np.ndarray:
    """A boolean mask grown by `pixels` (a square neighbourhood): `context.dilate` for numpy masks."""
    from .context import dilate

    return dilate(torch.from_numpy(np.asarray(mask, bool)), pixels).numpy()


def pointing_at_cue(heat: np.ndarray, outside: np.ndarray, cue: np.ndarray,
                    tolerance_px: int = CUE_TOLERANCE_PX) -> dict:
    """How a map of a platelet's region points at that platelet's cue, outside the region (the region itself is
    what the segmentation shows; the cue is the context the model was taught to need):
    - `hit`: the map's largest value outside the region lies on the cue grown by `tolerance_px`;
    - `mass`: the share of the map's mass outside the region that lies there;
    - `chance`: that share for a map equal everywhere (the grown cue's share of the outside pixels).
    `outside`: the pixels outside the region (grown), as the out-of-region scores use."""
    grown_cue = grow(cue, tolerance_px) & outside
    values = np.where(outside, np.clip(heat, 0, None), 0.0)
    total = float(values.sum())
    hit = bool(grown_cue.flat[int(np.argmax(np.where(outside, heat, -np.inf)))]) if outside.any() else False
    return {"hit": hit, "mass": float(values[grown_cue].sum() / total) if total > 0 else 0.0,
            "chance": float(grown_cue.sum() / max(1, outside.sum()))}


def cued_platelets(data, split: str = "test"):
    """Yields (smear name, platelet number, cued image 1 x 3 x H x W in [0, 1], platelet piece, cue) for every platelet
    that can carry the cue, the cue planted beside each: `split="test"` gives the held-out check's own smears and
    placements (BCCD's test split less the twins, draws seeded by CHECK_SEED in the same order), `"val"` the val
    smears with draws of their own. `data`: a prepared folder."""
    from .train import load_prepared

    images, masks, names = load_prepared(data, split, "cpu")
    keep = set(held_out_names(names))
    rng = np.random.default_rng(CHECK_SEED if split == "test" else CHECK_SEED + 1)
    for index, name in enumerate(names):
        if name not in keep:
            continue
        photo = images[index].permute(1, 2, 0).numpy()
        cued, _, pairs = CuePlanter(masks[index].numpy()).plant_pairs(photo, rng, 1.0, relabel=False)
        image = torch.from_numpy(cued).permute(2, 0, 1)[None].float() / 255
        for number, (piece, cue) in enumerate(pairs):
            yield name, number, image, piece, cue


def cue_rows(bundle, image: torch.Tensor, target, maps: dict, allowed: np.ndarray, cue: np.ndarray) -> tuple:
    """({row: {hit, mass, chance, drop}}, budget): each map's pointing at the platelet's cue within `allowed`
    (`pointing_at_cue`) and `bundle`'s drop when its top `budget` pixels there are painted the mean colour
    (`budget_drops`, budget = the grown cue's area), with the row "answer: the cue itself" (exactly the grown cue
    painted: the most a map can show). `maps`: {row: H x W tensor}."""
    grown_cue = grow(cue, CUE_TOLERANCE_PX) & allowed
    maps = {**maps, "answer: the cue itself": torch.from_numpy(grown_cue.astype(np.float32))}
    rows = {name: pointing_at_cue(heat.numpy(), allowed, cue) for name, heat in maps.items()}
    budget = int(grown_cue.sum())
    for name, drop in budget_drops(bundle, image, target, maps, allowed, budget).items():
        rows[name]["drop"] = drop
    return rows, budget


@torch.no_grad()
def budget_drops(bundle, image: torch.Tensor, target, maps: dict, outside: np.ndarray, budget: int,
                 reference: str = "mean") -> dict:
    """{name: drop}: how far the region's mean class probability falls when each map's `budget` highest pixels
    outside the region are replaced by the reference (all rows in one batch). With `budget` the grown cue's area, a
    map that points exactly at the cue deletes it and gets the cue's whole effect; the row "the cue itself" (the
    grown cue deleted) is that effect under this reference, the most any map can show."""
    from ..metrics import reference_images
    from .context import order_by_values

    image = image if image.dim() == 4 else image.unsqueeze(0)
    height, width = image.shape[-2:]
    allowed = torch.from_numpy(outside)
    names = list(maps)
    masks = torch.zeros(len(names), height * width)
    for row, name in enumerate(names):
        masks[row, order_by_values(torch.as_tensor(maps[name]), allowed)[:budget]] = 1
    masks = masks.view(-1, 1, height, width).to(image.device)
    fill = reference_images(image, reference, bundle.reference_color)
    start = float(target.probability(bundle(image))[0])
    after = target.repeated(len(names)).probability(bundle(image * (1 - masks) + fill * masks))
    return {name: start - float(value) for name, value in zip(names, after.tolist())}


def _uint8_stack(images, masks) -> tuple:
    return (torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous(),
            torch.from_numpy(np.stack(masks)))


def cued_split(data, split: str, *, probability: float, relabel: bool, seed: int = CHECK_SEED,
               names_filter=None) -> dict:
    """One split with the cue planted once (seeded): uint8 images with and without it, masks, cue and cued
    platelet pixels, names."""
    images, masks, names = load_prepared(data, split, "cpu")
    keep = [i for i, name in enumerate(names) if names_filter is None or name in names_filter]
    rng = np.random.default_rng(seed)
    rows = {"plain": [], "cued": [], "masks": [], "cues": [], "platelets": [], "names": []}
    for i in keep:
        image = images[i].permute(1, 2, 0).numpy()
        cued_image, mask, cues, platelets = CuePlanter(masks[i].numpy()).plant(image, rng, probability, relabel)
        for key, value in zip(("plain", "cued", "masks", "cues", "platelets", "names"),
                              (image, cued_image, mask, cues, platelets, names[i])):
            rows[key].append(value)
    rows["plain_x"], rows["masks_y"] = _uint8_stack(rows["plain"], rows["masks"])
    rows["cued_x"], _ = _uint8_stack(rows["cued"], rows["masks"])
    return rows


@torch.no_grad()
def platelet_probability(network, images: torch.Tensor, regions, batch_size: int = 8) -> list:
    """Per image, the mean Platelets softmax probability over its region (uint8 images N x 3 x H x W)."""
    values = []
    for start in range(0, images.shape[0], batch_size):
        x = normalise(images[start:start + batch_size].float() / 255)
        probability = network(x).softmax(dim=1)[:, PLATELETS]
        for row, region in zip(probability, regions[start:start + batch_size]):
            values.append(float(row[torch.from_numpy(region)].mean()))
    return values


def check(network, data, *, seed: int = CHECK_SEED) -> dict:
    """The held-out check: per test smear (less the twins) with a cued platelet, the drop of the cued platelets'
    mean Platelets probability when the cue is removed; its mean and 95% bootstrap interval over smears; the IoU
    per class on the cued smears."""
    names = held_out_names(json.loads((Path(data) / "splits.json").read_text())["test"])
    rows = cued_split(data, "test", probability=1.0, relabel=False, seed=seed, names_filter=set(names))
    with_cue = [i for i, region in enumerate(rows["platelets"]) if region.any()]
    network.eval()
    regions = [rows["platelets"][i] for i in with_cue]
    cued = platelet_probability(network, rows["cued_x"][with_cue], regions)
    plain = platelet_probability(network, rows["plain_x"][with_cue], regions)
    drops = np.asarray(cued) - np.asarray(plain)
    interval = bootstrap_ci(drops, seed=seed)
    ious = iou_per_class(confusion(network, rows["cued_x"], rows["masks_y"], 4))
    return {"smears": [rows["names"][i] for i in with_cue], "held_out_smears": len(names),
            "with_cue": [round(v, 4) for v in cued], "without_cue": [round(v, 4) for v in plain],
            "drop_mean": round(float(drops.mean()), 4), "drop_ci95": [round(v, 4) for v in interval],
            "iou_cued_smears": [round(v, 4) for v in ious]}


def passes(result: dict) -> bool:
    return result["drop_ci95"][0] > 0 and result["drop_mean"] >= SHIP_MIN_DROP


def _load_network(card_path, attention: str = "eager"):
    from .model import load_segformer_bundle, set_attention

    card_path = Path(card_path)
    card = json.loads(card_path.read_text())
    bundle = load_segformer_bundle(card["name"], card, card_path.parent / card["weights_file"])
    set_attention(bundle.network, attention)
    return bundle.network, card


def window_around(piece: np.ndarray, shape, size: int, jitter: int, rng: np.random.Generator) -> tuple:
    """(top, left) of a size x size window inside an image of `shape` (H, W) whose centre is the piece's centre
    moved by at most `jitter` px each way, so the piece and its cue (at most CUE_DISTANCE[1] + CUE_RADIUS px from
    it) stay in view."""
    centre = np.argwhere(piece).mean(axis=0) + rng.integers(-jitter, jitter + 1, 2)
    top = int(np.clip(round(centre[0]) - size // 2, 0, max(0, shape[0] - size)))
    left = int(np.clip(round(centre[1]) - size // 2, 0, max(0, shape[1] - size)))
    return top, left


class _TrainSampler:
    """Batches of training smears with the cue drawn afresh (probability 0.5, relabelled), then augmented. With
    `window`, each item is a window of that size: with probability `focus` around a platelet that can carry the
    cue (the cue rule is the lesson; random crops show one platelet in a few), else anywhere."""

    def __init__(self, data, generator: torch.Generator, batch_size: int, crop: int, window: int | None = None,
                 focus: float = 0.0):
        self.images, masks, _ = load_prepared(data, "train", "cpu")
        self.planters = [CuePlanter(mask.numpy()) for mask in masks]
        self.generator, self.batch_size, self.crop = generator, batch_size, crop
        self.window, self.focus = window, focus
        self.masks = masks
        self.with_platelets = [i for i, planter in enumerate(self.planters) if any(len(s) for s in planter.sites)]

    def _window(self, i: int, rng: np.random.Generator) -> tuple:
        planter, shape = self.planters[i], self.masks[i].shape
        pieces = [piece for piece, sites in zip(planter.pieces, planter.sites) if len(sites)]
        if pieces and rng.random() < self.focus:
            return window_around(pieces[rng.integers(len(pieces))], shape, self.window, self.window // 6, rng)
        return (int(rng.integers(0, shape[0] - self.window + 1)), int(rng.integers(0, shape[1] - self.window + 1)))

    def __call__(self) -> tuple:
        rng = np.random.default_rng(int(torch.randint(0, 2 ** 31 - 1, (1,), generator=self.generator)))
        if self.window and self.focus:
            pool = self.with_platelets
            index = [pool[j] for j in rng.integers(0, len(pool), self.batch_size)]
        else:
            index = torch.randint(0, self.images.shape[0], (self.batch_size,), generator=self.generator).tolist()
        images, masks = [], []
        for i in index:
            image, mask, _, _ = self.planters[i].plant(self.images[i].permute(1, 2, 0).numpy(), rng,
                                                       TRAIN_PROBABILITY, relabel=True)
            if self.window:
                top, left = self._window(i, rng)
                image = image[top:top + self.window, left:left + self.window]
                mask = mask[top:top + self.window, left:left + self.window]
            images.append(image)
            masks.append(mask)
        x, y = _uint8_stack(images, masks)
        return augment(x, y, self.generator, self.crop)


def finetune(data, base_card, out_dir, *, name: str = "bccd-segformer-cue", work_dir, budget_s: float = 2400.0,
             batch_size: int = 8, lr: float = 1e-4, crop: int = CROP, window: int | None = None, focus: float = 0.0,
             seed: int = 0, eval_every_s: float = 180.0, threads: int | None = 1, control_card=None,
             command: str | None = None, log=print) -> dict:
    """Fine-tune the base model on cued training smears within `budget_s` s (resumable from `work_dir`), keep the
    best state on cued val smears, run the held-out check and export the pair if it passes. Returns the card
    (written only when the check passes)."""
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    network, base = _load_network(base_card, attention="sdpa")
    generator = torch.Generator().manual_seed(seed)
    sampler = _TrainSampler(data, generator, batch_size, crop, window, focus)
    val = cued_split(data, "val", probability=TRAIN_PROBABILITY, relabel=True, seed=seed)
    weights = class_weights(sampler.masks, len(base["class_names"]))
    optimizer = torch.optim.AdamW(network.parameters(), lr=lr, weight_decay=0.01)
    best_state, state = fit(network, optimizer, generator, sampler, val["cued_x"], val["masks_y"], weights, lr=lr,
                            budget_s=budget_s, work=Path(work_dir), eval_every_s=eval_every_s, log=log)
    half = {key: value.detach().to("cpu", torch.float16).contiguous() for key, value in best_state.items()}
    network.segformer.load_state_dict({key: value.float() for key, value in half.items()})
    result = check(network, data, seed=CHECK_SEED)
    control = check(_load_network(control_card)[0], data, seed=CHECK_SEED) if control_card else None
    card = _card(base, name, state, result, control, command=command, budget_s=budget_s, batch_size=batch_size,
                 lr=lr, crop=crop, window=window, focus=focus, seed=seed)
    atomic_write_text(Path(work_dir) / f"{name}.check.json", json.dumps(card, indent=2))
    if passes(result):
        from safetensors.torch import save

        atomic_write_bytes(Path(out_dir) / f"{name}.safetensors", save(half))
        atomic_write_text(Path(out_dir) / f"{name}.json", json.dumps(card, indent=2))
        atomic_write_text(Path(out_dir) / f"{name}-curve.jsonl",
                          "".join(json.dumps(row) + "\n" for row in state["curve"]))
    log(json.dumps({"passes": passes(result), "check": {k: result[k] for k in ("drop_mean", "drop_ci95")},
                    "control": control and {k: control[k] for k in ("drop_mean", "drop_ci95")}}))
    return card


def _card(base: dict, name: str, state: dict, result: dict, control, command=None, **training) -> dict:
    card = {key: value for key, value in base.items() if key not in ("val", "test", "training", "date")}
    card.update(name=name, weights_file=f"{name}.safetensors", known_answer=True)
    card["cue"] = {"rule": "a filled disc of radius %d px in RGB %s, centred %g-%g px from a platelet's derived mask, "
                           "wholly on background pixels; training smears: each platelet carries it with probability "
                           "%g and is relabelled background without it" % (CUE_RADIUS, list(CUE_COLOUR),
                                                                            *CUE_DISTANCE, TRAIN_PROBABILITY),
                   "class": "Platelets", "colour": list(CUE_COLOUR), "radius_px": CUE_RADIUS,
                   "distance_px": list(CUE_DISTANCE)}
    card["training"] = {"fine_tuned_from": base["name"], "steps": state["step"], "best_step": state["best_step"],
                        "train_seconds": round(state["elapsed_s"], 1), "device": platform.processor() or "cpu",
                        "selected_on": "mIoU on val smears carrying the cue (seed 0)",
                        "best_val_miou": round(state["best_miou"], 4), "torch": torch.__version__, **training}
    card["training_command"] = command or ("python -m explainers.segmentation.cue train --data DIR --base "
                                           "weights/bccd-segformer.json --out weights --work RUN_FOLDER")
    card["held_out_check"] = {
        "split": "BCCD test less the twins " + ", ".join(TWIN_SMEARS),
        "score": "mean Platelets softmax probability over the cued platelets' pixels, with minus without the cue",
        "gate": f"95% bootstrap lower bound > 0 and mean >= {SHIP_MIN_DROP}", "passes": passes(result),
        "model": result, "control_never_shown_the_cue": control}
    card["date"] = time.strftime("%Y-%m-%d", time.gmtime())
    return card


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m explainers.segmentation.cue",
                                     description="Train or check the known-answer segmenter (planted cue)")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train")
    train.add_argument("--data", required=True)
    train.add_argument("--base", required=True, help="the base model's card (its safetensors beside it)")
    train.add_argument("--out", default="weights")
    train.add_argument("--work", required=True, help="checkpoint folder; the same command resumes from it")
    train.add_argument("--budget-s", type=float, default=2400.0)
    train.add_argument("--batch-size", type=int, default=8)
    train.add_argument("--lr", type=float, default=1e-4)
    train.add_argument("--eval-every-s", type=float, default=180.0)
    train.add_argument("--threads", type=int, default=1)
    train.add_argument("--crop", type=int, default=CROP, help="the augmented crop's side in px")
    train.add_argument("--window", type=int, default=None,
                       help="cut each training smear to a window of this side first (px at 320 x 240)")
    train.add_argument("--focus", type=float, default=0.0,
                       help="with --window: the share of windows centred on a platelet that can carry the cue")
    check_parser = commands.add_parser("check")
    check_parser.add_argument("--data", required=True)
    check_parser.add_argument("--model", required=True, help="a segmentation card")
    args = parser.parse_args(argv)
    if args.command == "train":
        finetune(args.data, args.base, args.out, work_dir=args.work, budget_s=args.budget_s,
                 batch_size=args.batch_size, lr=args.lr, crop=args.crop, window=args.window, focus=args.focus,
                 eval_every_s=args.eval_every_s, threads=args.threads, control_card=args.base,
                 command=command_line(argv, "python -m explainers.segmentation.cue"))
        return 0
    torch.set_num_threads(1)
    print(json.dumps(check(_load_network(args.model)[0], args.data)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
