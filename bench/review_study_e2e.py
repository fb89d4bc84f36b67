"""A review study run end to end in a real browser (Debian's chromium through Playwright), checked against a
hand computation.

    python bench/review_study_e2e.py --data BLOODMNIST/64/test                             # starts python app.py
    python bench/review_study_e2e.py --data shipped --images 24                          # the shipped cells
    python bench/review_study_e2e.py --url http://127.0.0.1:7860 --data cells.zip --db PATH/review.sqlite
    python bench/review_study_e2e.py --data ... --screenshots docs                       # docs/review-*.png

Without --url the script starts `python app.py` on a free port with a fresh temporary SALIENCY_DATA_DIR (so
the study database is known and read back for one more check) and stops it at the end. The data: `shipped`
picks the app's BloodMNIST cells from the data-set menu; a folder with labels.csv (or a zip of one) is turned
into a zip of `--images` images spread over its classes and uploaded through the page.

In the browser, a creator's context uploads (or picks) the data set and creates an open and a blinded study
(the code is read from the page, where it is shown once). Two reviewers, each in their own browser context,
open each study with its code and answer every image in turn, alternating between them: verdicts and notes
(open), 1-5 ratings of maps A, B, C... and a best pick (blinded). The answers are drawn from --seed before the
run, so the expected results are known. Blinding is checked on every blinded page (no method name in the
captions, texts, progress). Then the creator opens the results and downloads the CSV and JSON exports.

Checks: the page's tables (per reviewer counts, kappa per pair, Fleiss, per method mean rating and best picks)
and the plots; the JSON export and the CSV (every answer given, the shown order) against an independent hand
computation here (Cohen's kappa, quadratically weighted kappa, Fleiss' kappa, counts, mean rating per method;
scikit-learn's `cohen_kappa_score` too when installed). Timings: open an image (click to maps shown), save a
verdict or a rating (click to "Saved"), load the results (click to the tables and plots). Writes a JSON file
(--out) and exits 1 when any check fails.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import random
import re
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
VERDICTS = ("plausible", "implausible", "unsure")
LIKERT = (1, 2, 3, 4, 5)
SLOTS = "ABCDEFGH"
TIMEOUT = 180_000  # ms: a loaded 2-core machine
TRICKY_NOTES = ("=SUM(A1)", 'nucleus, not "membrane"\nsecond line')


# ------------------------------------------------------------------------------------------------ hand computation
def cohen_kappa(a, b, categories, weights=None) -> float:
    """Cohen's kappa of two raters' labels (weights None, 'linear' or 'quadratic'), from the confusion matrix."""
    k = len(categories)
    index = {c: i for i, c in enumerate(categories)}
    n = len(a)
    observed = [[0.0] * k for _ in range(k)]
    for x, y in zip(a, b):
        observed[index[x]][index[y]] += 1 / n
    rows = [sum(observed[i]) for i in range(k)]
    cols = [sum(observed[i][j] for i in range(k)) for j in range(k)]

    def w(i, j):  # disagreement weight
        if weights is None:
            return 0.0 if i == j else 1.0
        d = abs(i - j) / (k - 1)
        return d if weights == "linear" else d * d

    seen = sum(w(i, j) * observed[i][j] for i in range(k) for j in range(k))
    chance = sum(w(i, j) * rows[i] * cols[j] for i in range(k) for j in range(k))
    return 1.0 - seen / chance if chance else float("nan")


def fleiss_kappa(units, categories) -> float:
    """Fleiss' kappa: units = [[label of rater 1, label of rater 2, ...], ...] (the same number of raters)."""
    n_raters = len(units[0])
    counts = [[row.count(c) for c in categories] for row in units]
    total = len(units) * n_raters
    p = [sum(r[j] for r in counts) / total for j in range(len(categories))]
    per_unit = [(sum(x * x for x in r) - n_raters) / (n_raters * (n_raters - 1)) for r in counts]
    mean_p = sum(per_unit) / len(units)
    chance = sum(x * x for x in p)
    return (mean_p - chance) / (1 - chance) if chance < 1 else float("nan")


def draw_answers(protocol, reviewers, n_images, n_slots, seed) -> dict:
    """{reviewer: {position: answer}} known before the run. Reviewers share a per-image 'truth' and depart from
    it now and then, so the agreement is neither 0 nor 1. Open: {'verdict', 'note'}; blinded: {'ratings':
    {slot: 1-5}, 'best': slot or None}. A few notes are spreadsheet traps (a formula, a comma/quote/newline)."""
    rng = random.Random(f"{seed}:{protocol}")
    answers = {r: {} for r in reviewers}
    for position in range(n_images):
        if protocol == "open":
            truth = rng.choice(VERDICTS)
            for k, reviewer in enumerate(reviewers):
                verdict = truth if rng.random() < 0.75 else rng.choice(VERDICTS)
                note = ""
                if position == 0:
                    note = TRICKY_NOTES[k % len(TRICKY_NOTES)]
                elif rng.random() < 0.2:
                    note = f"note {position + 1} by {reviewer}"
                answers[reviewer][position] = {"verdict": verdict, "note": note}
        else:
            base = {slot: rng.randint(1, 5) for slot in SLOTS[:n_slots]}
            for reviewer in reviewers:
                ratings = {s: min(5, max(1, v + rng.choice((-1, 0, 0, 0, 1)))) for s, v in base.items()}
                top = max(ratings.values())
                winners = [s for s, v in ratings.items() if v == top]
                best = rng.choice(winners) if rng.random() < 0.8 else None
                answers[reviewer][position] = {"ratings": ratings, "best": best}
    return answers


def expected_results(protocol, reviewers, answers, order, methods) -> dict:
    """The study's results computed here from the answers given and the shown order {position: [method, ...]}
    (read from the export or the database): counts, kappas, Fleiss, per method."""
    positions = sorted(order)
    out = {"per_reviewer": {}, "pairs": {}}
    if protocol == "open":
        for r in reviewers:
            given = [answers[r][p]["verdict"] for p in positions]
            out["per_reviewer"][r] = {"done": len(given), **{v: given.count(v) for v in VERDICTS}}
        for i, a in enumerate(reviewers):
            for b in reviewers[i + 1:]:
                la = [answers[a][p]["verdict"] for p in positions]
                lb = [answers[b][p]["verdict"] for p in positions]
                out["pairs"][f"{a}|{b}"] = {"kappa": cohen_kappa(la, lb, VERDICTS),
                                            "percent_agreement": sum(x == y for x, y in zip(la, lb)) / len(la),
                                            "images": len(la)}
        out["fleiss"] = fleiss_kappa([[answers[r][p]["verdict"] for r in reviewers] for p in positions], VERDICTS)
        out["fleiss_units"] = len(positions)
        return out

    def by_method(r, p):  # the reveal: slot -> method through the shown order
        return {order[p][SLOTS.index(s)]: v for s, v in answers[r][p]["ratings"].items()}

    for r in reviewers:
        values = [v for p in positions for v in answers[r][p]["ratings"].values()]
        out["per_reviewer"][r] = {"done": len(positions), "ratings": len(values),
                                  "mean_rating": sum(values) / len(values),
                                  "best_picks": sum(1 for p in positions if answers[r][p]["best"])}
    for i, a in enumerate(reviewers):
        for b in reviewers[i + 1:]:
            la = [by_method(a, p)[m] for p in positions for m in methods]
            lb = [by_method(b, p)[m] for p in positions for m in methods]
            picked = [p for p in positions if answers[a][p]["best"] and answers[b][p]["best"]]
            pa = [order[p][SLOTS.index(answers[a][p]["best"])] for p in picked]
            pb = [order[p][SLOTS.index(answers[b][p]["best"])] for p in picked]
            out["pairs"][f"{a}|{b}"] = {
                "kappa": cohen_kappa(la, lb, LIKERT, weights="quadratic"),
                "kappa_unweighted": cohen_kappa(la, lb, LIKERT),
                "percent_agreement": sum(x == y for x, y in zip(la, lb)) / len(la), "images": len(positions),
                "units": len(la), "best_kappa": cohen_kappa(pa, pb, methods) if picked else None,
                "best_images": len(picked)}
    out["fleiss"] = fleiss_kappa([[by_method(r, p)[m] for r in reviewers] for p in positions for m in methods],
                                 LIKERT)
    out["fleiss_units"] = len(positions) * len(methods)
    out["methods"] = {}
    for m in methods:
        values = [by_method(r, p)[m] for r in reviewers for p in positions]
        picks = sum(1 for r in reviewers for p in positions
                    if answers[r][p]["best"] and order[p][SLOTS.index(answers[r][p]["best"])] == m)
        out["methods"][m] = {"mean_rating": sum(values) / len(values), "ratings": len(values), "best_picks": picks,
                             "rating_counts": {str(k): values.count(k) for k in LIKERT}}
    return out


class Checks:
    def __init__(self):
        self.items = []

    def close(self, name, got, expected, tol=1e-4):
        ok = got is not None and expected is not None and abs(float(got) - float(expected)) <= tol
        self.items.append({"check": name, "got": got, "expected": round(expected, 6) if expected is not None
                           else None, "ok": bool(ok)})
        return ok

    def equal(self, name, got, expected):
        ok = got == expected
        self.items.append({"check": name, "got": got if ok else repr(got)[:300],
                           "expected": expected if ok else repr(expected)[:300], "ok": bool(ok)})
        return ok

    @property
    def failed(self):
        return [c for c in self.items if not c["ok"]]


def check_report(checks, label, report, expected, protocol, reviewers, methods):
    """The JSON report (the export, or what the page got) against the hand computation."""
    per = report["counts"]["per_reviewer"]
    for r in reviewers:
        for key, value in expected["per_reviewer"][r].items():
            if key == "mean_rating":
                checks.close(f"{label}: {r} mean rating", per[r]["mean_rating"], value, 1e-3)
            else:
                checks.equal(f"{label}: {r} {key}", per[r][key], value)
    pairs = {f"{p['a']}|{p['b']}": p for p in report["agreement"]["pairs"]}
    for key, want in expected["pairs"].items():
        got = pairs[key]
        checks.close(f"{label}: {key} {'weighted ' if protocol == 'blinded' else ''}kappa", got["kappa"],
                     want["kappa"])
        checks.close(f"{label}: {key} raw agreement", got["percent_agreement"], want["percent_agreement"])
        lo, hi = got["ci95"]
        if got.get("too_few"):  # under MIN_AGREEMENT_IMAGES no interval is given
            checks.equal(f"{label}: {key} no interval on too few images", (lo, hi), (None, None))
        else:
            checks.equal(f"{label}: {key} kappa inside its 95% interval",
                         lo is not None and lo <= got["kappa"] <= hi, True)
        if protocol == "blinded":
            best = {f"{p['a']}|{p['b']}": p for p in report["agreement"]["best_pick_pairs"]}[key]
            checks.equal(f"{label}: {key} best-pick images", best["images"], want["best_images"])
            if want["best_kappa"] is not None:
                checks.close(f"{label}: {key} best-pick kappa", best["kappa"], want["best_kappa"])
    fleiss = report["agreement"]["fleiss"]
    checks.close(f"{label}: Fleiss kappa", fleiss["kappa"], expected["fleiss"])
    checks.equal(f"{label}: Fleiss units", fleiss["units"], expected["fleiss_units"])
    if protocol == "blinded":
        stats = {m["method"]: m for m in report["methods"]}
        for m in methods:
            want = expected["methods"][m]
            checks.close(f"{label}: {m} mean rating", stats[m]["mean_rating"], want["mean_rating"], 1e-3)
            checks.equal(f"{label}: {m} ratings", stats[m]["ratings"], want["ratings"])
            checks.equal(f"{label}: {m} best picks", stats[m]["best_picks"], want["best_picks"])
            checks.equal(f"{label}: {m} rating counts", stats[m]["rating_counts"], want["rating_counts"])
            lo, hi = stats[m]["ci95"]
            checks.equal(f"{label}: {m} mean inside its 95% interval",
                         lo is not None and lo <= stats[m]["mean_rating"] <= hi, True)


def check_with_sklearn(checks, label, protocol, reviewers, answers, order, methods):
    try:
        from sklearn.metrics import cohen_kappa_score
    except ImportError:
        return
    positions = sorted(order)
    a, b = reviewers[:2]
    if protocol == "open":
        la = [answers[a][p]["verdict"] for p in positions]
        lb = [answers[b][p]["verdict"] for p in positions]
        ours = cohen_kappa(la, lb, VERDICTS)
        theirs = cohen_kappa_score(la, lb, labels=list(VERDICTS))
    else:
        def value(r, p, m):
            return answers[r][p]["ratings"][SLOTS[order[p].index(m)]]
        la = [value(a, p, m) for p in positions for m in methods]
        lb = [value(b, p, m) for p in positions for m in methods]
        ours = cohen_kappa(la, lb, LIKERT, weights="quadratic")
        theirs = cohen_kappa_score(la, lb, labels=list(LIKERT), weights="quadratic")
    checks.close(f"{label}: hand kappa = scikit-learn's cohen_kappa_score", ours, theirs, 1e-9)


def page_tables(page, selector="#study-results") -> list:
    """The Markdown tables of the results panel as lists of rows of cell texts."""
    return page.evaluate("""sel => [...document.querySelectorAll(sel + ' table')].map(t =>
        [...t.querySelectorAll('tr')].map(r => [...r.querySelectorAll('th,td')].map(c => c.innerText.trim())))""",
                         selector)


from explainers.review_report import MIN_AGREEMENT_IMAGES as MIN_IMAGES


def check_page(checks, label, tables, expected, protocol, reviewers, methods, labels):
    """The results as shown: per reviewer 'done', kappas and Fleiss (2 decimals), per method (revealed)."""
    counts, agreement = tables[0], tables[1]
    rows = {r[0]: r for r in counts[1:]}
    n = None
    for r in reviewers:
        n = expected["per_reviewer"][r]["done"]
        checks.equal(f"page {label}: {r} done", rows.get(r, ["", ""])[1], f"{n} of {n}")
        if protocol == "open":
            checks.equal(f"page {label}: {r} verdict counts", rows[r][2:5],
                         [str(expected["per_reviewer"][r][v]) for v in VERDICTS])
        else:
            checks.equal(f"page {label}: {r} ratings", rows[r][2], str(expected["per_reviewer"][r]["ratings"]))
    shown = {r[0]: r for r in agreement[1:]}
    for key, want in expected["pairs"].items():
        a, b = key.split("|")
        row = shown.get(f"{a} – {b}")
        if row and row[2].startswith("too few images"):  # under MIN_AGREEMENT_IMAGES: no figure is shown
            checks.equal(f"page {label}: {a} – {b} too few", row[2], f"too few images (fewer than {MIN_IMAGES})")
        else:
            checks.close(f"page {label}: {a} – {b} kappa", float(row[2]) if row else None, want["kappa"], 0.0051)
    fleiss_row = next((r for k, r in shown.items() if k.startswith("Fleiss")), None)
    if fleiss_row and fleiss_row[2].startswith("too few images"):
        checks.equal(f"page {label}: Fleiss too few", fleiss_row[2], f"too few images (fewer than {MIN_IMAGES})")
    else:
        checks.close(f"page {label}: Fleiss kappa", float(fleiss_row[2]) if fleiss_row else None,
                     expected["fleiss"], 0.0051)
    if protocol == "blinded":
        per_method = {r[0]: r for r in tables[2][1:]}
        for m in methods:
            row = per_method.get(labels[m])
            checks.close(f"page {label}: {labels[m]} mean rating", float(row[1]) if row else None,
                         expected["methods"][m]["mean_rating"], 0.0051)
            checks.equal(f"page {label}: {labels[m]} picked best", row[3] if row else None,
                         str(expected["methods"][m]["best_picks"]))


def read_csv_export(data: bytes) -> list:
    return list(csv.DictReader(io.StringIO(data.decode("utf-8-sig"), newline="")))


def check_csv(checks, label, data, protocol, reviewers, answers, n_images, methods) -> dict:
    """The CSV: a BOM, one header, a row per answer with the value given, formulas neutralised; returns the
    shown order {position: [method by slot]} it reveals (blinded) or the study's methods (open)."""
    checks.equal(f"{label} csv: starts with a UTF-8 BOM", data[:3].hex(), "efbbbf")
    rows = read_csv_export(data)
    checks.equal(f"{label} csv: no Python reprs", sorted({c for r in rows for c in r.values() if c in
                                                          ("None", "nan", "NaN", "True", "False") or
                                                          c.startswith(("{", "[", "("))}), [])
    checks.equal(f"{label} csv: ISO timestamps",
                 all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", r["updated_utc"]) for r in rows), True)
    order = {}
    if protocol == "open":
        checks.equal(f"{label} csv: rows", len(rows), n_images * len(reviewers))
        got = {(int(r["position"]), r["reviewer"]): r for r in rows}
        wrong = [(p, who) for who in reviewers for p in range(n_images)
                 if got.get((p, who), {}).get("verdict") != answers[who][p]["verdict"]]
        checks.equal(f"{label} csv: every verdict as given", wrong, [])

        def shown_note(note):
            return "'" + note if note.startswith(("=", "+", "-", "@")) else note
        bad_notes = [(p, who) for who in reviewers for p in range(n_images)
                     if got.get((p, who), {}).get("note") != shown_note(answers[who][p]["note"])]
        checks.equal(f"{label} csv: every note as typed (a formula behind an apostrophe)", bad_notes, [])
        order = {p: list(methods) for p in range(n_images)}
    else:
        checks.equal(f"{label} csv: rows", len(rows), n_images * len(reviewers) * len(methods))
        wrong = []
        for r in rows:
            p, who, slot = int(r["position"]), r["reviewer"], r["slot"]
            order.setdefault(p, [None] * len(methods))[SLOTS.index(slot)] = r["method"]
            if int(r["rating"]) != answers[who][p]["ratings"][slot]:
                wrong.append((p, who, slot))
            if (r["picked_best"] == "yes") != (answers[who][p]["best"] == slot):
                wrong.append((p, who, slot, "best"))
        checks.equal(f"{label} csv: every rating and best pick as given", wrong, [])
        checks.equal(f"{label} csv: each image shows every method once",
                     all(sorted(o) == sorted(methods) for o in order.values()) and len(order) == n_images, True)
    try:
        import pandas

        frame = pandas.read_csv(io.BytesIO(data))
        checks.equal(f"{label} csv: pandas reads the same rows and header", (len(frame), list(frame.columns)),
                     (len(rows), list(rows[0].keys()) if rows else []))
    except ImportError:
        pass
    return order


# ------------------------------------------------------------------------------------------------ the page
TEXT_JS = """window.__text = sel => {  // an element's text without Gradio's 'processing | 0.3/1.2s' overlay
    const e = document.querySelector(sel);
    if (!e) return '';
    const copy = e.cloneNode(true);
    copy.querySelectorAll('[data-testid=status-tracker]').forEach(x => x.remove());
    return copy.textContent;
};"""


def new_context(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 1000}, device_scale_factor=1)
    context.add_init_script(TEXT_JS)
    return context


def wait_js(page, expression, arg=None, timeout=TIMEOUT):
    page.wait_for_function(expression, arg=arg, timeout=timeout)


def text_of(page, elem_id) -> str:
    return page.evaluate("s => __text(s)", f"#{elem_id}")


def fill(page, elem_id, value):
    page.locator(f"#{elem_id} textarea, #{elem_id} input").first.fill(value)


def pick_dropdown(page, elem_id, value):
    box = page.locator(f"#{elem_id} input[role=combobox]")
    box.click()
    box.fill(value)
    option = page.locator("[role=option]", has_text=value).first
    option.wait_for(timeout=30_000)
    option.click()


def open_accordion(page, title):
    button = page.locator("button.label-wrap", has_text=title).first
    if "open" not in (button.get_attribute("class") or ""):
        button.click()


def timed(seconds: list):
    @contextmanager
    def block():
        start = time.perf_counter()
        yield
        seconds.append(time.perf_counter() - start)
    return block()


def shoot(page, path, top_selector, bottom_selector=None, width=1280, pad=12):
    """A 1280-px-wide screenshot from one element's top to another's bottom, kept small (a palette PNG when the
    full-colour one is over 380 KB)."""
    if path is None:
        return None
    page.wait_for_timeout(400)  # let plots and images settle
    top = page.locator(top_selector).first.bounding_box()
    bottom = page.locator(bottom_selector or top_selector).first.bounding_box()
    y0 = max(0, top["y"] - pad)
    scroll = page.evaluate("window.scrollY")
    y0 += scroll
    y1 = bottom["y"] + scroll + bottom["height"] + pad
    page.screenshot(path=str(path), full_page=True, clip={"x": 0, "y": y0, "width": width, "height": y1 - y0})
    if path.stat().st_size > 380_000:
        from PIL import Image

        Image.open(path).convert("RGB").quantize(256).save(path, optimize=True)
    return {"file": str(path), "bytes": path.stat().st_size}


def go_review_tab(page, url):
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector("#explain-button", timeout=TIMEOUT)
    page.get_by_role("tab", name="Review").click()
    page.locator("#study-open").wait_for(timeout=TIMEOUT)


def download(context, page, elem_id) -> tuple:
    """(file name, bytes) of the file the export component shows."""
    link = page.locator(f"#{elem_id} a[href]").first
    link.wait_for(timeout=TIMEOUT)
    href = link.get_attribute("href")
    response = context.request.get(href if href.startswith("http") else page.url.rstrip("/") + "/" + href.lstrip("/"))
    return link.get_attribute("download") or href.rsplit("/", 1)[-1], response.body()


def create_study(page, name, dataset, model, methods, protocol, reviewers, count, shots, shot_name):
    open_accordion(page, "2 · Create a study")
    fill(page, "study-new-name", name)
    if page.locator("#study-dataset input").input_value() != dataset:
        pick_dropdown(page, "study-dataset", dataset)
    if page.locator("#study-model input").input_value() != model:
        pick_dropdown(page, "study-model", model)
    wait_js(page, "m => !!document.querySelector(`#study-methods input[name='${m}']`)", methods[0])
    for _ in range(10):  # the page's own load (or the model's change) narrows and resets the menu: settle first
        boxes = page.locator("#study-methods input[type=checkbox]")
        for k in range(boxes.count()):
            box = boxes.nth(k)
            if box.is_checked() != (box.get_attribute("name") in methods):
                box.click()
        page.wait_for_timeout(1000)
        checked = page.locator("#study-methods input[type=checkbox]:checked").evaluate_all("e => e.map(x => x.name)")
        if sorted(checked) == sorted(methods):
            break
    else:
        raise RuntimeError(f"could not check the methods {methods} (checked: {checked})")
    page.locator(f"#study-protocol input[value={protocol}]").check()
    fill(page, "study-reviewers", ", ".join(reviewers))
    number = page.locator("#study-count input[type=number]")
    number.fill(str(count))
    number.press("Enter")
    start = time.perf_counter()
    page.locator("#study-create").click()
    wait_js(page, "n => __text('#study-created').includes('Owner code') && "
                  "__text('#study-created').includes(n)", name)
    seconds = time.perf_counter() - start
    created = text_of(page, "study-created")
    code = re.search(r"Reviewers' code: (\S+)", created).group(1).strip("`()")
    shot = shoot(page, shots / shot_name if shots and shot_name else None,
                 "button.label-wrap:has-text('2 · Create a study')", "#study-created")
    return code, created, seconds, shot


def open_as(page, name, code, reviewer, total):
    fill(page, "study-name", name)
    fill(page, "study-code", code)
    fill(page, "study-reviewer", reviewer)
    page.locator("#study-open").click()
    wait_js(page, "t => __text('#study-progress').includes(t)", f"of {total} done")
    wait_js(page, "() => __text('#study-info').includes('Image ')")


def current_position(page) -> int:
    return int(re.search(r"Image (\d+) of", text_of(page, "study-info")).group(1)) - 1


def wait_saved(page, before, expected):
    wait_js(page, "([b, e]) => { const t = __text('#study-saved'); "
                  "return t !== b && t.includes(e); }", [before, expected])


def answer_image(page, protocol, answer, n_maps, timings, forbidden):
    """Give one image's answer on the page; the blinded panel is checked for method names first."""
    wait_js(page, "n => document.querySelectorAll('#study-maps img').length >= n", n_maps + 1)
    leaks = []
    if protocol == "blinded":
        panel = " ".join(text_of(page, e) for e in ("study-maps", "study-info", "study-progress", "study-saved"))
        panel += " " + " ".join(page.locator("#study-maps img").evaluate_all("els => els.map(e => e.alt + ' ' + "
                                                                           "e.src.split('/').pop())"))
        leaks = sorted(w for w in forbidden if w in panel.lower())
        for slot, rating in answer["ratings"].items():
            before = text_of(page, "study-saved")
            with timed(timings["save_rating"]):
                page.locator(f"#study-rate-{slot}").get_by_label(str(rating), exact=True).check()
                wait_saved(page, before, f"map {slot} rated {rating}")
        before = text_of(page, "study-saved")
        if answer["best"]:
            page.locator("#study-best").get_by_label(f"Map {answer['best']}", exact=True).check()
            wait_saved(page, before, f"best map {answer['best']}")
    else:
        if answer["note"]:
            before = text_of(page, "study-saved")
            box = page.locator("#study-note textarea")
            box.fill(answer["note"][:-1])  # fill() alone does not fire the textbox's input event: type the last key
            box.press_sequentially(answer["note"][-1])
            wait_saved(page, before, "Note saved")
        before = text_of(page, "study-saved")
        with timed(timings["save_verdict"]):
            page.locator(f"#study-verdict-{answer['verdict']}").click()
            wait_saved(page, before, f"Saved: {answer['verdict']}")
    return leaks


def next_image(page, timings, total, done_before):
    """'Next to do' and wait for the new image and its maps; its position."""
    old = text_of(page, "study-info")
    with timed(timings["open_image"]):
        page.locator("#study-next-open").click()
        wait_js(page, "o => __text('#study-info') !== o", old)
        wait_js(page, "() => [...document.querySelectorAll('#study-maps img')].every(i => i.complete && "
                      "i.naturalWidth > 0)")
    return current_position(page)


def run_study(browser, url, *, protocol, name, dataset, model, methods, reviewers, n_images, seed, creator,
              creator_context, shots=None, timings=None, checks=None, db=None, forbidden=(), labels=None) -> dict:
    """Create a study on the creator's page, have every reviewer (own context each) answer every image, open the
    results and download the exports; checks go to `checks`. Returns what was measured and seen."""
    timings = timings if timings is not None else {}
    for key in ("open_study", "open_image", "save_verdict", "save_rating", "load_results", "create_study", "export"):
        timings.setdefault(key, [])
    checks = checks if checks is not None else Checks()
    labels = labels or {m: m for m in methods}
    shot = (lambda kind: f"review-{kind}.png") if shots else (lambda kind: None)
    code, created, seconds, create_shot = create_study(creator, name, dataset, model, methods, protocol, reviewers,
                                                       n_images, shots, shot("create") if protocol == "blinded"
                                                       else None)
    timings["create_study"].append(seconds)
    total = int(re.search(r"created: (\d+) images", created).group(1))
    checks.equal(f"{protocol}: study of {n_images} images created", total, n_images)
    answers = draw_answers(protocol, reviewers, total, len(methods), seed)
    contexts, pages = [], {}
    leaks, review_shot = [], None
    try:
        for who in reviewers:
            contexts.append(new_context(browser))
            pages[who] = contexts[-1].new_page()
            pages[who].errors = []
            pages[who].on("pageerror", lambda error, e=pages[who].errors: e.append(str(error)))
            go_review_tab(pages[who], url)
            with timed(timings["open_study"]):
                open_as(pages[who], name, code, who, total)
        positions = {who: current_position(pages[who]) for who in reviewers}
        visited = {who: [] for who in reviewers}
        checks.equal(f"{protocol}: every reviewer starts at image 1 with 0 done",
                     [(positions[w], "0 of" in text_of(pages[w], "study-progress")) for w in reviewers],
                     [(0, True)] * len(reviewers))
        for step in range(total):
            for who in reviewers:
                page = pages[who]
                if step:
                    positions[who] = next_image(page, timings, total, step)
                position = positions[who]
                visited[who].append(position)
                found = answer_image(page, protocol, answers[who][position], len(methods), timings, forbidden)
                leaks += [(who, position, w) for w in found]
                wait_js(page, "t => __text('#study-progress').includes(t)",
                        f"{step + 1} of {total} done")
                if shots and step == min(3, total - 1) and who == reviewers[0]:
                    review_shot = shoot(page, shots / shot(protocol), "#study-name", "#study-next-open")
        checks.equal(f"{protocol}: every reviewer's progress reads {total} of {total} done",
                     [f"{total} of {total} done" in text_of(pages[w], "study-progress") for w in reviewers],
                     [True] * len(reviewers))
        checks.equal(f"{protocol}: each reviewer saw every image once",
                     [sorted(visited[w]) for w in reviewers], [list(range(total))] * len(reviewers))
        if protocol == "blinded":
            checks.equal("blinded: no method name on a reviewer's page before the reveal", leaks, [])
        checks.equal(f"{protocol}: no page errors in the reviewers' pages",
                     [e for w in reviewers for e in pages[w].errors], [])
    except Exception:
        for who, page in pages.items():  # what the page showed when it went wrong
            page.screenshot(path=str(Path(tempfile.gettempdir()) / f"review-e2e-failed-{name}-{who}.png"),
                            full_page=True)
        raise
    finally:
        for context in contexts:
            context.close()

    # ---- results, on the creator's page
    page = creator
    fill(page, "study-name", name)
    owner = re.search(r"Owner code: (\S+)", text_of(page, "study-created")).group(1).strip("`()")
    open_accordion(page, "4 · Results")
    # the results are the owner's until the study is closed: the owner code goes in the results panel's own box
    # (the reviewers' code of section 3 does not open them); fill waits for the box to be drawn
    fill(page, "study-owner-code", owner)
    old = text_of(page, "study-results")
    with timed(timings["load_results"]):
        page.locator("#study-results-button").click()
        wait_js(page, "([o, n]) => { const t = __text('#study-results'); "
                      "return t !== o && t.includes('Agreement') && t.includes(n); }", [old, name])
        wait_js(page, "() => !!document.querySelector('#study-kappa-plot .main-svg')")
        if protocol == "blinded":
            wait_js(page, "() => !!document.querySelector('#study-ratings-plot .main-svg')")
    tables = page_tables(page)
    kappa_plot = page.locator("#study-kappa-plot").text_content()
    result_shot = shoot(page, shots / "review-results.png", "#study-results-button", "#study-kappa-plot") \
        if shots and protocol == "blinded" else None
    exports = {}
    with timed(timings["export"]):
        page.locator("#study-export-csv").click()
        wait_js(page, "() => [...document.querySelectorAll('#study-export a')].some(a => (a.download || a.href).endsWith('.csv'))")
    exports["csv"] = download(page.context, page, "study-export")
    page.locator("#study-export-json").click()
    wait_js(page, "() => [...document.querySelectorAll('#study-export a')].some(a => (a.download || a.href).endsWith('.json'))")
    export_shot = shoot(page, shots / "review-exports.png", "#study-results-button", "#study-export") \
        if shots and protocol == "blinded" else None
    exports["json"] = download(page.context, page, "study-export")

    # ---- the checks against the hand computation
    order = check_csv(checks, protocol, exports["csv"][1], protocol, reviewers, answers, total, methods)
    if db and Path(db).exists() and protocol == "blinded":
        with sqlite3.connect(f"file:{Path(db).resolve()}?mode=ro", uri=True) as con:
            stored = {p: json.loads(o) for p, o in con.execute(
                "SELECT position, shown_order FROM study_items WHERE study=?", (name,))}
        checks.equal(f"{protocol}: the shown order in the export = the one stored", order, stored)
    expected = expected_results(protocol, reviewers, answers, order, methods)
    report = json.loads(exports["json"][1])
    check_report(checks, f"{protocol} json", report, expected, protocol, reviewers, methods)
    check_with_sklearn(checks, protocol, protocol, reviewers, answers, order, methods)
    check_page(checks, protocol, tables, expected, protocol, reviewers, methods, labels)
    reported = {f"{p['a']}|{p['b']}": p for p in report["agreement"]["pairs"]}
    for key in expected["pairs"]:
        shown = f"{reported[key]['kappa']:.2f}" in kappa_plot
        if reported[key].get("too_few"):  # too few images: the matrix shows – instead of a figure
            checks.equal(f"page {protocol}: kappa matrix hides {key.replace('|', ' – ')} (too few images)", shown,
                         False)
        else:
            checks.equal(f"page {protocol}: kappa matrix shows {key.replace('|', ' – ')}", shown, True)
    return {"study": name, "protocol": protocol, "images": total, "reviewers": reviewers, "methods": methods,
            "expected": expected, "report_agreement": report["agreement"],
            "report_methods": report["methods"] if protocol == "blinded" else None,
            "exports": {k: {"file": v[0], "bytes": len(v[1])} for k, v in exports.items()},
            "screenshots": [s for s in (create_shot, review_shot, result_shot, export_shot) if s]}


def load_large(browser, creator, url, source: Path, n: int, model: str, methods: list, work: Path, stamp: str,
               checks: Checks) -> dict:
    """The big-data-set timings through the page: upload an n-image zip, create an n-image blinded study, open
    it as a reviewer (first image with its maps) and save one rating."""
    archive = make_zip(source, n, work / f"large-{n}.zip")
    dataset = f"e2e-large-{n}-{stamp}"
    open_accordion(creator, "1 · Data set")
    clear = creator.locator("#study-upload button[aria-label=Clear]")
    if clear.count():
        clear.first.click()  # the earlier upload goes, or both would be sent
    fill(creator, "study-upload-name", dataset)
    start = time.perf_counter()
    creator.locator("#study-upload input[type=file]").set_input_files(str(archive))
    creator.locator(f"#study-upload a[download='{archive.name}']").first.wait_for(timeout=TIMEOUT)
    wait_js(creator, "() => document.querySelectorAll('#study-upload a[download]').length === 1")
    transfer_s = time.perf_counter() - start
    creator.locator("#study-upload-button").click()
    wait_js(creator, "n => __text('#study-upload-info').includes(n)", dataset)
    upload_s = time.perf_counter() - start
    message = " ".join(text_of(creator, "study-upload-info").split())
    checks.equal(f"large: all {n} images loaded", f"{n} images loaded" in message, True)
    wait_js(creator, "n => (document.querySelector('#study-dataset input')?.value ?? '').includes(n)", dataset)
    name = f"e2e-large-{n}-{stamp}"
    code, created, create_s, _ = create_study(creator, name, dataset, model, methods, "blinded", ["dr-a"], n, None,
                                              None)
    checks.equal(f"large: a study of {n} images", f"created: {n} images" in created, True)
    context = new_context(browser)
    try:
        page = context.new_page()
        go_review_tab(page, url)
        start = time.perf_counter()
        open_as(page, name, code, "dr-a", n)
        wait_js(page, "k => document.querySelectorAll('#study-maps img').length >= k", len(methods) + 1)
        open_s = time.perf_counter() - start
        before = text_of(page, "study-saved")
        start = time.perf_counter()
        page.locator("#study-rate-A").get_by_label("4", exact=True).check()
        wait_saved(page, before, "map A rated 4")
        rate_s = time.perf_counter() - start
    finally:
        context.close()
    return {"images": n, "zip_bytes": archive.stat().st_size, "file_transfer_s": round(transfer_s, 3),
            "upload_and_check_s": round(upload_s, 3),
            "message": message, "create_study_s": round(create_s, 3), "open_first_image_s": round(open_s, 3),
            "save_rating_s": round(rate_s, 3), "methods": methods, "model": model}


# ------------------------------------------------------------------------------------------------ data and server
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spread(n, k):
    """k indices spread evenly over n (labels.csv files are sorted by class)."""
    return sorted({int(i * n / k) for i in range(k)}) if k < n else list(range(n))


def make_zip(source: Path, n_images: int, out: Path) -> Path:
    """A zip of n images spread over a labelled folder (labels.csv: file, class_index), with its labels.csv."""
    if source.suffix == ".zip":
        return source
    with (source / "labels.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    chosen = [rows[i] for i in spread(len(rows), n_images)]
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("labels.csv", "file,class_index\n" + "".join(f"{r['file']},{r['class_index']}\n" for r in chosen))
        for r in chosen:
            z.write(source / r["file"], r["file"])
        if (source / "classes.txt").exists():
            z.write(source / "classes.txt", "classes.txt")
    return out


@contextmanager
def app_server(url, data_dir):
    """The given URL, or `python app.py` on a free port with SALIENCY_DATA_DIR=data_dir."""
    if url:
        yield url, None
        return
    port = free_port()
    env = {**os.environ, "SALIENCY_DATA_DIR": str(data_dir), "GRADIO_SERVER_PORT": str(port),
           "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"), "GRADIO_ANALYTICS_ENABLED": "False"}
    env.pop("SALIENCY_LAB_STATE_DIR", None)
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    log = open(Path(data_dir) / "app.log", "w")
    process = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    address = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while True:
            try:
                urllib.request.urlopen(address, timeout=5)
                break
            except OSError:
                if process.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"python app.py did not start; see {log.name}")
                time.sleep(1)
        yield address, Path(data_dir) / "app" / "review.sqlite"
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def summary(values) -> dict:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return {"n": len(values), "median_s": round(statistics.median(values), 4), "p95_s": round(p95, 4),
            "max_s": round(max(values), 4), "mean_s": round(statistics.fmean(values), 4)}


def method_words() -> set:
    """Every method's registry name and label, lower case (what must not appear on a blinded page)."""
    from explainers.methods import METHODS

    return {w.lower() for n, cls in METHODS.items() for w in (n, getattr(cls, "label", n)) if w}


def method_labels(methods) -> dict:
    from explainers.engine import method_label

    return {m: method_label(m) for m in methods}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=None, help="a running app (default: start python app.py)")
    parser.add_argument("--db", default=None, help="its review.sqlite, for the stored-order check (with --url)")
    parser.add_argument("--data", default="shipped",
                        help="'shipped' (the app's BloodMNIST cells), a folder with labels.csv, or a zip of one")
    parser.add_argument("--images", type=int, default=30)
    parser.add_argument("--model", default="bloodmnist-vit")
    parser.add_argument("--open-methods", default="gradcam,aha")
    parser.add_argument("--blinded-methods", default="gradcam,aha,rollout")
    parser.add_argument("--protocols", default="open,blinded")
    parser.add_argument("--reviewers", default="dr-a,dr-b")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--large", type=int, default=0,
                        help="also upload N images, create an N-image study and time its first image (N <= 500)")
    parser.add_argument("--screenshots", default=None, help="a folder for review-*.png (e.g. docs)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "review-study-e2e.json"))
    args = parser.parse_args(argv)

    from playwright.sync_api import sync_playwright

    reviewers = [r.strip() for r in args.reviewers.split(",") if r.strip()]
    shots = Path(args.screenshots) if args.screenshots else None
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="review-e2e-"))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    timings, checks, studies_run = {}, Checks(), []
    started = time.perf_counter()
    with app_server(args.url, work / "data") as (url, db):
        db = Path(args.db) if args.db else db
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            creator_context = new_context(browser)
            creator = creator_context.new_page()
            creator.errors = []
            creator.on("pageerror", lambda error: creator.errors.append(str(error)))
            t0 = time.perf_counter()
            go_review_tab(creator, url)
            timings["page_load"] = [time.perf_counter() - t0]
            open_accordion(creator, "1 · Data set")
            if args.data == "shipped":
                dataset = "bloodmnist-cells"
                open_accordion(creator, "2 · Create a study")
                pick_dropdown(creator, "study-dataset", dataset)  # (opens create too: the menu lives there)
                upload = {"source": "shipped", "dataset": dataset}
                shot = shoot(creator, shots / "review-dataset.png" if shots else None,
                             "button.label-wrap:has-text('1 · Data set')", "#study-model")
            else:
                archive = make_zip(Path(args.data), args.images, work / "cells.zip")
                dataset = f"e2e-cells-{stamp}"
                creator.locator("#study-upload input[type=file]").set_input_files(str(archive))
                creator.locator("#study-upload a[download]").first.wait_for(timeout=TIMEOUT)
                fill(creator, "study-upload-name", dataset)
                t0 = time.perf_counter()
                creator.locator("#study-upload-button").click()
                wait_js(creator, "n => __text('#study-upload-info').includes(n)", dataset)
                upload = {"source": str(args.data), "zip_bytes": archive.stat().st_size, "dataset": dataset,
                          "seconds": round(time.perf_counter() - t0, 3), "message": " ".join(text_of(creator, "study-upload-info").split())}
                checks.equal("upload: every image loaded", f"{args.images} images loaded" in upload["message"], True)
                open_accordion(creator, "2 · Create a study")
                wait_js(creator, "n => (document.querySelector('#study-dataset input')?.value ?? '').includes(n)", dataset)
                shot = shoot(creator, shots / "review-dataset.png" if shots else None,
                             "button.label-wrap:has-text('1 · Data set')", "#study-model")
            upload["screenshot"] = shot
            forbidden = method_words()
            for protocol in [p.strip() for p in args.protocols.split(",") if p.strip()]:
                methods = [m.strip() for m in (args.open_methods if protocol == "open" else args.blinded_methods)
                           .split(",") if m.strip()]
                studies_run.append(run_study(
                    browser, url, protocol=protocol, name=f"e2e-{protocol}-{stamp}", dataset=dataset,
                    model=args.model, methods=methods, reviewers=reviewers,
                    n_images=min(args.images, 24) if args.data == "shipped" else args.images, seed=args.seed,
                    creator=creator, creator_context=creator_context, shots=shots, timings=timings, checks=checks,
                    db=db, forbidden=forbidden, labels=method_labels(methods)))
            large = None
            if args.large:
                if args.data == "shipped":
                    raise SystemExit("--large needs --data: a folder with labels.csv")
                large = load_large(browser, creator, url, Path(args.data), args.large, args.model,
                                   [m for m in args.blinded_methods.split(",") if m], work, stamp, checks)
            checks.equal("no page errors on the creator's page", creator.errors, [])
            browser.close()
    result = {"what": "a review study run end to end in Debian's chromium (Playwright) against python app.py",
              "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "url": args.url or "python app.py",
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
              "model": args.model, "reviewers": reviewers, "seed": args.seed, "data": upload,
              "wall_s": round(time.perf_counter() - started, 1),
              "timings": {k: summary(v) for k, v in timings.items()},
              "studies": studies_run, "large": large, "checks_passed": len(checks.items) - len(checks.failed),
              "checks_failed": checks.failed, "checks": checks.items}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False))
    print(json.dumps({"checks_passed": result["checks_passed"], "checks_failed": checks.failed, "large": large,
                      "timings": result["timings"], "wall_s": result["wall_s"]}, indent=2))
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
