"""Segmentation models as a model kind: SegFormer (transformers' SegformerForSemanticSegmentation) behind the
model bundle contract.

`bundle(images)` takes B x 3 x H x W images in [0, 1] and returns B x C x H x W class logits at the input's
resolution (SegFormer predicts at a quarter of it; the logits are upsampled bilinearly, as transformers'
post-processing does), so a region target, a mask and a map share one pixel grid. The bundle also says what
the methods need: `segformer_facts(bundle)` gives per stage its blocks, heads, and the reduction ratio of its
efficient attention (keys and values pooled by an R x R stride-R convolution).

Loaders, registered as the "segmentation" kind of model (`explainers.bundle.register_kind`, at the end):
- bundled: `weights/NAME.json` with `"kind": "segmentation"` and `"architecture": "segformer"` (the transformers
  config in `segformer_config`) and the safetensors beside it (see `load_segformer_bundle`);
- hub: repository names such as `nvidia/segformer-b0-finetuned-ade-512-512` (`owner/name`, the form transformers'
  from_pretrained reads; timm's names have no '/'), through from_pretrained into the HuggingFace cache; offline (or
  without transformers) they fail at once with a plain message.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..bundle import IMAGENET_MEAN, IMAGENET_STD, ModelBundle, ModelKind, ModelUnavailableError, register_kind

SEGMENTATION_FAMILY = "segformer"
BUNDLED_SEGMENTATION_MODELS = ("bccd-segformer",)
HUB_SEGMENTATION_MODELS = ("nvidia/segformer-b0-finetuned-ade-512-512",)
B0_SIZES = dict(hidden_sizes=[32, 64, 160, 256], depths=[2, 2, 2, 2], num_attention_heads=[1, 2, 5, 8],
                sr_ratios=[8, 4, 2, 1], decoder_hidden_size=256)


def _transformers():
    try:
        import transformers
    except ImportError as error:
        raise ModelUnavailableError(
            "Segmentation models need the 'transformers' package, which is not installed: install the segmentation "
            "extra (pip install 'saliency-lab[seg]' or pip install transformers).") from error
    return transformers


def segformer_config(num_labels: int, **overrides):
    """A SegFormer config: B0's sizes unless overridden (tests pass tiny ones)."""
    transformers = _transformers()
    values = dict(B0_SIZES, num_labels=num_labels, drop_path_rate=0.1, classifier_dropout_prob=0.1,
                  semantic_loss_ignore_index=255)
    values.update(overrides)
    return transformers.SegformerConfig(**values)


class SegmentationNetwork(nn.Module):
    """SegformerForSemanticSegmentation returning B x C x H x W logits at the input's size."""

    def __init__(self, segformer):
        super().__init__()
        self.segformer = segformer

    @property
    def config(self):
        return self.segformer.config

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        logits = self.segformer(pixel_values=pixel_values).logits
        return F.interpolate(logits, size=pixel_values.shape[-2:], mode="bilinear", align_corners=False)


def bilinear_rows(out_size: int, in_size: int, start: int = 0, stop: int | None = None) -> torch.Tensor:
    """(stop - start) x in_size: the weights `F.interpolate(..., mode="bilinear", align_corners=False)` gives output
    rows start..stop-1 from the input rows along one axis (bilinear is separable: a matrix per axis)."""
    stop = out_size if stop is None else stop
    source = ((torch.arange(start, stop, dtype=torch.float64) + 0.5) * (in_size / out_size) - 0.5).clamp_min(0)
    lower = source.floor().long().clamp_max(in_size - 1)
    upper = (lower + 1).clamp_max(in_size - 1)
    share = source - lower
    weights = torch.zeros(stop - start, in_size, dtype=torch.float64)
    rows = torch.arange(stop - start)
    weights.index_put_((rows, lower), 1 - share, accumulate=True)
    weights.index_put_((rows, upper), share, accumulate=True)
    return weights


def _support(weights: torch.Tensor) -> tuple:
    """(first, last + 1) of the input rows a weight matrix reads."""
    used = torch.nonzero(weights.abs().sum(0) > 0).flatten()
    return int(used[0]), int(used[-1]) + 1


def _resample(values: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """B x C x h x w -> B x C x len(rows) x len(cols) through the two axes' weight matrices."""
    rows, cols = rows.to(values), cols.to(values)
    return torch.einsum("yh,bchw,xw->bcyx", rows, values, cols)


# A window at least this share of the image is cheaper cropped from the whole pass: the resampling matrices cost
# more than F.interpolate on a large window (a smear's whole RBC box, 240 x 320: 69 ms an image against 54 ms; an
# 8% box 43 against 60, a 23% box 49 against 58; batch 4, one thread)
WHOLE_PASS_SHARE = 0.5


@torch.no_grad()
def fast_logits(bundle, images: torch.Tensor, window: tuple | None = None) -> torch.Tensor:
    """`bundle(images)` without gradients, about twice as fast on a CPU: the decode head's 1 x 1 fuse convolution is
    folded into each stage's projection and applied before the upsampling (projection, upsampling and fuse are all
    linear, so the logits are the same up to rounding, ~1e-6) and the 4 x 256-channel concatenation at a quarter
    of the image's size is never made. For the curves' many passes; methods that hook the decode head, or need
    gradients, call the bundle.

    `window` = (top, bottom, left, right): only those logits (B x C x (bottom - top) x (right - left)). The decode
    head then works only on the quarter-size rows and columns the window's upsampling reads: a region score reads
    its region's box, and for a platelet or a white cell that box is a small part of the smear (the decode head,
    at 256 channels, was about half of a full pass on a CPU)."""
    if window is not None:
        top, bottom, left, right = window
        if (bottom - top) * (right - left) >= WHOLE_PASS_SHARE * images.shape[-2] * images.shape[-1]:
            return fast_logits(bundle, images)[:, :, top:bottom, left:right]
    segformer = bundle.network.segformer
    pixel_values = bundle.normalize(images)
    stages = segformer.segformer(pixel_values, output_hidden_states=True, return_dict=True).hidden_states
    head = segformer.decode_head
    width, count = head.config.decoder_hidden_size, len(stages)
    fuse = head.linear_fuse.weight[:, :, 0, 0]  # the stages are concatenated last stage first
    norm, folded = head.batch_norm, _folds(head)
    if folded:  # an evaluating batch norm is a per-channel affine map: folded into the fuse as well (~12% a pass)
        scale = norm.weight / torch.sqrt(norm.running_var + norm.eps)
        fuse = fuse * scale[:, None]
    size = stages[0].shape[2:]
    height_out, width_out = images.shape[-2:]
    if window is not None:  # the output window's rows and columns of the quarter-size map, and what they read
        top, bottom, left, right = window
        out_rows, out_cols = bilinear_rows(height_out, size[0], top, bottom), bilinear_rows(width_out, size[1],
                                                                                            left, right)
        (row0, row1), (col0, col1) = _support(out_rows), _support(out_cols)
    fused = None
    for index, (hidden, projection) in enumerate(zip(stages, head.linear_projections)):
        if hidden.dim() == 3:  # B x N x D tokens (reshape_last_stage off): a square grid
            side = int(round(hidden.shape[1] ** 0.5))
            hidden = hidden.transpose(1, 2).reshape(hidden.shape[0], -1, side, side)
        block = fuse[:, (count - 1 - index) * width:(count - index) * width]
        weight, bias = block @ projection.proj.weight, block @ projection.proj.bias
        if window is None:  # channels-last parts: a CPU upsamples 256 channels ~5x quicker in that layout (a pass on
            # a 240 x 320 smear 52 -> 49 ms; batch 4, one thread)
            part = F.conv2d(hidden.contiguous(memory_format=torch.channels_last), weight[:, :, None, None], bias)
            if part.shape[2:] != size:
                part = F.interpolate(part, size=size, mode="bilinear", align_corners=False)
        else:  # the 1 x 1 convolution on the stage's rows and columns that the window reads, then resampled
            rows = bilinear_rows(size[0], hidden.shape[2], row0, row1)
            cols = bilinear_rows(size[1], hidden.shape[3], col0, col1)
            (r0, r1), (c0, c1) = _support(rows), _support(cols)
            part = F.conv2d(hidden[:, :, r0:r1, c0:c1], weight[:, :, None, None], bias)
            part = _resample(part, rows[:, r0:r1], cols[:, c0:c1])
        fused = part if fused is None else fused.add_(part)
    if folded:
        fused = fused.add_((norm.bias - norm.running_mean * scale)[None, :, None, None]).relu_()
    else:
        fused = head.activation(norm(fused))
    logits = head.classifier(fused)
    if window is None:  # a few class channels: the plain layout upsamples them quicker (and callers expect it)
        return F.interpolate(logits.contiguous(), size=images.shape[-2:], mode="bilinear", align_corners=False)
    return _resample(logits, out_rows[:, row0:row1], out_cols[:, col0:col1])


def _folds(head) -> bool:
    """Whether the decode head's batch norm and activation can be folded (an evaluating BatchNorm2d with its
    running statistics and affine weights, then a ReLU: the trained SegFormers here)."""
    norm = head.batch_norm
    return (isinstance(norm, torch.nn.BatchNorm2d) and not norm.training and norm.affine
            and norm.running_var is not None and isinstance(head.activation, torch.nn.ReLU))


def region_window(masks: torch.Tensor) -> tuple:
    """(top, bottom, left, right): the box around every region in B x H x W masks."""
    union = masks.any(dim=0)
    rows, cols = torch.nonzero(union.any(dim=1)).flatten(), torch.nonzero(union.any(dim=0)).flatten()
    return int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1


@torch.no_grad()
def region_probability(bundle, images: torch.Tensor, target) -> torch.Tensor:
    """`target.probability(bundle(images))` for a region target, the logits made only in the regions' box
    (`fast_logits` with a window): what the curves read, pass after pass."""
    from ..targets import RegionTarget

    top, bottom, left, right = window = region_window(target.masks)
    boxed = RegionTarget(target.masks[:, top:bottom, left:right], target.classes)
    return boxed.probability(fast_logits(bundle, images, window))


def build_segformer(config, attention: str = "eager") -> SegmentationNetwork:
    """A randomly initialised SegFormer. `attention`: 'eager' (the explanations see the attention weights) or
    'sdpa' (training)."""
    transformers = _transformers()
    config._attn_implementation = attention
    return SegmentationNetwork(transformers.SegformerForSemanticSegmentation(config))


def set_attention(network: SegmentationNetwork, attention: str) -> None:
    network.segformer.config._attn_implementation = attention
    for module in network.modules():
        if hasattr(module, "config") and hasattr(module.config, "_attn_implementation"):
            module.config._attn_implementation = attention


@dataclass(frozen=True)
class StageFacts:
    index: int
    blocks: int
    heads: int
    hidden_size: int
    reduction: int  # keys and values are pooled by an R x R stride-R convolution (1: no reduction)
    stride: int  # the overlapping patch embedding's stride into this stage


def segformer_facts(bundle) -> list:
    """[StageFacts] of a segmentation bundle's SegFormer encoder, in order."""
    config = bundle.network.config
    return [StageFacts(i, config.depths[i], config.num_attention_heads[i], config.hidden_sizes[i],
                       config.sr_ratios[i], config.strides[i]) for i in range(config.num_encoder_blocks)]


def is_segmentation(bundle) -> bool:
    return getattr(bundle, "task", "classification") == "segmentation"


def class_colours(bundle) -> list:
    """One RGB colour (0..255) per class: the card's, else a fixed palette."""
    colours = bundle.card.get("class_colours")
    if colours and len(colours) == bundle.num_classes:
        return [tuple(int(v) for v in colour) for colour in colours]
    generator = torch.Generator().manual_seed(0)
    palette = (torch.rand(bundle.num_classes, 3, generator=generator) * 200 + 40).int().tolist()
    return [tuple(colour) for colour in palette]


def bundle_from_segformer(name: str, network: SegmentationNetwork, *, class_names=None, class_colours=None,
                          input_size=(240, 320), mean=IMAGENET_MEAN, std=IMAGENET_STD, reference_color=None,
                          card: dict | None = None):
    """Wrap a SegFormer as a model bundle (also for a tiny one a test builds)."""
    network.eval()
    config = network.config
    names = list(class_names or [config.id2label.get(i, f"class {i}") for i in range(config.num_labels)])
    card = dict(card or {"source": "memory"})
    card.setdefault("kind", "segmentation")
    if class_colours is not None:
        card["class_colours"] = [list(c) for c in class_colours]
    bundle = ModelBundle(name=name, network=network, mean=tuple(mean), std=tuple(std),
                         input_size=tuple(int(v) for v in input_size), class_names=names, family=SEGMENTATION_FAMILY,
                         reference_color=tuple(reference_color or mean),
                         cam_layer_name=card.get("cam_layer", "segformer.decode_head.linear_fuse"),
                         crop_pct=1.0, interpolation="bilinear", card=card, task="segmentation")
    return bundle


def load_segformer_bundle(name: str, card: dict, weights) -> object:
    """A bundled SegFormer from its card and safetensors (stored in half precision, run in float32)."""
    from safetensors.torch import load_file

    if not os.path.exists(weights):
        raise ModelUnavailableError(
            f"Model '{name}': card found but weights file {weights} is missing. Re-clone the repository or retrain "
            f"it with: {card.get('training_command', 'python -m explainers train-seg')}")
    config = segformer_config(**card["segformer_config"])
    network = build_segformer(config)
    state = {key: value.float() for key, value in load_file(str(weights)).items()}
    network.segformer.load_state_dict(state)
    return bundle_from_segformer(name, network, class_names=card["class_names"],
                                 class_colours=card.get("class_colours"), input_size=card["input_size"],
                                 mean=card["mean"], std=card["std"], reference_color=card.get("reference_color"),
                                 card=card)


def load_hub_segformer(name: str):
    """A SegFormer from the HuggingFace hub (cached after the first download); a plain refusal offline."""
    transformers = _transformers()
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    try:
        segformer = transformers.SegformerForSemanticSegmentation.from_pretrained(name, attn_implementation="eager")
    except Exception as error:  # hub errors come in many types; all mean the same to the user
        raise ModelUnavailableError(
            f"Segmentation model '{name}' could not be downloaded from the HuggingFace hub"
            f"{' (HF_HUB_OFFLINE is set)' if offline else ''} and is not in the local cache. Connect to the "
            f"internet once to download it, or pick the bundled segmentation model "
            f"{BUNDLED_SEGMENTATION_MODELS[0]}.") from error
    size = _hub_input_size(name)
    labels = [segformer.config.id2label.get(i, f"class {i}") for i in range(segformer.config.num_labels)]
    return bundle_from_segformer(name, SegmentationNetwork(segformer), class_names=labels, input_size=size,
                                 card={"source": "hub", "kind": "segmentation", "hub_name": name})


def _hub_input_size(name: str) -> tuple:
    found = re.search(r"(\d{3,4})-(\d{3,4})$", name)
    return (int(found.group(1)), int(found.group(2))) if found else (512, 512)


def is_hub_repository(name: str) -> bool:
    """Whether a name without a card is a hub repository of this kind: `owner/name` (what transformers'
    from_pretrained reads; the classifiers' timm names have no '/')."""
    return re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*", str(name)) is not None


register_kind(ModelKind("segmentation", from_card=load_segformer_bundle, from_hub=load_hub_segformer,
                        hub_name=is_hub_repository, bundled=BUNDLED_SEGMENTATION_MODELS, hub=HUB_SEGMENTATION_MODELS))
