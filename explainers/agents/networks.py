"""Actor-critic networks for 3 x 60 x 80 uint8 frames, and the Grad-CAM of the critic's value V(s).

`ActorCriticCNN` (default): a shared convolutional trunk (3 convolutions, the last one `cam` at 15 x 20 is the
CAM layer), a narrow strided convolution and a linear layer (128), then a policy head (action logits) and a value head V(s).
`ActorCriticViT`: a small vision transformer (patch 10 -> 6 x 8 tokens, 4 blocks of width 96, written-out attention) with the same
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

ARCHITECTURES = ("cnn", "vit")


class ActorCriticCNN(nn.Module):
    cam_layer_name = "cam"

    def __init__(self, num_actions: int, width: int = 32, hidden: int = 128):
        super().__init__()
        self.arch = {"arch": "cnn", "num_actions": num_actions, "width": width, "hidden": hidden}
        self.stem = nn.Sequential(nn.Conv2d(3, width, 5, stride=2, padding=2), nn.ReLU(),
                                  nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.ReLU())
        self.cam = nn.Sequential(nn.Conv2d(2 * width, 2 * width, 3, padding=1), nn.ReLU())  # 15 x 20
        # a narrow strided convolution keeps the linear layer (and the checkpoint: about 1 MB) small
        self.head = nn.Sequential(nn.Conv2d(2 * width, width // 2, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(),
                                  nn.Linear(width // 2 * 8 * 10, hidden), nn.ReLU())
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


class ActorCriticViT(nn.Module):
    cam_layer_name = "blocks.3.norm1"
    patch = 10

    def __init__(self, num_actions: int, dim: int = 96, depth: int = 4, heads: int = 3, hidden: int = 256):
        super().__init__()
        self.arch = {"arch": "vit", "num_actions": num_actions, "dim": dim, "depth": depth, "heads": heads,
                     "hidden": hidden}
        self.grid = (FRAME_HW[0] // self.patch, FRAME_HW[1] // self.patch)
        self.embed = nn.Conv2d(3, dim, self.patch, stride=self.patch)
        self.position = nn.Parameter(torch.zeros(1, self.grid[0] * self.grid[1], dim))
        nn.init.trunc_normal_(self.position, std=0.02)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.hidden = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU())
        self.policy = nn.Linear(hidden, num_actions)
        self.value = nn.Linear(hidden, 1)
        nn.init.orthogonal_(self.policy.weight, 0.01)
        nn.init.zeros_(self.policy.bias)

    def forward(self, frames: torch.Tensor, return_features: bool = False):
        tokens = self.embed(frames.float() / 255.0).flatten(2).transpose(1, 2) + self.position
        captured = None
        for index, block in enumerate(self.blocks):
            tokens, normed = block(tokens)
            if index == len(self.blocks) - 1:
                captured = normed
        hidden = self.hidden(self.norm(tokens).mean(dim=1))
        logits, value = self.policy(hidden), self.value(hidden).squeeze(-1)
        return (logits, value, captured) if return_features else (logits, value)

    def features_to_grid(self, features: torch.Tensor) -> torch.Tensor:
        """B x N x D tokens -> B x D x h x w."""
        return features.transpose(1, 2).reshape(features.shape[0], -1, *self.grid)


class Block(nn.Module):
    """Pre-norm transformer block; returns (tokens, the first norm's output: the ViT's CAM layer)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, tokens: torch.Tensor) -> tuple:
        normed = self.norm1(tokens)
        tokens = tokens + self.attn(normed)
        return tokens + self.mlp(self.norm2(tokens)), normed


class Attention(nn.Module):
    """Multi-head self-attention written out (the fused kernels have no double backward, which CAMAL needs);
    keeps its last attention weights in `last_weights` (B x heads x N x N) for attention rollout."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.last_weights = None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        b, n, d = tokens.shape
        q, k, v = self.qkv(tokens).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        weights = (q @ k.transpose(-2, -1) * (d // self.heads) ** -0.5).softmax(dim=-1)
        self.last_weights = weights.detach()
        return self.proj((weights @ v).transpose(1, 2).reshape(b, n, d))


def build_network(arch: str, num_actions: int, **kwargs) -> nn.Module:
    if arch == "cnn":
        return ActorCriticCNN(num_actions, **kwargs)
    if arch == "vit":
        return ActorCriticViT(num_actions, **kwargs)
    raise ValueError(f"Unknown architecture '{arch}'. Available: {', '.join(ARCHITECTURES)}.")


def network_from_arch(arch: dict) -> nn.Module:
    options = dict(arch)
    return build_network(options.pop("arch"), options.pop("num_actions"), **options)


def cams_from(net: nn.Module, features: torch.Tensor, gradients: torch.Tensor, *,
              detach_weights: bool = False) -> torch.Tensor:
    """Grad-CAM from the CAM layer's activations and the gradients of the target: B x 60 x 80, max-normalised."""
    activations = net.features_to_grid(features)
    weights = net.features_to_grid(gradients).mean(dim=(2, 3), keepdim=True)
    if detach_weights:
        weights = weights.detach()
    cams = F.relu((weights * activations).sum(dim=1, keepdim=True))
    cams = F.interpolate(cams, size=FRAME_HW, mode="bilinear", align_corners=False).squeeze(1)
    return cams / cams.flatten(1).amax(dim=1).clamp_min(1e-8).view(-1, 1, 1)


def value_cam(net: nn.Module, frames: torch.Tensor, *, differentiable: bool = False,
              detach_weights: bool = False) -> tuple:
    """(cams B x 60 x 80, logits, values) from one forward pass and ONE backward of sum_b V_b (batch-level)."""
    with torch.enable_grad():
        logits, values, features = net(frames, return_features=True)
        if not features.requires_grad:  # frozen network: still differentiate V with respect to the features
            features = features.detach().requires_grad_(True)
            logits, values = _heads_from(net, frames, features)
        (gradients,) = torch.autograd.grad(values.sum(), features, create_graph=differentiable,
                                           retain_graph=True)
    cams = cams_from(net, features if differentiable else features.detach(), gradients,
                     detach_weights=detach_weights)
    return cams, logits, values


def _heads_from(net, frames, features):
    if isinstance(net, ActorCriticCNN):
        return net.heads(features)
    raise ValueError("a frozen ViT needs gradients enabled on its parameters to take its CAM")


def value_cam_per_sample(net: nn.Module, frames: torch.Tensor) -> torch.Tensor:
    """The same maps with one backward pass per frame (the O(B) baseline the batch-level CAM replaces)."""
    return torch.cat([value_cam(net, frames[i:i + 1])[0] for i in range(frames.shape[0])])
