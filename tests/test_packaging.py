"""The README's set-up installs the package itself, so the CLI works from any folder, as a module and as the
`saliency-explainers` command (not only from the repository root, where Python finds `explainers/` by accident)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # pytest.ini's pythonpath must not help
    return env


def test_cli_runs_from_another_folder(tmp_path):
    done = subprocess.run([sys.executable, "-m", "explainers", "--help"], cwd=tmp_path, env=_clean_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-500:]
    assert "usage: python -m explainers" in done.stdout
    assert "explain" in done.stdout and "evaluate" in done.stdout


def test_cli_entry_point_is_installed(tmp_path):
    script = Path(sys.executable).with_name("saliency-explainers")
    assert script.exists(), "the README's install step should install the saliency-explainers command"
    done = subprocess.run([str(script), "--help"], cwd=tmp_path, env=_clean_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-500:]
    assert "explain" in done.stdout


def test_readme_and_ci_install_the_package():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "-e ." in ci
    readme = (ROOT / "README.md").read_text()
    assert "-e ." in readme
