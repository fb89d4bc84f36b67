"""Review studies in the app: create one on a named data set, open it with its code, review image by image
(open verdicts or a blinded A/B/C comparison), and read the results.

    code, owner, text = create_study(services, "cells-1", "bloodmnist-cells", "bloodmnist-cnn", ["gradcam", "aha"],
                                     ["dr-a", "dr-b"], "blinded", count=30)
    state, text = open_study(services, "cells-1", code, "dr-a")      # state: a session's gr.State (server side)
    shown = show_item(services, state, state["position"], "dr-a")    # maps captioned "Map A", "Map B", ...
    rate(services, state, "dr-a", "B", 4); pick_best(services, state, "dr-a", "B")
    results = study_results(services, "cells-1", owner)              # report + figures (names revealed): the
    close_study(services, "cells-1", owner)                          # owner code alone, until the owner closes

Blinding: in a blinded study nothing returned before the results (captions, texts, file names) carries a
method's name; the shown order of each image is drawn at creation and stored. A study's code is checked on
opening and on every results request; the state that remembers an opened study never leaves the server.
"""
from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field

from explainers import engine
from explainers.data import class_names_for, open_dataset, spread_indices
from explainers.review_report import LIKERT, MIN_AGREEMENT_IMAGES, SLOTS, study_report, write_rows

from . import menus, pictures
from .errors import is_skippable
from .figures import FigureSpec, score_table_markdown, score_table_rows
from .datasets import resolve as resolve_dataset
from .review_store import ReviewError
from .services import run_method

QUESTION = "The highlighted region is where a haematologist would look."
MAX_STUDY_IMAGES = 2000


def _who(reviewer) -> str:
    name = (reviewer or "").strip()
    if not name:
        raise ReviewError("Type your name (reviewer) first.")
    return name


def study_method_choices(bundle) -> list:
    """[(label, name)] of the methods that can explain this model (a study's menu)."""
    return [(label, name) for label, name in menus.method_choices(bundle) if menus.method_ready(bundle, name)]


def create_study(services, name, dataset_name, model_name, methods, reviewers, protocol, count=30,
                 question: str = QUESTION, progress=None, seed=None) -> tuple:
    """(reviewers' code, owner code, Markdown): a new study of `count` images spread over the named data set,
    predicted once. The reviewers' code opens the study for reviewing; the owner code alone shows its results
    (method names revealed) until the owner closes it."""
    folder = resolve_dataset(dataset_name)
    dataset = open_dataset(folder)
    if isinstance(reviewers, str):
        reviewers = [r.strip() for r in reviewers.replace(";", ",").replace("\n", ",").split(",")]
    reviewers = [r for r in (reviewers or []) if r and r.strip()]
    methods = [m for m in (methods or []) if m]
    bundle = services.bundle(model_name)
    offered = {n for _, n in menus.method_choices(bundle)}
    unknown = [m for m in methods if m not in offered]
    if unknown:
        raise ReviewError(f"{model_name} cannot be explained by {', '.join(unknown)}: pick from its methods.")
    count = int(count or 0)
    if not 1 <= count <= MAX_STUDY_IMAGES:
        raise ReviewError(f"A study has 1 to {MAX_STUDY_IMAGES} images.")
    indices = spread_indices(len(dataset), min(count, len(dataset)))
    verdicts = []
    rows = engine.predict_dataset(bundle, dataset, indices, progress=progress, verdicts=verdicts)
    labels = [r[2] for r in rows]
    names = (class_names_for(folder) if folder.is_dir() else None) or list(bundle.class_names)
    if max(labels, default=-1) >= len(names):
        names = [str(i) for i in range(max(labels) + 1)]
    owner_code = secrets.token_urlsafe(12)
    code = services.store.create_study(
        name, owner_code=owner_code, protocol=protocol, dataset=dataset_name, dataset_path=str(folder), model=model_name, methods=methods,
        reviewers=reviewers, class_names=names if labels and max(labels) >= 0 else list(bundle.class_names),
        items=[(item, index, label, prediction, confidence) for item, index, label, prediction, confidence in rows],
        question=question, seed=seed)
    who = ", ".join(reviewers) if reviewers else "anyone with the code"
    text = (f"Study **{name}** created: {len(rows)} images of {dataset_name}, model {model_name}, protocol "
            f"*{protocol}*, reviewers: {who}.\n\n**Reviewers' code: `{code}`** (give it to the reviewers; without "
            f"it nobody can open the study).\n\n**Owner code: `{owner_code}`** (keep it to yourself: it alone shows "
            "the results, with the method names, until you close the study).\n\nBoth are shown only now: copy them.")
    unfamiliar = [rows[i][0] for i, verdict in enumerate(verdicts) if verdict["unfamiliar"]]
    if unfamiliar:  # a study of predictions that may mean nothing: say so before anyone reviews them
        shown = ", ".join(unfamiliar[:5]) + (", ..." if len(unfamiliar) > 5 else "")
        text += (f"\n\n⚠ **{len(unfamiliar)} of {len(rows)} images do not look like the images {model_name} learned "
                 f"from** ({shown}): their predictions, and so their explanations, may mean nothing. Reviewers will "
                 "see them as any other image.")
    return code, owner_code, text


def open_study(services, name, code, reviewer) -> tuple:
    """(state, Markdown progress): the study if the code is right, positioned at the reviewer's first image
    without a response. The state holds no method names for a blinded study's pages; they stay server side."""
    study = services.store.open_study(name, code)
    who = _who(reviewer)
    if study["reviewers"] and who not in study["reviewers"]:
        raise ReviewError(f"'{who}' is not a reviewer of this study: type your name as the study's creator gave it.")
    items = services.store.study_items(study["name"])
    state = {"study": study["name"], "protocol": study["protocol"], "model": study["model"],
             "path": study["dataset_path"], "class_names": study["class_names"], "methods": study["methods"],
             "question": study["question"], "total": len(items), "reviewer": who, "position": 0}
    done = services.store.study_done(study["name"], who, study["protocol"], len(study["methods"]))
    state["position"] = next((i for i in range(len(items)) if i not in done), 0)
    return state, progress_line(services, state, who)


def _check(state, reviewer) -> str:
    if not state or not state.get("study"):
        raise ReviewError("Open a study first (its name and code).")
    who = _who(reviewer)
    if who != state["reviewer"]:
        raise ReviewError(f"This study was opened as '{state['reviewer']}': open it again to review as '{who}'.")
    return who


def progress_line(services, state, reviewer) -> str:
    done = services.store.study_done(state["study"], reviewer, state["protocol"], len(state["methods"]))
    return f"**{len(done)} of {state['total']} done** as *{reviewer}* in study *{state['study']}*."


@dataclass
class StudyItem:
    """One image of a study: `items` [(file, caption)] (the image, then the maps), Markdown `info`, this
    reviewer's saved `response` (verdict, note, best, ratings by slot), the `slots` shown, `progress`, `state`."""

    items: list
    info: str
    response: dict
    slots: list
    progress: str
    state: dict


def show_item(services, state, position, reviewer) -> StudyItem:
    """The image at `position` with the study's maps of the predicted class: named (open) or as Map A, B, ...
    in the stored order (blinded). Each map's deletion/insertion AUCs are stored for the results."""
    who = _check(state, reviewer)
    position = int(position)
    if not 0 <= position < state["total"]:
        raise ReviewError(f"No image {position + 1} in this study ({state['total']} images).")
    row = services.store.study_items(state["study"])[position]
    bundle = services.bundle(state["model"])
    picture = open_dataset(state["path"]).image(row["data_index"])
    prepared = engine.prepare_input(picture, bundle)
    names = state["class_names"]
    true_name = names[row["label"]] if row["label"] is not None and row["label"] < len(names) else "not given"
    predicted = bundle.class_name(row["prediction"])
    items = [(prepared.display, f"Image {position + 1}")]
    blinded = state["protocol"] == "blinded"
    slots = []
    have = services.store.faithfulness_done(state["study"])
    for slot, method in zip(SLOTS, row["order"]):
        try:
            record = run_method(bundle, prepared, method, row["prediction"],
                                engine.method_options(method, bundle=bundle), services.cache, curves=True)
        except (ValueError, RuntimeError) as error:
            if not is_skippable(error):
                raise
            items.append((prepared.display, f"Map {slot}: not available" if blinded else f"{method}: not available"))
            continue
        if (position, method) not in have:
            services.store.save_faithfulness(state["study"], position, method, record["deletion_auc"],
                                             record["insertion_auc"])
        overlay = pictures.render_overlays(prepared, [record], 0.55, "cividis")[0][0]
        items.append((overlay, f"Map {slot}" if blinded else record["label"]))
        slots.append(slot)
    info = (f"**Image {position + 1} of {state['total']}** — true class **{true_name}**, the model predicts "
            f"**{predicted}** ({row['confidence']:.0%}). The maps explain the predicted class.")
    if blinded:
        info += f"\n\nRate each map from 1 (disagree) to 5 (agree): *{state['question']}* Pick the best map if one is."
    response = services.store.study_response(state["study"], position, who)
    return StudyItem(services.pictures(items), info, response, slots, progress_line(services, state, who),
                     {**state, "position": position})


def step(services, state, reviewer, delta: int) -> int:
    """The position `delta` away from the current one, clamped to the study."""
    _check(state, reviewer)
    return min(max(0, int(state.get("position", 0)) + int(delta)), state["total"] - 1)


def next_open(services, state, reviewer) -> int:
    """The next position after the current one this reviewer has not finished (wrapping), else the current."""
    who = _check(state, reviewer)
    done = services.store.study_done(state["study"], who, state["protocol"], len(state["methods"]))
    total, current = state["total"], int(state.get("position", 0))
    for k in range(1, total + 1):
        if (current + k) % total not in done:
            return (current + k) % total
    return current


def record_verdict(services, state, reviewer, verdict, note=None) -> tuple:
    """(saved line, progress): an open study's verdict (and the note, when given) on the current image."""
    who = _check(state, reviewer)
    if state["protocol"] != "open":
        raise ReviewError("This is a blinded study: rate each map from 1 to 5.")
    services.store.set_study_verdict(state["study"], state["position"], who, verdict)
    if note:
        services.store.set_study_note(state["study"], state["position"], who, note)
    return f"Saved: **{verdict}** ({time.strftime('%H:%M:%S')}).", progress_line(services, state, who)


def save_note(services, state, reviewer, note) -> str | None:
    if not state or not state.get("study"):
        return None
    who = _check(state, reviewer)
    services.store.set_study_note(state["study"], state["position"], who, note or "")
    return f"Note saved ({time.strftime('%H:%M:%S')})."


def rate(services, state, reviewer, slot, rating) -> tuple:
    """(saved line, progress): a 1-5 rating of map `slot` on the current image of a blinded study."""
    who = _check(state, reviewer)
    if state["protocol"] != "blinded":
        raise ReviewError("This is an open study: give a verdict (plausible, implausible, unsure).")
    if rating in (None, ""):
        return None, progress_line(services, state, who)
    services.store.set_study_rating(state["study"], state["position"], who, slot, rating)
    return f"Saved: map {slot} rated **{int(rating)}** ({time.strftime('%H:%M:%S')}).", progress_line(services, state, who)


def pick_best(services, state, reviewer, slot) -> tuple:
    who = _check(state, reviewer)
    if state["protocol"] != "blinded":
        raise ReviewError("Only a blinded study has a best map to pick.")
    slot = None if slot in (None, "", "none") else slot
    services.store.set_study_best(state["study"], state["position"], who, slot)
    line = f"Saved: best map **{slot}**" if slot else "Saved: no best map"
    return f"{line} ({time.strftime('%H:%M:%S')}).", progress_line(services, state, who)


# ------------------------------------------------------------------------------------------------ results
def fill_faithfulness(services, study: dict, progress=None) -> int:
    """Deletion/insertion AUCs of every (image, method) not yet stored (reviewers' pages store theirs as they
    go); the number computed."""
    have = services.store.faithfulness_done(study["name"])
    items = services.store.study_items(study["name"])
    todo = [(row, m) for row in items for m in row["order"] if (row["position"], m) not in have]
    if not todo:
        return 0
    bundle = services.bundle(study["model"])
    dataset = open_dataset(study["dataset_path"])
    prepared_by = {}
    for k, (row, method) in enumerate(todo):
        if row["position"] not in prepared_by:
            prepared_by = {row["position"]: engine.prepare_input(dataset.image(row["data_index"]), bundle)}
        try:
            record = run_method(bundle, prepared_by[row["position"]], method, row["prediction"],
                                engine.method_options(method, bundle=bundle), services.cache, curves=True)
        except (ValueError, RuntimeError) as error:
            if not is_skippable(error):
                raise
            continue
        services.store.save_faithfulness(study["name"], row["position"], method, record["deletion_auc"],
                                         record["insertion_auc"])
        if progress is not None:
            progress(k + 1, len(todo))
    return len(todo)


@dataclass
class StudyResults:
    """The report (dict, as the CLI writes it), a Markdown summary, the ratings and kappa figures, and the
    score table's rows (`figures.score_headers`: each AUC with its interval, significance marked)."""

    report: dict
    summary: str
    ratings_figure: FigureSpec | None
    kappa_figure: FigureSpec | None
    scores: list = field(default_factory=list)


def _results_access(services, name, code) -> dict:
    """The study whose results `code` may see: the owner code always; the reviewers' code once the owner closed
    the study (or for a study made before owner codes, as before). Else the same refusal for every wrong code."""
    store = services.store
    name = (name or "").strip()
    if store.is_owner(name, code):
        return store.study_settings(name)
    study = store.open_study(name, code)  # ReviewError for a wrong name or code
    owner = store.study_owner(study["name"])
    if owner is not None and owner["closed"] is None:
        raise ReviewError(f"The results of study '{study['name']}' are shown only with its owner code until the "
                          "owner closes the study (the reviewers' code opens it for reviewing).")
    return study


def close_study(services, name, owner_code) -> str:
    """Close a study with its owner code: no more responses; its results open to the reviewers' code too."""
    closed = services.store.close_study((name or "").strip(), owner_code)
    return (f"Study **{(name or '').strip()}** closed on {time.strftime('%Y-%m-%d %H:%M', time.localtime(closed))}:"
            " responses are final, and the reviewers' code now shows the results too.")


def study_results(services, name, code, *, faithfulness=True, progress=None, n_boot=1000) -> StudyResults:
    """The study's results (method names revealed) for its owner code (or the reviewers' code once closed)."""
    study = _results_access(services, name, code)
    if faithfulness:
        fill_faithfulness(services, study, progress)
    report = study_report(services.store.path, study["name"], n_boot=n_boot)
    per_image, _ = faithfulness_scores(report)
    scores = score_table_rows(per_image, **_bootstrap_options(report)) if per_image else []
    return StudyResults(report, summary_markdown(report), ratings_figure(report), kappa_figure(report), scores)


def faithfulness_scores(report: dict) -> tuple:
    """({method: {'deletion_auc': [...], 'insertion_auc': [...]}}, images): each method's deletion and insertion AUCs on
    the study's images that have both for every method (the same images, in the study's order, so that the
    methods compare pairwise); ({}, 0) when no image has them all."""
    methods = report["study"]["methods"]
    paired = [entry for entry in report["faithfulness"]["images"]
              if all(m in entry["deletion_auc"] and m in entry["insertion_auc"] for m in methods)]
    if not paired or not methods:
        return {}, 0
    per_image = {m: {key: [e[key][m] for e in paired] for key in ("deletion_auc", "insertion_auc")} for m in methods}
    return per_image, len(paired)


def _bootstrap_options(report: dict) -> dict:
    """The report's own bootstrap (resamples, seed) for the score table's intervals."""
    boot = report.get("bootstrap") or {}
    return {"n_resamples": int(boot.get("resamples") or 2000), "seed": int(boot.get("seed") or 0)}


def faithfulness_markdown(report: dict) -> list:
    """The score table's lines for the summary: per method deletion, insertion and ins − del over the images
    scored for every method, each with its 95% interval, the best and the significantly worse marked."""
    per_image, images = faithfulness_scores(report)
    if not per_image:
        return []
    scored = report["study"]["images"]
    subset = f" (of {scored}: the others lack a map of some method)" if images < scored else ""
    labels = {m: engine.method_label(m) for m in per_image}
    return ["", f"**Faithfulness per method** (deletion/insertion AUCs of the shown maps, {images} "
                f"image{'s' if images != 1 else ''}{subset}):", "",
            score_table_markdown(per_image, labels, **_bootstrap_options(report))]


def _images(count: int) -> str:
    return f"{count} image" if count == 1 else f"{count} images"


def _fmt(value, digits=2):
    return "–" if value is None else f"{value:.{digits}f}"


def _ci(pair, digits=2):
    return "–" if pair is None or pair[0] is None else f"[{pair[0]:.{digits}f}, {pair[1]:.{digits}f}]"


def summary_markdown(report: dict) -> str:
    study, counts, agreement = report["study"], report["counts"], report["agreement"]
    lines = [f"### {study['name']} · {study['protocol']} · {study['images']} images · model {study['model']}",
             "", "| reviewer | done | " + ("plausible | implausible | unsure |" if study["protocol"] == "open"
                                          else "ratings | mean rating | best picks |"),
             "|---|---|---|---|---|"]
    for who, entry in counts["per_reviewer"].items():
        if study["protocol"] == "open":
            tail = f"{entry['plausible']} | {entry['implausible']} | {entry['unsure']} |"
        else:
            tail = f"{entry['ratings']} | {_fmt(entry['mean_rating'])} | {entry['best_picks']} |"
        lines.append(f"| {who} | {entry['done']} of {entry['total']} | {tail}")
    overall = counts["overall"]
    lines += ["", f"Done by every reviewer: **{overall['complete_images']} of {overall['images']}** images."]
    least = agreement.get("min_images", MIN_AGREEMENT_IMAGES)
    exact = "exact agreement" if study["protocol"] == "open" else "same rating"
    lines += ["", f"**Agreement** ({agreement['measure']}; 95% bootstrap intervals over images; reported from "
                  f"{least} images done by both reviewers on):", "",
              f"| pair | images | kappa | 95% interval | {exact} |", "|---|---|---|---|---|"]
    too_few = f"too few images (fewer than {least})"
    for pair in agreement["pairs"]:
        if pair.get("too_few") or pair["kappa"] is None:
            lines.append(f"| {pair['a']} – {pair['b']} | {pair['images']} | {too_few} | | |")
        else:
            lines.append(f"| {pair['a']} – {pair['b']} | {pair['images']} | {_fmt(pair['kappa'])} | "
                         f"{_ci(pair['ci95'])} | {_fmt(pair['percent_agreement'])} |")
    fleiss = agreement["fleiss"]
    if fleiss.get("too_few") or fleiss["kappa"] is None:
        lines.append(f"| Fleiss (all {fleiss['reviewers']}) | {fleiss['images']} | {too_few} | | |")
    else:
        lines.append(f"| Fleiss (all {fleiss['reviewers']}) | {fleiss['images']} | {_fmt(fleiss['kappa'])} | "
                     f"{_ci(fleiss['ci95'])} | |")
    if study["protocol"] == "blinded":
        lines += ["", "**Per method** (revealed):", "",
                  "| method | mean rating | 95% interval | picked best |", "|---|---|---|---|"]
        for m in report["methods"]:
            lines.append(f"| {engine.method_label(m['method'])} | {_fmt(m['mean_rating'])} | {_ci(m['ci95'])} | "
                         f"{m['best_picks']} |")
        lines += faithfulness_markdown(report)
        faith = report["faithfulness"]
        if faith.get("images_compared"):
            lines += ["", f"On {faith['images_compared']} images the reviewers' best map has the best insertion AUC "
                          f"{faith['reviewers_best_has_best_insertion']} times ({faith['fraction']:.0%}; chance "
                          f"{faith['chance']:.0%})."]
    else:
        lines += faithfulness_markdown(report)
        by = report["faithfulness"].get("mean_insertion_auc_by_majority_verdict", {})
        if by:
            lines += ["", "Mean insertion AUC of the shown maps, by the reviewers' majority verdict: " +
                      ", ".join(f"{v} {x['insertion_auc']:.3f} ({_images(x['images'])})" for v, x in by.items()) + "."]
    lines += per_class_markdown(report)
    return "\n".join(lines)


def per_class_markdown(report: dict) -> list:
    """The per-class table of the results: images, how many the model got right, and the verdicts (open) or
    each method's mean rating (blinded)."""
    per_class = report.get("per_class") or []
    if not per_class:
        return []
    blinded = report["study"]["protocol"] == "blinded"
    methods = [m["method"] for m in report["methods"]] if blinded else []
    head = [engine.method_label(m) for m in methods] if blinded else ["plausible", "implausible", "unsure"]
    lines = ["", "**Per class** (true class):", "", "| class | images | model right | " + " | ".join(head) + " |",
             "|" + "---|" * (3 + len(head))]
    for entry in per_class:
        cells = ([_fmt(entry["mean_rating"].get(m)) for m in methods] if blinded else
                 [str(entry["verdicts"].get(v, 0)) for v in ("plausible", "implausible", "unsure")])
        lines.append(f"| {entry['class']} | {entry['images']} | {entry['model_correct']} | " + " | ".join(cells) + " |")
    return lines


def ratings_figure(report: dict) -> FigureSpec | None:
    """Mean rating per method with its 95% interval (blinded studies)."""
    if report["study"]["protocol"] != "blinded":
        return None
    methods = [m for m in report["methods"] if m["mean_rating"] is not None]
    if not methods:
        return None
    means = [m["mean_rating"] for m in methods]
    upper = [(m["ci95"][1] - m["mean_rating"]) if m["ci95"][1] is not None else 0 for m in methods]
    lower = [(m["mean_rating"] - m["ci95"][0]) if m["ci95"][0] is not None else 0 for m in methods]
    from .figures import color_for

    return FigureSpec([{"type": "bar", "x": [engine.method_label(m["method"]) for m in methods], "y": means,
                        "marker": {"color": [color_for(m["method"], i) for i, m in enumerate(methods)]},
                        "error_y": {"type": "data", "symmetric": False, "array": upper, "arrayminus": lower},
                        "hovertemplate": "%{x}: %{y:.2f}<extra></extra>"}],
                      {"title": {"text": "Mean rating per method (95% interval)"},
                       "yaxis": {"range": [0, 5.5], "title": {"text": "rating (1-5)"}},
                       "margin": {"l": 50, "r": 10, "t": 40, "b": 40}, "height": 320})


def kappa_figure(report: dict) -> FigureSpec | None:
    """Reviewers x reviewers matrix of pairwise kappa."""
    reviewers = report["study"]["reviewers"]
    if len(reviewers) < 2:
        return None
    index = {r: i for i, r in enumerate(reviewers)}
    matrix = [[1.0 if i == j else None for j in range(len(reviewers))] for i in range(len(reviewers))]
    for pair in report["agreement"]["pairs"]:
        i, j = index[pair["a"]], index[pair["b"]]
        matrix[i][j] = matrix[j][i] = None if pair.get("too_few") else pair["kappa"]  # too few: shown as –
    text = [["–" if v is None else f"{v:.2f}" for v in row] for row in matrix]
    return FigureSpec([{"type": "heatmap", "z": matrix, "x": reviewers, "y": reviewers, "zmin": -1, "zmax": 1,
                        "colorscale": "Cividis", "text": text, "texttemplate": "%{text}",
                        "hovertemplate": "%{y} – %{x}: %{text}<extra></extra>"}],
                      {"title": {"text": "Cohen's kappa between reviewers"}, "height": 320,
                       "margin": {"l": 80, "r": 10, "t": 40, "b": 60}})


def export_study(services, name, code, fmt="csv") -> str:
    """The study's responses (CSV, one row per verdict or rated map) or its report (JSON); the file's path. The
    same codes as the results (the responses reveal the method names)."""
    study = _results_access(services, name, code)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if fmt == "json":
        path = services.downloads / f"study-{study['name']}-{stamp}.json"
        path.write_text(json.dumps(study_report(services.store.path, study["name"]), indent=2))
        return str(path)
    return str(write_rows(services.store.path, study["name"], services.downloads / f"study-{study['name']}-{stamp}.csv"))


RATING_VALUES = list(LIKERT)
