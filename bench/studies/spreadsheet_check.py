"""Does a spreadsheet program read a study's CSV export as we mean it? (issue 13: "the exports open in a
spreadsheet"). Builds a small blinded study on the shipped cells with the bundled bloodmnist-vit in a temporary
data folder, two reviewers, notes that are a formula, a name starting like one, and a note with a comma, quotes,
a newline and a non-ASCII name; exports the CSV; has LibreOffice Calc (headless) open it with the import options
its Text Import dialog shows for the file (comma, double quote, UTF-8), save it as .xlsx, and convert that .xlsx
back to CSV; then compares every cell with what the app stored. Headless conversion skips the dialog's charset
detection, so the same round trip without options is recorded too (it reads the bytes as the system charset).

    python bench/studies/spreadsheet_check.py --out bench/results/review-csv-libreoffice.json
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "review-csv-libreoffice.json"))
    args = parser.parse_args()
    soffice = shutil.which("soffice") or shutil.which("libreoffice")
    if soffice is None:
        print("LibreOffice (soffice) is not installed: apt-get install -y libreoffice-calc-nogui", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="sheet-check-"))
    os.environ["SALIENCY_DATA_DIR"] = str(work / "data")
    import torch

    from explainers.models import load_model
    from saliency_lab import studies
    from saliency_lab.services import Services

    torch.set_num_threads(1)
    services = Services(load_model, ["bloodmnist-vit"], work / "state")
    tricky = 'nucleus, not "membrane"\nsecond line'
    reviewers = ("Dr. Müller", "-b")
    code, owner, _ = studies.create_study(services, "sheet", "bloodmnist-cells", "bloodmnist-vit", ["gradcam", "rollout"],
                                   ", ".join(reviewers), "blinded", count=3, seed=3)
    for reviewer, note in zip(reviewers, ("=SUM(A1)", tricky)):
        state, _ = studies.open_study(services, "sheet", code, reviewer)
        for position in range(3):
            state = studies.show_item(services, state, position, reviewer).state
            studies.rate(services, state, reviewer, "A", 4)
            studies.rate(services, state, reviewer, "B", 2)
            studies.pick_best(services, state, reviewer, "A")
            studies.save_note(services, state, reviewer, note)
    exported = Path(studies.export_study(services, "sheet", owner, "csv"))
    ours = list(csv.reader(io.StringIO(exported.read_bytes().decode("utf-8-sig"), newline="")))
    sheet_dir = work / "sheet"
    sheet_dir.mkdir()
    shutil.copy(exported, sheet_dir / "study.csv")
    profile = f"-env:UserInstallation=file://{work / 'lo-profile'}"
    run = lambda *a: subprocess.run([soffice, profile, "--headless", *a], cwd=sheet_dir, capture_output=True,
                                    text=True, timeout=300)
    def round_trip(infilter, folder):
        (sheet_dir / folder).mkdir()
        opened = run(*([f"--infilter={infilter}"] if infilter else []), "--convert-to", "xlsx", "--outdir", folder,
                     "study.csv")
        back = run("--convert-to", "csv:Text - txt - csv (StarCalc):44,34,76,1", "--outdir", f"{folder}/back",
                   f"{folder}/study.xlsx")
        back_file = sheet_dir / folder / "back" / "study.csv"
        rows = list(csv.reader(io.StringIO(back_file.read_text(encoding="utf-8"), newline=""))) if back_file.exists() else []
        return rows, (sheet_dir / folder / "study.xlsx").exists(), [opened.stdout.strip(), back.stdout.strip()]

    theirs, xlsx_written, logs = round_trip("CSV:44,34,76,1", "utf8")
    without_options, _, _ = round_trip(None, "plain")
    mismatches = [{"row": r, "column": ours[0][c] if r else c, "ours": ours[r][c],
                   "spreadsheet": theirs[r][c] if r < len(theirs) and c < len(theirs[r]) else None}
                  for r in range(len(ours)) for c in range(len(ours[r]))
                  if not (r < len(theirs) and c < len(theirs[r]) and theirs[r][c] == ours[r][c])]
    # numbers come back as the spreadsheet writes them (4 stays 4; 0.5123 may lose trailing digits): say which
    numeric = [m for m in mismatches if _same_number(m["ours"], m["spreadsheet"])]
    real = [m for m in mismatches if m not in numeric]
    notes = sorted({row[ours[0].index("note")] for row in theirs[1:]}) if theirs else []
    result = {
        "libreoffice": subprocess.run([soffice, "--version"], capture_output=True, text=True).stdout.strip(),
        "csv_file": exported.name, "rows": len(ours) - 1, "columns": len(ours[0]),
        "import_options": "CSV:44,34,76,1 (comma, double quote, UTF-8)",
        "xlsx_written": xlsx_written, "read_back_rows": max(0, len(theirs) - 1),
        "cells_equal": sum(len(r) for r in ours) - len(mismatches), "cells": sum(len(r) for r in ours),
        "numeric_format_only": len(numeric), "mismatches": real[:20],
        "notes_as_the_spreadsheet_holds_them": notes, "reviewers_as_the_spreadsheet_holds_them":
            sorted({row[ours[0].index("reviewer")] for row in theirs[1:]}) if theirs else [],
        "without_import_options": {
            "reviewers": sorted({row[ours[0].index("reviewer")] for row in without_options[1:]}) if without_options else [],
            "rows": max(0, len(without_options) - 1)},
        "conversion_logs": logs,
    }
    result["passed"] = bool(result["xlsx_written"] and not real and result["read_back_rows"] == result["rows"])
    Path(args.out).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "conversion_logs"}, indent=2, ensure_ascii=False))
    shutil.rmtree(work, ignore_errors=True)
    return 0 if result["passed"] else 1


def _same_number(a, b) -> bool:
    try:
        return b is not None and abs(float(a) - float(b)) <= 1e-9 + 1e-6 * abs(float(a))
    except ValueError:
        return False


if __name__ == "__main__":
    raise SystemExit(main())
