"""The app's plotly figures as plain JSON-ready specs (deletion/insertion curves, GradSkip's head weights, the
sanity check, fine-tune progress) and its score table. Only `FigureSpec.to_plotly()` imports plotly.
"""
from __future__ import annotations

import json

import numpy as np

from explainers.methods import METHODS, ordered
from explainers.metrics import CURVE_METRICS, METRICS, summary_value
from .pictures import options_text

FALLBACK_COLORS = ("#000000", "#F0E442", "#882255", "#44AA99")


def palette() -> list:
    """Every method's colour, in menu order (Okabe-Ito: colour-blind safe)."""
    return [METHODS[n].colour for n in ordered(METHODS) if METHODS[n].colour]


def color_for(method: str, index: int = 0) -> str:
    cls = METHODS.get(method)
    return (cls.colour if cls is not None and cls.colour else None) or FALLBACK_COLORS[index % len(FALLBACK_COLORS)]


class FigureSpec:
    """A plotly figure as plain JSON-ready dicts: `to_json()` is what a browser's Plotly.react needs (gr.Plot
    accepts this object as it accepts a plotly Figure), `to_plotly()` builds a real `plotly.graph_objects.Figure`.
    Plain dicts because building a validated plotly Figure costs ~80 ms per redraw on a small CPU."""

    def __init__(self, data=None, layout=None):
        self.data = list(data or [])
        self.layout = dict(layout or {})

    def to_dict(self) -> dict:
        return {"data": self.data, "layout": self.layout}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=_json_default)

    def to_plotly(self):
        import plotly.graph_objects as go

        return go.Figure(self.to_dict())

    def show(self):  # pragma: no cover - interactive use
        return self.to_plotly().show()


def _json_default(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


GRID = "#E5ECF6"


def axis_style(**kwargs) -> dict:
    """An axis in the app's plot style (grid and line colours), with `kwargs` on top."""
    return {"gridcolor": GRID, "linecolor": "#BCCCDC", "zerolinecolor": GRID, "automargin": True, **kwargs}


def plot_layout(title: str, height: int, **kwargs) -> dict:
    """A figure's layout in the app's plot style: its title, height, white background, margins; `kwargs` on top."""
    return {"title": {"text": title, "font": {"size": 15}}, "height": height, "paper_bgcolor": "white",
            "plot_bgcolor": "white", "font": {"color": "#2a3f5f", "family": "system-ui, sans-serif"},
            "margin": {"l": 60, "r": 20, "t": 50, "b": 40}, **kwargs}


CURVES_PLOT_PX = 300  # the plot area's height, whatever the number of methods (the legend gets its own room)


# one method's panel; below it its axis (tick labels and title); above it its title, one line of 15 px a line
PANEL_PX, AXIS_PX, NOTE_LINE_PX = 170, 34, 15
# the top margin: the figure's heading (two lines at most). Gradio's Plot makes it at least 100 px whenever the
# figure has a title and the block shows its label; the panels are laid out for that margin, not squeezed by it
CURVES_TOP_PX = 100
# a line of a panel title in three columns: at a phone's width (390 px) a panel is ~95 px wide, ~113 px apart
NARROW_LINE_CHARS = 16


def panel_columns(count: int) -> int:
    """Panels side by side: 1 method alone, 2 and 4 in pairs, else rows of 3 (7 methods: 3 rows)."""
    return 1 if count <= 1 else 2 if count in (2, 4) else 3


def wrapped(text: str, width: int) -> str:
    """`text` in lines of at most `width` characters (broken at spaces only) joined by plotly's <br>."""
    import textwrap

    return "<br>".join(textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)) or text


def panel_title(record: dict, columns: int) -> str:
    """A panel's title: the method's name in bold, then both AUCs. In three columns (panels ~95 px wide on a
    phone) the name is wrapped and each AUC has its own line, so that neighbouring titles never overlap."""
    deletion, insertion = METRICS["deletion_auc"], METRICS["insertion_auc"]
    dele = f"del {record['deletion_auc']:.3f} {deletion.arrow}"
    ins = f"ins {record['insertion_auc']:.3f} {insertion.arrow}"
    if columns < 3:
        return f"<b>{record['label']}</b><br>{dele} · {ins}"
    return f"<b>{wrapped(record['label'], NARROW_LINE_CHARS)}</b><br>{dele}<br>{ins}"


def curves_figure(results: list, title: str | None = None) -> FigureSpec:
    """Small multiples: one panel per method, its deletion (solid) and insertion (dashed) curves on the same
    axes in its colour, titled with its name and both AUCs. Seven methods are 14 lines: on one set of axes they lie
    on top of each other, told apart only by the legend; a panel each keeps every pair readable and comparable
    (same axes everywhere). Every text fits a phone's width (390 px) as well as 1280 px: the heading is wrapped
    on two lines, panel titles in three columns on up to four (`panel_title`)."""
    drawn = [(index, r) for index, r in enumerate(results) if r.get("fractions") is not None]
    columns = panel_columns(len(drawn))
    rows = max(1, -(-len(drawn) // columns))
    titles = [panel_title(record, columns) for _, record in drawn]
    note_px = NOTE_LINE_PX * max([t.count("<br>") + 1 for t in titles] or [2]) + 6
    block_px = note_px + PANEL_PX + AXIS_PX
    height = CURVES_TOP_PX + rows * block_px
    area = height - CURVES_TOP_PX  # the panels' part of the figure (the bottom margin is 0)
    data, axes, notes = [], {}, []
    for panel, (index, record) in enumerate(drawn):
        row, column = divmod(panel, columns)
        suffix = "" if panel == 0 else str(panel + 1)
        colour = color_for(record["method"], index)
        x = [100 * f for f in record["fractions"]]
        data.append({"type": "scatter", "x": x, "y": record["deletion"], "mode": "lines+markers",
                     "xaxis": f"x{suffix}", "yaxis": f"y{suffix}", "showlegend": False,
                     "line": {"color": colour, "width": 2.5}, "marker": {"size": 4},
                     "name": f"{record['label']}: deletion AUC {record['deletion_auc']:.3f} "
                             f"{METRICS['deletion_auc'].arrow} · insertion {record['insertion_auc']:.3f} "
                             f"{METRICS['insertion_auc'].arrow}",
                     "hovertemplate": "%{x:.0f}% deleted: p=%{y:.3f}<extra></extra>"})
        data.append({"type": "scatter", "x": x, "y": record["insertion"], "mode": "lines+markers",
                     "xaxis": f"x{suffix}", "yaxis": f"y{suffix}", "showlegend": False,
                     "line": {"color": colour, "width": 2.5, "dash": "dash"}, "marker": {"size": 4, "symbol": "diamond"},
                     "name": f"{record['label']} insertion · AUC {record['insertion_auc']:.3f} "
                             f"({METRICS['insertion_auc'].better_text})",
                     "hovertemplate": "%{x:.0f}% inserted: p=%{y:.3f}<extra></extra>"})
        gap = 0.06
        left = column / columns + (gap / 2 if column else 0)
        right = (column + 1) / columns - (gap / 2 if column < columns - 1 else 0)
        top_px = row * block_px + note_px  # its title above, its axis' tick labels and title below
        top = 1 - top_px / area
        bottom = 1 - (top_px + PANEL_PX) / area
        axes[f"xaxis{suffix}"] = axis_style(domain=[left, right], range=[0, 100], anchor=f"y{suffix}",
                                       title={"text": "% of pixels", "standoff": 2, "font": {"size": 11}},
                                       tickfont={"size": 10})
        axes[f"yaxis{suffix}"] = axis_style(domain=[max(bottom, 0), top], range=[0, 1.02], anchor=f"x{suffix}",
                                       tickfont={"size": 10},
                                       title={"text": "p(target)" if column == 0 else "", "font": {"size": 11}})
        notes.append({"text": titles[panel], "showarrow": False, "xref": "paper", "yref": "paper",
                      "x": (left + right) / 2, "y": top, "xanchor": "center", "yanchor": "bottom",
                      "font": {"size": 12 if columns < 3 else 11, "color": colour}})
    target = results[0]["target_name"] if results else ""
    heading = title or (f"Deletion (solid) and insertion (dashed) for '{target}'" if target
                        else "Deletion (solid) and insertion (dashed)")
    layout = plot_layout(wrapped(heading, 40), height, annotations=notes, hovermode="x unified", showlegend=False,
                     margin={"l": 50, "r": 12, "t": CURVES_TOP_PX, "b": 0}, **axes)
    layout["title"]["font"]["size"] = 14
    return FigureSpec(data, layout)


def step_figure(record: dict, step: int) -> FigureSpec:
    """One method's deletion (solid) and insertion (dashed) curves with step `step` marked on both: the points the
    step viewer's pictures stand for."""
    colour = color_for(record["method"])
    x = [100 * f for f in record["fractions"]]
    step = min(max(int(step), 0), len(x) - 1)
    side = "right" if x[step] < 50 else "left"
    # two labels at nearly the same height would print over each other: then the deletion one goes to the other side
    close = abs(record["deletion"][step] - record["insertion"][step]) < 0.15
    other = ("left" if side == "right" else "right") if close and 10 < x[step] < 90 else side
    data = [{"type": "scatter", "x": x, "y": record["deletion"], "mode": "lines", "name": "deletion",
             "line": {"color": colour, "width": 2}, "hovertemplate": "%{x:.0f}% deleted: p=%{y:.3f}<extra></extra>"},
            {"type": "scatter", "x": x, "y": record["insertion"], "mode": "lines", "name": "insertion",
             "line": {"color": colour, "width": 2, "dash": "dash"},
             "hovertemplate": "%{x:.0f}% inserted: p=%{y:.3f}<extra></extra>"},
            {"type": "scatter", "x": [x[step], x[step]], "y": [record["deletion"][step], record["insertion"][step]],
             "mode": "markers+text", "name": f"step {step}", "marker": {"size": 11, "color": "#000000",
                                                                       "symbol": ["circle", "diamond"]},
             "text": [f"del p={record['deletion'][step]:.2f}", f"ins p={record['insertion'][step]:.2f}"],
             # the labels on the side with room (on the left one was cut at the plot's edge); one below, one above
             # a label above a low point and below a high one: never on the axis' ticks or over the heading
             "textposition": [f"{'top' if y < 0.5 else 'bottom'} {place}" for y, place in
                              ((record["deletion"][step], other), (record["insertion"][step], side))],
             "cliponaxis": False,
             "hoverinfo": "skip"}]
    heading = wrapped(f"{record['label']}: step {step} = {x[step]:.0f}% of the pixels", 40)  # a phone's width
    lines = heading.count("<br>")
    layout = plot_layout(heading, 290 + 18 * lines,
                     xaxis=axis_style(title={"text": "% of pixels (most important first)", "standoff": 4}, range=[0, 100]),
                     yaxis=axis_style(title={"text": "p(target)"}, range=[0, 1.05]), showlegend=True,
                     # under the axis title: above the plot it ran into a heading wrapped on a narrow column
                     legend={"orientation": "h", "y": -0.32, "x": 0.5, "xanchor": "center", "yanchor": "top",
                             "font": {"size": 10}}, margin={"l": 50, "r": 12, "t": 40 + 18 * lines, "b": 76})
    return FigureSpec(data, layout)


def empty_figure(message: str) -> FigureSpec:
    layout = plot_layout("", 300, xaxis={"visible": False}, yaxis={"visible": False},
                     annotations=[{"text": message, "showarrow": False, "font": {"size": 14, "color": "#555"},
                                   "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}],
                     margin={"l": 20, "r": 20, "t": 20, "b": 20})
    return FigureSpec([], layout)


def head_weights_figure(diagnostics: dict) -> FigureSpec:
    """GradSkip's head weights (layers x heads) as a heatmap and, beside it when the diagnostics carry it, the
    b_main profile: per block, the share of the relevance that flows through attention (main) and through the
    skip connection, for the explained image."""
    weights = np.asarray(diagnostics["head_weights"], dtype=float)
    blocks = [f"block {b}" for b in range(weights.shape[0])]
    share = diagnostics.get("main_share")
    split = share is not None and len(share) == weights.shape[0]
    data = [{"type": "heatmap", "z": weights.round(4).tolist(), "colorscale": "Cividis",
             "colorbar": {"title": {"text": "weight"}, "x": 0.56 if split else 1.02, "len": 0.9},
             "x": [f"h{h}" for h in range(weights.shape[1])], "y": blocks,
             "hovertemplate": "%{y}, %{x}: %{z:.3f}<extra></extra>"}]
    layout = plot_layout(f"GradSkip head weights (alpha = {diagnostics['alpha']:.2f})"
                     + (" and main / skip share per block" if split else ""), 320,
                     margin={"l": 70, "r": 20, "t": 45, "b": 30})
    if split:
        main = [round(float(v), 4) for v in share]
        skip = [round(1 - v, 4) for v in main]
        data[0].update(xaxis="x", yaxis="y")
        data += [{"type": "bar", "orientation": "h", "y": blocks, "x": main, "name": "main (attention)",
                  "marker": {"color": "#0072B2"}, "xaxis": "x2", "yaxis": "y2",
                  "hovertemplate": "%{y}: main %{x:.2f}<extra></extra>"},
                 {"type": "bar", "orientation": "h", "y": blocks, "x": skip, "name": "skip",
                  "marker": {"color": "#E69F00"}, "xaxis": "x2", "yaxis": "y2",
                  "hovertemplate": "%{y}: skip %{x:.2f}<extra></extra>"}]
        layout.update(barmode="stack", xaxis={"domain": [0.0, 0.5]}, yaxis={"autorange": "reversed"},
                      xaxis2={"domain": [0.68, 1.0], "range": [0, 1],
                              "title": {"text": "share of relevance", "standoff": 4}},
                      yaxis2={"anchor": "x2", "autorange": "reversed", "showticklabels": False},
                      # under the axis title (at -0.15 it was drawn over it)
                      legend={"orientation": "h", "x": 0.68, "y": -0.3, "yanchor": "top"},
                      height=350, margin={"l": 70, "r": 20, "t": 45, "b": 80})
    return FigureSpec(data, layout)


def auc_table(results: list) -> list:
    """Rows [method, options, a column per curve metric, ms] for a table (`AUC_HEADERS`)."""
    rows = []
    for record in results:
        values = [summary_value(record, name) for name in CURVE_METRICS]
        rows.append([record["label"], options_text(record) or "-",
                     *[None if value is None else round(value, 4) for value in values],
                     round(1000 * record["seconds"], 1)])
    return rows


def _titles(names) -> list:
    """Short column titles with each metric's arrow, from its declaration ('deletion ↓', 'ins-del ↑')."""
    return [METRICS[name].title() for name in names]


AUC_HEADERS = ["method", "options", *_titles(CURVE_METRICS), "ms"]  # short: fits a phone
BEST_MARK, WORSE_MARK = "(best)", "*"
SCORE_LEGEND = (f"Mean over the images with its 95% bootstrap interval (images resampled). {BEST_MARK}: the best "
                f"mean on that score; {WORSE_MARK}: significantly worse than the best (the paired 95% interval of "
                "the difference, over the same images, excludes 0); no mark: within the noise of the best.")


def score_headers(per_image: dict) -> list:
    """The score table's headers: 'method', then the declared metrics every method carries per image."""
    from explainers.metrics import per_image as named

    carried = [named(block) for block in per_image.values()]
    return ["method", *_titles([m for m in METRICS if carried and all(m in value for value in carried)])]


def score_table_rows(per_image: dict, **options) -> list:
    """Rows [method, a cell per metric] of a score table over several images. `per_image`: {method: {metric:
    [...]}} (e.g. 'deletion_auc', 'insertion_auc'), the same images in the same order for every method. Each cell is
    'mean [low, high]' with the best method marked and those significantly worse than it starred
    (`explainers.statistics.score_table`: seeded bootstrap, paired differences); one image: means only."""
    from explainers.statistics import score_table

    several = len(per_image) > 1 and all(_images(v) > 1 for v in per_image.values())
    rows = []
    for row in score_table(per_image, **options):
        cells = [row["method"]]
        for key in [m for m in METRICS if m in row]:
            mark = (f" {BEST_MARK}" if row[f"{key}_best"] and several else
                    f" {WORSE_MARK}" if row[f"{key}_worse_than_best"] else "")
            cells.append(row[key] + mark)
        rows.append(cells)
    return rows


def _images(block: dict) -> int:
    return len(next(iter(block.values()), []))


def score_table_markdown(per_image: dict, labels: dict | None = None, **options) -> str:
    """The score table as Markdown (method names through `labels`), its legend under it when there are intervals."""
    rows = score_table_rows(per_image, **options)
    headers = score_headers(per_image)
    lines = ["| " + " | ".join(headers) + " |", "|---" * len(headers) + "|"]
    for method, *cells in rows:
        lines.append(f"| {(labels or {}).get(method, method)} | " + " | ".join(cells) + " |")
    if any(_images(v) > 1 for v in per_image.values()):
        lines += ["", SCORE_LEGEND]
    return "\n".join(lines)


def sanity_figure(stages: list, title: str = "Sanity check") -> FigureSpec:
    """Spearman rho of each stage's map with the original map, per method: [(method label, [(stage, rho)])]."""
    colours = palette()
    data = []
    for index, (label, points) in enumerate(stages):
        data.append({"type": "scatter", "x": list(range(len(points))), "y": [rho for _, rho in points],
                     "mode": "lines+markers", "name": label, "text": [name for name, _ in points],
                     "line": {"color": colours[index % len(colours)], "width": 2.5},
                     "hovertemplate": "%{text}: rho=%{y:.3f}<extra></extra>"})
    layout = plot_layout(title, 340, xaxis=axis_style(title={"text": "randomisation stage (0 = trained model)"}, dtick=1),
                     yaxis=axis_style(title={"text": "rank correlation with the original map"}, range=[-1.05, 1.05]),
                     legend={"orientation": "h", "y": -0.25},
                     shapes=[{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": 0, "y1": 0,
                              "line": {"color": "#999", "dash": "dot"}}])
    return FigureSpec(data, layout)



# ------------------------------------------------------------------------------------------------
# Fine-tune jobs
# ------------------------------------------------------------------------------------------------
JOB_SERIES = {"loss": ("loss (total)", "y"), "ce": ("cross-entropy", "y"), "reg": ("mask loss (outside − inside)", "y"),
              "alpha": ("mean CAM inside mask", "y2"), "beta": ("mean CAM outside mask", "y2"),
              "iou": ("IoU (training batch)", "y2"), "accuracy": ("accuracy", "y2")}


def job_figure(history: list, title: str = "Fine-tune progress") -> FigureSpec:
    """Loss terms (left axis) and the CAM inside/outside the masks, IoU, accuracy (right axis) against the step,
    from JobRunner.history(); `before_iou` (if reported) is drawn as a dotted reference line."""
    colours = palette()
    data = []
    for index, (key, (label, axis)) in enumerate(JOB_SERIES.items()):
        points = [(p.get("step"), p[key]) for p in history if isinstance(p.get(key), (int, float))]
        if not points:
            continue
        data.append({"type": "scatter", "x": [s for s, _ in points], "y": [v for _, v in points],
                     "mode": "lines+markers", "name": label, "yaxis": axis, "marker": {"size": 4},
                     "line": {"color": colours[index % len(colours)], "width": 2,
                              "dash": "dot" if axis == "y2" else "solid"}})
    steps = sorted({p["step"] for p in history if isinstance(p.get("step"), (int, float))})
    # one step (a one-step run): an x range of its own (plotly's autorange of one value drew NaN paths)
    span = [steps[0] - 1, steps[-1] + 1] if len(steps) == 1 else [steps[0], steps[-1]] if steps else [0, 1]
    before = next((p["before_iou"] for p in history if isinstance(p.get("before_iou"), (int, float))), None)
    if before is not None:  # a trace on the right axis (a shape there drew NaN when no trace used that axis)
        data.append({"type": "scatter", "x": span, "y": [before, before], "mode": "lines", "yaxis": "y2",
                     "name": f"IoU before {before:.2f}", "line": {"color": "#999", "dash": "dot", "width": 1.5},
                     "hoverinfo": "skip"})
    one_step = {"range": span} if len(steps) == 1 else {}
    layout = plot_layout(title, 340, xaxis=axis_style(title={"text": "step"}, **one_step),
                         yaxis=axis_style(title={"text": "loss"}),
                         yaxis2={"title": {"text": "CAM share / IoU"}, "overlaying": "y", "side": "right",
                                 "range": [0, 1], "showgrid": False},
                         margin={"l": 60, "r": 60, "t": 45, "b": 40}, legend={"orientation": "h", "y": -0.25})
    return FigureSpec(data, layout)



# ------------------------------------------------------------------------------------------------
# AHA training jobs
# ------------------------------------------------------------------------------------------------
AHA_SERIES = tuple((f"val_{name}", f"{METRICS[name].phrase} ({METRICS[name].better_text})", METRICS[name].colour, dash)
    for name, dash in zip(CURVE_METRICS, ("solid", "dash", "dot")))


def aha_validation_figure(history: list, title: str = "AHA explainer: validation during training") -> FigureSpec:
    """The fixed validation metric of an 'aha-train' job against the step (from JobRunner.history(): the points
    that carry `val_deletion_auc`); the best step so far (by ins - del: what is exported) is marked. The training
    loss is left out: its temperature anneals, so its values are not comparable from step to step."""
    data = []
    points = [p for p in history if isinstance(p.get("val_deletion_auc"), (int, float))]
    for key, label, colour, dash in AHA_SERIES:
        data.append({"type": "scatter", "x": [p["step"] for p in points], "y": [p[key] for p in points],
                     "mode": "lines+markers", "name": label, "marker": {"size": 6},
                     "line": {"color": colour, "width": 2.5, "dash": dash},
                     "hovertemplate": "step %{x}: %{y:.4f}<extra></extra>"})
    shapes, annotations = [], []
    if points:
        best = METRICS["ins_minus_del"].best(points, key=lambda p: p["val_ins_minus_del"])
        shapes.append({"type": "line", "xref": "x", "x0": best["step"], "x1": best["step"], "yref": "paper", "y0": 0,
                       "y1": 1, "line": {"color": "#009E73", "dash": "dot", "width": 1}})
        annotations.append({"text": f"best so far: step {best['step']}", "xref": "x", "x": best["step"], "yref": "paper",
                            "y": 1.0, "showarrow": False, "xanchor": "left", "yanchor": "bottom",
                            "font": {"size": 11, "color": "#009E73"}})
    layout = plot_layout(title, 380, xaxis=axis_style(title={"text": "training step", "standoff": 6}),
                     yaxis=axis_style(title={"text": "validation AUC (hard deletion / insertion)"}),
                     margin={"l": 60, "r": 20, "t": 50, "b": 80},
                     legend={"orientation": "h", "yanchor": "top", "y": -0.22, "xanchor": "left", "x": 0},
                     shapes=shapes, annotations=annotations)
    return FigureSpec(data, layout)
