"""The segmentation view as a newcomer meets it, in a real browser (Debian's chromium): click-to-result latency,
the unfamiliar-photo warning, refusals without red badges, and the score table at a phone's width.

Starts the app on the bundled models (a subprocess, offline), picks bccd-segformer in the Explain menu, segments
a BCCD test smear (the first shipped example) and clicks "Explain the class's region" again and again with the
default methods, recording from each click: the first map in the gallery, each method's map and its curves (its
row in the score table with AUCs), and the machine's load average. Then: the cat photo segmented (is it flagged,
in what words?), an empty drawing and a background click explained (our sentence, and how many red "Error"
badges are left), the page at 390 x 844 (is every score-table cell at least as wide as its number?), with
screenshots of each.

    python bench/segment_view_latency.py --repeats 6 --out bench/results/segment-view-latency.json \
        --shots /tmp/segment-shots

Timing is recorded in the page by a MutationObserver as the table and the target line change (nothing polls
from outside: a poll every 25 ms through the driver took CPU from the app on a 2-core machine).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from bench.explain_latency import ARGS, CHROMIUM, ROOT, free_port, open_page, start_app, wait_for

MODEL_LABEL = "bccd-segformer · segmentation"
CAT = ROOT / "assets" / "photos" / "cat-chelsea.jpg"
# the score table's rows: [method, del. AUC, ins. AUC] ("…" while its curves are computed)
TABLE = """() => [...document.querySelectorAll('#seg-scores table tbody tr')].map(row => {
    const cells = [...row.querySelectorAll('td')].map(c => c.innerText.trim());
    return [cells[0], cells[cells.length - 3], cells[cells.length - 2]]; })"""
RED = """() => [...document.querySelectorAll('.error')].filter(e => e.offsetParent !== null).map(e => e.innerText)"""
# each score-table cell narrower than its own text (a number broken over lines)
SQUEEZED = """() => { const ctx = document.createElement('canvas').getContext('2d');
    return [...document.querySelectorAll('#seg-scores td, #seg-scores th')].filter(c => {
        const style = getComputedStyle(c); ctx.font = style.font;
        const inner = c.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
        return c.innerText.trim().split(/\\s+/).some(w => ctx.measureText(w).width > inner + 1); })
    .map(c => c.innerText.trim()); }"""


def load() -> float:
    return os.getloadavg()[0]


# Recorded in the page by a MutationObserver (no polling from outside: on a 2-core machine a poll every 25 ms
# through the driver took CPU from the app it measured): each change of the score table's rows or of the target
# line, with performance.now() from just before the click.
WATCH = """(methods) => { const table = """ + TABLE + """;
    const state = { t0: performance.now(), first: null, maps: {}, curves: {}, whole: null, done: false };
    const look = () => { const now = (performance.now() - state.t0) / 1000, rows = table();
        const fresh = rows.some(([, d, i]) => (d + i).includes('…')) || rows.length < methods;
        if (rows.length && (fresh || state.first !== null)) {
            if (state.first === null) state.first = now;
            for (const [method, d, i] of rows) {
                if (!(method in state.maps)) state.maps[method] = now;
                if (!(d + i).includes('…') && !(method in state.curves)) state.curves[method] = now; } }
        const target = document.querySelector('#seg-target');
        if (state.first !== null && Object.keys(state.curves).length === methods && !fresh && target &&
            !target.innerText.includes('…')) { state.whole = now; state.done = true; observer.disconnect(); } };
    const observer = new MutationObserver(look);
    observer.observe(document.body, { subtree: true, childList: true, characterData: true });
    window.__segClick = state; }"""


def one_click(page, methods: int, timeout: float) -> dict:
    load_before = load()
    page.evaluate(WATCH, methods)
    page.locator("#seg-explain").click()
    # the stream goes on after the last curve (the deletion outside the region, and what a copy of the region
    # scores); a click before it ends is dropped by the button's one-at-a-time trigger, so the next click waits
    page.wait_for_function("window.__segClick.done", polling=500, timeout=timeout * 1000)
    state = page.evaluate("window.__segClick")
    curves = state["curves"]
    return {"first_map_s": state["first"], "map_s": state["maps"], "curves_s": curves,
            "last_curve_s": max(curves.values()) if len(curves) == methods else None,
            "whole_s": state["whole"], "load_1min": [round(load_before, 2), round(load(), 2)]}


def pick_model(page) -> None:
    page.locator("#model input").first.click()
    page.locator("ul[role=listbox] li", has_text=MODEL_LABEL).first.click()
    page.wait_for_selector("#segment-view", state="visible", timeout=60_000)


def segment(page, picture=None, example=0) -> None:
    if picture is None:
        page.locator("#seg-examples button.thumbnail-item").nth(example).click()
    else:
        page.locator("#seg-image input[type=file]").set_input_files(str(picture))
    page.wait_for_selector("#seg-image img", timeout=60_000)
    time.sleep(0.5)
    before = page.evaluate("document.querySelector('#seg-legend').innerText")
    page.locator("#seg-run").click()
    page.wait_for_function(f"document.querySelector('#seg-legend').innerText !== {before!r} && "
                           "!!document.querySelector('#seg-prediction img')", timeout=120_000)
    time.sleep(0.5)


def background_pixel() -> tuple:
    """(x, y) of a background pixel of the first example's prediction, far from any cell (the bench's own model
    pass: the same bundled model as the app's)."""
    import numpy as np
    from scipy import ndimage

    from explainers.models import load_model
    from saliency_lab.segmentation import SegmentationView, examples

    shown = SegmentationView(load_model("bccd-segformer")).predict(examples()[0][0])
    background = np.pad(shown.prediction.numpy() == 0, 1)  # the border counts as a cell: a click well inside
    distance = ndimage.distance_transform_edt(background)[1:-1, 1:-1]
    row, column = np.unravel_index(int(distance.argmax()), distance.shape)
    return int(column), int(row)


def refusals(page, shots: Path | None) -> dict:
    """An empty drawing and a click on the background: the sentence said, and the red badges left."""
    found = {}
    page.get_by_text("Draw a region instead").click()
    page.locator("#seg-explain-drawn").click(force=True)  # (the editor's layer sits over it)
    page.wait_for_function("document.querySelector('#seg-target').innerText.includes('empty')", timeout=60_000)
    time.sleep(1)
    found["empty_drawing"] = {"said": page.locator("#seg-target").inner_text(), "red": page.evaluate(RED)}
    column, row = background_pixel()
    box = page.locator("#seg-prediction img").bounding_box()
    natural = page.evaluate("[document.querySelector('#seg-prediction img').naturalWidth, "
                            "document.querySelector('#seg-prediction img').naturalHeight]")
    scale = min(box["width"] / natural[0], box["height"] / natural[1])  # object-fit: contain
    left = box["x"] + (box["width"] - natural[0] * scale) / 2
    top = box["y"] + (box["height"] - natural[1] * scale) / 2
    page.mouse.click(left + (column + 0.5) * scale, top + (row + 0.5) * scale)
    try:
        page.wait_for_function("document.querySelector('#seg-target').innerText.includes('⚠') && "
                               "!document.querySelector('#seg-target').innerText.includes('empty')", timeout=60_000)
    except Exception:  # noqa: BLE001 - recorded as no answer (the click fired no event)
        pass
    time.sleep(1)
    found["background_click"] = {"at": [column, row], "said": page.locator("#seg-target").inner_text(),
                                 "red": page.evaluate(RED)}
    if shots:
        page.screenshot(path=str(shots / "segment-refusal.png"), full_page=True)
    return found


def summarise(result: dict, out: Path | None) -> None:
    """Medians over the measured clicks (the first one warms the caches); written to `out` as they stand."""
    measured = result["runs"][1:]

    def median(values):
        values = [v for v in values if v is not None]
        return round(statistics.median(values), 3) if values else None

    result.update({"clicks": len(measured), "first_map_s": median([r["first_map_s"] for r in measured]),
                   "last_curve_s": median([r["last_curve_s"] for r in measured]),
                   "whole_s": median([r["whole_s"] for r in measured]),
                   "load_1min_median": median([sum(r["load_1min"]) / 2 for r in measured]),
                   "machine": f"{os.cpu_count()} cores", "when": time.strftime("%Y-%m-%d %H:%M")})
    print(f"first map {result['first_map_s']} s, every curve {result['last_curve_s']} s, the whole answer "
          f"{result['whole_s']} s (medians of "
          f"{len(measured)} clicks, load {result['load_1min_median']})", flush=True)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, ensure_ascii=False))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=6, help="explain clicks measured (after one warm-up)")
    parser.add_argument("--methods", type=int, default=4, help="how many methods are ticked (the defaults: 4)")
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--shots", type=Path, help="a folder for the screenshots")
    parser.add_argument("--url", help="an app already running (default: one started here on the bundled models)")
    parser.add_argument("--only", choices=["timing", "checks"], help="only the clicks, or only the other checks")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    if args.shots:
        args.shots.mkdir(parents=True, exist_ok=True)
    app = None
    if args.url:
        url = args.url
    else:
        port = free_port()
        app = start_app(port, Path(os.environ.get("TMPDIR", "/tmp")) / f"segment-latency-data-{port}")
        url = f"http://127.0.0.1:{port}/"
    result = {"load_1min_start": round(load(), 2)}
    try:
        wait_for(url)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = open_page(browser, url, viewport={"width": 1280, "height": 900})
            pick_model(page)
            segment(page)
            result["smear_flagged"] = page.locator("#seg-unfamiliar").is_visible()
            if args.only != "checks":
                result["runs"] = [one_click(page, args.methods, args.timeout) for _ in range(args.repeats + 1)]
                summarise(result, args.out)
            if args.only == "timing":
                return 0
            one_click(page, args.methods, args.timeout)
            if args.shots:
                page.screenshot(path=str(args.shots / "segment-smear.png"), full_page=True)
            result["refusals"] = refusals(page, args.shots)
            segment(page, picture=CAT)
            result["cat"] = {"flagged": page.locator("#seg-unfamiliar").is_visible(),
                             "said": page.locator("#seg-unfamiliar").inner_text()}
            if args.shots:
                page.screenshot(path=str(args.shots / "segment-cat.png"), full_page=True)
            phone = open_page(browser, url, viewport={"width": 390, "height": 844}, device_scale_factor=2,
                              is_mobile=True, has_touch=True)
            pick_model(phone)
            segment(phone)
            one_click(phone, args.methods, args.timeout)
            result["phone_squeezed_cells"] = phone.evaluate(SQUEEZED)
            if args.shots:
                phone.locator("#seg-scores").scroll_into_view_if_needed()
                phone.screenshot(path=str(args.shots / "segment-phone.png"), full_page=True)
            browser.close()
    finally:
        if app is not None:
            app.terminate()
            app.wait(timeout=30)
    if "runs" in result:
        summarise(result, args.out)
    elif args.out:
        args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False))
    print(f"cat flagged: {result['cat']['flagged']}; smear flagged: {result['smear_flagged']}; red badges after "
          f"refusals: {[len(v['red']) for v in result['refusals'].values()]}; squeezed cells at 390 px: "
          f"{len(result['phone_squeezed_cells'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
