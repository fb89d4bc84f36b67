"""Train a PPO actor-critic on a ViZDoom scenario, vanilla (lambda = 0) or with CAMAL on the critic.

    python -m explainers train-agent --scenario defend_the_center --seed 1 --lambda 1.0 \
        --budget-s 330 --out weights --name dtc-camal-s1

Seeded (torch, action sampling and the environments' reset seeds all follow --seed), resumable (a checkpoint
NAME.ckpt.* is written every `checkpoint_every` updates and at the end of the budget; a later run with the same
name continues from it, on fresh episodes), time-budgeted (--budget-s, checked after every update) and/or
step-capped (--steps). Progress: every update prints the mean return of the episodes that ended, and every
`iou_every` updates the IoU of the V(s)-CAM with the masks on the rollout's frames.
Training reset seeds are seed * 1000 + i (+ 100 per resume); evaluation uses seeds >= EVAL_SEED_BASE, never these.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from .checkpoint import check_name, load_checkpoint, save_agent, save_checkpoint
from .envs import FRAME_SKIP, MASK_COVERAGE, VecEnv, scenario, source_resolution
from .networks import build_network, frame_hw_of, hud_of, value_cam
from .ppo import PPOConfig, Rollout, act, ppo_update

EVAL_SEED_BASE = 10_000_000
# lambda per frame (the term is divided by the minibatch size, like the PPO loss): the comparison's sweep at the
# real budget chose 3 by its rule (the largest lambda whose critic keeps explained variance >= 0.3; docs/agents.md)
DEFAULT_LAMBDA = 3.0
PROGRESS_EVERY = 32  # rollout steps between progress reports inside a rollout (what the app's bar shows)


def cam_iou(net, frames: torch.Tensor, masks: torch.Tensor, device, batch: int = 256) -> float:
    """Mean IoU of the binarised V(s)-CAM with the masks over the frames whose mask is non-empty."""
    from ..metrics import top_pixel_iou

    keep = masks.flatten(1).any(dim=1)
    frames, masks = frames[keep], masks[keep]
    if not len(frames):
        return float("nan")
    ious = []
    for start in range(0, len(frames), batch):
        cams = value_cam(net, frames[start:start + batch].to(device))[0].detach().cpu()
        ious.append(top_pixel_iou(cams, masks[start:start + batch]))
    return float(np.nanmean(np.concatenate(ious)))


def train_agent(*, scenario_name: str, out_dir, name: str, seed: int = 0, lam: float = 0.0, arch: str = "cnn",
                steps: int | None = None, budget_s: float | None = None, device: str = "cpu",
                config: PPOConfig | None = None, net_options: dict | None = None, iou_every: int = 5,
                checkpoint_every: int = 10,
                progress=None, cancelled=None, log=None) -> dict:
    """Returns a summary (steps, seconds, history); writes NAME.safetensors + NAME.json when done (the budget or
    the step cap reached), and the resumable checkpoint whenever it stops (also when cancelled).
    `net_options`: the architecture's size (e.g. {"width": 8} for tests) and its frame size ("frame_hw", default
    60 x 80): the environments, the masks and the maps follow the network's frame size."""
    if steps is None and budget_s is None:
        raise ValueError("give a step cap (--steps) or a time budget (--budget-s), or both")
    config = config or PPOConfig()
    config.lr_at(0, steps)  # an unknown schedule, or a linear one without a step cap, fails before the game starts
    spec = scenario(scenario_name)
    out_dir = Path(out_dir)
    check_name(name)
    config.camal_lambda = float(lam)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    net = build_network(arch, _num_actions(scenario_name), **(net_options or {})).to(device)
    frame_hw = frame_hw_of(net)
    optimizer = torch.optim.Adam(net.parameters(), lr=config.lr, eps=1e-5)
    stem = out_dir / f"{name}.ckpt"
    run = {"scenario": scenario_name, "arch": net.arch, "lambda": float(lam), "seed": seed, "ppo": config.to_dict()}
    _check_same_run(stem, run, name)
    state = load_checkpoint(net, optimizer, stem) or {"steps": 0, "updates": 0, "seconds": 0.0, "history": [],
                                                      "resumes": -1, "returns": []}
    state["run"] = run
    state["resumes"] += 1
    if state["resumes"]:
        generator.manual_seed(seed + 7919 * state["resumes"])
        _say(log, f"[train-agent] {name}: resumed at step {state['steps']} (update {state['updates']})")
    started = time.time()
    if progress is not None:  # the game takes a while to start: say so rather than nothing
        progress(state["steps"], steps, phase="start", elapsed_s=state["seconds"])
    envs = VecEnv(scenario_name, config.num_envs, seed * 1000 + 100 * state["resumes"], frame_hw=frame_hw,
                  hud=hud_of(net))
    frames, masks = envs.reset()
    if progress is not None:
        progress(state["steps"], steps, phase="first-rollout", **_budget(budget_s, started))
    rollout = Rollout(config.rollout_steps, config.num_envs, (3, *frame_hw), device)
    stopped_by = "steps"
    try:
        while steps is None or state["steps"] < steps:
            if cancelled is not None and cancelled():
                stopped_by = "cancelled"
                break
            if budget_s is not None and time.time() - started >= budget_s:
                stopped_by = "budget"
                break
            net.eval()
            finished = []
            for t in range(config.rollout_steps):
                if cancelled is not None and t % 64 == 63 and cancelled():
                    stopped_by = "cancelled"  # the half-played rollout is dropped; the checkpoint is the last update
                    break
                if progress is not None and t % PROGRESS_EVERY == PROGRESS_EVERY - 1:  # the bar moves within a rollout
                    progress(state["steps"] + (t + 1) * config.num_envs, steps, **_budget(budget_s, started))
                actions, log_probs, values = act(net, frames, device, generator)
                rollout.frames[t], rollout.masks[t] = torch.from_numpy(frames), torch.from_numpy(masks)
                rollout.actions[t], rollout.log_probs[t], rollout.values[t] = actions, log_probs, values
                frames, masks, rewards, dones, ended = envs.step(actions.numpy())
                rollout.rewards[t] = torch.from_numpy(rewards)
                rollout.dones[t] = torch.from_numpy(dones.astype(np.float32))
                finished += ended
            if stopped_by == "cancelled":
                break
            last_values = act(net, frames, device, generator)[2]
            net.train()
            for group in optimizer.param_groups:  # resumes follow the same schedule: it reads the steps done
                group["lr"] = config.lr_at(state["steps"], steps)
            losses = ppo_update(net, optimizer, rollout, last_values, config, generator)
            state["steps"] += config.rollout_steps * config.num_envs
            state["updates"] += 1
            state["returns"] = (state["returns"] + [f["return"] for f in finished])[-100:]
            record = {"update": state["updates"], "steps": state["steps"],
                      "seconds": round(state["seconds"] + time.time() - started, 1),
                      "episodes": len(finished), "return": float(np.mean([f["return"] for f in finished]))
                      if finished else None, "return_100": float(np.mean(state["returns"])) if state["returns"]
                      else None, "lr": optimizer.param_groups[0]["lr"],
                      **{k: round(v, 5) for k, v in losses.items()}}
            if state["updates"] % iou_every == 0:
                net.eval()
                record["iou"] = cam_iou(net, rollout.frames.flatten(0, 1), rollout.masks.flatten(0, 1), device)
            state["history"].append(record)
            _report(progress, log, name, record, steps, budget_s, started)
            if state["updates"] % checkpoint_every == 0:
                _checkpoint(net, optimizer, state, stem, started)
    finally:
        envs.close()
    state["seconds"] = round(state["seconds"] + time.time() - started, 1)
    save_checkpoint(net, optimizer, state, stem)
    summary = {"name": name, "steps": state["steps"], "updates": state["updates"], "seconds": state["seconds"],
               "stopped_by": stopped_by, "history": state["history"]}
    if stopped_by != "cancelled":
        card = {"kind": "agent", "scenario": scenario_name, "what_matters": spec.what_matters,
                "mask_rule": list(spec.relevant), "frame_hw": list(frame_hw), "hud": hud_of(net),
                "frame_skip": FRAME_SKIP,
                "source_resolution": source_resolution(frame_hw),
                "frame_stack": 1, "mask_coverage": MASK_COVERAGE, "lambda": float(lam), "seed": seed,
                "steps": state["steps"], "updates": state["updates"], "train_seconds": state["seconds"],
                "device": str(device), "ppo": config.to_dict(), "resumes": state["resumes"],
                "method": "PPO" + (f" + CAMAL on the critic (lambda {lam})" if lam else " (vanilla)"),
                "history": state["history"]}
        summary["card"] = str(save_agent(net.cpu(), card, out_dir, name))
    return summary


def _check_same_run(stem: Path, run: dict, name: str) -> None:
    """A checkpoint resumes only the run it came from (same scenario, network, lambda, seed and PPO settings: a run
    continued with another clip or learning rate would be neither run)."""
    meta = stem.with_name(stem.name + ".json")
    if not meta.exists():
        return
    saved = json.loads(meta.read_text()).get("run")
    if saved is None:
        return
    differ = [what for key, what in (("scenario", "scenario"), ("arch", "network"), ("lambda", "lambda"),
                                     ("seed", "seed")) if saved.get(key) != run[key]]
    saved_ppo = saved.get("ppo") or {}  # a setting added after the checkpoint was written is not compared
    differ += [f"PPO setting ({key} {saved_ppo[key]} there, {value} here)" for key, value in run["ppo"].items()
               if key in saved_ppo and key != "camal_lambda" and saved_ppo[key] != value]
    if differ:
        raise ValueError(f"The checkpoint of '{name}' belongs to a run with another {differ[0]}: give the new run "
                         "another name, or the same settings to continue it.")


def _num_actions(scenario_name: str) -> int:
    from .envs import make_env

    env = make_env(scenario_name)
    try:
        return env.num_actions
    finally:
        env.close()


def _checkpoint(net, optimizer, state, stem, started):
    saved = dict(state, seconds=round(state["seconds"] + time.time() - started, 1))
    save_checkpoint(net, optimizer, saved, stem)


def _budget(budget_s, started) -> dict:
    return {"budget_fraction": min(1.0, (time.time() - started) / budget_s)} if budget_s else {}


def _say(log, text):
    print(text, file=log or sys.stderr, flush=True)


def _report(progress, log, name, record, steps, budget_s, started):
    if progress is not None:
        total = steps or None
        metrics = {k: record[k] for k in ("return", "return_100", "iou", "seconds") if record.get(k) is not None}
        progress(record["steps"], total, **metrics, **_budget(budget_s, started))
    shown = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()
                     if v is not None)
    _say(log, f"[train-agent] {name} {shown}")


def summary_json(summary: dict) -> str:
    return json.dumps({k: v for k, v in summary.items() if k != "history"}, indent=2)
