"""The agents' commands: `python -m explainers train-agent` and `python -m explainers evaluate-agent`."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..atomic import atomic_write_text
from ..stopping import stop_on_signals


def _device(name: str | None) -> str:
    import torch

    if name in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def cmd_train_agent(args) -> int:
    import torch

    from .ppo import PPOConfig
    from .train import summary_json, train_agent

    torch.set_num_threads(args.threads)
    config = PPOConfig(num_envs=args.num_envs, rollout_steps=args.rollout_steps, lr=args.lr,
                       lr_schedule=args.lr_schedule,
                       minibatch=args.minibatch, epochs=args.epochs, cam_mode=args.cam_mode, clip=args.clip,
                       entropy_coef=args.entropy_coef, camal_max_grad_norm=args.camal_max_grad_norm,
                       norm_every=args.camal_norm_every)
    net_options = {key: value for key, value in (("width", args.width), ("hidden", args.hidden),
                                                 ("frame_hw", args.frame_hw)) if value is not None}
    if args.hud:
        net_options["hud"] = True
    stop = stop_on_signals()
    summary = train_agent(scenario_name=args.scenario, out_dir=args.out, name=args.name, seed=args.seed,
                          lam=args.lam, arch=args.arch, steps=args.steps, budget_s=args.budget_s,
                          device=_device(args.device), config=config, net_options=net_options,
                          iou_every=args.iou_every, checkpoint_every=args.checkpoint_every, cancelled=stop)
    print(summary_json(summary))
    return 0


def cmd_evaluate_agent(args) -> int:
    import torch

    from .evaluate import evaluate_agents

    torch.set_num_threads(args.threads)
    result = evaluate_agents(args.agents, episodes=args.episodes, seed_base=args.seed_base,
                             device=_device(args.device), max_steps=args.max_steps, curve_every=args.curve_every,
                             greedy=args.greedy, prior=_prior(args.prior),
                             log=lambda text: print(text, file=sys.stderr, flush=True))
    atomic_write_text(Path(args.out), json.dumps(result))
    print(f"wrote {args.out}: {len(result['episodes'])} episodes, {result['fidelity_frames']} frames with curves",
          file=sys.stderr)
    return 0


def cmd_export_agent(args) -> int:
    """A trained agent copied under a new name (the shipped pair), weights in float16 with --half; its card gets
    the held-out evaluations (evaluate-agent's JSON, sampled and greedy), the counterfactual test and, from
    bench/agents_baselines.py's JSON on the same episodes, what needs no model (`references`)."""
    from .checkpoint import load_agent, save_agent

    net, card = load_agent(args.agent)
    card = {k: v for k, v in card.items() if k not in ("name", "weights_file", "stored_dtype", "held_out",
                                                        "arm_comparison", "references")}
    card["exported_from"] = {"name": Path(args.agent).stem, "steps": card.get("steps")}
    card.setdefault("command", training_command(card, Path(args.agent).stem))
    evaluations = [json.loads(Path(path).read_text()) for path in args.evaluation or []]
    for result in evaluations:
        summary = evaluation_summary(result, args.agent)
        card["held_out_greedy" if summary["greedy"] else "held_out"] = summary
    sampled = next((result for result in evaluations if not result.get("greedy")), None)
    baselines = json.loads(Path(args.baselines).read_text()) if args.baselines else None
    if sampled is not None or baselines is not None:
        card["references"] = card_references(sampled, baselines, args.agent)
    path = save_agent(net, card, args.out_dir, args.name, half=args.half)
    print(f"wrote {path}", file=sys.stderr)
    return 0


def training_command(card: dict, name: str) -> str:
    """The train-agent command that makes this agent again, rebuilt from what its card records (scenario, seed,
    lambda, steps, frame size, network and PPO settings), for cards written before train-agent kept its own."""
    ppo, arch = card.get("ppo") or {}, card.get("arch") or {}
    parts = ["python -m explainers train-agent", f"--scenario {card['scenario']}", f"--seed {card.get('seed', 0)}",
             f"--lambda {card.get('lambda', 0.0):g}"]
    if card.get("steps"):
        parts.append(f"--steps {card['steps']}")
    if card.get("frame_hw"):
        parts.append("--frame-hw {} {}".format(*card["frame_hw"]))
    parts.append(f"--arch {arch.get('arch', 'cnn')}")
    if arch.get("hud"):
        parts.append("--hud")
    parts += [f"--{key} {arch[key]}" for key in ("width", "hidden") if key in arch]
    flags = {"num_envs": "--num-envs", "rollout_steps": "--rollout-steps", "epochs": "--epochs", "lr": "--lr",
             "lr_schedule": "--lr-schedule", "minibatch": "--minibatch", "clip": "--clip",
             "entropy_coef": "--entropy-coef",
             "camal_max_grad_norm": "--camal-max-grad-norm", "cam_mode": "--cam-mode",
             "norm_every": "--camal-norm-every"}
    parts += [f"{flag} {ppo[key]:g}" if isinstance(ppo[key], float) else f"{flag} {ppo[key]}"
              for key, flag in flags.items() if key in ppo]
    parts += [f"--device {card.get('device', 'cpu')} --threads 1", f"--out DIR --name {name}"]
    return " ".join(parts)


def _episodes_of(result: dict, agent_card) -> list:
    name = json.loads(Path(agent_card).read_text())["name"]
    episodes = [e for e in result["episodes"] if e.get("agent", name) == name]
    if not episodes:
        raise ValueError(f"{name} has no episodes in that evaluation")
    return episodes


def evaluation_summary(result: dict, agent_card) -> dict:
    """Mean return with its bootstrap 95% interval, episodes and their seeds, from evaluate-agent's results for
    this agent (by name); the counterfactual test's medians where the evaluation ran it."""
    import numpy as np

    from ..statistics import bootstrap_ci, rounded
    from .counterfactual import summarise_drops

    episodes = _episodes_of(result, agent_card)
    returns = [e["return"] for e in episodes]
    seeds = [e["seed"] for e in episodes if "seed" in e]
    low, high = bootstrap_ci(returns)
    summary = {"mean_return": round(float(np.mean(returns)), 3), "ci95": [round(low, 3), round(high, 3)],
               "episodes": len(returns), "reset_seeds": [min(seeds), max(seeds)] if seeds else None,
               "greedy": bool(result.get("greedy", False))}
    ious = [e["iou"] for e in episodes if e.get("iou") is not None]
    if ious:
        low, high = bootstrap_ci(ious)
        summary["value_cam_iou"] = {"mean": round(float(np.mean(ious)), 4), "ci95": [round(low, 4), round(high, 4)]}
    drops = next(iter((result.get("counterfactual") or {}).values()), None)
    if drops:
        summary["counterfactual"] = rounded(summarise_drops(drops, _masked_objects(result.get("scenario")),
                                                            n_resamples=2000))
    return summary


def _masked_objects(scenario_name) -> str:
    """The masked objects in words ("the monsters ...", "the medkits ..."), from the scenario's declaration."""
    from .envs import SCENARIOS

    return SCENARIOS[scenario_name].what_matters if scenario_name in SCENARIOS else "the masked objects"


def card_references(evaluation: dict | None, baselines: dict | None, agent_card) -> dict:
    """What needs no model, beside the agent's own figures: the scripted policies' returns on the same episodes
    (bench/agents_baselines.py) and the IoU of a random map, the fixed prior map and the best any map on the grid
    can reach, measured on this agent's own frames (the evaluation's per-episode `iou_reference`)."""
    import numpy as np

    references: dict = {}
    if baselines is not None:
        references["return"] = {name: policy["return"]["mean"] for name, policy in baselines["policies"].items()}
        references["return_episodes"] = baselines.get("episode_seeds")
    if evaluation is not None:
        per_episode = [e.get("iou_reference") or {} for e in _episodes_of(evaluation, agent_card)]
        keys = sorted({key for reference in per_episode for key in reference})
        references["iou"] = {key: round(float(np.nanmean([r[key] for r in per_episode if r.get(key) is not None])), 4)
                             for key in keys}
        references["iou_on"] = "this agent's own held-out frames (mean over episodes)"
    return references


def _prior(path):
    """The fixed prior map (the mean mask over training-seed frames) from a .npy file, or None."""
    if path is None:
        return None
    import numpy as np

    return np.load(path, allow_pickle=False)


def add_agent_parsers(commands) -> None:
    from .envs import SCENARIOS
    from .evaluate import CURVE_STEPS, MAX_EPISODE_STEPS
    from .train import DEFAULT_LAMBDA, EVAL_SEED_BASE

    train = commands.add_parser("train-agent", help="train a PPO agent on a ViZDoom scenario, vanilla or with "
                                                    "CAMAL on the critic (seeded, resumable, time-budgeted)")
    train.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    train.add_argument("--name", required=True, help="the agent's name: OUT/NAME.safetensors + NAME.json")
    train.add_argument("--out", default="weights")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--lambda", dest="lam", type=float, default=0.0,
                       help=f"CAMAL weight per frame (0 = vanilla PPO; the shipped CAMAL agents use {DEFAULT_LAMBDA})")
    train.add_argument("--cam-mode", choices=["differentiable", "detach-weights"], default="differentiable",
                       help="CAMAL's V(s)-CAM: second-order through the channel weights, or the cheaper update "
                            "with the weights detached (the map moves through the activations only)")
    train.add_argument("--camal-norm-every", type=int, default=1, metavar="K",
                       help="measure the PPO and CAMAL gradient norms (each clipped apart) on every K-th minibatch "
                            "and take one backward pass with those clip factors on the others (1 = every "
                            "minibatch, exact; with 8 a CAMAL update measured 1.26x a vanilla one, against 2.13x)")
    train.add_argument("--arch", choices=["cnn", "nature", "vit"], default="cnn",
                       help="cnn: the compact CNN (CAM grid a quarter of the frame); nature: stable-baselines3's "
                            "CnnPolicy network; vit: a small vision transformer")
    train.add_argument("--frame-hw", type=int, nargs=2, default=None, metavar=("H", "W"),
                       help="the network's frame size (default 60 80); masks and maps follow it")
    train.add_argument("--hud", action="store_true",
                       help="draw Doom's status bar (ammo, health) in the frames the network reads; the scenarios "
                            "hide it, so the network cannot see how much ammunition is left")
    train.add_argument("--clip", type=float, default=0.1, help="PPO clip range")
    train.add_argument("--entropy-coef", type=float, default=0.01)
    train.add_argument("--camal-max-grad-norm", type=float, default=0.5,
                       help="the CAMAL term's gradient is clipped to this norm, apart from the PPO loss's")
    train.add_argument("--steps", type=int, default=None, help="stop after this many environment steps")
    train.add_argument("--budget-s", type=float, default=None, help="stop after this many seconds")
    train.add_argument("--num-envs", type=int, default=8)
    train.add_argument("--rollout-steps", type=int, default=128)
    train.add_argument("--lr", type=float, default=2.5e-4)
    train.add_argument("--lr-schedule", choices=["constant", "linear"], default="constant",
                       help="linear: Adam's rate falls from --lr to 0 at --steps")
    train.add_argument("--minibatch", type=int, default=256)
    train.add_argument("--epochs", type=int, default=4, help="PPO epochs per update")
    train.add_argument("--width", type=int, default=None, help="CNN width (default 32; 8 for a CPU-sized agent)")
    train.add_argument("--hidden", type=int, default=None, help="width of the last hidden layer (default 128)")
    train.add_argument("--iou-every", type=int, default=5, help="updates between IoU measurements")
    train.add_argument("--checkpoint-every", type=int, default=10,
                       help="updates between checkpoints (also written when the run stops, SIGTERM included)")
    train.add_argument("--device", default="auto")
    train.add_argument("--threads", type=int, default=1)
    train.set_defaults(handler=cmd_train_agent)

    evaluate = commands.add_parser("evaluate-agent", help="agents on held-out episode seeds: return, V(s)-CAM IoU "
                                                          "with the masks, deletion/insertion of V(s) (JSON)")
    evaluate.add_argument("--agents", nargs="+", required=True, help="agent cards (NAME.json), same scenario")
    evaluate.add_argument("--episodes", type=int, default=10)
    evaluate.add_argument("--seed-base", type=int, default=EVAL_SEED_BASE,
                          help="episode k uses reset seed SEED_BASE + k (training never uses these)")
    evaluate.add_argument("--max-steps", type=int, default=MAX_EPISODE_STEPS)
    evaluate.add_argument("--curve-every", type=int, default=10,
                          help=f"every N-th frame gets {CURVE_STEPS}-step deletion/insertion curves")
    evaluate.add_argument("--greedy", action="store_true", help="play the most probable action (default: sampled)")
    evaluate.add_argument("--prior", default=None,
                          help="a .npy mean mask from training seeds (bench/agents_baselines.py): its IoU is reported")
    evaluate.add_argument("--out", required=True, help="results JSON (per-episode records)")
    evaluate.add_argument("--device", default="auto")
    evaluate.add_argument("--threads", type=int, default=1)
    evaluate.set_defaults(handler=cmd_evaluate_agent)

    export = commands.add_parser("export-agent", help="copy a trained agent under a new name (the shipped pair): "
                                                      "float16 weights with --half, a held-out evaluation in its card")
    export.add_argument("--agent", required=True, help="the trained agent's card (NAME.json)")
    export.add_argument("--name", required=True)
    export.add_argument("--out-dir", default="weights/agents")
    export.add_argument("--half", action="store_true", help="store the weights in float16")
    export.add_argument("--evaluation", nargs="*", default=None,
                        help="evaluate-agent's JSON(s) for this agent on held-out seeds (sampled, greedy)")
    export.add_argument("--baselines", default=None,
                        help="bench/agents_baselines.py's JSON on the same episodes: the scripted policies' returns")
    export.set_defaults(handler=cmd_export_agent)
