"""The job panel's progress line for every job kind (issue 36 item 9): step x of N, the epoch, elapsed, an ETA from
the recent step rate ("estimating…" before two timed points), the latest loss and IoU; no ETA once finished. Fake
runners with timed history rows, one real job of the test kinds, and CAMAL's rows reaching the live figure."""
import re
import time

import pytest

from saliency_lab import figures, job_panel


class FakeRunner:
    def __init__(self, job, history):
        self.job, self.rows = job, history

    def get(self, job_id):
        return dict(self.job, id=job_id)

    def history(self, job_id):
        return list(self.rows)


def fake_services(job, history, tmp_path):
    runner = FakeRunner(job, history)
    return type("S", (), {"runner": lambda self: runner, "weights_dir": tmp_path})()


def camal_rows(t0, steps, seconds_per_step=2.0):
    """A CAMAL job's rows: the 'evaluated before' point at step 0, then logged steps (10 steps an epoch)."""
    rows = [{"t": t0, "step": 0, "phase": "evaluated before", "before_iou": 0.4, "before_accuracy": 0.8}]
    for step in steps:
        rows.append({"t": t0 + seconds_per_step * step, "step": step, "epoch": 1 + (step - 1) // 10,
                     "loss": 1.0 / step, "ce": 0.5, "reg": -0.1, "alpha": 0.3, "beta": 0.1, "lr": 1e-4,
                     "iou": round(0.5 + step / 100, 3)})
    return rows


def eta_of(text):
    """(seconds left, 'HH:MM') from '... about N s|min left (ETA HH:MM)'."""
    found = re.search(r"about (\d+) (s|min) left \(ETA (\d\d:\d\d)\)", text)
    assert found, text
    return int(found.group(1)) * (60 if found.group(2) == "min" else 1), found.group(3)


def test_a_running_camal_job_says_step_epoch_eta_loss_and_iou(tmp_path):
    now = time.time()
    t0 = now - 50.0
    history = camal_rows(t0, [1, 11, 21])  # 2 s a step: step 21 at t0 + 42
    job = {"kind": "camal", "status": "running", "progress": {"step": 21, "total": 30}, "started": t0 - 10,
           "finished": None, "params": {"epochs": 3}, "error": None}
    text = job_panel.progress_text(job, history, now=now)
    assert text.startswith("step 21/30 (70%) · epoch 3/3 · 2.00 s/step · about ")
    left, clock = eta_of(text)
    # 9 steps left at 2 s a step from the last row (at now - 8 s): 10 s from now
    assert left == 10 and clock == time.strftime("%H:%M", time.localtime(now + 10))
    assert "elapsed 1 min 00 s" in text
    assert "loss 0.04762" in text and "IoU 0.71 (before 0.4)" in text
    assert "cross-entropy 0.5" in text and "lr" not in text  # readable names; bookkeeping left out

    # the whole report, through the CAMAL kind's describer (nothing of its own while it runs)
    report = job_panel.job_report(fake_services(job, history, tmp_path), "j1")
    assert report.text.startswith("Job **j1**: running · step 21/30 (70%) · epoch 3/3 · 2.00 s/step · about ")
    assert not report.finished and report.percent == pytest.approx(70.0)
    later_left, _ = eta_of(report.text)
    assert 9 <= later_left <= 10 and "loss 0.04762" in report.text and "IoU 0.71" in report.text
    names = [trace["name"] for trace in report.figure.to_dict()["data"]]
    assert "loss (total)" in names and "IoU (training batch)" in names


def test_the_rate_is_the_recent_one_of_this_run():
    now = 10_000.0
    old = camal_rows(now - 1000, [1, 11, 21, 31], seconds_per_step=10.0)  # the interrupted run: slow
    resumed = camal_rows(now - 70, [21, 31])  # resumed from epoch 2: the steps go back; 2 s a step since
    job = {"status": "running", "progress": {"step": 31, "total": 41}, "started": now - 75, "params": {}}
    text = job_panel.progress_text(job, old + resumed, now=now)
    assert "· 2.00 s/step · about 12 s left" in text  # this run only: 10 steps at 2 s, the last row 8 s ago
    assert "epoch 4 ·" in text and "IoU 0.81" in text
    # a slow start then fast steps: the rate of the last RATE_WINDOW rows
    times, t = [], 0.0
    for step in range(1, 31):
        t += 10.0 if step <= 10 else 1.0
        times.append({"t": t, "step": step, "loss": 1.0})
    job = {"status": "running", "progress": {"step": 30, "total": 40}, "started": 0.0}
    assert "· 1.00 s/step · about 10 s left" in job_panel.progress_text(job, times, now=t)


def test_before_two_timed_points_it_says_estimating(tmp_path):
    now = 5000.0
    job = {"kind": "camal", "status": "running", "progress": {"step": 0, "total": 30}, "started": now - 20,
           "params": {"epochs": 3}}
    text = job_panel.progress_text(job, camal_rows(now - 5, []), now=now)
    assert text.startswith("step 0/30 (0%) · ETA estimating…") and "left" not in text and "s/step" not in text
    assert "elapsed 20 s" in text
    # no row at all yet, only the job's step: still one timed point
    fresh = dict(job, progress={"step": 3, "total": 30})
    assert "estimating…" in job_panel.progress_text(fresh, [], now=now)
    # the job's step moving past the last row makes the second point
    second = job_panel.progress_text(dict(job, progress={"step": 5, "total": 30}), camal_rows(now - 10, []), now=now)
    assert "2.00 s/step" in second and eta_of(second)[0] == 50
    starting = dict(job, progress={"step": None, "total": None})
    assert job_panel.progress_text(starting, [], now=now).startswith("starting…")
    queued = dict(job, status="queued", progress={"step": None, "total": None}, started=None)
    assert job_panel.progress_text(queued, [], now=now) == ""
    report = job_panel.job_report(fake_services(fresh, [], tmp_path), "j2")
    assert "estimating…" in report.text and "ETA (" not in report.text


def test_a_finished_job_shows_no_eta(tmp_path):
    now = time.time()
    history = camal_rows(now - 100, [1, 11, 21, 30])
    job = {"kind": "sleep-steps", "status": "done", "progress": {"step": 30, "total": 30}, "started": now - 110,
           "finished": now - 30, "params": {"epochs": 3}, "result": {}}
    report = job_panel.job_report(fake_services(job, history, tmp_path), "j3")
    assert report.finished and report.text.startswith("Job **j3**: done · step 30/30 · epoch 3/3 · ran 1 min 20 s")
    assert "loss 0.03333" in report.text and "IoU 0.8" in report.text
    for word in ("ETA", "left", "estimating", "elapsed", "s/step"):
        assert word not in report.text
    failed = dict(job, status="failed", error="ValueError: boom", progress={"step": 21, "total": 30})
    text = job_panel.job_report(fake_services(failed, history[:3], tmp_path), "j4").text
    assert text.startswith("Job **j4**: failed · step 21/30") and text.endswith("— ValueError: boom")
    assert "ETA" not in text


def test_an_agent_budget_run_has_an_eta_from_its_budget():
    """No step total (a time budget): the ETA is the budget's end, from the rows' budget_fraction."""
    now = 2000.0
    rows = [{"t": 1100.0, "step": 2048, "return": 3.0, "iou": 0.2, "budget_fraction": 0.25},
            {"t": 1200.0, "step": 4096, "return": 4.0, "return_100": 3.5, "budget_fraction": 0.5}]
    job = {"status": "running", "progress": {"step": 4096, "total": None}, "started": 1000.0}
    text = job_panel.progress_text(job, rows, now=1210.0)
    assert text.startswith("step 4096 · 20.5 steps/s · about 3 min left")  # 200 s of 400 spent, 10 s ago
    assert "IoU 0.2" in text and "mean return (last 100) 3.5" in text and "budget" not in text
    spent = dict(rows[-1], t=1400.0, budget_fraction=1.0)
    assert "the time budget is spent · finishing…" in job_panel.progress_text(job, rows + [spent], now=now)


def test_aha_keeps_its_line_through_the_shared_eta():
    from saliency_lab import aha_train

    history = [{"t": 100.0, "step": 0, "phase": "start", "elapsed_s": 0},
               {"t": 200.0, "step": 10, "phase": "start", "elapsed_s": 50}]
    assert aha_train.eta_text(20, 110, history, 220.0) == job_panel.eta_text(
        20, 110, history, 220.0, finishing=aha_train.FINISHING)
    job = {"status": "running", "progress": {"step": 20, "total": 110}, "started": 195.0,
           "params": {"minutes": 2}}
    text = job_panel.progress_text(job, history + [{"t": 215.0, "step": 18, "loss": 0.25}], now=220.0,
                                   minutes=2, finishing=aha_train.FINISHING)
    assert text.startswith("step 20/110 (18%) · 2.00 s/step · about 50 s left (ETA ") and "loss 0.25" in text


def test_a_real_job_reports_its_rate_and_loss(tmp_path):
    from saliency_lab.jobs import JobRunner

    runner = JobRunner(tmp_path / "jobs", poll_s=0.05)
    services = type("S", (), {"runner": lambda self: runner, "weights_dir": tmp_path})()
    try:
        job_id = runner.submit("sleep-steps", {"steps": 300, "dt": 0.12})
        deadline = time.monotonic() + 60
        while len(runner.history(job_id)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        text = job_panel.job_report(services, job_id).text
        found = re.match(rf"Job \*\*{job_id}\*\*: running · step (\d+)/300 \(\d+%\) · ([\d.]+) s/step · ", text)
        assert found and " left (ETA " in text and "elapsed " in text and "loss " in text, text
        step, per_step = int(found.group(1)), float(found.group(2))
        assert 0.1 <= per_step < 2 and abs(eta_of(text)[0] - per_step * (300 - step)) <= 60, text  # from the rate
        runner.cancel(job_id)
        job = runner.wait(job_id, timeout=60)
        text = job_panel.job_report(services, job_id).text
        assert job["status"] == "cancelled" and "ETA" not in text and "ran " in text and "loss " in text
    finally:
        runner.shutdown()


def test_camal_rows_carry_loss_and_iou_to_the_figure(tmp_path):
    import timm
    import torch

    from explainers import camal as C
    from explainers import models
    from explainers.masks import load_mask_set

    from conftest import make_mask_set

    data = load_mask_set(make_mask_set(tmp_path / "d", count=8))
    torch.manual_seed(0)
    bundle = models.bundle_from_timm("t", timm.create_model(
        "resnet18", pretrained=False, layers=[1, 1, 1, 1], channels=[8, 8, 16, 16], output_stride=8, num_classes=3),
        input_size=(32, 32))
    rows, steps = [], []

    def progress(step, total, **metrics):
        steps.append(step)
        if metrics:
            rows.append({"t": time.time(), "step": step, **metrics})

    C.finetune(bundle, data, epochs=2, lam=1.0, batch_size=4, progress=progress, log_every=1)
    assert steps == [1, 2, 3, 4] and [row["epoch"] for row in rows] == [1, 1, 2, 2]
    assert all(0.0 <= row["iou"] <= 1.0 and row["loss"] > 0 for row in rows)
    names = [trace["name"] for trace in figures.job_figure(rows).to_dict()["data"]]
    assert names[0] == "loss (total)" and "IoU (training batch)" in names
    job = {"status": "running", "progress": {"step": 4, "total": 4}, "started": rows[0]["t"], "params": {"epochs": 2}}
    text = job_panel.progress_text(job, rows, now=rows[-1]["t"])
    assert f"IoU {rows[-1]['iou']:.4g}" in text and f"loss {rows[-1]['loss']:.4g}" in text and "epoch 2/2" in text
    plain = []
    C.finetune(bundle, data, epochs=1, lam=0.0, batch_size=4,
               progress=lambda step, total, **m: plain.append(m) if m else None, log_every=1)
    assert plain and not any("iou" in m for m in plain)  # no CAM without the mask term: no IoU


def test_the_jobs_table_names_each_jobs_kind_model_and_progress():
    """Every kind of job gets its kind, its model (an agent job: the agent it makes) and its progress (a step
    without a known total as such)."""
    from saliency_lab import job_panel

    agent = {"kind": "agent-train", "status": "running", "progress": {"step": 4096, "total": None},
             "params": {"name": "camal-1", "scenario": "defend_the_center"}}
    finetune = {"kind": "finetune", "status": "done", "progress": {"step": 30, "total": 30},
                "params": {"model": "weights/bloodmnist-cnn.json"}}
    assert job_panel.JOB_HEADERS[:5] == ["job", "kind", "state", "progress", "model"]
    assert job_panel.job_model(agent) == "camal-1 (defend_the_center)" and job_panel.progress_cell(agent) == "step 4096"
    assert job_panel.job_model(finetune) == "bloodmnist-cnn" and job_panel.progress_cell(finetune) == "30/30"
    assert job_panel.progress_cell({"status": "done", "progress": {}}) == "done"


def test_a_one_step_fine_tune_figure_has_an_x_range_and_no_shape_on_an_empty_axis():
    """A one-step run: plotly's autorange of one step, and a reference line drawn as a shape on an axis no trace
    used, gave NaN paths in the browser. The reference IoU is a trace on the right axis; one step has its range."""
    figure = figures.job_figure([{"t": 0, "step": 1, "loss": 0.7, "before_iou": 0.2}]).to_dict()
    layout = figure["layout"]
    assert layout["xaxis"]["range"] == [0, 2] and not layout.get("shapes")
    before = [trace for trace in figure["data"] if trace["name"].startswith("IoU before")]
    assert before and before[0]["yaxis"] == "y2" and before[0]["y"] == [0.2, 0.2]
