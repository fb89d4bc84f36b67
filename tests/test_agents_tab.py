"""The Agents tab (saliency_lab.ui.agents): it builds, its handlers play / scrub / replay / export, the training
job runs through the app's job runner, and without ViZDoom the tab says how to install it."""
import json

import gradio as gr
import pytest

from explainers.agents import envs
from saliency_lab import agents as service, job_panel
from saliency_lab.ui import TAB_MODULES, TabContext
from saliency_lab.ui import agents as tab

from conftest import train_tiny_agents

needs_vizdoom = pytest.mark.skipif(not envs.vizdoom_available(), reason="ViZDoom is not installed")


class Services:
    def __init__(self, root):
        self._runner, self.root = None, root

    def runner(self):
        from saliency_lab.jobs import JobRunner

        if self._runner is None:
            self._runner = JobRunner(self.root)
        return self._runner


def context(services):
    return TabContext(services=services, names=[], first_model="", heavy={}, light={})


def test_the_tab_is_listed_and_builds_without_vizdoom(monkeypatch, tmp_path):
    assert "agents" in TAB_MODULES
    monkeypatch.setattr(service, "vizdoom_available", lambda: False)
    with gr.Blocks() as demo:
        with gr.Tab(tab.TITLE, id=tab.TAB_ID):
            parts = tab.build(context(Services(tmp_path)))
    assert "agents_records" in parts
    assert "pip install" in tab.status_text()
    with pytest.raises(gr.Error, match="ViZDoom is not installed"):
        tab.start_training(Services(tmp_path), "defend_the_center", "x", 0, 1.0, 1)
    demo.close()


def test_agent_labels_name_the_arm_and_a_camal_clip_of_its_own(monkeypatch, tmp_path):
    """The menu label starts with the arm; a CAMAL agent whose gradient has its own clip (its strength, more than
    lambda) names it; the same clip as PPO's is not repeated; a vanilla agent has no lambda or clip."""
    cards = {"v": {"scenario": "s", "lambda": 0.0, "ppo": {"max_grad_norm": 0.5, "camal_max_grad_norm": 0.05}},
             "c": {"scenario": "s", "lambda": 1.0, "ppo": {"max_grad_norm": 0.5, "camal_max_grad_norm": 0.05}},
             "old": {"scenario": "s", "lambda": 3.0, "ppo": {"max_grad_norm": 0.5, "camal_max_grad_norm": 0.5}}}
    for name, card in cards.items():
        (tmp_path / f"s-{name}.json").write_text(json.dumps(card))
    monkeypatch.setattr(service, "card_file", lambda name: tmp_path / f"{name}.json")
    assert service.agent_label("s-v") == "vanilla PPO · v"
    assert service.agent_label("s-c") == "CAMAL λ 1, clip 0.05 · c"
    assert service.agent_label("s-old") == "CAMAL λ 3 · old"


@pytest.fixture(scope="module")
def agent_folder(tmp_path_factory):
    return train_tiny_agents(tmp_path_factory.mktemp("tab-agents"), (("t-vanilla", 0.0), ("t-camal", 1.0)),
                             seed=1, steps=32, num_envs=1)


@needs_vizdoom
def test_handlers_play_scrub_replay_export(agent_folder, monkeypatch):
    monkeypatch.setattr(service, "agent_dirs", lambda: [agent_folder, agent_folder / "user"])
    service._agents.clear()
    a, b = tab.agent_choices("defend_the_center")
    assert a["value"] == "t-vanilla" and b["value"] == "t-camal"
    labels = dict((value, label) for label, value in a["choices"])
    assert labels["t-vanilla"].startswith("vanilla PPO") and labels["t-camal"].startswith("CAMAL λ 1")
    menu = tab.map_choices("t-vanilla", "t-camal", "gradskip")  # a CNN agent: no ViT-only map is offered
    assert {name for _, name in menu["choices"]} == {"gradcam", "occlusion", "rise", "intgrad", "aha"}
    assert menu["value"] == "gradcam"
    records, slider, picture_a, picture_b, facts, figure, stop = tab.play("t-vanilla", "t-camal", 10_000_002, 6,
                                                                          "gradcam", "value")
    assert len(records) == 2 and slider["maximum"] == 5 and picture_a.shape == picture_b.shape == (240, 320, 3)
    assert "t-vanilla" in facts and "t-camal" in facts and "IoU of the Grad-CAM of V(s)" in facts
    assert stop["value"] == 5  # "To frame" within the episode
    picture_a2, _, facts2, _ = tab.scrub(records, 4, "occlusion", "action")
    assert "step 4" in facts2 and picture_a2.shape == (240, 320, 3)
    replayed = tab.load_record(tab.record_text(records), "gradcam", "value")
    assert replayed[0] == records
    with pytest.raises(gr.Error, match="not an episode record"):
        tab.load_record("not json", "gradcam", "value")
    path = tab.export(records, "gif", 0, 3, 1, "gradcam", "value")
    assert path.endswith("t-vanilla-vs-t-camal-seed10000002-gradcam-frames0-3.gif")
    with pytest.raises(gr.Error, match="Pick an agent"):
        tab.play(None, None, 1, 5, "gradcam", "value")


@needs_vizdoom
def test_training_job_runs_through_the_job_runner(tmp_path):
    services = Services(tmp_path / "jobs")
    runner = services.runner()
    try:
        job_id = runner.submit("agent-train", {"scenario": "defend_the_center", "name": "job-agent", "seed": 0,
                                               "lambda": 1.0, "steps": 64, "num_envs": 1, "rollout_steps": 64,
                                               "budget_s": 600})
        job = runner.wait(job_id, timeout=240)
        assert job["status"] == "done", open(job["log"]).read()[-2000:]
        report = job_panel.job_report(services, job_id)  # the one job panel's view of it
        assert report.finished and "done" in report.text and "job-agent" in report.text
        assert [trace["name"].split(" ")[0] for trace in report.figure.data] == ["return", "IoU"]
        assert len(report.figure.data[0]["x"]) >= 1
        assert report.percent == 100.0  # the bar reaches the end
        history = runner.history(job_id)
        assert history[0]["phase"] == "start" and any(p.get("phase") == "first-rollout" for p in history)
        steps = [p["step"] for p in history if "return_100" not in p and p.get("step")]
        assert steps and min(steps) < 64  # the bar moved during the rollout, before the update
        assert all(0 < p["budget_fraction"] < 1 for p in history[1:])
        assert "job-agent" in service.list_agents("defend_the_center")
        card = json.loads(service.card_file("job-agent").read_text())
        assert card["lambda"] == 1.0 and card["steps"] == 64
    finally:
        runner.shutdown()
