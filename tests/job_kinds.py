"""Job kinds for the tests only (a sleep with a fake loss; a tiny MLP that checkpoints and resumes), registered
with the app's job runner when this module is imported (conftest.py imports it for every test). The job process
imports it by name, as any kind's module: conftest.py puts this folder on the job processes' PYTHONPATH."""
import time

from explainers.atomic import atomic_torch_save
from saliency_lab.jobs import JobContext, register_job_kind


@register_job_kind("sleep-steps")
def sleep_steps(params: dict, context: JobContext) -> dict:
    """N steps of sleep(dt) with a fake decreasing loss; `fail_at` raises, `ignore_cancel` never stops."""
    steps, dt, fail_at = int(params.get("steps", 10)), float(params.get("dt", 0.05)), params.get("fail_at")
    for step in range(1, steps + 1):
        if context.cancelled() and not params.get("ignore_cancel"):
            return {"stopped_at": step - 1}
        time.sleep(dt)
        if fail_at is not None and step == int(fail_at):
            raise ValueError(f"failing at step {step} as asked")
        context.progress(step, steps, loss=1.0 / step)
    return {"steps": steps, "final_loss": 1.0 / steps}


@register_job_kind("tiny-train")
def tiny_train(params: dict, context: JobContext) -> dict:
    """A 2-layer MLP on random regression data; checkpoints atomically and resumes from its checkpoint."""
    import torch
    torch.set_num_threads(1)
    steps, every = int(params.get("steps", 50)), int(params.get("checkpoint_every", 10))
    seed, step_sleep = int(params.get("seed", 0)), float(params.get("step_sleep", 0.0))
    data_gen = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 8, generator=data_gen)
    y = x @ torch.randn(8, 1, generator=data_gen) + 0.1 * torch.randn(256, 1, generator=data_gen)
    x, y = x.to(context.device), y.to(context.device)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(context.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=float(params.get("lr", 1e-2)))
    checkpoint, start = context.checkpoint_path("last.pt"), 0
    if checkpoint.exists():
        state = torch.load(checkpoint, map_location=context.device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
        print(f"resuming from step {start}", flush=True)
    loss = None
    for step in range(start + 1, steps + 1):
        if context.cancelled():
            break
        batch = torch.randint(0, len(x), (64,), generator=torch.Generator().manual_seed(seed * 100003 + step))
        loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        context.progress(step, steps, loss=loss.item())
        if step % every == 0 or step == steps:
            state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
            atomic_torch_save(state, checkpoint)
        time.sleep(step_sleep)
    with torch.no_grad():
        final = torch.nn.functional.mse_loss(model(x), y).item()
    return {"resumed_from": start, "steps": steps, "final_loss": final, "checkpoint": str(checkpoint)}


CHILD = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


@register_job_kind("spawn-children")
def spawn_children(params: dict, context: JobContext) -> dict:
    """Starts `children` processes that ignore SIGTERM (like ViZDoom's), writes their pids to children.txt, then
    sleeps in steps; `ignore_cancel` never stops, `leave_children` returns on cancel without ending them."""
    import subprocess
    import sys

    children = [subprocess.Popen([sys.executable, "-c", CHILD]) for _ in range(int(params.get("children", 3)))]
    (context.work_dir / "children.txt").write_text(" ".join(str(c.pid) for c in children))
    for step in range(1, 1001):
        if context.cancelled() and not params.get("ignore_cancel"):
            return {"stopped_at": step - 1}
        time.sleep(0.02)
        context.progress(step, 1000)
    return {"steps": 1000}
