"""Actor-critic networks for 3 x h x w uint8 frames (`frame_hw`, default 60 x 80), and the Grad-CAM of the critic's
value V(s). Every network records its frame size in `net.arch["frame_hw"]` (the card's, the masks' and the maps').

`ActorCriticCNN` (default): a shared convolutional trunk (3 convolutions, the last one `cam` at a quarter of the
frame, 15 x 20 for 60 x 80, is the CAM layer), a narrow strided convolution and a linear layer (128), then a policy
head (action logits) and a value head V(s).
`ActorCriticNature`: the Nature-DQN trunk that stable-baselines3's `CnnPolicy` uses (8x8/4, 4x4/2, 3x3/1
convolutions of 32, 64, 64 channels, the last one `cam` is the CAM layer, 9 x 16 for a 100 x 156 frame; then a
linear layer of 512), shared by the policy and value heads, orthogonally initialised like stable-baselines3.
`ActorCriticViT`: a small timm vision transformer (patch 10 -> 6 x 8 tokens, 4 blocks of width 96) with the same
heads; its CAM layer is the last block's first norm's patch tokens, reshaped to the grid (as in the zoo's ViTs).

`value_cam(net, frames)`: the Grad-CAM of V(s), batch-level: ONE gradient of sum_b V_b with respect to the CAM
layer's activations (samples never interact: no batch norm, no dropout), optionally differentiable
(create_graph) so that CAMAL trains through it. Maps are normalised by their maximum and upsampled to the frame.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .envs import FRAME_HW

ARCHITECTURES = ("cnn", "nature", "vit")


class ActorCriticCNN(nn.Module):
    cam_layer_name = "cam"

    def __init__(self, num_actions: int, width: int = 32, hidden: int = 128, frame_hw=FRAME_HW):
        super().__init__()
        frame_hw = tuple(int(v) for v in frame_hw)
        self.frame_hw = frame_hw
        self.arch = {"arch": "cnn", "num_actions": num_actions, "width": width, "hidden": hidden,
                     "frame_hw": list(frame_hw)}
        head_hw = [_strided(_strided(_strided(n, 5, 2, 2), 3, 2, 1), 3, 2, 1) for n in frame_hw]
        self.stem = nn.Sequential(nn.Conv2d(3, width, 5, stride=2, padding=2), nn.ReLU(),
                                  nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.ReLU())
        self.cam = nn.Sequential(nn.Conv2d(2 * width, 2 * width, 3, padding=1), nn.ReLU())  # 15 x 20
        # a narrow strided convolution keeps the linear layer (and the checkpoint: about 1 MB) small
        self.head = nn.Sequential(nn.Conv2d(2 * width, width // 2, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(),
                                  nn.Linear(width // 2 * head_hw[0] * head_hw[1], hidden), nn.ReLU())
        self.policy = nn.Linear(hidden, num_actions)
        self.value = nn.Linear(hidden, 1)
        nn.init.orthogonal_(self.policy.weight, 0.01)
        nn.init.zeros_(self.policy.bias)

    def features(self, frames: torch.Tensor) -> torch.Tensor:
        return self.cam(self.stem(frames.float() / 255.0))

    def heads(self, features: torch.Tensor) -> tuple:
        hidden = self.head(features)
        return self.policy(hidden), self.value(hidden).squeeze(-1)

    def forward(self, frames: torch.Tensor, return_features: bool = False):
        features = self.features(frames)
        logits, value = self.heads(features)
        return (logits, value, features) if return_features else (logits, value)

    def features_to_grid(self, features: torch.Tensor) -> torch.Tensor:
        return features


def _strided(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


class ActorCriticNature(ActorCriticCNN):
    """stable-baselines3's `CnnPolicy` network (NatureCNN features, shared) with the same interface."""

    def __init__(self, num_actions: int, hidden: int = 512, frame_hw=FRAME_HW):
        nn.Module.__init__(self)
        frame_hw = tuple(int(v) for v in frame_hw)
        self.frame_hw = frame_hw
        self.arch = {"arch": "nature", "num_actions": num_actions, "hidden": hidden, "frame_hw": list(frame_hw)}
        grid = [_strided(_strided(_strided(n, 8, 4, 0), 4, 2, 0), 3, 1, 0) for n in frame_hw]
        if min(grid) < 1:
            raise ValueError("The frame is too small for this network (at least 36 x 36 pixels).")
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU())
        self.cam = nn.Sequential(nn.Conv2d(64, 64, 3, stride=1), nn.ReLU())
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(64 * grid[0] * grid[1], hidden), nn.ReLU())
        self.policy = nn.Linear(hidden, num_actions)
        self.value = nn.Linear(hidden, 1)
        for module in [*self.stem, *self.cam, *self.head]:
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.orthogonal_(module.weight, 2 ** 0.5)
                nn.init.zeros_(module.bias)
        nn.init.orthogonal_(self.policy.weight, 0.01)
        nn.init.zeros_(self.policy.bias)
        nn.init.orthogonal_(self.value.weight, 1.0)
        nn.init.zeros_(self.value.bias)


class ActorCriticViT(nn.Module):
    """A small timm ViT (no class token, mean-pooled tokens) with the same heads; timm's module names and
    attributes (`blocks`, `patch_embed`, `num_prefix_tokens`) let the registry's ViT methods (rollout, GradSkip)
    explain it. Fused attention is off: CAMAL needs a double backward, which the fused kernels lack."""
    cam_layer_name = "vit.blocks.3.norm1"
    patch = 10

    def __init__(self, num_actions: int, dim: int = 96, depth: int = 4, heads: int = 3, hidden: int = 128,
                 frame_hw=FRAME_HW):
        super().__init__()
        from timm.models.vision_transformer import VisionTransformer

        frame_hw = tuple(int(v) for v in frame_hw)
        self.frame_hw = frame_hw
        self.arch = {"arch": "vit", "num_actions": num_actions, "dim": dim, "depth": depth, "heads": heads,
                     "hidden": hidden, "frame_hw": list(frame_hw)}
        self.cam_layer_name = f"vit.blocks.{depth - 1}.norm1"
        self.grid = (frame_hw[0] // self.patch, frame_hw[1] // self.patch)
        self.vit = VisionTransformer(img_size=frame_hw, patch_size=self.patch, embed_dim=dim, depth=depth,
                                     num_heads=heads, mlp_ratio=2.0, num_classes=0, class_token=False,
                                     global_pool="avg")
        for module in self.vit.modules():
            if hasattr(module, "fused_attn"):
                module.fused_attn = False
        self.hidden = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU())
        self.policy = nn.Linear(hidden, num_actions)
        self.value = nn.Linear(hidden, 1)
        nn.init.orthogonal_(self.policy.weight, 0.01)
        nn.init.zeros_(self.policy.bias)

    def forward(self, frames: torch.Tensor, return_features: bool = False):
        captured = {}
        handle = self.get_submodule(self.cam_layer_name).register_forward_hook(
            lambda _m, _i, output: captured.__setitem__("tokens", output))
        try:
            pooled = self.vit(frames.float() / 255.0)
        finally:
            handle.remove()
        hidden = self.hidden(pooled)
        logits, value = self.policy(hidden), self.value(hidden).squeeze(-1)
        return (logits, value, captured["tokens"]) if return_features else (logits, value)

    def features_to_grid(self, features: torch.Tensor) -> torch.Tensor:
        """B x N x D tokens -> B x D x h x w."""
        return features.transpose(1, 2).reshape(features.shape[0], -1, *self.grid)


def build_network(arch: str, num_actions: int, hud: bool = False, **kwargs) -> nn.Module:
    """`hud`: the network reads frames with Doom's status bar drawn (ammo, health; the view above it shrinks):
    recorded in `net.arch` (only when on, so agents saved before it load unchanged) for the envs to follow."""
    classes = {"cnn": ActorCriticCNN, "nature": ActorCriticNature, "vit": ActorCriticViT}
    if arch not in classes:
        raise ValueError(f"Unknown architecture '{arch}'. Available: {', '.join(ARCHITECTURES)}.")
    net = classes[arch](num_actions, **kwargs)
    if hud:
        net.hud = True
        net.arch = {**net.arch, "hud": True}
    return net


def frame_hw_of(net: nn.Module) -> tuple:
    """The frame size the network reads (agents saved before the size was recorded read 60 x 80)."""
    return tuple(getattr(net, "frame_hw", FRAME_HW))


def hud_of(net: nn.Module) -> bool:
    """Whether the network reads frames with the status bar drawn (`build_network(..., hud=True)`)."""
    return bool(getattr(net, "hud", False))


def network_from_arch(arch: dict) -> nn.Module:
    options = dict(arch)
    return build_network(options.pop("arch"), options.pop("num_actions"), **options)


def cams_from(net: nn.Module, features: torch.Tensor, gradients: torch.Tensor, *,
              detach_weights: bool = False, at_grid: bool = False) -> torch.Tensor:
    """Grad-CAM from the CAM layer's activations and the gradients of the target, max-normalised: B x h x w at the
    network's frame size (upsampled, then divided by its maximum: the maps shown and scored), or with `at_grid` B x h x w at the CAM
    layer's own grid, divided by its maximum (what CAMAL's term reads: see `ppo.camal_term`)."""
    activations = net.features_to_grid(features)
    weights = net.features_to_grid(gradients).mean(dim=(2, 3), keepdim=True)
    if detach_weights:
        weights = weights.detach()
    cams = F.relu((weights * activations).sum(dim=1, keepdim=True))
    if not at_grid:
        cams = F.interpolate(cams, size=frame_hw_of(net), mode="bilinear", align_corners=False)
    cams = cams.squeeze(1)
    return cams / cams.flatten(1).amax(dim=1).clamp_min(1e-8).view(-1, 1, 1)


def value_cam(net: nn.Module, frames: torch.Tensor, *, differentiable: bool = False,
              detach_weights: bool = False, at_grid: bool = False) -> tuple:
    """(cams, logits, values) from one forward pass and ONE backward of sum_b V_b (batch-level); cams B x h x w,
    or B x h x w at the CAM layer's grid with `at_grid`."""
    with torch.enable_grad():
        logits, values, features = net(frames, return_features=True)
        if not features.requires_grad:  # frozen network: still differentiate V with respect to the features
            features = features.detach().requires_grad_(True)
            logits, values = _heads_from(net, frames, features)
        # detached weights need no second-order graph (the cheaper CAMAL mode): the map stays differentiable
        # through the activations alone
        (gradients,) = torch.autograd.grad(values.sum(), features,
                                           create_graph=differentiable and not detach_weights, retain_graph=True)
    cams = cams_from(net, features if differentiable else features.detach(), gradients,
                     detach_weights=detach_weights, at_grid=at_grid)
    return cams, logits, values


def _heads_from(net, frames, features):
    if isinstance(net, ActorCriticCNN):
        return net.heads(features)
    raise ValueError("a frozen ViT needs gradients enabled on its parameters to take its CAM")


def value_cam_per_sample(net: nn.Module, frames: torch.Tensor) -> torch.Tensor:
    """The same maps with one backward pass per frame (the O(B) baseline the batch-level CAM replaces)."""
    return torch.cat([value_cam(net, frames[i:i + 1])[0] for i in range(frames.shape[0])])
