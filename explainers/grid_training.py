"""A ViT that reads mosaics: fine-tune a bundled classifier at twice its input size on 2 x 2 mosaics of four
cells of four different classes (multi-label loss: one-hot per quadrant's class, binary cross-entropy),
mixed with single cells shown at the new size (`python -m explainers train-grid`).

Time-budgeted (`--minutes`), resumable (an atomic checkpoint every `--save-every` steps and at the end of the
budget; the next run continues from it), seeded. The card records single-cell test accuracy, per-quadrant
multi-label recall on test mosaics (each quadrant's class among the model's top 4) and the model's quadrant
sensitivity (`gridpg.quadrant_sensitivity`), and `grid_cell_size` so that `gridpg` builds mosaics of the
cells the model was trained on.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .atomic import atomic_torch_save
from .gridpg import assemble, plan_mosaics, quadrant_sensitivity
from .training import augment, export_classifier, load_into_memory


def _mosaic_batch(images_u8, labels, count, generator, num_classes, rng):
    plan = plan_mosaics(labels.numpy(), count, seed=int(rng.integers(1 << 31)))
    cells = torch.stack([images_u8[c] for cells, _ in plan for c in cells]).float() / 255
    cells = augment(cells, generator).view(count, 4, *cells.shape[1:])
    mosaics = torch.stack([assemble(group) for group in cells])
    targets = torch.zeros(count, num_classes)
    for row, (_, classes) in enumerate(plan):
        targets[row, classes] = 1.0
    return mosaics, targets


def _single_batch(images_u8, labels, count, generator, num_classes, size):
    index = torch.randint(0, len(labels), (count,), generator=generator)
    cells = augment(images_u8[index].float() / 255, generator)
    return F.interpolate(cells, size=size, mode="bicubic", align_corners=False).clamp(0, 1), \
        F.one_hot(labels[index], num_classes).float()


@torch.no_grad()
def grid_figures(bundle, cells_u8, labels, *, n_mosaics=200, seed=1, batch_size=32) -> dict:
    """Single-cell accuracy (cells resized to the model input), quadrant recall and sensitivity on mosaics."""
    size = tuple(bundle.input_size)
    correct = 0
    for start in range(0, len(labels), 256):
        cells = F.interpolate(cells_u8[start:start + 256].float() / 255, size=size, mode="bicubic",
                              align_corners=False).clamp(0, 1)
        correct += int((bundle(cells).argmax(1) == labels[start:start + 256]).sum())
    plan = plan_mosaics(labels.numpy(), n_mosaics, seed=seed)
    recall, sensitivity = [], []
    for start in range(0, n_mosaics, batch_size):
        chunk = plan[start:start + batch_size]
        mosaics = torch.stack([assemble(torch.stack([cells_u8[c].float() / 255 for c in cells])) for cells, _ in chunk])
        classes = torch.tensor([c for _, c in chunk])
        top4 = bundle(mosaics).topk(4, dim=1).indices
        recall.extend(float(c in set(t)) for t, cs in zip(top4.tolist(), classes.tolist()) for c in cs)
        sensitivity.append(quadrant_sensitivity(bundle, mosaics, classes))
    sensitivity = np.concatenate(sensitivity)
    return {"single_cell_accuracy": correct / max(1, len(labels)), "quadrant_top4_recall": float(np.mean(recall)),
            "quadrant_sensitivity": float(sensitivity.mean()), "quadrant_sensitivity_positive": float((sensitivity > 0).mean()),
            "n_cells": int(len(labels)), "n_mosaics": n_mosaics}


def train_grid(*, base: str, name: str, data: str, val_data: str | None = None, test_data: str | None = None,
               minutes: float = 30.0, max_steps: int = 10_000, batch_size: int = 32, single_fraction: float = 0.25,
               lr: float = 3e-4, weight_decay: float = 0.05, seed: int = 0, out_dir: str = "weights",
               save_every: int = 20) -> dict:
    import timm

    from .models import load_model

    source = load_model(base)
    if not source.is_vit:
        raise ValueError(f"train-grid fine-tunes a timm ViT; {base} is a {source.family}")
    card = source.card
    cell = tuple(source.input_size)
    size = (2 * cell[0], 2 * cell[1])
    timm_name, timm_kwargs = card["timm_name"], dict(card["timm_kwargs"], img_size=size[0])
    model = timm.create_model(timm_name, pretrained=False, **timm_kwargs)
    source.network.set_input_size(img_size=size)  # interpolate the position embeddings, then copy everything
    model.load_state_dict(source.network.state_dict())
    mean_t, std_t = torch.tensor(source.mean).view(1, 3, 1, 1), torch.tensor(source.std).view(1, 3, 1, 1)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint_path = out / f"{name}.ckpt"
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    step, history, spent = 0, [], 0.0
    if checkpoint_path.exists():
        state = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, history, spent = state["step"], json.loads(state["history"]), state["seconds"]
        print(f"Resuming {name} at step {step} ({spent / 60:.1f} min spent)", file=sys.stderr)
    train_x, train_y = load_into_memory(data)
    num_classes = int(train_y.max()) + 1
    rng = np.random.default_rng(seed + step)
    generator = torch.Generator().manual_seed(seed * 1000 + step)
    n_single = int(round(batch_size * single_fraction))

    def save():
        atomic_torch_save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                     "history": json.dumps(history), "seconds": spent}, checkpoint_path)

    started = time.time()
    running = None
    model.train()
    while step < max_steps and spent + (time.time() - started) < 60 * minutes:
        for group in optimizer.param_groups:  # warm-up then cosine over max_steps
            group["lr"] = lr * min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(1.0, step / max_steps)))
        mosaics, targets = _mosaic_batch(train_x, train_y, batch_size - n_single, generator, num_classes, rng)
        if n_single:
            singles, single_targets = _single_batch(train_x, train_y, n_single, generator, num_classes, size)
            mosaics, targets = torch.cat([mosaics, singles]), torch.cat([targets, single_targets])
        loss = F.binary_cross_entropy_with_logits(model((mosaics - mean_t) / std_t), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        running = loss.item() if running is None else 0.9 * running + 0.1 * loss.item()
        if step % save_every == 0:
            history.append({"step": step, "loss": running})
            print(f"{name} step {step}: loss {running:.4f} ({(spent + time.time() - started) / 60:.1f} min)",
                  file=sys.stderr, flush=True)
            spent, started = spent + time.time() - started, time.time()
            save()
    spent += time.time() - started
    save()
    model.eval()

    from .models import ModelBundle

    trained = ModelBundle(name=name, network=model, mean=source.mean, std=source.std, input_size=size,
                          class_names=source.class_names, family="vit", reference_color=source.reference_color,
                          cam_layer_name=source.cam_layer_name)
    figures = {}
    for split, path in (("val", val_data), ("test", test_data)):
        if path:
            cells, labels = load_into_memory(path)
            figures[split] = grid_figures(trained, cells, labels)
    card_out = export_classifier(
        model, name=name, out_dir=out, timm_name=timm_name, timm_kwargs=timm_kwargs, mean=source.mean,
        std=source.std, class_names=source.class_names, data=str(data), val_accuracy=figures.get("val", {}).get("single_cell_accuracy"),
        test_data=None, seed=seed, history=history, epochs=0, train_seconds=spent, input_size=size[0],
        extra={"base": base, "grid_cell_size": list(cell), "steps": step, "batch_size": batch_size,
               "single_fraction": single_fraction, "loss": "binary cross-entropy, multi-hot (4 classes per mosaic)",
               "grid": figures})
    return card_out
