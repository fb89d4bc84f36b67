"""Cost of CAMAL in PPO: one PPO update (4 epochs x minibatches) vanilla vs CAMAL on the same synthetic rollout,
and the batch-level V(s)-CAM (one backward) against per-frame extraction (one backward per frame), with the maximum
difference between the two. Random frames and masks: the cost does not depend on what the frames show.

    python bench/agents_cost.py --device cuda --out bench/results/agents-cost-h200.json
    python bench/agents_cost.py --arch nature --frame-hw 100 156 --num-envs 2 --rollout-steps 256 --epochs 3 \
        --minibatch 32 --out bench/results/agents-cost-cpu-nature-100x156.json   # the recipe of the gate
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def synthetic_rollout(config, device, seed=0, frame_hw=(60, 80)):
    from explainers.agents.ppo import Rollout

    generator = torch.Generator().manual_seed(seed)
    rollout = Rollout(config.rollout_steps, config.num_envs, (3, *frame_hw), device)
    shape = rollout.frames.shape
    rollout.frames = torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8)
    rollout.masks = torch.rand(rollout.masks.shape, generator=generator) < 0.1
    rollout.actions = torch.randint(0, 4, rollout.actions.shape, generator=generator)
    rollout.log_probs = torch.full(rollout.log_probs.shape, -1.386)
    rollout.values = torch.randn(rollout.values.shape, generator=generator)
    rollout.rewards = torch.randn(rollout.rewards.shape, generator=generator)
    return rollout


def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


# (name, lambda, cam mode, norm_every): norm_every 8 measures the two clip factors on every 8th minibatch and takes
# one backward pass on the others (`ppo.weighted_step`)
ARMS = (("vanilla", 0.0, "differentiable", 1), ("camal", 1.0, "differentiable", 1),
        ("camal_detach_weights", 1.0, "detach-weights", 1), ("camal_norm_every_8", 1.0, "differentiable", 8),
        ("camal_detach_weights_norm_every_8", 1.0, "detach-weights", 8))


def time_updates(make_config, device, repeats, arch="cnn", **net_options):
    """Seconds per PPO update for each arm, the arms interleaved within every repeat (a loaded machine slows all
    arms alike rather than whichever ran last). The first round is warm-up."""
    from explainers.agents.networks import build_network
    from explainers.agents.ppo import ppo_update

    prepared = {}
    for name, lam, mode, norm_every in ARMS:
        config = make_config()
        config.camal_lambda, config.cam_mode, config.norm_every = lam, mode, norm_every
        torch.manual_seed(0)
        net = build_network(arch, 4, **net_options).to(device).train()
        prepared[name] = (config, net, torch.optim.Adam(net.parameters(), lr=config.lr),
                          synthetic_rollout(config, device, frame_hw=net_options.get("frame_hw", (60, 80))))
    times = {name: [] for name in prepared}
    for repeat in range(repeats + 1):
        for name, (config, net, optimizer, rollout) in prepared.items():
            sync(device)
            start = time.perf_counter()
            ppo_update(net, optimizer, rollout, torch.zeros(config.num_envs), config,
                       torch.Generator().manual_seed(0))
            sync(device)
            if repeat:
                times[name].append(time.perf_counter() - start)
    return times


def time_cams(device, batch, repeats):
    from explainers.agents.networks import build_network, value_cam, value_cam_per_sample

    torch.manual_seed(0)
    net = build_network("cnn", 4).to(device).eval()
    frames = torch.randint(0, 256, (batch, 3, 60, 80), dtype=torch.uint8, device=device)
    results = {}
    for name, fn in (("batch", lambda: value_cam(net, frames)[0]),
                     ("per_frame", lambda: value_cam_per_sample(net, frames))):
        times = []
        for repeat in range(repeats + 1):
            sync(device)
            start = time.perf_counter()
            maps = fn()
            sync(device)
            if repeat:
                times.append(time.perf_counter() - start)
        results[name] = (statistics.median(times), maps.detach())
    difference = float((results["batch"][1] - results["per_frame"][1]).abs().max())
    return {"batch": batch, "batch_ms": 1000 * results["batch"][0], "per_frame_ms": 1000 * results["per_frame"][0],
            "speedup": results["per_frame"][0] / results["batch"][0], "max_abs_difference": difference}


def main(argv=None) -> int:
    from explainers.agents.ppo import PPOConfig

    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--num-envs", type=int, default=PPOConfig.num_envs)
    parser.add_argument("--rollout-steps", type=int, default=PPOConfig.rollout_steps)
    parser.add_argument("--arch", choices=["cnn", "nature"], default="cnn")
    parser.add_argument("--frame-hw", type=int, nargs=2, default=[60, 80])
    parser.add_argument("--epochs", type=int, default=PPOConfig.epochs)
    parser.add_argument("--minibatch", type=int, default=PPOConfig.minibatch)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=None)
    parser.add_argument("--no-cam-extraction", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    def config_():
        return PPOConfig(num_envs=args.num_envs, rollout_steps=args.rollout_steps, epochs=args.epochs,
                         minibatch=args.minibatch)

    config = config_()
    net_options = {"frame_hw": tuple(args.frame_hw)}
    if args.arch == "cnn":
        net_options["width"] = args.width
    if args.hidden is not None:
        net_options["hidden"] = args.hidden
    times = time_updates(config_, args.device, args.repeats, arch=args.arch, **net_options)
    vanilla = times["vanilla"]

    def arm(name):
        ratios = [c / v for c, v in zip(times[name], vanilla)]
        return {"s_median": statistics.median(times[name]), "ratio_median": statistics.median(ratios),
                "ratios": ratios}

    result = {
        "date": time.strftime("%Y-%m-%d"), "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor(),
        "torch": torch.__version__, "threads": args.threads, "repeats": args.repeats,
        "network": {"arch": args.arch, **net_options},
        "update": {"frames": config.num_envs * config.rollout_steps, "epochs": config.epochs,
                   "minibatch": config.minibatch, "vanilla_s_median": statistics.median(vanilla),
                   **{name: arm(name) for name, *_ in ARMS[1:]},
                   "target": "CAMAL update at most 1.3x vanilla"},
        "cam_extraction": [] if args.no_cam_extraction else [time_cams(args.device, batch, args.repeats)
                                                              for batch in (16, 256)],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
