"""One forward and one backward pass of a SegFormer, keeping what the attention-based methods read.

Per encoder block (stage s, block l), through hooks on transformers' modules (all removed in a `finally`):
- `attention`  B x heads x N x M: the efficient attention's probabilities, queries at the stage's full token grid
  (N = h x w) and keys / values at the reduced grid (M = ceil(h / R) x ceil(w / R), R the stage's reduction
  ratio), and `attention_grad` (dA) for the region score, when gradients are asked for;
- `value_norms` B x heads x M: |v| per head and reduced key (the embedding magnitudes);
- `block_input` x and the attention branch output o (B x N x C) with their gradients, summed over channels as
  `skip_flow` = sum dx * x and `main_flow` = sum do * o (B x N);
- `key_shares` B x N: how much each token weighs in the reduced key that pools it (see `key_shares`);
- the Mix-FFN's flows, `ffn_skip_flow` = sum dh * h (h its residual input) and `ffn_main_flow` = sum df * f (f its
  output), and `ffn_shares` B x 9 x N: how much each token of the 3 x 3 window of its depthwise convolution makes
  of a token's FFN input (see `depthwise_shares`): the FFN is where SegFormer mixes neighbouring tokens outside
  attention (its only positional signal), so relevance that goes through it may move to a neighbour;
and per stage the decoder path's evidence `decoder_flow` B x N_s = relu(sum over channels dP * P), P the decode
head's projection of that stage's output (its linear_projections[s]), i.e. how much each token feeds the region
score through the decoder directly (the stage's output also feeds the next stage; that share comes back through
the next stage's propagation).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..attention import model_lock
from ..methods.integrated_gradients import gradient_times_difference


@dataclass
class BlockRecord:
    stage: int
    grid: tuple  # (h, w) of the queries
    reduced_grid: tuple  # (h', w') of the keys
    reduction: int
    attention: torch.Tensor | None = None
    attention_grad: torch.Tensor | None = None
    value_norms: torch.Tensor | None = None
    main_flow: torch.Tensor | None = None
    skip_flow: torch.Tensor | None = None
    key_shares: torch.Tensor | None = None
    ffn_main_flow: torch.Tensor | None = None
    ffn_skip_flow: torch.Tensor | None = None
    ffn_shares: torch.Tensor | None = None


@dataclass
class Capture:
    blocks: list  # [BlockRecord] in forward order
    stage_grids: list  # [(h, w)] per stage
    # per stage s > 0: B x 9 x N_s shares of the 3 x 3 window of stage s-1 tokens that its patch embedding reads
    embed_shares: dict = field(default_factory=dict)
    decoder_flow: list = field(default_factory=list)  # [B x N_s] per stage: relu(sum dP * P) (gradients only)
    decoder_signed: list = field(default_factory=list)  # [B x N_s] per stage: sum dP * P, signed
    logits: torch.Tensor | None = None  # B x C x H x W
    scores: torch.Tensor | None = None  # B region scores
    # B x H x W: the score's gradient times the image's difference from the reference colour, summed over the colour
    # channels (`keep_pixel_flow` only): to first order, what painting a pixel that colour costs the score
    pixel_flow: torch.Tensor | None = None


def _stage_modules(network):
    encoder = network.segformer.segformer
    return list(encoder.stages) if hasattr(encoder, "stages") else None


def key_shares(hidden: torch.Tensor, conv: torch.nn.Conv2d, grid: tuple) -> torch.Tensor:
    """B x N: each token's share of the reduced key that pools it, |W_(dy,dx) h_t| over the tokens of its R x R
    cell, W_(dy,dx) the reduction convolution's weights at the token's offset in the cell and h_t its (normed)
    features: how much of the key the token makes. Shares within a cell sum to 1."""
    b, n, c = hidden.shape
    h, w = grid
    r = conv.kernel_size[0]
    hk, wk = h // r, w // r  # whole cells only: the convolution (no padding) drops the rest
    shares = torch.zeros(b, h, w, device=hidden.device, dtype=torch.float32)
    if hk == 0 or wk == 0:
        return shares.reshape(b, n)
    x = hidden.transpose(1, 2).reshape(b, c, h, w)[:, :, :hk * r, :wk * r].float()
    cells = x.reshape(b, c, hk, r, wk, r)  # b, c, cell row, dy, cell column, dx
    # every token's share of its key, all offsets in one contraction: |W[:, :, dy, dx] h_t| over output channels
    projected = torch.einsum("ocyx,bciyjx->boiyjx", conv.weight.float(), cells)
    norms = projected.norm(dim=1)  # b, cell row, dy, cell column, dx
    totals = norms.sum(dim=(2, 4), keepdim=True).clamp_min(1e-12)
    shares[:, :hk * r, :wk * r] = (norms / totals).reshape(b, hk * r, wk * r)
    return shares.reshape(b, n)


def reduced_grid(grid: tuple, reduction: int) -> tuple:
    """The keys' grid after a kernel = stride = R convolution (no padding): floor, as PyTorch's conv."""
    if reduction <= 1:
        return tuple(grid)
    return (grid[0] // reduction, grid[1] // reduction)


def capture(bundle, images: torch.Tensor, target=None, *, keep_shares: bool = True,
            keep_window_shares: bool = False, keep_pixel_flow: bool = False) -> Capture:
    """The forward pass (and, with a region `target`, the backward pass of the sum of its B scores, down to the
    first block's input: the first patch embedding's gradient is not needed unless `keep_pixel_flow`, which carries
    it down to the image for `pixel_flow`). `keep_shares`: the reduced keys' token shares; `keep_window_shares`: the
    patch embeddings' window shares (`stage_spread="conv"`)."""
    network = bundle.network
    stages = _stage_modules(network)
    if stages is None:
        raise ValueError(f"'{bundle.name}' is not a SegFormer from transformers: no encoder stages to read")
    gradients = target is not None
    blocks, grids, handles = [], [], []
    embed_shares, first_input = {}, []
    decoder_outputs = []

    def keep_grad(tensor, record, name):
        if gradients and tensor.requires_grad:
            tensor.register_hook(lambda grad: setattr(record, name, grad))

    for stage_index, stage in enumerate(stages):
        def embed_hook(module, inputs, output, stage_index=stage_index):
            grids.append((int(output[1]), int(output[2])))
            if keep_window_shares and stage_index > 0:
                with torch.no_grad():
                    embed_shares[stage_index] = window_shares(inputs[0].detach(), module.proj)
        handles.append(stage.patch_embeddings.register_forward_hook(embed_hook))
        for block in stage.blocks:
            attention = block.attention
            reduction = int(getattr(attention, "sequence_reduction_ratio", 1))
            record = BlockRecord(stage=stage_index, grid=(0, 0), reduced_grid=(0, 0), reduction=reduction)
            blocks.append(record)

            def block_pre_hook(_module, args, kwargs, record=record, stage_index=stage_index):
                hidden = args[0]
                if not first_input:
                    first_input.append(hidden)
                record.grid = grids[stage_index]
                record.reduced_grid = reduced_grid(record.grid, record.reduction)
                record._x = hidden
                keep_grad(hidden, record, "_dx")

            def attention_pre_hook(_module, args, kwargs, record=record, attention=attention):
                if keep_shares and record.reduction > 1:
                    with torch.no_grad():
                        record.key_shares = key_shares(args[0].detach(), attention.sequence_reduction
                                                       .sequence_reduction, record.grid)

            def attention_hook(_module, _args, output, record=record):
                out, weights = output
                if weights is None:
                    raise ValueError("the SegFormer's attention returned no weights: load it with eager attention")
                record.attention = weights.detach().float()
                record._o = out
                keep_grad(out, record, "_do")
                keep_grad(weights, record, "_dA")

            def ffn_input_hook(_module, args, record=record):
                record._h = args[0]
                keep_grad(args[0], record, "_dh")

            def ffn_hook(_module, _args, output, record=record):
                record._f = output
                keep_grad(output, record, "_df")

            def depthwise_hook(module, args, record=record):
                with torch.no_grad():
                    record.ffn_shares = depthwise_shares(args[0].detach(), module.dwconv, record.grid)

            def value_hook(_module, _args, output, record=record, attention=attention):
                b, m, _ = output.shape
                heads = attention.num_attention_heads
                record.value_norms = output.detach().float().view(b, m, heads, -1).norm(dim=-1).transpose(1, 2)

            handles.append(block.register_forward_pre_hook(block_pre_hook, with_kwargs=True))
            handles.append(attention.register_forward_pre_hook(attention_pre_hook, with_kwargs=True))
            handles.append(attention.register_forward_hook(attention_hook))
            handles.append(attention.v_proj.register_forward_hook(value_hook))
            handles.append(block.layernorm_after.register_forward_pre_hook(ffn_input_hook))
            handles.append(block.mlp.register_forward_hook(ffn_hook))
            handles.append(block.mlp.dwconv.register_forward_pre_hook(depthwise_hook))
    projections = network.segformer.decode_head.linear_projections
    for projection in projections:
        def projection_hook(_module, _args, output):
            # the hook writes into a dict that does not hold `output`: a hook that reaches its own tensor makes a
            # cycle through the autograd graph that Python's collector cannot see (~40 MB kept per capture)
            grads = {}
            decoder_outputs.append({"P": output, "grads": grads})
            if gradients and output.requires_grad:
                output.register_hook(lambda grad, grads=grads: grads.__setitem__("dP", grad))
        handles.append(projection.proj.register_forward_hook(projection_hook))

    with model_lock(bundle):
        attention_setting = network.segformer.config._attn_implementation
        from .model import set_attention

        set_attention(network, "eager")
        try:
            with torch.set_grad_enabled(gradients):
                inputs = images
                if gradients and not images.requires_grad:
                    inputs = images.detach().requires_grad_(True)  # a frozen model still needs a graph
                logits = bundle(inputs)
                scores = pixel_gradient = None
                if gradients:
                    scores = target(logits)
                    ends = [first_input[0], inputs] if keep_pixel_flow else first_input[:1]
                    gradients_at_ends = torch.autograd.grad(scores.sum(), ends)
                    pixel_gradient = gradients_at_ends[1] if keep_pixel_flow else None
        finally:
            for handle in handles:
                handle.remove()
            set_attention(network, attention_setting)
    result = Capture(blocks=blocks, stage_grids=grids, embed_shares=embed_shares, logits=logits.detach(),
                     scores=None if scores is None else scores.detach())
    for record in blocks:
        x, o, h, f = (record.__dict__.pop(name) for name in ("_x", "_o", "_h", "_f"))
        dx, do, d_attention, dh, df = (record.__dict__.pop(name, None) for name in ("_dx", "_do", "_dA", "_dh", "_df"))
        if gradients:
            record.attention_grad = None if d_attention is None else d_attention.detach().float()
            record.skip_flow = _flow(dx, x)
            record.main_flow = _flow(do, o)
            record.ffn_skip_flow = _flow(dh, h)
            record.ffn_main_flow = _flow(df, f)
    if gradients:
        # the decode head hands back dP as a strided view (its channels-first reshape): a product over such views
        # took 13 ms at stage 1, over contiguous copies under 2
        result.decoder_signed = [torch.linalg.vecdot(h["grads"]["dP"].float().contiguous(),
                                                     h["P"].detach().float().contiguous())
                                 if "dP" in h["grads"] else torch.zeros(h["P"].shape[:2], device=images.device)
                                 for h in decoder_outputs]
        result.decoder_flow = [flow.clamp_min(0) for flow in result.decoder_signed]
        if keep_pixel_flow:
            result.pixel_flow = gradient_times_difference(bundle, images.detach(), pixel_gradient).float()
    return result


def _flow(grad, value):
    """B x N: sum over channels of gradient * value (None without a gradient)."""
    return None if grad is None else torch.linalg.vecdot(grad.float(), value.detach().float())


def depthwise_shares(hidden: torch.Tensor, conv: torch.nn.Conv2d, grid: tuple) -> torch.Tensor:
    """B x 9 x N: for each token, the share of each token in the 3 x 3 window its Mix-FFN's depthwise convolution
    reads, ||W_(dy,dx) * h_t|| over channels (one filter per channel), normalised over the window (padding: none).
    `hidden`: B x N x C, the convolution's input.

    ||W_k * h_t||^2 = sum_c W_ck^2 h_ct^2 is one product of the squared features with the squared filters at every
    token, read at each offset k: no window of features is ever gathered (that was ~70 ms a block at stage 1)."""
    b, n, c = hidden.shape
    k = conv.kernel_size[0]
    h, w = grid
    filters = conv.weight.detach().float().view(c, k * k).square().t()  # K x C
    # K x C times C x N per image: the same product as N x C times C x K, which ran 2-5x slower on this CPU (skinny)
    squares = filters @ hidden.detach().float().square().transpose(1, 2)  # B x K x N
    padded = F.pad(squares.view(b, k * k, h, w), (k // 2,) * 4)
    norms = torch.empty(b, k * k, h, w, dtype=squares.dtype, device=squares.device)
    for i in range(k):  # offset (i, j) of a window is read at the token it feeds: one shifted slice each
        for j in range(k):
            norms[:, i * k + j] = padded[:, i * k + j, i:i + h, j:j + w]
    norms = norms.clamp_min_(0).sqrt_().view(b, k * k, n)
    return norms / norms.sum(dim=1, keepdim=True).clamp_min(1e-12)


class CaptureCache:
    """Prepare once, query many (segment-anything's shape): the captures of ONE image and region, kept for every
    method that reads the same passes. GradSkip and both region rollouts read the same capture at their defaults,
    and a capture is ~95% of each one's cost on a CPU, so a view that shows all three pays for one. A capture is
    read, never changed, by the methods. The cache is made for one explanation and dropped with it: asking it
    about another image or region is a programming error (it raises), not a cache miss."""

    def __init__(self):
        self._images = None
        self._target = None
        self._captures: dict = {}

    def get(self, bundle, images: torch.Tensor, target, *, keep_shares: bool = True,
            keep_window_shares: bool = False, keep_pixel_flow: bool = False) -> Capture:
        if self._images is None:
            self._images, self._target = images, target
        elif images is not self._images or target is not self._target:
            raise ValueError("a CaptureCache serves one image and one region; make a new one for another")
        # the image's gradient is always kept here: GradSkip's default reads it, and the ~3% it adds to a rollout's
        # capture is less than a second capture when GradSkip comes after a rollout
        key = (id(bundle.network), bool(keep_shares), bool(keep_window_shares))
        if key not in self._captures:
            self._captures[key] = capture(bundle, images, target, keep_shares=keep_shares,
                                          keep_window_shares=keep_window_shares, keep_pixel_flow=True)
        return self._captures[key]

    def clear(self) -> None:
        self._captures.clear()


def spread_keys(key_relevance: torch.Tensor, record: BlockRecord, shares: str = "conv") -> torch.Tensor:
    """B x M relevance on the reduced keys -> B x N on the tokens they pool: each key's relevance split over the
    tokens of its R x R cell, evenly (`shares="even"`) or by `key_shares` ("conv"). Tokens past the last whole
    cell (a grid side not divisible by R) are not pooled by any key (PyTorch's convolution drops them) and
    get none."""
    b = key_relevance.shape[0]
    h, w = record.grid
    r = record.reduction
    if r <= 1:
        return key_relevance
    hk, wk = record.reduced_grid
    cells = key_relevance.view(b, 1, hk, wk)
    full = torch.zeros(b, h, w, device=key_relevance.device, dtype=key_relevance.dtype)
    spread = F.interpolate(cells, scale_factor=r, mode="nearest")[:, 0]  # B x hk*r x wk*r
    if shares == "conv" and record.key_shares is not None:
        weights = record.key_shares.view(b, h, w)[:, :hk * r, :wk * r]
        full[:, :hk * r, :wk * r] = spread * weights
    else:
        full[:, :hk * r, :wk * r] = spread / (r * r)
    return full.reshape(b, h * w)


def window_shares(inputs: torch.Tensor, conv: torch.nn.Conv2d) -> torch.Tensor:
    """B x K x L: for each output token of an overlapping patch embedding (a K = k x k window, stride s, padding p)
    the share of each input token of its window, |W_(dy,dx) h_t| normalised over the window (padding: none)."""
    k = conv.kernel_size[0]
    windows = F.unfold(inputs.float(), k, padding=conv.padding[0], stride=conv.stride[0])  # B x C*K x L
    b, _, count = windows.shape
    windows = windows.view(b, inputs.shape[1], k * k, count)
    weight = conv.weight.float().view(conv.weight.shape[0], conv.weight.shape[1], k * k)  # O x C x K
    norms = torch.einsum("ock,bckl->bokl", weight, windows).norm(dim=1)  # B x K x L
    return norms / norms.sum(dim=1, keepdim=True).clamp_min(1e-12)


def to_finer_by_window(relevance: torch.Tensor, shares: torch.Tensor, conv: torch.nn.Conv2d, fine: tuple) -> torch.Tensor:
    """B x L coarse relevance -> B x (h w) over the finer tokens, each coarse token's relevance split over the
    window its patch embedding reads by `window_shares` (overlapping windows add up), so the total is kept."""
    k = conv.kernel_size[0]
    spread = shares * relevance.unsqueeze(1)  # B x K x L
    folded = F.fold(spread, fine, k, padding=conv.padding[0], stride=conv.stride[0])  # B x 1 x h x w
    return folded.flatten(1)


def spread_depthwise(relevance: torch.Tensor, shares: torch.Tensor, grid: tuple, kernel: int = 3) -> torch.Tensor:
    """B x N relevance at the Mix-FFN's output -> B x N at its input: each token's relevance split over the 3 x 3
    window its depthwise convolution reads by `depthwise_shares` (a share past the border is 0), so the total is
    kept."""
    folded = F.fold(shares * relevance.unsqueeze(1), tuple(grid), kernel, padding=kernel // 2)
    return folded.flatten(1)


def to_finer_grid(relevance: torch.Tensor, coarse: tuple, fine: tuple) -> torch.Tensor:
    """B x (h_c w_c) -> B x (h_f w_f): each coarse token's relevance split evenly over the finer tokens nearest to
    it (the patch embedding between stages has stride 2), so the total is kept."""
    device = relevance.device
    rows = torch.clamp((torch.arange(fine[0], device=device) * coarse[0]) // fine[0], max=coarse[0] - 1)
    cols = torch.clamp((torch.arange(fine[1], device=device) * coarse[1]) // fine[1], max=coarse[1] - 1)
    parent = (rows[:, None] * coarse[1] + cols[None, :]).flatten()  # h_f w_f
    children = torch.bincount(parent, minlength=coarse[0] * coarse[1]).clamp_min(1).to(relevance.dtype)
    return relevance[:, parent] / children[parent]
