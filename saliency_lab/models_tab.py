"""The Models tab: importing a user's own model (a timm architecture + a safetensors state dict + class names),
listing the imported models and removing one. The work is `explainers.import_model`'s; this module turns the
form's text fields into its arguments and its results into what the tab shows.

    message = import_upload(services, weights_path, classes_path, "resnet50", "my-model", "224 224", "", "", "", "me")
    rows = imported_rows()                     # the table of imported models
    message = remove(services, "my-model")

Errors meant for the user are ValueError (explainers.import_model.ImportRefused is one).
"""
from __future__ import annotations

import time

from explainers import import_model as importer

# A few common architectures for the menu; any timm name can be typed in.
ARCHITECTURES = ("resnet18", "resnet50", "convnext_tiny", "efficientnet_b0", "tf_efficientnet_lite0",
                 "vit_small_patch16_224", "vit_base_patch16_224", "deit_small_patch16_224",
                 "swin_tiny_patch4_window7_224")
TABLE_HEADERS = ["Model", "Architecture", "Classes", "Input", "Mean / std", "sha256", "Imported by", "When"]


def _numbers(text, count: int, label: str, cast=float):
    """'224 224' or '0.5, 0.5, 0.5' -> a list of `count` numbers; '' -> None (the architecture's default)."""
    text = (text or "").replace(",", " ").split()
    if not text:
        return None
    try:
        values = [cast(v) for v in text]
    except ValueError as error:
        raise ValueError(f"{label}: give {count} numbers separated by spaces.") from error
    if len(values) != count:
        raise ValueError(f"{label}: give {count} numbers separated by spaces, not {len(values)}.")
    return values


def _upload_path(upload):
    """A gr.File value (a path, or an object with .name / a dict with 'path') -> a path, or None."""
    if upload is None:
        return None
    if isinstance(upload, dict):
        return upload.get("path") or upload.get("name")
    return getattr(upload, "name", upload)


def import_upload(services, weights, classes, arch, name, input_size="", mean="", std="", model_args="",
                  imported_by="", crop_pct=None) -> str:
    """Import the uploaded files; returns the message for the tab (Markdown)."""
    weights, classes = _upload_path(weights), _upload_path(classes)
    arch = (arch or "").strip()
    if not arch:
        raise ValueError("Pick or type a timm architecture.")
    if not arch.startswith("hf-hub:"):
        if not weights:
            raise ValueError("Upload the weights: a .safetensors file.")
        if not classes:
            raise ValueError("Upload the class names: a text file (one per line) or a CSV.")
    crop = _numbers(crop_pct, 1, "Centre crop")
    started = time.perf_counter()
    card = importer.import_model(arch=arch, name=(name or "").strip(), weights=weights, classes=classes,
                                 input_size=_numbers(input_size, 2, "Input size", int), mean=_numbers(mean, 3, "Mean"),
                                 std=_numbers(std, 3, "Std"), crop_pct=(crop or [None])[0],
                                 model_args=(model_args or "").strip() or None, imported_by=(imported_by or "").strip() or None)
    seconds = time.perf_counter() - started
    if services is not None:
        services.forget_model(card["name"])
    names = ", ".join(card["class_names"][:5]) + (", ..." if len(card["class_names"]) > 5 else "")
    return (f"Imported **{card['name']}** ({card['timm_name']}, {len(card['class_names'])} classes: {names}; input "
            f"{card['input_size'][0]}x{card['input_size'][1]}) in {seconds:.2f} s. It is now in every model menu: "
            f"open the Explain tab and pick it.")


def imported_rows() -> list:
    """One row per imported model (TABLE_HEADERS)."""
    rows = []
    for card in importer.imported_models():
        rows.append([card["name"], card.get("timm_name", ""), len(card.get("class_names", [])),
                     "x".join(str(v) for v in card.get("input_size", [])),
                     " / ".join(" ".join(f"{v:.3f}" for v in card.get(k, [])) for k in ("mean", "std")),
                     card.get("weights_sha256", "")[:12], card.get("imported_by", ""),
                     card.get("imported_at", "").replace("T", " ")[:16]])
    return rows


def removable_choices() -> list:
    return [card["name"] for card in importer.imported_models()]


def remove(services, name) -> str:
    if not name:
        raise ValueError("Pick an imported model to remove.")
    removed = importer.remove_imported_model(name)
    if services is not None:
        services.forget_model(name)
    return f"Removed **{name}** ({len(removed)} files)."
