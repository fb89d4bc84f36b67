"""The validation curve of an AHA training run as a small PNG next to its card (Pillow only: the library has
no plotting dependency). Deletion, insertion and their difference (each named with the way it is better, from its
declaration in `explainers.metrics.METRICS`), measured by the evaluation engine on fixed held-out images during
training; the exported step is marked."""
from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageColor, ImageDraw

from ..metrics import CURVE_METRICS, METRICS

SERIES = tuple((key, METRICS[key].heading(), ImageColor.getrgb(METRICS[key].colour)) for key in CURVE_METRICS)


def validation_plot(validation: list, path, *, exported_step: int | None = None, title: str = "",
                    size=(640, 360)) -> Path:
    """Write the PNG and return its path. `validation`: [{"step", "deletion_auc", "insertion_auc", "ins_minus_del"}]."""
    if not validation:
        raise ValueError("no validation points to plot")
    width, height = size
    left, right, top, bottom = 60, 20, 40, 70
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    steps = [int(p["step"]) for p in validation]
    values = [float(p[key]) for p in validation for key, _, _ in SERIES]
    low, high = min(0.0, min(values)), max(1.0 if max(values) > 0.7 else 0.8, max(values))
    span_steps = max(1, max(steps) - min(steps))

    def xy(step, value):
        x = left + (width - left - right) * (step - min(steps)) / span_steps
        y = top + (height - top - bottom) * (1 - (value - low) / (high - low))
        return x, y

    draw.rectangle([left, top, width - right, height - bottom], outline=(120, 120, 120))
    for tick in range(6):
        value = low + (high - low) * tick / 5
        _, y = xy(min(steps), value)
        draw.line([left - 4, y, left, y], fill=(120, 120, 120))
        draw.text((8, y - 6), f"{value:.2f}", fill=(60, 60, 60))
    for step in sorted(set([min(steps), max(steps)] + steps[:: max(1, len(steps) // 6)])):
        x, _ = xy(step, low)
        draw.line([x, height - bottom, x, height - bottom + 4], fill=(120, 120, 120))
        draw.text((x - 10, height - bottom + 6), str(step), fill=(60, 60, 60))
    draw.text((width // 2 - 40, height - bottom + 22), "training step", fill=(60, 60, 60))
    if exported_step is not None:
        x, _ = xy(exported_step, low)
        draw.line([x, top, x, height - bottom], fill=(160, 160, 160), width=1)
        label = f"exported (step {exported_step})"
        draw.text((x + 3 if x < width - 160 else x - 150, top + 2), label, fill=(100, 100, 100))
    for index, (key, label, colour) in enumerate(SERIES):
        points = [xy(p["step"], float(p[key])) for p in validation]
        if len(points) > 1:
            draw.line(points, fill=colour, width=2)
        for x, y in points:
            draw.ellipse([x - 2, y - 2, x + 2, y + 2], fill=colour)
        draw.line([left + 10 + 190 * index, height - 18, left + 30 + 190 * index, height - 18], fill=colour, width=3)
        draw.text((left + 34 + 190 * index, height - 24), label, fill=(40, 40, 40))
    draw.text((left, 12), title or "validation during training (hard AUCs, held-out images)", fill=(20, 20, 20))
    path = Path(path)
    image.save(path)
    return path
