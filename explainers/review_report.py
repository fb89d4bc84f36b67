"""Results of a clinician review study, read straight from the review store's SQLite file.

    report = study_report("reviews/review.sqlite", "cells-2026")      # dict, JSON-ready
    rows = study_rows("reviews/review.sqlite", "cells-2026")          # one row per response (CSV export)

The app writes studies through `saliency_lab.review_store` (which takes `STUDY_SCHEMA` from here); this module
only reads, so the command line (`python -m explainers review-report`) and a notebook get the same numbers as
the app without importing it. Two protocols:

- "open": one verdict (plausible / implausible / unsure) and a note per image and reviewer;
- "blinded": the maps of the study's methods shown in a stored random order as A, B, C...; a 1-5 rating per map
  and an optional best pick per image and reviewer.

Agreement: Cohen's kappa per pair of reviewers (quadratically weighted for ratings), Fleiss' kappa over the
units every reviewer rated, each with a seeded bootstrap 95% interval that resamples images.
"""
from __future__ import annotations

import json
import math
import sqlite3
import time
from itertools import combinations
from pathlib import Path

import numpy as np

from .agreement import bootstrap_interval, cohen_kappa, fleiss_kappa_from_labels, percent_agreement

PROTOCOLS = ("open", "blinded")
VERDICTS = ("plausible", "implausible", "unsure")
LIKERT = (1, 2, 3, 4, 5)
SLOTS = "ABCDEFGH"
# Below this many images an agreement figure is not reported as a finding: a bootstrap over a handful of images
# has few distinct resamples (its interval collapses onto the point, "0.65 [0.57, 0.65]"), and one image more or
# less swings kappa by tenths. The value stays in the JSON, marked `too_few`, for the record.
MIN_AGREEMENT_IMAGES = 10

STUDY_SCHEMA = """
CREATE TABLE IF NOT EXISTS studies (
  name TEXT PRIMARY KEY, code_hash TEXT NOT NULL, salt TEXT NOT NULL, protocol TEXT NOT NULL,
  dataset TEXT NOT NULL, dataset_path TEXT NOT NULL, model TEXT NOT NULL, methods TEXT NOT NULL,
  reviewers TEXT NOT NULL, class_names TEXT NOT NULL, question TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS study_items (
  study TEXT NOT NULL, position INTEGER NOT NULL, item TEXT NOT NULL, data_index INTEGER NOT NULL,
  label INTEGER, prediction INTEGER NOT NULL, confidence REAL NOT NULL, shown_order TEXT NOT NULL,
  PRIMARY KEY (study, position));
CREATE TABLE IF NOT EXISTS study_responses (
  study TEXT NOT NULL, position INTEGER NOT NULL, reviewer TEXT NOT NULL, verdict TEXT,
  note TEXT NOT NULL DEFAULT '', best TEXT, updated REAL NOT NULL,
  PRIMARY KEY (study, position, reviewer));
CREATE TABLE IF NOT EXISTS study_ratings (
  study TEXT NOT NULL, position INTEGER NOT NULL, reviewer TEXT NOT NULL, slot TEXT NOT NULL,
  rating INTEGER NOT NULL, updated REAL NOT NULL,
  PRIMARY KEY (study, position, reviewer, slot));
CREATE TABLE IF NOT EXISTS study_owners (
  study TEXT PRIMARY KEY, owner_hash TEXT NOT NULL, owner_salt TEXT NOT NULL, closed REAL);
CREATE TABLE IF NOT EXISTS study_faithfulness (
  study TEXT NOT NULL, position INTEGER NOT NULL, method TEXT NOT NULL, deletion_auc REAL, insertion_auc REAL,
  PRIMARY KEY (study, position, method));
"""


class StudyNotFound(LookupError):
    """No study of that name in the database."""


def _connect(db) -> sqlite3.Connection:
    if isinstance(db, sqlite3.Connection):
        return db
    path = Path(db)
    if not path.exists():
        raise FileNotFoundError(f"No review database at {path}.")
    con = sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True, timeout=30)
    con.row_factory = sqlite3.Row
    return con


def _finite(value):
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _round(value, digits=4):
    value = _finite(value)
    return None if value is None else round(float(value), digits)


def _interval(pair):
    return [_round(pair[0]), _round(pair[1])]


class _Study:
    """Everything one report needs, loaded once."""

    def __init__(self, con, name):
        row = con.execute("SELECT * FROM studies WHERE name=?", (name,)).fetchone()
        if row is None:
            raise StudyNotFound(f"No study named '{name}'.")
        self.meta = dict(row)
        self.name = name
        self.protocol = row["protocol"]
        self.methods = json.loads(row["methods"])
        self.class_names = json.loads(row["class_names"])
        listed = json.loads(row["reviewers"])
        self.items = [dict(r) for r in con.execute("SELECT * FROM study_items WHERE study=? ORDER BY position",
                                                   (name,))]
        for item in self.items:
            item["order"] = json.loads(item["shown_order"])
        self.by_position = {item["position"]: item for item in self.items}
        self.responses = [dict(r) for r in con.execute("SELECT * FROM study_responses WHERE study=?", (name,))]
        self.ratings = [dict(r) for r in con.execute("SELECT * FROM study_ratings WHERE study=?", (name,))]
        self.faithfulness = [dict(r) for r in con.execute("SELECT * FROM study_faithfulness WHERE study=?",
                                                          (name,))]
        seen = {r["reviewer"] for r in self.responses} | {r["reviewer"] for r in self.ratings}
        self.reviewers = listed + sorted(seen - set(listed))
        # position -> reviewer -> method -> rating (slots translated to methods: the reveal)
        self.rating = {}
        for r in self.ratings:
            order = self.by_position[r["position"]]["order"]
            slot = SLOTS.index(r["slot"])
            if slot < len(order):
                self.rating.setdefault(r["position"], {}).setdefault(r["reviewer"], {})[order[slot]] = r["rating"]
        self.best = {}
        self.verdict = {}
        for r in self.responses:
            if r["best"]:
                order = self.by_position[r["position"]]["order"]
                slot = SLOTS.index(r["best"])
                if slot < len(order):
                    self.best.setdefault(r["position"], {})[r["reviewer"]] = order[slot]
            if r["verdict"]:
                self.verdict.setdefault(r["position"], {})[r["reviewer"]] = r["verdict"]
        self.auc = {}
        for r in self.faithfulness:
            self.auc.setdefault(r["position"], {})[r["method"]] = (r["deletion_auc"], r["insertion_auc"])

    def class_name(self, label) -> str:
        if label is None or label < 0:
            return "unlabelled"
        return self.class_names[label] if label < len(self.class_names) else str(label)

    def done(self, reviewer) -> int:
        if self.protocol == "open":
            return sum(1 for v in self.verdict.values() if reviewer in v)
        return sum(1 for ratings in self.rating.values()
                   if len(ratings.get(reviewer, {})) >= len(self.methods))


def _pair_units(study, a, b):
    """Per image, the paired labels of two reviewers: {position: [(label a, label b), ...]}."""
    units = {}
    for position in study.by_position:
        if study.protocol == "open":
            verdicts = study.verdict.get(position, {})
            if a in verdicts and b in verdicts:
                units[position] = [(verdicts[a], verdicts[b])]
        else:
            ratings = study.rating.get(position, {})
            ra, rb = ratings.get(a, {}), ratings.get(b, {})
            shared = [(ra[m], rb[m]) for m in study.methods if m in ra and m in rb]
            if shared:
                units[position] = shared
    return units


def _kappa_of(units_by_image, positions, weights, categories):
    pairs = [p for position in positions for p in units_by_image[position]]
    return cohen_kappa([p[0] for p in pairs], [p[1] for p in pairs], weights=weights, categories=categories)


def _agreement(study, n_boot, seed) -> dict:
    weights = None if study.protocol == "open" else "quadratic"
    categories = list(VERDICTS) if study.protocol == "open" else list(LIKERT)
    pairs = []
    reviewers = study.reviewers
    for a, b in combinations(reviewers, 2):
        units = _pair_units(study, a, b)
        positions = sorted(units)
        if not positions:
            pairs.append({"a": a, "b": b, "images": 0, "units": 0, "kappa": None, "ci95": [None, None],
                          "percent_agreement": None})
            continue
        kappa = _kappa_of(units, positions, weights, categories)
        too_few = len(positions) < MIN_AGREEMENT_IMAGES
        interval = None if too_few else bootstrap_interval(
            lambda idx: _kappa_of(units, [positions[i] for i in idx], weights, categories), len(positions),
            n_boot=n_boot, seed=seed)
        flat = [p for position in positions for p in units[position]]
        pairs.append({"a": a, "b": b, "images": len(positions), "units": len(flat), "kappa": _round(kappa),
                      "ci95": [None, None] if too_few else _interval(interval), "too_few": too_few,
                      "percent_agreement": _round(percent_agreement([p[0] for p in flat], [p[1] for p in flat]))})
    # Fleiss: the units every reviewer labelled
    rows_by_image = {}
    if len(reviewers) >= 2:
        for position in study.by_position:
            if study.protocol == "open":
                verdicts = study.verdict.get(position, {})
                if all(r in verdicts for r in reviewers):
                    rows_by_image[position] = [[verdicts[r] for r in reviewers]]
            else:
                ratings = study.rating.get(position, {})
                rows = [[ratings[r][m] for r in reviewers] for m in study.methods
                        if all(m in ratings.get(r, {}) for r in reviewers)]
                if rows:
                    rows_by_image[position] = rows
    positions = sorted(rows_by_image)

    def fleiss_of(chosen):
        return fleiss_kappa_from_labels([row for p in chosen for row in rows_by_image[p]], categories=categories)

    fleiss = {"reviewers": len(reviewers), "images": len(positions),
              "units": sum(len(rows_by_image[p]) for p in positions), "kappa": None, "ci95": [None, None],
              "too_few": len(positions) < MIN_AGREEMENT_IMAGES}
    if positions:
        fleiss["kappa"] = _round(fleiss_of(positions))
    if not fleiss["too_few"]:
        fleiss["ci95"] = _interval(bootstrap_interval(lambda idx: fleiss_of([positions[i] for i in idx]),
                                                      len(positions), n_boot=n_boot, seed=seed))
    result = {"measure": ("Cohen's kappa on the verdicts" if study.protocol == "open" else
                          "Cohen's kappa, quadratically weighted, on the 1-5 ratings of each map"),
              "unit": "image" if study.protocol == "open" else "map (image x method)",
              "pairs": pairs, "fleiss": fleiss, "min_images": MIN_AGREEMENT_IMAGES}
    if study.protocol == "blinded":
        best_pairs = []
        for a, b in combinations(reviewers, 2):
            shared = [(v[a], v[b]) for v in study.best.values() if a in v and b in v]
            best_pairs.append({"a": a, "b": b, "images": len(shared),
                               "kappa": _round(cohen_kappa([s[0] for s in shared], [s[1] for s in shared],
                                                           categories=study.methods)) if shared else None,
                               "percent_agreement": _round(percent_agreement([s[0] for s in shared],
                                                                             [s[1] for s in shared]))
                               if shared else None})
        result["best_pick_pairs"] = best_pairs
    return result


def _method_stats(study, n_boot, seed) -> list:
    out = []
    positions = [item["position"] for item in study.items]
    picks_total = sum(len(v) for v in study.best.values())
    for method in study.methods:
        per_image = {p: [r[method] for r in study.rating.get(p, {}).values() if method in r] for p in positions}
        rated = [p for p in positions if per_image[p]]
        values = [v for p in rated for v in per_image[p]]
        mean = float(np.mean(values)) if values else None

        def mean_of(idx, rated=rated, per_image=per_image):
            chosen = [v for i in idx for v in per_image[rated[i]]]
            return float(np.mean(chosen)) if chosen else math.nan

        interval = bootstrap_interval(mean_of, len(rated), n_boot=n_boot, seed=seed) if rated else (math.nan,) * 2
        best = sum(1 for v in study.best.values() for m in v.values() if m == method)
        aucs = [study.auc[p][method] for p in positions if method in study.auc.get(p, {})]
        deletion = [a[0] for a in aucs if a[0] is not None]
        insertion = [a[1] for a in aucs if a[1] is not None]
        out.append({"method": method, "ratings": len(values), "images": len(rated), "mean_rating": _round(mean, 3),
                    "ci95": _interval(interval), "best_picks": best,
                    "best_fraction": _round(best / picks_total, 3) if picks_total else None,
                    "rating_counts": {str(k): values.count(k) for k in LIKERT},
                    "faithfulness_images": len(aucs),
                    "deletion_auc": _round(float(np.mean(deletion))) if deletion else None,
                    "insertion_auc": _round(float(np.mean(insertion))) if insertion else None})
    return out


def _reviewers_best(study, position):
    """The map the reviewers liked best on one image: the most picked method, else the highest mean rating;
    None on a tie or without responses."""
    picks = list(study.best.get(position, {}).values())
    if picks:
        counts = {m: picks.count(m) for m in set(picks)}
    else:
        ratings = study.rating.get(position, {})
        counts = {}
        for method in study.methods:
            values = [r[method] for r in ratings.values() if method in r]
            if values:
                counts[method] = float(np.mean(values))
    if not counts:
        return None
    top = max(counts.values())
    winners = [m for m, c in counts.items() if c == top]
    return winners[0] if len(winners) == 1 else None


def _faithfulness(study) -> dict:
    from .metrics import METRICS

    images = []
    for item in study.items:
        aucs = study.auc.get(item["position"], {})
        insertion = {m: a[1] for m, a in aucs.items() if a[1] is not None}
        entry = {"position": item["position"], "item": item["item"],
                 "insertion_auc": {m: _round(v) for m, v in insertion.items()},
                 "deletion_auc": {m: _round(a[0]) for m, a in aucs.items() if a[0] is not None}}
        if study.protocol == "blinded":
            liked = _reviewers_best(study, item["position"])
            top = METRICS["insertion_auc"].best(insertion.values()) if insertion else None
            faithful = [m for m, v in insertion.items() if v == top] if insertion else []
            entry.update({"reviewers_best": liked, "best_insertion": faithful[0] if len(faithful) == 1 else None,
                          "match": (liked == faithful[0]) if liked and len(faithful) == 1 else None})
        else:
            verdicts = list(study.verdict.get(item["position"], {}).values())
            entry["verdicts"] = {v: verdicts.count(v) for v in VERDICTS if v in verdicts}
        images.append(entry)
    result = {"images": images}
    if study.protocol == "blinded":
        judged = [e for e in images if e["match"] is not None]
        result.update({"images_compared": len(judged),
                       "reviewers_best_has_best_insertion": sum(e["match"] for e in judged),
                       "fraction": _round(sum(e["match"] for e in judged) / len(judged), 3) if judged else None,
                       "chance": _round(1 / len(study.methods), 3)})
    else:  # the mean insertion AUC of the shown maps, by majority verdict
        by_verdict = {}
        for entry in images:
            if entry["verdicts"] and entry["insertion_auc"]:
                top = max(entry["verdicts"].values())
                winners = [v for v, c in entry["verdicts"].items() if c == top]
                if len(winners) == 1:
                    by_verdict.setdefault(winners[0], []).append(float(np.mean(list(entry["insertion_auc"].values()))))
        result["mean_insertion_auc_by_majority_verdict"] = {
            v: {"images": len(x), "insertion_auc": _round(float(np.mean(x)))} for v, x in by_verdict.items()}
    return result


def _per_class(study) -> list:
    out = []
    labels = sorted({item["label"] if item["label"] is not None else -1 for item in study.items})
    for label in labels:
        members = [i for i in study.items if (i["label"] if i["label"] is not None else -1) == label]
        entry = {"class": study.class_name(label), "class_index": label, "images": len(members),
                 "model_correct": sum(1 for i in members if i["prediction"] == label)}
        if study.protocol == "open":
            verdicts = [v for i in members for v in study.verdict.get(i["position"], {}).values()]
            entry["verdicts"] = {v: verdicts.count(v) for v in VERDICTS}
        else:
            entry["mean_rating"] = {}
            for method in study.methods:
                values = [r[method] for i in members for r in study.rating.get(i["position"], {}).values()
                          if method in r]
                entry["mean_rating"][method] = _round(float(np.mean(values)), 3) if values else None
        out.append(entry)
    return out


def _counts(study) -> dict:
    per_reviewer = {}
    for reviewer in study.reviewers:
        entry = {"done": study.done(reviewer), "total": len(study.items)}
        if study.protocol == "open":
            verdicts = [v[reviewer] for v in study.verdict.values() if reviewer in v]
            entry.update({v: verdicts.count(v) for v in VERDICTS})
        else:
            values = [x for r in study.rating.values() for x in r.get(reviewer, {}).values()]
            entry.update({"ratings": len(values), "mean_rating": _round(float(np.mean(values)), 3) if values else None,
                          "best_picks": sum(1 for v in study.best.values() if reviewer in v)})
        entry["notes"] = sum(1 for r in study.responses if r["reviewer"] == reviewer and r["note"])
        per_reviewer[reviewer] = entry
    overall = {"images": len(study.items), "reviewers": len(study.reviewers),
               "complete_images": sum(1 for item in study.items
                                      if study.reviewers and all(_is_done(study, item["position"], r)
                                                                 for r in study.reviewers))}
    if study.protocol == "open":
        every = [v for x in study.verdict.values() for v in x.values()]
        overall.update({v: every.count(v) for v in VERDICTS})
    else:
        overall["ratings"] = len(study.ratings)
        overall["best_picks"] = sum(len(v) for v in study.best.values())
    return {"per_reviewer": per_reviewer, "overall": overall}


def _is_done(study, position, reviewer) -> bool:
    if study.protocol == "open":
        return reviewer in study.verdict.get(position, {})
    return len(study.rating.get(position, {}).get(reviewer, {})) >= len(study.methods)


def study_report(db, name: str, *, n_boot: int = 1000, seed: int = 0) -> dict:
    """The results of one study (method names revealed), JSON-ready: the study, counts per reviewer and
    overall, agreement with intervals, per method (blinded), per class, plausibility vs faithfulness."""
    study = _read_study(db, name)
    meta = study.meta
    report = {"study": {"name": name, "protocol": study.protocol, "dataset": meta["dataset"],
                        "model": meta["model"], "methods": study.methods, "reviewers": study.reviewers,
                        "images": len(study.items), "question": meta["question"],
                        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(meta["created"]))},
              "bootstrap": {"resamples": n_boot, "seed": seed, "unit": "image", "level": 0.95},
              "counts": _counts(study), "agreement": _agreement(study, n_boot, seed),
              "per_class": _per_class(study), "faithfulness": _faithfulness(study)}
    if study.protocol == "blinded":
        report["methods"] = _method_stats(study, n_boot, seed)
    else:
        report["methods"] = [{"method": m, **_auc_means(study, m)} for m in study.methods]
    return report


def _read_study(db, name: str) -> "_Study":
    """The study's rows, read at once (the connection is closed unless the caller passed one)."""
    con = _connect(db)
    try:
        return _Study(con, name)
    finally:
        if not isinstance(db, sqlite3.Connection):
            con.close()


def _auc_means(study, method) -> dict:
    aucs = [a[method] for a in study.auc.values() if method in a]
    deletion = [a[0] for a in aucs if a[0] is not None]
    insertion = [a[1] for a in aucs if a[1] is not None]
    return {"faithfulness_images": len(aucs),
            "deletion_auc": _round(float(np.mean(deletion))) if deletion else None,
            "insertion_auc": _round(float(np.mean(insertion))) if insertion else None}


EXPORT_COLUMNS = ("study", "protocol", "position", "item", "true_class", "predicted_class", "confidence",
                  "reviewer", "verdict", "note", "slot", "method", "rating", "picked_best", "updated_utc")


def study_rows(db, name: str) -> list:
    """The study's responses as flat rows (EXPORT_COLUMNS): one per verdict (open) or per rated map (blinded),
    method names revealed."""
    study = _read_study(db, name)
    stamp = lambda t: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))  # noqa: E731
    responses = {(r["position"], r["reviewer"]): r for r in study.responses}
    rows = []

    def base(item, reviewer):
        return {"study": name, "protocol": study.protocol, "position": item["position"], "item": item["item"],
                "true_class": study.class_name(item["label"]), "predicted_class": study.class_name(item["prediction"]),
                "confidence": round(float(item["confidence"]), 4), "reviewer": reviewer}

    if study.protocol == "open":
        for r in sorted(study.responses, key=lambda r: (r["position"], r["reviewer"])):
            item = study.by_position[r["position"]]
            rows.append({**base(item, r["reviewer"]), "verdict": r["verdict"] or "", "note": r["note"], "slot": "",
                         "method": "", "rating": "", "picked_best": "", "updated_utc": stamp(r["updated"])})
        return rows
    for r in sorted(study.ratings, key=lambda r: (r["position"], r["reviewer"], r["slot"])):
        item = study.by_position[r["position"]]
        response = responses.get((r["position"], r["reviewer"]), {})
        slot = SLOTS.index(r["slot"])
        rows.append({**base(item, r["reviewer"]), "verdict": "", "note": response.get("note", ""), "slot": r["slot"],
                     "method": item["order"][slot] if slot < len(item["order"]) else "", "rating": r["rating"],
                     "picked_best": "yes" if response.get("best") == r["slot"] else "",
                     "updated_utc": stamp(r["updated"])})
    return rows


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_cell(value):
    """One CSV cell as a spreadsheet should read it: '' for None, numbers as they are, and text that starts
    like a formula (= + - @, tab, carriage return) behind an apostrophe, so Excel/LibreOffice/Sheets show it as
    text and never run it (CSV injection)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else ""
    if isinstance(value, (int, float, np.integer, np.floating)):
        return value
    text = str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def write_rows_csv(out, columns, rows) -> Path:
    """Rows (dicts) as a CSV spreadsheets open cleanly: UTF-8 with a byte-order mark (Excel on Windows reads a
    BOM-less file in the local code page and garbles names like 'Müller'; pandas and LibreOffice strip the mark;
    Python's csv module reads it with encoding='utf-8-sig'), one header row, RFC 4180 quoting and CRLF line
    ends, every cell through `spreadsheet_cell`."""
    import csv

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8-sig") as handle:
        writer = csv.writer(handle, quoting=csv.QUOTE_MINIMAL, lineterminator="\r\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([spreadsheet_cell(row.get(c)) for c in columns])
    return out


def write_rows(db, name: str, out) -> Path:
    """The study's responses (`study_rows`) as a spreadsheet-safe CSV file; its path."""
    return write_rows_csv(out, EXPORT_COLUMNS, study_rows(db, name))


def write_report(db, name: str, out, *, n_boot: int = 1000, seed: int = 0) -> Path:
    """`study_report` as an indented JSON file (written atomically); its path."""
    from .atomic import atomic_write_text

    out = Path(out)
    atomic_write_text(out, json.dumps(study_report(db, name, n_boot=n_boot, seed=seed), indent=2))
    return out
