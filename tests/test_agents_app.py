"""The Agents tab's service layer (saliency_lab.agents): play, maps, caps, export bounds, the training job kind."""
import json

import numpy as np
import pytest

from explainers.agents import envs

from conftest import train_tiny_agents

pytestmark = pytest.mark.skipif(not envs.vizdoom_available(), reason="ViZDoom is not installed")


@pytest.fixture(scope="module")
def agent_folder(tmp_path_factory):
    return train_tiny_agents(tmp_path_factory.mktemp("agents"), (("tiny-vanilla", 0.0), ("tiny-camal", 1.0)),
                             seed=2, steps=64, num_envs=2)


@pytest.fixture()
def service(agent_folder, monkeypatch):
    from saliency_lab import agents

    monkeypatch.setattr(agents, "agent_dirs", lambda: [agent_folder, agent_folder / "user"])
    agents._agents.clear()
    agents._episodes.clear()
    return agents


def test_list_play_and_pictures(service):
    assert set(service.list_agents("defend_the_center")) == {"tiny-vanilla", "tiny-camal"}
    assert service.list_agents("health_gathering") == []
    episode = service.play("tiny-camal", 10_000_003, max_steps=8)
    assert episode.length == 8 and episode.capped and "cut at 8 steps" in episode.note
    assert service.play("tiny-camal", 10_000_003, max_steps=8) is episode  # cached
    picture = service.frame_picture(episode, 3, "gradcam", scale=2)
    assert picture.shape == (240, 320, 3) and picture.dtype == np.uint8
    facts = service.frame_facts(episode, 3)
    assert facts["value"] == episode.values[3]
    if episode.masks[3].any():
        assert facts["iou"] == pytest.approx(episode.ious[3], abs=1e-6)
    occlusion = service.frame_map(episode, 3, "occlusion", "action")
    assert occlusion.shape == (60, 80)
    figure = service.timeline_figure([episode, service.play("tiny-vanilla", 10_000_003, max_steps=8)], 3)
    assert len(figure.data) == 4
    replay = service.load_record(json.dumps(episode.record()))
    assert replay is episode


def test_what_needs_no_model_is_drawn_beside_the_agents_figures(service, agent_folder):
    """An agent whose card has export-agent's `references`: grey lines at its IoU references on the episode plot's
    IoU axis, the scripts' returns on a training job's return axis (from the scenario's first agent with them),
    and its held-out return with the scripts' in the facts line; an agent without them gets none."""
    card_path = agent_folder / "tiny-camal.json"
    original = card_path.read_text()
    card = json.loads(original)
    card["held_out"] = {"mean_return": 8.2, "ci95": [7.9, 8.5], "episodes": 100}
    card["references"] = {"return": {"random": 0.32, "blind": 3.69}, "iou": {"random": 0.017, "ceiling": 0.51}}
    try:
        card_path.write_text(json.dumps(card))
        service._agents.clear()
        camal = service.play("tiny-camal", 10_000_004, max_steps=6)
        figure = service.timeline_figure([camal], 2)
        lines = {(shape["yref"], shape["y0"]) for shape in figure.layout["shapes"] if shape.get("xref") == "paper"}
        assert lines == {("y2", 0.017), ("y2", 0.51)}
        assert {note["text"] for note in figure.layout["annotations"]} == {"random map 0.02",
                                                                           "best any map can reach 0.51"}
        history = [{"step": 4096, "seconds": 90, "return": 1.5, "iou": 0.2}]
        training = service.training_curves(history, "defend_the_center")
        assert {shape["y0"] for shape in training.layout["shapes"] if shape["yref"] == "y"} == {0.32, 3.69}
        assert "random policy 0.3, blind script 3.7" in service.held_out_line("tiny-camal")
        assert {note["text"] for note in training.layout["annotations"]} == {"random policy 0.32",
                                                                             "blind script 3.69"}
        assert "8.2 [7.9, 8.5]" in service.held_out_line("tiny-camal")
        vanilla = service.play("tiny-vanilla", 10_000_004, max_steps=6)
        assert not [s for s in service.timeline_figure([vanilla], 2).layout["shapes"] if s.get("xref") == "paper"]
        assert service.held_out_line("tiny-vanilla") == ""
        assert service.training_curves(history).layout["shapes"] == []
    finally:
        card_path.write_text(original)
        service._agents.clear()


def test_caps_and_bad_input(service, monkeypatch):
    monkeypatch.setattr(service, "EPISODE_CAP", 12)
    episode = service.play("tiny-vanilla", 5, max_steps=10 ** 6)  # asked for more than the cap
    assert episode.length == 12 and episode.capped and "the cap is 12" in episode.note
    with pytest.raises(service.AgentsError, match="no agent called"):
        service.play("nobody", 1)
    with pytest.raises(service.AgentsError, match="seed"):
        service.play("tiny-vanilla", -1)
    with pytest.raises(service.AgentsError, match="not an episode record"):
        service.load_record("{oops")


def test_export_gif_mp4_and_size_bound(service, tmp_path, monkeypatch):
    pair = [service.play(name, 10_000_004, max_steps=6) for name in ("tiny-vanilla", "tiny-camal")]
    gif = service.export_episode(pair, tmp_path / "pair.gif", fmt="gif", scale=1)
    from PIL import Image

    with Image.open(gif) as image:
        assert image.n_frames == 6 and image.size == (320, 120)
    mp4 = service.export_episode(pair[:1], tmp_path / "one.mp4", fmt="mp4", scale=1)
    assert mp4.stat().st_size > 0
    monkeypatch.setattr(service, "EXPORT_MAX_FRAMES", 4)
    with pytest.raises(service.AgentsError, match="too large"):
        service.export_episode(pair, tmp_path / "big.gif")


def test_missing_vizdoom_says_how_to_install(service, monkeypatch):
    monkeypatch.setattr(service, "vizdoom_available", lambda: False)
    assert service.status() == {"available": False, "message": envs.INSTALL_HINT}
    with pytest.raises(service.AgentsError, match="pip install"):
        service.play("tiny-camal", 1)


def test_training_job_kind_rejects_unknown_settings(service):
    class Context:
        device = "cpu"

        def progress(self, *args, **kwargs):
            pass

        def cancelled(self):
            return False

    with pytest.raises(service.AgentsError, match="Unknown scenario"):
        service.agent_train_job({"scenario": "doom3", "name": "x"}, Context())
    with pytest.raises(service.AgentsError, match="Unknown settings"):
        service.agent_train_job({"scenario": "defend_the_center", "name": "x", "epochs": 3}, Context())


def test_training_percent_follows_steps_or_the_time_budget():
    from saliency_lab.agents import training_percent

    running = {"status": "running", "progress": {"step": 512, "total": 2048}}
    assert training_percent(running, []) == 25.0
    budgeted = {"status": "running", "progress": {"step": 512, "total": None}}
    assert training_percent(budgeted, [{"budget_fraction": 0.1}, {"budget_fraction": 0.4}]) == 40.0
    assert training_percent(budgeted, []) == 0.0
    assert training_percent({"status": "done", "progress": {"step": 3, "total": None}}, []) == 100.0
