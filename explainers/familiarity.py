"""Does this image look like the images the model learned from? A warning before an explanation of a prediction
that may mean nothing (a coffee cup given to a blood-cell model is still "eosinophil, 89%").

The score is the Mahalanobis distance of the image's pre-logit features (the classifier head's input) to the
nearest class mean, with one covariance shared by the classes (Lee et al. 2018, "A simple unified framework for
detecting out-of-distribution samples"; the one-layer form, no input perturbation). It is measured in the same
forward pass as the prediction (a pre-hook on the head), so the check costs no model pass of its own.

    stats = fit(bundle, "../shared/data/bloodmnist/64/train", "../shared/data/bloodmnist/64/val")  # once
    save(stats, "weights/bloodmnist-vit.familiarity.safetensors")
    prediction, verdict = engine.predict_and_check(bundle, image)   # verdict: None without statistics

The threshold is a quantile of the validation images' scores (`quantile`, 0.99 by default: about 1 in 100 images
like the training data is flagged); the verdict says where the image's score lies among them.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

QUANTILE = 0.99
SHRINKAGE = 1e-3  # of the covariance's mean variance, added to its diagonal: a stable inverse with few images
_LOCK = threading.Lock()
_CACHE: dict = {}


@dataclass
class FamiliarityStats:
    """Class means (C x D) and the shared precision (D x D) of pre-logit features, the validation scores' sorted
    values (for percentiles) and the flagging threshold; `source`: what they were fitted on (for the card)."""

    means: torch.Tensor
    precision: torch.Tensor
    val_scores: torch.Tensor
    threshold: float
    source: dict

    def score(self, features: torch.Tensor) -> torch.Tensor:
        """The distance to the nearest class mean, B features (B x D) -> B scores (higher = less familiar)."""
        features = features.to(self.means.dtype)
        diff = features.unsqueeze(1) - self.means.unsqueeze(0)  # B x C x D
        squared = torch.einsum("bcd,de,bce->bc", diff, self.precision, diff)
        return squared.clamp_min(0).amin(dim=1).sqrt()

    def percentile(self, score: float) -> float:
        """The share (0-100) of validation images whose score is below `score`."""
        values = self.val_scores
        return 100.0 * float((values < score).sum()) / max(1, values.numel())


def classifier_head(network: nn.Module) -> nn.Module:
    """The module whose input is the pre-logit feature vector: timm's `get_classifier()`, else the last Linear."""
    head = network.get_classifier() if hasattr(network, "get_classifier") else None
    if isinstance(head, nn.Module) and any(p.numel() for p in head.parameters()):
        return head
    linears = [m for m in network.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("this model has no linear classifier head to read pre-logit features from")
    return linears[-1]


PRE_LOGITS = "pre_logits"
WITH_PATCH_MEAN = "pre_logits+patch_mean"
FEATURES = (PRE_LOGITS, WITH_PATCH_MEAN)


def _token_norm(bundle) -> nn.Module:
    """A class-token ViT's final norm, whose output holds every token (B x N x D)."""
    norm = getattr(bundle.network, "norm", None)
    if not bundle.is_vit or not isinstance(norm, nn.Module) or isinstance(norm, nn.Identity):
        raise ValueError(f"'{WITH_PATCH_MEAN}' needs a ViT with a final token norm; {bundle.name} has none")
    return norm


def feature_kind(bundle) -> str:
    """The features the model's statistics were fitted on (pre-logits where it has none)."""
    stats = get_stats(bundle)
    return (stats.source.get("features") if stats is not None else None) or PRE_LOGITS


@torch.no_grad()
def logits_and_features(bundle, images: torch.Tensor, features: str | None = None) -> tuple:
    """(logits B x C, features B x D) from one forward pass: hooks read the head's input (the pre-logits) and, for
    `WITH_PATCH_MEAN` (ViTs), the final norm's tokens, whose patch-token mean is appended (the class token alone
    lets through whole blood smears that the patches show plainly). `features`: None = what the model's
    statistics use."""
    features = feature_kind(bundle) if features is None else features
    if features not in FEATURES:
        raise ValueError(f"features must be one of {', '.join(FEATURES)}, got {features!r}")
    seen, tokens = [], []
    handles = [classifier_head(bundle.network).register_forward_pre_hook(lambda module, args: seen.append(args[0]))]
    if features == WITH_PATCH_MEAN:
        handles.append(_token_norm(bundle).register_forward_hook(lambda module, args, out: tokens.append(out)))
    try:
        logits = bundle(images)
    finally:
        for handle in handles:
            handle.remove()
    if not seen:
        raise ValueError("the classifier head was not called in the forward pass")
    parts = [seen[-1].flatten(1)]
    if features == WITH_PATCH_MEAN:
        parts.append(tokens[-1][:, bundle.num_prefix_tokens:].mean(dim=1))
    return logits, torch.cat(parts, dim=1).float()


@torch.no_grad()
def dataset_features(bundle, dataset, batch_size: int = 128, progress=None, features: str | None = None) -> tuple:
    """(features N x D, labels N) of every image of a data set, prepared as the app prepares an upload."""
    from .data import model_batches

    rows, labels = [], []
    for chunk, images in model_batches(dataset, bundle, batch_size=batch_size):
        with bundle.lock:
            _, batch = logits_and_features(bundle, images, features)
        rows.append(batch.cpu())
        labels.extend(int(dataset.labels[i]) for i in chunk)
        if progress is not None:
            progress(chunk[-1] + 1, len(dataset))
    return torch.cat(rows), torch.tensor(labels)


def fit(bundle, train_data, val_data, *, quantile: float = QUANTILE, features: str = PRE_LOGITS,
        progress=None) -> FamiliarityStats:
    """Class means and shared covariance of the training images' `features` (labels from labels.csv); the threshold
    is the `quantile` of the validation images' scores."""
    from .data import open_dataset

    if not 0.5 <= quantile < 1:
        raise ValueError(f"quantile must be in [0.5, 1), got {quantile}")
    kind = features
    train = open_dataset(train_data, split="train")
    train_features, labels = dataset_features(bundle, train, progress=progress, features=kind)
    classes = sorted(set(labels.tolist()))
    if classes and not (0 <= classes[0] and classes[-1] < bundle.num_classes):
        raise ValueError(f"the training labels must be class indices of {bundle.name} (0..{bundle.num_classes - 1}); "
                         f"{train_data} has {classes[0]}..{classes[-1]}")
    if len(classes) < 2:
        raise ValueError("the training data has fewer than two classes")
    means = torch.zeros(bundle.num_classes, train_features.shape[1], dtype=torch.float64)
    centred = []
    for c in classes:
        members = train_features[labels == c].double()
        means[c] = members.mean(dim=0)
        centred.append(members - means[c])
    present = torch.tensor(classes)
    centred = torch.cat(centred)
    covariance = centred.T @ centred / max(1, len(centred) - len(classes))
    covariance += SHRINKAGE * covariance.diagonal().mean() * torch.eye(len(covariance), dtype=covariance.dtype)
    stats = FamiliarityStats(means=means[present], precision=torch.linalg.inv(covariance),
                             val_scores=torch.zeros(0, dtype=torch.float64), threshold=float("inf"), source={})
    val = open_dataset(val_data, split="val")
    val_scores = stats.score(dataset_features(bundle, val, features=kind)[0]).sort().values
    stats.val_scores = val_scores
    stats.threshold = float(torch.quantile(val_scores, quantile))
    stats.source = {"model": bundle.name, "features": kind, "train": str(train_data), "train_images": len(train),
                    "val": str(val_data), "val_images": len(val), "quantile": quantile,
                    "score": f"Mahalanobis distance of the features ({kind}) to the nearest class mean, shared "
                             f"covariance (+{SHRINKAGE} x mean variance on the diagonal)"}
    return stats


def save(stats: FamiliarityStats, path) -> Path:
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"means": stats.means.contiguous(), "precision": stats.precision.contiguous(),
               "val_scores": stats.val_scores.contiguous()}, str(path),
              metadata={"threshold": repr(stats.threshold), "source": json.dumps(stats.source)})
    return path


def load(path) -> FamiliarityStats:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        meta = handle.metadata() or {}
        tensors = {key: handle.get_tensor(key) for key in ("means", "precision", "val_scores")}
    return FamiliarityStats(**tensors, threshold=float(meta["threshold"]), source=json.loads(meta.get("source", "{}")))


def stats_path(model_name: str) -> Path | None:
    """Where a model's statistics are: the code's weights/ (bundled models), else the user's models folder."""
    from .models import card_folders, safe_name

    for folder in card_folders():
        path = folder / f"{safe_name(model_name)}.familiarity.safetensors"
        if path.exists():
            return path
    return None


def _key(bundle) -> tuple:
    return bundle.name, id(bundle.network)


def get_stats(bundle) -> FamiliarityStats | None:
    """The model's statistics (loaded once), or None where it has none (hub models: their training data is not
    here; the check then says nothing rather than guess)."""
    key = _key(bundle)
    with _LOCK:
        if key not in _CACHE:
            path = stats_path(bundle.name)
            _CACHE[key] = load(path) if path is not None else None
        return _CACHE[key]


def register_stats(bundle, stats: FamiliarityStats | None) -> None:
    """Use these statistics for this model instance (tests; None: none)."""
    with _LOCK:
        _CACHE[_key(bundle)] = stats


def verdict(stats: FamiliarityStats, score: float, model_name: str) -> dict:
    """The check's result as a JSON-ready dict, with a sentence for a person where the image is unfamiliar."""
    unfamiliar = score > stats.threshold
    percentile = stats.percentile(score)
    record = {"score": round(float(score), 3), "threshold": round(stats.threshold, 3),
              "quantile": stats.source.get("quantile", QUANTILE), "unfamiliar": bool(unfamiliar),
              "validation_percentile": round(percentile, 1)}
    if unfamiliar:
        record["message"] = (f"This image does not look like the images {model_name} learned from: its features lie "
                             f"further from all of the model's classes than those of {percentile:.1f}% of its "
                             f"validation images (score {score:.1f}; flagged above {stats.threshold:.1f}). The "
                             "prediction may mean nothing, and so may its explanation.")
    return record


@torch.no_grad()
def forward_and_check(bundle, images: torch.Tensor) -> tuple:
    """(logits B x C, a verdict per image or None where the model has no statistics): the model's forward pass and
    the check read in it. The one place the prediction passes of the app, `evaluate`, reviews and studies go
    through; it takes the bundle's lock (the hooks sit on the shared network)."""
    stats = get_stats(bundle)
    with bundle.lock:
        if stats is None:
            return bundle(images), None
        logits, features = logits_and_features(bundle, images)
    return logits, [verdict(stats, float(score), bundle.name) for score in stats.score(features.cpu())]


def flagged_share(bundle, stats: FamiliarityStats, data, *, split: str = "test", limit: int | None = None) -> dict:
    """How many images of a data set (labels not needed) the check flags, with a Wilson 95% interval."""
    from .data import open_dataset
    from .statistics import wilson_interval

    dataset = open_dataset(data, split=split, limit=limit, require_labels=False)
    scores = stats.score(dataset_features(bundle, dataset, features=stats.source.get("features") or PRE_LOGITS)[0])
    flagged = int((scores > stats.threshold).sum())
    return {"data": str(data), "images": len(dataset), "flagged": flagged, "share": flagged / max(1, len(dataset)),
            "share_ci95": list(wilson_interval(flagged, len(dataset))),
            "median_score": float(scores.median()), "threshold": stats.threshold}


def cmd_familiarity(args) -> int:
    from .models import load_model, safe_name
    from .paths import user_models_dir

    bundle = load_model(args.model)
    stats = fit(bundle, args.train, args.val, quantile=args.quantile, features=args.features)
    out = Path(args.out) if args.out else user_models_dir() / f"{safe_name(bundle.name)}.familiarity.safetensors"
    save(stats, out)
    report = {"kind": "familiarity-statistics", **stats.source, "threshold": stats.threshold, "written": str(out),
              "checks": []}
    print(f"{bundle.name}: threshold {stats.threshold:.2f} (the {args.quantile:.0%} quantile of "
          f"{len(stats.val_scores)} validation images); wrote {out}")
    for spec in args.check or []:
        name, _, folder = spec.rpartition("=")
        row = {"name": name or Path(folder).name, **flagged_share(bundle, stats, folder, limit=args.limit)}
        report["checks"].append(row)
        low, high = row["share_ci95"]
        print(f"  {row['name']}: {row['flagged']}/{row['images']} flagged ({row['share']:.1%}, 95% "
              f"[{low:.1%}, {high:.1%}]), median score {row['median_score']:.2f}")
    report["command"] = "python -m explainers familiarity " + " ".join(
        f"--{key.replace('_', '-')} {value}" for key, value in vars(args).items()
        if key in ("model", "train", "val", "quantile", "features") and value is not None)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))  # the card beside the statistics
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(json.dumps(report, indent=2))
    return 0


def add_familiarity_parser(commands) -> None:
    parser = commands.add_parser("familiarity", help="fit the check that warns when an image does not look like the "
                                                     "model's training images; measure what it flags")
    parser.add_argument("--model", required=True)
    parser.add_argument("--train", required=True, help="the model's training images (folder with labels.csv)")
    parser.add_argument("--val", required=True, help="validation images (labels.csv): the threshold's quantile")
    parser.add_argument("--quantile", type=float, default=QUANTILE,
                        help="share of validation images below the threshold (default 0.99)")
    parser.add_argument("--features", choices=FEATURES, default=PRE_LOGITS,
                        help="the classifier head's input; ViTs: also the mean of the patch tokens after the final "
                             "norm")
    parser.add_argument("--out", default=None, help="the statistics (.safetensors); default: the data folder's "
                                                    "models/ (the code's weights/ for a bundled model: give it)")
    parser.add_argument("--check", action="append", metavar="NAME=FOLDER",
                        help="a folder of images (labels not needed) to count the flagged share of (repeatable)")
    parser.add_argument("--limit", type=int, default=None, help="at most N images per --check folder (spread)")
    parser.add_argument("--report", default=None, help="JSON report of the fit and the checks")
    parser.set_defaults(handler=cmd_familiarity)
