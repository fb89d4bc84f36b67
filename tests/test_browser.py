"""A real browser on the real page: Debian's chromium through Playwright (never a downloaded browser).

Opens the app, picks an example, explains with two methods, sees two overlays and the plotly curves, moves the
alpha slider, draws a mask stroke (and clicks for SAM / its fallback, then turns the stroke into SAM's box),
reviews an image, runs the sanity check and the decoy before/after view, and saves a screenshot of each tab.

By default the app runs in-process with tiny models (no ../shared, no network). To shoot the docs/ screenshots
against a running `python app.py` with the bundled models:

    SALIENCY_LAB_URL=http://127.0.0.1:7860 SALIENCY_LAB_SCREENSHOTS=docs pytest tests/test_browser.py
    (SALIENCY_LAB_EXAMPLES=photo-examples picks a photo, for an ImageNet model)
"""
import os
import re
import time
from pathlib import Path

import pytest

from conftest import launch_for_test, screenshot_folder, tiny_cnn, tiny_vit, verdict_stats

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
ROOT = Path(__file__).resolve().parent.parent


pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (apt-get install chromium)")]


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    external = os.environ.get("SALIENCY_LAB_URL")
    if external:
        yield external
        return
    import torch

    torch.set_num_threads(1)
    import app
    from explainers.models import register_bundle

    cnn, vit = register_bundle(tiny_cnn(num_classes=8)), register_bundle(tiny_vit(num_classes=8))
    try:
        from explainers.aha.network import AHAExplainer
        from explainers.aha.store import register_explainer

        for bundle in (cnn, vit):
            register_explainer(bundle, AHAExplainer(bundle))
    except ImportError:
        pass
    state = tmp_path_factory.mktemp("browser-state")
    from explainers.import_model import imported_models

    def model_names():
        return ["tiny-vit", "tiny-cnn"] + [card["name"] for card in imported_models()]

    with pytest.MonkeyPatch.context() as env:
        env.setenv("SALIENCY_DATA_DIR", str(tmp_path_factory.mktemp("browser-data")))  # imports land here
        demo = app.build_app(model_names=model_names, default_model="tiny-vit",
                             data_dir=str(ROOT / "assets" / "bloodmnist"), state_dir=state, sam_variant="vit_b",
                             decoy_roots=[ROOT])  # the decoy models shipped in weights/, if any; no ../shared
        url = launch_for_test(demo, **app.launch_kwargs(demo))
        yield url
        demo.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    return screenshot_folder(tmp_path_factory, "screenshots")


@pytest.fixture(scope="module")
def page(app_url):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(viewport={"width": 1440, "height": 1000}, device_scale_factor=1)
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(app_url, wait_until="domcontentloaded")
        page.wait_for_selector("#explain-button", timeout=60_000)
        page.errors = errors
        yield page
        browser.close()


def wait_js(page, expression, timeout=120_000):
    page.wait_for_function(expression, timeout=timeout)


def test_explain_tab(page, shots):
    external = bool(os.environ.get("SALIENCY_LAB_URL"))
    examples = os.environ.get("SALIENCY_LAB_EXAMPLES", "cell-examples")  # or photo-examples (ImageNet models)
    index = int(os.environ.get("SALIENCY_LAB_EXAMPLE_INDEX", "0"))
    # the expected time of the methods ticked when the page opens, before anything runs
    wait_js(page, "(document.querySelector('#expected-time')?.innerText || '').includes('Expected on this machine')")
    page.locator(f"#{examples} button.thumbnail-item").nth(index).click()  # picking an example explains at once
    wait_js(page, "document.querySelectorAll('#overlays img').length >= 2")
    wait_js(page, "[...document.querySelectorAll('#overlays .caption-label')].filter(e => e.innerText.includes('ins'))"
                  ".length >= 2")  # the curves are in: each caption carries its AUCs
    wait_js(page, "!!document.querySelector('#curves [data-testid=plotly] .main-svg')")
    checked = page.locator("#methods input[type=checkbox]:checked")
    assert checked.count() == 2
    captions = page.locator("#overlays .caption-label").all_inner_texts()
    assert len(captions) == 2 and all("del" in c and "ins" in c for c in captions)
    traces = page.locator("#curves .scatterlayer .trace").count()
    assert traces == 4  # deletion + insertion for each method, on the same axes
    assert "lower deletion auc is better" in page.content().lower()
    assert page.locator("#top5").inner_text().strip()
    if page.locator("#alpha").is_visible():  # GradSkip is offered on ViTs
        slider = page.locator("#alpha input[type=range]")
        slider.fill("0.2")
        slider.dispatch_event("pointerup")  # 'release': the curves follow
        released = ("[...document.querySelectorAll('#overlays .caption-label')]"
                    ".some(e => e.innerText.includes('alpha=0.2') && e.innerText.includes('ins'))")
        try:
            wait_js(page, released, timeout=45_000)
        except Exception:  # once in CI the released value never showed (not reproduced here: a synthetic pointerup
            slider.dispatch_event("pointerup")  # racing the filled value, or a late preview): release once more
            wait_js(page, released)
        # GradSkip is ticked from the start, so its details panel must be there without touching the methods
        details = page.locator("#method-details")
        assert details.is_visible()
        details.get_by_text("GradSkip details").first.click()
        wait_js(page, "!!document.querySelector('#method-details [data-testid=plotly] .main-svg')")
        figure = details.locator("[data-testid=plotly]").first.text_content()  # both of its svg layers
        assert "main / skip share per block" in figure and "skip" in figure  # the b_main profile beside the heads
    else:
        assert external, "the tiny test app defaults to a ViT, so the alpha slider must be shown"
    time.sleep(0.5)
    page.screenshot(path=str(shots / "explain.png"), full_page=True)
    assert not page.errors, page.errors


def test_masks_tab_draw_and_click(page, shots):
    page.get_by_role("tab", name="Masks & fine-tune").click()
    page.get_by_role("button", name="Use the image from the Explain tab").click()
    page.wait_for_selector("#sam-view img", timeout=60_000)
    time.sleep(1.0)  # the editor's WebGL canvas settles
    canvas = page.locator("#mask-editor canvas").first
    box = canvas.bounding_box()
    x, y = box["x"] + box["width"] / 2 - 40, box["y"] + box["height"] / 2 - 20
    page.mouse.move(x, y)
    page.mouse.down()
    for step in range(24):
        page.mouse.move(x + 4 * step, y + 2 * step)
    page.mouse.up()
    time.sleep(0.5)
    page.locator("#use-drawing").click()
    wait_js(page, "document.querySelector('#segmenter-info').innerText.includes('Drawn mask')")
    assert page.locator("#mask-preview img").count() == 1
    view = page.locator("#sam-view img").first.bounding_box()
    page.mouse.click(view["x"] + view["width"] / 2, view["y"] + view["height"] / 2)
    wait_js(page, "document.querySelector('#segmenter-info').innerText.includes('1 object point:')")
    # the drag form of a box: the same stroke's bounding box becomes SAM's box, with the clicked point
    page.locator("#stroke-box").click()
    wait_js(page, "document.querySelector('#segmenter-info').innerText.includes('1 object point and a box')")
    assert "Mask by" in page.locator("#segmenter-info").inner_text()
    page.locator("#mask-label input").click()
    page.locator("ul[role=listbox] li").first.click()
    page.locator("#add-mask").click()
    wait_js(page, "document.querySelector('#set-info').innerText.includes('Mask sets')")
    page.screenshot(path=str(shots / "masks.png"), full_page=True)
    assert not page.errors, page.errors


def test_review_tab(page, shots):
    page.get_by_role("tab", name="Review").click()
    page.locator("#reviewer textarea, #reviewer input").first.fill("browser-test")
    limit = page.locator("#review-limit input[type=number]")
    limit.fill("48")
    limit.press("Enter")
    page.locator("#review-load").click()
    wait_js(page, "document.querySelectorAll('#review-gallery img').length >= 8")
    page.locator("#review-gallery button.thumbnail-item").first.click()
    wait_js(page, "document.querySelectorAll('#review-maps img').length >= 2")
    page.locator("#verdict-plausible").click()
    wait_js(page, "document.querySelector('#review-saved').innerText.includes('plausible')")
    page.locator("#review-note textarea").press_sequentially("membrane highlighted, nucleus not")
    wait_js(page, "document.querySelector('#review-saved').innerText.includes('Note saved')")
    assert "Reviewed" in page.locator("#review-progress").inner_text()
    page.screenshot(path=str(shots / "review.png"), full_page=True)
    assert not page.errors, page.errors


def test_learn_tab(page, shots):
    page.get_by_role("tab", name="Learn").click()
    page.locator("#sanity-button").click()
    checked = page.locator("#sanity-methods input[type=checkbox]:checked").count()
    wait_js(page, f"document.querySelectorAll('#sanity-gallery img').length >= {checked * 5}", timeout=300_000)
    page.locator("#decoy-button").click()
    wait_js(page, "document.querySelectorAll('#decoy-gallery img').length >= 4", timeout=300_000)
    shipped = (ROOT / "weights" / "decoy-bloodmnist-cnn-camal.json").exists()
    if shipped and not os.environ.get("SALIENCY_LAB_URL"):  # before/after maps of the shipped decoy models
        wait_js(page, "document.querySelector('#decoy-info').innerText.includes('decoy-bloodmnist-cnn-camal')")
        assert page.locator("#decoy-gallery img").count() == 4 * 3
    time.sleep(0.5)
    page.screenshot(path=str(shots / "learn.png"), full_page=True)
    assert not page.errors, page.errors


def test_review_study_two_reviewers_in_two_contexts(app_url, page, shots):
    """A blinded study created through the API, reviewed by two people in two browser contexts at once: each sees
    Map A, B (no method name in the study panel), rates, and sees their own progress."""
    from gradio_client import Client
    from explainers.methods import METHODS

    name = f"browser-{int(time.time())}"
    created, _ = Client(app_url, verbose=False).predict(
        name, "bloodmnist-cells", "bloodmnist-vit" if os.environ.get("SALIENCY_LAB_URL") else "tiny-vit",
        ["gradcam", "rollout"], "dr-a, dr-b", "blinded", 3,
        api_name="/review_study_create")
    code = created.split("Reviewers' code: `")[1].split("`")[0]
    owner = created.split("Owner code: `")[1].split("`")[0]
    words = {w.lower() for n, cls in METHODS.items() for w in (n, getattr(cls, "label", n)) if w}
    browser = page.context.browser  # the module's browser (one sync Playwright per thread); two new contexts
    contexts = []
    try:
        pages = {}
        for who in ("dr-a", "dr-b"):
            contexts.append(browser.new_context(viewport={"width": 1440, "height": 1000}))
            page = contexts[-1].new_page()
            page.goto(app_url, wait_until="domcontentloaded")
            page.wait_for_selector("#explain-button", timeout=60_000)
            page.get_by_role("tab", name="Review").click()
            page.locator("#study-name textarea, #study-name input").first.fill(name)
            page.locator("#study-code input, #study-code textarea").first.fill(code)
            page.locator("#study-reviewer textarea, #study-reviewer input").first.fill(who)
            page.locator("#study-open").click()
            pages[who] = page
        for who, page in pages.items():
            wait_js(page, "document.querySelector('#study-progress').innerText.includes('0 of 3 done')")
            wait_js(page, "document.querySelectorAll('#study-maps img').length >= 3")
            panel = " ".join(page.locator(f"#{e}").inner_text() for e in ("study-maps", "study-info", "study-progress"))
            assert "Map A" in panel and not [w for w in words if w in panel.lower()]
            for slot, rating in (("A", "4" if who == "dr-a" else "5"), ("B", "2")):
                page.locator(f"#study-rate-{slot}").get_by_label(rating, exact=True).check()
                wait_js(page, f"document.querySelector('#study-saved').innerText.includes('map {slot} rated')")
            wait_js(page, "document.querySelector('#study-progress').innerText.includes('1 of 3 done')")
        pages["dr-a"].screenshot(path=str(shots / "review-study-blinded.png"), full_page=True)
    finally:
        for context in contexts:
            context.close()
    report = Client(app_url, verbose=False).predict(name, owner, api_name="/review_agreement")[3]
    assert report["counts"]["per_reviewer"]["dr-a"]["done"] == 1 and report["counts"]["per_reviewer"]["dr-b"]["done"] == 1


def test_uploads_refused_with_one_message_and_alpha_shown_on_white(page, tmp_path):
    """An RGBA upload: the preview is composed on white, as the model sees it (said once, in a notice), and
    explained. Then refused uploads: one note in our words beside the image box (no Python object, our 40 MP
    limit), no toast and no red error display on any panel; the box is emptied and the results go with it."""
    import numpy as np
    from PIL import Image

    from conftest import png_header_only

    python_words = ("Traceback", "Error:", "ValueError", "ImageError", "DecompressionBomb", "Exception", "PIL.")

    page.get_by_role("tab", name="Explain").click()
    text = tmp_path / "notes.png"
    text.write_text("hello, not a picture")
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(png_header_only(20000, 20000))
    rgba = np.zeros((48, 48, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[:, 24:, 3] = 255  # left half transparent
    Image.fromarray(rgba, "RGBA").save(tmp_path / "half.png")
    page.evaluate("""() => { window.seenToasts = [];
        new MutationObserver(records => records.forEach(r => r.addedNodes.forEach(n => {
            if (n.nodeType === 1) (n.matches('.toast-body') ? [n] : [...n.querySelectorAll('.toast-body')])
                .forEach(t => window.seenToasts.push(t.innerText)); })))
            .observe(document.body, {childList: true, subtree: true}); }""")
    page.locator("#input-image input[type=file]").set_input_files(str(tmp_path / "half.png"))
    wait_js(page, "window.seenToasts.some(t => t.includes('composed on white'))", timeout=60_000)
    # the preview is swapped for the composed image (its own event, which clears the results), then that image is
    # explained: every ticked method's caption with its AUCs and nothing still computing
    read_pixels = """async () => {
        const img = document.querySelector('#input-image img'); if (!img) return null;
        try { await img.decode(); } catch (error) { return null; }
        const c = document.createElement('canvas'); c.width = img.naturalWidth; c.height = img.naturalHeight;
        const g = c.getContext('2d'); g.drawImage(img, 0, 0);
        return [...g.getImageData(2, 24, 1, 1).data, ...g.getImageData(40, 24, 1, 1).data]; }"""
    page.wait_for_function(f"""async () => {{ const p = await ({read_pixels})();
        return !!p && p.slice(0, 4).every(v => v === 255) && p[4] === 200 && p[7] === 255; }}""",
                           polling=500, timeout=60_000)
    pixel = page.evaluate(read_pixels)
    assert pixel[:4] == [255, 255, 255, 255] and pixel[4] == 200 and pixel[7] == 255, pixel
    checked = page.locator("#methods input[type=checkbox]:checked").count()
    wait_js(page, f"""[...document.querySelectorAll('#overlays .caption-label')].filter(e => e.innerText.includes('ins'))
                      .length === {checked} && !!document.querySelector('#explain-status').innerText.trim()
                      && !document.querySelector('#explain-status').innerText.includes('Still computing')""")
    for path, words in ((text, "notes.png is not a readable image"), (bomb, "the limit is 40 MP")):
        page.evaluate("document.querySelectorAll('.toast-close').forEach(b => b.click())")
        wait_js(page, "document.querySelectorAll('.toast-body').length === 0", timeout=20_000)
        page.evaluate("window.seenToasts = []")
        page.locator("#input-image input[type=file]").set_input_files(str(path))
        # the note; the box emptied; its change (the empty box) cleared the results: every event of this upload done
        wait_js(page, f"""(document.querySelector('#image-note')?.innerText || '').includes({words!r})
                          && document.querySelector('#image-note').offsetParent !== null
                          && !document.querySelector('#input-image img')
                          && document.querySelectorAll('#overlays img').length === 0
                          && document.querySelector('#curves').textContent.includes('Pick an image')""",
                timeout=60_000)
        note = page.locator("#image-note").inner_text()
        assert note.count("not explained") == 1 and " at 0x" not in note and "178" not in note, note
        assert not [word for word in python_words if word in note], note
        assert page.evaluate("window.seenToasts") == []  # the note is the one message: no toast
        errors = page.evaluate("[...document.querySelectorAll('.error')].filter(e => e.offsetParent !== null)"
                               ".map(e => e.innerText)")
        assert errors == [], errors  # no red "Error" on any panel
    assert not page.errors, page.errors


def test_six_methods_fit_with_every_number_readable(page):
    """Explain with every method the tiny ViT offers (7: AHA, GradSkip, Grad-CAM, Chefer, rollout, occlusion,
    RISE) at 1280 x 800 and at a phone's width: all maps in view
    of the page (no inner scroll area), captions not cut, one curve panel per method at a readable height, each
    titled with its method and the caption's two AUCs, every panel title inside the plot and none over another,
    the score table not cut off, a colour bar."""
    page.set_viewport_size({"width": 1280, "height": 800})
    try:
        page.get_by_role("tab", name="Explain").click()
        for box in page.locator("#methods input[type=checkbox]").all():
            if not box.is_checked():
                box.check()
        count = page.locator("#methods input[type=checkbox]:checked").count()
        assert count >= 6
        assert page.locator("#cell-examples .caption-label").count() == 8  # each example cell names its class
        page.locator("#cell-examples button.thumbnail-item").nth(1).click()
        wait_js(page, "[...document.querySelectorAll('#overlays .caption-label')].filter(e => e.innerText.includes("
                      f"'ins')).length === {count}", timeout=300_000)
        time.sleep(1.0)
        for width in (1280, 390):
            page.set_viewport_size({"width": width, "height": 800})
            time.sleep(1.0)
            facts = page.evaluate("""() => {
                const wrap = document.querySelector('#overlays .grid-wrap');
                const table = document.querySelector('#aucs table'), box = document.querySelector('#aucs');
                const plot = document.querySelector('#curves [data-testid=plotly]').getBoundingClientRect();
                const notes = [...document.querySelectorAll('#curves .annotation-text')].map(t => {
                    const b = t.getBoundingClientRect();
                    return {text: t.textContent.replace(/\\s+/g, ''), left: b.left, right: b.right, top: b.top,
                            bottom: b.bottom}; });
                const over = [];
                notes.forEach((a, i) => notes.slice(i + 1).forEach(b => {
                    if (a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom)
                        over.push([a.text, b.text]); }));
                return {scroll: wrap.scrollHeight - wrap.clientHeight,
                        cut: [...document.querySelectorAll('#overlays .caption-label')]
                             .filter(e => e.scrollWidth > e.clientWidth + 1 || e.scrollHeight > e.clientHeight + 1).length,
                        captions: [...document.querySelectorAll('#overlays .caption-label')].map(e => e.innerText),
                        panels: [...document.querySelectorAll('#curves .nsewdrag')]
                                .map(e => Math.round(e.getBoundingClientRect().height)),
                        notes: notes.map(n => n.text), over,
                        outside: notes.filter(n => n.left < plot.left - 1 || n.right > plot.right + 1).map(n => n.text),
                        table: table.getBoundingClientRect().right - box.getBoundingClientRect().right,
                        bar: !!document.querySelector('#colour-bar .colour-bar-strip')}; }""")
            assert facts["scroll"] <= 1 and facts["cut"] == 0, (width, facts)
            # small multiples: a panel per method, none squeezed
            assert len(facts["panels"]) == count and min(facts["panels"]) >= 150, (width, facts)
            for caption in facts["captions"]:  # "<label> · class 0 (options) · del 0.139 ↓ · ins 0.141 ↑"
                label = caption.split(" · ")[0].replace(" ", "")
                scores = re.findall(r"(del|ins) (\d\.\d{3})", caption)
                assert len(scores) == 2, caption
                assert any(n.startswith(label) and all(f"{k}{v}" in n for k, v in scores) for n in facts["notes"]), \
                    (width, caption, facts["notes"])
            assert not facts["over"] and not facts["outside"], (width, facts)
            assert facts["table"] <= 1 and facts["bar"], (width, facts)
    finally:
        page.set_viewport_size({"width": 1440, "height": 1000})
    assert not page.errors, page.errors


def _page_resnet_files(tmp_path) -> tuple:
    """(weights, class names, timm arguments) of the import test's model: a tiny resnet18 with 3 classes."""
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    args = {"channels": [8, 16, 16, 16]}
    network = timm.create_model("resnet18", pretrained=False, num_classes=3, **args)
    weights, classes = tmp_path / "my-cells.safetensors", tmp_path / "classes.txt"
    save_file(network.state_dict(), str(weights))
    classes.write_text("healthy cell\natypical cell\nartefact\n")
    return weights, classes, args


def test_models_tab_import_then_explain(page, shots, tmp_path):
    """(Last: it leaves the imported model picked.) Import a tiny timm resnet18 (3 classes) through the page, then explain an example with it."""
    if os.environ.get("SALIENCY_LAB_URL"):
        pytest.skip("imports into the running server's data folder: only against the in-process test app")
    import json

    weights, classes, args = _page_resnet_files(tmp_path)
    page.get_by_role("tab", name="Models").click()
    page.locator("#import-weights input[type=file]").set_input_files(str(weights))
    page.locator("#import-classes input[type=file]").set_input_files(str(classes))
    arch = page.locator("#import-arch input")
    arch.fill("resnet18")
    arch.press("Enter")
    page.locator("#import-name textarea, #import-name input").first.fill("page-resnet")
    page.get_by_text("Preprocessing and architecture options").click()
    page.locator("#import-size textarea, #import-size input").first.fill("32 32")
    page.locator("#import-args textarea, #import-args input").first.fill(json.dumps(args))
    page.locator("#import-button").click()
    wait_js(page, "document.querySelector('#import-status').innerText.includes('Imported')")
    assert "page-resnet" in page.locator("#imported-table").inner_text()
    page.screenshot(path=str(shots / "models.png"), full_page=True)
    page.get_by_role("tab", name="Explain").click()
    model = page.locator("#model input")
    model.click()
    page.locator("ul[role=listbox] li", has_text="page-resnet").first.click()
    wait_js(page, "document.querySelector('#model input').value.includes('page-resnet')")
    wait_js(page, "document.body.innerText.includes('page-resnet: resnet, 3 classes')")  # the method menu follows
    page.locator("#cell-examples button.thumbnail-item").nth(1).click()
    wait_js(page, "document.querySelector('#explain-status').innerText.includes('page-resnet')")
    wait_js(page, "document.querySelectorAll('#overlays img').length >= 1")
    assert any(name in page.locator("#top5").inner_text() for name in ("healthy cell", "atypical cell", "artefact"))
    page.screenshot(path=str(shots / "models-explain.png"), full_page=True)


def _fresh_page(page, app_url, width=1280, height=800):
    """A new browser context (its own local storage and session) on the module's browser, at width x height."""
    context = page.context.browser.new_context(viewport={"width": width, "height": height}, device_scale_factor=1)
    fresh = context.new_page()
    fresh.errors = []
    fresh.on("pageerror", lambda error: fresh.errors.append(str(error)))
    fresh.goto(app_url, wait_until="domcontentloaded")
    fresh.wait_for_selector("#explain-button", timeout=60_000)
    return context, fresh


def _verdict_classes(page) -> list:
    return page.evaluate("['plausible', 'implausible', 'unsure'].map(v => "
                         "document.querySelector('#verdict-' + v).classList.contains('primary'))")


def test_review_name_survives_a_reload_and_the_set_verdict_is_selected(app_url, page):
    """Issue 11.9: the reviewer's name comes back after a reload; the verdict set on the open image is the
    selected (primary) button, on open, Next, Previous and after a click."""
    who = f"dr-reload-{int(time.time())}"
    context, fresh = _fresh_page(page, app_url)
    try:
        fresh.get_by_role("tab", name="Review").click()
        fresh.locator("#reviewer textarea, #reviewer input").first.fill(who)
        wait_js(fresh, "Object.keys(localStorage).includes('saliency-lab-reviewer')", timeout=30_000)
        time.sleep(1.0)  # the name's change event stores it
        fresh.reload(wait_until="domcontentloaded")
        fresh.wait_for_selector("#explain-button", timeout=60_000)
        fresh.get_by_role("tab", name="Review").click()
        wait_js(fresh, f"(document.querySelector('#reviewer textarea, #reviewer input') || {{}}).value === '{who}'",
                timeout=30_000)
        folder = fresh.locator("#review-folder input").input_value()
        assert "/" not in folder and folder.startswith("bloodmnist-")  # a named data set, not a server path
        fresh.locator("#review-load").click()
        wait_js(fresh, "document.querySelectorAll('#review-gallery img').length >= 8")
        fresh.locator("#review-gallery button.thumbnail-item").first.click()
        wait_js(fresh, "document.querySelectorAll('#review-maps img').length >= 2")
        assert _verdict_classes(fresh) == [False, False, False]  # a new reviewer: nothing set
        fresh.locator("#verdict-implausible").click()
        wait_js(fresh, "document.querySelector('#verdict-implausible').classList.contains('primary')")
        assert _verdict_classes(fresh) == [False, True, False]
        fresh.locator("#verdict-unsure").click()  # a change of mind moves the selection
        wait_js(fresh, "document.querySelector('#verdict-unsure').classList.contains('primary')")
        assert _verdict_classes(fresh) == [False, False, True]
        first = fresh.locator("#review-item").inner_text()
        fresh.locator("#review-next").click()
        wait_js(fresh, f"document.querySelector('#review-item').innerText !== {first!r}")
        wait_js(fresh, "!document.querySelector('#verdict-unsure').classList.contains('primary')")
        assert _verdict_classes(fresh) == [False, False, False]  # the next image has no verdict
        fresh.locator("#review-previous").click()
        wait_js(fresh, f"document.querySelector('#review-item').innerText === {first!r}")
        wait_js(fresh, "document.querySelector('#verdict-unsure').classList.contains('primary')")
        assert _verdict_classes(fresh) == [False, False, True]
        assert not fresh.errors, fresh.errors
    finally:
        context.close()


def test_review_study_open_protocol_end_to_end_in_the_page(app_url, page):
    """The open protocol through the page only (bench/review_study_e2e.py, small): a creator picks the shipped
    cells and creates a study in the Create panel (its code read from the page), two reviewers in two contexts
    give seeded verdicts and notes (a formula and a comma/quote/newline among them) on 4 images, then the
    results table, the kappa matrix and the CSV/JSON exports are checked against a hand computation."""
    from bench.review_study_e2e import (Checks, go_review_tab, method_labels, new_context, open_accordion,
                                        pick_dropdown, run_study)

    external = bool(os.environ.get("SALIENCY_LAB_URL"))
    browser = page.context.browser
    creator_context = new_context(browser)
    try:
        creator = creator_context.new_page()
        go_review_tab(creator, app_url)
        open_accordion(creator, "2 · Create a study")
        pick_dropdown(creator, "study-dataset", "bloodmnist-cells")
        checks, timings = Checks(), {}
        methods = ["gradcam", "rollout"]
        result = run_study(browser, app_url, protocol="open", name=f"browser-open-{int(time.time())}",
                           dataset="bloodmnist-cells", model="bloodmnist-vit" if external else "tiny-vit",
                           methods=methods, reviewers=["dr-a", "dr-b"], n_images=4, seed=9, creator=creator,
                           creator_context=creator_context, timings=timings, checks=checks,
                           labels=method_labels(methods))
    finally:
        creator_context.close()
    assert not checks.failed, checks.failed
    names = {c["check"] for c in checks.items}
    # 4 images: under MIN_AGREEMENT_IMAGES the page says "too few images" instead of a kappa (the JSON keeps it)
    for needed in ("open json: dr-a|dr-b kappa", "open json: Fleiss kappa", "page open: dr-a – dr-b too few",
                   "open csv: every note as typed (a formula behind an apostrophe)", "open csv: every verdict as given"):
        assert needed in names
    assert result["images"] == 4 and len(timings["save_verdict"]) == 8 and len(timings["open_image"]) == 6
    # seed 9 gives dr-a: unsure, implausible, plausible, plausible; dr-b: unsure, unsure, plausible, plausible.
    # By hand: p_o = 3/4, p_e = 2/4*2/4 + 1/4*0 + 1/4*2/4 = 3/8, so kappa = (3/4 - 3/8) / (5/8) = 0.6; Fleiss:
    # P = 3/4, P_e = (4/8)^2 + (1/8)^2 + (3/8)^2 = 13/32, kappa = (3/4 - 13/32) / (19/32) = 11/19
    assert result["report_agreement"]["pairs"][0]["kappa"] == pytest.approx(0.6, abs=1e-4)
    assert result["report_agreement"]["fleiss"]["kappa"] == pytest.approx(11 / 19, abs=1e-4)


def test_study_reviewer_name_is_restored_after_a_reload(app_url, page):
    """A reviewer types their name once: it comes back after a reload (browser storage), in the study panel and in
    the image list. Both failed before: a BrowserState inside a tab not shown first is mounted too late for the
    page's load event."""
    from bench.review_study_e2e import go_review_tab, new_context

    context = new_context(page.context.browser)
    try:
        mine = context.new_page()
        go_review_tab(mine, app_url)
        for elem_id, name in (("study-reviewer", "dr-okafor"), ("reviewer", "dr-lee")):  # study panel, image list
            box = mine.locator(f"#{elem_id} textarea, #{elem_id} input").first
            box.press_sequentially(name)
            box.press("Tab")
        mine.wait_for_timeout(1500)  # the change events write browser storage
        go_review_tab(mine, app_url)  # a reload
        for elem_id, name in (("study-reviewer", "dr-okafor"), ("reviewer", "dr-lee")):
            wait_js(mine, f"() => [...document.querySelectorAll('#{elem_id} textarea, #{elem_id} input')]"
                          f".some(e => e.value === '{name}')", timeout=60_000)
    finally:
        context.close()


def test_browse_gallery_fits_its_column_with_whole_labels(app_url, page):
    """Issue 11.14: at 1280 x 800 the BloodMNIST browser's gallery is not clipped on the right and no label is
    cut; the data set is picked by name (no server path shown)."""
    context, fresh = _fresh_page(page, app_url)
    try:
        fresh.get_by_text("BloodMNIST browser").click()
        chosen = fresh.locator("#browse-folder input").input_value()
        assert "/" not in chosen and chosen.startswith("bloodmnist-"), chosen  # cells, or the test split
        fresh.get_by_role("button", name="Show", exact=True).click()
        wait_js(fresh, "document.querySelectorAll('#browse-gallery img').length >= 24")
        fresh.locator("#browse-gallery").scroll_into_view_if_needed()
        time.sleep(1.0)
        facts = fresh.evaluate("""() => {
            const box = document.querySelector('#browse-gallery').getBoundingClientRect();
            const items = [...document.querySelectorAll('#browse-gallery .thumbnail-item')];
            const labels = [...document.querySelectorAll('#browse-gallery .caption-label')];
            return {items: items.length, labels: labels.length,
                    over: items.filter(e => e.getBoundingClientRect().right > box.right + 1
                                          || e.getBoundingClientRect().left < box.left - 1).length,
                    cut: labels.filter(e => e.scrollWidth > e.clientWidth + 1
                                         || e.getBoundingClientRect().right > box.right + 1).length,
                    page: document.documentElement.scrollWidth - window.innerWidth}; }""")
        assert facts["items"] >= 24 and facts["labels"] == facts["items"], facts  # 24 shipped, 48 a page
        assert facts["over"] == 0 and facts["cut"] == 0 and facts["page"] <= 0, facts
        assert not fresh.errors, fresh.errors
    finally:
        context.close()


def test_learn_gridpg_mosaic_then_one_class(page, shots):
    """The Learn tab's grid pointing game: a mosaic of bloodmnist-cnn with its default methods (Grad-CAM and
    random), every map scored; then one class's maps only, drawn from the session's state."""
    page.get_by_role("tab", name="Learn").click()
    page.locator("#grid-button").click()
    wait_js(page, "document.querySelectorAll('#grid-gallery img').length >= 9", timeout=300_000)  # mosaic + 2 x 4
    info = page.locator("#grid-info").inner_text()
    assert "quadrant sensitivity" in info and "Grad-CAM" in info and "Random" in info
    page.locator("#grid-class label").nth(2).click()  # the second class (the first option is "all four")
    wait_js(page, "document.querySelectorAll('#grid-gallery img').length === 3", timeout=120_000)
    page.locator("#grid-gallery").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "learn-gridpg.png"), full_page=True)


def _ensure_page_resnet(tmp_path) -> None:
    """The import test's model, imported through the library when that test has not run first in this data
    folder (a test run alone)."""
    import json

    from explainers.import_model import import_model, imported_models

    if any(card.get("name") == "page-resnet" for card in imported_models()):
        return
    weights, classes, args = _page_resnet_files(tmp_path)
    import_model(arch="resnet18", name="page-resnet", weights=weights, classes=classes, input_size=(32, 32),
                 model_args=json.dumps(args))


def test_models_tab_trains_an_aha_explainer_for_the_imported_model(page, shots, tmp_path):
    """Start a 3-step AHA job from the Models tab on the shipped cells for page-resnet (the import test's model,
    imported here if that test did not run first); the validation curve appears, the job ends done and AHA is
    one-pass for the model."""
    if os.environ.get("SALIENCY_LAB_URL"):
        pytest.skip("trains for a model it imports into the data folder: only against the in-process test app")
    import csv

    from explainers.paths import user_dir

    _ensure_page_resnet(tmp_path)

    folder = user_dir("datasets") / "three-cells"  # the imported model has 3 classes: 12 shipped cells as 0-2
    folder.mkdir(exist_ok=True)
    with open(ROOT / "assets" / "bloodmnist" / "labels.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))[:12]
    lines = ["file,class_index"]
    for i, row in enumerate(rows):
        (folder / row["file"]).write_bytes((ROOT / "assets" / "bloodmnist" / row["file"]).read_bytes())
        lines.append(f"{row['file']},{i % 3}")
    (folder / "labels.csv").write_text("\n".join(lines) + "\n")
    page.get_by_role("tab", name="Models").click()  # its lists are refreshed when the tab opens
    page.locator("#aha-model input").click()
    page.locator("ul[role=listbox] li", has_text="page-resnet").first.click()
    page.locator("#aha-data input").click()
    page.locator("ul[role=listbox] li", has_text="three-cells").first.click()
    steps = page.locator("#aha-steps input")
    steps.fill("3")
    steps.press("Tab")
    page.locator("#aha-start").click()
    deadline, text = time.monotonic() + 300, ""
    while time.monotonic() < deadline:  # the status line: queued, running (with an ETA), then done
        text = page.locator("#aha-status").inner_text()
        if any(f"): {end}" in text for end in ("done", "failed", "cancelled", "interrupted")):
            break
        time.sleep(1)
    assert "): done" in text and "one pass" in text, text
    wait_js(page, "document.querySelectorAll('#aha-plot .scatterlayer .trace').length >= 3")
    points = page.evaluate("document.querySelectorAll('#aha-plot .scatterlayer .trace')[0]"
                           ".querySelectorAll('.point').length")
    assert points == 4  # the untrained explainer, then every step (3 steps: every max(1, 3 // 10))
    page.screenshot(path=str(shots / "models-aha-train.png"), full_page=True)
    assert not page.errors, page.errors


def test_study_data_set_from_a_picked_folder(app_url, page, tmp_path):
    """A folder picked in the study panel (a directory input): its images and labels.csv become a data set."""
    import shutil

    from bench.review_study_e2e import go_review_tab, new_context, open_accordion

    folder = tmp_path / "smears"
    folder.mkdir()
    cells = sorted((ROOT / "assets" / "bloodmnist").glob("*.jpg"))[:3]
    for cell in cells:
        shutil.copy(cell, folder / cell.name)
    (folder / "labels.csv").write_text("file,class_index\n" + "".join(f"{c.name},{k}\n" for k, c in enumerate(cells)))
    context = new_context(page.context.browser)
    try:
        mine = context.new_page()
        go_review_tab(mine, app_url)
        open_accordion(mine, "1 · Data set")
        mine.locator("#study-upload-folder input[type=file]").set_input_files(str(folder))
        wait_js(mine, "() => document.querySelectorAll('#study-upload-folder a[download]').length >= 4")
        name = f"folder-{int(time.time())}"
        mine.locator("#study-upload-name textarea, #study-upload-name input").first.fill(name)
        mine.locator("#study-upload-button").click()
        mine.wait_for_function("n => __text('#study-upload-info').includes(n)", arg=name, timeout=60_000)
        message = mine.evaluate("() => __text('#study-upload-info')")
    finally:
        context.close()
    assert "3 images loaded" in message and "no labels" not in message and "skipped" not in message, message


def test_an_unfamiliar_image_is_flagged_above_the_prediction(app_url, page):
    """While the explained image is unfamiliar to the model (explainers.familiarity), a warning stands above the
    prediction; a familiar one clears it. Statistics with a known verdict are put on the test app's ViT."""
    if os.environ.get("SALIENCY_LAB_URL"):
        pytest.skip("needs the in-process test app")
    from explainers import familiarity
    from explainers.models import load_model

    bundle = load_model("tiny-vit")

    page.get_by_role("tab", name="Explain").click()
    model = page.locator("#model input").first
    model.click()
    model.fill("tiny-vit")
    page.keyboard.press("Enter")
    note = page.locator("#unfamiliar-note")
    try:
        familiarity.register_stats(bundle, verdict_stats(bundle, flag_all=True))
        page.locator("#cell-examples button.thumbnail-item").nth(1).click()
        wait_js(page, "(document.querySelector('#unfamiliar-note')?.innerText || '').includes('does not look like')")
        box, top5 = note.bounding_box(), page.locator("#top5").bounding_box()
        assert box["y"] + box["height"] <= top5["y"] + 1  # above the prediction, where it is read
        familiarity.register_stats(bundle, verdict_stats(bundle, flag_all=False))
        page.locator("#cell-examples button.thumbnail-item").nth(2).click()
        wait_js(page, "!document.querySelector('#unfamiliar-note') || "
                      "document.querySelector('#unfamiliar-note').offsetParent === null || "
                      "!document.querySelector('#unfamiliar-note').innerText.trim()")
    finally:
        familiarity.register_stats(bundle, None)
    assert not page.errors, page.errors


def pick_bundled_segmentation_model(page):
    """Picks bccd-segformer in the Explain menu; (the menu's input, the model it showed before)."""
    page.get_by_role("tab", name="Explain").click()
    model = page.locator("#model input").first
    before = model.input_value()
    model.click()
    page.locator("ul[role=listbox] li", has_text="bccd-segformer · segmentation").first.click()
    page.wait_for_selector("#segment-view", state="visible", timeout=60_000)
    return model, before


def segment_an_example_with_gradcam_alone(page):
    """bccd-segformer picked, the first example smear (BloodImage_00007) segmented, Grad-CAM alone ticked (the
    quickest map); returns what pick_bundled_segmentation_model does."""
    picked = pick_bundled_segmentation_model(page)
    page.locator("#seg-examples button.thumbnail-item").nth(0).click()
    page.wait_for_selector("#seg-image img", timeout=60_000)  # the smear is in before Segment reads it
    page.locator("#seg-run").click()
    wait_js(page, "(document.querySelector('#seg-legend')?.innerText || '').includes('WBC')")
    for box in page.locator("#seg-methods input[type=checkbox]").all():  # Grad-CAM alone: the quickest map
        if box.is_checked():
            box.uncheck()
    page.locator("#seg-methods label", has_text="Grad-CAM").first.click()
    return picked


def test_a_segmentation_model_turns_explain_into_the_segmentation_view(page):
    """The Explain menu also lists the segmentation models (labelled): picking one hides the classifier view and shows
    the segmentation view in its place (one model menu, the example smears); picking the classifier again brings the
    classifier view back. (The whole segmentation flow on the bundled model: docs/segment-view.png.)"""
    model, before = pick_bundled_segmentation_model(page)
    page.wait_for_selector("#classifier-view", state="hidden", timeout=60_000)
    assert page.locator("#seg-examples button.thumbnail-item").count() >= 3
    assert page.locator("#seg-model").count() == 0  # the Explain menu drives the view
    wait_js(page, "document.querySelector('#model-info').innerText.includes('bccd-segformer segments')")
    # a test smear segmented (not flagged as unfamiliar), then a refusal: an empty drawing is said on the target
    # line, the rest left as it was, and no red "Error" badge anywhere
    page.locator("#seg-examples button.thumbnail-item").first.click()
    page.wait_for_selector("#seg-image img", timeout=60_000)
    page.locator("#seg-run").click()
    wait_js(page, "document.querySelector('#seg-legend').innerText.includes('RBC')")
    assert not page.locator("#seg-unfamiliar").is_visible()
    page.get_by_text("Draw a region instead").click()
    page.locator("#seg-explain-drawn").click(force=True)
    wait_js(page, "document.querySelector('#seg-target').innerText.includes('The drawn region is empty')")
    red = page.evaluate("[...document.querySelectorAll('.error')].filter(e => e.offsetParent !== null).length")
    assert red == 0
    model.click()
    model.fill(before)
    page.keyboard.press("Enter")
    page.wait_for_selector("#classifier-view", state="visible", timeout=60_000)
    page.wait_for_selector("#segment-view", state="hidden", timeout=60_000)
    assert page.locator("#explain-button").is_visible()
    assert not page.errors, page.errors


def test_the_segmentation_view_explains_context(page):
    """On the bundled model: an example smear, Segment, Grad-CAM of the first class's region; the caption says what
    a copy of the region would score, the out-of-region curve is drawn beside the region's own, and "Context only"
    redraws the maps (outside the region only) without another run."""
    model, before = segment_an_example_with_gradcam_alone(page)
    page.locator("#seg-explain").click()
    wait_js(page, "(document.querySelector('#seg-copy-caption')?.innerText || '').includes('copies the region')",
            timeout=300_000)
    assert "Out del." in page.locator("#seg-scores").inner_text()
    # the figure comes in the same answer as the caption, but plotly draws it a moment later in the browser
    page.wait_for_selector("#seg-context-curves .js-plotly-plot", timeout=30_000)
    assert page.locator("#seg-context-curves .js-plotly-plot").count() == 1
    whole = page.locator("#seg-maps img").first.get_attribute("src")
    page.locator("#seg-context-only input[type=checkbox]").check()
    wait_js(page, f"document.querySelector('#seg-maps img')?.getAttribute('src') !== {whole!r}")
    model.click()
    model.fill(before)
    page.keyboard.press("Enter")
    page.wait_for_selector("#classifier-view", state="visible", timeout=60_000)
    assert not page.errors, page.errors


def test_a_click_while_an_explanation_streams_replaces_it(page):
    """On the bundled model and an example smear: a red cell clicked, then the white cell a moment later while the
    first explanation still streams. The second click is answered (it used to be dropped until the first ended):
    the target line ends on the white cell, with its caption, and nothing red."""
    model, before = segment_an_example_with_gradcam_alone(page)
    picture = page.locator("#seg-prediction img")
    picture.scroll_into_view_if_needed()  # the mouse clicks where the picture is on the screen
    box = picture.bounding_box()
    width, height = page.evaluate("[document.querySelector('#seg-prediction img').naturalWidth, "
                                  "document.querySelector('#seg-prediction img').naturalHeight]")
    scale = min(box["width"] / width, box["height"] / height)
    left, top = box["x"] + (box["width"] - width * scale) / 2, box["y"] + (box["height"] - height * scale) / 2

    def click(x, y):  # a point of the smear's 320 x 240 example mask
        page.mouse.click(left + x / 320 * width * scale, top + y / 240 * height * scale)

    click(48, 66)  # the largest red cell
    wait_js(page, "(document.querySelector('#seg-target')?.innerText || '').includes('Explaining RBC')")
    click(159, 86)  # the white cell, while the red cell's explanation streams
    wait_js(page, "(document.querySelector('#seg-target')?.innerText || '').includes('Explaining WBC') && "
                  "(document.querySelector('#seg-copy-caption')?.innerText || '').includes('copies the region')",
            timeout=300_000)
    assert page.evaluate("[...document.querySelectorAll('.error')].filter(e => e.offsetParent !== null).length") == 0
    model.click()
    model.fill(before)
    page.keyboard.press("Enter")
    page.wait_for_selector("#classifier-view", state="visible", timeout=60_000)
    assert not page.errors, page.errors


@pytest.mark.skipif(not (ROOT / "weights" / "agents" / "defend_the_center-camal.json").exists(),
                    reason="the shipped agents are not in this checkout")
def test_the_agents_tab_shows_what_needs_no_model_beside_the_shipped_pair(page, shots):
    """The shipped vanilla and CAMAL agents play one short episode side by side: both frames arrive, the facts
    give each agent's held-out return with the scripts' on the same episodes, and the timeline draws the IoU
    reference points (random map, fixed prior map, the grid's ceiling) as labelled grey lines."""
    from explainers.agents import envs

    if not envs.vizdoom_available():
        pytest.skip("ViZDoom is not installed")
    page.get_by_role("tab", name="Agents").click()
    steps = page.locator("#agents-max-steps input").first
    steps.fill("24")
    steps.press("Tab")
    page.locator("#agents-play").click()
    wait_js(page, "(document.querySelector('#agents-facts')?.innerText || '').includes('held-out episodes')",
            timeout=300_000)
    facts = page.evaluate("document.querySelector('#agents-facts').innerText")
    assert facts.count("held-out episodes") == 2 and "blind script" in facts and "random policy" in facts
    assert page.locator("#agents-frame-a img").count() == 1 and page.locator("#agents-frame-b img").count() == 1
    wait_js(page, "document.querySelectorAll('#agents-timeline .annotation-text').length >= 3")
    notes = page.evaluate("[...document.querySelectorAll('#agents-timeline .annotation-text')].map(e => e.textContent)")
    assert any(n.startswith("random map") for n in notes) and any(n.startswith("fixed prior map") for n in notes)
    page.screenshot(path=str(shots / "agents.png"), full_page=True)
    assert not page.errors, page.errors
