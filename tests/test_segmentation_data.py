"""BCCD masks from boxes (on synthetic smears the test draws), the prepared folder, and train-seg at toy size:
export, card, resume."""
import json

import numpy as np
import pytest
import torch

cv2 = pytest.importorskip("cv2")
pytest.importorskip("transformers")

from explainers.segmentation.bccd import IGNORE_INDEX, derive_mask, prepare, read_boxes  # noqa: E402

BACKGROUND = (225, 222, 215)


def smear(seed=0):
    """A pale background, two pink disks (one boxed, one not), a purple blob in a box and a small dark speck."""
    rng = np.random.default_rng(seed)
    image = np.full((120, 160, 3), BACKGROUND, np.uint8)
    cv2.circle(image, (40, 40), 18, (205, 120, 130), -1)
    cv2.circle(image, (40, 40), 6, (215, 170, 170), -1)  # a pale centre
    cv2.circle(image, (130, 90), 18, (205, 120, 130), -1)  # an unboxed cell
    cv2.ellipse(image, (100, 35), (14, 11), 0, 0, 360, (120, 60, 170), -1)
    cv2.circle(image, (60, 95), 4, (110, 50, 150), -1)
    noise = rng.integers(-4, 5, image.shape)
    image = np.clip(image.astype(int) + noise, 0, 255).astype(np.uint8)
    boxes = [("RBC", 20, 20, 60, 60), ("WBC", 82, 20, 118, 50), ("Platelets", 54, 89, 66, 101)]
    return image, boxes


def disk(center, radius, shape=(120, 160)):
    yy, xx = np.mgrid[:shape[0], :shape[1]]
    return (yy - center[1]) ** 2 + (xx - center[0]) ** 2 <= radius ** 2


def iou(a, b):
    return (a & b).sum() / (a | b).sum()


def test_masks_follow_the_cells_and_ignore_unboxed_ones():
    image, boxes = smear()
    mask = derive_mask(image, boxes)
    assert iou(mask == 1, disk((40, 40), 18)) > 0.8  # the pale centre belongs to the red cell
    assert (mask[disk((130, 90), 15)] == IGNORE_INDEX).mean() > 0.9  # unboxed: neither cell nor background
    assert (mask[80:110, 2:30] == 0).all()  # plain background stays background
    blob = np.zeros((120, 160), bool)
    cv2.ellipse(blob.view(np.uint8), (100, 35), (14, 11), 0, 0, 360, 1, -1)
    assert iou(mask == 2, blob) > 0.6
    assert (mask == 3).sum() > 10 and iou(mask == 3, disk((60, 95), 4)) > 0.4


def test_read_boxes_clips_and_skips(tmp_path):
    xml = tmp_path / "a.xml"
    xml.write_text("<annotation><size><width>100</width><height>80</height></size>"
                   "<object><name>RBC</name><bndbox><xmin>-5</xmin><ymin>10</ymin><xmax>30</xmax><ymax>90</ymax>"
                   "</bndbox></object><object><name>Dog</name><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>9</xmax>"
                   "<ymax>9</ymax></bndbox></object><object><name>WBC</name><bndbox><xmin>5</xmin><ymin>5</ymin>"
                   "<xmax>6</xmax><ymax>40</ymax></bndbox></object></annotation>")
    assert read_boxes(xml) == [("RBC", 0, 10, 30, 79)]


def write_bccd(root, count=6):
    """A BCCD-shaped folder of synthetic smears (JPEGImages, Annotations, ImageSets/Main)."""
    from PIL import Image

    for sub in ("JPEGImages", "Annotations", "ImageSets/Main"):
        (root / "BCCD" / sub).mkdir(parents=True, exist_ok=True)
    names = [f"Smear_{i:03d}" for i in range(count)]
    for i, name in enumerate(names):
        image, boxes = smear(i)
        Image.fromarray(image).save(root / "BCCD" / "JPEGImages" / f"{name}.jpg", quality=95)
        objects = "".join(f"<object><name>{c}</name><bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin><xmax>{x1}</xmax>"
                          f"<ymax>{y1}</ymax></bndbox></object>" for c, x0, y0, x1, y1 in boxes)
        (root / "BCCD" / "Annotations" / f"{name}.xml").write_text(
            f"<annotation><size><width>160</width><height>120</height></size>{objects}</annotation>")
    splits = {"train": names[:4], "val": names[4:5], "test": names[5:]}
    for split, members in splits.items():
        (root / "BCCD" / "ImageSets" / "Main" / f"{split}.txt").write_text("\n".join(members) + "\n")
    return names


def test_prepare_writes_a_compact_folder(tmp_path):
    write_bccd(tmp_path / "src")
    meta = prepare(tmp_path / "src", tmp_path / "prepared", size=(64, 48))
    assert meta["images"] == 6 and meta["rule_counts"]["WBC_grabcut"] + meta["rule_counts"]["WBC_ellipse"] == 6
    splits = json.loads((tmp_path / "prepared" / "splits.json").read_text())
    assert len(splits["train"]) == 4 and splits["test"] == ["Smear_005"]
    from PIL import Image

    mask = np.asarray(Image.open(tmp_path / "prepared" / "masks" / "Smear_000.png"))
    assert mask.shape == (48, 64) and set(np.unique(mask)) <= {0, 1, 2, 3, IGNORE_INDEX}
    boxes = json.loads((tmp_path / "prepared" / "boxes.json").read_text())
    assert boxes["Smear_000"][0] == ["RBC", 8.0, 8.0, 24.0, 24.0]


def test_train_seg_exports_a_loadable_model_and_resumes(tmp_path, monkeypatch):
    from explainers.segmentation import train as train_module
    from explainers.segmentation.model import load_segformer_bundle

    write_bccd(tmp_path / "src")
    prepare(tmp_path / "src", tmp_path / "data", size=(64, 64))
    tiny = dict(hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_attention_heads=[1, 2, 2, 4],
                decoder_hidden_size=16)
    original = train_module.segformer_config
    monkeypatch.setattr(train_module, "segformer_config", lambda **values: original(**{**values, **tiny}))
    options = dict(name="toy-seg", batch_size=2, crop=32, device="cpu", eval_every_s=0.5, work_dir=tmp_path / "work")
    card = train_module.train_segformer(tmp_path / "data", tmp_path / "out", budget_s=1.0, **options)
    assert card["kind"] == "segmentation" and set(card["test"]["iou"]) == {"background", "RBC", "WBC", "Platelets"}
    assert (tmp_path / "out" / "toy-seg.safetensors").exists() and card["training"]["steps"] >= 1
    steps = card["training"]["steps"]
    again = train_module.train_segformer(tmp_path / "data", tmp_path / "out",
                                         budget_s=card["training"]["train_seconds"] + 3.0, **options)
    assert again["training"]["steps"] > steps  # resumed from the checkpoint, not started over
    card["segformer_config"] = {**card["segformer_config"], **tiny}
    bundle = load_segformer_bundle("toy-seg", card, tmp_path / "out" / "toy-seg.safetensors")
    with torch.no_grad():
        assert bundle(torch.rand(1, 3, 64, 64)).shape == (1, 4, 64, 64)


def test_augmentation_keeps_images_and_masks_aligned():
    from explainers.segmentation.train import augment

    images = torch.zeros(2, 3, 40, 60, dtype=torch.uint8)
    masks = torch.zeros(2, 40, 60, dtype=torch.uint8)
    images[:, 0, 10:20, 10:30] = 255
    masks[:, 10:20, 10:30] = 1
    x, y = augment(images, masks, torch.Generator().manual_seed(0), crop=32)
    assert x.shape == (2, 3, 32, 32) and y.shape == (2, 32, 32)
    red = x[:, 0] > x[:, 1] + 0.3
    inside = y == 1
    assert (red == inside)[y != IGNORE_INDEX].float().mean() > 0.95
