"""The Review tab's logic: a labelled folder predicted once (cached in the review store), filtered and paged,
one image opened with its maps, verdicts and notes saved the moment they are made.

    state, warning = load_review(services, "bloodmnist-cells", "bloodmnist-cnn", count=400)  # a named data set
    page = filter_page(services, state, class_value="all", correctness="incorrect", page=1, reviewer="dr-lee")
    item = open_item(services, page.state, 0, "dr-lee")
    saved, progress = record_verdict(services, item.state, "dr-lee", "plausible", note="nucleus highlighted")

`state` is a plain dict (a session's gr.State); `services` a `saliency_lab.services.Services`. Errors meant
for the user are ValueError.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from . import browse
from explainers import engine, familiarity
from . import menus
from . import pictures
from .browse import PAGE, class_names, open_folder
from explainers.data import open_dataset
from .errors import is_skippable
from .services import run_method

REVIEW_METHODS = ("gradcam", "aha", "gradskip")  # up to three maps per image, in this order
MARKS = {"plausible": "· plausible", "implausible": "· implausible", "unsure": "· unsure"}
VERDICTS = ("plausible", "implausible", "unsure")  # the verdict buttons, in this order


def reviewer_name(name) -> str:
    """The reviewer's name, or "anonymous"."""
    return (name or "").strip() or "anonymous"


def load_review(services, folder, model_name, count, progress=None) -> tuple:
    """(state, warning or None): the first `count` images of a named data set (`saliency_lab.datasets`; off a
    Space also an allowed folder) with the model's predictions
    (only the images not predicted before run the model; `progress(done, total)` follows them)."""
    folder = str(browse.resolve_dataset_choice(folder))
    dataset = open_folder(folder)
    bundle = services.bundle(model_name)
    key = browse.dataset_key(folder)
    count = min(int(count), len(dataset))
    cached = {row["item"]: row for row in services.store.predictions(key, model_name)}
    checked = familiarity.get_stats(bundle) is not None  # then a row cached before the check is predicted again
    fresh = {item for item, row in cached.items() if not (checked and row["unfamiliar"] is None)}
    missing = [i for i in range(count) if engine.item_name(dataset, i) not in fresh]
    if missing:
        if progress is not None:
            progress(0, len(missing))
        verdicts = []
        rows = engine.predict_dataset(bundle, dataset, missing, progress=progress, verdicts=verdicts)
        services.store.save_predictions(key, model_name, rows,
                                        unfamiliar=[v["unfamiliar"] for v in verdicts] if verdicts else None)
    rows = [r for r in services.store.predictions(key, model_name) if r["position"] < count]
    names = class_names(folder, dataset)
    warnings = []
    if bundle.num_classes != len(names):
        warnings.append(f"{model_name} has {bundle.num_classes} classes but this data set has {len(names)}: "
                        "'correct' and 'incorrect' compare class indices that do not match.")
    unfamiliar = sum(1 for r in rows if r["unfamiliar"])
    if unfamiliar:
        warnings.append(f"{unfamiliar} of these {len(rows)} images do not look like the images {model_name} learned "
                        "from (marked ⚠): their predictions, and so their explanations, may mean nothing.")
    warning = " ".join(warnings) or None
    state = {"folder": folder, "key": key, "model": model_name, "rows": rows, "names": names,
             "model_names": list(bundle.class_names), "filtered": [], "current": None}
    return state, warning


@dataclass
class ReviewPage:
    """One page of the filtered gallery: `items` [(PIL, caption)], the new `state`, a Markdown `progress` line."""

    items: list
    state: dict
    progress: str
    page: int
    pages: int


def filter_page(services, state, class_value="all", correctness="all", page=1, reviewer="") -> ReviewPage:
    """The rows of a true class ("all" or an index) and correctness ("all", "correct", "incorrect"), one page
    of thumbnails captioned ✓/✗, prediction, confidence and this reviewer's verdict."""
    if not state:
        raise ValueError("Load a data set first.")
    class_index = None if class_value in (None, "", "all") else int(class_value)
    filtered = browse.filter_rows(state["rows"], class_index, correctness or "all")
    # the opened image keeps its place in the new list (or none is open): an index into the old list would
    # point at another image, or past the end
    opened = None
    if state.get("current") is not None and state["current"] < len(state.get("filtered") or []):
        opened = state["filtered"][state["current"]]["item"]
    current = next((i for i, row in enumerate(filtered) if row["item"] == opened), None)
    state = {**state, "filtered": filtered, "current": current}
    pages = max(1, (len(filtered) + PAGE - 1) // PAGE)
    page = min(max(1, int(page or 1)), pages)
    dataset = open_dataset(state["folder"])
    verdicts = {v["item"]: v["verdict"] for v in services.store.verdicts(state["key"], reviewer_name(reviewer))}
    items = []
    for row in filtered[(page - 1) * PAGE: page * PAGE]:
        ok = "✓" if row["label"] == row["prediction"] else "✗"
        mark = MARKS.get(verdicts.get(row["item"]), "")
        odd = "⚠ " if row.get("unfamiliar") else ""  # unlike the model's training images
        items.append((dataset.image(row["position"]),
                      f"{odd}{ok} {state['model_names'][row['prediction']]} {row['confidence']:.0%} {mark}".strip()))
    state["page_start"] = (page - 1) * PAGE
    return ReviewPage(items, state, progress_text(services, state, reviewer), page, pages)


def progress_text(services, state, reviewer) -> str:
    """How many images this reviewer has judged (all, and among those the filters show), and the accuracy."""
    who = reviewer_name(reviewer)
    reviewed, _ = services.store.progress(state["key"], who)
    in_view = {r["item"] for r in state["filtered"]}
    done_here = sum(1 for v in services.store.verdicts(state["key"], who) if v["verdict"] and v["item"] in in_view)
    wrong = sum(1 for r in state["rows"] if r["label"] != r["prediction"])
    return (f"**Reviewed {reviewed} of {len(state['rows'])}** images as *{who}* "
            f"({done_here} of the {len(state['filtered'])} shown by the filters). "
            f"Model accuracy on these images: {1 - wrong / max(1, len(state['rows'])):.1%}.")


@dataclass
class ReviewItem:
    """One opened image: `items` [(file, caption)] (the image, then its maps), a Markdown `info`, the saved
    `note`, a line about the saved verdict, and the new `state` (its "current" is the index)."""

    items: list
    info: str
    note: str
    saved: str
    state: dict
    index: int


def open_item(services, state, index, reviewer) -> ReviewItem:
    """Open the image at position `index` of the filtered list: its maps (of the predicted class) by up to
    three methods the model supports, and this reviewer's saved verdict and note."""
    if not state:
        raise ValueError("Load a data set first.")
    index = int(index)
    if not 0 <= index < len(state["filtered"]):
        raise ValueError(f"No image {index} in the current list ({len(state['filtered'])} images).")
    row = state["filtered"][index]
    bundle = services.bundle(state["model"])
    picture = open_dataset(state["folder"]).image(row["position"])
    prepared = engine.prepare_input(picture, bundle)
    items = [(prepared.display, f"image · true: {state['names'][row['label']]}")]
    used = []
    offered = {v for _, v in menus.method_choices(bundle)}
    for method in [m for m in REVIEW_METHODS if m in offered][:3]:
        try:
            record = run_method(bundle, prepared, method, row["prediction"], engine.method_options(method, bundle=bundle),
                                services.cache, curves=False)
        except (ValueError, RuntimeError) as error:
            if not is_skippable(error):
                raise
            continue
        used.append(method)
        items.append((pictures.render_overlays(prepared, [record], 0.55, "cividis")[0][0], record["label"]))
    saved_row = services.store.get(state["key"], row["item"], reviewer_name(reviewer)) or {}
    correct = row["label"] == row["prediction"]
    info = (f"**{row['item']}** — true class **{state['names'][row['label']]}**, predicted "
            f"**{state['model_names'][row['prediction']]}** with confidence **{row['confidence']:.1%}** "
            f"({'correct' if correct else 'incorrect'}). Maps explain the predicted class.")
    verdict = saved_row.get("verdict")
    return ReviewItem(services.pictures(items), info, saved_row.get("note", ""),
                      f"Saved verdict: **{verdict}**." if verdict else "No verdict yet.",
                      {**state, "current": index, "current_methods": used}, index)


def neighbour_index(state, step: int) -> int:
    """The index Previous (-1) / Next (+1) opens in the filtered list: from the opened image, or the first image
    when none is open (e.g. after a filter left it out), kept inside the list."""
    if not state or not state.get("filtered"):
        raise ValueError("No images in the current list: change the filters or load a data set.")
    current = state.get("current")
    index = 0 if current is None else current + step
    return max(0, min(len(state["filtered"]) - 1, index))


def current_row(state) -> dict:
    if not state or state.get("current") is None:
        raise ValueError("Open an image first (click it in the gallery).")
    return state["filtered"][state["current"]]


def record_verdict(services, state, reviewer, verdict, note="") -> tuple:
    """Save the verdict (and the note, when there is one) on the opened image at once; (saved line, progress)."""
    row = current_row(state)
    who = reviewer_name(reviewer)
    services.store.set_verdict(state["key"], row["item"], verdict, reviewer=who, model=state["model"],
                               label=state["names"][row["label"]], prediction=state["model_names"][row["prediction"]],
                               confidence=row["confidence"], methods=state.get("current_methods", []))
    if note:
        services.store.set_note(state["key"], row["item"], note, reviewer=who)
    return f"Saved verdict: **{verdict}** ({time.strftime('%H:%M:%S')}).", progress_text(services, state, reviewer)


def current_verdict(services, state, reviewer) -> str | None:
    """This reviewer's saved verdict on the opened image; None when none is open or none is set."""
    if not state or state.get("current") is None or state["current"] >= len(state.get("filtered") or []):
        return None
    row = state["filtered"][state["current"]]
    return (services.store.get(state["key"], row["item"], reviewer_name(reviewer)) or {}).get("verdict")


def verdict_variants(verdict) -> list:
    """The variant of each verdict button (VERDICTS order): "primary" for the saved verdict, "secondary" for the
    others (all "secondary" without one), so the set verdict is visibly selected."""
    return ["primary" if verdict == value else "secondary" for value in VERDICTS]


def save_note(services, state, reviewer, note) -> str | None:
    """Save the note on the opened image; None when no image is open."""
    if not state or state.get("current") is None:
        return None
    row = state["filtered"][state["current"]]
    who = reviewer_name(reviewer)
    services.store.set_note(state["key"], row["item"], note or "", reviewer=who)
    verdict = (services.store.get(state["key"], row["item"], who) or {}).get("verdict")
    saved = f"Saved verdict: **{verdict}** · " if verdict else ""  # the verdict line stays visible
    return f"{saved}Note saved ({time.strftime('%H:%M:%S')})."


def export_verdicts(services, state) -> str:
    """Every verdict of the loaded data set (all data sets without one) as a CSV file; its path."""
    path = services.downloads / f"verdicts-{time.strftime('%Y%m%d-%H%M%S')}.csv"
    services.store.export_csv(path, dataset=state["key"] if state else None)
    return str(path)
