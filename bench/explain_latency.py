"""Click-to-result latency of the Explain tab, as a newcomer sees it in a real browser.

Starts the app on the bundled models (a subprocess, offline), opens it in Debian's chromium, ticks a set of
methods on a model, clicks example cells one after another and records, from the click: the first heatmap on the
page, each method's map and the last curve. Prints a table and writes JSON.

    python bench/explain_latency.py --model bloodmnist-vit --methods aha gradskip gradcam --repeats 5 \
        --out bench/results/explain-latency-vit-3.json

A method counts as shown when a caption naming it is in the heatmap gallery; its curves when that caption carries
its AUCs ("ins"). Timing is polled every 25 ms in the page (the figures are upper bounds by at most that much).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run"]

# the page's state in one call: the captions of the heatmaps, and whether each carries its AUCs
PROBE = """() => [...document.querySelectorAll('#overlays .thumbnail-item, #overlays .preview')].map(e =>
    [(e.querySelector('.caption-label') || {}).innerText || '', (e.querySelector('img') || {}).src || ''])"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_app(port: int, data_dir: Path) -> subprocess.Popen:
    env = dict(os.environ, HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", GRADIO_SERVER_PORT=str(port),
               SALIENCY_DATA_DIR=str(data_dir), PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def wait_for(url: str, timeout: float = 240) -> None:
    import urllib.request

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"the app did not answer at {url} within {timeout:.0f} s")


def open_page(browser, url: str, **context):
    """A new page of the app in a new browser context (`context`: viewport and the like), once the page is up."""
    page = browser.new_context(**context).new_page()
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector("#explain-button", timeout=120_000)
    return page


def tick_methods(page, labels: list[str]) -> None:
    """Tick exactly the methods whose checkbox label starts with one of `labels` (case-insensitive)."""
    boxes = page.locator("#methods label")
    for i in range(boxes.count()):
        box = boxes.nth(i)
        text = box.inner_text().strip().lower()
        wanted = any(text.startswith(label.lower()) for label in labels)
        checkbox = box.locator("input[type=checkbox]")
        if checkbox.is_checked() != wanted:
            checkbox.click()


def one_click(page, example_index: int, labels: list[str], timeout: float) -> dict:
    before = {tuple(item) for item in page.evaluate(PROBE)}  # the last click's results: not counted again
    page.locator("#cell-examples button.thumbnail-item").nth(example_index).click()
    start = time.perf_counter()
    first_map = None
    shown, curved = {}, {}
    while time.perf_counter() - start < timeout:
        captions = [caption for caption, src in map(tuple, page.evaluate(PROBE))
                    if src and (caption, src) not in before]
        now = time.perf_counter() - start
        if captions and first_map is None:
            first_map = now
        for label in labels:
            for caption in captions:
                if caption.lower().startswith(label.lower()):
                    shown.setdefault(label, now)
                    if "ins" in caption:
                        curved.setdefault(label, now)
        if len(curved) == len(labels):
            break
        time.sleep(0.025)
    return {"first_map_s": first_map, "map_s": shown, "curves_s": curved,
            "last_curve_s": max(curved.values()) if len(curved) == len(labels) else None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bloodmnist-vit")
    parser.add_argument("--methods", nargs="+", default=["aha", "gradskip", "grad-cam"],
                        help="checkbox labels (their starts, case-insensitive) of the methods to tick")
    parser.add_argument("--repeats", type=int, default=5, help="example cells clicked (the first is a warm-up)")
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    from playwright.sync_api import sync_playwright

    port = free_port()
    data_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"latency-data-{port}"
    app = start_app(port, data_dir)
    url = f"http://127.0.0.1:{port}/"
    runs = []
    try:
        wait_for(url)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = open_page(browser, url, viewport={"width": 1280, "height": 800})
            model = page.locator("#model input")
            model.fill(args.model)
            model.press("Enter")
            time.sleep(3)  # the model's menu settles (its methods are offered)
            tick_methods(page, args.methods)
            time.sleep(1)
            for i in range(args.repeats + 1):
                runs.append(one_click(page, i % 8, args.methods, args.timeout))
                time.sleep(1)
            browser.close()
    finally:
        app.terminate()
        app.wait(timeout=30)
    measured = runs[1:]  # the first click warms the caches of the model and the page

    def median(key, label=None):
        values = [r[key] if label is None else r[key].get(label) for r in measured]
        values = [v for v in values if v is not None]
        return round(statistics.median(values), 3) if values else None

    summary = {"model": args.model, "methods": args.methods, "clicks": len(measured),
               "first_map_s": median("first_map_s"), "last_curve_s": median("last_curve_s"),
               "map_s": {m: median("map_s", m) for m in args.methods},
               "curves_s": {m: median("curves_s", m) for m in args.methods}, "runs": runs,
               "machine": f"{os.cpu_count()} cores", "when": time.strftime("%Y-%m-%d %H:%M")}
    print(f"{args.model}, {', '.join(args.methods)}: first heatmap {summary['first_map_s']} s, last curve "
          f"{summary['last_curve_s']} s (medians of {len(measured)} clicks)")
    for m in args.methods:
        print(f"  {m}: map {summary['map_s'][m]} s, curves {summary['curves_s'][m]} s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
