"""The scoreboard: one generated table of the headline methods against every baseline, paired on the same images,
under three references side by side (mean colour, blur, ROAD).

    reports = [json.load(open(f)) for f in files]      # bench/scoreboard_run.py's merged reports, one per model
    text = scoreboard_markdown(reports)

A report: {"model", "n_images", "protocol", "references": {ref: {"files": [...], "methods": {label: {"options",
"per_image": {"deletion_auc": [...], "insertion_auc": [...]}}}}}}; within a reference every method is scored on the
same files (ROAD may use a named subset of them). A row compares a headline method with one baseline on one declared
metric (`metrics.METRICS`: every metric both carry per image) by the paired bootstrap interval of the per-image
improvement (baseline - method where the declaration says lower is better, method - baseline otherwise), one
interval per reference. The method **wins** a row only where the
lower bound is above 0 under all three references; the verdict names the references where it is not.
"""
from __future__ import annotations

from .metrics import METRICS, per_image
from .statistics import N_RESAMPLES, bootstrap_ci, format_interval, paired_difference

REFERENCE_ORDER = ("mean", "blur", "road")
REFERENCE_NAMES = {"mean": "mean colour", "blur": "blur", "road": "ROAD"}
DISPLAY = {"aha": "AHA T=0", "aha:T3": "AHA T=3", "gradskip": "GradSkip", "gradcam": "Grad-CAM", "rollout": "rollout", "chefer": "Chefer",
           "occlusion": "occlusion", "rise": "RISE", "random": "random"}
# the methods the README makes claims for, and the baselines each is compared with (None: every other method
# except the AHA variants); AHA with refinement steps is compared with the one pass only (the claim: T=3 improves it)
HEADLINE_METHODS = ("aha", "gradskip", "aha:T3")
BASELINES = {"aha:T3": ("aha",)}


def method_name(label: str) -> str:
    """The row key of a method spec: 'rise:n_masks=4000,batch_size=1000' -> 'rise'; AHA's refinement steps stay apart
    ('aha:refine_steps=3' -> 'aha:T3'; 'aha' is the one pass)."""
    from .methods import parse_method_spec

    name, options, _ = parse_method_spec(label)
    steps = int(options.get("refine_steps", 0) or 0) if name == "aha" else 0
    return f"aha:T{steps}" if steps else name


def display_name(label: str, options: dict | None = None) -> str:
    """'rise:n_masks=4000' -> 'RISE (4,000 masks)', 'aha:refine_steps=3' -> 'AHA T=3' (the label's options, then the
    row's recorded options)."""
    from .methods import parse_method_spec

    name, spec_options, _ = parse_method_spec(label)
    options = {**spec_options, **(options or {})}
    shown = DISPLAY.get(name, label)
    if name == "rise" and options.get("n_masks"):
        shown += f" ({int(options['n_masks']):,} masks)"
    if name == "aha" and int(options.get("refine_steps", 0) or 0):
        shown = f"AHA T={int(options['refine_steps'])}"
    return shown


def scores(row: dict) -> dict:
    """{metric name: per-image values} of a method's row (`metrics.per_image`: older reports' keys read too)."""
    return per_image(row["per_image"])


def improvement(method_row: dict, baseline_row: dict, metric: str, seed: int = 0) -> dict:
    """Paired mean and interval of the method's improvement over the baseline on one metric (positive: better, by
    the metric's declared direction)."""
    a, b = scores(method_row)[metric], scores(baseline_row)[metric]
    return paired_difference(b, a, seed=seed) if METRICS[metric].better == "lower" else paired_difference(a, b, seed=seed)


def compared_metrics(rows: dict) -> list:
    """The declared metrics every row carries per image, in declaration order."""
    carried = [scores(row) for row in rows.values()]
    return [name for name in METRICS if carried and all(name in value for value in carried)]


def by_method(report: dict, reference: str) -> dict:
    """{method name: row} of one reference (the first row of each method name)."""
    rows = {}
    for label, row in report["references"].get(reference, {}).get("methods", {}).items():
        rows.setdefault(method_name(label), {**row, "label": label})
    return rows


def comparisons(report: dict, method: str, seed: int = 0) -> list:
    """[{baseline, metric, per reference {mean, ci95, n}, verdict}] for one headline method of one report."""
    references = [ref for ref in REFERENCE_ORDER if ref in report["references"]]
    rows_by_ref = {ref: by_method(report, ref) for ref in references}
    if not all(method in rows for rows in rows_by_ref.values()):
        return []
    first = rows_by_ref[references[0]]
    baselines = [name for name in first if name != method and (
        name in BASELINES[method] if method in BASELINES else not name.startswith("aha"))]
    out = []
    for baseline in baselines:
        for metric in compared_metrics({name: first[name] for name in (method, baseline)}):
            cells = {ref: improvement(rows_by_ref[ref][method], rows_by_ref[ref][baseline], metric, seed)
                     for ref in references if baseline in rows_by_ref[ref]}
            out.append({"method": method, "baseline": baseline, "baseline_label": first[baseline]["label"],
                        "baseline_options": first[baseline].get("options"), "metric": metric, "cells": cells,
                        "verdict": verdict(cells, references)})
    return out


def verdict(cells: dict, references) -> str:
    """'wins' where the interval's lower bound is above 0 under every reference; otherwise where it is not."""
    missing = [ref for ref in references if ref not in cells or cells[ref]["ci95"] is None]
    if missing:
        return "not measured under " + ", ".join(REFERENCE_NAMES[r] for r in missing)
    above = [ref for ref in references if cells[ref]["ci95"][0] > 0]
    below = [ref for ref in references if cells[ref]["ci95"][1] < 0]
    if len(above) == len(references):
        return "**wins**"
    if len(below) == len(references):
        return "loses"
    parts = []
    if above:
        parts.append("ahead under " + ", ".join(REFERENCE_NAMES[r] for r in above))
    level = [r for r in references if r not in above and r not in below]
    if level:
        parts.append("level under " + ", ".join(REFERENCE_NAMES[r] for r in level))
    if below:
        parts.append("behind under " + ", ".join(REFERENCE_NAMES[r] for r in below))
    return "no: " + "; ".join(parts)


def format_cell(cell: dict, digits: int = 4) -> str:
    if cell["ci95"] is None:
        return f"{cell['mean']:+.{digits}f}"
    low, high = cell["ci95"]
    return f"{cell['mean']:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def score_table(report: dict) -> list:
    """Markdown lines: each method's mean of every compared metric with its bootstrap interval, per reference."""
    references = [ref for ref in REFERENCE_ORDER if ref in report["references"]]
    rows_by_ref = {ref: by_method(report, ref) for ref in references}
    names = compared_metrics(rows_by_ref[references[0]])
    header = "| method | " + " | ".join(f"{REFERENCE_NAMES[r]}: {METRICS[m].title()}" for r in references
                                        for m in names) + " |"
    lines = [header, "|" + " --- |" * (1 + len(names) * len(references))]
    for name, row in rows_by_ref[references[0]].items():
        cells = []
        for ref in references:
            if name not in rows_by_ref[ref]:
                cells += ["-"] * len(names)
                continue
            value = scores(rows_by_ref[ref][name])
            cells += [format_interval(float(value[m].mean()), bootstrap_ci(value[m]), 3) for m in names]
        lines.append(f"| {display_name(row['label'], row.get('options'))} | " + " | ".join(cells) + " |")
    return lines


def comparison_table(rows: list, references) -> list:
    header = ("| vs baseline | metric | " + " | ".join(f"{REFERENCE_NAMES[r]}" for r in references)
              + " | wins on all three? |")
    lines = [header, "|" + " --- |" * (3 + len(references))]
    for row in rows:
        cells = [format_cell(row["cells"][r]) if r in row["cells"] else "-" for r in references]
        lines.append(f"| {display_name(row['baseline_label'], row['baseline_options'])} | {METRICS[row['metric']].heading()}"
                     f" | " + " | ".join(cells) + f" | {row['verdict']} |")
    return lines


def summary_line(report: dict, method: str, rows: list) -> str:
    """One sentence per headline method and model: the baselines it beats on all three curves-and-references, and
    the ones it does not, with where."""
    if not rows:
        return ""
    beaten, not_beaten = [], []
    for baseline in dict.fromkeys(row["baseline"] for row in rows):
        mine = [row for row in rows if row["baseline"] == baseline]
        name = display_name(mine[0]["baseline_label"], mine[0]["baseline_options"])
        grouped = {}  # verdict -> the metrics with it, so that one reason is said once
        for row in mine:
            if row["verdict"] != "**wins**":
                grouped.setdefault(row["verdict"].removeprefix("no: "), []).append(METRICS[row["metric"]].short)
        failed = [f"{', '.join(metrics)} {reason}" for reason, metrics in grouped.items()]
        (not_beaten if failed else beaten).append(name if not failed else f"{name} ({'; '.join(failed)})")
    text = f"- `{report['model']}`, {DISPLAY.get(method, method)}: "
    compared = [METRICS[name].short for name in dict.fromkeys(row["metric"] for row in rows)]
    listed = " and ".join(filter(None, [", ".join(compared[:-1]), compared[-1]]))
    text += (f"wins {listed} under all three references against " + ", ".join(beaten)
             if beaten else "wins against no baseline on every curve and reference")
    if not_beaten:
        text += ". Not a win against " + ", ".join(not_beaten)
    return text + "."


def data_name(path: str) -> str:
    """A data folder as the tables name it: its last three parts ('bloodmnist/64/test'), not where it lay on the
    machine that measured it."""
    return "/".join(str(path).replace("\\", "/").rstrip("/").split("/")[-3:])


def reference_sizes(report: dict) -> str:
    parts = []
    for ref in REFERENCE_ORDER:
        block = report["references"].get(ref)
        if block:
            parts.append(f"{REFERENCE_NAMES[ref]} {len(block['files'])}")
    return ", ".join(parts)


def scoreboard_markdown(reports: list, *, sources: list | None = None, seed: int = 0) -> str:
    """The whole generated scoreboard (summary lines, then per model the score table and the paired comparisons)."""
    summary, sections = [], []
    for index, report in enumerate(reports):
        references = [ref for ref in REFERENCE_ORDER if ref in report["references"]]
        protocol = report.get("protocol", {})
        source = f" (`{sources[index]}`)" if sources else ""
        sections += [f"### `{report['model']}`{source}", "",
                     f"Images: {report['n_images']} of `{data_name(protocol.get('data', '?'))}` (predicted class as target); "
                     f"per reference: {reference_sizes(report)}"
                     + (f" (ROAD: an even spread of {protocol['road_images']})" if protocol.get("road_limit") else "")
                     + f". {protocol.get('steps', 20)} steps; intervals: paired percentile bootstrap over images, "
                       f"{N_RESAMPLES} resamples, seed {seed}.", ""]
        sections += score_table(report) + [""]
        for method in HEADLINE_METHODS:
            rows = comparisons(report, method, seed)
            if not rows:
                continue
            summary.append(summary_line(report, method, rows))
            sections += [f"{DISPLAY[method]} minus each baseline (improvement: positive = {DISPLAY[method]} better)",
                         ""] + comparison_table(rows, references) + [""]
    head = ["A method **wins** a row only where the paired 95% interval of its improvement over the baseline lies above "
            "0 under all three references (mean colour, blur, ROAD); otherwise the row says where it does not.", ""]
    return "\n".join(head + summary + [""] + sections).rstrip() + "\n"
