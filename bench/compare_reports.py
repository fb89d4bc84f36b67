"""Paired comparisons and rankings from `python -m explainers evaluate --out` reports (issue #14).

    python bench/compare_reports.py bench/results/evaluate-bloodmnist-vit-mean-100x10.json \
        bench/results/evaluate-bloodmnist-vit-road-100x10.json --pairs aha,rollout gradskip,rollout

For each report: the methods ranked by every metric the report carries per image (deletion, insertion, ins-del, ...,
best first by each metric's declared direction, `explainers.metrics.METRICS`), with 95% bootstrap intervals, and the paired bootstrap interval (`explainers.statistics.paired_difference`)
of each requested pair on the same images. With two reports on the same files (e.g. the mean-colour and the
ROAD reference), whether the rankings agree, and the per-method Spearman correlation of the per-image scores.

`--concat` pools reports of DIFFERENT images (e.g. one long RISE run done in chunks) into one report: the same
model and protocol (checked), no image twice (checked), the methods every part has; per-image scores joined, means and
intervals recomputed; `--pairs` then compares on all the images, and `--report-out` writes the pooled report. A part
may itself be `A+B`, reports of the same images (checked) merged keeping the method names, and any report may be
narrowed to some methods with `FILE#m1,m2` (e.g. one method from a stored run of the same photos):

    python bench/compare_reports.py --concat "first12.json+aha2-effnet-rise-timing.json@rise#rise" chunk-a.json \
        chunk-b.json --pairs aha,rise --report-out pooled.json

`--merge` pairs methods ACROSS reports of the same images (e.g. a new explainer's run against a stored run of
the peers): the reports must have scored the same files in the same order (checked), their methods are named
`N:method` (N = the report's place on the command line, from 1) and `--pairs` takes those names;
`--out` writes the comparisons as JSON. `FILE@TIER` reads one tier of a `bench/studies/bench_aha.py` result (e.g.
`aha4-cnn-blur8-rise48.json@rise`). Grid pointing game reports (`python -m explainers gridpg --out`) are paired the
same way on their per-mosaic scores (the mosaics must be the same, checked).

    python bench/compare_reports.py --merge new-500.json bench/results/evaluate-bloodmnist-cnn-distilled-500.json \
        --pairs 1:aha,2:aha 1:aha,2:gradcam --out pairs.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from explainers.metrics import METRICS, interval, per_image, summary_value
from explainers.statistics import compare_methods, format_comparison, format_interval


def ranking(report: dict, key: str) -> list:
    methods = report["methods"]
    return METRICS[key].ranked(methods, key=lambda m: summary_value(methods[m], key))


def ranked_metrics(report: dict) -> list:
    """The declared metrics every method of the report carries a mean of."""
    rows = report["methods"].values()
    return [name for name in METRICS if rows and all(summary_value(row, name) is not None for row in rows)]


def rank_correlation(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def load_report(path: str) -> dict:
    """An evaluate report; `FILE@TIER` reads one tier of a bench/studies/bench_aha.py result (a list with one model);
    `...#m1,m2` keeps only those methods."""
    path, _, keep = path.partition("#")
    file, _, tier = path.partition("@")
    report = json.loads(Path(file).read_text())
    if tier:
        report = report[0][tier] if isinstance(report, list) else report[tier]
    if keep:
        names = keep.split(",")
        missing = [name for name in names if name not in report["methods"]]
        if missing:
            raise SystemExit(f"{path}: no method {', '.join(missing)} (it has {', '.join(report['methods'])})")
        report = {**report, "methods": {name: report["methods"][name] for name in names}}
    return report


# what must agree for scores of two reports to be pooled or paired
PROTOCOL_KEYS = ("steps", "reference", "reference_color", "score", "target", "auc")


def _same_protocol(paths: list, reports: list) -> None:
    for path, report in zip(paths[1:], reports[1:]):
        if report["model"] != reports[0]["model"]:
            raise SystemExit(f"{path} explains {report['model']}, {paths[0]} {reports[0]['model']}: not poolable")
        for key in PROTOCOL_KEYS:
            if report["protocol"].get(key) != reports[0]["protocol"].get(key):
                raise SystemExit(f"{path} and {paths[0]} differ in protocol '{key}': "
                                 f"{report['protocol'].get(key)} vs {reports[0]['protocol'].get(key)}")


def check_same_items(paths: list, reports: list, flag: str) -> None:
    """Refuse unless every report scored the same files (the same mosaics, for grid pointing game reports) in the
    same order: the precondition of pairing their methods image by image."""
    key = "mosaics" if is_gridpg(reports[0]) else "files"
    items = reports[0].get(key)
    for path, report in zip(paths, reports):
        if not items or report.get(key) != items:
            raise SystemExit(f"{flag}: {path} did not score the same {'mosaics' if key == 'mosaics' else 'images'}"
                             f" in the same order as {paths[0]}")


def same_images(paths: list, reports: list) -> dict:
    """`A+B` of a --concat part: reports of the same files in the same order, methods merged under their names."""
    check_same_items(paths, reports, "--concat")
    _same_protocol(paths, reports)
    methods = {}
    for path, report in zip(paths, reports):
        for name, row in report["methods"].items():
            if name in methods:
                raise SystemExit(f"'{name}' is in two reports of {'+'.join(paths)}: keep one with FILE#methods")
            methods[name] = row
    return {**reports[0], "methods": methods}


def pooled(parts: list) -> dict:
    """One report over the images of all `parts` (each a path, or `A+B` of reports of the same images)."""
    from explainers.evaluate import score_summary

    reports = [same_images(part.split("+"), [load_report(p) for p in part.split("+")]) for part in parts]
    _same_protocol(parts, reports)
    files = [file for report in reports for file in report["files"]]
    repeated = sorted({file for file in files if files.count(file) > 1})
    if repeated:
        raise SystemExit(f"--concat: {len(repeated)} image(s) in more than one part, e.g. {repeated[0]}")
    common = [name for name in reports[0]["methods"] if all(name in r["methods"] for r in reports)]
    dropped = sorted({name for r in reports for name in r["methods"]} - set(common))
    if dropped:
        print(f"--concat: left out {', '.join(dropped)} (not in every part)")
    methods = {}
    for name in common:
        blocks = [per_image(r["methods"][name]["per_image"]) for r in reports]
        scores = {key: [float(v) for block in blocks for v in block[key]] for key in blocks[0]
                  if all(key in block for block in blocks)}  # the metrics every part carries
        seed = reports[0]["protocol"].get("seed", 0)
        methods[name] = {**score_summary(scores, seed=seed),
                         "ms_per_image": float(np.average([r["methods"][name]["ms_per_image"] for r in reports],
                                                          weights=[r["n_images"] for r in reports])),
                         "options": reports[0]["methods"][name].get("options"),
                         "per_image": scores}
    return {"model": reports[0]["model"], "n_images": len(files), "files": files,
            "protocol": {**reports[0]["protocol"], "limit": None, "data": [r["protocol"].get("data") for r in reports]},
            "methods": methods, "pooled_from": list(parts)}


def is_gridpg(report: dict) -> bool:
    return "n_mosaics" in report


def merged(paths: list, reports: list) -> dict:
    """One report whose methods are every report's, named `N:method`; refused unless all scored the same files
    (the same mosaics, for grid pointing game reports)."""
    check_same_items(paths, reports, "--merge")
    methods = {f"{n}:{name}": row for n, report in enumerate(reports, 1) for name, row in report["methods"].items()}
    return {**reports[0], "methods": methods, "merged_from": list(paths)}


def gridpg_main(args, reports: list) -> int:
    """Grid pointing game: the ranking with intervals (best first by its declaration) and the paired interval of
    each pair."""
    from explainers.statistics import paired_difference

    comparisons = []
    for path, report in zip(args.reports, reports):
        methods = report["methods"]
        print(f"== {path}: {report['model']}, {report['n_mosaics']} mosaics")
        order = METRICS["gridpg"].ranked(methods, key=lambda m: methods[m]["gridpg"])
        print("  gridpg " + " > ".join(f"{m} {format_interval(methods[m]['gridpg'], methods[m]['gridpg_ci95'], 3)}"
                                        for m in order))
        for pair in args.pairs:
            first, second = pair.split(",")
            difference = paired_difference(methods[first]["per_mosaic"], methods[second]["per_mosaic"])
            comparisons.append({"a": first, "b": second, "gridpg": difference})
            print(f"  {first} - {second}: gridpg {format_interval(difference['mean'], difference['ci95'], 4)}")
    if args.out:
        Path(args.out).write_text(json.dumps({"reports": args.reports, "n_mosaics": reports[0]["n_mosaics"],
                                              "mosaics_checked": bool(args.merge), "comparisons": comparisons},
                                             indent=1))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+")
    parser.add_argument("--pairs", nargs="*", default=[], metavar="A,B")
    parser.add_argument("--merge", action="store_true", help="pair methods across reports of the same images")
    parser.add_argument("--concat", action="store_true", help="pool reports of different images into one")
    parser.add_argument("--report-out", default=None, help="--concat: write the pooled report (JSON)")
    parser.add_argument("--out", default=None, help="write the comparisons (JSON)")
    args = parser.parse_args(argv)
    if args.concat:
        report = pooled(args.reports)
        if args.report_out:
            Path(args.report_out).write_text(json.dumps(report, indent=1))
        args.reports, reports = ["+".join(args.reports)], [report]
    else:
        reports = [load_report(path) for path in args.reports]
    if args.merge:
        args.reports, reports = ["+".join(args.reports)], [merged(args.reports, reports)]
    if is_gridpg(reports[0]):
        return gridpg_main(args, reports)
    comparisons = []
    for path, report in zip(args.reports, reports):
        print(f"== {path}: {report['model']}, {report['n_images']} images, reference "
              f"{report['protocol']['reference']}, {report['protocol']['steps']} steps")
        for key in ranked_metrics(report):
            rows = report["methods"]
            print(f"  {key:<14} " + " > ".join(
                f"{m} {format_interval(summary_value(rows[m], key), interval(rows[m], key), 3)}"
                for m in ranking(report, key)))
        for pair in args.pairs:
            first, second = pair.split(",")
            comparisons.append(compare_methods(report, first, second))
            print(format_comparison(comparisons[-1]))
    if args.out:
        Path(args.out).write_text(json.dumps({"reports": args.reports, "n_images": reports[0]["n_images"],
                                              "files_checked": bool(args.merge or args.concat), "comparisons": comparisons},
                                             indent=1))
    if len(reports) == 2:
        a, b = reports
        if a["files"] != b["files"]:
            print("the two reports scored different images: no per-image comparison")
            return 0
        print(f"== {a['protocol']['reference']} vs {b['protocol']['reference']} on the same images")
        for key in ranked_metrics(a):
            same = ranking(a, key) == ranking(b, key)
            print(f"  {key:<14} ranking {'the same' if same else 'changes'}")
        for method in a["methods"]:
            if method in b["methods"]:
                da, db = (per_image(r["methods"][method]["per_image"])["deletion_auc"] for r in (a, b))
                print(f"  {method:<10} per-image deletion Spearman {rank_correlation(da, db):.3f}; ms/image "
                      f"(maps only) {a['methods'][method]['ms_per_image']:.1f} / {b['methods'][method]['ms_per_image']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
