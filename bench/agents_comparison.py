"""The agents' comparison, in resumable stages: the recipe pilots and their gate, the CAMAL lambda, 5 seeds x 2 arms,
the held-out evaluation and the results. The same command continues where it stopped.

    PYTHONPATH=. python bench/agents_comparison.py --parallel 2 [--stop-at 22:20]     (WORK: bench/agents-runs/comparison-hud)

Stages (each starts when the one before is complete; a stage's runs go at most `--parallel` at a time, one thread
each, `train-agent` resuming from its checkpoint in WORK):
1. pilots: the recipes of bench/agents_recipe_gate.md (A: Nature CNN, B: compact CNN width 16; both 100 x 156,
   2 envs x 2048 steps, 3 epochs, lr 1e-4, minibatch 32, clip 0.2, no entropy bonus) on training seed 1 to
   196,608 steps (48 updates, within 200k), then 100 episodes each on reset seeds EVAL_SEED_BASE + k; gate: mean return >= 15. The recipe
   the comparison uses: B if it passes, else A if it passes; none: the script stops and says so.
   A pilots record (`agents-pilots.json`) that names a chosen recipe settles this stage.
2. lambda: with `--sweep`, CAMAL at lambda 3, 1 and 0.3 (largest first) on training seed 2 with the chosen
   recipe; the rule, fixed before the runs: the largest lambda whose critic's explained variance (mean over the
   last 5 updates) is >= 0.3, so the first that passes settles it and the smaller ones are not run; none: the
   comparison does not run CAMAL, and says so. `--lambda L`: a lambda the sweep chose before (at the real budget
   it chose 3.0: bench/results/agents-lambda-sweep-196k.json). With neither (the sweep does not fit this CPU's
   time beside the comparison): the documented default lambda 1.0 per frame. Either way the same rule is checked
   on the comparison's CAMAL runs after the fact (the results say whether it holds).
3. compare: training seeds 101-105 x {vanilla, CAMAL at the chosen lambda}, 196,608 steps each, with the status
   bar drawn (`--hud`, accepted by the fourth pilot round; a WORK folder of runs without it cannot be resumed
   with it: start a new one).
4. evaluate: every agent of stage 3 on 100 held-out episodes (reset seeds EVAL_SEED_BASE + 1000 + k, never
   used before), sampled and greedy, with the IoU references, V(s) deletion and the counterfactual test; each
   evaluation in a process of its own as soon as its run is trained, ahead of the next training run.
5. results: bench/results/agents-comparison-hud.json (agents-comparison.json: the runs without the bar; rliable intervals and POI over seeds for return and IoU, the
   counterfactual gap per arm and CAMAL - vanilla, the baselines and IoU reference points beside them).
2b. clip (`--clip-sweep`; bench/agents_recipe_gate.md, 2026-12-07): with the separate clips, lambda does not set
   CAMAL's strength once its gradient is held at its clip; the clip c does. CAMAL at lambda 1 and c in CLIPS on
   training seed 2, side by side; the largest c whose last 5 updates have explained variance >= 0.5, training
   return >= 16.0 and a last training IoU >= 0.10 is chosen (WORK/clip.json); `--camal-clip C` then runs the
   comparison's CAMAL arm at it.
`--arms camal --seeds 101 102`: only those runs of stages 3-4 (a new lambda needs only the CAMAL arm, since a vanilla
run does not depend on it; a session's share of the seeds), and no results file until every seed is in.
`--stop-at HH:MM` (UTC) or SIGTERM: the runs stop with a checkpoint; run the same command to continue.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

from explainers.agents.train import EVAL_SEED_BASE
from explainers.statistics import rounded

STEPS = 196_608  # 48 updates of 2 x 2048 steps: the most within the gate's 200k
RECIPE = ["--scenario", "defend_the_center", "--frame-hw", "100", "156", "--num-envs", "2", "--rollout-steps", "2048",
          "--epochs", "3", "--lr", "1e-4", "--minibatch", "32", "--clip", "0.2", "--entropy-coef", "0",
          "--iou-every", "5", "--checkpoint-every", "2", "--threads", "1", "--device", "cpu",
          "--hud"]  # the status bar drawn: the fourth pilot round (bench/agents_recipe_gate.md)
NETWORKS = {"A": ["--arch", "nature"], "B": ["--arch", "cnn", "--width", "16"]}
PREFERENCE = ("B", "A")  # if both pass the gate (bench/agents_recipe_gate.md)
GATE_RETURN, GATE_EPISODES = 15.0, 100
LAMBDAS, LAMBDA_SEED, EV_FLOOR, EV_UPDATES = (0.3, 1.0, 3.0), 2, 0.3, 5
DEFAULT_LAMBDA = 1.0  # without --sweep or --lambda
# CAMAL's strength with the status bar: the separate clip c (bench/agents_recipe_gate.md, the rule of 2026-12-07)
CLIPS, CLIP_SEED, CLIP_LAMBDA = (0.15, 0.05), 2, 1.0
CLIP_EV, CLIP_RETURN, CLIP_IOU, CLIP_UPDATES = 0.5, 16.0, 0.10, 5  # (ii) amended before the runs logged
# every CAMAL run of the clip sweep and the comparison measures the two clip factors on every 8th minibatch (one
# backward on the others): 1.26x a vanilla update instead of 2.1x, the cost target (bench/agents_recipe_gate.md,
# the amendment of 2026-12-07 19:05 UTC; judged equivalent in bench/results/agents-camal-norm-every-8.json)
CAMAL_COST = ["--camal-norm-every", "8"]
RESULTS = "agents-comparison-hud.json" if "--hud" in RECIPE else "agents-comparison.json"
PRIOR = "agents-mask-prior-hud-100x156.npy" if "--hud" in RECIPE else "agents-mask-prior-100x156.npy"  # the IoU's
# fixed prior map, made by bench/agents_baselines.py on frames drawn as the agents see them
SEEDS, EVAL_EPISODES, EVAL_OFFSET = (101, 102, 103, 104, 105), 100, 1000
STOPPED = 3  # exit status: stopped before the end, run the same command again


class Stop(Exception):
    pass


def finished(work: Path, name: str) -> dict | None:
    card = work / f"{name}.json"
    if not card.exists():
        return None
    card = json.loads(card.read_text())
    return card if card.get("steps", 0) >= STEPS else None


def evaluation_file(work: Path, name: str, greedy: bool = False) -> Path:
    return work / "eval" / f"{name}{'-greedy' if greedy else ''}.json"


def run_all(work: Path, runs: list, args, logs: Path, evaluations: tuple = ()) -> None:
    """Train the runs not yet finished and evaluate the finished ones (`evaluations`: (name, greedy) pairs, each
    once its run is trained), at most `args.parallel` processes at a time, one thread each; a slot goes to an
    evaluation before a new training run (a quarter of a run's time, and it completes a run's record), so no core
    waits for the last training runs before the evaluations start. Stop at the deadline or on a signal: training
    runs checkpoint, an evaluation under way is dropped (its file is written only at its end)."""
    waiting = [run for run in runs if not finished(work, run[0])]
    to_evaluate = [job for job in evaluations if not evaluation_file(work, *job).exists()]
    active: dict = {}  # process -> (what, name, log)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    while waiting or to_evaluate or active:
        while len(active) < args.parallel and not stop_now(args):
            ready = [job for job in to_evaluate if finished(work, job[0])]
            if ready:
                name, greedy = ready[0]
                to_evaluate.remove(ready[0])
                command = [sys.executable, str(Path(__file__).resolve()), "--work", str(work), "--results",
                           str(args.results), "--evaluate-one", name, *(["--greedy"] if greedy else []),
                           *(["--smoke"] if getattr(args, "smoke", False) else [])]
                label, what = f"{name}-eval{'-greedy' if greedy else ''}", ("eval", name, greedy)
            elif waiting:
                name, extra = waiting.pop(0)
                command = [sys.executable, "-m", "explainers", "train-agent", *RECIPE, *extra, "--steps", str(STEPS),
                           "--out", str(work), "--name", name]
                label, what = name, ("train", name, None)
            else:
                break
            log = logs / f"{label}.log"
            with open(log, "a") as handle:
                process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
            active[process] = (*what, log)
            print(f"[comparison] started {label}", flush=True)
        if stop_now(args):
            for process in active:
                process.send_signal(signal.SIGTERM)  # train-agent checkpoints and exits after its current step
            for process in active:
                process.wait()
            raise Stop()
        if not active:  # evaluations left whose runs are neither trained nor among these runs
            raise SystemExit(f"cannot evaluate {[name for name, _ in to_evaluate]}: not trained")
        time.sleep(5)
        for process, (what, name, greedy, log) in list(active.items()):
            if process.poll() is None:
                continue
            del active[process]
            if what == "train" and not finished(work, name):
                raise SystemExit(f"{name} stopped without finishing (see {log})")
            if what == "eval" and not evaluation_file(work, name, greedy).exists():
                raise SystemExit(f"the evaluation of {name} failed (see {log})")


def stop_now(args) -> bool:
    return bool(STOP_SIGNAL) or (args.deadline is not None and time.time() >= args.deadline)


def next_occurrence(clock: str | None, now: datetime.datetime | None = None) -> float | None:
    """The next time the UTC clock reads HH:MM, as a timestamp: 01:40 given at 23:25 means tomorrow's 01:40."""
    if not clock:
        return None
    hour, minute = (int(v) for v in clock.split(":"))
    now = now or datetime.datetime.now(datetime.timezone.utc)
    target = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if target <= now:
        target += datetime.timedelta(days=1)
    return target.timestamp()


STOP_SIGNAL: list = []


def evaluate(work: Path, name: str, seed_base: int, episodes: int, greedy: bool = False, prior=None) -> dict:
    out = evaluation_file(work, name, greedy)
    if out.exists():
        return json.loads(out.read_text())
    from explainers.agents.evaluate import evaluate_agents
    from explainers.atomic import atomic_write_text

    result = evaluate_agents([work / f"{name}.json"], episodes=episodes, seed_base=seed_base, greedy=greedy,
                             prior=prior, curve_every=10)
    atomic_write_text(out, json.dumps(rounded(result)))  # whole or absent: a stopped evaluation leaves nothing
    return result


def pilots(work: Path, args, logs: Path) -> str | None:
    """Train and judge the pilots; the preferred one that passes is chosen as soon as it is known."""
    record = {"gate": f"mean return >= {GATE_RETURN} on {GATE_EPISODES} episodes (reset seeds "
                      f"{EVAL_SEED_BASE}-{EVAL_SEED_BASE + GATE_EPISODES - 1}) within {STEPS} steps",
              "recipe": RECIPE, "pilots": {}}
    done = Path(args.results, "agents-pilots.json")
    if done.exists() and json.loads(done.read_text()).get("chosen"):
        return json.loads(done.read_text())["chosen"]
    for key in PREFERENCE:  # a preferred pilot that already passed settles it
        if finished(work, f"pilot-{key}") and judge(work, key, record):
            return write_pilots(record, key, args)
    run_all(work, [(f"pilot-{key}", ["--seed", "1", "--lambda", "0", *NETWORKS[key]]) for key in PREFERENCE],
            args, logs)
    passed = [key for key in PREFERENCE if judge(work, key, record)]
    return write_pilots(record, passed[0] if passed else None, args)


def judge(work: Path, key: str, record: dict) -> bool:
    result = evaluate(work, f"pilot-{key}", EVAL_SEED_BASE, GATE_EPISODES)
    returns = [e["return"] for e in result["episodes"]]
    card = finished(work, f"pilot-{key}")
    record["pilots"][key] = {"network": NETWORKS[key], "steps": card["steps"], "train_seconds":
                             card["train_seconds"], **_mean_ci(returns), "passed": float(np.mean(returns)) >= GATE_RETURN}
    return record["pilots"][key]["passed"]


def write_pilots(record: dict, chosen: str | None, args) -> str | None:
    record["chosen"] = chosen
    Path(args.results, "agents-pilots.json").write_text(json.dumps(rounded(record), indent=1))
    return chosen


def _mean_ci(values) -> dict:
    from explainers.statistics import mean_with_ci

    scores = mean_with_ci(values)
    return {"mean_return": scores["mean"], "ci95": scores["ci95"], "episodes": scores["n"]}


def pick_lambda(work: Path, key: str, args, logs: Path) -> float | None:
    """The rule's lambda, largest first: once a lambda passes, no smaller one can be chosen, so those are not run
    (the same answer as running all three, for a third to two thirds of the time on this CPU)."""
    table, chosen = {}, None
    for lam in sorted(LAMBDAS, reverse=True):
        name = f"lambda-{lam:g}-s{LAMBDA_SEED}"
        run_all(work, [(name, ["--seed", str(LAMBDA_SEED), "--lambda", str(lam), *NETWORKS[key]])], args, logs)
        history = finished(work, name)["history"]
        table[lam] = float(np.mean([row["explained_variance"] for row in history[-EV_UPDATES:]]))
        if table[lam] >= EV_FLOOR:
            chosen = lam
            break
    (work / "lambda.json").write_text(json.dumps({
        "rule": f"largest lambda with explained variance >= {EV_FLOOR} (mean of the last {EV_UPDATES} updates)",
        "explained_variance": table, "chosen": chosen,
        "not_run": [lam for lam in LAMBDAS if lam not in table],
        "why_not_run": "a larger lambda passed, so the rule cannot choose these"}, indent=1))
    return chosen


def judge_clip(card: dict) -> dict:
    """The clip rule on one finished run's training log: explained variance, training return and the V(s)-CAM's
    IoU over its last updates (bench/agents_recipe_gate.md)."""
    tail = card["history"][-CLIP_UPDATES:]
    ious = [row["iou"] for row in card["history"] if row.get("iou") is not None]
    row = {"explained_variance": float(np.mean([r["explained_variance"] for r in tail])),
           "training_return": float(np.mean([r["return_100"] for r in tail])),
           "training_iou": ious[-1] if ious else None}
    row["passed"] = bool(row["explained_variance"] >= CLIP_EV and row["training_return"] >= CLIP_RETURN
                         and row["training_iou"] is not None and row["training_iou"] >= CLIP_IOU)
    return row


def pick_clip(work: Path, key: str, args, logs: Path) -> float | None:
    """Every candidate clip on the clip seed (side by side, `--parallel` at a time), then the largest that passes
    the rule; None if none does. Written to WORK/clip.json."""
    runs = [(f"clip-{c:g}-s{CLIP_SEED}", ["--seed", str(CLIP_SEED), "--lambda", str(CLIP_LAMBDA),
                                          "--camal-max-grad-norm", str(c), *CAMAL_COST, *NETWORKS[key]])
            for c in CLIPS]
    run_all(work, runs, args, logs)
    table = {f"{c:g}": judge_clip(finished(work, name)) for c, (name, _) in zip(CLIPS, runs)}
    passing = [c for c in CLIPS if table[f"{c:g}"]["passed"]]
    chosen = max(passing) if passing else None
    (work / "clip.json").write_text(json.dumps(rounded({
        "rule": f"the largest CAMAL clip c whose run (lambda {CLIP_LAMBDA}, training seed {CLIP_SEED}) has, over its "
                f"last {CLIP_UPDATES} updates, explained variance >= {CLIP_EV}, training return >= {CLIP_RETURN} and a "
                f"last training IoU >= {CLIP_IOU} (bench/agents_recipe_gate.md)", "runs": table, "chosen": chosen}),
        indent=1))
    return chosen


def load_prior(args):
    """The IoU's fixed prior map (float32), needed before any agent of the comparison is evaluated."""
    prior_path = Path(args.results, PRIOR)
    if not prior_path.exists() and not getattr(args, "smoke", False):
        raise SystemExit(f"The IoU's prior map {prior_path} is missing: make it first with "
                         f"bench/agents_baselines.py{' --hud' if '--hud' in RECIPE else ''} --prior-out {prior_path} ...")
    return np.load(prior_path).astype(np.float32) if prior_path.exists() else None


def compare(work: Path, key: str, lam: float | None, args, logs: Path) -> list:
    arms = [("vanilla", 0.0)] + ([("camal", lam)] if lam is not None else [])
    arms = [(arm, value) for arm, value in arms if arm in args.arms]
    clip = getattr(args, "camal_clip", None)
    runs = [(f"{arm}-s{seed}", ["--seed", str(seed), "--lambda", str(value), *NETWORKS[key],
                                *(CAMAL_COST if arm == "camal" else []),
                                *(["--camal-max-grad-norm", str(clip)] if arm == "camal" and clip is not None else [])])
            for seed in args.seeds for arm, value in arms]
    prior = load_prior(args)
    run_all(work, runs, args, logs, evaluations=tuple((name, greedy) for name, _ in runs for greedy in (False, True)))
    for name, _ in runs:  # each evaluated above in its own process: read back here (made here if one is missing)
        for greedy in (False, True):
            if stop_now(args):
                raise Stop()
            evaluate(work, name, EVAL_SEED_BASE + EVAL_OFFSET, EVAL_EPISODES, greedy, prior)
    return [name for name, _ in runs]


def _smoke() -> None:
    global STEPS, GATE_RETURN, GATE_EPISODES, LAMBDAS, SEEDS, EVAL_EPISODES, EV_FLOOR
    STEPS, GATE_RETURN, GATE_EPISODES, LAMBDAS, SEEDS, EVAL_EPISODES, EV_FLOOR = 256, -99, 2, (1.0,), (101,), 2, -99
    RECIPE[RECIPE.index("--rollout-steps") + 1] = "64"
    RECIPE[RECIPE.index("--frame-hw") + 1:RECIPE.index("--frame-hw") + 3] = ["60", "80"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default=str(ROOT / "bench" / "agents-runs" / "comparison-hud"))
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--stop-at", default=None, help="HH:MM (UTC): stop with checkpoints at this time")
    parser.add_argument("--logs", default=str(ROOT / "bench" / "agents-runs" / "logs"),
                        help="the runs' logs (in the tree, so that a stop commits them with the checkpoints)")
    parser.add_argument("--results", default=str(ROOT / "bench" / "results"))
    parser.add_argument("--sweep", action="store_true", help="choose lambda by the sweep of stage 2 (3 more runs)")
    parser.add_argument("--sweep-only", action="store_true",
                        help="stage 2 alone: the lambda sweep and its lambda.json, then stop (the comparison's runs "
                             "are not touched)")
    parser.add_argument("--lambda", dest="lam", type=float, default=None,
                        help="CAMAL's lambda, chosen before by the sweep's rule (its record: "
                             "bench/results/agents-lambda-sweep-196k.json); without it and without --sweep, "
                             f"{DEFAULT_LAMBDA}")
    parser.add_argument("--clip-sweep", action="store_true",
                        help="CAMAL's clip by its rule (bench/agents_recipe_gate.md): every candidate on the clip "
                             "seed, then WORK/clip.json, then stop")
    parser.add_argument("--camal-clip", type=float, default=None,
                        help="the CAMAL arm at this clip of its gradient (lambda 1): the clip rule's choice")
    parser.add_argument("--arms", nargs="+", choices=("vanilla", "camal"), default=["vanilla", "camal"],
                        help="train and evaluate only these arms (a vanilla run does not depend on lambda, so a new "
                             "lambda needs only the CAMAL arm)")
    parser.add_argument("--seeds", nargs="+", type=int, default=None,
                        help=f"only these training seeds of the comparison's {SEEDS} (a session's share of it)")
    parser.add_argument("--evaluate-one", metavar="NAME", help=argparse.SUPPRESS)  # run_all's evaluation process
    parser.add_argument("--greedy", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true", help="a quick check of the machinery (tiny runs, a few "
                                                             "episodes): its numbers are not results")
    args = parser.parse_args(argv)
    args.deadline = next_occurrence(args.stop_at)
    if args.smoke:
        _smoke()
    args.seeds = args.seeds or list(SEEDS)
    if not set(args.seeds) <= set(SEEDS):
        parser.error(f"--seeds must be among the comparison's training seeds {SEEDS}")
    work, logs = Path(args.work), Path(args.logs)
    if args.evaluate_one:  # one agent on the held-out episodes, in a process of its own (SIGTERM ends it)
        started = time.time()
        result = evaluate(work, args.evaluate_one, EVAL_SEED_BASE + EVAL_OFFSET, EVAL_EPISODES, args.greedy,
                          load_prior(args))
        returns = [episode["return"] for episode in result["episodes"]]
        print(f"[evaluate] {args.evaluate_one} {'greedy' if args.greedy else 'sampled'}: {len(returns)} episodes, "
              f"mean return {np.mean(returns):.2f}, {time.time() - started:.0f} s", flush=True)
        return 0
    work.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: STOP_SIGNAL.append(True))
    try:
        key = pilots(work, args, logs)
        if key is None:
            print("[comparison] no recipe passed the gate: see bench/results/agents-pilots.json", flush=True)
            return 0
        if args.clip_sweep:
            clip = pick_clip(work, key, args, logs)
            print(f"[comparison] the clip rule chose {clip} (figures: {work / 'clip.json'})", flush=True)
            return 0
        if args.camal_clip is not None:
            if args.lam is not None or args.sweep or args.sweep_only:
                parser.error("--camal-clip sets CAMAL's strength with lambda 1: give no --lambda or --sweep")
            args.lam = CLIP_LAMBDA
        if args.lam is not None and (args.sweep or args.sweep_only):
            parser.error("--lambda and --sweep both choose lambda: give one")
        lam = (pick_lambda(work, key, args, logs) if args.sweep or args.sweep_only
               else args.lam if args.lam is not None else DEFAULT_LAMBDA)
        if args.camal_clip is not None:  # the results read CAMAL's setting and where it came from
            (work / "lambda.json").write_text(json.dumps({
                "chosen": CLIP_LAMBDA, "camal_clip": args.camal_clip, "from": "--camal-clip: chosen by the clip rule "
                "(bench/agents_recipe_gate.md, WORK/clip.json); lambda 1, every CAMAL step held at the clip",
                "rule_after_the_fact": f"explained variance >= {EV_FLOOR} in every CAMAL run of the comparison"},
                indent=1))
        elif args.lam is not None:  # the results read the lambda and where it came from in WORK/lambda.json
            (work / "lambda.json").write_text(json.dumps({
                "chosen": args.lam, "from": "--lambda: chosen before by the sweep's rule (largest lambda with "
                f"explained variance >= {EV_FLOOR}, mean of the last {EV_UPDATES} updates), "
                "bench/results/agents-lambda-sweep-196k.json", "rule_after_the_fact": f"explained variance >= "
                f"{EV_FLOOR} in every CAMAL run of the comparison"}, indent=1))
        if args.sweep_only:
            print(f"[comparison] the sweep chose lambda {lam} (rule and figures: {work / 'lambda.json'})", flush=True)
            return 0
        names = compare(work, key, lam, args, logs)
    except Stop:
        print("[comparison] stopped with checkpoints: run the same command to continue", flush=True)
        return STOPPED
    if set(args.seeds) != set(SEEDS) or len(args.arms) < 2:
        print(f"[comparison] trained and evaluated {names} (a part of the comparison: the results are written by "
              f"agents_comparison_results.py once every seed is in)", flush=True)
        return 0
    from agents_comparison_results import write_results  # beside this script

    write_results(work, names, Path(args.results, RESULTS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
