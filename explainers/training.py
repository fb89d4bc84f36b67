"""Training of the bundled classifiers (`python -m explainers train-classifier`).

Deterministic (seeded), resumable (a checkpoint after every epoch, written atomically), with a
progress bar; the best epoch on the validation split is exported as safetensors + a JSON card.
"""
from __future__ import annotations

import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

import timm

from .atomic import atomic_torch_save, atomic_write_text
from .data import open_dataset, pil_to_tensor

# Architectures the bundled models use; any timm name + kwargs also works through --timm-name.
PRESETS = {
    "vit": ("vit_tiny_patch16_224", {"img_size": 64, "patch_size": 8, "depth": 6, "embed_dim": 192,
                                     "num_heads": 3, "drop_path_rate": 0.1}),
    "cnn": ("resnet18", {"channels": [32, 64, 128, 256], "output_stride": 8}),
}


def load_into_memory(path, split=None):
    dataset = open_dataset(path, split=split or "train")
    images = torch.stack([pil_to_tensor(dataset.image(i)) for i in range(len(dataset))])
    labels = torch.tensor(dataset.labels)
    return (images * 255).round().to(torch.uint8), labels


def augment(batch: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Cell images have no orientation: random 90-degree turns and flips, small shifts, colour jitter."""
    b = batch.shape[0]
    out = batch.clone()
    turns = torch.randint(0, 4, (b,), generator=generator)
    flips = torch.rand(b, generator=generator) < 0.5
    for k in range(4):
        idx = (turns == k).nonzero().flatten()
        if len(idx):
            out[idx] = torch.rot90(out[idx], k, dims=(2, 3))
    out[flips] = out[flips].flip(3)
    pad = 4
    padded = F.pad(out, (pad, pad, pad, pad), mode="reflect")
    dx, dy = torch.randint(0, 2 * pad + 1, (2, b), generator=generator)
    h, w = out.shape[2:]
    out = torch.stack([padded[i, :, dy[i]:dy[i] + h, dx[i]:dx[i] + w] for i in range(b)])
    brightness = 1 + (torch.rand(b, 1, 1, 1, generator=generator) - 0.5) * 0.2
    contrast = 1 + (torch.rand(b, 1, 1, 1, generator=generator) - 0.5) * 0.2
    mean = out.mean(dim=(1, 2, 3), keepdim=True)
    out = ((out - mean) * contrast + mean) * brightness
    return out.clamp(0, 1)


@torch.no_grad()
def accuracy(model, images_u8, labels, mean, std, batch_size=512) -> float:
    model.eval()
    mean_t = torch.tensor(mean).view(1, 3, 1, 1)
    std_t = torch.tensor(std).view(1, 3, 1, 1)
    correct = 0
    for start in range(0, len(labels), batch_size):
        x = images_u8[start:start + batch_size].float() / 255
        correct += (model((x - mean_t) / std_t).argmax(1) == labels[start:start + batch_size]).sum().item()
    return correct / max(len(labels), 1)


def train_classifier(*, name: str, data: str, preset: str = "cnn", epochs: int = 20, batch_size: int = 128,
                     lr: float = 2e-3, weight_decay: float = 0.05, seed: int = 0, out_dir: str = "weights",
                     test_data: str | None = None, val_data: str | None = None, label_smoothing: float = 0.1,
                     class_names: list | None = None) -> dict:
    torch.manual_seed(seed)
    np.random.seed(seed)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoint_path = out_dir / f"{name}.ckpt"

    data_path = Path(data)
    train_x, train_y = load_into_memory(data_path)
    val_path = Path(val_data) if val_data else data_path.parent / "val"
    val_x, val_y = load_into_memory(val_path) if (val_path / "labels.csv").exists() else (train_x[:0], train_y[:0])
    num_classes = int(train_y.max().item()) + 1
    mean = tuple((train_x.float() / 255).mean(dim=(0, 2, 3)).tolist())
    std = tuple((train_x.float() / 255).std(dim=(0, 2, 3)).tolist())

    timm_name, timm_kwargs = PRESETS[preset]
    timm_kwargs = dict(timm_kwargs, num_classes=num_classes)
    model = timm.create_model(timm_name, pretrained=False, **timm_kwargs)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    steps_per_epoch = math.ceil(len(train_y) / batch_size)
    total_steps = epochs * steps_per_epoch
    warmup = max(1, int(0.05 * total_steps))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total_steps))))

    start_epoch, best_val, history = 0, -1.0, []
    if checkpoint_path.exists():
        state = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        start_epoch, best_val, history = state["epoch"], state["best_val"], json.loads(state["history"])
        torch.set_rng_state(state["rng"])
        print(f"Resuming {name} from epoch {start_epoch} (best val {best_val:.4f})", file=sys.stderr)

    mean_t, std_t = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
    started = time.time()
    for epoch in range(start_epoch, epochs):
        model.train()
        generator = torch.Generator().manual_seed(seed * 1000 + epoch)
        order = torch.randperm(len(train_y), generator=generator)
        bar = tqdm(range(steps_per_epoch), desc=f"{name} epoch {epoch + 1}/{epochs}", file=sys.stderr)
        running = 0.0
        for step in bar:
            idx = order[step * batch_size:(step + 1) * batch_size]
            x = augment(train_x[idx].float() / 255, generator)
            loss = F.cross_entropy(model((x - mean_t) / std_t), train_y[idx], label_smoothing=label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            running = 0.9 * running + 0.1 * loss.item() if step else loss.item()
            bar.set_postfix(loss=f"{running:.3f}", lr=f"{schedule.get_last_lr()[0]:.2e}")
        val_acc = accuracy(model, val_x, val_y, mean, std) if len(val_y) else float("nan")
        history.append({"epoch": epoch + 1, "loss": running, "val_accuracy": val_acc})
        print(f"{name} epoch {epoch + 1}: loss {running:.4f} val acc {val_acc:.4f}", file=sys.stderr)
        if len(val_y) == 0 or val_acc > best_val:
            best_val = val_acc
            atomic_torch_save({k: v.clone() for k, v in model.state_dict().items()}, out_dir / f"{name}.best.pt")
        atomic_torch_save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "schedule": schedule.state_dict(), "epoch": epoch + 1, "best_val": best_val,
                     "history": json.dumps(history), "rng": torch.get_rng_state()}, checkpoint_path)

    best_state = torch.load(out_dir / f"{name}.best.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(best_state)
    return export_classifier(model, name=name, out_dir=out_dir, timm_name=timm_name, timm_kwargs=timm_kwargs,
                             mean=mean, std=std, class_names=class_names or [str(i) for i in range(num_classes)],
                             data=str(data_path), val_accuracy=best_val, test_data=test_data, seed=seed,
                             history=history, epochs=epochs, train_seconds=time.time() - started,
                             input_size=int(train_x.shape[-1]))


def export_classifier(model, *, name, out_dir, timm_name, timm_kwargs, mean, std, class_names, data,
                      val_accuracy, test_data, seed, history, epochs, train_seconds, input_size, extra=None) -> dict:
    """Write weights (fp16 safetensors, a few MB) and the card; test accuracy measured on the stored weights."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    state = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in model.state_dict().items()}
    weights_file = f"{name}.safetensors"
    save_file(state, str(out_dir / weights_file))
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    test_acc = None
    if test_data:
        test_x, test_y = load_into_memory(test_data)
        test_acc = accuracy(model, test_x, test_y, mean, std)
    size = input_size
    card = {
        "kind": "classifier", "name": name, "timm_name": timm_name, "timm_kwargs": timm_kwargs,
        "weights_file": weights_file, "weights_dtype": "float16 (loaded as float32)",
        "input_size": [size, size], "mean": list(mean), "std": list(std), "reference_color": list(mean),
        "crop_pct": 1.0, "interpolation": "bicubic", "class_names": list(class_names),
        "data": {"train": data, "val_accuracy_best": val_accuracy, "test": test_data, "test_accuracy": test_acc},
        "seed": seed, "epochs": epochs, "train_seconds": round(train_seconds, 1), "history": history,
        "training_command": " ".join(["python -m explainers"] + sys.argv[1:]) if sys.argv else "",
        "software": {"torch": torch.__version__, "timm": timm.__version__, "python": platform.python_version()},
    }
    if extra:
        card.update(extra)
    atomic_write_text(out_dir / f"{name}.json", json.dumps(card, indent=2))
    return card


def check_job_params(kind: str, params: dict, known, required=("model", "data")) -> None:
    """A job kind's params: no unknown key (named, with the known ones), every required one given."""
    unknown = set(params) - set(known)
    if unknown:
        raise ValueError(f"unknown {kind} job params {sorted(unknown)}; known: {', '.join(known)}")
    for key in required:
        if not params.get(key):
            raise ValueError(f"a {kind} job needs '{key}'")
