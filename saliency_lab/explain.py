"""One explanation of one image, as the Explain tab keeps it: a plain, JSON-like `state` dict (the model, the
image, the target class, the top-5 prediction and one record per method), and the steps that update it.

    state, image = explain_maps(services, "cell.png", "bloodmnist-cnn", ["gradcam", "aha"])  # maps first (fast)
    state, image = explain_curves(services, state)                                          # then the curves
    state, image = recombine_live(services, state, "alpha", 0.2)   # a live option (GradSkip's alpha): no model pass
    state, image = rerun_method(services, state, "aha", {"refine_steps": 3})
    pictures = overlay_pictures(services, state, opacity=0.5, colormap="cividis", image=image)

Slider values (`values`: {option name: value}) reach every method that declares that user option
(`explainers.methods.Option`), cast once here (`slider_values`, `cast_option`); nothing here names a method. An
image is decoded once per upload and prepared once per model (`services.uploads`): every step, redraw and
download reuses that prepared input (`explainers.engine.PreparedInput`).

`services` is a `saliency_lab.services.Services`. A method that cannot explain this model or image is skipped
with a note in `state["skipped"]` (and `warn(text)` when given); other errors propagate. Errors meant for the
user are ValueError.
"""
from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

from explainers import engine, familiarity
from explainers.images import conversion_notes, file_facts
from explainers.methods import METHODS

from . import menus, pictures
from .errors import is_skippable, user_message
from .services import add_curves, run_method

NO_IMAGE = "Upload an image, pick an example or choose one from the BloodMNIST browser first."
AUTO = "auto"


def shown_image(services, image_path) -> tuple:
    """(path, note) of the picture to show for an upload: the file itself when a browser shows it exactly as
    `explainers.images.load_image` reads it, else a PNG of what load_image returns (named after the upload),
    so that the preview, the model input and the overlays are one image. `note`: why it changed (transparency
    composed on white, only the first of several frames), or "". Refused uploads raise ImageError (a message for
    the user)."""
    path = Path(str(image_path))
    folder = services.downloads / "uploads"
    if folder in path.parents:
        return str(path), ""
    picture = services.uploads.picture(path)  # refuses what the model could not take
    facts = file_facts(path)
    if facts[0]:
        return str(path), ""
    from explainers.images import image_digest, png_bytes

    target = folder / image_digest(picture)[:24] / f"{path.stem or 'image'}.png"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(png_bytes(picture, compress_level=1))
    services.uploads.remember(target, picture)  # the normalised copy is the same picture: not decoded again
    return str(target), " ".join(conversion_notes(facts))


def prepared(services, model_name, image_path) -> tuple:
    """(bundle, explainers.engine.PreparedInput) of an image path for a model, decoded and prepared once
    (`services.uploads`); ValueError without an image."""
    if not image_path:
        raise ValueError(NO_IMAGE)
    bundle = classifier(services, model_name)
    return bundle, services.uploads.prepared(bundle, image_path)


def classifier(services, model_name):
    """The model's bundle; ValueError for a segmentation model (the classifier methods, predictions and curves
    do not apply: the segmentation view explains it)."""
    bundle = services.bundle(model_name)
    if getattr(bundle, "task", "classification") == "segmentation":
        raise ValueError(f"{model_name} is a segmentation model: the segmentation view explains it (pick it in "
                         "the Explain tab's model menu; API: /segment, then /segment_explain).")
    return bundle


def target_choices(prediction) -> list:
    """[(label, value)] for the target menu: the top-1 class ("auto", named with its probability), then the other
    top-5 classes with theirs (the top-1 class is not listed twice)."""
    if not prediction:
        return [("Predicted class (top-1)", AUTO)]
    (_, first, p_first), rest = prediction[0], prediction[1:]
    return [(f"Predicted: {first} · {p_first:.1%}", AUTO)] + [(f"{name} · {p:.1%}", str(i)) for i, name, p in rest]


def label_value(prediction) -> dict:
    """{class name: probability} of a prediction (names made unique with their index)."""
    out = {}
    for i, name, p in prediction:
        out[name if name not in out else f"{name} ({i})"] = float(p)
    return out


def unfamiliar_note(state) -> str:
    """The warning shown above the prediction, where a person reads it, while the explained image is unfamiliar to
    the model (`explainers.familiarity`); "" otherwise."""
    verdict = (state or {}).get("familiarity") or {}
    return f"⚠ **Unfamiliar image.** {verdict['message']}" if verdict.get("unfamiliar") else ""


def status_text(state) -> str:
    """A Markdown line: model, target and the time each map took; the skipped methods and why."""
    if not state:
        return ""
    skipped = ("\n\n**Skipped:** " + "; ".join(state["skipped"])) if state.get("skipped") else ""
    unfamiliar = unfamiliar_note(state) + "\n\n" if unfamiliar_note(state) else ""  # also for API clients
    if not state.get("results"):
        return (unfamiliar + skipped.strip() + "\n\n" + still_running_text(state)).strip()
    parts = [f"**{r['label']}** {1000 * r['seconds']:.0f} ms" for r in state["results"]]
    crop = f" {state['crop_note']}" if state.get("crop_note") else ""
    running = still_running_text(state)
    return unfamiliar + (f"Model **{state['model']}**, target **{state['target_name']}** (class {state['target']}). "
                         f"Map times: {', '.join(parts)}.{crop}") + caveats_text(state) + skipped + (
        f"\n\n{running}" if running else "")


def caveats_text(state) -> str:
    """The methods' caveats for this model and these options (`Method.caveat`, e.g. a one-pass map that barely
    changes with the class asked about), each once, as Markdown paragraphs; "" when there is none."""
    seen = []
    for record in (state or {}).get("results", []):
        if record.get("caveat") and record["caveat"] not in seen:
            seen.append(record["caveat"])
    return "".join(f"\n\n**Note:** {text}" for text in seen)


def has_method(state, method: str) -> bool:
    return bool(state) and any(r["method"] == method for r in state.get("results", []))


def target_choice(choice, prediction) -> str:
    """"auto", or the chosen class index as text when it is among the top-5 (else "auto")."""
    choice = AUTO if choice in (None, "", AUTO) else str(choice)
    if choice != AUTO and int(choice) not in [i for i, _, _ in prediction]:
        return AUTO
    return choice


def explain_maps(services, image_path, model_name, methods, target=AUTO, values=None, *, warn=None) -> tuple:
    """Step 1 of an explanation: the top-5 prediction and each chosen method's map, without curves (fast).
    `target`: "auto" (top-1) or a class index among the top 5; `values`: the sliders' values by option name.
    Returns (state, image); the state's "target_choice" is what the target menu should show."""
    bundle, image, state = start_state(services, image_path, model_name, methods, target, values, warn=warn)
    for method in menus.method_order(list(methods)):
        record = map_or_skip(services, bundle, image, state, method, warn)
        if record is not None:
            state["results"].append(record)
    return state, image


def start_state(services, image_path, model_name, methods, target=AUTO, values=None, *, warn=None) -> tuple:
    """(bundle, image, state) of a new explanation: the prediction and the target, no result yet."""
    if not list(methods or []):
        raise ValueError("Pick at least one explanation method.")
    bundle, image = prepared(services, model_name, image_path)
    prediction, verdict = engine.predict_and_check(bundle, image, 5)
    choice = target_choice(target, prediction)
    if verdict and verdict["unfamiliar"] and warn is not None and choice == AUTO:
        warn(verdict["message"])  # once per image (a new class of the same image keeps the note, not the toast)
    target_index = prediction[0][0] if choice == AUTO else int(choice)
    state = {"model": model_name, "image": image_path, "image_name": Path(str(image_path)).name,
             "image_size": list(image.original.size), "crop_note": pictures.crop_note(image, bundle),
             "target": target_index, "target_name": bundle.class_name(target_index), "prediction": prediction,
             "target_choice": choice, "familiarity": verdict, **slider_values(values), "results": [], "skipped": []}
    return bundle, image, state


def map_or_skip(services, bundle, image, state, method: str, warn=None) -> dict | None:
    """One method's map for the state's image and target (its time remembered), or None when the method cannot
    explain this model or image (noted in state["skipped"], and `warn` told)."""
    options = engine.method_options(method, {k: state[k] for k in slider_values() if k in state}, bundle)
    try:
        record = run_method(bundle, image, method, state["target"], options, services.cache, curves=False)
    except (ValueError, RuntimeError) as error:
        if not is_skippable(error):
            raise
        state["skipped"].append(f"{engine.method_label(method)}: {user_message(error)}")
        if warn is not None:
            warn(f"{engine.method_label(method)} skipped: {user_message(error)}")
        return None
    remember_seconds(services, bundle, record)
    return record


def stream_order(services, bundle, methods, values=None) -> list:
    """The methods in the order a streamed explanation runs them: the quickest expected first (menu order among
    equals), so that a slow method (RISE, occlusion) never holds back maps that take milliseconds."""
    ordered = menus.method_order([m for m in methods if m in METHODS])
    return sorted(ordered, key=lambda m: expected_seconds(services, bundle, m, values))


# Every update of a streamed explanation costs the page a round trip and a redraw (about 0.2-0.5 s on a loaded
# 2-core machine, measured in bench/explain_latency.py), more than a quick method's map or curves take. So the
# quick maps come in one update, with the prediction, and curves are gathered for up to UPDATE_SECONDS.
QUICK_SECONDS = 0.3  # maps expected to take this long together are computed before the first update
UPDATE_SECONDS = 1.0  # curves finished within this long of the last update wait to be shown with the next ones


def quick_methods(order: list, expected: dict) -> list:
    """The first methods of `order` whose maps are expected to take QUICK_SECONDS together (none when the first
    alone takes longer: the prediction is then shown before it runs)."""
    quick, total = [], 0.0
    for method in order:
        total += expected[method]
        if total > QUICK_SECONDS:
            break
        quick.append(method)
    return quick


def explain_stream(services, image_path, model_name, methods, target=AUTO, values=None, *, warn=None):
    """An explanation as it is made, the quickest methods first (`stream_order`; the results kept in menu order).
    Yields (state, image): the prediction with the quick methods' maps (`quick_methods`), their curves (gathered
    for up to UPDATE_SECONDS between updates), then each slower method's map and its curves; the last update is the
    whole explanation. While it runs, state["pending"] lists [(label, expected seconds)] of the methods whose map
    is still to come, state["curving"] the labels whose curves are being computed (None when none)."""
    bundle, image, state = start_state(services, image_path, model_name, methods, target, values, warn=warn)
    order = stream_order(services, bundle, methods, values)
    expected = {m: expected_seconds(services, bundle, m, values) for m in order}
    place = {m: i for i, m in enumerate(menus.method_order(list(methods)))}  # shown in menu order, as ever
    state["pending"] = [(engine.method_label(m), expected[m]) for m in order]
    state["curving"] = None
    quick = quick_methods(order, expected)
    waiting = []  # records whose curves are still to come

    def with_map(state, method):
        record = map_or_skip(services, bundle, image, state, method, warn)
        state = {**state, "pending": state["pending"][1:]}
        if record is not None:
            waiting.append(record)
            results = sorted(state["results"] + [record], key=lambda r: place.get(r["method"], len(place)))
            state = {**state, "results": results}
        return {**state, "curving": ", ".join(r["label"] for r in waiting) or None}

    def with_curves(state, record):
        computed = engine.cached_result(services.cache, bundle, image, record["method"], record["target"],
                                        record["options"]) is None  # a cached one says nothing of the time
        started = time.perf_counter()
        done = add_curves(bundle, image, record, services.cache)
        if computed:
            remember_curve_seconds(services, bundle, time.perf_counter() - started)
        waiting.remove(record)
        results = [done if r is record else r for r in state["results"]]
        return {**state, "results": results, "curving": ", ".join(r["label"] for r in waiting) or None}

    for method in quick:
        state = with_map(state, method)
    yield state, image
    last = time.perf_counter()
    for record in list(waiting):
        state = with_curves(state, record)
        if waiting or len(quick) < len(order):
            if not waiting or time.perf_counter() - last >= UPDATE_SECONDS:
                yield state, image
                last = time.perf_counter()
    for method in order[len(quick):]:
        state = with_map(state, method)
        if not waiting:  # skipped
            if state["pending"]:
                yield state, image
            continue
        yield state, image
        state = with_curves(state, waiting[0])
        if state["pending"]:
            yield state, image
    state = {k: v for k, v in state.items() if k not in ("pending", "curving")}
    yield state, image


def still_running_text(state) -> str:
    """What a streamed explanation is still computing, for the status line ("" when it is done)."""
    parts = []
    if (state or {}).get("curving"):
        parts.append(f"the curves of {state['curving']}")
    parts += [f"{label} ({_seconds(seconds)} expected)" for label, seconds in (state or {}).get("pending", [])]
    return ("Still computing: " + ", ".join(parts) + "…") if parts else ""


def slider_values(values=None) -> dict:
    """{option name: value} for every slider (`menus.sliders()`), the given values cast, else the defaults."""
    values = values or {}
    return {option.name: option.cast(values.get(option.name)) for _, option in menus.sliders()}


def cast_option(name: str, value):
    """One slider's value as its option's type (the one cast between a slider and the methods)."""
    option = next((o for _, o in menus.sliders() if o.name == name), None)
    return value if option is None else option.cast(value)


def explain_curves(services, state) -> tuple:
    """Step 2: deletion and insertion curves of every map (2 x 21 model passes each); (state, image)."""
    bundle, image = prepared(services, state["model"], state["image"])
    results = [add_curves(bundle, image, record, services.cache) for record in state["results"]]
    return {**state, "results": results}, image


def curve_methods(state) -> list:
    """[(label, method)] of the results whose curves are computed (what the step viewer can show)."""
    return [(r["label"], r["method"]) for r in (state or {}).get("results", []) if r.get("fractions") is not None]


def curve_step(services, state, method: str, step: int, image=None) -> list:
    """[(picture, caption)] of the image as the deletion and the insertion curve of `method` feed it to the model
    at step `step` (the top step/K of the map's pixels replaced by the reference colour, or the reference with
    them restored: the curve engine's ranks, ties broken alike), each with the target's probability at that
    step, read from the curves already computed: no model pass. Shown at the model's input, enlarged."""
    record = next((r for r in (state or {}).get("results", []) if r["method"] == method
                   and r.get("fractions") is not None), None)
    if record is None:
        raise ValueError("Its curves are not computed yet: explain an image with this method first.")
    steps = len(record["fractions"]) - 1
    step = min(max(int(step), 0), steps)
    bundle = services.bundle(state["model"])
    if image is None:
        _, image = prepared(services, state["model"], state["image"])
    deleted, inserted = pictures.curve_step_images(image.tensor, record["map"], step, steps, bundle.reference_color)
    share = record["fractions"][step]
    name = record["target_name"]
    return [(deleted, f"Deletion, step {step}/{steps}: {share:.0%} of the pixels removed (most important first). "
                      f"p({name}) = {record['deletion'][step]:.3f}"),
            (inserted, f"Insertion, step {step}/{steps}: {share:.0%} of the pixels restored on the reference. "
                       f"p({name}) = {record['insertion'][step]:.3f}")]


def has_details(state) -> bool:
    """Whether a result's method has a diagnostics panel (a prepared state with `diagnostics`)."""
    return bool(state) and any(METHODS.get(r["method"]) is not None and METHODS[r["method"]].details
                               for r in state.get("results", []))


def head_weights(services, state, values=None, image=None) -> dict | None:
    """The diagnostics (GradSkip: head weights) of the first result whose method has them, for the state's image
    and target, with the live option values of the state (or `values`: {option name: value}); None without
    any."""
    records = [r for r in (state or {}).get("results", []) if METHODS.get(r["method"]) is not None
               and METHODS[r["method"]].details]
    if not records:
        return None
    bundle = services.bundle(state["model"])
    if image is None:
        _, image = prepared(services, state["model"], state["image"])
    live = {k: state[k] for k in METHODS[records[0]["method"]].live_options() if k in state}
    values = {k: v for k, v in {**live, **(values or {})}.items() if k in live}
    return engine.diagnostics(bundle, image, records[0], services.cache, values)


def live_methods(option: str) -> list:
    """The methods whose prepared state takes this option without a model pass."""
    return [m for m in menus.methods_with_option(option) if option in METHODS[m].live_options()]


def recombine_live(services, state, option: str, value) -> tuple:
    """The maps of every method with this live option, for a new value, from their cached prepared states (no
    model pass); the curves are kept only when they were already computed for this value."""
    bundle, image = prepared(services, state["model"], state["image"])
    live, value = live_methods(option), cast_option(option, value)
    results = []
    for record in state["results"]:
        if record["method"] in live:
            cached = engine.cached_result(services.cache, bundle, image, record["method"], record["target"],
                                          {**record["options"], option: value})
            record = cached or engine.recombine(bundle, image, record, {option: value}, services.cache)
        results.append(record)
    return {**state, "results": results, option: value}, image


def rerun_method(services, state, method: str, options: dict) -> tuple:
    """Re-run one method with new options (with its curves); the other methods' records are kept.
    The options are remembered in the state (e.g. alpha, refine_steps)."""
    options = {name: cast_option(name, value) for name, value in options.items()}
    bundle, image = prepared(services, state["model"], state["image"])
    declared = METHODS[method].user_options_by_name()

    def kept(record):  # the method's other sliders keep their values (alpha stays when the class focus moves)
        return {k: v for k, v in record["options"].items() if k in declared}

    results = [run_method(bundle, image, method, r["target"], {**kept(r), **options}, services.cache)
               if r["method"] == method else r for r in state["results"]]
    for record in results:
        if record["method"] == method:
            remember_seconds(services, bundle, record)
    slider_names = {o.name for _, o in menus.sliders()}
    return {**state, "results": results, **{k: v for k, v in options.items() if k in slider_names}}, image


def overlay_pictures(services, state, opacity, colormap, image=None) -> list:
    """[(file, caption)] of every map blended over the image (files named by content), with the state's
    "outline" (the top fraction of each map, outlined: `set_outline`)."""
    if image is None:
        _, image = prepared(services, state["model"], state["image"])
    items = pictures.render_overlays(image, state["results"], opacity, colormap, outline=state.get("outline", 0.0))
    prefix = download_prefix(state)  # the gallery's download button saves the file under this name
    return services.pictures(items, names=[f"{prefix}-{r['method']}" for r in state["results"]])


def set_outline(state, percent) -> dict:
    """The state with the top `percent` % of each map to be outlined (0: none); the maps are kept (no model
    pass)."""
    percent = float(percent or 0)
    if not 0 <= percent <= 100:
        raise ValueError(f"The outlined share must be between 0 and 100 %, got {percent}.")
    return {**(state or {}), "outline": percent / 100.0}


def download_choices(state=None) -> list:
    """[(label, value)] of the overlay sizes offered for download, with the pixels of the explained image."""
    size = (state or {}).get("image_size")
    original = f" ({size[0]}×{size[1]})" if size else ""
    enlarged = engine.download_size(size, "enlarged") if size else None
    bigger = f" ({enlarged[0]}×{enlarged[1]})" if enlarged else f" (at least {engine.ENLARGED} px)"
    return [(f"Original size{original}", "original"), (f"Enlarged{bigger}", "enlarged")]


def write_downloads(services, state, opacity, colormap, size="original") -> list:
    """Overlay PNGs (at the uploaded image's own size, or `size`="enlarged": see `engine.download_size`),
    curves.csv and report.json of the state, in a new folder; their paths."""
    if not state or not state.get("results"):
        raise ValueError("Explain an image first: there is nothing to download yet.")
    _, image = prepared(services, state["model"], state["image"])
    folder = Path(tempfile.mkdtemp(prefix="explain-", dir=services.downloads))
    written = engine.write_downloads(folder, state["model"], image, state["results"], opacity=opacity,
                                     colormap=colormap, prediction=state["prediction"], image_name=state["image_name"],
                                     size=size or "original", familiarity=state.get("familiarity"))
    prefix = download_prefix(state)
    named = []
    for path in written:  # a second download (another image or model) must not overwrite the first
        target = path.with_name(f"{prefix}-{path.name}")
        path.replace(target)
        named.append(target)
    return named


def safe_part(text: str, fallback: str) -> str:
    """A file-name part of `text`: letters, digits, '.', '_' and '-' kept, other runs made '-', at most 60
    characters (no separator, no leading dot: never a path)."""
    part = re.sub(r"[^A-Za-z0-9._-]+", "-", str(text or "")).strip("-.")[:60].strip("-.")
    return part or fallback


def download_prefix(state) -> str:
    """"<image>-<model>-<explained class>" of a state, for the names of its downloads
    (cell-bloodmnist-vit-eosinophil-overlay-aha.png): the runner-up's overlays are not named like the top class's."""
    prefix = f"{safe_part(Path(str(state.get('image_name') or '')).stem, 'image')}-{safe_part(state.get('model'), 'model')}"
    explained = state.get("target_name")
    return f"{prefix}-{safe_part(explained, 'class')}" if explained else prefix


SLOW_SECONDS = 5.0  # a map expected to take longer than this is "slow": unticked when the model changes
CURVE_PASSES = 2 * 21  # deletion + insertion, 21 steps each


def method_passes(bundle, method: str, options: dict | None = None) -> int:
    """Forward passes (backward counted as two) one map of this method costs on this model with `options`, as the
    method declares it (`Method.model_passes`: RISE its masks, occlusion its windows, AHA its refinement steps,
    gradient methods about three)."""
    cls = METHODS.get(method)
    return 3 if cls is None else int(cls.model_passes(bundle, options))


def cost_options(method: str, options: dict) -> tuple:
    """The options of a run that change what its map costs, as a key: all but the live ones (those recombine a
    prepared state without a model pass, e.g. GradSkip's alpha)."""
    live = set(METHODS[method].live_options()) if method in METHODS else set()
    return tuple(sorted((name, repr(value)) for name, value in options.items() if name not in live))


def remember_seconds(services, bundle, record: dict) -> None:
    """A run's time is the next expected time for its model, method and cost options."""
    if hasattr(services, "record_seconds"):
        method = record["method"]
        options = engine.method_options(method, record["options"], bundle)
        services.record_seconds(bundle.name, method, record["seconds"], cost_options(method, options))


def expected_seconds(services, bundle, method: str, values: dict | None = None) -> float:
    """Expected seconds of one map (without the curves) with the sliders' `values` (default: the defaults): the
    last measured time for this model, method and cost options, else the passes the method declares for these
    options × the measured time of one image's pass (no model pass of its own)."""
    options = engine.method_options(method, slider_values(values), bundle)
    measured = services.measured_seconds(bundle.name, method, cost_options(method, options))
    if measured is not None:
        return measured
    return passes_seconds(services, bundle, method_passes(bundle, method, options))


BATCHED = 32  # a method declaring this many passes or more runs them in batches (RISE, occlusion, AHA's steps)
METHOD_BATCH = 100  # ... of about this many images (RISE's 100 masks, occlusion's 128 windows)


def passes_seconds(services, bundle, passes: int, batch: int | None = None) -> float:
    """Expected seconds of `passes` forward passes of one image each, going through the model `batch` at a time
    (default: one at a time for a few passes, as a gradient map runs; METHOD_BATCH for many). A pass costs a fixed
    part per call plus a part per image (`Services.pass_costs`, measured at batches of 1 and 32): pricing batched
    work at the per-image time of small batches over-counted RISE and the curves 3-4 times on the bundled ViT."""
    if passes <= 0:
        return 0.0
    batch = batch or (METHOD_BATCH if passes >= BATCHED else 1)
    per_call, per_image = services.pass_costs(bundle)
    return -(-passes // batch) * per_call + passes * per_image


def expected_curves_seconds(services, bundle) -> float:
    """Expected seconds of one map's deletion and insertion curves: the last measured curves on this model, else
    their 42 images priced as the one batch they go through the model in (explainers.metrics: up to 256)."""
    measured = services.measured_seconds(bundle.name, CURVES_KEY)
    return measured if measured is not None else passes_seconds(services, bundle, CURVE_PASSES, CURVE_PASSES)


CURVES_KEY = "(curves)"  # the curves' measured time is remembered beside the methods' (never a method's name)


def remember_curve_seconds(services, bundle, seconds: float) -> None:
    if hasattr(services, "record_seconds"):
        services.record_seconds(bundle.name, CURVES_KEY, seconds)


def _seconds(value: float) -> str:
    if value < 1:
        return "under 1 s"
    if value < 90:
        return f"about {value:.0f} s"
    return f"about {value / 60:.0f} min"


def expected_text(services, model_name, methods, values: dict | None = None) -> str:
    """A Markdown line: the expected time of each ticked method on this model with the sliders' `values` (slow
    ones in bold), before it runs, and of the curves."""
    methods = [m for m in menus.method_order(list(methods or [])) if m in METHODS]
    if not model_name or not methods:
        return ""
    bundle = classifier(services, model_name)
    parts, total = [], 0.0
    for method in methods:
        seconds = expected_seconds(services, bundle, method, values)
        total += seconds
        text = f"{engine.method_label(method)} {_seconds(seconds)}"
        parts.append(f"**{text}**" if seconds > SLOW_SECONDS else text)
    curves = len(methods) * expected_curves_seconds(services, bundle)
    return (f"Expected on this machine: {', '.join(parts)}; then the curves {_seconds(curves)}"
            + (" (slow methods in bold)." if total > SLOW_SECONDS else "."))


def model_menu(services, model_name, methods) -> tuple:
    """(method choices, the methods to keep ticked, a Markdown line about the model) for a newly picked model.
    Slow methods on this model (RISE on a large input on a CPU, AHA's per-image optimisation on a model without
    a trained explainer: expected over SLOW_SECONDS) are unticked, the fast ones ticked, and the line offers the
    slow ones with their expected time."""
    bundle = classifier(services, model_name)
    choices = menus.method_choices(bundle)
    names = [value for _, value in choices]
    kept = [m for m in (methods or []) if m in names and menus.method_ready(bundle, m)]
    # the ticked methods and those the model would get by default (AHA), slow here: RISE on a large input, AHA's
    # per-image optimisation on a model without a trained explainer (an imported one)
    candidates = list(dict.fromkeys(kept + [m for m in names if METHODS[m].default_for(bundle)]))
    slow = [m for m in candidates if not METHODS[m].quick_on(bundle)
            and expected_seconds(services, bundle, m) > SLOW_SECONDS]
    kept = [m for m in kept if m not in slow] or [m for m in menus.default_methods(bundle) if m not in slow]
    info = (f"**{bundle.name}**: {bundle.family}, {bundle.num_classes} classes, input "
            f"{bundle.input_size[0]}×{bundle.input_size[1]} px ({menus.model_kind(model_name)}). "
            + ("Images unlike its training images are flagged." if familiarity.get_stats(bundle) is not None
               else "Not checked for images unlike its training images (no statistics for this model)."))
    if slow:
        info += " Unticked as slow on this model: " + ", ".join(
            f"{engine.method_label(m)} ({_seconds(expected_seconds(services, bundle, m))} a map)" for m in slow
        ) + "; tick it to run it anyway."
    return choices, kept, info
