"""What people type into Saliency Lab, kept safe in SQLite: clinicians' verdicts and notes, cached
predictions for the review gallery, and user-made mask sets for CAMAL fine-tuning.

    store = ReviewStore("runs/app/review.sqlite")
    store.set_verdict("bloodmnist-test", "test_00001.jpg", verdict="plausible", reviewer="dr-a")
    store.set_note("bloodmnist-test", "test_00001.jpg", "nucleus highlighted", reviewer="dr-a")
    store.progress("bloodmnist-test", reviewer="dr-a")          # (reviewed, total)
    store.export_csv("verdicts.csv", dataset="bloodmnist-test")

    set_id = store.add_mask("my-set", image, mask, label=3)     # PIL/numpy image + boolean mask
    store.export_mask_set("my-set", "runs/masksets/my-set")     # images/, masks/, labels.csv

    code = store.create_study("cells-1", protocol="blinded", ...)  # the study code, shown once (a hash is kept)
    study = store.open_study("cells-1", code)                     # ReviewError when the name or code is wrong
    store.set_study_rating("cells-1", 0, "dr-a", "B", 4)          # map B of image 0, 1-5

Every write commits at once (WAL journal, one short transaction): a refresh or a crash loses nothing
that was already sent. Safe to share between threads (one connection per thread).
"""
from __future__ import annotations

import csv
import hashlib
import hmac
import io
import json
import random
import re
import secrets
import sqlite3
import threading
import time
from pathlib import Path

import numpy as np
from PIL import Image

from explainers.images import png_bytes
from explainers.review_report import LIKERT, PROTOCOLS, SLOTS, STUDY_SCHEMA

VERDICTS = ("plausible", "implausible", "unsure")

SCHEMA = """
CREATE TABLE IF NOT EXISTS verdicts (
  dataset TEXT NOT NULL, item TEXT NOT NULL, reviewer TEXT NOT NULL DEFAULT 'anonymous',
  verdict TEXT, note TEXT NOT NULL DEFAULT '', model TEXT, label TEXT, prediction TEXT, confidence REAL,
  methods TEXT, updated REAL NOT NULL,
  PRIMARY KEY (dataset, item, reviewer));
CREATE TABLE IF NOT EXISTS predictions (
  dataset TEXT NOT NULL, model TEXT NOT NULL, item TEXT NOT NULL, position INTEGER NOT NULL,
  label INTEGER, prediction INTEGER NOT NULL, confidence REAL NOT NULL, updated REAL NOT NULL,
  unfamiliar INTEGER,
  PRIMARY KEY (dataset, model, item));
CREATE TABLE IF NOT EXISTS masks (
  id INTEGER PRIMARY KEY AUTOINCREMENT, set_name TEXT NOT NULL, label TEXT NOT NULL,
  image_png BLOB NOT NULL, mask_png BLOB NOT NULL, source TEXT NOT NULL DEFAULT 'drawn',
  width INTEGER NOT NULL, height INTEGER NOT NULL, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS masks_set ON masks (set_name);
"""

EXPORT_COLUMNS = ("dataset", "item", "reviewer", "verdict", "note", "model", "label", "prediction",
                  "confidence", "methods", "updated_utc")


class ReviewError(ValueError):
    """A request the store refuses; the message is meant for the user."""


def _clean_name(value: str, what: str, default: str | None = None) -> str:
    value = (value or "").strip()
    if not value:
        if default is not None:
            return default
        raise ReviewError(f"Please give a {what}.")
    if len(value) > 200:
        raise ReviewError(f"The {what} is too long (200 characters at most).")
    return value


def safe_set_name(name: str) -> str:
    """Mask-set names become folder names: letters, digits, '-', '_' and '.' only."""
    name = (name or "").strip()
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name) or ".." in name:
        raise ReviewError(f"Mask set name {name!r}: use 1-64 letters, digits, '.', '-' or '_' "
                          "(starting with a letter or digit).")
    return name


def _as_mask(mask) -> np.ndarray:
    array = np.asarray(mask)
    if array.ndim == 3:  # RGBA/RGB drawings: any non-zero alpha or colour counts
        array = array[..., 3] if array.shape[2] == 4 else array.max(axis=2)
    if array.ndim != 2:
        raise ReviewError(f"A mask must be H x W, got shape {tuple(array.shape)}.")
    return array > 0 if array.dtype != bool else array


class ReviewStore:
    """SQLite storage for verdicts, notes, cached predictions and mask sets (thread-safe)."""

    def __init__(self, path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._con().executescript(SCHEMA + STUDY_SCHEMA)
        self._add_missing_columns()

    def _add_missing_columns(self) -> None:
        """Databases made by an earlier version gain the columns added since (their rows keep NULL there)."""
        con = self._con()
        columns = {row["name"] for row in con.execute("PRAGMA table_info(predictions)")}
        if "unfamiliar" not in columns:  # the familiarity verdict (explainers.familiarity); NULL: not checked
            with self._write_lock:
                con.execute("ALTER TABLE predictions ADD COLUMN unfamiliar INTEGER")

    def _con(self) -> sqlite3.Connection:
        con = getattr(self._local, "con", None)
        if con is None:
            con = sqlite3.connect(str(self.path), timeout=30, isolation_level=None, check_same_thread=False)
            con.row_factory = sqlite3.Row
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA synchronous=NORMAL")
            con.execute("PRAGMA busy_timeout=30000")
            self._local.con = con
        return con

    def _write(self, sql: str, params=()) -> sqlite3.Cursor:
        with self._write_lock:
            return self._con().execute(sql, params)

    # ------------------------------------------------------------------ verdicts and notes
    def _upsert(self, dataset, item, reviewer, fields: dict) -> dict:
        dataset = _clean_name(dataset, "data set name")
        item = _clean_name(item, "image id")
        reviewer = _clean_name(reviewer, "reviewer name", default="anonymous")
        fields = {k: v for k, v in fields.items() if v is not None}
        columns = ["dataset", "item", "reviewer", "updated", *fields]
        values = [dataset, item, reviewer, time.time(), *fields.values()]
        updates = ", ".join(f"{c}=excluded.{c}" for c in ["updated", *fields])
        self._write(f"INSERT INTO verdicts ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
                    f"ON CONFLICT (dataset, item, reviewer) DO UPDATE SET {updates}", values)
        return self.get(dataset, item, reviewer)

    def set_verdict(self, dataset: str, item: str, verdict: str, *, reviewer: str = "anonymous",
                    model: str | None = None, label=None, prediction=None, confidence: float | None = None,
                    methods=None) -> dict:
        """Record (or change) a verdict; the note and other fields already saved are kept."""
        if verdict not in VERDICTS:
            raise ReviewError(f"Unknown verdict {verdict!r}: choose one of {', '.join(VERDICTS)}.")
        return self._upsert(dataset, item, reviewer, {
            "verdict": verdict, "model": model, "label": None if label is None else str(label),
            "prediction": None if prediction is None else str(prediction),
            "confidence": None if confidence is None else float(confidence),
            "methods": None if methods is None else (methods if isinstance(methods, str) else ",".join(methods))})

    def set_note(self, dataset: str, item: str, note: str, *, reviewer: str = "anonymous") -> dict:
        """Save a note (the verdict, if any, is kept)."""
        note = "" if note is None else str(note)
        if len(note) > 20_000:
            raise ReviewError("The note is too long (20,000 characters at most).")
        return self._upsert(dataset, item, reviewer, {"note": note})

    def get(self, dataset: str, item: str, reviewer: str = "anonymous") -> dict | None:
        row = self._con().execute("SELECT * FROM verdicts WHERE dataset=? AND item=? AND reviewer=?",
                                  (dataset, item, (reviewer or "").strip() or "anonymous")).fetchone()
        return dict(row) if row else None

    def verdicts(self, dataset: str | None = None, reviewer: str | None = None) -> list:
        sql, params = "SELECT * FROM verdicts WHERE 1=1", []
        if dataset:
            sql, params = sql + " AND dataset=?", params + [dataset]
        if reviewer:
            sql, params = sql + " AND reviewer=?", params + [reviewer]
        return [dict(r) for r in self._con().execute(sql + " ORDER BY dataset, item, reviewer", params)]

    def progress(self, dataset: str, reviewer: str = "anonymous", total: int | None = None) -> tuple:
        """(images with a verdict, total): total defaults to the cached predictions' count."""
        reviewed = self._con().execute(
            "SELECT COUNT(*) FROM verdicts WHERE dataset=? AND reviewer=? AND verdict IS NOT NULL",
            (dataset, (reviewer or "").strip() or "anonymous")).fetchone()[0]
        if total is None:
            total = self._con().execute("SELECT COUNT(DISTINCT item) FROM predictions WHERE dataset=?",
                                        (dataset,)).fetchone()[0]
        return int(reviewed), int(total)

    def export_csv(self, path, dataset: str | None = None, reviewer: str | None = None) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(EXPORT_COLUMNS)
            for row in self.verdicts(dataset, reviewer):
                writer.writerow([row["dataset"], row["item"], row["reviewer"], row["verdict"] or "", row["note"],
                                 row["model"] or "", row["label"] or "", row["prediction"] or "",
                                 "" if row["confidence"] is None else f"{row['confidence']:.4f}",
                                 row["methods"] or "",
                                 time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(row["updated"]))])
        return path

    # ------------------------------------------------------------------ cached predictions
    def save_predictions(self, dataset: str, model: str, rows, unfamiliar=None) -> int:
        """rows: (item, position, label or None, prediction, confidence); `unfamiliar`: a familiarity flag per
        row (True / False), or None where the model was not checked."""
        now = time.time()
        flags = [None] * len(rows) if unfamiliar is None else [None if f is None else int(bool(f)) for f in unfamiliar]
        data = [(dataset, model, str(item), int(pos), None if label is None else int(label), int(pred),
                 float(conf), now, flag) for (item, pos, label, pred, conf), flag in zip(rows, flags)]
        with self._write_lock:
            con = self._con()
            con.execute("BEGIN")
            try:
                con.executemany("INSERT OR REPLACE INTO predictions (dataset, model, item, position, label, "
                                "prediction, confidence, updated, unfamiliar) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                data)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        return len(data)

    def predictions(self, dataset: str, model: str) -> list:
        rows = self._con().execute("SELECT item, position, label, prediction, confidence, unfamiliar FROM predictions "
                                   "WHERE dataset=? AND model=? ORDER BY position", (dataset, model))
        return [dict(r) for r in rows]

    # ------------------------------------------------------------------ mask sets
    def add_mask(self, set_name: str, image, mask, label, *, source: str = "drawn") -> int:
        """Add image + boolean mask (same size) + class label to a mask set; returns the entry's id."""
        set_name = safe_set_name(set_name)
        if label is None or str(label).strip() == "":
            raise ReviewError("Pick the class label of this image before adding it to the mask set.")
        picture = image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image, dtype=np.uint8))
        picture = picture.convert("RGB")
        mask = _as_mask(mask)
        if mask.shape != (picture.height, picture.width):
            raise ReviewError(f"The mask is {mask.shape[1]} x {mask.shape[0]} but the image is "
                              f"{picture.width} x {picture.height}: draw the mask on this image.")
        if not mask.any():
            raise ReviewError("The mask is empty: draw over (or click on) the region that should explain the class.")
        if mask.all():
            raise ReviewError("The mask covers the whole image, so it says nothing: mark only the relevant region.")
        mask_png = png_bytes(Image.fromarray(mask.astype(np.uint8) * 255, "L"))
        cursor = self._write("INSERT INTO masks (set_name, label, image_png, mask_png, source, width, height, created) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                             (set_name, str(label).strip(), png_bytes(picture), mask_png, source, picture.width,
                              picture.height, time.time()))
        return int(cursor.lastrowid)

    def delete_mask(self, mask_id: int) -> None:
        self._write("DELETE FROM masks WHERE id=?", (int(mask_id),))

    def mask_sets(self) -> list:
        """[(set name, number of entries)], by name."""
        rows = self._con().execute("SELECT set_name, COUNT(*) FROM masks GROUP BY set_name ORDER BY set_name")
        return [(r[0], int(r[1])) for r in rows]

    def masks(self, set_name: str) -> list:
        rows = self._con().execute("SELECT id, label, source, width, height, created FROM masks WHERE set_name=? "
                                   "ORDER BY id", (set_name,))
        return [dict(r) for r in rows]

    def mask_item(self, mask_id: int) -> tuple:
        """(PIL RGB image, boolean mask, label) of one entry."""
        row = self._con().execute("SELECT image_png, mask_png, label FROM masks WHERE id=?", (int(mask_id),)).fetchone()
        if row is None:
            raise ReviewError(f"No mask entry {mask_id}.")
        image = Image.open(io.BytesIO(row["image_png"])).convert("RGB")
        mask = np.asarray(Image.open(io.BytesIO(row["mask_png"])).convert("L")) > 0
        return image, mask, row["label"]

    def export_mask_set(self, set_name: str, folder) -> Path:
        """Write a set in the mask-set layout `explainers.masks` and the CAMAL job read: `images/`, `masks/`,
        `masks.csv` (`file,mask_file,class_index,mask_source`) and `labels.csv`."""
        from explainers.masks import write_mask_set

        set_name = safe_set_name(set_name)
        entries = self.masks(set_name)
        if not entries:
            raise ReviewError(f"Mask set '{set_name}' is empty: add at least one image with its mask first.")

        def items():
            for entry in entries:
                image, mask, label = self.mask_item(entry["id"])
                try:
                    class_index = int(label)
                except ValueError:
                    class_index = -1
                yield f"{entry['id']:06d}", np.asarray(image, dtype=np.uint8), mask, class_index, entry["source"]

        return write_mask_set(folder, items())

    # ------------------------------------------------------------------ studies
    @staticmethod
    def _hash_code(code: str, salt: str) -> str:
        return hashlib.pbkdf2_hmac("sha256", code.encode(), bytes.fromhex(salt), 60_000).hex()

    def create_study(self, name: str, *, protocol: str, dataset: str, dataset_path: str, model: str, methods,
                     reviewers, class_names, items, question: str = "", seed: int | None = None,
                     owner_code: str | None = None) -> str:
        """A new study; returns its code (a random token, kept only as a salted hash: show it once).
        `owner_code` (kept as a salted hash too): the code that alone sees the results until the owner closes
        the study; distinct from the reviewers' code, so that no reviewer can unblind a study mid-way.

        items: (item name, data-set index, true label or None, predicted class, confidence). For the blinded
        protocol every image gets its own random order of the methods (stored; `seed` only for tests)."""
        name = safe_set_name(name)
        if protocol not in PROTOCOLS:
            raise ReviewError(f"Unknown protocol {protocol!r}: choose 'open' or 'blinded'.")
        methods = [str(m) for m in methods]
        if not methods:
            raise ReviewError("Choose at least one method to show.")
        if protocol == "blinded" and not 2 <= len(methods) <= len(SLOTS):
            raise ReviewError(f"A blinded comparison needs 2 to {len(SLOTS)} methods (got {len(methods)}).")
        reviewers = list(dict.fromkeys(_clean_name(r, "reviewer name") for r in reviewers if str(r).strip()))
        items = list(items)
        if not items:
            raise ReviewError("The study has no images.")
        shuffle = random.Random(seed) if seed is not None else secrets.SystemRandom()
        code = secrets.token_urlsafe(12)
        salt = secrets.token_hex(16)
        rows = []
        for position, (item, index, label, prediction, confidence) in enumerate(items):
            order = list(methods)
            if protocol == "blinded":
                shuffle.shuffle(order)
            rows.append((name, position, str(item), int(index), None if label is None or int(label) < 0 else int(label),
                         int(prediction), float(confidence), json.dumps(order)))
        with self._write_lock:
            con = self._con()
            con.execute("BEGIN IMMEDIATE")
            try:
                if con.execute("SELECT 1 FROM studies WHERE name=?", (name,)).fetchone():
                    raise ReviewError(f"A study named '{name}' exists already: choose another name.")
                con.execute("INSERT INTO studies VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            (name, self._hash_code(code, salt), salt, protocol, dataset, str(dataset_path), model,
                             json.dumps(methods), json.dumps(reviewers), json.dumps(list(class_names)),
                             question or "", time.time()))
                con.executemany("INSERT INTO study_items VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
                if owner_code:
                    if owner_code == code:
                        raise ReviewError("The owner code must differ from the reviewers' code.")
                    owner_salt = secrets.token_hex(16)
                    con.execute("INSERT INTO study_owners VALUES (?, ?, ?, NULL)",
                                (name, self._hash_code(owner_code, owner_salt), owner_salt))
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        return code

    def study_settings(self, name: str) -> dict:
        """The study's settings (no codes), for a caller that checked a code already."""
        row = self._con().execute("SELECT * FROM studies WHERE name=?", (name,)).fetchone()
        if row is None:
            raise ReviewError("No study with this name and code.")
        study = {k: row[k] for k in row.keys() if k not in ("code_hash", "salt")}
        for key in ("methods", "reviewers", "class_names"):
            study[key] = json.loads(study[key])
        return study

    def open_study(self, name: str, code: str) -> dict:
        """The study's settings when `code` is its code; the same ReviewError for an unknown name and a wrong
        code, so a guess learns nothing."""
        row = self._con().execute("SELECT * FROM studies WHERE name=?", ((name or "").strip(),)).fetchone()
        refused = ReviewError("No study with this name and code.")
        if row is None:
            self._hash_code(code or "", "00" * 16)  # the same time as a wrong code
            raise refused
        if not hmac.compare_digest(self._hash_code((code or "").strip(), row["salt"]), row["code_hash"]):
            raise refused
        return self.study_settings(row["name"])

    def study_owner(self, name: str) -> dict | None:
        """{'closed': time or None} of a study created with an owner code; None for one created without (an
        earlier version's study: its reviewers' code shows the results, as it always did)."""
        row = self._con().execute("SELECT closed FROM study_owners WHERE study=?", (name,)).fetchone()
        return None if row is None else {"closed": row["closed"]}

    def is_owner(self, name: str, owner_code: str) -> bool:
        row = self._con().execute("SELECT owner_hash, owner_salt FROM study_owners WHERE study=?",
                                  ((name or "").strip(),)).fetchone()
        if row is None:
            self._hash_code(owner_code or "", "00" * 16)  # the same time as a wrong code
            return False
        return hmac.compare_digest(self._hash_code((owner_code or "").strip(), row["owner_salt"]), row["owner_hash"])

    def close_study(self, name: str, owner_code: str) -> float:
        """Close the study (no more responses; its results open to the reviewers' code too); the closing time.
        Only the owner code closes it; closing twice keeps the first time."""
        if not self.is_owner(name, owner_code):
            raise ReviewError("Only the study's owner code closes it (the code shown to its creator as the owner "
                              "code, not the reviewers' code).")
        now = time.time()
        self._write("UPDATE study_owners SET closed=COALESCE(closed, ?) WHERE study=?", (now, name))
        return self.study_owner(name)["closed"]

    def _check_open(self, name: str) -> None:
        owner = self.study_owner(name)
        if owner is not None and owner["closed"] is not None:
            raise ReviewError(f"Study '{name}' is closed: its responses can no longer change.")

    def study_items(self, name: str) -> list:
        rows = self._con().execute("SELECT * FROM study_items WHERE study=? ORDER BY position", (name,))
        return [{**dict(r), "order": json.loads(r["shown_order"])} for r in rows]

    def _study_upsert(self, name, position, reviewer, fields: dict) -> None:
        reviewer = _clean_name(reviewer, "reviewer name")
        self._check_open(name)
        columns = ["study", "position", "reviewer", "updated", *fields]
        values = [name, int(position), reviewer, time.time(), *fields.values()]
        updates = ", ".join(f"{c}=excluded.{c}" for c in ["updated", *fields])
        self._write(f"INSERT INTO study_responses ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
                    f"ON CONFLICT (study, position, reviewer) DO UPDATE SET {updates}", values)

    def _check_position(self, name, position) -> dict:
        row = self._con().execute("SELECT shown_order FROM study_items WHERE study=? AND position=?",
                                  (name, int(position))).fetchone()
        if row is None:
            raise ReviewError(f"Study '{name}' has no image {position}.")
        return {"order": json.loads(row["shown_order"])}

    def _check_slot(self, name, position, slot) -> str:
        order = self._check_position(name, position)["order"]
        slot = (slot or "").strip().upper()
        if slot not in SLOTS[:len(order)]:
            raise ReviewError(f"Map {slot or '?'} does not exist: this image shows maps {', '.join(SLOTS[:len(order)])}.")
        return slot

    def set_study_verdict(self, name: str, position: int, reviewer: str, verdict: str) -> None:
        if verdict not in VERDICTS:
            raise ReviewError(f"Unknown verdict {verdict!r}: choose one of {', '.join(VERDICTS)}.")
        self._check_position(name, position)
        self._study_upsert(name, position, reviewer, {"verdict": verdict})

    def set_study_note(self, name: str, position: int, reviewer: str, note: str) -> None:
        note = "" if note is None else str(note)
        if len(note) > 20_000:
            raise ReviewError("The note is too long (20,000 characters at most).")
        self._check_position(name, position)
        self._study_upsert(name, position, reviewer, {"note": note})

    def set_study_best(self, name: str, position: int, reviewer: str, slot: str | None) -> None:
        """The map the reviewer finds best on this image (a letter), or None to clear the pick."""
        slot = None if not slot else self._check_slot(name, position, slot)
        if slot is None:
            self._check_position(name, position)
        self._study_upsert(name, position, reviewer, {"best": slot})

    def set_study_rating(self, name: str, position: int, reviewer: str, slot: str, rating: int) -> None:
        slot = self._check_slot(name, position, slot)
        try:
            rating = int(rating)
        except (TypeError, ValueError):
            rating = None
        if rating not in LIKERT:
            raise ReviewError("A rating is a whole number from 1 to 5.")
        reviewer = _clean_name(reviewer, "reviewer name")
        self._check_open(name)
        self._write("INSERT INTO study_ratings VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (study, position, reviewer, slot) "
                    "DO UPDATE SET rating=excluded.rating, updated=excluded.updated",
                    (name, int(position), reviewer, slot, rating, time.time()))

    def study_response(self, name: str, position: int, reviewer: str) -> dict:
        """This reviewer's verdict, note, best pick and ratings ({slot: rating}) on one image."""
        row = self._con().execute("SELECT verdict, note, best FROM study_responses WHERE study=? AND position=? "
                                  "AND reviewer=?", (name, int(position), reviewer)).fetchone()
        ratings = self._con().execute("SELECT slot, rating FROM study_ratings WHERE study=? AND position=? AND "
                                      "reviewer=?", (name, int(position), reviewer))
        out = dict(row) if row else {"verdict": None, "note": "", "best": None}
        out["ratings"] = {r["slot"]: r["rating"] for r in ratings}
        return out

    def study_done(self, name: str, reviewer: str, protocol: str, n_methods: int) -> set:
        """Positions this reviewer has finished: a verdict (open) or every map rated (blinded)."""
        if protocol == "open":
            rows = self._con().execute("SELECT position FROM study_responses WHERE study=? AND reviewer=? AND "
                                       "verdict IS NOT NULL", (name, reviewer))
        else:
            rows = self._con().execute("SELECT position FROM study_ratings WHERE study=? AND reviewer=? GROUP BY "
                                       "position HAVING COUNT(*) >= ?", (name, reviewer, int(n_methods)))
        return {int(r[0]) for r in rows}

    def save_faithfulness(self, name: str, position: int, method: str, deletion_auc, insertion_auc) -> None:
        self._write("INSERT OR REPLACE INTO study_faithfulness VALUES (?, ?, ?, ?, ?)",
                    (name, int(position), method, None if deletion_auc is None else float(deletion_auc),
                     None if insertion_auc is None else float(insertion_auc)))

    def faithfulness_done(self, name: str) -> set:
        rows = self._con().execute("SELECT position, method FROM study_faithfulness WHERE study=?", (name,))
        return {(int(r[0]), r[1]) for r in rows}

    def close(self) -> None:
        con = getattr(self._local, "con", None)
        if con is not None:
            con.close()
            self._local.con = None
