"""Background jobs: long work (fine-tunes, AHA explainers) in a separate process, tracked in SQLite.

    runner = JobRunner("runs/jobs")                    # one per app; a background thread starts queued jobs
    job_id = runner.submit("camal", {"model": "bloodmnist-cnn", "data": "masks/train"}, timeout_s=3600)
    runner.get(job_id)["status"], runner.history(job_id)   # live status and metric points (loss curve)

A job kind is a function `fn(params: dict, context: JobContext) -> dict`, registered with
`@register_job_kind("name")` in an importable module. Each job runs in its own process
(`python -m saliency_lab.jobs run <job_id> --root <root> --module <module>`), which writes progress,
metrics and its result into `<root>/jobs.sqlite` (WAL) and its output and traceback into
`<root>/<job_id>/job.log`. A new JobRunner on the same root keeps jobs whose process is still
alive, marks the others 'interrupted' (`resume(job_id)` queues them again, in the same work dir)
and starts the queued ones. `backend="hf-jobs"` runs the job's CLI command on Hugging Face Jobs.
"""
from __future__ import annotations

import functools
import importlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
import uuid
import weakref
from pathlib import Path
from typing import Callable

from . import hf_jobs

TERMINAL = ("done", "failed", "cancelled", "interrupted")
_REGISTRY: dict[str, Callable] = {}


def register_job_kind(name: str):
    """Decorator: `@register_job_kind("camal")` makes `fn(params, context) -> dict` submittable."""
    def decorate(fn):
        _REGISTRY[name] = fn
        return fn
    return decorate


class JobCancelled(Exception):
    """A job function may raise this (or simply return) once `context.cancelled()` is true."""


# ----------------------------------------------------------------------------------------- storage
SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY, kind TEXT NOT NULL, module TEXT, params TEXT NOT NULL, status TEXT NOT NULL,
  backend TEXT NOT NULL DEFAULT 'local', external_id TEXT, created REAL NOT NULL, started REAL,
  finished REAL, pid INTEGER, device TEXT, step INTEGER, total INTEGER, metrics TEXT, result TEXT,
  error TEXT, timeout_s REAL, cancel_requested REAL, work_dir TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS metrics (job_id TEXT NOT NULL, t REAL NOT NULL, step INTEGER, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS metrics_job ON metrics (job_id);
"""


def _connect(db_path) -> sqlite3.Connection:
    con = sqlite3.connect(str(db_path), timeout=30, isolation_level=None, check_same_thread=False)
    con.row_factory = sqlite3.Row
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA busy_timeout=30000")
    con.execute("PRAGMA synchronous=NORMAL")  # safe with WAL; no fsync per progress point
    return con


def _finish(con, job_id, status, *, error=None, result=None, only_if=("running",)) -> bool:
    """Move a job to a terminal status unless something else already did (atomic compare-and-set)."""
    marks = ",".join("?" * len(only_if))
    cur = con.execute(f"UPDATE jobs SET status=?, finished=?, error=COALESCE(?, error), "
                      f"result=COALESCE(?, result) WHERE id=? AND status IN ({marks})",
                      (status, time.time(), error, None if result is None else json.dumps(result, default=str),
                       job_id, *only_if))
    return cur.rowcount == 1


def _row_to_dict(row) -> dict:
    job = dict(row)
    for key in ("params", "metrics", "result"):
        job[key] = json.loads(job[key]) if job[key] else None
    job["progress"] = {"step": job.pop("step"), "total": job.pop("total")}
    job["cancel_requested"] = bool(job["cancel_requested"])
    job["log"] = str(Path(job["work_dir"]) / "job.log")
    return job


# ----------------------------------------------------------------------------------------- in the job
class JobContext:
    """What a running job function sees: progress reporting, cancellation, device and its folder."""

    def __init__(self, db_path, job_id: str, device: str, work_dir):
        self.job_id, self.device, self.work_dir = job_id, device, Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._con = _connect(db_path)

    def progress(self, step: int, total: int | None = None, **metrics) -> None:
        """Record progress; numeric metrics (loss=..., iou=...) also become a history point."""
        metrics = {k: (float(v) if hasattr(v, "__float__") else v) for k, v in metrics.items()}
        self._con.execute("UPDATE jobs SET step=?, total=COALESCE(?, total), metrics=COALESCE(?, metrics) WHERE id=?",
                          (step, total, json.dumps(metrics) if metrics else None, self.job_id))
        if metrics:
            self._con.execute("INSERT INTO metrics (job_id, t, step, data) VALUES (?, ?, ?, ?)",
                              (self.job_id, time.time(), step, json.dumps(metrics)))

    def cancelled(self) -> bool:
        row = self._con.execute("SELECT cancel_requested, status FROM jobs WHERE id=?", (self.job_id,)).fetchone()
        return row is None or bool(row["cancel_requested"]) or row["status"] != "running"

    def checkpoint_path(self, name: str = "checkpoint.pt") -> Path:
        return self.work_dir / name


def _child_main(root: str, job_id: str, module: str = __name__) -> int:
    """Body of the job process: run the registered function and store its outcome."""
    con = _connect(Path(root) / "jobs.sqlite")
    job = con.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
    if job is None or job["status"] != "running":
        return 0
    context = JobContext(Path(root) / "jobs.sqlite", job_id, job["device"] or "cpu", job["work_dir"])
    print(f"[job {job_id}] kind={job['kind']} device={context.device} pid={os.getpid()}", flush=True)
    try:
        importlib.import_module(module)  # registers the kind
        fn = _REGISTRY[job["kind"]]
        result = fn(json.loads(job["params"]), context)
        status = "cancelled" if context.cancelled() else "done"
        _finish(con, job_id, status, result=result if result is not None else {})
    except JobCancelled:
        _finish(con, job_id, "cancelled")
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the record
        traceback.print_exc()
        _finish(con, job_id, "failed", error=f"{type(exc).__name__}: {exc}")
        return 1
    return 0


# ----------------------------------------------------------------------------------------- processes
def _pid_runs_job(pid, job_id) -> bool:
    """True if `pid` is alive and is the process of this job (guards against reused pids)."""
    if not pid:
        return False
    if Path("/proc/self/cmdline").exists():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return b"saliency_lab.jobs" in cmdline and job_id.encode() in cmdline  # empty for zombies
    try:  # no /proc (macOS, Windows): fall back to "the pid exists"
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def _kill(pid, proc=None) -> None:
    """Kill the job process and everything in its process group (ViZDoom and any other children, which may
    ignore SIGTERM): the job was started as the leader of its own session, so the group's id is its pid."""
    try:
        if proc is not None:
            proc.kill()
            proc.wait(timeout=10)
        else:
            os.kill(pid, signal.SIGKILL if hasattr(signal, "SIGKILL") else signal.SIGTERM)
    except (OSError, subprocess.TimeoutExpired):
        pass
    _kill_group(pid)


def _pid_exists(pid) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _kill_group(pgid) -> None:
    """SIGKILL to the job's process group: what a job process leaves behind when it ends (its children stay in its
    group) goes with it."""
    if not pgid or not hasattr(os, "killpg"):
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:  # no such group (nothing left) or not ours
        pass


@functools.lru_cache(maxsize=1)
def best_device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


# ----------------------------------------------------------------------------------------- runner
class JobRunner:
    """Queue + process supervisor for one root folder (`<root>/jobs.sqlite`, `<root>/<job_id>/`).

    A daemon thread starts queued jobs (at most `max_concurrent` local ones), kills jobs past their
    timeout or still alive `cancel_grace_s` after a cancel, and notices processes that died."""

    def __init__(self, root, max_concurrent: int = 1, default_timeout_s: float | None = None, *,
                 cancel_grace_s: float = 5.0, poll_s: float = 0.1, hf_token: str | None = None,
                 hf_image: str | None = None, hf_flavor: str = "t4-small", hf_poll_s: float | None = 30.0,
                 results_dir=None):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.db_path = self.root / "jobs.sqlite"
        self.max_concurrent, self.default_timeout_s = max_concurrent, default_timeout_s
        self.cancel_grace_s, self.poll_s = cancel_grace_s, poll_s
        self.hf_token = hf_token or os.environ.get("HF_TOKEN")
        self.hf_image = hf_image or os.environ.get("SALIENCY_LAB_HF_IMAGE", "pytorch/pytorch:latest")
        self.results_dir = results_dir  # where finished HF jobs' models are downloaded (default: the model zoo)
        self.hf_flavor, self.hf_poll_s, self._hf_polled = hf_flavor, hf_poll_s, 0.0
        self._local = threading.local()
        self._procs: dict[str, subprocess.Popen] = {}
        self._lock = threading.RLock()
        self._wake, self._stop = threading.Event(), threading.Event()
        self._con().executescript(SCHEMA)
        self._recover()
        self._thread = threading.Thread(target=_scheduler, args=(weakref.ref(self), self._wake, self._stop),
                                        name=f"JobRunner({self.root})", daemon=True)
        self._thread.start()

    def _con(self) -> sqlite3.Connection:
        if getattr(self._local, "con", None) is None:
            self._local.con = _connect(self.db_path)
        return self._local.con

    def _recover(self) -> None:
        """Records left 'running' by a previous runner: keep live job processes, the rest are interrupted."""
        rows = self._con().execute("SELECT id, pid FROM jobs WHERE status='running' AND backend='local'").fetchall()
        for row in rows:
            if not _pid_runs_job(row["pid"], row["id"]):
                _finish(self._con(), row["id"], "interrupted",
                        error=f"interrupted: the job process (pid {row['pid']}) is gone - the app restarted or "
                              f"the process was killed; resume the job to start it again")

    # -- public API
    def submit(self, kind: str, params: dict | None = None, timeout_s: float | None = None,
               backend: str = "local") -> str:
        params = dict(params or {})
        json.dumps(params)  # fail here, not in the job process, on unserializable params
        job_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        work_dir = self.root / job_id
        timeout_s = timeout_s if timeout_s is not None else self.default_timeout_s
        if backend == "hf-jobs":
            return self._submit_hf(job_id, kind, params, timeout_s, work_dir)
        if backend != "local":
            raise ValueError(f"unknown backend {backend!r} (use 'local' or 'hf-jobs')")
        fn = _REGISTRY.get(kind)
        if fn is None:
            raise KeyError(f"unknown job kind {kind!r} (registered: {', '.join(sorted(_REGISTRY))})")
        if fn.__module__ == "__main__":
            raise ValueError(f"job kind {kind!r} is defined in __main__; define it in an importable module "
                             "so the job process can import it")
        work_dir.mkdir(parents=True, exist_ok=True)
        self._con().execute("INSERT INTO jobs (id, kind, module, params, status, created, timeout_s, work_dir) "
                            "VALUES (?, ?, ?, ?, 'queued', ?, ?, ?)",
                            (job_id, kind, fn.__module__, json.dumps(params), time.time(), timeout_s, str(work_dir)))
        self._wake.set()
        return job_id

    def get(self, job_id: str) -> dict:
        row = self._con().execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
        if row is None:
            raise KeyError(f"no job {job_id!r}")
        return _row_to_dict(row)

    def list(self, limit: int = 50) -> list[dict]:
        rows = self._con().execute("SELECT * FROM jobs ORDER BY created DESC LIMIT ?", (limit,)).fetchall()
        return [_row_to_dict(row) for row in rows]

    def history(self, job_id: str) -> list[dict]:
        rows = self._con().execute("SELECT t, step, data FROM metrics WHERE job_id=? ORDER BY rowid", (job_id,))
        return [{"t": t, "step": step, **json.loads(data)} for t, step, data in rows]

    def cancel(self, job_id: str) -> dict:
        """Queued: cancelled at once. Running: the job sees `context.cancelled()`; if its process is still
        alive `cancel_grace_s` later it is killed."""
        job = self.get(job_id)
        if job["backend"] == "hf-jobs" and job["status"] == "running":
            import huggingface_hub
            huggingface_hub.cancel_job(job_id=job["external_id"], token=self.hf_token)
            _finish(self._con(), job_id, "cancelled", error="cancelled by user")
        elif not _finish(self._con(), job_id, "cancelled", only_if=("queued",)):
            self._con().execute("UPDATE jobs SET cancel_requested=? WHERE id=? AND status='running' "
                                "AND cancel_requested IS NULL", (time.time(), job_id))
        self._wake.set()
        return self.get(job_id)

    def resume(self, job_id: str) -> None:
        """Queue a finished-but-not-done job again, same id and work dir (so it can resume a checkpoint)."""
        cur = self._con().execute("UPDATE jobs SET status='queued', error=NULL, result=NULL, finished=NULL, pid=NULL, "
                                  "cancel_requested=NULL WHERE id=? AND backend='local' AND status IN "
                                  "('failed', 'cancelled', 'interrupted')", (job_id,))
        if cur.rowcount != 1:
            raise ValueError(f"job {job_id!r} cannot be resumed (status {self.get(job_id)['status']})")
        self._wake.set()

    def wait(self, job_id: str, timeout: float | None = None) -> dict:
        """Block until the job is in a terminal status (and its process has exited); TimeoutError otherwise."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if job["status"] in TERMINAL:
                proc = self._procs.get(job_id)
                if proc is not None:
                    try:
                        proc.wait(timeout=None if deadline is None else max(0.1, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        pass
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job['status']} after {timeout} s")
            time.sleep(0.05)

    def refresh(self) -> None:
        """Poll HF Jobs for the status of every unfinished hf-jobs record; download the models of finished ones."""
        import huggingface_hub
        self._hf_polled = time.monotonic()
        for row in self._con().execute("SELECT id, external_id, params FROM jobs WHERE backend='hf-jobs' "
                                       "AND status='running'").fetchall():
            info = huggingface_hub.inspect_job(job_id=row["external_id"], token=self.hf_token)
            stage = getattr(info.status.stage, "value", info.status.stage)
            if stage not in hf_jobs.STAGES:
                continue
            status, result, error = hf_jobs.STAGES[stage], None, None
            if status != "done":
                error = f"HF job {stage}: {info.status.message or ''}".strip()
            repo = json.loads(row["params"] or "{}").get("_result_repo")
            if status == "done" and repo:
                try:
                    result = hf_jobs.fetch_result(repo, self._results_dir(), token=self.hf_token)
                except Exception as exc:  # noqa: BLE001 - the job ran; say where its model is
                    status, error = "failed", (f"HF job finished but its model could not be downloaded from {repo}: "
                                               f"{type(exc).__name__}: {exc}")
            _finish(self._con(), row["id"], status, error=error, result=result)

    def _results_dir(self) -> Path:
        if self.results_dir is not None:
            return Path(self.results_dir)
        from explainers.paths import user_models_dir
        return user_models_dir()

    def shutdown(self, wait: bool = False) -> None:
        """Stop the scheduler. Running local jobs: wait for them, or kill them and mark them interrupted."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)
        with self._lock:
            for job_id, proc in list(self._procs.items()):
                if wait:
                    proc.wait()
                else:
                    _finish(self._con(), job_id, "interrupted", error="interrupted: the job runner shut down")
                    _kill(proc.pid, proc)
            self._procs.clear()

    # -- scheduling (runs in the background thread)
    def _tick(self) -> None:
        with self._lock:
            con, now = self._con(), time.time()
            for row in con.execute("SELECT * FROM jobs WHERE status='running' AND backend='local'").fetchall():
                self._watch(con, row, now)
            for job_id, proc in list(self._procs.items()):  # reap finished processes and what they left
                if proc.poll() is not None and self.get(job_id)["status"] in TERMINAL:
                    _kill_group(proc.pid)
                    del self._procs[job_id]
            running = con.execute("SELECT COUNT(*) FROM jobs WHERE status='running' AND backend='local'").fetchone()[0]
            for row in con.execute("SELECT * FROM jobs WHERE status='queued' ORDER BY created, rowid "
                                   "LIMIT ?", (max(0, self.max_concurrent - running),)).fetchall():
                self._start(con, row)
        if self.hf_poll_s and time.monotonic() - self._hf_polled > self.hf_poll_s and con.execute(
                "SELECT 1 FROM jobs WHERE backend='hf-jobs' AND status='running'").fetchone():
            try:
                self.refresh()
            except Exception as exc:  # noqa: BLE001 - network trouble must not stop local jobs
                print(f"[jobs] HF Jobs refresh failed: {exc}", file=sys.stderr)

    def _watch(self, con, row, now) -> None:
        job_id, pid, proc = row["id"], row["pid"], self._procs.get(row["id"])
        if pid is None and proc is None and now - row["started"] < 30:
            return  # another runner on this root is starting it right now
        alive = proc.poll() is None if proc is not None else _pid_runs_job(pid, job_id)
        if not alive:
            if proc is not None or not _pid_exists(pid):  # never a group whose leader is another live program
                _kill_group(pid)  # the children of a job process that died (killed, crashed) go with it
            code = f" with code {proc.returncode}" if proc is not None else ""
            _finish(con, job_id, "failed", error=f"job process (pid {pid}) exited{code} without reporting a "
                                                 f"result; see {Path(row['work_dir']) / 'job.log'}")
        elif row["timeout_s"] and row["started"] and now - row["started"] > row["timeout_s"]:
            if _finish(con, job_id, "failed", error=f"timed out after {row['timeout_s']:g} s"):
                _kill(pid, proc)
        elif row["cancel_requested"] and now - row["cancel_requested"] > self.cancel_grace_s:
            error = f"killed: did not stop within {self.cancel_grace_s:g} s of cancel"
            if _finish(con, job_id, "cancelled", error=error):
                _kill(pid, proc)

    def _start(self, con, row) -> None:
        job_id, device = row["id"], best_device()
        if con.execute("UPDATE jobs SET status='running', started=?, device=?, step=NULL, total=NULL "
                       "WHERE id=? AND status='queued'", (time.time(), device, job_id)).rowcount != 1:
            return
        package_parent = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")])))
        command = [sys.executable, "-m", "saliency_lab.jobs", "run", job_id, "--root", str(self.root.resolve()),
                   "--module", row["module"] or __name__]
        try:
            with open(Path(row["work_dir"]) / "job.log", "ab") as log:
                proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        env=env, start_new_session=(os.name == "posix"))
        except OSError as exc:
            _finish(con, job_id, "failed", error=f"could not start the job process: {type(exc).__name__}: {exc}")
            return
        self._procs[job_id] = proc
        con.execute("UPDATE jobs SET pid=? WHERE id=?", (proc.pid, job_id))

    def _submit_hf(self, job_id, kind, params, timeout_s, work_dir) -> str:
        """Stage the inputs on the hub, start the container, record the job (see `hf_jobs`)."""
        if not self.hf_token:
            raise hf_jobs.HFJobsError("HF Jobs backend needs a Hugging Face token: set HF_TOKEN or pass hf_token=")
        import huggingface_hub
        remote = hf_jobs.prepare(kind, params, job_id, self.hf_token)
        info = huggingface_hub.run_job(image=self.hf_image, command=remote.command, volumes=remote.volumes,
                                       flavor=self.hf_flavor, secrets={"HF_TOKEN": self.hf_token}, timeout=timeout_s,
                                       token=self.hf_token, labels={"app": "saliency-lab", "job": job_id})
        recorded = dict(params, _result_repo=remote.result_repo, _staged_repo=remote.staged_repo)
        self._con().execute("INSERT INTO jobs (id, kind, params, status, backend, external_id, created, started, "
                            "device, timeout_s, work_dir) VALUES (?, ?, ?, 'running', 'hf-jobs', ?, ?, ?, ?, ?, ?)",
                            (job_id, kind, json.dumps(recorded), info.id, time.time(), time.time(),
                             f"hf:{self.hf_flavor}", timeout_s, str(work_dir)))
        return job_id


def _scheduler(runner_ref, wake: threading.Event, stop: threading.Event) -> None:
    """Background loop; holds the runner only weakly, so dropping the runner ends it."""
    while not stop.is_set():
        runner = runner_ref()
        if runner is None:
            return
        try:
            runner._tick()
        except Exception:  # noqa: BLE001 - keep scheduling; the next tick retries
            traceback.print_exc()
        poll_s = runner.poll_s
        del runner
        wake.wait(poll_s)
        wake.clear()


# ----------------------------------------------------------------------------------------- the app's kinds
@register_job_kind("camal")
def camal(params: dict, context: JobContext) -> dict:
    """The CAMAL fine-tune (`explainers.camal.run_camal_job`: params as the CLI's flags), registered here, in the
    app's job runner, rather than at the import of the library's camal module."""
    from explainers.camal import run_camal_job

    return run_camal_job(params, context)


@register_job_kind("aha-train")
def aha_train(params: dict, context: JobContext) -> dict:
    """Training an AHA explainer for a model (`explainers.aha_training.job.run_aha_job`), registered here as camal is."""
    from explainers.aha_training.job import run_aha_job

    return run_aha_job(params, context)


def main(argv=None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="python -m saliency_lab.jobs", description="run one job (used by JobRunner)")
    parser.add_argument("action", choices=["run"])
    parser.add_argument("job_id")
    parser.add_argument("--root", required=True)
    parser.add_argument("--module", default=__name__, help="the module that registers the job kind")
    args = parser.parse_args(argv)
    return _child_main(args.root, args.job_id, args.module)


if __name__ == "__main__":
    from saliency_lab.jobs import main as _main  # the canonical module, whose registry the job kinds use
    raise SystemExit(_main())
