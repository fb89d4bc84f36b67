"""The AHA explainer network (methods.md section 2, "choice"): works for any timm backbone.

- Features: the frozen target classifier's own multi-level features from ONE call of timm's
  `forward_intermediates`; its final features go through `forward_head`, so the prediction the UI shows
  comes from the same pass (`predict_and_explain`).
- Class conditioning: a class embedding made from the classifier's own weight row for the class (a small
  learned projection of the frozen `get_classifier().weight[c]`, so it generalises to classes never seen in
  training; a learned `nn.Embedding` where the classifier is not a plain linear layer), applied by FiLM at
  every level, plus the class activation channel <final features, w_c> (standardised) fed to the coarsest
  level and as a skip to the output.
- Decoder: DPT-style. Per level a 1x1 projection to `width` channels (ViT levels, all at the patch grid,
  are reassembled at 4x, 2x, 1x, 0.5x as in DPT), fusion coarse -> fine with residual conv units, then the
  output head (3x3 conv, ReLU, 1x1 conv, bilinear upsampling to the input size). The map is unbounded
  (higher = more important): gain * (cam_weight * CAM + head output). The head's last conv starts at zero,
  so an untrained explainer returns the class activation map; training (and test-time refinement of
  `head`) moves it towards the deletion/insertion optimum. The CAM skip is used on globally pooled networks
  only: on class-token ViTs the patch-token CAM points the wrong way (measured), so there it is off.
  The loss only sees a map's ranking (standardised scores), so the gain is inert: refinement leaves it.
- Output blur (`output_blur`, sigma in input pixels, default 0): a Gaussian blur of the output map, chosen
  after training on held-out images by `aha-output-blur` (no parameter; the card's architecture holds it).
- What `predict_and_explain` returns is standardised per image (mean 0, unit spread), as the refined and the
  per-image maps are: the raw map's offset is arbitrary (the loss reads ranks only), so without this its sign,
  which the grid pointing game and a signed colour scale read, would mean nothing. The ranking is unchanged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..resize import resize_bilinear
from ..smoothing import gaussian_smooth

DEFAULT_ARCH = {"levels": 4, "width": 32, "embed_dim": 64, "gain_init": 10.0}
PRIORS = ("cam", "rollout", "none")
# A class-specific input beside a class-blind prior (rollout): "token_logits" reads every final patch token through
# the classifier's own head row (log-softmax over the classes, so it says which class each token looks like) from
# the same pass; "none" (explainers saved before it) has no such input.
CLASS_INPUTS = ("none", "token_logits")


@dataclass
class Encoded:
    """What one classifier pass gives the decoder (per image)."""

    logits: torch.Tensor  # B x classes
    levels: list  # of B x C_l x h_l x w_l
    final_grid: torch.Tensor | None  # B x C x h x w, the features the classifier head pools
    image_hw: tuple
    class_tokens: torch.Tensor | None = None  # B x C x h x w final patch tokens, for the class input

    def select(self, index: torch.Tensor) -> "Encoded":
        return Encoded(self.logits[index], [level[index] for level in self.levels],
                       None if self.final_grid is None else self.final_grid[index], self.image_hw,
                       None if self.class_tokens is None else self.class_tokens[index])


class ResidualConvUnit(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1)

    def forward(self, x):
        return x + self.conv2(F.relu(self.conv1(F.relu(x))))


class FusionBlock(nn.Module):
    """DPT's fusion: out = RCU(RCU(skip) + upsampled coarser). `units=1` drops the skip path's RCU (lighter)."""

    def __init__(self, width: int, units: int = 2):
        super().__init__()
        self.skip = ResidualConvUnit(width) if units >= 2 else nn.Identity()
        self.out = ResidualConvUnit(width)

    def forward(self, skip, coarser=None):
        out = self.skip(skip)
        if coarser is not None:
            if coarser.shape[-2:] != skip.shape[-2:]:
                coarser = resize_bilinear(coarser, skip.shape[-2:])
            out = out + coarser
        return self.out(out)


class OutputHead(nn.Module):
    """The part refined at test time: a 3x3 conv, ReLU, a 1x1 conv (zero-initialised), the output gain and
    the weight of the class-activation skip."""

    def __init__(self, width: int, gain_init: float):
        super().__init__()
        self.conv1 = nn.Conv2d(width, max(8, width // 2), 3, padding=1)
        self.conv2 = nn.Conv2d(max(8, width // 2), 1, 1)
        nn.init.zeros_(self.conv2.weight)
        nn.init.zeros_(self.conv2.bias)
        self.log_gain = nn.Parameter(torch.tensor(math.log(gain_init)))
        self.cam_weight = nn.Parameter(torch.tensor(1.0))

    def forward(self, fused: torch.Tensor, cam: torch.Tensor | None, image_hw: tuple) -> torch.Tensor:
        return self.forward_with(dict(self.named_parameters()), fused, cam, image_hw)

    @staticmethod
    def forward_with(params: dict, fused: torch.Tensor, cam: torch.Tensor | None, image_hw: tuple) -> torch.Tensor:
        """Pure function of `params` (no module state is touched): refinement runs it on per-call copies,
        so concurrent refinements never see each other's weights."""
        out = F.conv2d(fused, params["conv1.weight"], params["conv1.bias"], padding=1)
        out = F.conv2d(F.relu(out), params["conv2.weight"], params["conv2.bias"])
        out = resize_bilinear(out, image_hw).squeeze(1)
        if cam is not None:
            out = out + params["cam_weight"] * cam
        return params["log_gain"].exp() * out


def _level_indices(network: nn.Module, levels: int) -> tuple:
    """Which intermediates to take: the last `levels` stages of a hierarchical network; for plain ViTs
    (every block at the patch grid) evenly spaced blocks as in DPT (e.g. 2, 5, 8, 11 of 12)."""
    info = getattr(network, "feature_info", None)
    available = len(info) if info is not None else levels
    reductions = [f.get("reduction") for f in info] if info is not None else []
    uniform = bool(reductions) and len(set(reductions)) == 1
    levels = min(levels, available)
    if uniform:
        step = available / levels
        return tuple(int(round(step * (i + 1))) - 1 for i in range(levels)), True
    return tuple(range(available - levels, available)), False


def pools_class_token(network: nn.Module) -> bool:
    """True for networks whose head reads a class/prefix token (timm ViTs with global_pool 'token' or 'map')."""
    pool = getattr(network, "global_pool", None)
    return isinstance(pool, str) and pool in ("token", "map") and int(getattr(network, "num_prefix_tokens", 0)) > 0


def attention_rollout_grid(attentions: list, bundle, image_hw: tuple) -> torch.Tensor:
    """Attention rollout (mean over heads, identity for the skip) read at the class token: B x 1 x gh x gw."""
    from ..attention import class_token_relevance, tokens_to_map

    rollout = None
    for attention in attentions:
        fused = attention.float().mean(dim=1)
        step = 0.5 * fused + 0.5 * torch.eye(fused.shape[-1], device=fused.device)
        step = step / step.sum(dim=-1, keepdim=True)
        rollout = step if rollout is None else step @ rollout
    return tokens_to_map(class_token_relevance(rollout, bundle), bundle, image_hw).unsqueeze(1)


MAX_OUTPUT_BLUR = 64.0


def check_output_blur(sigma) -> float:
    """A blur sigma in input pixels, 0..64 (0 = none)."""
    try:
        value = float(sigma)
    except (TypeError, ValueError):
        raise ValueError(f"output_blur must be a number of pixels in [0, {MAX_OUTPUT_BLUR:g}], got {sigma!r}") from None
    if isinstance(sigma, bool) or not 0.0 <= value <= MAX_OUTPUT_BLUR:
        raise ValueError(f"output_blur must be a number of pixels in [0, {MAX_OUTPUT_BLUR:g}], got {sigma!r}")
    return value


def standardise(maps: torch.Tensor) -> torch.Tensor:
    """B x H x W maps with mean 0 and unit (population) spread per image; the ranking is unchanged. A flat map
    stays flat (all 0)."""
    flat = maps.flatten(1)
    centred = flat - flat.mean(1, keepdim=True)
    return (centred / flat.std(1, keepdim=True, unbiased=False).clamp_min(1e-6)).view_as(maps)


def resolve_targets(logits: torch.Tensor, targets=None) -> torch.Tensor:
    """One target per image: the top-1 classes when None; a single target is repeated for the batch."""
    if targets is None:
        return logits.argmax(dim=1)
    targets = torch.as_tensor(targets, dtype=torch.long, device=logits.device).view(-1)
    return targets.expand(logits.shape[0]) if targets.numel() == 1 else targets


class AHAExplainer(nn.Module):
    """Explainer for one classifier (a `ModelBundle`). Only the decoder's parameters live in this module;
    the classifier is held by reference, frozen, and never saved with the explainer."""

    def __init__(self, bundle, *, levels: int = 4, width: int = 32, embed_dim: int = 64, gain_init: float = 10.0,
                 class_embedding: str = "auto", use_cam: bool = True, indices=None, scales=None,
                 fusion_units: int = 2, prior: str = "auto", output_blur: float = 0.0, class_input: str = "none",
                 class_boost: float = 0.0, class_contrast: float = 0.0):
        super().__init__()
        # a Gaussian blur (sigma in input pixels) of the output map, chosen after training on held-out images
        # (`python -m explainers aha-output-blur`); 0 = none. No parameter: the weights do not change.
        self.output_blur = check_output_blur(output_blur)
        object.__setattr__(self, "bundle", bundle)  # not a submodule: never trained, never saved
        network = bundle.network
        auto_indices, uniform = _level_indices(network, levels)
        self.indices = tuple(indices) if indices is not None else auto_indices
        self.arch = {"levels": len(self.indices), "width": width, "embed_dim": embed_dim, "gain_init": gain_init,
                     "class_embedding": class_embedding, "use_cam": use_cam, "indices": list(self.indices)}
        with torch.no_grad():
            probe = torch.zeros(1, 3, *bundle.input_size, device=bundle.device)
            final, inter = self._features(probe)
        channels = [t.shape[1] for t in inter]
        sizes = [tuple(t.shape[-2:]) for t in inter]
        if scales is None:
            scales = [1.0] * len(sizes)
            if len(set(sizes)) == 1 and len(sizes) > 1:  # plain ViT: DPT's reassembly at 4x, 2x, 1x, 0.5x ...
                stride = min(bundle.input_size) / min(sizes[0])
                cap = max(1.0, stride / 4)  # ... but never finer than stride 4 (patch 8 at 64 px: 2x, 2x, 1x, 0.5x)
                scales = [min(cap, 2.0 ** (len(sizes) - 2 - i)) for i in range(len(sizes))]
        self.scales = [float(v) for v in scales]
        self.arch["scales"] = self.scales

        classifier = network.get_classifier() if hasattr(network, "get_classifier") else None
        head_weight = getattr(classifier, "weight", None) if isinstance(classifier, nn.Linear) else None
        self._final_channels = None
        if head_weight is not None and head_weight.shape[0] == bundle.num_classes:
            grid = self._final_to_grid(final, sizes[-1], head_weight.shape[1])
            if grid is not None:
                self._final_channels = head_weight.shape[1]
        mode = class_embedding
        if mode == "auto":
            mode = "head" if head_weight is not None and head_weight.shape[0] == bundle.num_classes else "learned"
        self.class_mode = mode
        self.arch["class_embedding"] = mode
        if mode == "head":
            self.class_proj = nn.Sequential(nn.Linear(head_weight.shape[1], embed_dim), nn.GELU(),
                                            nn.Linear(embed_dim, embed_dim))
        else:
            self.class_table = nn.Embedding(bundle.num_classes, embed_dim)
        # The prior map the decoder starts from (its output skip). A CAM from the patch tokens is not what a
        # class-token ViT classifies from: measured on the bundled ViT it ranks worse than random
        # (methods.md, "Priors"), so class-token ViTs take attention rollout (from the same pass) instead.
        # "auto" resolves per network; explainers saved before priors existed said only use_cam.
        if prior == "auto":
            if not use_cam:
                prior = "none"
            elif pools_class_token(network) and getattr(bundle, "is_vit", False):
                prior = "rollout"
            else:
                prior = "cam"
        if prior not in PRIORS:
            raise ValueError(f"prior must be one of {', '.join(PRIORS)} or 'auto', got {prior!r}")
        if prior == "cam" and self._final_channels is None:
            prior = "none"
        if prior == "rollout" and not getattr(bundle, "is_vit", False):
            raise ValueError(f"a rollout prior needs a ViT; '{bundle.name}' is not one")
        self.prior = prior
        self.use_cam = prior != "none"  # the prior's channel and skip (named after the first prior, the CAM)
        self.arch["use_cam"] = self.use_cam
        self.arch["prior"] = prior

        self.projections = nn.ModuleList(nn.Conv2d(c, width, 1) for c in channels)
        self.films = nn.ModuleList(nn.Linear(embed_dim, 2 * width) for _ in channels)
        for film in self.films:
            nn.init.zeros_(film.weight)
            nn.init.zeros_(film.bias)
        self.class_bias = nn.Linear(embed_dim, width)  # additive class embedding at the coarsest level
        if self.use_cam:
            self.cam_proj = nn.Conv2d(1, width, 1)
        if class_input not in CLASS_INPUTS:
            raise ValueError(f"class_input must be one of {', '.join(CLASS_INPUTS)}, got {class_input!r}")
        if class_input == "token_logits" and self._final_channels is None:
            raise ValueError(f"a token_logits class input needs a linear classifier head over patch tokens; "
                             f"'{bundle.name}' has none")
        self.class_input = class_input
        self.arch["class_input"] = class_input
        # the weight of the class input added to the standardised one-pass map, chosen after training on validation
        # data (bench/studies/aha_class_mix_val.py); no parameter, 0 = none
        self.class_boost = float(class_boost)
        if self.class_boost and class_input == "none":
            raise ValueError("class_boost needs a class input")
        if not 0.0 <= self.class_boost <= 10.0:
            raise ValueError(f"class_boost must lie in [0, 10], got {class_boost}")
        self.arch["class_boost"] = self.class_boost
        # the weight of the contrast map (each token's logit for the target minus its logit for the predicted class)
        # added to the standardised one-pass map of every class but the predicted one: the predicted class's map,
        # the one the curves of an explanation read by default, stays the trained one. No parameter, 0 = none;
        # chosen on validation data (bench/studies/aha_class_mix_val.py --term contrast)
        self.class_contrast = float(class_contrast)
        if not 0.0 <= self.class_contrast <= 10.0:
            raise ValueError(f"class_contrast must lie in [0, 10], got {class_contrast}")
        if self.class_contrast and self._final_channels is None:
            raise ValueError(f"a class contrast needs a linear classifier head over patch tokens; "
                             f"'{bundle.name}' has none")
        self.arch["class_contrast"] = self.class_contrast
        if class_input != "none":
            # zero-initialised: a warm start from an explainer without this input begins with its maps unchanged
            self.class_inputs = nn.ModuleList(nn.Conv2d(1, width, 1) for _ in channels)
            for conv in self.class_inputs:
                nn.init.zeros_(conv.weight)
                nn.init.zeros_(conv.bias)
            self.class_mix = nn.Parameter(torch.tensor(0.0))  # its weight in the output skip beside the prior
        self.fusions = nn.ModuleList(FusionBlock(width, fusion_units) for _ in channels)
        self.arch["fusion_units"] = int(fusion_units)
        self.arch["output_blur"] = self.output_blur
        self.head = OutputHead(width, gain_init)

    # --- the classifier pass ------------------------------------------------------------------------
    def _features(self, x01: torch.Tensor):
        network = self.bundle.network
        return network.forward_intermediates(self.bundle.normalize(x01), indices=list(self.indices),
                                             intermediates_only=False)

    def _final_to_grid(self, final: torch.Tensor, grid_hw: tuple, channels: int):
        """The features the classifier head pools, as B x C x h x w (tokens, NHWC or NCHW)."""
        if final.dim() == 3 and final.shape[-1] == channels:
            prefix = int(getattr(self.bundle.network, "num_prefix_tokens", 0))
            tokens = final[:, prefix:]
            n = tokens.shape[1]
            h, w = grid_hw if grid_hw[0] * grid_hw[1] == n else (int(math.isqrt(n)), n // max(1, int(math.isqrt(n))))
            if h * w != n:
                return None
            return tokens.transpose(1, 2).reshape(final.shape[0], channels, h, w)
        if final.dim() == 4:
            if final.shape[1] == channels:
                return final
            if final.shape[-1] == channels:
                return final.permute(0, 3, 1, 2)
        return None

    def encode(self, images: torch.Tensor) -> Encoded:
        """One classifier pass: logits (== bundle(images)) and the decoder's features. No gradient."""
        with torch.no_grad():
            grid = None
            if self.prior == "rollout":  # the attention of this same pass, recorded by hooks
                from ..attention import AttentionRecorder

                with AttentionRecorder(self.bundle) as recorder:
                    final, inter = self._features(images)
                grid = attention_rollout_grid(recorder.attentions, self.bundle, tuple(images.shape[-2:]))
            else:
                final, inter = self._features(images)
            logits = self.bundle.network.forward_head(final)
            if self.prior == "cam":
                grid = self._final_to_grid(final, tuple(inter[-1].shape[-2:]), self._final_channels)
            tokens = None
            if self.class_input == "token_logits" or self.class_contrast:
                tokens = self._final_to_grid(final, tuple(inter[-1].shape[-2:]), self._final_channels)
        return Encoded(logits=logits, levels=list(inter), final_grid=grid, image_hw=tuple(images.shape[-2:]),
                       class_tokens=tokens)

    # --- the decoder ---------------------------------------------------------------------------------
    def class_vectors(self, targets: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The class embedding from the classifier's weight rows for `targets`; `rows` (B x C) gives other head
        rows instead (training on re-initialised heads, `bench/studies/aha_head_sensitivity.py`)."""
        if self.class_mode == "head":
            if rows is None:
                rows = self.bundle.network.get_classifier().weight.detach()[targets]
            rows = rows.float()
            rows = rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-6)
            return self.class_proj(rows)
        return self.class_table(targets)

    def class_activation(self, encoded: Encoded, targets: torch.Tensor) -> torch.Tensor | None:
        """Standardised <final features, w_c> at the input size (B x H x W), or None."""
        if not self.use_cam or encoded.final_grid is None:
            return None
        if self.prior == "rollout":  # class-agnostic: B x 1 x h x w
            cam = encoded.final_grid[:, 0].float()
        else:
            weight = self.bundle.network.get_classifier().weight.detach()
            cam = torch.einsum("bchw,bc->bhw", encoded.final_grid.float(), weight[targets].float())
        flat = cam.flatten(1)
        # (unbiased std, as the shipped explainers were trained with; a 1-cell map has none: scale 1)
        spread = flat.std(1) if flat.shape[1] > 1 else torch.ones_like(flat[:, 0])
        cam = (cam - flat.mean(1).view(-1, 1, 1)) / spread.clamp_min(1e-6).view(-1, 1, 1)
        return cam

    def class_token_map(self, encoded: Encoded, targets: torch.Tensor) -> torch.Tensor | None:
        """The class input (B x h x w, standardised): each final patch token read by the classifier's head (weight
        row and bias), log-softmax over the classes, at the target class. Class-specific by construction, from
        the same pass (no gradient), so it costs a matrix product."""
        if self.class_input == "none" or encoded.class_tokens is None:
            return None
        logits = self.token_logits(encoded)
        chosen = logits.log_softmax(dim=1).gather(1, targets.view(-1, 1, 1, 1).expand(-1, 1, *logits.shape[-2:]))
        return standardise(chosen[:, 0])

    def token_logits(self, encoded: Encoded) -> torch.Tensor:
        """B x classes x h x w: every final patch token read by the classifier's head (weight and bias)."""
        head = self.bundle.network.get_classifier()
        logits = torch.einsum("bchw,kc->bkhw", encoded.class_tokens.float(), head.weight.detach().float())
        if head.bias is not None:
            logits = logits + head.bias.detach().float().view(1, -1, 1, 1)
        return logits

    def class_contrast_map(self, encoded: Encoded, targets: torch.Tensor) -> torch.Tensor:
        """B x h x w, standardised: each token's logit for the target minus its logit for the image's predicted
        class (where the target out-scores the prediction). All 0 where the target is the predicted class. From the
        same pass (no gradient): a matrix product."""
        if encoded.class_tokens is None:
            raise ValueError("this pass kept no patch tokens: the explainer has no class contrast")
        logits = self.token_logits(encoded)
        predicted = encoded.logits.argmax(dim=1)
        picked = torch.stack([targets, predicted], dim=1).view(-1, 2, 1, 1).expand(-1, 2, *logits.shape[-2:])
        pair = logits.gather(1, picked)
        return standardise(pair[:, 0] - pair[:, 1])

    def trunk(self, encoded: Encoded, targets: torch.Tensor, class_rows: torch.Tensor | None = None):
        """Everything before the output head: (fused finest features, CAM at input size or None)."""
        if class_rows is not None and self.prior == "cam":
            raise ValueError("class_rows needs a class-agnostic prior (the CAM reads the classifier's own rows)")
        if class_rows is not None and self.class_mode != "head":
            raise ValueError("class_rows needs the head class embedding (this explainer learnt a table of classes)")
        embedding = self.class_vectors(targets, class_rows)
        cam = self.class_activation(encoded, targets)
        class_map = self.class_token_map(encoded, targets)
        projected = []
        for index, (level, projection, film, scale) in enumerate(
                zip(encoded.levels, self.projections, self.films, self.scales)):
            x = projection(level.float())
            if scale != 1.0:
                size = tuple(max(1, int(round(s * scale))) for s in x.shape[-2:])
                x = F.adaptive_avg_pool2d(x, size) if scale < 1 else resize_bilinear(x, size)
            gamma, beta = film(embedding).chunk(2, dim=1)
            x = x * (1 + gamma[..., None, None]) + beta[..., None, None]
            if class_map is not None:
                x = x + self.class_inputs[index](F.adaptive_avg_pool2d(class_map.unsqueeze(1), x.shape[-2:]))
            projected.append(x)
        coarsest = projected[-1] + self.class_bias(embedding)[..., None, None]
        if cam is not None:
            coarse_cam = F.adaptive_avg_pool2d(cam.unsqueeze(1), coarsest.shape[-2:])
            coarsest = coarsest + self.cam_proj(coarse_cam)
        projected[-1] = coarsest
        fused = None
        for x, fusion in zip(reversed(projected), reversed(self.fusions)):
            fused = fusion(x, fused)
        cam_full = None
        if cam is not None:
            cam_full = resize_bilinear(cam, encoded.image_hw)
        if class_map is not None:  # the output skip: the prior plus the class input, weighed by training
            class_full = self.class_mix * resize_bilinear(class_map, encoded.image_hw)
            cam_full = class_full if cam_full is None else cam_full + class_full
        return fused, cam_full

    def smooth(self, maps: torch.Tensor, sigma: float | None = None) -> torch.Tensor:
        """The output blur (B x H x W; unchanged when it is 0). `sigma` overrides the card's `output_blur` for
        this call only (the shared explainer is not changed)."""
        sigma = self.output_blur if sigma is None else check_output_blur(sigma)
        if sigma <= 0:
            return maps
        return gaussian_smooth(maps.unsqueeze(1), sigma).squeeze(1)

    def head_output(self, fused, cam, image_hw, params: dict | None = None, output_blur: float | None = None):
        if params is None:
            return self.smooth(self.head(fused, cam, image_hw), output_blur)
        return self.smooth(OutputHead.forward_with(params, fused, cam, image_hw), output_blur)

    def forward(self, encoded, targets: torch.Tensor, output_blur: float | None = None,
                class_rows: torch.Tensor | None = None) -> torch.Tensor:
        """B x H x W maps (unbounded, higher = more important) for images (B x 3 x H x W in [0, 1]) or an
        `Encoded` pass, and B target classes; `output_blur` (pixels) overrides the card's for this call;
        `class_rows` (B x C) stands in for the classifier's weight rows of the targets."""
        if isinstance(encoded, torch.Tensor):
            encoded = self.encode(encoded)
        targets = targets.to(encoded.logits.device).long().view(-1)
        fused, cam = self.trunk(encoded, targets, class_rows)
        return self.head_output(fused, cam, encoded.image_hw, output_blur=output_blur)

    @torch.no_grad()
    def predict_and_explain(self, images: torch.Tensor, targets=None, output_blur: float | None = None):
        """(logits, standardised maps, targets) from one classifier pass; targets default to the top-1 classes."""
        encoded = self.encode(images)
        targets = resolve_targets(encoded.logits, targets)
        maps = standardise(self.forward(encoded, targets, output_blur))
        if self.class_boost:
            boost = resize_bilinear(self.class_token_map(encoded, targets), encoded.image_hw)
            maps = standardise(maps + self.class_boost * boost)
        if self.class_contrast and bool((targets != encoded.logits.argmax(dim=1)).any()):  # 0 for the prediction
            contrast = resize_bilinear(self.class_contrast_map(encoded, targets), encoded.image_hw)
            maps = standardise(maps + self.class_contrast * contrast)
        return encoded.logits, maps, targets

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
