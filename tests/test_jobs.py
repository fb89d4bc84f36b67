"""Background job runner: real job processes (tiny), SQLite records, restart recovery, HF Jobs with fakes."""
import gc
import os
import signal
import time

import pytest

from explainers.atomic import atomic_torch_save, atomic_write_bytes
from saliency_lab import hf_jobs, jobs
from saliency_lab.jobs import JobRunner
from saliency_lab.hf_jobs import cli_command as hf_job_command
from conftest import FakeHub, wait_until


class Runners:
    """Makes JobRunners on one root; shuts down (kills the jobs of) those still held at the end."""

    def __init__(self, root):
        self.root, self.made = root, []

    def __call__(self, **kwargs):
        kwargs.setdefault("poll_s", 0.05)
        self.made.append(JobRunner(self.root, **kwargs))
        return self.made[-1]


@pytest.fixture
def runners(tmp_path):
    made = Runners(tmp_path / "jobs")
    yield made
    for runner in made.made:
        runner.shutdown()



def pid_gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return not jobs._pid_runs_job(pid, "")  # zombie of a dropped runner: no cmdline any more


def test_job_runs_to_done_with_progress_and_history(runners, tmp_path):
    runner = runners()
    job_id = runner.submit("sleep-steps", {"steps": 4, "dt": 0.01})
    assert runner.get(job_id)["status"] in ("queued", "running")
    job = runner.wait(job_id, timeout=30)
    assert job["status"] == "done", job
    assert job["result"] == {"steps": 4, "final_loss": 0.25}
    assert job["progress"] == {"step": 4, "total": 4}
    assert job["device"] in ("cpu", "cuda") and job["pid"] and job["backend"] == "local"
    assert job["started"] >= job["created"] and job["finished"] >= job["started"]
    history = runner.history(job_id)
    assert [point["step"] for point in history] == [1, 2, 3, 4]
    assert [point["loss"] for point in history] == [1.0, 0.5, 1 / 3, 0.25]
    assert (tmp_path / "jobs" / "jobs.sqlite").exists() and os.path.isdir(job["work_dir"])
    assert runner.list(10)[0]["id"] == job_id


def test_failing_job_is_failed_with_message_and_traceback_in_log(runners):
    runner = runners()
    job = runner.wait(runner.submit("sleep-steps", {"steps": 5, "dt": 0.01, "fail_at": 2}), timeout=30)
    assert job["status"] == "failed"
    assert job["error"] == "ValueError: failing at step 2 as asked"
    assert job["progress"]["step"] == 1
    log = open(job["log"]).read()
    assert "Traceback" in log and "failing at step 2" in log


def test_cancel_stops_running_job(runners):
    runner = runners()
    job_id = runner.submit("sleep-steps", {"steps": 500, "dt": 0.02})
    wait_until(lambda: (runner.get(job_id)["progress"]["step"] or 0) >= 1)
    runner.cancel(job_id)
    job = runner.wait(job_id, timeout=20)
    assert job["status"] == "cancelled" and job["result"]["stopped_at"] < 500
    assert pid_gone(job["pid"])


def test_cancel_kills_job_that_ignores_it_after_grace(runners):
    runner = runners(cancel_grace_s=0.3)
    job_id = runner.submit("sleep-steps", {"steps": 500, "dt": 0.02, "ignore_cancel": True})
    wait_until(lambda: runner.get(job_id)["pid"] and runner.get(job_id)["progress"]["step"])
    runner.cancel(job_id)
    job = runner.wait(job_id, timeout=20)
    assert job["status"] == "cancelled" and "did not stop" in job["error"]
    assert wait_until(lambda: pid_gone(job["pid"]), timeout=5)


def _children_of(runner, job_id):
    path = os.path.join(runner.get(job_id)["work_dir"], "children.txt")
    text = wait_until(lambda: os.path.exists(path) and open(path).read())
    return [int(pid) for pid in text.split()]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = open(f"/proc/{pid}/status").read() if os.path.exists(f"/proc/{pid}/status") else ""
    return "\nState:\tZ" not in status  # a zombie is dead, waiting for init to reap it


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups are POSIX")
@pytest.mark.parametrize("how", ["cancel-ignored", "cancel-left-children", "job-killed"])
def test_no_child_outlives_a_cancelled_or_killed_job(runners, how):
    """Children that ignore SIGTERM (as ViZDoom's do) end with their job: after a cancel the job ignores, after a
    cancel the job obeys but leaves its children running, and after the job process is killed."""
    runner = runners(cancel_grace_s=0.3)
    params = {"children": 3, "ignore_cancel": how == "cancel-ignored", "leave_children": True}
    job_id = runner.submit("spawn-children", params)
    children = _children_of(runner, job_id)
    assert all(_alive(pid) for pid in children)
    if how == "job-killed":
        os.kill(runner.get(job_id)["pid"], signal.SIGKILL)
    else:
        runner.cancel(job_id)
    job = runner.wait(job_id, timeout=20)
    assert job["status"] == ("failed" if how == "job-killed" else "cancelled")
    assert wait_until(lambda: not any(_alive(pid) for pid in children), timeout=10), "a child outlived its job"


def test_cancel_queued_job(runners):
    runner = runners()
    first = runner.submit("sleep-steps", {"steps": 500, "dt": 0.02})
    second = runner.submit("sleep-steps", {"steps": 1})
    assert runner.cancel(second)["status"] == "cancelled"
    runner.cancel(first)
    assert runner.wait(first, timeout=20)["status"] == "cancelled"


def test_job_process_killed_while_runner_alive_is_failed(runners):
    runner = runners()
    job_id = runner.submit("sleep-steps", {"steps": 500, "dt": 0.02})
    pid = wait_until(lambda: runner.get(job_id)["progress"]["step"] and runner.get(job_id)["pid"])
    os.kill(pid, signal.SIGKILL)
    job = runner.wait(job_id, timeout=20)
    assert job["status"] == "failed" and "exited with code -9 without reporting a result" in job["error"]


def test_timeout_kills_and_fails(runners):
    runner = runners(default_timeout_s=0.5)
    job = runner.wait(runner.submit("sleep-steps", {"steps": 500, "dt": 0.02, "ignore_cancel": True}), timeout=20)
    assert job["status"] == "failed" and job["error"] == "timed out after 0.5 s"
    assert wait_until(lambda: pid_gone(job["pid"]), timeout=5)


def test_max_concurrent_one_queues_second_job(runners):
    runner = runners(max_concurrent=1)
    first = runner.submit("sleep-steps", {"steps": 10, "dt": 0.03})
    second = runner.submit("sleep-steps", {"steps": 2, "dt": 0.01})
    wait_until(lambda: runner.get(first)["status"] == "running")
    for _ in range(5):
        if runner.get(first)["status"] == "running":
            assert runner.get(second)["status"] == "queued"
        time.sleep(0.05)
    a, b = runner.wait(first, timeout=30), runner.wait(second, timeout=30)
    assert a["status"] == b["status"] == "done"
    assert b["started"] >= a["finished"]


def _start_then_crash(runners, kind, params, min_step):
    """Start a job, then 'crash the app': drop the runner (no cleanup) and SIGKILL its job process."""
    runner = runners()
    job_id = runner.submit(kind, params)
    wait_until(lambda: (runner.get(job_id)["progress"]["step"] or 0) >= min_step, timeout=30)
    pid, thread = runner.get(job_id)["pid"], runner._thread
    os.kill(pid, signal.SIGSTOP)  # freeze it mid-way at once: on a loaded machine it could otherwise finish first
    runners.made.remove(runner)
    runner = None  # the app's runner is gone (no cleanup)
    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive()
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: pid_gone(pid), timeout=5)
    return job_id


def test_restart_marks_dead_running_job_interrupted(runners):
    job_id = _start_then_crash(runners, "sleep-steps", {"steps": 5000, "dt": 0.02}, 1)
    runner = runners()
    job = runner.get(job_id)
    assert job["status"] == "interrupted" and "pid" in job["error"] and "gone" in job["error"]
    assert job["finished"] is not None


def test_restart_starts_queued_jobs(runners, tmp_path):
    runner = runners(max_concurrent=1)
    runner.shutdown()  # scheduler stopped: the job stays queued
    job_id = runner.submit("sleep-steps", {"steps": 1, "dt": 0.01})
    assert runner.get(job_id)["status"] == "queued"
    assert runners().wait(job_id, timeout=30)["status"] == "done"


def test_tiny_train_resumes_from_checkpoint_after_interruption(runners):
    params = {"steps": 300, "checkpoint_every": 5, "step_sleep": 0.02}  # long enough to crash mid-way under load
    job_id = _start_then_crash(runners, "tiny-train", params, 8)
    runner = runners()
    assert runner.get(job_id)["status"] == "interrupted"
    runner.resume(job_id)
    job = runner.wait(job_id, timeout=60)
    assert job["status"] == "done", job
    assert 5 <= job["result"]["resumed_from"] < 300 and job["result"]["resumed_from"] % 5 == 0
    history = runner.history(job_id)
    assert history[-1]["step"] == 300 and history[0]["loss"] > job["result"]["final_loss"]
    assert "resuming from step" in open(job["log"]).read()
    assert [p.name for p in os.scandir(job["work_dir"]) if p.name.endswith(".tmp")] == []


def test_atomic_writes_leave_no_temp_files(tmp_path):
    import torch
    target = tmp_path / "ckpt" / "model.pt"
    atomic_write_bytes(target, b"old")
    atomic_torch_save({"w": torch.ones(3)}, target)
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.ones(3))
    with pytest.raises(TypeError):
        atomic_write_bytes(target, "not bytes")
    assert sorted(p.name for p in target.parent.iterdir()) == ["model.pt"]


def test_unknown_kind_and_backend_are_clear_errors(runners):
    runner = runners()
    with pytest.raises(KeyError, match="unknown job kind 'nope'"):
        runner.submit("nope", {})
    with pytest.raises(ValueError, match="unknown backend"):
        runner.submit("sleep-steps", {}, backend="slurm")


# ----------------------------------------------------------------------------------------- HF Jobs
def test_hf_job_command_for_camal():
    command = hf_job_command("camal", {"model": "vit-tiny", "data": "data/pets", "epochs": 3, "lambda": 0.5,
                                       "out": "weights/camal.pt"})
    assert command == ["python", "-m", "explainers", "camal", "--model", "vit-tiny", "--data", "data/pets",
                       "--epochs", "3", "--lambda", "0.5", "--out", "weights/camal.pt"]
    assert hf_job_command("camal", {"model": "m", "data": "d"}) == ["python", "-m", "explainers", "camal",
                                                                    "--model", "m", "--data", "d"]
    with pytest.raises(ValueError, match="missing params \\['data'\\]"):
        hf_job_command("camal", {"model": "m"})
    with pytest.raises(ValueError, match="unsupported params \\['bogus'\\]"):
        hf_job_command("camal", {"model": "m", "data": "d", "bogus": 1})
    with pytest.raises(ValueError, match="cannot run on HF Jobs"):
        hf_job_command("tiny-train", {})


def test_hf_jobs_without_token_is_a_clear_error(runners, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    runner = runners()
    with pytest.raises(RuntimeError, match="HF_TOKEN"):
        runner.submit("camal", {"model": "m", "data": "d"}, backend="hf-jobs")
    assert runner.list() == []


def test_hf_jobs_submit_refresh_cancel_with_fakes(runners, monkeypatch, tmp_path):
    hub = FakeHub(monkeypatch, tmp_path / "hub")
    monkeypatch.setenv("SPACE_ID", "alice/saliency-lab")
    runner = runners(hf_token="hf_secret", hf_image="img:1", hf_flavor="a10g-small", hf_poll_s=None,
                     results_dir=tmp_path / "weights")
    params = {"model": "m", "data": "d", "epochs": 2}
    ids = [runner.submit("camal", params, timeout_s=3600, backend="hf-jobs") for _ in range(4)]
    kind, kwargs = hub.calls[0]
    assert kwargs["image"] == "img:1" and kwargs["flavor"] == "a10g-small" and kwargs["timeout"] == 3600
    assert kwargs["secrets"] == {"HF_TOKEN": "hf_secret"}
    assert kwargs["command"][:2] == ["bash", "-c"] and kwargs["command"][2].endswith(
        "python -m explainers camal --model m --data d --epochs 2")
    assert [(v.type, v.source, v.mount_path) for v in kwargs["volumes"]] == [("space", "alice/saliency-lab", "/code")]
    job = runner.get(ids[0])
    assert job["backend"] == "hf-jobs" and job["external_id"] == "hf-1" and job["status"] == "running"

    from huggingface_hub import JobStage
    hub.stages.update({"hf-1": (JobStage.COMPLETED, None), "hf-2": ("ERROR", "CUDA out of memory"),
                       "hf-3": ("CANCELED", None)})
    runner.refresh()
    assert [runner.get(i)["status"] for i in ids] == ["done", "failed", "cancelled", "running"]
    assert "CUDA out of memory" in runner.get(ids[1])["error"]
    assert runner.cancel(ids[3])["status"] == "cancelled"
    assert hub.calls[-1] == ("cancel", "hf-4")


def test_hf_jobs_upload_the_mask_set_and_bring_the_model_back(runners, monkeypatch, tmp_path):
    """The remote job cannot see local paths: the mask set goes up to a private dataset repo mounted in the
    container, the model comes back from the model repo the job pushed to, into the local weights folder."""
    hub = FakeHub(monkeypatch, tmp_path / "hub")
    monkeypatch.setenv("SPACE_ID", "alice/saliency-lab")
    masks = tmp_path / "my masks"
    masks.mkdir()
    (masks / "masks.csv").write_text("file,mask,class_index\na.png,a.mask.png,1\n")
    weights = tmp_path / "weights"
    weights.mkdir()
    runner = runners(hf_token="hf_secret", hf_poll_s=None, results_dir=weights)
    job_id = runner.submit("camal", {"model": "bloodmnist-cnn", "data": str(masks), "epochs": 1,
                                     "out": "weights/cnn-camal-1"}, backend="hf-jobs")
    staged = f"alice/saliency-lab-job-{job_id}"
    assert ("create", staged, "dataset", True) in hub.calls and ("create", "alice/cnn-camal-1", "model", True) in hub.calls
    assert ("upload", staged, "dataset", "data", str(masks)) in hub.calls
    assert (tmp_path / "hub" / staged / "data" / "masks.csv").exists()
    kwargs = next(c[1] for c in hub.calls if c[0] == "run")
    script = kwargs["command"][2]
    assert "--data /inputs/data" in script and "--out /tmp/out/cnn-camal-1 --push-to alice/cnn-camal-1" in script
    assert str(masks) not in script  # no local path reaches the container
    assert ("dataset", staged, "/inputs") in [(v.type, v.source, v.mount_path) for v in kwargs["volumes"]]

    # what the job's `--push-to` does at its end, then the runner notices the job finished
    out = tmp_path / "remote-out"
    out.mkdir()
    (out / "cnn-camal-1.json").write_text('{"kind": "classifier", "weights_file": "cnn-camal-1.safetensors"}')
    (out / "cnn-camal-1.safetensors").write_bytes(b"weights")
    (out / "cnn-camal-1.camal.ckpt").write_bytes(b"not shipped")
    (out / "cnn-camal-1.summary.json").write_text('{"before": {"val": {"iou": 0.2}}, "after": {"val": {"iou": 0.6}}, '
                                                  '"weights": "/tmp/out/cnn-camal-1.safetensors"}')
    (out / "other-model.json").write_text("{}")
    hf_jobs.push_result(out / "cnn-camal-1", "alice/cnn-camal-1", token="hf_secret")
    pushed = sorted(p.name for p in (tmp_path / "hub" / "alice" / "cnn-camal-1").iterdir())
    assert pushed == ["cnn-camal-1.json", "cnn-camal-1.safetensors", "cnn-camal-1.summary.json"]
    hub.stages["hf-1"] = ("COMPLETED", None)
    runner.refresh()
    job = runner.get(job_id)
    assert job["status"] == "done", job
    assert (weights / "cnn-camal-1.json").exists() and (weights / "cnn-camal-1.safetensors").read_bytes() == b"weights"
    assert job["result"]["card"] == str(weights / "cnn-camal-1.json")
    assert job["result"]["weights"] == str(weights / "cnn-camal-1.safetensors")
    assert job["result"]["after"]["val"]["iou"] == 0.6


def test_hf_jobs_need_the_code_on_the_hub(runners, monkeypatch, tmp_path):
    FakeHub(monkeypatch, tmp_path / "hub")
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("SALIENCY_LAB_CODE_REPO", raising=False)
    runner = runners(hf_token="hf_secret", hf_poll_s=None)
    with pytest.raises(hf_jobs.HFJobsError, match="SALIENCY_LAB_CODE_REPO"):
        runner.submit("camal", {"model": "m", "data": "d"}, backend="hf-jobs")
    assert runner.list() == []
    monkeypatch.setenv("SALIENCY_LAB_CODE_REPO", "model:alice/saliency-code")
    assert hf_jobs.code_repo() == ("alice/saliency-code", "model")
