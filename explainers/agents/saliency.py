"""The registry's saliency methods on an agent's frames, with V(s) or the chosen action's probability as target.

An agent becomes a model bundle (`agent_bundle`) whose "logits" are
- target "value": [V(s), 0]. Grad-CAM of class 0 is the Grad-CAM of V(s) itself; the methods that score the
  softmax probability (occlusion, RISE, AHA's per-image mode, the curves) see softmax([V, 0])[0] = sigmoid(V(s)),
  a monotone function of V(s), so their rankings of pixels are rankings by their effect on V(s);
- target "action": the policy's logits; class = the chosen action, score = its probability.
Frames enter as uint8 (3 x h x w, the network's frame size); the bundle takes [0, 1] images (mean 0, std 1/255 recovers the uint8 scale
the network expects). The CNN is family "cnn" (Grad-CAM, occlusion, RISE, AHA); the ViT is family "vit"
(also attention rollout, Chefer, GradSkip), its timm modules reached under the same names as a zoo ViT.

    maps = explain_frames(net, frames, "occlusion", target="value")   # B x h x w
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..engine import explain
from ..methods import METHODS, available_methods, ordered
from ..models import ModelBundle
from .networks import frame_hw_of

TARGETS = ("value", "action")
AGENT_FAMILIES = frozenset({"cnn", "vit"})  # agent_bundle's families: the CNN agent and the ViT agent


class AgentScores(nn.Module):
    """The actor-critic seen as a classifier: [V, 0] (target "value") or the action logits ("action")."""

    def __init__(self, net: nn.Module, target: str):
        super().__init__()
        if target not in TARGETS:
            raise ValueError(f"Unknown target '{target}': choose {' or '.join(TARGETS)}")
        self.net, self.target = net, target
        vit = getattr(net, "vit", None)
        if vit is not None:  # the ViT methods look for timm's attributes on the bundle's network
            self.blocks, self.patch_embed = vit.blocks, vit.patch_embed
            self.num_prefix_tokens, self.cls_token = 0, None

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        logits, values = self.net(frames)
        if self.target == "action":
            return logits
        return torch.stack([values, torch.zeros_like(values)], dim=1)


def agent_bundle(net: nn.Module, target: str = "value", name: str = "agent") -> ModelBundle:
    network = AgentScores(net.eval(), target)
    is_vit = hasattr(net, "vit")
    classes = ["V(s)", "0"] if target == "value" else [f"action {i}" for i in range(net.arch["num_actions"])]
    cam_layer = net.cam_layer_name.removeprefix("vit.") if is_vit else f"net.{net.cam_layer_name}"
    return ModelBundle(name=name, network=network, mean=(0.0, 0.0, 0.0), std=(1 / 255,) * 3,
                       input_size=frame_hw_of(net), class_names=classes,
                       family="vit" if is_vit else "cnn", reference_color=(0.0, 0.0, 0.0),
                       cam_layer_name=cam_layer, card={"kind": "agent"})


def agent_methods(net: nn.Module) -> list:
    """The registry's methods that apply to this agent (menu order), without baselines (the random map)."""
    bundle = agent_bundle(net)
    return [name for name in ordered(available_methods(bundle)) if not METHODS[name].baseline]


def agent_method_choices() -> list:
    """[(label, name)] of the registry's methods that some agent network takes (`AGENT_FAMILIES`), in menu order,
    without baselines: the Agents tab's menu, so a new method file shows up there too. A method only the ViT agent
    takes is marked "(ViT)"; labels as for a model with nothing trained for it (`label_for(None)`: AHA per image)."""
    choices = []
    for name in ordered(METHODS):
        cls = METHODS[name]
        if cls.baseline or not cls.families & AGENT_FAMILIES:
            continue
        choices.append((cls.label_for(None) + ("" if "cnn" in cls.families else " (ViT)"), name))
    return choices


def explain_frames(net: nn.Module, frames, method: str, *, target: str = "value", actions=None,
                   options: dict | None = None) -> torch.Tensor:
    """B x h x w maps of one registry method for uint8 frames (B x 3 x h x w)."""
    frames = torch.as_tensor(frames)
    device = next(net.parameters()).device
    images = frames.to(device).float() / 255.0
    bundle = agent_bundle(net, target)
    if target == "action":
        if actions is None:
            with torch.no_grad():
                actions = net(frames.to(device))[0].argmax(dim=1)
        targets = torch.as_tensor(actions).view(-1)
    else:
        targets = torch.zeros(frames.shape[0], dtype=torch.long)
    maps = explain(bundle, images, targets.to(device), method, **(options or {}))
    return maps.detach().float().cpu()
