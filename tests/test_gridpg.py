"""The grid pointing game on a model with a known answer: class k fires only on colour k."""
import json

import numpy as np
import pytest
import torch
import torch.nn as nn

from explainers import models
from explainers.cli import main
from explainers.gridpg import (assemble, bundle_for_mosaics, plan_mosaics, quadrant_sensitivity, quadrant_share,
                                top_quarter_share,
                               run_gridpg)
from explainers.models import ModelBundle

from conftest import tiny_vit, write_labelled_folder

COLOURS = [(1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 1), (0, 1, 1)]


class ColourNet(nn.Module):
    """Detector k fires (ReLU) only on colour k; the logits are the globally pooled detectors."""

    def __init__(self, scale=20.0):
        super().__init__()
        conv = nn.Conv2d(3, len(COLOURS), 1)
        with torch.no_grad():  # input normalised to [-0.5, 0.5]: w = +-1 per channel, fires only at its colour
            for k, colour in enumerate(COLOURS):
                conv.weight[k, :, 0, 0] = torch.tensor([1.0 if c else -1.0 for c in colour])
                conv.bias[k] = -1.0
        self.layer4 = nn.Sequential(conv, nn.ReLU())
        self.scale = scale

    def forward(self, x):
        return self.scale * self.layer4(x).mean(dim=(2, 3))


def colour_bundle(size=16):
    return ModelBundle(name="colour", network=ColourNet().eval(), mean=(0.5, 0.5, 0.5), std=(1.0, 1.0, 1.0),
                       input_size=(size, size), class_names=[str(c) for c in COLOURS], family="cnn",
                       reference_color=(0.5, 0.5, 0.5), cam_layer_name="layer4")


@pytest.fixture
def colour_folder(tmp_path):
    return write_labelled_folder(tmp_path / "colours", (
        (f"c{k}_{copy}.png", np.zeros((16, 16, 3), dtype=np.uint8) + (np.array(colour) * 255).astype(np.uint8), k)
        for k, colour in enumerate(COLOURS) for copy in range(2)))


def test_plan_is_deterministic_with_four_different_classes():
    labels = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    plan = plan_mosaics(labels, 30, seed=1)
    assert plan == plan_mosaics(labels, 30, seed=1) and plan != plan_mosaics(labels, 30, seed=2)
    for cells, classes in plan:
        assert len(set(classes)) == 4 and [labels[i] for i in cells] == classes
    assert {c for _, classes in plan for c in classes} == {0, 1, 2, 3, 4}
    with pytest.raises(ValueError, match="at least 4 classes"):
        plan_mosaics([0, 1, 2, 0], 3)


def test_assemble_and_share_known_answers():
    cells = torch.stack([torch.full((3, 4, 4), float(q)) for q in range(4)])
    mosaic = assemble(cells)
    assert mosaic.shape == (3, 8, 8) and mosaic[0, 0, 0] == 0 and mosaic[0, 0, 7] == 1
    assert mosaic[0, 7, 0] == 2 and mosaic[0, 7, 7] == 3
    maps = torch.stack([mosaic[0] == q for q in range(4)]).float()  # all mass in quadrant q
    assert quadrant_share(maps, [0, 1, 2, 3]).tolist() == [1.0, 1.0, 1.0, 1.0]
    assert quadrant_share(maps, [1, 2, 3, 0]).tolist() == [0.0, 0.0, 0.0, 0.0]
    uniform = torch.ones(2, 8, 8)
    assert quadrant_share(uniform, [0, 3]) == pytest.approx([0.25, 0.25])
    signed = maps[:1] - 5 * maps[1:2]  # negative attribution elsewhere is ignored
    assert quadrant_share(signed, [0]) == pytest.approx([1.0])
    assert quadrant_share(-uniform[:1], [2]) == pytest.approx([0.25])  # nothing positive: chance


def test_top_quarter_share_depends_on_the_ranking_only():
    yy, xx = torch.meshgrid(torch.arange(8.0), torch.arange(8.0), indexing="ij")
    quadrant_first = torch.where((yy < 4) & (xx < 4), 50.0 + xx + yy, xx + yy)[None]  # quadrant 0 ranked first
    assert top_quarter_share(quadrant_first, [0]).tolist() == [1.0]
    assert top_quarter_share(quadrant_first, [3]).tolist() == [0.0]
    shifted = quadrant_first + 100.0  # an offset moves the positive share, not the ranking
    assert top_quarter_share(shifted, [0]).tolist() == [1.0]
    assert quadrant_share(shifted, [0])[0] < 0.5 < quadrant_share(quadrant_first, [0])[0]
    assert top_quarter_share(torch.exp(quadrant_first / 10), [0]).tolist() == [1.0]
    half = torch.where(xx < 4, 1.0, 0.0)[None]  # left half ranked first: the top 16 pixels are split over TL and BL
    assert top_quarter_share(half, [0])[0] + top_quarter_share(half, [2])[0] == pytest.approx(1.0)


def test_gridpg_separates_gradcam_from_random_on_the_colour_model(colour_folder):
    bundle = colour_bundle()
    report = run_gridpg(bundle, str(colour_folder), ["gradcam", "random"], n_mosaics=12, seed=0, batch_size=5,
                        progress=False)
    assert report["n_mosaics"] == 12 and report["mosaic_size"] == [32, 32]
    gradcam, random = report["methods"]["gradcam"], report["methods"]["random"]
    assert gradcam["gridpg"] == pytest.approx(1.0, abs=1e-6)  # the detector fires only in its quadrant
    assert abs(random["gridpg"] - 0.25) < 0.05
    low, high = random["gridpg_ci95"]
    assert low <= random["gridpg"] <= high and len(random["per_mosaic"]) == 12
    assert gradcam["top_quarter"] > 0.9 and abs(random["top_quarter"] - 0.25) < 0.08
    assert len(gradcam["per_mosaic_top_quarter"]) == 12
    # the model reads each class in its quadrant only
    sensitivity = report["model_quadrant_sensitivity"]
    assert sensitivity["share_positive"] == 1.0 and sensitivity["mean"] > 0.1
    assert report["model_top4_recall"] == 1.0
    first = report["mosaics"][0]
    assert [int(f[1]) for f in first["files"]] == first["classes"]  # c{k}_*.png holds class k


def test_quadrant_sensitivity_is_zero_for_a_model_blind_to_position():
    class Constant(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer4 = nn.Conv2d(3, 5, 1)

        def forward(self, x):
            return self.layer4(x).mean(dim=(2, 3)) * 0 + torch.arange(5.0)

    bundle = colour_bundle()
    bundle.network = Constant()
    mosaics = torch.rand(2, 3, 32, 32)
    assert np.abs(quadrant_sensitivity(bundle, mosaics, torch.tensor([[0, 1, 2, 3], [4, 3, 2, 1]]))).max() < 1e-6


def test_vit_gets_interpolated_position_embeddings():
    bundle = tiny_vit(img_size=32)
    mosaic = bundle_for_mosaics(bundle, (64, 64))
    assert mosaic.network is not bundle.network and mosaic.input_size == (64, 64)
    with torch.no_grad():
        assert mosaic(torch.rand(1, 3, 64, 64)).shape == (1, 4)
        assert bundle(torch.rand(1, 3, 32, 32)).shape == (1, 4)  # the original is untouched
    assert mosaic.patch_grid() == (8, 8)


def test_gridpg_command_writes_the_report(colour_folder, tmp_path, capsys):
    models.register_bundle(colour_bundle())
    out = tmp_path / "grid.json"
    assert main(["gridpg", "--model", "colour", "--methods", "gradcam,random", "--data", str(colour_folder),
                 "--mosaics", "6", "--seed", "3", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["methods"]) == {"gradcam", "random"}
    assert {"gridpg", "gridpg_ci95", "per_mosaic"} <= set(report["methods"]["gradcam"])
    assert len(report["model_quadrant_sensitivity"]["per_mosaic"]) == 6
    assert "GridPG" in capsys.readouterr().out


def test_grid_training_batches_and_figures():
    from explainers.grid_training import _mosaic_batch, grid_figures

    cells = torch.stack([torch.tensor(np.array(c) * 255, dtype=torch.uint8).view(3, 1, 1).expand(3, 16, 16)
                         for c in COLOURS for _ in range(2)])
    labels = torch.tensor([k for k in range(len(COLOURS)) for _ in range(2)])
    mosaics, targets = _mosaic_batch(cells, labels, 6, torch.Generator().manual_seed(0), len(COLOURS),
                                     np.random.default_rng(0))
    assert mosaics.shape == (6, 3, 32, 32) and targets.sum(1).tolist() == [4.0] * 6
    bundle = colour_bundle(size=32)  # a model taking 32 px mosaics of 16 px cells
    figures = grid_figures(bundle, cells, labels, n_mosaics=10, batch_size=4)
    assert figures["single_cell_accuracy"] == 1.0 and figures["quadrant_top4_recall"] == 1.0
    assert figures["quadrant_sensitivity_positive"] == 1.0


def test_torchrun_two_processes_write_the_gridpg_report_of_one(tiny_folder, tmp_path):
    """`torchrun --nproc-per-node 2 -m explainers gridpg` (gloo): the mosaics' batches are shared out and the
    gathered report equals one process's, per-mosaic scores, sensitivity and intervals included (random too:
    whole batches go to a process, so a batch holds the same mosaics as in one process)."""
    from conftest import cli_in_one_and_two_processes
    from conftest import same

    folder = tiny_folder
    a, b = cli_in_one_and_two_processes(
        tmp_path, "ddp-grid-vit", ["gridpg", "--model", "ddp-grid-vit", "--methods", "gradcam,rollout,random",
                                   "--data", str(folder), "--mosaics", "7", "--seed", "2", "--batch-size", "2",
                                   "--threads", "1"],  # 4 batches: 2 per process
        "ms_per_map")
    assert a["n_mosaics"] == 7 and len(a["methods"]["gradcam"]["per_mosaic"]) == 7
    assert len(a["model_quadrant_sensitivity"]["per_mosaic"]) == 7
    for method in ("gradcam", "rollout", "random"):
        assert np.allclose(a["methods"][method]["per_class"], b["methods"][method]["per_class"], atol=1e-6)
    # the maps are not all alike: the comparison has something to compare
    assert len({round(v, 6) for v in b["methods"]["gradcam"]["per_mosaic"]}) > 1
    same(a, b)  # everything else: the same report (floats to 1e-6)
