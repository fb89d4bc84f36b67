"""The one contract every explanation method follows (Captum's shape).

    method = get_method("gradcam", **options)
    maps = method.attribute(bundle, images, targets)   # B x H x W float, higher = more important

`images` are B x 3 x H x W in [0, 1] (the bundle normalises), `targets` a LongTensor of B class indices, or,
for the methods that read their score through the target (`any_target`: occlusion, RISE, Grad-CAM, AHA, the
random map), any `explainers.targets.Target` (a segmentation model's region, ...).
A method that cannot explain a model (e.g. attention rollout on a CNN) raises `MethodNotApplicable` with
a message a user can act on, from `check(bundle)`.

A method class also declares what a user interface needs, so that adding a method is one file: its `label`,
`colour` and `order` in menus, its `user_options` (sliders: range, step, default) and `flag_options` (set by a
caller, not a slider: RISE's mask count), whose ranges the constructor enforces and from which the CLI makes
its flags (`--<method>-<option>`, or the option's `flag`), whether it is a default
choice for a model (`default_for`), a note for its menu entry (`menu_note`), a caveat shown beside its result
where its map can mislead on that model (`caveat`), the options an interactive caller
should use (`interactive_options`, e.g. fewer RISE masks on a CPU), and, where a slider must not rerun the
model, `prepare(bundle, images, targets) -> state` with `state.map(**live_options)` (GradSkip's alpha).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from ..resize import resize_bilinear
from ..targets import ClassTarget, Target, as_target

ALL_FAMILIES = frozenset({"vit", "swin", "convnext", "resnet", "efficientnet", "cnn"})
# the methods that read their score through the target (`any_target`) explain a segmentation model's regions too
ANY_TARGET_FAMILIES = ALL_FAMILIES | {"segformer"}


class MethodNotApplicable(ValueError):
    """This method cannot explain this model (a clear, user-facing reason)."""


@dataclass(frozen=True)
class Option:
    """A user-facing option of a method: a slider in the app (range, step, default), a keyword of the method.

    `live`: the method's prepared state recombines it without a model pass (`state.map(name=value)`), so the
    app redraws while the slider moves; otherwise the method reruns when the slider is released. `rank` orders
    the sliders of all methods (the app names each slider and its endpoints from (method, option):
    `saliency_lab.menus.slider_ids`); `short` names it in a map's caption (default: its keyword); `flag` is its
    command-line flag without the dashes (default: '<method>-<name>', underscores as dashes).
    `minimum`..`maximum` is the range the method accepts, not only the slider's: `Method.__init__` refuses a
    value outside it."""
    name: str
    label: str
    default: float
    minimum: float
    maximum: float
    step: float
    kind: type = float
    info: str = ""
    live: bool = False
    rank: int = 0
    short: str = ""
    flag: str = ""

    def cast(self, value):
        return self.kind(self.default if value is None else value)

    def check(self, value, owner: str = "") -> None:
        """ValueError in plain words when `value` is not a number in minimum..maximum (a whole one for an int)."""
        what = f"{owner}: {self.name}" if owner else self.name
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{what} must be a number, got {value!r}.")
        if self.kind is int and int(value) != value:
            raise ValueError(f"{what} must be a whole number, got {value!r}.")
        if not self.minimum <= value <= self.maximum:
            raise ValueError(f"{what} must be between {self.minimum:g} and {self.maximum:g}, got {value!r}.")


class Method(ABC):
    name: ClassVar[str] = ""
    label: ClassVar[str] = ""  # shown in the UI
    families: ClassVar[frozenset] = ALL_FAMILIES
    description: ClassVar[str] = ""
    colour: ClassVar[str | None] = None  # its colour in figures (None: a fallback colour)
    order: ClassVar[int] = 100  # its place in menus (then by name)
    baseline: ClassVar[bool] = False  # a floor to compare with (the random map): left out of menus by default
    slow: ClassVar[bool] = False  # many model passes per map (RISE): left out of repeated runs (the sanity check)
    quick_pixels: ClassVar[int | None] = None  # a slow method is quick on inputs up to this many pixels (None: any)
    user_options: ClassVar[tuple] = ()  # Option(...) for each slider
    flag_options: ClassVar[tuple] = ()  # Option(...) a caller sets (a CLI flag, a spec) that is no slider
    details: ClassVar[str] = ""  # title of the diagnostics panel (a prepared state with `diagnostics(**options)`)
    score_targets: ClassVar[bool] = False  # accepts a target given as a function of the output (logits -> B scores)
    any_target: ClassVar[bool] = False  # reads its score through the target (`explainers.targets`): any model kind
    # the share of a map's largest values shown in the top colour: a pixel-level map's few extreme pixels would
    # otherwise leave the rest in the low colour (integrated gradients); display only, scores read the map itself
    display_clip: ClassVar[float] = 0.0
    # whether pictures outline the map's above-mean pixels: a pixel-level map's above-mean set is thousands of
    # scattered pixels whose edges would cover the picture in a white grid (its scores still read the set)
    outline_binarised: ClassVar[bool] = True

    @classmethod
    def default_for(cls, bundle) -> bool:
        """Whether the app ticks this method by default for this model."""
        return False

    @classmethod
    def label_for(cls, bundle=None) -> str:
        """Its label where it runs in a mode the model decides (AHA: trained or per image); `bundle` None: a model
        with nothing trained for it (an RL agent). Default: `label`."""
        return cls.label

    @classmethod
    def quick_on(cls, bundle) -> bool:
        """Whether it is fast enough on this model to be picked by default (`quick_pixels`: by its input size)."""
        return cls.quick_pixels is None or bundle.input_size[0] * bundle.input_size[1] <= cls.quick_pixels

    @classmethod
    def menu_note(cls, bundle) -> str | None:
        """A short note after its label in the app's menu for this model (e.g. 'slow on a CPU'), or None."""
        return "slow on a CPU" if cls.slow and bundle.device.type == "cpu" and not cls.quick_on(bundle) else None

    @classmethod
    def caveat(cls, bundle, options: dict | None = None) -> str | None:
        """What a reader of this method's map on this model should know and cannot see in it (one sentence or
        two, shown beside the result and kept in its report), or None. `options`: the result's options (the
        user's and what the method resolved, e.g. AHA's mode)."""
        return None

    @classmethod
    def interactive_options(cls, bundle) -> dict:
        """Options an interactive caller uses for this model (beside the user options)."""
        return {}

    @classmethod
    def model_passes(cls, bundle, options: dict | None = None) -> int:
        """About how many forward passes (a backward counted as two) one map costs on this model with `options`
        (the user and interactive options of the run; None: the defaults): the app's time estimate before a run.
        Gradient methods about three, a baseline none; a method that perturbs the input says how many it makes."""
        return 0 if cls.baseline else 3

    @classmethod
    def display_map(cls, values) -> np.ndarray:
        """The map as coloured for the eye (`display_clip`: its largest values shown in the top colour, as Captum's
        visualisation clips outliers); curves, scores and binarisation use the map itself."""
        values = np.asarray(values, dtype=np.float32)
        finite = values[np.isfinite(values)]
        if not cls.display_clip or finite.size == 0:
            return values
        return np.minimum(values, np.quantile(finite, 1.0 - cls.display_clip)).astype(np.float32)

    @classmethod
    def live_options(cls) -> tuple:
        """Names of the options its prepared state takes without a model pass."""
        return tuple(o.name for o in cls.user_options if o.live)

    @classmethod
    def user_options_by_name(cls) -> dict:
        return {o.name: o for o in cls.user_options}

    @classmethod
    def declared_options(cls) -> tuple:
        """Every option with a declared range: the sliders, then the others."""
        return tuple(cls.user_options) + tuple(cls.flag_options)

    @classmethod
    def has_prepare(cls) -> bool:
        return callable(getattr(cls, "prepare", None))

    def __init__(self, **options):
        """Keeps the options; a declared option (`declared_options`) outside its range is refused here, once for
        every caller (the app's sliders, the CLI's flags, a spec, a notebook)."""
        for option in self.declared_options():
            if options.get(option.name) is not None:
                option.check(options[option.name], self.label or self.name)
        self.options = options

    def check(self, bundle) -> None:
        if bundle.family not in self.families:
            raise MethodNotApplicable(
                f"{self.label or self.name} cannot explain '{bundle.name}' ({bundle.family}): it needs one of "
                f"{', '.join(sorted(self.families))}.")

    @abstractmethod
    def attribute(self, bundle, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """B x H x W maps (higher = more important) for B images and B target classes."""

    def __repr__(self):
        return f"{type(self).__name__}({self.options})"


def as_targets(targets, batch_size: int, device=None):
    """What the engine hands a method: a LongTensor of B class indices for an int, a list or a tensor; a `Target`
    (a region, `explainers.targets`) or a plain function of the outputs passed through. The methods that take any
    target (`any_target`) read it through `as_target`; `check_targets` refuses what a method cannot take."""
    if isinstance(targets, ClassTarget):
        targets = targets.classes
    elif isinstance(targets, Target) or (callable(targets) and not isinstance(targets, torch.Tensor)):
        return targets
    return as_target(targets, batch_size, device).classes


def check_targets(method, targets) -> None:
    """MethodNotApplicable when the method cannot take this target: a method of class indices only (attention
    rollout, GradSkip, ...) takes neither a region nor a function of the output; a function of the whole batch's
    outputs (a critic's V(s)) needs a method that differentiates it (`score_targets`: Grad-CAM, CAMAL)."""
    if isinstance(targets, ClassTarget) or method.score_targets:
        return
    name = method.label or method.name
    if isinstance(targets, Target) and targets.rows_known:
        if not method.any_target:
            raise MethodNotApplicable(f"{name} explains class indices only; a {targets.kind} target works with "
                                      "occlusion, RISE, Grad-CAM, AHA (per image) and the random map.")
    elif callable(targets) and not isinstance(targets, torch.Tensor):
        raise MethodNotApplicable(f"{name} explains class indices only; a target given as a "
                                  "function of the model output (a scalar per image) works with Grad-CAM and CAMAL.")


def target_scores(logits: torch.Tensor, targets) -> torch.Tensor:
    """B scores to explain: the target's score (`Target.score`; class indices: logits[b, targets[b]]; a function
    of the outputs: its value)."""
    return as_target(targets).score(logits)


def repeated_runs(images: torch.Tensor) -> list:
    """[(start, stop)] of the runs of identical consecutive images: one image explained for several classes (the
    grid pointing game's four, a class picker) is perturbed and classified once per run, since each pass gives
    every class's score (RISE, occlusion)."""
    runs = []
    for index in range(images.shape[0]):
        if runs and torch.equal(images[index], images[runs[-1][0]]):
            runs[-1][1] = index + 1
        else:
            runs.append([index, index + 1])
    return [tuple(run) for run in runs]


def upsample(maps: torch.Tensor, size: tuple) -> torch.Tensor:
    """B x h x w -> B x H x W, bilinear (`explainers.resize`: the same map as F.interpolate, several times faster)."""
    return resize_bilinear(maps, size)


def normalize_max(maps: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Divide each map by its maximum (maps are non-negative); an all-zero map stays zero."""
    peak = maps.flatten(1).amax(dim=1).clamp_min(eps).view(-1, 1, 1)
    return maps / peak
