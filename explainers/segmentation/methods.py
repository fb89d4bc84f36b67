"""Explanation methods for segmentation models: one contract (explainers.methods.base.Method), a class over a
region as the target (`RegionTarget`: the mean class-c logit over the region), B x H x W maps.

    maps = explain_region(bundle, images, RegionTarget(masks, classes), "gradskip").maps

Only what is SegFormer-specific lives here (GradSkip through the reduced keys, the rollouts); Grad-CAM (of the
region score: Seg-Grad-CAM), occlusion, RISE, per-image AHA and the random map are the classifier methods
themselves, reading the score through the region target.

SegFormer's encoder has four stages; each block's efficient attention takes queries at the stage's full token
grid and keys and values at a grid reduced R x R times by a kernel = stride = R convolution (R = 8, 4, 2, 1 in
B0). Every attention-based method here propagates a relevance vector backwards through the blocks:
- within a stage, block by block; relevance reaching a reduced key goes back to the tokens that key pools
  (`key_spread`: "conv" by each token's share of the key, |W_(dy,dx) h_t| of the reduction convolution at the
  token's offset, or "even" over its R x R cell);
- across stages, from a stage's input tokens to the previous stage's output tokens (the stride-2 patch
  embedding): each token's relevance split evenly over the finer tokens nearest to it;
- after the first stage (a quarter of the image's resolution), upsampled bilinearly to the image (GradSkip adds
  a pixel term read from the same backward pass: `pixel_step`).
The Mix-FFN's 3 x 3 depthwise convolution mixes neighbouring tokens: GradSkip sends the share of a token's relevance
that goes through the FFN back over that window (`ffn_spread="conv"`, its default), or treats the FFN as token-wise,
as a ViT's MLP (`"none"`); the rollouts treat it as token-wise. Classifier methods (Chefer's LRP, a classifier's
GradSkip, ...) refuse a segmentation model in plain words.
"""
from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import torch

from ..methods.aha import AHA
from ..methods.base import Method, MethodNotApplicable, normalize_max, upsample
from ..methods.chefer import CheferRollout
from ..methods.gradcam import GradCAM
from ..methods.gradskip import MAP_DEFAULTS, GradSkip, _validate_options, gini
from ..methods.integrated_gradients import IntegratedGradients
from ..methods.occlusion import Occlusion
from ..methods.random_map import RandomMap
from ..methods.rise import RISE
from ..methods.rollout import AttentionRollout
from .capture import CaptureCache, capture, spread_depthwise, spread_keys, to_finer_by_window, to_finer_grid
from .model import SEGMENTATION_FAMILY, is_segmentation
from .targets import RegionTarget, require_region_target

SEGMENTATION_METHODS: dict = {}
KEY_SPREADS = ("conv", "even")
FFN_SPREADS = ("none", "conv")
ATTENTION_WEIGHTINGS = ("attention", "gradient", "gradient_residual")
STARTS = ("decoder", "decoder_abs", "decoder_signed")
PIXEL_STEPS = ("upsample", "input_gradient", "upsample_and_input_gradient")
# the token map's exponent in the "input_gradient" pixel step, chosen on 40 cued val platelets among 2, 1, 1/2 and 1/4
# (docs/segmentation.md section 8): at 1 or above the smooth token map overrules the pixel term and the cue is missed
TOKEN_EXPONENT = 0.5
DEFAULT_START = "decoder_signed"  # GradSkip's, chosen on val smears (docs/segmentation.md section 7); the rollouts'
EPS = 1e-12


def register_segmentation(cls):
    SEGMENTATION_METHODS[cls.name] = cls
    return cls


class SegmentationMethod(Method):
    """`form_of`: the classifier method this is the segmentation form of. Its `label`, `colour` and `order` are
    taken from there unless the class sets its own (one declaration: a figure colours both forms alike)."""
    families = frozenset({SEGMENTATION_FAMILY})
    score_targets = True  # the region target is a function of the logits
    form_of: ClassVar[type | None] = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        form = cls.__dict__.get("form_of")
        for attribute in ("label", "colour", "order"):
            if form is not None and attribute not in cls.__dict__:
                setattr(cls, attribute, getattr(form, attribute))

    def check(self, bundle) -> None:
        if not is_segmentation(bundle):
            raise MethodNotApplicable(
                f"{self.label} (segmentation form) explains a segmentation model's regions; '{bundle.name}' is a "
                f"classifier: use the classifier methods for it.")

    def _target(self, images, targets) -> RegionTarget:
        return require_region_target(self.label, targets, images.shape[0])

    # the capture-based methods' passes, shared through a `CaptureCache` when the caller gives one (a view that
    # explains one region with several methods); otherwise each call makes its own
    captures: CaptureCache | None = None

    def share_captures(self, cache: CaptureCache | None):
        """Read the model's passes from `cache` (one image and region); returns the method."""
        self.captures = cache
        return self

    def _capture(self, bundle, images, target, **flags):
        if self.captures is not None:
            return self.captures.get(bundle, images, target, **flags)
        return capture(bundle, images, target, **flags)


def _stage_blocks(blocks, stage: int) -> list:
    return [record for record in blocks if record.stage == stage]


def propagate(captured, starts: list, block_step, stage_spread: str = "even", network=None) -> torch.Tensor:
    """B x h0 x w0 relevance at the first stage's grid. `starts[s]`: B x N_s relevance entering at stage s's
    output; `block_step(record, R) -> R`: one block backwards; `stage_spread`: how a stage's input relevance goes
    back to the previous stage's tokens ("even": over the nearest finer tokens; "conv": over the 3 x 3 window its
    patch embedding reads, by each token's |W_(dy,dx) h_t|, as the keys' "conv" spread)."""
    grids = captured.stage_grids
    relevance = None
    for stage in reversed(range(len(grids))):
        if relevance is None:
            relevance = starts[stage].clone()
        elif stage_spread == "conv":
            if (stage + 1) not in captured.embed_shares or network is None:
                raise ValueError("stage_spread='conv' needs the patch embeddings' shares: prepare GradSkip with "
                                 "stage_spread='conv'")
            conv = network.segformer.segformer.stages[stage + 1].patch_embeddings.proj
            relevance = to_finer_by_window(relevance, captured.embed_shares[stage + 1], conv, grids[stage]) \
                + starts[stage]
        else:
            relevance = to_finer_grid(relevance, grids[stage + 1], grids[stage]) + starts[stage]
        for record in reversed(_stage_blocks(captured.blocks, stage)):
            relevance = block_step(record, relevance)
    b = relevance.shape[0]
    return relevance.view(b, *grids[0])


def _to_image(relevance: torch.Tensor, image_hw: tuple, normalize: bool = True) -> torch.Tensor:
    maps = upsample(relevance.float(), image_hw).clamp_min(0)
    return normalize_max(maps) if normalize else maps


def _normalise_heads(values: torch.Tensor) -> torch.Tensor:
    """B x heads -> shares summing to 1 (uniform where all are 0)."""
    total = values.sum(dim=1, keepdim=True)
    uniform = torch.full_like(values, 1.0 / values.shape[1])
    return torch.where(total > EPS, values / total.clamp_min(EPS), uniform)


def gradient_starts(captured, start: str = "decoder") -> list:
    """Per stage, B x N_s: the relevance entering at each stage's output tokens, from the region score's
    gradients only (never from the region's pixels): how much each token feeds the score directly through the
    decode head, relu(sum dP * P) ("decoder"), |sum dP * P| ("decoder_abs") or sum dP * P with its sign
    ("decoder_signed": a token that lowers the score carries negative relevance back, cancelling positive
    relevance where the two meet; the map keeps what is positive at the end), P the head's projection of the
    stage's tokens; all stages together sum to 1 per image in absolute value."""
    if start == "decoder":
        flows = captured.decoder_flow
    elif start == "decoder_signed":
        flows = captured.decoder_signed
    else:
        flows = [flow.abs() for flow in captured.decoder_signed]
    total = sum(flow.abs().sum(dim=1) for flow in flows).clamp_min(EPS).view(-1, 1)
    return [flow / total for flow in flows]


class SegGradSkipState:
    """What `.map(alpha)` reads, from one forward and one backward pass: alpha, the head threshold, the key
    spread, the attention weighting and the start change without a model pass."""

    def __init__(self, captured, image_hw: tuple, options: dict, network=None):
        self.captured = captured
        self.network = network
        self.image_hw = tuple(image_hw)
        self.options = dict(options)
        self.scores = captured.scores
        self._per_block: dict = {}  # what a block's matrices read that no slider changes, made once

    def _head_parts(self, record, weighting: str, head_threshold: float) -> tuple:
        """(gradient-flow shares, sparsity shares, the heads' matrices M_q diag|v_q|) of a block: alpha only mixes
        the first two, so the slider re-weights these without making them again."""
        key = (id(record), weighting, head_threshold)
        if key not in self._per_block:
            attention = record.attention
            product = record.attention_grad * attention
            heads = attention.shape[1]
            if heads == 1:
                flow = sparsity = torch.ones(attention.shape[0], 1, device=attention.device)
            else:
                flow = product.abs().mean(dim=(-2, -1))
                largest = flow.amax(dim=1, keepdim=True)
                flow = _normalise_heads(torch.where(flow >= head_threshold * largest, flow, torch.zeros_like(flow)))
                sparsity = _normalise_heads(gini(attention.mean(dim=2)))  # the mean query row: no class token
            per_head = attention if weighting == "attention" else product.clamp_min_(0)
            self._per_block[key] = (flow, sparsity, per_head * record.value_norms.unsqueeze(2))
        return self._per_block[key]

    def head_weights(self, record, alpha: float, head_threshold: float) -> torch.Tensor:
        """B x heads: alpha * gradient flow + (1 - alpha) * Gini sparsity, each normalised over the heads."""
        flow, sparsity, _ = self._head_parts(record, self.options["attention_weighting"], head_threshold)
        return alpha * flow + (1 - alpha) * sparsity

    def mixing(self, record, alpha, head_threshold, weighting, normalise: bool = True) -> torch.Tensor:
        """B x N x M: W~ = rownorm(sum_q w_q M_q diag|v_q|), M_q = A_q or relu(dA_q * A_q) (not row-normalised
        with `normalise=False`: "gradient_residual" scales it once per image instead)."""
        flow, sparsity, per_head = self._head_parts(record, weighting, head_threshold)
        weights = alpha * flow + (1 - alpha) * sparsity
        mixed = torch.einsum("bh,bhnm->bnm", weights, per_head)
        if not normalise:
            return mixed
        return mixed / mixed.sum(dim=-1, keepdim=True).clamp_min(EPS)

    def starts(self, start: str) -> list:
        return gradient_starts(self.captured, start)

    def relevance(self, alpha=None, **overrides) -> torch.Tensor:
        options = {**self.options, **overrides}
        alpha = float(options["alpha"] if alpha is None else alpha)
        _validate(**{k: v for k, v in {**options, "alpha": alpha}.items() if not k.startswith("_")})

        weighting = options["attention_weighting"]
        residual = weighting == "gradient_residual"
        if any(r.attention_grad is None or r.main_flow is None or r.skip_flow is None for r in self.captured.blocks):
            raise ValueError("the capture has no gradients for a block: was the region score differentiable?")
        matrices = [self.mixing(r, alpha, options["head_threshold"], weighting, normalise=not residual)
                    for r in self.captured.blocks]
        scale = row_sums = None
        if residual:  # one scale per image: the largest row sum over every block
            row_sums = [m.sum(dim=-1) for m in matrices]
            scale = torch.stack([rows.amax(dim=-1) for rows in row_sums]).amax(dim=0).clamp_min(EPS).view(-1, 1)
            # the matrices stay unscaled: the scale divides the B x M keys and the B x N row sums instead of every
            # B x N x M matrix (the same numbers, fewer passes over the largest tensors)
            row_sums = [rows / scale for rows in row_sums]
        by_block = {id(r): i for i, r in enumerate(self.captured.blocks)}

        def ffn_step(record, relevance):
            # backwards through the block's second half first: the share of each token's relevance that its
            # FFN branch carries (against the residual) goes over the 3 x 3 window the depthwise convolution read
            main, skip = record.ffn_main_flow.abs(), record.ffn_skip_flow.abs()
            through = main / (main + skip).clamp_min(EPS) * relevance
            return spread_depthwise(through, record.ffn_shares, record.grid) + relevance - through

        def block_step(record, relevance):
            if options.get("ffn_spread", "conv") == "conv":
                relevance = ffn_step(record, relevance)
            main, skip = record.main_flow.abs(), record.skip_flow.abs()
            if options["beta_reduction"] == "layer":
                main, skip = main.sum(dim=1, keepdim=True), skip.sum(dim=1, keepdim=True)
            b_main = main / (main + skip).clamp_min(EPS)
            through = b_main * relevance
            index = by_block[id(record)]
            keys = torch.einsum("bnm,bn->bm", matrices[index], through)
            kept = relevance - through
            if residual:  # the part of a row the weak gradients do not claim stays on its own token
                keys = keys / scale
                kept = kept + through * (1 - row_sums[index]).clamp_min(0)
            return spread_keys(keys, record, options["key_spread"]) + kept

        return propagate(self.captured, self.starts(options["start"]), block_step, options["stage_spread"],
                         self.network)

    def map(self, alpha=None, normalize: bool = True, **overrides) -> torch.Tensor:
        relevance = self.relevance(alpha, **overrides)
        options = {**self.options, **overrides}
        if options.get("pixel_step", "upsample") == "upsample":
            return _to_image(relevance, self.image_hw, normalize)
        if self.captured.pixel_flow is None:
            raise ValueError(f"pixel_step={options['pixel_step']!r} needs the image's gradient: prepare GradSkip "
                             "with that pixel_step")
        # the tokens say which parts of the smear carry the score through the attention; within and between them
        # the pixel term says which pixels the score responds to (its gradient times the pixel's difference from
        # the reference colour: what painting the pixel that colour costs, to first order). The product keeps a
        # pixel only where both agree; the square root stops the smooth token map from overruling the pixel term.
        tokens = _to_image(relevance, self.image_hw, normalize=False)
        maps = tokens.pow(TOKEN_EXPONENT) * self.captured.pixel_flow.clamp_min(0)
        if options["pixel_step"] == "upsample_and_input_gradient":
            # the sum, each part scaled to a maximum of 1: inside the region the token map's contiguous order
            # leads (deleting a cell's core lowers its score faster than deleting scattered pixels), outside it the
            # pixels the score responds to rise above the token map's smooth halo
            maps = normalize_max(tokens) + normalize_max(maps)
        return normalize_max(maps) if normalize else maps


def _validate(*, alpha=None, head_threshold=None, key_spread=None, attention_weighting=None, start=None,
              beta_reduction=None, stage_spread=None, ffn_spread=None, pixel_step=None, **_ignored) -> None:
    if pixel_step is not None and pixel_step not in PIXEL_STEPS:
        raise ValueError(f"pixel_step must be one of {', '.join(PIXEL_STEPS)}, got {pixel_step!r}")
    if ffn_spread is not None and ffn_spread not in FFN_SPREADS:
        raise ValueError(f"ffn_spread must be one of {', '.join(FFN_SPREADS)}, got {ffn_spread!r}")
    if stage_spread is not None and stage_spread not in KEY_SPREADS:
        raise ValueError(f"stage_spread must be one of {', '.join(KEY_SPREADS)}, got {stage_spread!r}")
    # alpha (its declared Option), head_threshold and beta_reduction: checked as the classifier's GradSkip checks them
    _validate_options(alpha=alpha, head_threshold=head_threshold, beta_reduction=beta_reduction)
    if key_spread is not None and key_spread not in KEY_SPREADS:
        raise ValueError(f"key_spread must be one of {', '.join(KEY_SPREADS)}, got {key_spread!r}")
    if attention_weighting is not None and attention_weighting not in ATTENTION_WEIGHTINGS:
        raise ValueError(f"attention_weighting must be one of {', '.join(ATTENTION_WEIGHTINGS)}, "
                         f"got {attention_weighting!r}")
    if start is not None and start not in STARTS:
        raise ValueError(f"start must be one of {', '.join(STARTS)}, got {start!r}")


@register_segmentation
class SegGradSkip(SegmentationMethod):
    """GradSkip on SegFormer (docs/segmentation.md). One forward and one backward pass of the region score.

    Options (ours where marked choice; the paper has no public code: NOT VERIFIED AGAINST AUTHOR CODE):
      alpha=0.5            head weights alpha * gradient flow + (1 - alpha) * Gini sparsity (paper's best).
      head_threshold=0.1   (choice, as the classifier's) heads under this share of the block's largest gradient
                           flow get no gradient-flow weight. Stage 1 of B0 has one head: its weight is 1.
      attention_weighting="gradient_residual"  (choice, chosen on val smears) M_q in W~: "gradient"
                           relu(dA * A) (the paper's wording) or "attention" A,
                           rows renormalised; or "gradient_residual": relu(dA * A) |v| mixed by w_q WITHOUT
                           renormalising rows, every block divided by one scale per image (the largest row sum
                           over all blocks), the rest of each row staying on its own token (as the classifier
                           GradSkip's form of that name): a query whose gradients are weak keeps its relevance
                           instead of sending all of it to whichever reduced key happens to lead.
      key_spread="even"    (choice, chosen on val smears) how a reduced key's relevance goes back to the tokens it
                           pools (module doc).
      start="decoder_signed" (chosen on val smears: the only start that passes the randomisation gate) the
                           relevance entering at each stage's output, from the region score's gradients only
                           (`gradient_starts`): relu(dP * P) ("decoder"), |dP * P| ("decoder_abs") or dP * P with
                           its sign ("decoder_signed"), summed over channels, P the decode head's projection of
                           that stage's tokens (how much each token feeds the region score directly through the
                           decoder), over all stages summing to 1 in absolute value. The region's pixels are never
                           read: a map cannot copy the answer.
      stage_spread="even"  (choice) how relevance at a stage's input tokens goes back to the previous stage's output
                           tokens: over the 3 x 3 window the stride-2 patch embedding reads, by each token's
                           |W_(dy,dx) h_t| ("conv"), or evenly over the nearest finer tokens ("even").
      beta_reduction="token"  b_main = |sum do*o| / (|sum do*o| + |sum dx*x|) per token ("layer": per block).
      ffn_spread="conv"    (chosen on val regions by out-of-region deletion, docs/segmentation.md section 8) the
                           Mix-FFN: ("conv") the FFN's share of a token's relevance, |sum df*f| / (|sum df*f| +
                           |sum dh*h|), split over the 3 x 3 window of its depthwise convolution by each
                           neighbour's ||W_(dy,dx) * u_t|| (`depthwise_shares`), or token-wise ("none").
      pixel_step="upsample_and_input_gradient" (chosen on val smears, docs/segmentation.md section 8) from the
                           first stage's tokens (a quarter of the image's resolution) to pixels:
                           bilinear upsampling ("upsample"), or ("input_gradient") the upsampled relevance to the
                           power TOKEN_EXPONENT times relu of the score's gradient at each pixel times the pixel's
                           difference from the reference colour, summed over colour channels (from the same
                           backward pass, carried down to the image); or ("upsample_and_input_gradient") the
                           sum of the upsampled relevance and that product, each scaled to a maximum of 1.
    The class token the paper drops does not exist in SegFormer: every token is a patch token.
    """

    name = "gradskip"
    description = ("Propagates the region's class score back through SegFormer's efficient attention (queries at "
                   "full resolution, keys at the reduced one), weighting heads by gradient flow and sparsity and "
                   "splitting relevance between attention and skip paths. One forward and one backward pass.")
    form_of = GradSkip
    # its default pixel step adds pixel-level detail: the above-mean set's edges would speckle the smear white
    outline_binarised = False
    # the classifier's alpha slider (label, range, step, help), under its own element id and without the classifier
    # app's endpoints and CLI flag
    user_options = (replace(GradSkip.user_options_by_name()["alpha"], flag=""),)

    @classmethod
    def default_for(cls, bundle) -> bool:
        return True

    def __init__(self, alpha: float = GradSkip.user_options_by_name()["alpha"].default,
                 head_threshold: float = MAP_DEFAULTS["head_threshold"],
                 attention_weighting: str = "gradient_residual", key_spread: str = "even", start: str = DEFAULT_START,
                 beta_reduction: str = "token",
                 stage_spread: str = "even", ffn_spread: str = "conv",
                 pixel_step: str = "upsample_and_input_gradient"):
        _validate(alpha=alpha, head_threshold=head_threshold, attention_weighting=attention_weighting,
                  key_spread=key_spread, start=start, beta_reduction=beta_reduction, stage_spread=stage_spread,
                  ffn_spread=ffn_spread, pixel_step=pixel_step)
        super().__init__(alpha=float(alpha), head_threshold=float(head_threshold),
                         attention_weighting=attention_weighting, key_spread=key_spread, start=start,
                         beta_reduction=beta_reduction, stage_spread=stage_spread, ffn_spread=ffn_spread,
                         pixel_step=pixel_step)

    def prepare(self, bundle, images, targets) -> SegGradSkipState:
        self.check(bundle)
        target = self._target(images, targets)
        captured = self._capture(bundle, images, target, keep_shares=self.options["key_spread"] == "conv",
                                 keep_window_shares=self.options["stage_spread"] == "conv",
                                 keep_pixel_flow=self.options["pixel_step"] != "upsample")
        return SegGradSkipState(captured, tuple(images.shape[-2:]), self.options,
                                network=bundle.network)

    def attribute(self, bundle, images, targets):
        return self.prepare(bundle, images, targets).map()


class _RegionRollout(SegmentationMethod):
    """Rollout through the efficient attention from the region score's gradients: the start is GradSkip's
    decoder start (`gradient_starts`: how much each token feeds the score through the decode head; never the
    region's pixels), each block mixes it by a head-fused matrix (below) with the identity for the skip
    connection, and reduced keys spread evenly over the tokens they pool. `start`: GradSkip's starts, its
    default too (a baseline compared with GradSkip gets the same start)."""

    def __init__(self, start: str = DEFAULT_START):
        _validate(start=start)
        super().__init__(start=start)

    def block_matrix(self, record) -> torch.Tensor:
        raise ValueError("a rollout names its block matrix")

    def attribute(self, bundle, images, targets):
        self.check(bundle)
        target = self._target(images, targets)
        captured = self._capture(bundle, images, target, keep_shares=False)
        starts = gradient_starts(captured, self.options["start"])

        def block_step(record, relevance):
            fused = self.block_matrix(record)  # B x N x M, non-negative
            row_sums = fused.sum(dim=-1)  # B x N
            scaled = relevance / (row_sums + 1.0)  # rownorm(fused E + I)^T R, E the even spread
            keys = torch.einsum("bnm,bn->bm", fused, scaled)
            return spread_keys(keys, record, "even") + scaled

        with torch.no_grad():
            return _to_image(propagate(captured, starts, block_step), tuple(images.shape[-2:]))


@register_segmentation
class SegAttentionRollout(_RegionRollout):
    name = "rollout"
    description = ("Follows the mean attention of the heads through every block, from where the region's score "
                   "enters the decoder (skip connections as identity), keys mapped back through the reduction.")
    form_of = AttentionRollout

    def block_matrix(self, record) -> torch.Tensor:
        return record.attention.mean(dim=1)  # rows sum to 1: rownorm(A E + I) = (A E + I) / 2


@register_segmentation
class SegGradientRollout(_RegionRollout):
    name = "gradrollout"
    label = "Gradient rollout"
    description = ("Rollout of relu(gradient × attention) averaged over heads (the region score's gradient), with "
                   "the identity for skip connections, keys mapped back through the reduction.")
    form_of = CheferRollout

    def block_matrix(self, record) -> torch.Tensor:
        fused = (record.attention_grad * record.attention).mean(dim=1).clamp_min(0)
        # the gradient's scale varies by orders of magnitude between blocks: each block's matrix is scaled so its
        # largest row sums to 1 (as attention's rows do), else the identity swamps or vanishes
        peak = fused.sum(dim=-1).amax(dim=-1).clamp_min(EPS).view(-1, 1, 1)
        return fused / peak


# the methods that read their score through any target (explainers.targets) explain a region as they are:
# Grad-CAM of the region score is Seg-Grad-CAM (Vinogradova et al. 2020), at the decode head's fused features
SHARED_METHODS = (GradCAM, Occlusion, RISE, IntegratedGradients, AHA, RandomMap)
for _shared in SHARED_METHODS:
    SEGMENTATION_METHODS[_shared.name] = _shared


def list_segmentation_methods() -> list:
    return sorted(SEGMENTATION_METHODS, key=lambda name: (SEGMENTATION_METHODS[name].order, name))


def method_label(name: str, bundle=None) -> str:
    return SEGMENTATION_METHODS[name].label_for(bundle)


def get_segmentation_method(name: str, bundle=None, **options) -> Method:
    """A method that explains a segmentation model's region; a plain refusal for a method that explains
    classifiers only, and for a classifier."""
    if name not in SEGMENTATION_METHODS:
        from ..methods import METHODS

        choices = ", ".join(method_label(n, bundle) for n in list_segmentation_methods())
        model = f" '{bundle.name}'" if bundle is not None else ""
        if name in METHODS:
            raise MethodNotApplicable(
                f"{METHODS[name].label} explains classifiers only; it has no form for a segmentation model. For "
                f"the segmentation model{model}, choose one of: {choices}.")
        raise MethodNotApplicable(f"There is no method called '{name}'. For a segmentation model, choose one of: "
                                  f"{choices}.")
    method = SEGMENTATION_METHODS[name](**options)
    if bundle is not None:
        if not is_segmentation(bundle):
            raise MethodNotApplicable(
                f"{method_label(name, bundle)} (segmentation form) explains a segmentation model's regions; "
                f"'{bundle.name}' is a classifier: use the classifier methods for it.")
        method.check(bundle)
    return method


def explain_region(bundle, images, target: RegionTarget, method, *, progress=None, **options):
    """One segmentation method's maps for a region target, through the one run path (`engine.explain_batch`:
    the checks, the bundle's lock, the seed). `method`: a name or a Method. Returns the engine's BatchMaps."""
    from ..engine import explain_batch

    method_obj = method if isinstance(method, Method) else get_segmentation_method(method, bundle, **options)
    return explain_batch(bundle, method_obj, images, target, progress=progress)
