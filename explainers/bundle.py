"""The model bundle contract: `ModelBundle` (a network and what methods need to know about it),
`ModelUnavailableError`, and the registry of model kinds (`ModelKind`, `register_kind`: timm's `register_model`
for whole kinds of model). Its own module so that every loader (explainers.models for classifiers,
explainers.segmentation.model for SegFormers) builds bundles and registers its kind without importing another
loader; `explainers.models` re-exports these names and finds, lists and loads every kind's models.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ModelUnavailableError(RuntimeError):
    """A model cannot be loaded here (not bundled, not cached, and the hub is unreachable)."""


@dataclass(frozen=True)
class ModelKind:
    """A kind of model (a classifier, a segmentation model, ...), registered by its loader's module.

    `name` is the "kind" its cards carry; `from_card(name, card, weights_path) -> ModelBundle` builds one from its
    card and weights; `from_hub(name, **options) -> ModelBundle` downloads (or finds cached) a hub model of this
    kind; `hub_name(name) -> bool` says whether a name without a card is one of its hub names (the classifier
    kind takes every other name: `default`); `bundled` are the shipped names (listed first, when their card is
    present) and `hub` the hub names offered by default."""
    name: str
    from_card: Callable
    from_hub: Callable | None = None
    hub_name: Callable | None = None
    bundled: tuple = ()
    hub: tuple = ()
    default: bool = False


MODEL_KINDS: dict = {}


def register_kind(kind: ModelKind) -> ModelKind:
    """Add a kind of model to the registry (its loader's module calls this when imported)."""
    MODEL_KINDS[kind.name] = kind
    return kind


@dataclass
class ModelBundle:
    """A classifier and what explanation methods need to know about it.

    `bundle(images)` takes images in [0, 1] (B x 3 x H x W) and returns logits: normalisation lives
    here so that every method and the curve engine work in [0, 1] image space.
    """

    name: str
    network: nn.Module
    mean: tuple
    std: tuple
    input_size: tuple  # (H, W)
    class_names: list
    family: str  # vit | swin | convnext | resnet | efficientnet | cnn
    reference_color: tuple  # dataset mean colour in [0, 1], the default deletion/insertion reference
    cam_layer_name: str
    crop_pct: float = 1.0
    interpolation: str = "bicubic"
    card: dict = field(default_factory=dict)
    task: str = "classification"  # or "segmentation": B x C x H x W logits (explainers.segmentation.model)
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    # --- forward -------------------------------------------------------------------------------
    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        mean = torch.tensor(self.mean, device=images.device, dtype=images.dtype).view(1, -1, 1, 1)
        std = torch.tensor(self.std, device=images.device, dtype=images.dtype).view(1, -1, 1, 1)
        return (images - mean) / std

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return self.network(self.normalize(images))

    @property
    def device(self) -> torch.device:
        return next(self.network.parameters()).device

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    # --- architecture facts --------------------------------------------------------------------
    @property
    def is_vit(self) -> bool:
        return self.family == "vit"

    @property
    def num_prefix_tokens(self) -> int:
        return int(getattr(self.network, "num_prefix_tokens", 0)) if self.is_vit else 0

    @property
    def has_class_token(self) -> bool:
        return self.is_vit and getattr(self.network, "cls_token", None) is not None

    @property
    def patch_size(self) -> tuple:
        ps = self.network.patch_embed.patch_size
        return (ps, ps) if isinstance(ps, int) else tuple(ps)

    def patch_grid(self, image_hw: tuple | None = None) -> tuple:
        h, w = image_hw or self.input_size
        ph, pw = self.patch_size
        return h // ph, w // pw

    @property
    def blocks(self) -> list:
        return list(self.network.blocks) if self.is_vit else []

    @property
    def cam_layer(self) -> nn.Module:
        return self.network.get_submodule(self.cam_layer_name)

    def activations_to_grid(self, activations: torch.Tensor, image_hw: tuple | None = None) -> torch.Tensor:
        """Bring the CAM layer's output to B x C x h x w, whatever the family."""
        if self.family == "vit":
            tokens = activations[:, self.num_prefix_tokens:, :]
            gh, gw = self.patch_grid(image_hw)
            return tokens.transpose(1, 2).reshape(tokens.shape[0], tokens.shape[2], gh, gw)
        if self.family == "swin" and activations.dim() == 4 and activations.shape[-1] != activations.shape[-2]:
            return activations.permute(0, 3, 1, 2)  # timm's Swin is NHWC
        return activations

    def class_name(self, index: int) -> str:
        return self.class_names[index] if 0 <= index < len(self.class_names) else str(index)

    def to(self, device) -> "ModelBundle":
        self.network.to(device)
        return self
