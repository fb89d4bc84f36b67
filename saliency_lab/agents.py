"""The Agents tab's service layer (no Gradio): list agents, play an episode from a seed, the map of a method on a
frame with the mask outline, the value and IoU over time, side-by-side episodes, GIF/MP4 export with the overlays,
and the 'agent-train' job kind (a train-agent run through the app's job runner: progress, cancel, resume).

Agents: shipped ones in weights/agents/, the user's in <data>/models/agents/ (sub-folders, so the classifier
zoo never lists them). A recorded episode is its agent, seed and cap (JSON): ViZDoom and the seeded policy replay
it exactly, so nothing but those three numbers is stored.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from explainers.agents.envs import INSTALL_HINT, SCENARIOS, ScenarioError, vizdoom_available

from . import job_panel
from .jobs import register_job_kind

EPISODE_CAP = 600          # steps; longer episodes are cut (with a note)
EXPORT_MAX_FRAMES = 600    # frames in one GIF/MP4
EXPORT_MAX_PIXELS = 400 * 1024 * 1024  # frames x height x width: bounds the file and the memory to build it
_CACHE_SIZE = 6
_lock = threading.RLock()
_episodes: OrderedDict = OrderedDict()
_agents: dict = {}


class AgentsError(ValueError):
    """A plain sentence for the user."""


def status() -> dict:
    """{"available": bool, "message": how to install ViZDoom when it is missing}."""
    ok = vizdoom_available()
    return {"available": ok, "message": "" if ok else INSTALL_HINT}


def agent_dirs() -> list:
    """The agents' folders of the one card store (`explainers.models.card_folders("agents")`)."""
    from explainers.models import KIND_FOLDERS, card_folders

    return card_folders(KIND_FOLDERS["agent"])


def list_agents(scenario: str | None = None) -> list:
    """Names of the agent cards (kind "agent"), shipped first; only those of `scenario` when given."""
    from explainers.models import cards

    return [card.name for card in cards("agent", folders=agent_dirs())
            if scenario is None or card.data.get("scenario") == scenario]


def card_file(name: str) -> Path:
    from explainers.agents.checkpoint import check_name
    from explainers.models import find

    check_name(name)
    found = find("agent", name, folders=agent_dirs())
    if found is None:
        raise AgentsError(f"There is no agent called '{name}'.")
    return found.path


def load(name: str):
    """(network, card), cached."""
    from explainers.agents.checkpoint import load_agent

    with _lock:
        if name not in _agents:
            _agents[name] = load_agent(card_file(name))
        return _agents[name]


IOU_REFERENCES = {"random": "random map", "prior": "fixed prior map", "ceiling": "best any map can reach"}
RETURN_REFERENCES = {"random": "random policy", "blind": "blind script", "aimed": "mask-aimed script (privileged)"}
REFERENCE_STYLE = {"random": "dot", "prior": "dash", "ceiling": "longdash", "blind": "dash", "aimed": "longdash"}


def references(name: str) -> dict:
    """What needs no model beside an agent's figures, from its card (export-agent's `references`): the scripted
    policies' mean returns on its held-out episodes and the IoU of a random map, the fixed prior map and the grid's
    ceiling on its own frames; {} for an agent without them (one trained in the app)."""
    try:
        return load(name)[1].get("references") or {}
    except AgentsError:
        return {}


def scenario_references(scenario: str) -> dict:
    """The references of the first agent of `scenario` that has them (the shipped pair's): what a newly trained
    agent's return is compared with."""
    for name in list_agents(scenario):
        found = references(name)
        if found:
            return found
    return {}


def reference_lines(values: dict, axis: str, labels: dict) -> tuple:
    """(shapes, annotations): a thin grey horizontal line per reference value on `axis` ("y" or "y2"), named at
    its right end."""
    shapes, notes = [], []
    for key, value in values.items():
        if not isinstance(value, (int, float)):
            continue
        shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": axis, "y0": value, "y1": value,
                       "line": {"color": "#999", "width": 1, "dash": REFERENCE_STYLE.get(key, "dot")}})
        notes.append({"xref": "paper", "x": 1, "xanchor": "right", "yref": axis, "y": value, "yanchor": "bottom",
                      "text": f"{labels.get(key, key)} {value:.2f}", "showarrow": False,
                      "font": {"size": 10, "color": "#666"}})
    return shapes, notes


def held_out_line(name: str) -> str:
    """The agent's held-out return with its interval beside the scripts' on the same episodes, or ''."""
    try:
        card = load(name)[1]
    except AgentsError:
        return ""
    held = card.get("held_out")
    if not held:
        return ""
    line = (f"On {held['episodes']} held-out episodes this agent averages a return of {held['mean_return']:.1f} "
            f"[{held['ci95'][0]:.1f}, {held['ci95'][1]:.1f}]")
    scripts = (card.get("references") or {}).get("return") or {}
    if scripts:
        line += "; on the same episodes: " + ", ".join(f"{RETURN_REFERENCES.get(k, k)} {v:.1f}"
                                                     for k, v in scripts.items())
    return line + "."


@dataclass
class Episode:
    agent: str
    scenario: str
    seed: int
    frames: np.ndarray    # T x 3 x 60 x 80 uint8
    masks: np.ndarray     # T x 60 x 80 bool
    screens: np.ndarray   # T x 120 x 160 x 3 uint8 (what the player sees)
    values: list
    ious: list
    rewards: list
    actions: list
    capped: bool
    maps: dict = field(default_factory=dict)  # (method, target) -> {frame index: 60 x 80 map}

    @property
    def length(self) -> int:
        return len(self.values)

    @property
    def note(self) -> str:
        return (f"The episode was cut at {self.length} steps (the cap is {EPISODE_CAP})." if self.capped else "")

    def record(self) -> dict:
        """What replays this episode exactly."""
        return {"agent": self.agent, "scenario": self.scenario, "seed": self.seed, "max_steps": self.length
                if self.capped else EPISODE_CAP}


def play(name: str, seed: int, max_steps: int = EPISODE_CAP) -> Episode:
    """Play (or fetch from the cache) one episode of agent `name` from reset seed `seed`."""
    if not vizdoom_available():
        raise AgentsError(INSTALL_HINT)
    max_steps = int(max(1, min(int(max_steps), EPISODE_CAP)))
    seed = int(seed)
    if not 0 <= seed < 2 ** 31:
        raise AgentsError("The seed must be a whole number from 0 to 2147483647.")
    key = (name, seed, max_steps)
    with _lock:
        if key in _episodes:
            _episodes.move_to_end(key)
            return _episodes[key]
    from explainers.agents.evaluate import play_episode

    net, card = load(name)
    try:
        raw = play_episode(net, card["scenario"], seed, max_steps=max_steps, keep_frames=True, keep_screens=True)
    except ScenarioError as error:
        raise AgentsError(str(error)) from None
    episode = Episode(name, card["scenario"], seed, raw["frames"], raw["masks"], raw["screens"], raw["values"],
                      raw["ious"], raw["rewards"], raw["actions"], raw["capped"])
    episode.maps[("gradcam", "value")] = dict(enumerate(raw["cams"]))
    with _lock:
        _episodes[key] = episode
        while len(_episodes) > _CACHE_SIZE:
            _episodes.popitem(last=False)
    return episode


def load_record(text: str) -> Episode:
    """Replay an episode from its record (JSON text: agent, seed, max_steps)."""
    try:
        record = json.loads(text)
        return play(str(record["agent"]), int(record["seed"]), int(record.get("max_steps", EPISODE_CAP)))
    except (ValueError, KeyError, TypeError):
        raise AgentsError("That is not an episode record (it needs an agent, a seed and max_steps).") from None


def method_choices(names: list | None = None) -> list:
    """[(label, name)] for the map menu: the registry's methods an agent network takes
    (`explainers.agents.saliency.agent_method_choices`); with agent names, only those that run on every one of
    them (no ViT-only map for a CNN agent)."""
    from explainers.agents.saliency import agent_method_choices, agent_methods

    choices = agent_method_choices()
    if names:  # every map left runs on these agents: no "(ViT)" marker needed
        choices = [(label.removesuffix(" (ViT)"), name) for label, name in choices]
    for agent in names or []:
        allowed = set(agent_methods(load(agent)[0]))
        choices = [(label, name) for label, name in choices if name in allowed]
    return choices


def agent_label(name: str) -> str:
    """A menu label that tells the agents apart even when cut short on a phone: the arm first, then the name
    without its scenario prefix."""
    try:
        card = json.loads(card_file(name).read_text())
    except (OSError, ValueError, AgentsError):
        return name
    lam = float(card.get("lambda") or 0.0)
    ppo = card.get("ppo") or {}
    clip = ppo.get("camal_max_grad_norm")
    # with separate clips, the CAMAL step's clip sets its strength more than lambda does (docs/agents.md)
    own_clip = f", clip {clip:g}" if lam and clip is not None and clip != ppo.get("max_grad_norm") else ""
    arm = f"CAMAL λ {lam:g}{own_clip}" if lam else "vanilla PPO"
    short = name.removeprefix(f"{card.get('scenario', '')}-")
    return f"{arm} · {short}"


def export_name(episodes: list, method: str, start: int, stop: int, fmt: str) -> str:
    """agent(s), seed, map and frames: e.g. defend_the_center-vanilla-vs-...-seed10000000-gradcam-0-99.gif."""
    agents = "-vs-".join(episode.agent for episode in episodes)
    return f"{agents}-seed{episodes[0].seed}-{method}-frames{start}-{stop}.{fmt}"


def frame_map(episode: Episode, index: int, method: str = "gradcam", target: str = "value") -> np.ndarray:
    """The 60 x 80 map of `method` on frame `index` (computed once, then cached with the episode)."""
    from explainers.agents.saliency import explain_frames

    index = int(np.clip(index, 0, episode.length - 1))
    cached = episode.maps.setdefault((method, target), {})
    if index not in cached:
        net, _ = load(episode.agent)
        action = [episode.actions[index]] if target == "action" else None
        options = {"n_masks": 1000} if method == "rise" else {}
        cached[index] = explain_frames(net, episode.frames[index:index + 1], method, target=target, actions=action,
                                       options=options)[0].numpy()
    return cached[index]


def frame_iou(episode: Episode, index: int, method: str, target: str) -> float | None:
    from explainers.metrics import top_pixel_iou

    mask = episode.masks[index]
    if not mask.any():
        return None
    return float(top_pixel_iou(frame_map(episode, index, method, target)[None], mask[None])[0])


def outline(mask: np.ndarray) -> np.ndarray:
    """The mask's edge pixels."""
    padded = np.pad(mask, 1)
    interior = padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:]
    return mask & ~interior


def frame_picture(episode: Episode, index: int, method: str = "gradcam", target: str = "value",
                  scale: int = 2) -> np.ndarray:
    """The screen with the map as an overlay and the mask's outline (green), upscaled `scale` times."""
    import cv2

    from explainers.images import overlay

    index = int(np.clip(index, 0, episode.length - 1))
    screen = episode.screens[index]
    height, width = screen.shape[0] * scale, screen.shape[1] * scale
    big = cv2.resize(screen, (width, height), interpolation=cv2.INTER_NEAREST)
    heat = cv2.resize(frame_map(episode, index, method, target).astype(np.float32), (width, height),
                      interpolation=cv2.INTER_LINEAR)
    picture = np.asarray(overlay(big, heat, 0.45)).copy()
    mask = cv2.resize(episode.masks[index].astype(np.uint8), (width, height), interpolation=cv2.INTER_NEAREST) > 0
    picture[outline(mask)] = (0, 255, 0)
    return picture


def frame_facts(episode: Episode, index: int, method: str = "gradcam", target: str = "value") -> dict:
    index = int(np.clip(index, 0, episode.length - 1))
    return {"step": index, "value": episode.values[index], "iou": frame_iou(episode, index, method, target),
            "return_so_far": float(sum(episode.rewards[:index])), "action": episode.actions[index],
            "mask_pixels": int(episode.masks[index].sum())}


def episode_summary(episode: Episode) -> dict:
    ious = [value for value in episode.ious if value is not None]
    return {"agent": episode.agent, "seed": episode.seed, "steps": episode.length,
            "return": float(sum(episode.rewards)), "mean_iou": float(np.mean(ious)) if ious else None,
            "frames_with_mask": len(ious), "note": episode.note}


def timeline_figure(episodes: list, index: int):
    """V(s) over time (solid) and the Grad-CAM IoU per frame (dotted, right axis) of one or two episodes, with
    the current step marked and, in grey, the first agent's IoU reference points (random map, fixed prior map,
    the grid's ceiling) where its card has them."""
    from .figures import FigureSpec, axis_style, plot_layout

    data, colours = [], ("#0072B2", "#D55E00")
    for number, episode in enumerate(episodes):
        steps = list(range(episode.length))
        data.append({"type": "scatter", "mode": "lines", "x": steps, "y": episode.values,
                     "name": f"V(s) {episode.agent}", "line": {"color": colours[number % 2]}})
        data.append({"type": "scatter", "mode": "lines", "x": steps, "y": episode.ious, "yaxis": "y2",
                     "name": f"Grad-CAM IoU {episode.agent}", "line": {"color": colours[number % 2], "dash": "dot"}})
    shapes, notes = reference_lines((references(episodes[0].agent) if episodes else {}).get("iou") or {}, "y2",
                                    IOU_REFERENCES)
    layout = plot_layout("Value and IoU with the mask over the episode", 360,
                     xaxis=axis_style(title={"text": "step", "standoff": 4}), yaxis=axis_style(title={"text": "V(s)"}),
                     yaxis2=axis_style(title={"text": "IoU (Grad-CAM of V)"}, overlaying="y", side="right",
                                  range=[0, 1]),
                     shapes=[{"type": "line", "x0": index, "x1": index, "yref": "paper", "y0": 0, "y1": 1,
                              "line": {"color": "#888", "width": 1}}, *shapes], annotations=notes,
                     # under the axis title (at -0.25 it was drawn over it); four entries wrap on a phone
                     legend={"orientation": "h", "y": -0.22, "yanchor": "top", "font": {"size": 11}},
                     margin={"l": 50, "r": 50, "t": 50, "b": 100})
    return FigureSpec(data, layout)


def export_episode(episodes: list, path, *, method: str = "gradcam", target: str = "value", fmt: str = "gif",
                   start: int = 0, stop: int | None = None, scale: int = 2, fps: int = 12) -> Path:
    """The frames [start, stop) of one episode, or of two side by side, with the overlays, as a GIF or MP4."""
    if fmt not in ("gif", "mp4"):
        raise AgentsError("Export as 'gif' or 'mp4'.")
    length = min(episode.length for episode in episodes)
    stop = length if stop is None else min(int(stop), length)
    start = max(0, int(start))
    count = stop - start
    if count <= 0:
        raise AgentsError("There are no frames in that range to export.")
    height, width = episodes[0].screens.shape[1] * scale, episodes[0].screens.shape[2] * scale * len(episodes)
    if count > EXPORT_MAX_FRAMES or count * height * width > EXPORT_MAX_PIXELS:
        raise AgentsError(f"That export is too large ({count} frames of {width} x {height} pixels): the limit is "
                          f"{EXPORT_MAX_FRAMES} frames and {EXPORT_MAX_PIXELS // 2 ** 20} megapixels in all; "
                          "choose fewer frames or a smaller scale.")
    pictures = [np.concatenate([frame_picture(episode, index, method, target, scale) for episode in episodes],
                               axis=1) for index in range(start, stop)]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "gif":
        from PIL import Image

        # each frame quantised by the fast octree (PIL's default median cut took most of a minute for 77 frames)
        images = [Image.fromarray(picture).quantize(colors=255, method=Image.Quantize.FASTOCTREE)
                  for picture in pictures]
        images[0].save(path, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0,
                       optimize=False)
    else:
        import cv2

        writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
        for picture in pictures:
            writer.write(cv2.cvtColor(picture, cv2.COLOR_RGB2BGR))
        writer.release()
    return path


# ------------------------------------------------------------------------------------------ the training job
JOB_PARAMS = ("scenario", "name", "seed", "lambda", "budget_s", "steps", "arch", "num_envs", "rollout_steps")


@register_job_kind("agent-train")
def agent_train_job(params: dict, context) -> dict:
    """train-agent as a job: the agent is written to <data>/models/agents/NAME; its checkpoint lives there too,
    so a job resumed after a restart (or a new job with the same name) continues from it."""
    from explainers.agents.ppo import PPOConfig
    from explainers.agents.train import train_agent

    unknown = sorted(set(params) - set(JOB_PARAMS))
    if unknown:
        raise AgentsError(f"Unknown settings for an agent training run: {', '.join(unknown)}.")
    if params.get("scenario") not in SCENARIOS:
        raise AgentsError(f"Unknown scenario '{params.get('scenario')}'. Available: {', '.join(SCENARIOS)}.")
    out_dir = agent_dirs()[1]
    out_dir.mkdir(parents=True, exist_ok=True)
    device = getattr(context, "device", "cpu") or "cpu"
    summary = train_agent(scenario_name=params["scenario"], out_dir=out_dir, name=params["name"],
                          seed=int(params.get("seed", 0)), lam=float(params.get("lambda", 1.0)),
                          arch=params.get("arch", "cnn"), steps=params.get("steps"),
                          budget_s=params.get("budget_s"), device=device,
                          config=PPOConfig(num_envs=int(params.get("num_envs", 8)),
                                           rollout_steps=int(params.get("rollout_steps", 128))),
                          progress=context.progress, cancelled=context.cancelled)
    with _lock:
        _agents.pop(params["name"], None)
    return {k: v for k, v in summary.items() if k != "history"}


@job_panel.describes("agent-train")
def describe_job(services, job, history, report) -> job_panel.JobReport:
    """An 'agent-train' job in the one job panel: its return and IoU curves as they come (the plain progress
    line already has steps, elapsed, the ETA and the latest return and IoU), and where the agent went."""
    from dataclasses import replace

    params = job.get("params") or {}
    figure = (training_curves(history, params.get("scenario")) if any("seconds" in p for p in history)
              else report.figure)  # update rows
    text = report.text
    run = job_panel.this_run(history)
    if job["status"] == "running" and not any("seconds" in p for p in run):
        phase = next((p.get("phase") for p in reversed(run) if p.get("phase")), None)
        text += (" · playing the first rollout" if phase == "first-rollout" or (run and run[-1].get("step"))
                 else " · starting the game (ViZDoom takes up to a minute to start)")
    if job["status"] == "done":
        text += (f" · the agent **{params.get('name', '')}** is in the agent menus of its scenario "
                 f"({params.get('scenario', '')}).")
    return replace(report, text=text, figure=figure, percent=training_percent(job, run))


def training_percent(job, run) -> float:
    """Done: 100; running: the larger of the steps' share of the step cap and the time budget's share spent."""
    if job["status"] == "done":
        return 100.0
    progress = job.get("progress") or {}
    shares = [float(progress["step"] or 0) / float(progress["total"])] if progress.get("total") else []
    fractions = [p["budget_fraction"] for p in run if isinstance(p.get("budget_fraction"), (int, float))]
    shares += fractions[-1:]
    return round(100.0 * min(1.0, max(shares, default=0.0)), 1)


def training_curves(history: list, scenario: str | None = None):
    """Return and IoU of a training job's metric points (the job runner's history), as they come, with the
    scripted policies' returns on the scenario (grey lines) where a shipped agent's card has them."""
    from .figures import FigureSpec, axis_style, plot_layout

    def series(key):  # only the rows that carry it (progress rows inside a rollout carry neither)
        points = [(p.get("step"), p[key]) for p in history if isinstance(p.get(key), (int, float))]
        return {"x": [step for step, _ in points], "y": [value for _, value in points]}

    data = [{"type": "scatter", "mode": "lines+markers", "name": "return (episodes ended in the update)",
             **series("return")},
            {"type": "scatter", "mode": "lines+markers", "name": "IoU of V(s)-CAM with masks", "yaxis": "y2",
             **series("iou")}]
    shapes, notes = reference_lines((scenario_references(scenario) if scenario else {}).get("return") or {}, "y",
                                    RETURN_REFERENCES)
    layout = plot_layout("Training: return and IoU", 280, xaxis=axis_style(title={"text": "environment steps"}),
                     shapes=shapes, annotations=notes,
                     yaxis=axis_style(title={"text": "return"}),
                     yaxis2=axis_style(title={"text": "IoU"}, overlaying="y", side="right", range=[0, 1]),
                     legend={"orientation": "h", "y": -0.3})
    return FigureSpec(data, layout)
