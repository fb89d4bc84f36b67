"""Review studies through the running app's named endpoints (gradio_client): upload, create, two reviewers in
two sessions, blinded pages without method names, results with the code only."""
import json
import zipfile
from pathlib import Path

import pytest

from conftest import launch_for_test, tiny_vit
from explainers.methods import METHODS

ROOT = Path(__file__).resolve().parent.parent



@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    import torch

    torch.set_num_threads(1)
    import app
    from explainers.models import register_bundle

    register_bundle(tiny_vit(num_classes=8))
    state = tmp_path_factory.mktemp("studies-app")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SALIENCY_DATA_DIR", str(state / "user-data"))
        demo = app.build_app(model_names=["tiny-vit"], default_model="tiny-vit",
                             data_dir=str(ROOT / "assets" / "bloodmnist"), state_dir=state,
                             weights_dir=state / "weights", decoy_roots=[])
        url = launch_for_test(demo)
        yield url
        demo.close()


def client(url):
    from gradio_client import Client

    return Client(url, verbose=False)


def method_words() -> set:
    return {w.lower() for name, cls in METHODS.items() for w in (name, getattr(cls, "label", name)) if w}


def test_study_endpoints_are_named(app_url):
    api = client(app_url).view_api(print_info=False, return_format="dict")["named_endpoints"]
    for name in ("/review_upload", "/review_study_create", "/review_agreement", "/review_study_open",
                 "/review_study_rate", "/review_study_best", "/review_study_verdict"):
        assert name in api


def test_upload_create_review_two_reviewers_and_results(app_url, tmp_path):
    from gradio_client import handle_file

    archive = tmp_path / "cells.zip"
    with zipfile.ZipFile(archive, "w") as z:
        lines = ["file,class_index"]
        for i, source in enumerate(sorted((ROOT / "assets" / "bloodmnist").glob("*.jpg"))[:6]):
            z.write(source, f"c{i}.jpg")
            lines.append(f"c{i}.jpg,{i % 3}")
        z.writestr("broken.jpg", b"\xff\xd8 not really")
        lines.append("broken.jpg,0")
        z.writestr("labels.csv", "\n".join(lines) + "\n")
    creator = client(app_url)
    message, dataset = creator.predict([handle_file(str(archive))], "uploaded-cells", api_name="/review_upload")
    assert "6 images loaded" in message and "broken.jpg" in message
    created, name = creator.predict("blind-1", "uploaded-cells", "tiny-vit", ["gradcam", "rollout", "chefer"],
                                    "dr-a, dr-b", "blinded", 6, api_name="/review_study_create")
    code = created.split("Reviewers' code: `")[1].split("`")[0]
    owner = created.split("Owner code: `")[1].split("`")[0]
    assert name == "blind-1" and len(code) >= 16 and len(owner) >= 16 and owner != code

    words = method_words()
    reviewers = {"dr-a": client(app_url), "dr-b": client(app_url)}  # two sessions at once
    for who, session in reviewers.items():
        opened = session.predict("blind-1", code, who, api_name="/review_study_open")
        assert "0 of 6 done" in opened[4]
    for position in range(6):
        for k, (who, session) in enumerate(reviewers.items()):
            if position:
                shown = session.predict(who, position, api_name="/review_study_show")
            else:
                shown = opened if who == "dr-b" else session.predict(who, 0, api_name="/review_study_show")
            text = json.dumps(shown).lower()
            assert not [w for w in words if w in text], "a method name reached a reviewer's page"
            for slot, rating in zip("ABC", (5, 3, 1) if k == 0 else (4, 3, 2)):
                saved, progress = session.predict(who, slot, rating, api_name="/review_study_rate")
            session.predict(who, "A", api_name="/review_study_best")
    assert "6 of 6 done" in progress
    # a wrong code gets our sentence, not the results; nor can the reviewers' code unblind the study before its
    # owner closes it
    for wrong in ("not-the-code", code):
        summary, _, _, report = creator.predict("blind-1", wrong, api_name="/review_agreement")
        assert summary.startswith("⚠") and "counts" not in str(report)
    summary, _, _, report = creator.predict("blind-1", owner, api_name="/review_agreement")
    assert report["counts"]["overall"]["complete_images"] == 6
    assert report["agreement"]["pairs"][0]["images"] == 6
    assert sum(m["best_picks"] for m in report["methods"]) == 12 and "Per method" in summary
    # the owner closes the study from the page: the reviewers' code cannot close it, then shows the results too
    with pytest.raises(Exception):
        creator.predict("blind-1", code, api_name="/review_study_close")
    closed = creator.predict("blind-1", owner, api_name="/review_study_close")
    assert "closed" in closed and owner not in closed
    assert creator.predict("blind-1", code, api_name="/review_agreement")[3]["counts"]["overall"]["complete_images"] == 6
    with pytest.raises(Exception):  # no more responses once closed
        reviewers["dr-a"].predict("dr-a", "A", 1, api_name="/review_study_rate")
