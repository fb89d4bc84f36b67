"""Sharding work over torchrun's processes: which process this is, joining the group, and putting every process's
per-item results back in item order (the evaluation over a data set and the grid pointing game use it)."""
from __future__ import annotations

import os

import torch


def world() -> tuple:
    """(world size, rank) of the torchrun process group; (1, 0) in a single process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def init_distributed() -> tuple:
    """Join torchrun's process group when WORLD_SIZE > 1 (gloo on CPU, NCCL where CUDA is there);
    returns (world size, rank)."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        use_cuda = torch.cuda.is_available()
        if use_cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return world()


def gather_items(per_item: dict, sums: dict, indices: list, n: int) -> tuple:
    """Under torchrun: every process's per-item lists put back in item order, and numbers summed over processes.
    `per_item` {key: list aligned with `indices`, this process's items of 0..n-1}; `sums` {key: number}.
    Returns ({key: list of n}, {key: total}); every process gets the whole."""
    import torch.distributed as dist

    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, {"indices": list(indices), "per_item": per_item, "sums": sums})
    merged = {}
    for key in per_item:
        values = [None] * n
        for part in parts:
            for index, value in zip(part["indices"], part["per_item"][key]):
                values[index] = value
        merged[key] = values
    return merged, {key: sum(part["sums"][key] for part in parts) for key in sums}
