"""The two layers: the library (`explainers`) never imports the UI (gradio, plotly) or the app's service layer
(`saliency_lab`). Every library module is imported in a fresh interpreter with those packages blocked by a
meta-path finder that raises, so a module imported earlier in this test session cannot hide a violation."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

def layer_probe(package: str, blocked: tuple, why: str, skip_prefix: str = "-", after: str = "") -> str:
    """The code of a fresh interpreter that blocks `blocked` (a meta-path finder that raises, naming `why`), imports
    every module of `package` (except those under `skip_prefix`), runs `after`, and prints the modules, the import
    failures, the blocked packages loaded anyway and `extra` (what `after` records) as one JSON line."""
    return f'''
import importlib, json, pkgutil, sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"the {why} imported {{name!r}}, which it must never do")
        return None

sys.meta_path.insert(0, Block())
import {package}
names = sorted(m.name for m in pkgutil.walk_packages({package}.__path__, "{package}.")
               if not m.name.endswith("__main__") and not m.name.startswith({skip_prefix!r}))
failures, extra = {{}}, {{}}
for name in names:
    try:
        importlib.import_module(name)
    except ImportError as error:
        failures[name] = str(error)
{after}
loaded = [name for name in {blocked!r} if name in sys.modules]
print(json.dumps({{"modules": names, "failures": failures, "loaded": loaded, "extra": extra}}))
'''


PROBE = layer_probe("explainers", ("gradio", "plotly", "saliency_lab"), "library")


def run_probe(code: str):
    """Run `code` in a fresh interpreter (offline, this repository importable) and read its last line as JSON."""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_library_never_imports_the_ui_or_the_app():
    result = run_probe(PROBE)
    assert len(result["modules"]) >= 25, result["modules"]  # every library module was reached
    for expected in ("explainers.engine", "explainers.methods.gradskip", "explainers.aha_training.loop", "explainers.camal",
                     "explainers.cli", "explainers.sanity"):
        assert expected in result["modules"]
    assert result["failures"] == {} and result["loaded"] == []


def test_the_probe_catches_a_violation():
    """The same finder, with a library module that reaches the app: it must be reported (the test can fail)."""
    code = layer_probe("explainers", ("gradio", "plotly", "saliency_lab"), "library", after="""
try:
    import saliency_lab.menus
except ImportError as error:
    failures["probe"] = str(error)
""")
    result = run_probe(code)
    assert "saliency_lab" in result["failures"]["probe"]


def _loaded_after(statement: str) -> list:
    return run_probe(f"import sys; {statement}; print(__import__('json').dumps(sorted(m for m in "
                     "('gradio', 'plotly', 'saliency_lab', 'timm', 'torch') if m in sys.modules)))")


def test_import_explainers_is_light():
    assert _loaded_after("import explainers") == []  # the public API loads on first use
    assert _loaded_after("import explainers, explainers.methods, explainers.metrics") == ["timm", "torch"]
    assert _loaded_after("import explainers; explainers.get_method") == ["timm", "torch"]


def test_the_space_deploy_copies_every_package_the_app_imports():
    """Space.md's deploy step copies the code by name: every top-level package of this repository that app.py
    imports must be in that list (saliency_lab once was not: the Space would not start)."""
    import ast
    import re

    tree = ast.parse((ROOT / "app.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    local = {name for name in imported if (ROOT / name / "__init__.py").exists()}
    assert {"explainers", "saliency_lab"} <= local
    copy = re.search(r"cp -r (app\.py [^\n]*?) space/", (ROOT / "Space.md").read_text())
    assert copy, "Space.md has no 'cp -r app.py ... space/' step"
    copied = set(copy.group(1).split())
    assert local <= copied, f"Space.md's deploy leaves out {sorted(local - copied)}"
    assert {"assets", "weights"} <= copied


SERVICE_PROBE = layer_probe("saliency_lab", ("gradio",), "service layer (only saliency_lab.ui may import it)",
                            skip_prefix="saliency_lab.ui", after="""
try:
    importlib.import_module("saliency_lab.ui.explain")
except ImportError as error:
    extra["saliency_lab.ui.explain"] = str(error)
""")


def test_only_the_ui_package_imports_gradio():
    """The service layer (saliency_lab, except saliency_lab.ui) imports without Gradio; the UI package does not
    (so the probe can fail), and no service module loads Gradio on import."""
    result = run_probe(SERVICE_PROBE)
    for expected in ("saliency_lab.explain", "saliency_lab.services", "saliency_lab.jobs", "saliency_lab.datasets"):
        assert expected in result["modules"]
    assert result["failures"] == {} and result["loaded"] == []
    assert "only saliency_lab.ui may import it" in result["extra"]["saliency_lab.ui.explain"]


def test_every_tab_keeps_the_tab_contract():
    """Each module in TAB_MODULES has TITLE, TAB_ID (unique) and build; the Gradio imports stay inside the ui
    package and app.py (no other top-level module of the app imports it)."""
    import ast
    import importlib

    from saliency_lab.ui import TAB_MODULES, tab_modules

    modules = tab_modules()
    assert [m.__name__.rsplit(".", 1)[1] for m in modules] == TAB_MODULES
    assert len({m.TAB_ID for m in modules}) == len(modules)
    for module in modules:
        assert isinstance(module.TITLE, str) and module.TITLE and callable(module.build)
    for path in (ROOT / "saliency_lab").glob("*.py"):
        tree = ast.parse(path.read_text())
        roots = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names}
        roots |= {node.module.split(".")[0] for node in ast.walk(tree)
                  if isinstance(node, ast.ImportFrom) and node.module}
        assert "gradio" not in roots, f"{path.name} imports gradio: only saliency_lab/ui/ may"
    assert importlib.import_module("saliency_lab.ui").TabContext


def test_library_options_carry_no_gradio_names_and_the_app_derives_them():
    """A method's Option names no element or endpoint of the page: the app derives them from (method, option),
    keeping the names the page and its API have published, and naming any other option '<method>-<option>'."""
    import dataclasses

    from explainers.methods import Option
    from saliency_lab import menus

    fields = {field.name for field in dataclasses.fields(Option)}
    assert not fields & {"elem_id", "api_name", "preview_api_name"}
    ids = {(method, option.name): menus.slider_ids(method, option) for method, option in menus.sliders()}
    assert ids[("gradskip", "alpha")] == menus.SliderIds("alpha", "alpha_curves", "alpha_preview")
    assert ids[("gradskip", "gate_power")] == menus.SliderIds("class-focus", "class_focus_curves", "class_focus_preview")
    assert ids[("aha", "refine_steps")] == menus.SliderIds("refine", "refine", None)
    assert ids[("occlusion", "window_fraction")] == menus.SliderIds("occlusion-window", "occlusion_window", None)
    assert len({i.elem_id for i in ids.values()}) == len(ids)  # one element per slider
    new = Option("window_size", "A new option", 1, 0, 2, 1)
    assert menus.slider_ids("newmethod", new) == menus.SliderIds("newmethod-window-size", "newmethod_window_size", None)
    assert [menus.api_parameter(m, o) for m, o in menus.sliders()] == ["alpha", "class_focus", "refine_steps",
                                                                      "occlusion_window", "intgrad_steps"]
