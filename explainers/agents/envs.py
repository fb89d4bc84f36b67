"""ViZDoom scenarios through ViZDoom's Gymnasium interface, with a mask of what matters in every frame.

Each scenario declares its Gymnasium id, a reward scale (the critic's targets stay near unit size) and its mask rule:
the labelled objects that matter (`state.labels` names each object; the labels buffer gives its pixels). A frame is
the RGB screen downscaled to the network's frame size `frame_hw` (height x width, area interpolation; default
FRAME_HW = 60x80 from the 160x120 screen, larger frames from the 320x240 screen), one frame per observation (no
stacking); `hud=True` draws Doom's status bar, whose ammo count the game otherwise hides. The mask is computed at
the same size: a network pixel is inside when at least MASK_COVERAGE = 1/4 of its source pixels belong to a
relevant object. Actions repeat for FRAME_SKIP = 4 tics.

    env = make_env("defend_the_center", seed=3)
    frame, mask = env.reset(seed=3)          # uint8 3 x 60 x 80, bool 60 x 80 (make_env(..., frame_hw=(100, 156)))
    frame, mask, reward, done, info = env.step(action)
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np

FRAME_HW = (60, 80)
FRAME_SKIP = 4
MASK_COVERAGE = 0.25
SOURCE_RESOLUTION = "RES_160X120"
LARGE_SOURCE_RESOLUTION = "RES_320X240"


def source_resolution(frame_hw) -> str:
    """The screen a frame is cut from: 160x120 for frames up to 60x80 (at least 2x2 source pixels per frame
    pixel), 320x240 for larger ones."""
    return SOURCE_RESOLUTION if frame_hw[0] <= 60 and frame_hw[1] <= 80 else LARGE_SOURCE_RESOLUTION


def check_frame_hw(frame_hw) -> tuple:
    frame_hw = tuple(int(v) for v in frame_hw)
    if len(frame_hw) != 2 or not (16 <= frame_hw[0] <= 240 and 16 <= frame_hw[1] <= 320):
        raise ScenarioError("The frame size must be two numbers, height 16-240 and width 16-320.")
    return frame_hw


@dataclass(frozen=True)
class Scenario:
    name: str
    gym_id: str
    relevant: tuple  # labelled object names that matter (the mask rule)
    reward_scale: float
    what_matters: str


SCENARIOS = {
    "defend_the_center": Scenario(
        "defend_the_center", "VizdoomDefendCenter-v1", ("MarineChainsawVzd", "Demon"), 1.0,
        "the monsters (chainsaw marines and demons) closing in from every side"),
    "health_gathering": Scenario(
        "health_gathering", "VizdoomHealthGathering-v1", ("Medikit",), 0.01,
        "the medkits on the acid floor"),
}

INSTALL_HINT = ("ViZDoom is not installed. Install the agents extra: pip install 'saliency-lab[agents]' "
                "(or pip install vizdoom gymnasium).")


class ScenarioError(ValueError):
    """An unknown scenario or a missing ViZDoom: the message is a plain sentence for the user."""


def scenario(name: str) -> Scenario:
    if name not in SCENARIOS:
        raise ScenarioError(f"Unknown scenario '{name}'. Available: {', '.join(SCENARIOS)}.")
    return SCENARIOS[name]


def vizdoom_available() -> bool:
    try:
        importlib.import_module("vizdoom")
        _allow_headless_wrapper()
        importlib.import_module("vizdoom.gymnasium_wrapper")  # registers the Gymnasium ids
    except ImportError:
        return False
    return True


def _allow_headless_wrapper() -> None:
    """ViZDoom's Gymnasium wrapper imports pygame at the top but uses it only to draw a window (render_mode
    "human", never used here): without pygame an empty module stands in, so a headless machine needs no pygame."""
    import importlib.util
    import sys
    import types

    if "pygame" not in sys.modules and importlib.util.find_spec("pygame") is None:
        sys.modules["pygame"] = types.ModuleType("pygame")


def downscale(screen: np.ndarray, frame_hw=FRAME_HW) -> np.ndarray:
    """H x W x 3 uint8 -> 3 x h x w uint8 (area interpolation)."""
    import cv2

    small = cv2.resize(screen, tuple(frame_hw)[::-1], interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(small.transpose(2, 0, 1))


def relevant_mask(labels_buffer: np.ndarray, labels, relevant: tuple, frame_hw=FRAME_HW) -> np.ndarray:
    """The mask rule at the network's resolution: pixels of the labelled objects named in `relevant`.

    `labels`: objects with `.value` (their id in the buffer) and `.object_name`."""
    import cv2

    values = [label.value for label in labels if label.object_name in relevant]
    full = np.isin(labels_buffer, values).astype(np.float32) if values else \
        np.zeros(labels_buffer.shape, np.float32)
    coverage = cv2.resize(full, tuple(frame_hw)[::-1], interpolation=cv2.INTER_AREA)
    return coverage >= MASK_COVERAGE


class DoomEnv:
    """One ViZDoom scenario (Gymnasium env, discrete actions) giving (frame, mask) observations."""

    def __init__(self, name: str, *, keep_screen: bool = False, frame_hw=FRAME_HW, hud: bool = False):
        self.scenario = scenario(name)
        self.frame_hw = check_frame_hw(frame_hw)
        if not vizdoom_available():
            raise ScenarioError(INSTALL_HINT)
        import gymnasium as gym

        self.env = gym.make(self.scenario.gym_id, frame_skip=FRAME_SKIP, labels_buffer_enabled=True,
                            screen_resolution=source_resolution(self.frame_hw))
        # the status bar (ammo, health) drawn or not: the scenarios' configs leave it off; a render setting
        # ViZDoom takes after the game has started
        self.hud = bool(hud)
        self.env.unwrapped.game.set_render_hud(self.hud)
        self.num_actions = int(self.env.action_space.n)
        self.keep_screen = keep_screen  # the app shows the full-resolution screen
        self.screen = None
        self.episode_return = 0.0
        self.episode_length = 0

    def _observe(self, observation):
        game_state = self.env.unwrapped.state
        if game_state is None:  # terminal step: no state, a blank frame stands in (never learned from)
            return np.zeros((3, *self.frame_hw), np.uint8), np.zeros(self.frame_hw, bool)
        if self.keep_screen:
            self.screen = observation["screen"].copy()
        mask = relevant_mask(game_state.labels_buffer, game_state.labels, self.scenario.relevant, self.frame_hw)
        return downscale(observation["screen"], self.frame_hw), mask

    def reset(self, seed: int | None = None):
        observation, _ = self.env.reset(seed=seed)
        self.episode_return, self.episode_length = 0.0, 0
        return self._observe(observation)

    def step(self, action: int):
        observation, reward, terminated, truncated, _ = self.env.step(int(action))
        self.episode_return += float(reward)
        self.episode_length += 1
        frame, mask = self._observe(observation)
        info = {"return": self.episode_return, "length": self.episode_length, "truncated": bool(truncated)}
        return frame, mask, float(reward) * self.scenario.reward_scale, bool(terminated or truncated), info

    def close(self):
        self.env.close()


def make_env(name: str, **kwargs) -> DoomEnv:
    return DoomEnv(name, **kwargs)


class VecEnv:
    """N environments stepped in turn in this process; a finished episode restarts at once (its final return and
    length are reported in `infos`). Env i starts from reset seed `seed + i`; later episodes draw their game seeds
    from the env's own generator (Gymnasium's convention), so a run is reproducible from its seed."""

    def __init__(self, name: str, num_envs: int, seed: int, frame_hw=FRAME_HW, hud: bool = False):
        self.envs = [make_env(name, frame_hw=frame_hw, hud=hud) for _ in range(num_envs)]
        self.num_actions = self.envs[0].num_actions
        self.seed = seed

    def reset(self):
        pairs = [env.reset(seed=self.seed + i) for i, env in enumerate(self.envs)]
        return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])

    def step(self, actions):
        frames, masks, rewards, dones, finished = [], [], [], [], []
        for env, action in zip(self.envs, actions):
            frame, mask, reward, done, info = env.step(action)
            if done:
                finished.append({"return": info["return"], "length": info["length"]})
                frame, mask = env.reset()
            frames.append(frame)
            masks.append(mask)
            rewards.append(reward)
            dones.append(done)
        return (np.stack(frames), np.stack(masks), np.array(rewards, np.float32), np.array(dones, bool), finished)

    def close(self):
        for env in self.envs:
            env.close()
