"""Seed statistics (explainers.agents.stats) against rliable, the field's reference, and known answers."""
import numpy as np
import pytest

from explainers.agents.stats import compare_arms, probability_of_improvement, stratified_interval


def test_probability_of_improvement_known_answers():
    assert probability_of_improvement([3, 4, 5], [0, 1, 2]) == 1.0
    assert probability_of_improvement([0, 1], [2, 3]) == 0.0
    assert probability_of_improvement([1, 1], [1, 1]) == 0.5
    # x = [1, 3] vs y = [2, 2]: pairs (1>2 no, 1>2 no, 3>2 yes, 3>2 yes) = 0.5; a tie counts a half
    assert probability_of_improvement([1, 3], [2, 2]) == 0.5
    assert probability_of_improvement([2, 3], [2, 1]) == pytest.approx((0.5 + 1 + 1 + 1) / 4)


def test_stratified_bootstrap_resamples_within_tasks():
    scores = np.array([[0.0, 10.0], [1.0, 11.0], [2.0, 12.0]])  # 3 runs x 2 tasks
    seen = set()

    def record(matrix):
        seen.update(matrix[:, 0].tolist())
        assert set(matrix[:, 1].tolist()) <= {10.0, 11.0, 12.0}  # task 2's runs stay in task 2
        return float(matrix.mean())

    point, (low, high) = stratified_interval(record, scores, reps=200)
    assert point == pytest.approx(6.0) and low < point < high and seen == {0.0, 1.0, 2.0}


def test_agrees_with_rliable():
    pytest.importorskip("rliable")
    from explainers.agents.stats import compare_arms_rliable

    rng = np.random.default_rng(3)
    camal, vanilla = rng.normal(0.30, 0.05, (5, 1)), rng.normal(0.20, 0.06, (5, 1))
    ours = compare_arms(camal, vanilla, reps=1000)
    theirs = compare_arms_rliable(camal, vanilla, reps=1000)
    for key in ("x_mean", "y_mean", "difference", "poi"):
        assert ours[key] == pytest.approx(theirs[key], abs=1e-12)
    for key in ("x_ci", "y_ci", "difference_ci"):  # different random draws: close, not equal
        assert np.allclose(ours[key], theirs[key], atol=0.025), (key, ours[key], theirs[key])
    # POI over 5 x 5 runs moves in steps of 1/25: the two draws' quantiles may sit one step apart
    assert np.allclose(ours["poi_ci"], theirs["poi_ci"], atol=1 / 25 + 0.01), (ours["poi_ci"], theirs["poi_ci"])


def test_the_comparison_deadline_crosses_midnight():
    """`--stop-at 01:40` given at 23:25 means the next 01:40, not one already past (which stopped every run at once)."""
    import datetime
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("agents_comparison",
                                                  Path(__file__).parent.parent / "bench" / "agents_comparison.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    utc = datetime.timezone.utc
    late = datetime.datetime(2026, 12, 5, 23, 25, tzinfo=utc)
    assert module.next_occurrence("01:40", late) == datetime.datetime(2026, 12, 6, 1, 40, tzinfo=utc).timestamp()
    assert module.next_occurrence("23:50", late) == datetime.datetime(2026, 12, 5, 23, 50, tzinfo=utc).timestamp()
    assert module.next_occurrence(None, late) is None


def test_the_comparison_results_over_the_runs_evaluated_so_far(tmp_path):
    """bench/agents_comparison_results.py on a folder of two seeds per arm (one more run trained but evaluated only
    sampled, so left out): per-seed scores are the means over each agent's episodes, the arms are compared over the
    shared seeds, the CAMAL critics' explained-variance rule is read from their cards, and a file written before
    the planned five seeds says it is not complete."""
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "agents_comparison_results", Path(__file__).parent.parent / "bench" / "agents_comparison_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "eval").mkdir()

    def write_run(name, returns, iou, explained_variance, greedy_return):
        episodes = [{"return": r, "iou": iou, "iou_reference": {"random": 0.02, "prior": 0.1}, "seed": 10 + k}
                    for k, r in enumerate(returns)]
        drops = {"spread": 2.0, "frames": 4, "skipped": 0, "monsters": [0.3, 0.2, 0.4, 0.1],
                 "control": [0.0, 0.1, 0.0, 0.0], "episodes": [10, 10, 11, 11]}
        sampled = {"episodes": episodes, "counterfactual": {name: drops},
                   "fidelity": {name: {"deletion_drop": [0.5, 0.7]}}}
        (tmp_path / "eval" / f"{name}.json").write_text(json.dumps(sampled))
        if greedy_return is not None:
            greedy = {"episodes": [{"return": greedy_return, "iou": iou}]}
            (tmp_path / "eval" / f"{name}-greedy.json").write_text(json.dumps(greedy))
        card = {"steps": 4096, "train_seconds": 60.0,
                "history": [{"explained_variance": explained_variance}] * 5}
        (tmp_path / f"{name}.json").write_text(json.dumps(card))

    write_run("vanilla-s101", [10, 14], 0.02, 0.7, 9.0)
    write_run("vanilla-s102", [8, 8], 0.01, 0.6, 8.0)
    write_run("camal-s101", [6, 10], 0.40, 0.8, 7.0)
    write_run("camal-s102", [9, 9], 0.30, 0.5, 6.0)
    write_run("camal-s103", [1, 1], 0.30, 0.5, None)  # no greedy evaluation yet
    names = module.evaluated_runs(tmp_path)
    assert names == ["camal-s101", "camal-s102", "vanilla-s101", "vanilla-s102"]
    result = module.write_results(tmp_path, names, tmp_path / "results.json", reps=500)
    assert result["seeds_done"] == {"camal": [101, 102], "vanilla": [101, 102]} and not result["complete"]
    assert result["arms"]["vanilla"][101]["return"] == 12.0 and result["arms"]["camal"][102]["iou"] == 0.30
    assert result["arms"]["camal"][101]["return_greedy"] == 7.0
    comparison = result["camal_minus_vanilla"]["return"]
    assert comparison["x_mean"] == 8.5 and comparison["y_mean"] == 10.0 and comparison["runs"] == [2, 2]
    assert result["lambda"]["holds_in_every_camal_seed"]  # every CAMAL critic's end-of-training explained variance >= 0.3
    assert json.loads((tmp_path / "results.json").read_text())["complete"] is False
    table = (tmp_path / "results.md").read_text()
    assert "| camal-s101 | 8.00 | 7.00 | 0.400 | 0.020 / 0.100 / n/a |" in table
    assert "| vanilla-s102 | 8.00 | 8.00 | 0.010 |" in table and "camal-s103" not in table
    assert not result["status_bar_drawn"] and result["baselines_file"] == "agents-baselines-100x156-comparison-seeds.json"
    # runs that read the status bar take the scripts' references made on frames with the bar; a CAMAL critic below
    # the explained-variance floor breaks the rule
    card = json.loads((tmp_path / "camal-s102.json").read_text())
    (tmp_path / "camal-s102.json").write_text(json.dumps({**card, "hud": True,
                                                          "history": [{"explained_variance": 0.2}] * 5}))
    result = module.write_results(tmp_path, names, tmp_path / "results.json", reps=500)
    assert result["status_bar_drawn"] and result["baselines_file"].startswith("agents-baselines-hud-")
    assert not result["lambda"]["holds_in_every_camal_seed"]
    assert "**not complete**" in table and "| return, sampled actions (2 vs 2 seeds) | -1.500" in table
    # a new lambda's CAMAL arm beside the vanilla seeds of that file (their eval files gone): the stored scores
    # are taken as they were, the new runs' from their evaluations
    for name in ("vanilla-s101", "vanilla-s102"):
        (tmp_path / "eval" / f"{name}.json").unlink()
    names = module.evaluated_runs(tmp_path)
    again = module.write_results(tmp_path, names, tmp_path / "again.json", reps=500,
                                 stored={"vanilla": tmp_path / "results.json"})
    assert again["seeds_done"] == {"vanilla": [101, 102], "camal": [101, 102]}
    assert again["arms"]["vanilla"][101]["return"] == 12.0 and again["stored_arms"]["vanilla"].endswith("results.json")
    assert again["camal_minus_vanilla"]["return"]["y_mean"] == 10.0
    # the command line leaves out a lambda sweep's run evaluated in the same folder
    write_run("lambda-3-s2", [5, 5], 0.35, 0.75, 4.0)
    assert module.main(["--work", str(tmp_path), "--out", str(tmp_path / "cli.json"),
                        "--stored", f"vanilla={tmp_path / 'results.json'}"]) == 0
    assert set(json.loads((tmp_path / "cli.json").read_text())["arms"]) == {"camal", "vanilla"}


def test_a_variants_results_pair_its_episodes_with_the_comparisons_runs(tmp_path):
    """bench/agents_variant_results.py: a variant's return minus the comparison's runs of the same seed, paired over
    the same episodes (matched by reset seed, whatever their order), and the variant minus each arm over seeds."""
    import json

    from bench.agents_variant_results import markdown, variant_results

    def write_run(work, name, returns, iou):
        (work / "eval").mkdir(parents=True, exist_ok=True)
        episodes = [{"return": r, "iou": iou, "iou_reference": {"random": 0.02}, "seed": 10 + k}
                    for k, r in enumerate(returns)]
        drops = {"spread": 2.0, "frames": 2, "skipped": 0, "monsters": [0.3, 0.2], "control": [0.0, 0.1],
                 "episodes": [10, 11]}
        sampled = {"episodes": episodes[::-1] if "ne8" in name else episodes,  # another order: paired by seed
                   "counterfactual": {name: drops}, "fidelity": {name: {"deletion_drop": [0.5]}}}
        (work / "eval" / f"{name}.json").write_text(json.dumps(sampled))
        (work / "eval" / f"{name}-greedy.json").write_text(json.dumps({"episodes": [{"return": 1.0, "iou": iou}]}))
        (work / f"{name}.json").write_text(json.dumps({"steps": 64, "train_seconds": 1.0,
                                                       "history": [{"explained_variance": 0.5}] * 5}))

    comparison, variant = tmp_path / "comparison", tmp_path / "variant"
    for seed, offset in ((101, 0), (102, 2)):
        write_run(comparison, f"vanilla-s{seed}", [10 + offset, 12 + offset, 14 + offset], 0.02)
        write_run(comparison, f"camal-s{seed}", [4 + offset, 6 + offset, 8 + offset], 0.40)
        write_run(variant, f"camal-ne8-s{seed}", [11 + offset, 12 + offset, 16 + offset], 0.30)
    result = variant_results(variant, "camal-ne8", comparison)
    assert result["seeds"] == [101, 102]
    paired = result["per_seed"][101]["paired_over_episodes"]
    assert paired["vanilla-s101"]["return"]["mean"] == 1.0  # (1 + 0 + 2) / 3, episode by episode
    assert paired["camal-s101"]["return"]["mean"] == 7.0 and paired["camal-s101"]["episodes"] == 3
    assert abs(paired["camal-s101"]["iou"]["mean"] + 0.10) < 1e-9
    over = result["variant_minus_arm_over_seeds"]
    assert over["vanilla"]["seeds"] == [101, 102] and abs(over["vanilla"]["return"]["difference"] - 1.0) < 1e-9
    assert "| 101 | 13.00 |" in markdown(result) and "minus camal" in markdown(result)
    # 4 CAMAL runs: the variant's (IoU 0.30, returns 13 and 15) above the exact arm's (IoU 0.40, returns 6 and 8)
    link = result["iou_and_return"]
    assert link["runs"] == 4 and link["spearman"] < -0.8 and "Spearman" in markdown(result)


def test_the_lambda_sweep_runs_largest_first_and_stops_at_the_first_that_passes(tmp_path):
    """The rule takes the largest lambda whose critic explains >= 0.3 of the variance: once one passes, the smaller
    ones cannot be chosen and are not trained; if none passes, every lambda is tried and none is chosen."""
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("agents_comparison",
                                                  Path(__file__).parent.parent / "bench" / "agents_comparison.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def sweep(explained_variance: dict):
        trained = []

        def fake_run_all(work, runs, args, logs):
            for name, extra in runs:
                lam = float(extra[extra.index("--lambda") + 1])
                trained.append(lam)
                history = [{"explained_variance": 0.0}] * 10 + [{"explained_variance": explained_variance[lam]}] * 5
                (work / f"{name}.json").write_text(json.dumps({"steps": module.STEPS, "history": history}))

        module.run_all = fake_run_all
        work = tmp_path / str(len(list(tmp_path.iterdir())))
        work.mkdir()
        chosen = module.pick_lambda(work, "A", None, tmp_path)
        return chosen, trained, json.loads((work / "lambda.json").read_text())

    chosen, trained, record = sweep({3.0: 0.1, 1.0: 0.45, 0.3: 0.8})
    assert (chosen, trained) == (1.0, [3.0, 1.0])
    assert record["not_run"] == [0.3] and record["chosen"] == 1.0
    chosen, trained, record = sweep({3.0: 0.6, 1.0: 0.7, 0.3: 0.8})
    assert (chosen, trained) == (3.0, [3.0])
    chosen, trained, record = sweep({3.0: 0.1, 1.0: 0.2, 0.3: 0.29})
    assert (chosen, trained, record["not_run"]) == (None, [3.0, 1.0, 0.3], [])


def test_the_comparison_can_run_one_arm_on_some_seeds(tmp_path):
    """A new lambda needs only the CAMAL arm (vanilla does not depend on it), a session's share of the seeds: those
    runs are trained and evaluated at the chosen lambda and no others, and the results file is not written from a
    part of the comparison."""
    import argparse
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("agents_comparison",
                                                  Path(__file__).parent.parent / "bench" / "agents_comparison.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    trained, evaluated = [], []
    scheduled = []
    module.run_all = lambda work, runs, args, logs, evaluations=(): (scheduled.extend(evaluations), trained.extend(
        (name, extra[extra.index("--lambda") + 1], extra[extra.index("--seed") + 1]) for name, extra in runs))
    module.evaluate = lambda work, name, seed_base, episodes, greedy=False, prior=None: evaluated.append((name, greedy))
    args = argparse.Namespace(arms=["camal"], seeds=[101, 102], results=str(tmp_path), deadline=None)
    with __import__("pytest").raises(SystemExit, match="prior map"):  # the IoU's prior is needed before evaluating
        module.compare(tmp_path, "A", 3.0, args, tmp_path)
    assert evaluated == []
    trained.clear()
    __import__("numpy").save(tmp_path / module.PRIOR, __import__("numpy").zeros((100, 156), "float16"))
    names = module.compare(tmp_path, "A", 3.0, args, tmp_path)
    assert names == ["camal-s101", "camal-s102"]
    assert trained == [("camal-s101", "3.0", "101"), ("camal-s102", "3.0", "102")]
    assert evaluated == [("camal-s101", False), ("camal-s101", True), ("camal-s102", False), ("camal-s102", True)]
    assert scheduled == evaluated  # each evaluation goes to the scheduler beside the training runs
    module.pilots = lambda work, args, logs: "A"
    module.pick_lambda = lambda work, key, args, logs: 3.0
    module.compare = lambda work, key, lam, args, logs: ["camal-s101"]
    assert module.main(["--work", str(tmp_path), "--logs", str(tmp_path), "--results", str(tmp_path), "--sweep",
                        "--arms", "camal", "--seeds", "101"]) == 0
    assert not (tmp_path / "agents-comparison.json").exists()
    with __import__("pytest").raises(SystemExit):
        module.main(["--work", str(tmp_path), "--seeds", "7"])
    # a lambda the sweep chose before: given, recorded where the results read it, and never beside --sweep
    chosen = []
    module.compare = lambda work, key, lam, args, logs: chosen.append(lam) or ["camal-s101"]
    assert module.main(["--work", str(tmp_path), "--logs", str(tmp_path), "--results", str(tmp_path),
                        "--lambda", "3", "--arms", "camal", "--seeds", "101"]) == 0
    assert chosen == [3.0] and json.loads((tmp_path / "lambda.json").read_text())["chosen"] == 3.0
    with __import__("pytest").raises(SystemExit):
        module.main(["--work", str(tmp_path), "--lambda", "3", "--sweep"])
    # the clip rule's choice: lambda 1 and the clip, recorded; never beside a lambda of its own
    chosen.clear()
    assert module.main(["--work", str(tmp_path), "--logs", str(tmp_path), "--results", str(tmp_path),
                        "--camal-clip", "0.15", "--arms", "camal", "--seeds", "101"]) == 0
    record = json.loads((tmp_path / "lambda.json").read_text())
    assert chosen == [1.0] and record["camal_clip"] == 0.15 and record["chosen"] == 1.0
    with __import__("pytest").raises(SystemExit):
        module.main(["--work", str(tmp_path), "--camal-clip", "0.15", "--lambda", "3"])


def test_the_comparison_evaluates_each_trained_run_before_training_the_next(tmp_path, monkeypatch):
    """run_all's scheduler: at most `parallel` processes; a free slot goes to an evaluation of a trained run before
    a new training run; an evaluation that writes no file or a run that does not finish stops the comparison; at
    the deadline every process under way is sent SIGTERM and the call raises Stop."""
    import argparse
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("agents_comparison",
                                                  Path(__file__).parent.parent / "bench" / "agents_comparison.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    started, signalled = [], []

    class FakeProcess:  # does its work when first polled: a training run writes its card, an evaluation its file
        def __init__(self, command, **_):
            self.command, self.done = command, False
            if "train-agent" in command:
                self.label = command[command.index("--name") + 1]
            else:
                self.label = command[command.index("--evaluate-one") + 1] + ("-greedy" if "--greedy" in command
                                                                             else "-eval")
            started.append(self.label)

        def poll(self):
            if not self.done:
                self.done = True
                if "train-agent" in self.command:
                    (tmp_path / f"{self.label}.json").write_text(json.dumps({"steps": module.STEPS}))
                elif "broken" not in self.label:
                    module.evaluation_file(tmp_path, self.label.rsplit("-", 1)[0], "greedy" in self.label).parent.mkdir(
                        exist_ok=True)
                    module.evaluation_file(tmp_path, self.label.rsplit("-", 1)[0],
                                           "greedy" in self.label).write_text("{}")
                return None  # still running at this poll
            return 0

        def send_signal(self, number):
            signalled.append((self.label, number))

        def wait(self):
            return 0

    monkeypatch.setattr(module.subprocess, "Popen", FakeProcess)
    monkeypatch.setattr(module.time, "sleep", lambda seconds: None)
    runs = [("a", []), ("b", [])]
    jobs = tuple((name, greedy) for name, _ in runs for greedy in (False, True))
    args = argparse.Namespace(parallel=1, deadline=None, results=str(tmp_path))
    module.run_all(tmp_path, runs, args, tmp_path, evaluations=jobs)
    assert started == ["a", "a-eval", "a-greedy", "b", "b-eval", "b-greedy"]
    started.clear()
    module.run_all(tmp_path, runs, args, tmp_path, evaluations=jobs)  # all done: nothing starts again
    assert started == []
    (tmp_path / "eval" / "b-greedy.json").unlink()
    args.parallel = 2
    module.run_all(tmp_path, runs + [("c", [])], args, tmp_path, evaluations=jobs + (("c", False),))
    assert started == ["b-greedy", "c", "c-eval"]
    started.clear()
    with __import__("pytest").raises(SystemExit, match="evaluation of broken"):
        module.run_all(tmp_path, [("broken", [])], args, tmp_path, evaluations=(("broken", False),))
    with __import__("pytest").raises(SystemExit, match="not trained"):
        module.run_all(tmp_path, [], args, tmp_path, evaluations=(("never", False),))
    started.clear()
    monkeypatch.setattr(module, "STOP_SIGNAL", [])
    real_init = FakeProcess.__init__

    def stop_after_starting(self, command, **kw):  # SIGTERM reaches the driver once "d" is under way
        real_init(self, command, **kw)
        module.STOP_SIGNAL.append(True)

    monkeypatch.setattr(FakeProcess, "__init__", stop_after_starting)
    with __import__("pytest").raises(module.Stop):
        module.run_all(tmp_path, [("d", []), ("e", [])], args, tmp_path, evaluations=(("d", False),))
    assert started == ["d"] and signalled == [("d", module.signal.SIGTERM)]
    started.clear()
    args.deadline = 0  # long past: nothing starts
    with __import__("pytest").raises(module.Stop):
        module.run_all(tmp_path, [("f", [])], args, tmp_path)
    assert started == []


def test_a_scenario_agent_plays_only_when_it_beats_the_blind_script_on_the_same_episodes(tmp_path):
    """bench/agents_scenario_results.py: episodes are paired with the scripts' by reset seed; an agent 10 above the
    blind script on every episode plays, one level with it in mean does not; CAMAL minus vanilla is paired by seed;
    an agent not yet evaluated is listed as not judged."""
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "agents_scenario_results", Path(__file__).parent.parent / "bench" / "agents_scenario_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rng = np.random.default_rng(0)
    blind = list(300 + 50 * rng.standard_normal(40))
    baselines = {"scenario": "health_gathering", "episode_seeds": [100, 139],
                 "policies": {name: {"return": {"mean": float(np.mean(values))}, "returns": values}
                              for name, values in (("random", [v - 100 for v in blind]), ("blind", blind),
                                                   ("aimed", [v + 300 for v in blind]))}}
    (tmp_path / "baselines.json").write_text(json.dumps(baselines))

    def agent(name, returns, iou):
        card = {"scenario": "health_gathering", "steps": 100, "lambda": 0.0,
                "history": [{"explained_variance": 0.6}] * 5}
        episodes = [{"seed": 139 - k, "return": returns[139 - k - 100], "length": 50, "iou": iou,  # any order
                     "iou_reference": {"random": 0.01, "prior": 0.05, "ceiling": 0.4}} for k in range(40)]
        (tmp_path / f"{name}.json").write_text(json.dumps(card))
        (tmp_path / f"{name}-eval.json").write_text(json.dumps({"episodes": episodes}))
        return [name, str(tmp_path / f"{name}.json"), str(tmp_path / f"{name}-eval.json")]

    shuffled = list(rng.permutation(blind))  # the blind script's mean, not its episodes
    module.main(["--scenario", "health_gathering", "--baselines", str(tmp_path / "baselines.json"),
                 "--agent", *agent("camal", [v + 10 for v in blind], 0.3),
                 "--agent", *agent("vanilla", shuffled, 0.01),
                 "--agent", "late", str(tmp_path / "camal.json"), str(tmp_path / "missing.json"),
                 "--out", str(tmp_path / "out")])
    result = json.loads((tmp_path / "out.json").read_text())
    camal, vanilla = result["agents"]["camal"], result["agents"]["vanilla"]
    assert camal["plays"] and abs(camal["minus_blind"]["mean"] - 10) < 1e-6 and camal["minus_blind"]["ci95"][0] > 9.9
    assert not vanilla["plays"] and abs(vanilla["minus_blind"]["mean"]) < 1e-6
    assert abs(camal["iou_minus_prior"]["mean"] - 0.25) < 1e-6 and camal["explained_variance_end"] == 0.6
    difference = result["camal_minus_vanilla"]["return"]
    assert abs(difference["mean"] - 10) < 1e-6 and difference["ci95"][0] < 10 < difference["ci95"][1]
    assert result["agents"]["late"] == {"judged": False, "why": "no evaluation yet (100 steps trained)"}
    assert "| camal | yes |" in (tmp_path / "out.md").read_text()


def test_the_second_pilot_round_is_judged_on_every_seed_and_their_mean(tmp_path):
    """bench/agents_pilot_record.py --seed-run: each seed's held-out mean and its peak / final training return; the
    gate needs every seed >= 12 and the mean >= 15, so a 20 beside an 11 fails and 15.5 beside 14.5 passes."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
    import agents_pilot_record as record

    def run(seed, returns):
        episodes = [{"return": r, "length": 200, "iou": 0.02, "iou_reference": {"random": 0.015, "prior": 0.1}}
                    for r in returns]
        drops = {"spread": 2.0, "frames": 4, "skipped": 0, "monsters": [0.3, 0.2, 0.4, 0.1],
                 "control": [0.0, 0.1, 0.0, 0.0], "episodes": [10, 10, 11, 11]}
        evaluation = {"episodes": episodes, "episode_seeds": [10_000_000, 10_000_001],
                      "counterfactual": {"a": drops}, "fidelity": {"a": {"deletion_drop": [0.5, 0.7]}}}
        history = [{"return_100": value, "explained_variance": 0.7, "steps": 4096 * (k + 1)}
                   for k, value in enumerate([2.0, 9.0, 13.5, 12.0])]
        state = {"steps": 196608, "seconds": 3000.0, "history": history}
        paths = tmp_path / f"eval-{seed}.json", tmp_path / f"ckpt-{seed}.json"
        paths[0].write_text(json.dumps(evaluation))
        paths[1].write_text(json.dumps(state))
        return [str(seed), str(paths[0]), str(paths[1])]

    out = tmp_path / "round.json"
    argv = ["--change", "--lr-schedule linear", "--seed-run", *run(6, [20, 20]), "--seed-run", *run(7, [11, 11])]
    assert record.main(argv + ["--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["mean_over_seeds"] == 15.5 and result["passed"] is False
    assert result["runs"]["6"]["training_return_peak"] == 13.5 and result["runs"]["6"]["training_return_final"] == 12.0
    argv = ["--change", "x", "--seed-run", *run(6, [15, 16]), "--seed-run", *run(7, [14, 15])]
    assert record.main(argv + ["--out", str(out)]) == 0 and json.loads(out.read_text())["passed"] is True


def test_the_clip_rule_takes_the_largest_clip_that_keeps_the_critic_the_return_and_a_moved_map(tmp_path):
    """CAMAL's clip (bench/agents_recipe_gate.md): each candidate is judged on its last 5 updates (explained
    variance, training return) and its last logged IoU; the largest passing clip is chosen, none if none passes;
    the comparison's CAMAL arm then carries the clip, the vanilla arm does not."""
    import argparse
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("agents_comparison",
                                                  Path(__file__).parent.parent / "bench" / "agents_comparison.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def card(ev, ret, iou):
        early = [{"explained_variance": 0.0, "return_100": 0.0, "iou": 0.5}] * 10  # only the end counts
        return {"steps": module.STEPS, "history": early + [{"explained_variance": ev, "return_100": ret}] * 4
                + [{"explained_variance": ev, "return_100": ret, "iou": iou}]}

    assert module.judge_clip(card(0.8, 18.0, 0.2))["passed"]
    for failing in (card(0.4, 18.0, 0.2), card(0.8, 15.5, 0.2), card(0.8, 18.0, 0.05)):
        assert not module.judge_clip(failing)["passed"]

    def sweep(cards):
        trained = []

        def fake_run_all(work, runs, args, logs):
            for name, extra in runs:
                clip = float(extra[extra.index("--camal-max-grad-norm") + 1])
                assert extra[extra.index("--lambda") + 1] == "1.0" and extra[extra.index("--seed") + 1] == "2"
                assert extra[extra.index("--camal-norm-every") + 1] == "8"  # the amendment's cheaper update
                trained.append(clip)
                (work / f"{name}.json").write_text(json.dumps(cards[clip]))

        module.run_all = fake_run_all
        work = tmp_path / str(len(list(tmp_path.iterdir())))
        work.mkdir()
        return module.pick_clip(work, "A", None, tmp_path), trained, json.loads((work / "clip.json").read_text())

    chosen, trained, record = sweep({0.15: card(0.8, 15.0, 0.3), 0.05: card(0.9, 19.0, 0.2)})
    assert chosen == 0.05 and sorted(trained) == [0.05, 0.15] and not record["runs"]["0.15"]["passed"]
    chosen, _, _ = sweep({0.15: card(0.8, 18.0, 0.3), 0.05: card(0.9, 19.0, 0.2)})
    assert chosen == 0.15
    chosen, _, record = sweep({0.15: card(0.2, 18.0, 0.3), 0.05: card(0.9, 19.0, 0.01)})
    assert chosen is None and record["chosen"] is None
    ran = []
    module.run_all = lambda work, runs, args, logs, evaluations=(): ran.extend(runs)
    module.evaluate = lambda *a, **k: None
    __import__("numpy").save(tmp_path / module.PRIOR, __import__("numpy").zeros((100, 156), "float16"))
    args = argparse.Namespace(arms=["vanilla", "camal"], seeds=[101], results=str(tmp_path), deadline=None,
                              camal_clip=0.15)
    module.compare(tmp_path, "A", 1.0, args, tmp_path)
    extras = dict(ran)
    assert extras["camal-s101"][extras["camal-s101"].index("--camal-max-grad-norm") + 1] == "0.15"
    assert "--camal-max-grad-norm" not in extras["vanilla-s101"]
    assert extras["camal-s101"][extras["camal-s101"].index("--camal-norm-every") + 1] == "8"
    assert "--camal-norm-every" not in extras["vanilla-s101"]
    ran.clear()  # the fallback (no clip passed: lambda 3 at the default clip) takes the same cheaper update
    module.compare(tmp_path, "A", 3.0, argparse.Namespace(**{**vars(args), "camal_clip": None}), tmp_path)
    extras = dict(ran)
    assert extras["camal-s101"][extras["camal-s101"].index("--lambda") + 1] == "3.0"
    assert "--camal-norm-every" in extras["camal-s101"] and "--camal-max-grad-norm" not in extras["camal-s101"]
