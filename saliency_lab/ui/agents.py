"""The Agents tab: where a deep-RL agent looks in ViZDoom, vanilla PPO against PPO + CAMAL on the critic.

Play an episode from a seed (or replay a record), scrub its frames: the frame with the chosen method's map of
V(s) (or of the chosen action's probability) and the outline of the mask of what matters, the value and the IoU
over time; a second agent on the same seed side by side; export GIF/MP4; launch a CAMAL training run as a job.
The handlers are plain functions (tests call them); `build` lays the tab out and wires them.
"""
from __future__ import annotations

import json
import logging
import tempfile

import gradio as gr

from saliency_lab import agents as service
from saliency_lab.ui.common import friendly
from saliency_lab.ui.jobs import JobPanel, api_names

TITLE = "Agents"
TAB_ID = "agents"
log = logging.getLogger(__name__)
NONE = "(none)"
EXPORT_DEFAULT_FRAMES = 100  # "To frame" after a play: the 100th frame, or the episode's last
TARGET_CHOICES = [("V(s), the critic's value", "value"), ("the chosen action's probability", "action")]
ABOUT = ("Each agent plays ViZDoom from the seed you give; the map shows which pixels drive its value V(s) (or its "
         "chosen action), the green outline marks what matters in the scenario (monsters, medkits) from the game's "
         "own labels. IoU: the map's top pixels (as many as the mask has) against the mask; higher is better.")



def status_text() -> str:
    state = service.status()
    return ABOUT if state["available"] else f"**ViZDoom is not installed here.** {state['message']}"


def agent_choices(scenario: str) -> tuple:
    names = service.list_agents(scenario) if service.status()["available"] else []
    first = next((n for n in names if "vanilla" in n), names[0] if names else None)
    second = next((n for n in names if "camal" in n), NONE)
    labelled = [(service.agent_label(n), n) for n in names]
    return gr.update(choices=labelled, value=first), gr.update(choices=[NONE, *labelled], value=second)


@friendly
def map_choices(agent_a: str, agent_b: str, method: str):
    """The map menu offers only the maps that run on the agent(s) picked."""
    names = [n for n in (agent_a, agent_b) if n and n != NONE]
    choices = service.method_choices(names)
    allowed = [name for _, name in choices]
    fallback = "gradcam" if "gradcam" in allowed else (allowed[0] if allowed else None)
    return gr.update(choices=choices, value=method if method in allowed else fallback)


def _map_label(method: str, target: str) -> str:
    label = dict((name, label) for label, name in service.method_choices()).get(method, method)
    return f"{label} of {'V(s)' if target == 'value' else 'the action'}"


def _episodes(records: list) -> list:
    return [service.play(r["agent"], r["seed"], r["max_steps"]) for r in records]


def _view(records: list, index: int, method: str, target: str) -> tuple:
    episodes = _episodes(records)
    pictures = [service.frame_picture(e, index, method, target) for e in episodes]
    lines = []
    for episode in episodes:
        facts = service.frame_facts(episode, index, method, target)
        iou = ("no relevant object in view" if facts["iou"] is None
               else f"IoU of the {_map_label(method, target)} {facts['iou']:.2f}")
        summary = service.episode_summary(episode)
        mean_iou = "n/a" if summary["mean_iou"] is None else f"{summary['mean_iou']:.2f}"
        lines.append(f"**{episode.agent}**: step {facts['step']}, V(s) {facts['value']:.3f}, {iou}; episode return "
                     f"{summary['return']:.0f} over {summary['steps']} steps, episode mean IoU of the Grad-CAM of "
                     f"V(s) {mean_iou}. {episode.note}")
        held = service.held_out_line(episode.agent)
        if held:
            lines[-1] += f" {held}"
    second = pictures[1] if len(pictures) > 1 else None
    return pictures[0], second, "\n\n".join(lines), service.timeline_figure(episodes, index)


@friendly
def play(agent_a: str, agent_b: str, seed, max_steps, method: str, target: str) -> tuple:
    """Play the agent(s) from the seed; returns (records, slider update, picture A, picture B, facts, timeline)."""
    if not agent_a:
        raise gr.Error("Pick an agent first (train one below if the list is empty).")
    names = [agent_a] + ([agent_b] if agent_b and agent_b != NONE else [])
    records = [service.play(n, int(seed), int(max_steps)).record() for n in names]
    length = min(e.length for e in _episodes(records))
    return (records, gr.update(maximum=max(length - 1, 1), value=0), *_view(records, 0, method, target),
            gr.update(value=min(EXPORT_DEFAULT_FRAMES, length) - 1))


@friendly
def scrub(records: list, index, method: str, target: str) -> tuple:
    if not records:
        return None, None, "Play an episode first.", None
    return _view(records, int(index), method, target)


@friendly
def load_record(text: str, method: str, target: str) -> tuple:
    """Replay the episode(s) of a record (one record or a list of two)."""
    try:
        parsed = json.loads(text or "")
    except ValueError:
        raise gr.Error("That is not an episode record (it needs an agent, a seed and max_steps).") from None
    records = [service.load_record(json.dumps(r)).record() for r in (parsed if isinstance(parsed, list) else [parsed])]
    length = min(e.length for e in _episodes(records))
    return (records, gr.update(maximum=max(length - 1, 1), value=0), *_view(records, 0, method, target))


def record_text(records: list) -> str:
    return json.dumps(records) if records else ""


@friendly
def export(records: list, fmt: str, start, stop, scale, method: str, target: str) -> str:
    if not records:
        raise gr.Error("Play an episode first.")
    folder = tempfile.mkdtemp(prefix="agents-export-")
    episodes = _episodes(records)
    name = service.export_name(episodes, method, int(start), int(stop), fmt)
    path = service.export_episode(episodes, f"{folder}/{name}", method=method, target=target,
                                  fmt=fmt, start=int(start), stop=int(stop) + 1, scale=int(scale))
    return str(path)


def start_training(services, scenario: str, name: str, seed, lam, budget_minutes) -> tuple:
    """(job id, message): a train-agent run through the one job runner."""
    from explainers.agents.checkpoint import check_name

    if not service.status()["available"]:
        raise gr.Error(service.status()["message"])
    check_name(name or "")
    params = {"scenario": scenario, "name": name, "seed": int(seed), "lambda": float(lam),
              "budget_s": float(budget_minutes) * 60}
    job_id = services.runner().submit("agent-train", params)
    return job_id, f"Job **{job_id}** started: {name} on {scenario}, lambda {float(lam):g}, {float(budget_minutes):g} min."


def build(ctx) -> dict:
    from explainers.agents.envs import SCENARIOS
    from explainers.agents.train import DEFAULT_LAMBDA

    services = ctx.services
    scenarios = list(SCENARIOS)
    gr.Markdown(status_text(), elem_id="agents-status")
    records = gr.State([])
    with gr.Row():
        scenario = gr.Dropdown(scenarios, value=scenarios[0], label="Scenario", elem_id="agents-scenario")
        first, second = agent_choices(scenarios[0])
        agent_a = gr.Dropdown(label="Agent", elem_id="agents-agent-a", **_choices(first))
        agent_b = gr.Dropdown(label="Side by side with", elem_id="agents-agent-b", **_choices(second))
        seed = gr.Number(10_000_000, precision=0, label="Episode seed", elem_id="agents-seed")
        max_steps = gr.Number(300, precision=0, minimum=1, maximum=service.EPISODE_CAP,
                              label=f"Steps at most (cap {service.EPISODE_CAP})", elem_id="agents-max-steps")
    with gr.Row():
        method = gr.Dropdown(service.method_choices([first["value"]] if first.get("value") else None),
                             value="gradcam", label="Map", elem_id="agents-method")
        target = gr.Radio(TARGET_CHOICES, value="value", label="Explain", elem_id="agents-target")
        play_button = gr.Button("Play", variant="primary", elem_id="agents-play")
    with gr.Row():
        picture_a = gr.Image(label="Agent", format="png", elem_id="agents-frame-a", interactive=False)
        picture_b = gr.Image(label="Side by side", format="png", elem_id="agents-frame-b", interactive=False)
    frame = gr.Slider(0, 1, value=0, step=1, label="Frame", elem_id="agents-frame")
    facts = gr.Markdown(elem_id="agents-facts")
    timeline = gr.Plot(label="Value and IoU over time", elem_id="agents-timeline")
    with gr.Accordion("Record, replay and export", open=False):
        record = gr.Textbox(label="Episode record (agent, seed, steps): paste one to replay it",
                            elem_id="agents-record")
        load_button = gr.Button("Replay the record", elem_id="agents-load")
        with gr.Row():
            fmt = gr.Radio(["gif", "mp4"], value="gif", label="Format")
            start = gr.Number(0, precision=0, label="From frame")
            stop = gr.Number(99, precision=0, label="To frame")
            scale = gr.Slider(1, 3, value=2, step=1, label="Scale")
        export_button = gr.Button("Export with the overlays", elem_id="agents-export")
        exported = gr.File(label="Export", elem_id="agents-export-file")
    with gr.Accordion("Train an agent with CAMAL (a job)", open=False):
        with gr.Row():
            train_scenario = gr.Dropdown(scenarios, value=scenarios[0], label="Scenario")
            train_name = gr.Textbox("my-camal-agent", label="Name (letters, digits, - and _)")
            train_seed = gr.Number(0, precision=0, label="Training seed")
            train_lambda = gr.Number(DEFAULT_LAMBDA, label="lambda (0 = vanilla PPO)")
            budget = gr.Number(10, label="Time budget (minutes)")
        panel = JobPanel(ctx, api=api_names("agent_train"), kind="agent-train",
                         ids={"start": "agents-train", "cancel": "agents-cancel", "status": "agents-job",
                              "progress": "agents-progress", "plot": "agents-curves", "pick": "agents-job-pick",
                              "resume": "agents-resume", "open": "agents-open"})
        panel.controls("Start training", "Return and IoU")
        panel.job_list("Agent training jobs on this server (all jobs: Masks & fine-tune tab)", short=True)

    def start_job(scenario, name, seed, lam, budget_minutes):
        return start_training(services, scenario, name, seed, lam, budget_minutes)

    view_outputs = [picture_a, picture_b, facts, timeline]
    scenario.change(agent_choices, [scenario], [agent_a, agent_b], **ctx.light)
    gr.on([agent_a.change, agent_b.change], map_choices, [agent_a, agent_b, method], [method], **ctx.light)
    play_button.click(play, [agent_a, agent_b, seed, max_steps, method, target],
                      [records, frame, *view_outputs, stop], **ctx.heavy).then(record_text, [records], [record])
    gr.on([frame.release, method.change, target.change], scrub, [records, frame, method, target], view_outputs,
          trigger_mode="always_last", **ctx.heavy)
    load_button.click(load_record, [record, method, target], [records, frame, *view_outputs], **ctx.heavy)
    export_button.click(export, [records, fmt, start, stop, scale, method, target], [exported], **ctx.heavy)
    panel.wire(start_job, [train_scenario, train_name, train_seed, train_lambda, budget], list_on_start=True,
               finished=[(panel.pick, lambda report: gr.update(choices=panel.choices()))])
    return {"agents_records": records}


def _choices(update: dict) -> dict:
    return {"choices": update.get("choices", []), "value": update.get("value")}
