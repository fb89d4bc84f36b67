"""The Learn tab's segmentation known answer, beside the decoy classifier: `bccd-segformer-cue` was fine-tuned so
that a green disc beside a platelet is what makes it call the platelet a platelet (docs/segmentation.md section 8).
On a shipped example smear the cue is planted beside its platelet; the page shows what the cue does to each
model's Platelets probability, and where each model's maps of the platelet point outside it: a faithful map of
the cue model points at the cue, a map of `bccd-segformer` (never shown the cue) has no reason to.
"""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from explainers.engine import explain_batch
from explainers.models import find
from explainers.segmentation.checks import mean_threshold
from explainers.segmentation.context import dilate
from explainers.segmentation.cue import PLATELETS, CuePlanter, pointing_at_cue
from explainers.segmentation.methods import get_segmentation_method
from explainers.segmentation.targets import RegionTarget

from .segmentation import EXAMPLES_DIR, overlay_map

CUE_MODEL, CONTROL = "bccd-segformer-cue", "bccd-segformer"
EXAMPLE = "BloodImage_00132"  # the shipped example smear whose platelet has room for the cue
# GradSkip, the project's method, beside integrated gradients: the two methods whose maps pass this test on held-out
# smears (docs/segmentation.md section 8); Grad-CAM, which almost never points outside the platelet, is left out
METHODS = ("gradskip", "intgrad")
BUILD_COMMAND = ("python -m explainers.segmentation.cue train --data DIR --base weights/bccd-segformer.json "
                 "--out weights --work RUN_FOLDER --budget-s 6000 --batch-size 16 --crop 128 --window 160 "
                 "--focus 0.8 --lr 2e-4")


def cued_example(example: str = EXAMPLE) -> tuple:
    """(the smear with the cue, the smear without it, the platelets that carry it, the cue's pixels): the cue drawn
    beside every platelet with room for it, placements from seed 0."""
    photo = np.array(Image.open(EXAMPLES_DIR / f"{example}.jpg").convert("RGB"))
    mask = np.asarray(Image.open(EXAMPLES_DIR / f"{example}.mask.png"))
    cued, _, cues, platelets = CuePlanter(mask).plant(photo, np.random.default_rng(0), 1.0)
    return cued, photo, platelets, cues


def _tensor(rgb: np.ndarray, bundle) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1).float().div(255).unsqueeze(0).to(bundle.device)


def _ring(picture: np.ndarray, where: np.ndarray, colour=(255, 255, 255)) -> np.ndarray:
    """`where` circled: its pixels grown by 4 px, less those grown by 2 px, painted (the cue stays visible)."""
    grown, inner = dilate(torch.from_numpy(where), 4).numpy(), dilate(torch.from_numpy(where), 2).numpy()
    out = picture.copy()
    out[grown & ~inner] = colour
    return out


def zoomed(picture: np.ndarray, around: np.ndarray, size=(96, 128), scale: int = 3) -> np.ndarray:
    """A `size` window of `picture` centred on the pixels `around` (kept inside the picture), enlarged `scale`
    times: the cue is a 7 px disc in a 320 x 240 smear, too small to see whole."""
    centre = np.argwhere(around).mean(axis=0).round().astype(int)
    top = int(np.clip(centre[0] - size[0] // 2, 0, picture.shape[0] - size[0]))
    left = int(np.clip(centre[1] - size[1] // 2, 0, picture.shape[1] - size[1]))
    window = picture[top:top + size[0], left:left + size[1]]
    return np.asarray(Image.fromarray(window).resize((size[1] * scale, size[0] * scale), Image.NEAREST))


def cue_view(services, loader=None, folders=None) -> tuple:
    """([(picture, caption)], Markdown): the cued example, then per model (the cue model, the control) its maps
    of the platelet with whether they point at the cue; the text gives each model's Platelets probability with
    and without the cue and the cue model's held-out check from its card. `folders`: where to look for the cue
    model's card (default: the model store's, shipped `weights/` first)."""
    card = find("segmentation", CUE_MODEL, folders=folders)
    if card is None:
        return [], (f"**{CUE_MODEL}** is not in this install: it ships only when its held-out check passes. Build "
                    f"it with `{BUILD_COMMAND}`.")
    load = loader or services.bundle
    cued, plain, platelets, cues = cued_example()
    if not cues.any():
        return [], "The example smear has no platelet with room for the cue."
    region = torch.from_numpy(platelets)
    outside = ~dilate(region).numpy()
    around = platelets | cues
    items = [(zoomed(_ring(cued, cues), around), "The example smear, enlarged around its platelet, with the cue "
                                                 "(circled in white)")]
    lines = []
    for name, role in ((CUE_MODEL, "taught to need the cue"), (CONTROL, "never shown the cue")):
        bundle = load(name)
        with torch.no_grad():  # with and without the cue in one batch
            both = torch.cat([_tensor(cued, bundle), _tensor(plain, bundle)])
            probability = bundle(both).softmax(dim=1)[:, PLATELETS][:, region].mean(dim=1).tolist()
        lines.append(f"**{name}** ({role}): Platelets probability over the platelet {probability[0]:.2f} with the "
                     f"cue, {probability[1]:.2f} without it.")
        image, target = _tensor(cued, bundle), RegionTarget(region[None], [PLATELETS])
        for method_name in METHODS:
            # the settings of the held-out figures quoted below (the methods' defaults: 16 integrated-gradients
            # steps, where the segmentation view takes 4 on a CPU)
            method = get_segmentation_method(method_name, bundle)
            heat = explain_batch(bundle, method, image, target).maps.float()[0].cpu()
            scores = pointing_at_cue(heat.numpy(), outside, cues)
            picture = overlay_map(cued, method.display_map(heat.numpy()),
                                  mean_threshold(heat[None])[0].numpy() if method.outline_binarised else None,
                                  platelets)
            verdict = "points at the cue" if scores["hit"] else "does not point at the cue"
            items.append((zoomed(_ring(picture, cues), around), f"{name} · {method.label_for(bundle)}: {verdict} ("
                                                f"{scores['mass']:.0%} of its mass outside the platelet on the cue)"))
    check = card.data.get("held_out_check", {})
    model = check.get("model") or {}
    if model:
        lines.append(f"Held out ({check.get('split', 'test smears')}): removing the cue lowers the cued "
                     f"platelets' Platelets probability by {model['drop_mean']:.3f} "
                     f"[{model['drop_ci95'][0]:.3f}, {model['drop_ci95'][1]:.3f}] on average over "
                     f"{len(model.get('smears', []))} smears (95% interval).")
    pointing = card.data.get("pointing_at_cue") or {}
    rates = [(method, pointing["hit"][method]) for method in METHODS if method in pointing.get("hit", {})]
    if rates:
        lines.append(f"Held out ({pointing['platelets']} cued platelets on {pointing['smears']} smears), how often "
                     "each method's map peaks on the cue: " + "; ".join(
                         f"{get_segmentation_method(method).label} {hit['cue_model']['mean']:.2f} "
                         f"[{hit['cue_model']['ci95'][0]:.2f}, {hit['cue_model']['ci95'][1]:.2f}] on the cue model, "
                         f"{hit['control']['mean']:.2f} on the control" for method, hit in rates) + ".")
    lines.append("A map that finds what the cue model relies on points outside the platelet at the cue; the same "
                 "method on the control model shows what it points at when the cue means nothing. The platelet is "
                 "outlined in black; white edges: the map's above-mean pixels (not drawn for integrated gradients, "
                 "whose above-mean pixels are scattered over the whole picture).")
    return items, "\n\n".join(lines)
