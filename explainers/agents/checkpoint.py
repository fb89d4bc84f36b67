"""Agent files: weights as safetensors, everything else as JSON (nothing is unpickled).

    NAME.safetensors + NAME.json          the trained agent (card: scenario, architecture, lambda, steps, ...)
    NAME.ckpt.safetensors + NAME.ckpt.json  the resumable state (network, Adam moments, counters, history)
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from ..atomic import atomic_write_bytes, atomic_write_text
from .networks import network_from_arch

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")


def check_name(name: str) -> str:
    if not NAME_PATTERN.match(name) or ".." in name:
        raise ValueError(f"'{name}' is not a usable agent name: letters, digits, '.', '_' and '-' only")
    return name


def _save_tensors(tensors: dict, path: Path) -> None:
    from safetensors.torch import save

    atomic_write_bytes(path, save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}))


def save_agent(net, card: dict, out_dir, name: str, half: bool = False) -> Path:
    """NAME.safetensors + NAME.json in `out_dir`; `half`: the weights stored in float16 (half the file, for the
    agents shipped in the repository; loading casts them back to the network's float32)."""
    out_dir = Path(out_dir)
    tensors = net.state_dict()
    if half:
        tensors = {k: v.half() if v.is_floating_point() else v for k, v in tensors.items()}
    _save_tensors(tensors, out_dir / f"{check_name(name)}.safetensors")
    card = {**card, "name": name, "arch": net.arch, "weights_file": f"{name}.safetensors",
            "stored_dtype": "float16" if half else "float32"}
    atomic_write_text(out_dir / f"{name}.json", json.dumps(card, indent=2))
    return out_dir / f"{name}.json"


def load_agent(card_path, device="cpu") -> tuple:
    """(network in eval mode, card) from NAME.json with its weights beside it."""
    from safetensors.torch import load_file

    card_path = Path(card_path)
    card = json.loads(card_path.read_text())
    net = network_from_arch(card["arch"])
    net.load_state_dict(load_file(str(card_path.parent / card["weights_file"])))
    return net.to(device).eval(), card


def save_checkpoint(net, optimizer, state: dict, path_stem) -> None:
    """Network and Adam moments in one safetensors file, counters and history in JSON beside it."""
    path_stem = Path(path_stem)
    tensors = {f"net.{k}": v for k, v in net.state_dict().items()}
    for index, moments in optimizer.state_dict()["state"].items():
        for key, value in moments.items():
            tensors[f"opt.{index}.{key}"] = torch.as_tensor(value)
    _save_tensors(tensors, path_stem.with_name(path_stem.name + ".safetensors"))
    atomic_write_text(path_stem.with_name(path_stem.name + ".json"), json.dumps(state))


def load_checkpoint(net, optimizer, path_stem) -> dict | None:
    """Restore network and optimizer in place; returns the saved state, or None when there is no checkpoint."""
    from safetensors.torch import load_file

    path_stem = Path(path_stem)
    weights, meta = path_stem.with_name(path_stem.name + ".safetensors"), path_stem.with_name(path_stem.name + ".json")
    if not (weights.exists() and meta.exists()):
        return None
    tensors = load_file(str(weights))
    net.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("net.")})
    state = {}
    for key, value in tensors.items():
        if key.startswith("opt."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value
    saved = optimizer.state_dict()
    saved["state"] = state
    optimizer.load_state_dict(saved)
    return json.loads(meta.read_text())


def agent_from_checkpoint(path_stem, out_dir, name: str, arch: dict | None = None) -> Path:
    """Write the network of a resumable checkpoint as an agent (NAME.safetensors + NAME.json) to evaluate a run
    that has not finished. `arch`: for checkpoints that do not record their run's network."""
    from safetensors.torch import load_file

    path_stem = Path(path_stem)
    state = json.loads(path_stem.with_name(path_stem.name + ".json").read_text())
    run = state.get("run") or {}
    arch = arch or run.get("arch")
    if arch is None:
        raise ValueError("This checkpoint does not record its network: give it (arch).")
    net = network_from_arch(arch)
    tensors = load_file(str(path_stem.with_name(path_stem.name + ".safetensors")))
    net.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("net.")})
    card = {"kind": "agent", "scenario": run.get("scenario", "defend_the_center"), "lambda": run.get("lambda", 0.0),
            "seed": run.get("seed"), "steps": state["steps"], "updates": state["updates"],
            "train_seconds": state["seconds"], "frame_hw": arch.get("frame_hw", [60, 80]), "ppo": run.get("ppo"),
            "snapshot_of": path_stem.name, "method": "snapshot of an unfinished run"}
    return save_agent(net, card, out_dir, name)
