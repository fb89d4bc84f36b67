"""The 'aha-train' job kind end to end on a tiny imported resnet18 (through the real JobRunner: its own process),
cancel inside the step loop, resume after the job process is killed, the Models tab's service functions, the
evaluate CLI before and after an explainer exists; and part 3 of issue 12: CAMAL, a review study, the sanity
check, RISE and GradSkip on imported models. Tiny models and data sets made here; nothing from ../shared."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import save_file

from explainers import models
from explainers.import_model import import_model
from saliency_lab.jobs import TERMINAL
from conftest import wait_until

ROOT = Path(__file__).resolve().parent.parent
CNN_ARGS = {"channels": [8, 16, 16, 16]}
VIT_ARGS = {"patch_size": 8, "depth": 2, "num_heads": 2, "embed_dim": 32}
FAST = {"batch_size": 4, "fraction_samples": 4, "val_track": 4, "val_limit": 4, "compare": []}


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    folder = tmp_path / "saliency-data"
    monkeypatch.setenv("SALIENCY_DATA_DIR", str(folder))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the job processes inherit it
    from explainers.aha.store import forget_explainers

    forget_explainers()
    yield folder
    forget_explainers()
    for card in (folder / "models").glob("*.json"):
        models.forget(card.stem)


@pytest.fixture
def runner(tmp_path):
    from saliency_lab.jobs import JobRunner

    made = JobRunner(tmp_path / "jobs", poll_s=0.05, cancel_grace_s=120.0)  # a loaded machine: never killed early
    yield made
    made.shutdown()


def import_cnn(tmp_path, name="job-cnn", seed=0):
    torch.manual_seed(seed)
    network = timm.create_model("resnet18", pretrained=False, num_classes=3, **CNN_ARGS)
    weights = tmp_path / f"{name}.safetensors"
    save_file(network.state_dict(), str(weights))
    (tmp_path / "classes.txt").write_text("red\ngreen\nblue\n")
    import_model(arch="resnet18", weights=weights, classes=tmp_path / "classes.txt", name=name, input_size=(32, 32),
                 model_args=CNN_ARGS)
    return name


def import_vit(tmp_path, name="job-vit", seed=1):
    torch.manual_seed(seed)
    network = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3, img_size=32, **VIT_ARGS)
    weights = tmp_path / f"{name}.safetensors"
    save_file(network.state_dict(), str(weights))
    (tmp_path / "classes.txt").write_text("red\ngreen\nblue\n")
    import_model(arch="vit_tiny_patch16_224", weights=weights, classes=tmp_path / "classes.txt", name=name,
                 input_size=(32, 32), model_args=VIT_ARGS)
    return name


def labelled_folder(folder: Path, n=12, size=32) -> Path:
    """n images whose class is the colour of a disk (so a classifier, and a map, have something to find)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    colours = ((220, 30, 30), (30, 180, 30), (40, 40, 220))
    ys, xs = np.mgrid[0:size, 0:size]
    rows = ["file,class_index"]
    for i in range(n):
        image = rng.integers(120, 200, (size, size, 3)).astype(np.uint8)
        cy, cx = rng.integers(8, size - 8, 2)
        image[(ys - cy) ** 2 + (xs - cx) ** 2 <= 30] = colours[i % 3]
        Image.fromarray(image).save(folder / f"{i}.png")
        rows.append(f"{i}.png,{i % 3}")
    (folder / "labels.csv").write_text("\n".join(rows) + "\n")
    (folder / "classes.txt").write_text("red\ngreen\nblue\n")
    return folder


def aha_mode(name: str) -> str:
    """The mode AHA ran in for one image of `name` (the engine's result options)."""
    from explainers.engine import prepare_input, run_method

    bundle = models.load_model(name)
    prepared = prepare_input(Image.open(ROOT / "tests" / "data" / "cell_0.jpg").convert("RGB"), bundle)
    record = run_method(bundle, prepared, "aha", 0, {}, steps=4)
    assert np.isfinite(record["map"]).all() and record["map"].shape == (32, 32)
    return record["options"]["mode"]


def wait_for(predicate, timeout=300.0):
    return wait_until(predicate, timeout)


def job_log(job) -> str:
    return Path(job["log"]).read_text()[-3000:] if Path(job["log"]).exists() else ""


# ------------------------------------------------------------------------------------------------ (a) end to end
def test_aha_train_job_end_to_end_on_an_imported_model(data_dir, tmp_path, runner):
    from explainers.aha.store import forget_explainers
    from explainers.data import spread_indices
    from explainers.methods import METHODS
    from saliency_lab import jobs

    assert jobs._REGISTRY["aha-train"] is jobs.aha_train
    name = import_cnn(tmp_path)
    folder = labelled_folder(tmp_path / "train", n=12)
    assert aha_mode(name) == "per-image"  # no explainer yet
    assert "per-image" in METHODS["aha"].menu_note(models.load_model(name))
    job_id = runner.submit("aha-train", {"model": name, "data": str(folder), "steps": 6, "val_every": 3,
                                         "val_holdout": 0.25, **FAST})
    job = runner.wait(job_id, timeout=600)
    assert job["status"] == "done", (job["error"], job_log(job))
    history = runner.history(job_id)
    validation = [p for p in history if "val_deletion_auc" in p]
    assert [p["step"] for p in validation] == [0, 3, 6]  # the untrained explainer, then every 3 steps
    for point in validation:
        assert 0 <= point["val_deletion_auc"] <= 1 and 0 <= point["val_insertion_auc"] <= 1
        assert point["val_ins_minus_del"] == pytest.approx(point["val_insertion_auc"] - point["val_deletion_auc"],
                                                           abs=2e-5)
    assert job["progress"] == {"step": 6, "total": 6}
    starts = [p for p in history if p.get("phase") == "start"]
    assert len(starts) == 1 and starts[0]["resumed_from"] == 0
    # the explainer lies beside the model's card in the data folder, never in the code's weights/
    stem = data_dir / "models" / f"aha-{name}"
    assert Path(f"{stem}.json").exists() and Path(f"{stem}.safetensors").exists()
    assert Path(f"{stem}.validation.png").exists()
    assert not (models.WEIGHTS_DIR / f"aha-{name}.json").exists()
    assert not (Path(job["work_dir"]) / "aha.ckpt").exists()  # done: the resume file is gone
    card = json.loads(Path(f"{stem}.json").read_text())
    assert card["base_model"] == name and card["device"] == "cpu" and card["recipe"]["device"] == "cpu"
    assert card["recipe"]["data"] == str(folder) and card["recipe"]["steps"] == 6 and card["train_seconds"] > 0
    held = spread_indices(12, 3)  # 25% of 12 images held out, spread over the file
    assert card["recipe"]["held_out_indices"] == held and card["recipe"]["train_images"] == 9
    assert "held out of" in card["recipe"]["validation_data"] and card["held_out"]["images"] == 3
    assert [(v["step"], v["deletion_auc"]) for v in card["validation"]] == [
        (p["step"], p["val_deletion_auc"]) for p in validation]  # the card's curve is the job's metric history
    assert card["job_id"] == job_id and job["result"]["card"] == f"{stem}.json"
    # AHA now runs in one pass for this model
    forget_explainers()
    assert aha_mode(name) == "trained"
    assert METHODS["aha"].menu_note(models.load_model(name)) == "one pass (trained explainer)"


def test_job_refuses_bad_params_and_never_writes_into_weights(data_dir, tmp_path):
    from explainers.aha_training.job import job_out_stem, run_aha_job

    with pytest.raises(ValueError, match="unknown aha-train job params \\['bogus'\\]"):
        run_aha_job({"model": "m", "data": "d", "bogus": 1}, None)
    with pytest.raises(ValueError, match="needs 'data'"):
        run_aha_job({"model": "m"}, None)
    with pytest.raises(ValueError, match="ships a trained AHA explainer"):  # shipped: the loader takes weights/
        job_out_stem("bloodmnist-cnn")
    with pytest.raises(ValueError, match="never writes into the code's weights folder"):
        job_out_stem("my-model", out=str(models.WEIGHTS_DIR / "aha-my-model"))
    assert job_out_stem("some-hub-model") == data_dir / "models" / "aha-some-hub-model"


def test_an_explainer_trained_for_a_shipped_model_without_one_is_found_in_the_user_folder(data_dir, tmp_path,
                                                                                         monkeypatch):
    """A model shipped in weights/ without an explainer: the job's explainer goes to the user's models folder
    (never weights/) and the loader finds it there."""
    from explainers.aha.store import explainer_stem, forget_explainers
    from explainers.aha_training.loop import train_aha
    from explainers.training import export_classifier

    shipped = tmp_path / "shipped-weights"
    shipped.mkdir()
    monkeypatch.setattr(models, "WEIGHTS_DIR", shipped)
    torch.manual_seed(0)
    network = timm.create_model("resnet18", pretrained=False, num_classes=3, **CNN_ARGS)
    export_classifier(network, name="shipped-cnn", out_dir=shipped, timm_name="resnet18", timm_kwargs={**CNN_ARGS, "num_classes": 3},
                      mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), class_names=["red", "green", "blue"],
                      data="synthetic", val_accuracy=None, test_data=None, seed=0, history=[], epochs=0,
                      train_seconds=0.0, input_size=32)
    models.forget("shipped-cnn")
    try:
        assert aha_mode("shipped-cnn") == "per-image"
        folder = labelled_folder(tmp_path / "train", n=8)
        from explainers.aha_training.job import job_out_stem

        out = job_out_stem("shipped-cnn")
        assert out == data_dir / "models" / "aha-shipped-cnn"
        train_aha(model="shipped-cnn", data=str(folder), out=str(out), steps=2, progress=False, checkpoint_every=1,
                  **{k: v for k, v in FAST.items() if k not in ("val_track", "val_limit")})
        assert not list(shipped.glob("aha-*")) and explainer_stem("shipped-cnn") == out
        forget_explainers()
        assert aha_mode("shipped-cnn") == "trained"
    finally:
        models.forget("shipped-cnn")


# ------------------------------------------------------------------------------------------------ (b) cancel
def test_cancel_inside_the_step_loop_stops_at_the_next_step(data_dir, tmp_path, runner):
    name = import_cnn(tmp_path)
    folder = labelled_folder(tmp_path / "train", n=12)
    job_id = runner.submit("aha-train", {"model": name, "data": str(folder), "steps": 400, "val_every": 200,
                                         "checkpoint_every": 50, "val_holdout": 0.25, **FAST})
    wait_for(lambda: (runner.get(job_id)["progress"]["step"] or 0) >= 2 or runner.get(job_id)["status"] in TERMINAL)
    assert runner.get(job_id)["status"] == "running", job_log(runner.get(job_id))
    runner.cancel(job_id)
    step_at_cancel = runner.get(job_id)["progress"]["step"]  # read after the cancel was recorded
    job = runner.wait(job_id, timeout=300)
    assert job["status"] == "cancelled" and not job["error"], (job, job_log(job))  # stopped by itself, not killed
    result = job["result"]
    # checked after every step: the step in flight when the cancel landed is the last one
    assert result["cancelled"] and result["step"] == job["progress"]["step"] <= step_at_cancel + 1
    assert result["step"] < 400 and result["total_steps"] == 400
    state = torch.load(Path(job["work_dir"]) / "aha.ckpt", map_location="cpu", weights_only=True)
    assert state["step"] == result["step"]  # a resume continues from exactly there
    assert not (data_dir / "models" / f"aha-{name}.json").exists()  # nothing exported


# ------------------------------------------------------------------------------------------------ (c) resume
def test_resume_after_the_job_process_is_killed_continues_from_its_checkpoint(data_dir, tmp_path, runner):
    name = import_cnn(tmp_path)
    folder = labelled_folder(tmp_path / "train", n=12)
    job_id = runner.submit("aha-train", {"model": name, "data": str(folder), "steps": 40, "val_every": 20,
                                         "checkpoint_every": 2, "val_holdout": 0.25, **FAST})
    checkpoint = Path(runner.get(job_id)["work_dir"]) / "aha.ckpt"
    wait_for(lambda: (checkpoint.exists() and (runner.get(job_id)["progress"]["step"] or 0) >= 4)
             or runner.get(job_id)["status"] in TERMINAL)
    assert runner.get(job_id)["status"] == "running", job_log(runner.get(job_id))
    pid = runner.get(job_id)["pid"]
    os.kill(pid, signal.SIGKILL)
    killed = wait_for(lambda: runner.get(job_id) if runner.get(job_id)["status"] != "running" else None)
    assert killed["status"] == "failed" and "exited" in killed["error"]
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)["step"]
    assert 2 <= saved < 40 and saved % 2 == 0
    runner.resume(job_id)
    job = runner.wait(job_id, timeout=600)
    assert job["status"] == "done", (job["error"], job_log(job))
    history = runner.history(job_id)
    starts = [p for p in history if p.get("phase") == "start"]
    assert [p["resumed_from"] for p in starts] == [0, saved]  # the second run began at the checkpoint's step
    after = [p["step"] for p in history[history.index(starts[1]):] if "loss" in p]
    assert after and min(after) > saved and after[-1] == 40  # and counted on from there
    assert "Resuming aha-" in Path(job["log"]).read_text()
    card = json.loads((data_dir / "models" / f"aha-{name}.json").read_text())
    assert card["recipe"]["steps"] == 40 and [v["step"] for v in card["validation"]] == [0, 20, 40]


# ------------------------------------------------------------------------------------------------ (d) the form
def test_the_forms_service_functions(data_dir, tmp_path):
    from saliency_lab import aha_train, datasets, figures, job_panel, menus
    from saliency_lab.services import Services

    name = import_cnn(tmp_path)
    labelled_folder(data_dir / "datasets" / "mini-cells", n=12)  # a data set in the data folder, by name
    services = Services(models.load_model, models.list_models, tmp_path / "state", weights_dir=tmp_path / "fine")
    try:
        assert (f"{name} · imported · AHA per-image", name) in aha_train.model_choices(services)
        assert "bloodmnist-cnn" not in [n for _, n in aha_train.model_choices(services)]  # ships its explainer
        data = dict((value, label) for label, value in datasets.choices())
        assert "mini-cells (12 images)" == data["mini-cells"] and "bloodmnist-cells" in data
        assert aha_train.validation_choices()[0][1] == aha_train.HOLDOUT
        with pytest.raises(ValueError, match="ships a trained AHA explainer"):
            aha_train.start_training(services, "bloodmnist-cnn", "mini-cells")
        for bad in ("../mini-cells", str(data_dir / "datasets" / "mini-cells"), "nope"):
            with pytest.raises(ValueError):
                aha_train.start_training(services, name, bad)
        with pytest.raises(ValueError, match="labels of bloodmnist-cells run from 0 to 7, but 'job-cnn' has 3 "
                                             "classes"):  # 8 cell types for a 3-class model: refused before queueing
            aha_train.start_training(services, name, "bloodmnist-cells")
        with pytest.raises(ValueError, match="Steps: between 1"):
            aha_train.start_training(services, name, "mini-cells", steps=0)
        with pytest.raises(ValueError, match="HuggingFace Jobs needs a token"):
            services.hf_token = None
            aha_train.start_training(services, name, "mini-cells", backend="hf-jobs")
        job_id, message = aha_train.start_training(services, name, "mini-cells", aha_train.HOLDOUT, steps=4, seed=1)
        assert "queued" in message and "10% of **mini-cells** held out" in message
        params = services.runner().get(job_id)["params"]
        assert params["val_holdout"] == 0.1 and params["data"] == str(data_dir / "datasets" / "mini-cells")
        assert params["val_every"] == 1 and params["data_name"] == "mini-cells"
        job = services.runner().wait(job_id, timeout=600)
        assert job["status"] == "done", (job["error"], job_log(job))
        report = job_panel.job_report(services, job_id)
        assert report.finished and report.percent == 100 and "one pass" in report.text
        steps = [p["step"] for p in services.runner().history(job_id) if "val_deletion_auc" in p]
        assert steps == [0, 1, 2, 3, 4]
        spec = report.figure.to_dict()
        assert [t["name"] for t in spec["data"][:2]] == [label for _, label, _, _ in figures.AHA_SERIES[:2]]
        assert spec["data"][0]["x"] == steps and len(spec["data"][1]["y"]) == 5
        labels = dict((v, k) for k, v in menus.method_choices(services.bundle(name)))
        assert labels["aha"].endswith("· one pass (trained explainer)")  # the Explain tab's menu note
        assert aha_train.aha_note(services, name).endswith("one pass (trained explainer).")
        assert (job_id in [v for _, v in job_panel.job_choices(services, kind=aha_train.KIND)])
        assert any(row[0] == job_id and row[1] == "aha-train" and row[4] == f"{name} (AHA explainer)"
                   for row in job_panel.job_rows(services))
    finally:
        if services._runner is not None:
            services._runner.shutdown()


def test_eta_counts_from_the_last_start_and_respects_the_minutes():
    from saliency_lab.aha_train import eta_text

    history = [{"t": 100.0, "step": 0, "phase": "start", "elapsed_s": 0},
               {"t": 200.0, "step": 10, "phase": "start", "elapsed_s": 50}]  # resumed at step 10
    text = eta_text(20, 110, history, now=220.0)  # 10 steps in 20 s since the resume: 2 s/step, 90 steps left
    assert text.startswith("step 20/110 (18%) · 2.00 s/step · about 3 min left (ETA ")
    capped = eta_text(20, 110, history, now=220.0, minutes=2)  # 120 s budget, 50 s before the restart, 20 s since
    assert "about 50 s left" in capped
    assert "measuring the speed" in eta_text(10, 110, history, now=201.0)
    assert "budget is spent · finishing" in eta_text(20, 110, history, now=280.0, minutes=2)
    assert eta_text(110, 110, history, now=400.0).endswith("finishing: held-out figures, then the explainer is saved…")


def test_hf_jobs_command_for_an_aha_job_stages_an_imported_model():
    from saliency_lab.hf_jobs import cli_command

    command = cli_command("aha-train", {"model": "my-cells", "data": "/inputs/data", "steps": 300, "minutes": 20,
                                        "val_holdout": 0.1, "val_every": 30, "seed": 0, "out": "/tmp/out/aha-my-cells",
                                        "model_files": "/inputs/model_files"})
    assert command == ["python", "-m", "explainers", "train-aha", "--model", "my-cells", "--data", "/inputs/data",
                       "--val-holdout", "0.1", "--steps", "300", "--time-budget-minutes", "20", "--seed", "0",
                       "--val-every", "30", "--out", "/tmp/out/aha-my-cells"]
    with pytest.raises(ValueError, match="missing params \\['out'\\]"):
        cli_command("aha-train", {"model": "m", "data": "d"})


def test_hf_jobs_backend_uploads_the_data_and_the_imported_model_and_brings_the_explainer_back(data_dir, tmp_path,
                                                                                             monkeypatch):
    from saliency_lab import aha_train, hf_jobs
    from saliency_lab.services import Services
    from conftest import FakeHub

    hub = FakeHub(monkeypatch, tmp_path / "hub")
    monkeypatch.setenv("SPACE_ID", "alice/saliency-lab")
    name = import_cnn(tmp_path)
    labelled_folder(data_dir / "datasets" / "mini-cells", n=12)
    services = Services(models.load_model, models.list_models, tmp_path / "state", hf_token="hf_secret")
    try:
        job_id, _ = aha_train.start_training(services, name, "mini-cells", steps=30, backend="hf-jobs")
        staged = f"alice/saliency-lab-job-{job_id}"
        script = next(c[1] for c in hub.calls if c[0] == "run")["command"][2]
        assert "export SALIENCY_DATA_DIR=/tmp/saliency-data" in script and "/inputs/model_files/*" in script
        assert script.endswith(f"python -m explainers train-aha --model {name} --data /inputs/data --val-holdout 0.1 "
                               f"--steps 30 --seed 0 --val-every 3 --out /tmp/out/aha-{name} --push-to alice/aha-{name}")
        assert str(data_dir) not in script  # no local path reaches the container
        uploaded = sorted(p.name for p in (tmp_path / "hub" / staged / "model_files").iterdir())
        assert uploaded == [f"{name}.json", f"{name}.safetensors"]
        assert (tmp_path / "hub" / staged / "data" / "labels.csv").exists()
        # what --push-to does at the job's end; then the runner sees it finished and fetches the explainer
        out = tmp_path / "remote-out"
        out.mkdir()
        (out / f"aha-{name}.json").write_text(json.dumps({"base_model": name}))
        (out / f"aha-{name}.safetensors").write_bytes(b"weights")
        hf_jobs.push_result(out / f"aha-{name}", f"alice/aha-{name}", token="hf_secret")
        hub.stages["hf-1"] = ("COMPLETED", None)
        services.runner().refresh()
        assert services.runner().get(job_id)["status"] == "done"
        assert (data_dir / "models" / f"aha-{name}.safetensors").read_bytes() == b"weights"  # beside the model
    finally:
        services.runner().shutdown()


# ------------------------------------------------------------------------------------------------ (e) evaluate
def test_evaluate_cli_per_image_before_and_trained_after(data_dir, tmp_path):
    from explainers.aha_training.loop import train_aha

    name = import_cnn(tmp_path, "eval-cnn")
    folder = labelled_folder(tmp_path / "test", n=4)
    env = dict(os.environ, SALIENCY_DATA_DIR=str(data_dir), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT))

    def evaluate(out):
        result = subprocess.run([sys.executable, "-m", "explainers", "evaluate", "--model", name, "--methods",
                                 "gradcam,aha", "--data", str(folder), "--steps", "4", "--out", str(out)],
                                cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-2000:]
        return json.loads(out.read_text())

    before = evaluate(tmp_path / "before.json")
    assert before["methods"]["aha"]["options"]["mode"] == "per-image"
    assert before["methods"]["aha"]["options"]["prior"] == "gradcam"
    shipped = sorted(p.name for p in models.WEIGHTS_DIR.iterdir())
    train_aha(model=name, data=str(labelled_folder(tmp_path / "train", n=8)), steps=2, progress=False,
              checkpoint_every=1, **{k: v for k, v in FAST.items() if k not in ("val_track", "val_limit")})
    assert (data_dir / "models" / f"aha-{name}.json").exists()  # the CLI's default: beside the imported model
    assert sorted(p.name for p in models.WEIGHTS_DIR.iterdir()) == shipped  # never into the code's weights/
    after = evaluate(tmp_path / "after.json")
    assert after["methods"]["aha"]["options"]["mode"] == "trained"
    assert len(after["methods"]["aha"]["per_image"]["deletion_auc"]) == 4


# ------------------------------------------------------------------------------------------------ (f) part 3
def test_camal_finetunes_imported_cnn_and_vit(data_dir, tmp_path):
    from explainers.camal import run_camal

    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import make_mask_set

    train = make_mask_set(tmp_path / "masks" / "train", count=8)
    for name in (import_cnn(tmp_path), import_vit(tmp_path)):
        out = data_dir / "models" / f"{name}-camal"
        summary = run_camal(model=name, data=str(train), out=str(out), epochs=1, lam=1.0, batch_size=4,
                            curve_limit=2, eval_limit=4)
        assert summary["steps"] == 2 and not summary["cancelled"] and summary["listed_in_zoo"], summary
        card = json.loads(Path(summary["card"]).read_text())
        assert card["camal"]["base_model"] == name and card["class_names"] == ["red", "green", "blue"]
        tuned = models.load_model(f"{name}-camal")
        base = models.load_model(name)
        assert tuned.is_vit == base.is_vit and tuned.input_size == base.input_size == (32, 32)
        assert any(not torch.equal(a, b) for a, b in zip(tuned.network.state_dict().values(),
                                                         base.network.state_dict().values()))  # it trained
        models.forget(f"{name}-camal")


def test_review_study_on_an_imported_model_shows_a_map(data_dir, tmp_path):
    from saliency_lab import studies
    from saliency_lab.services import Services

    name = import_vit(tmp_path)
    services = Services(models.load_model, models.list_models, tmp_path / "state")
    code, _, text = studies.create_study(services, "imported-study", "bloodmnist-cells", name, ["gradcam", "rollout"],
                                      ["a"], "blinded", count=2, seed=0)
    state, _ = studies.open_study(services, "imported-study", code, "a")
    shown = studies.show_item(services, state, 0, "a")
    assert [caption for _, caption in shown.items] == ["Image 1", "Map A", "Map B"]
    assert all(Path(path).exists() for path, _ in shown.items)
    assert studies.rate(services, shown.state, "a", "A", 4)


def test_sanity_rise_and_gradskip_on_imported_models(data_dir, tmp_path):
    from explainers.engine import prepare_input, run_method
    from saliency_lab import learn
    from saliency_lab.services import Services

    cnn, vit = import_cnn(tmp_path), import_vit(tmp_path)
    services = Services(models.load_model, models.list_models, tmp_path / "state")
    image = str(ROOT / "tests" / "data" / "cell_0.jpg")
    for name, methods in ((cnn, ["gradcam", "random"]), (vit, ["rollout", "gradskip"])):
        steps = list(learn.sanity_run(services, name, methods, stages=2, image_path=image))
        items, figure = steps[-1]
        assert len(items) == 2 * 3  # each method: the trained model and 2 randomisation stages
        traces = figure.to_dict()["data"]
        assert len(traces) == 2 and all(len(t["y"]) == 3 and abs(t["y"][0] - 1) < 1e-6 for t in traces)
    for name, method, options in ((cnn, "rise", {"n_masks": 32}), (vit, "rise", {"n_masks": 32}),
                                  (vit, "gradskip", {})):
        bundle = models.load_model(name)
        prepared = prepare_input(Image.open(image).convert("RGB"), bundle)
        record = run_method(bundle, prepared, method, 0, options, steps=4)
        assert record["map"].shape == (32, 32) and np.isfinite(record["map"]).all() and record["map"].std() > 0
        assert 0 <= record["deletion_auc"] <= 1 and 0 <= record["insertion_auc"] <= 1
