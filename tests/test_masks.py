"""Masks: drawings, boxes (VOC), mask sets, SAM (tiny random-weight model) and the GrabCut fallback."""
from functools import partial

import numpy as np
import pytest
import torch
from PIL import Image

from explainers import masks as M
from explainers.decoy import build_decoy_bloodmnist, cell_mask


def blob_image(h=48, w=64, center=(24, 30), radius=10):
    ys, xs = np.mgrid[0:h, 0:w]
    inside = (ys - center[0]) ** 2 + (xs - center[1]) ** 2 <= radius ** 2
    image = np.full((h, w, 3), (235, 210, 200), np.uint8)
    image[inside] = (90, 40, 140)
    return image, inside


# ------------------------------------------------------------------ validation and drawings
def test_validate_refuses_empty_full_and_mismatched_masks():
    with pytest.raises(M.MaskError, match="empty"):
        M.validate_mask(np.zeros((8, 8)), (8, 8))
    with pytest.raises(M.MaskError, match="whole image"):
        M.validate_mask(np.ones((8, 8)), (8, 8))
    with pytest.raises(M.MaskError, match="4 x 8 .* but the image is 8 x 8"):
        M.validate_mask(np.eye(8)[:4], (8, 8))
    with pytest.raises(M.MaskError, match="2-D"):
        M.validate_mask(np.zeros((2, 3, 4, 5)))
    ok = M.validate_mask(np.eye(8), (8, 8))
    assert ok.dtype == bool and ok.sum() == 8


def test_drawing_from_editor_layers_any_size_is_resized_to_the_image():
    layer = np.zeros((20, 40, 4), np.uint8)  # drawn at half the image's size
    layer[5:10, 10:20, 3] = 255
    second = np.zeros((40, 80, 4), np.uint8)
    second[0:4, 0:4, 3] = 10
    value = {"background": np.zeros((40, 80, 3), np.uint8), "layers": [layer, second], "composite": None}
    result = M.mask_from_drawing(value, (40, 80))
    assert result.source == "drawing" and result.mask.shape == (40, 80)
    assert result.mask[10:20, 20:40].all() and result.mask[0:4, 0:4].all()
    assert result.mask.sum() == 10 * 20 + 16
    # a PIL RGBA layer and a plain 2-D array work too
    pil_layer = Image.fromarray(layer, "RGBA")
    assert M.mask_from_drawing(pil_layer, (40, 80)).mask.sum() == 200


@pytest.mark.parametrize("value", [None, {"background": None, "layers": [], "composite": None},
                                   {"layers": [np.zeros((8, 8, 4), np.uint8)]}])
def test_nothing_drawn_is_refused_clearly(value):
    with pytest.raises(M.MaskError, match="No mask drawn|empty"):
        M.mask_from_drawing(value, (8, 8))


def test_box_and_voc_boxes(tmp_path):
    xml = tmp_path / "a.xml"
    xml.write_text("""<annotation><size><width>64</width><height>48</height><depth>3</depth></size>
      <object><name>WBC</name><bndbox><xmin>11</xmin><ymin>5</ymin><xmax>30</xmax><ymax>20</ymax></bndbox></object>
      <object><name>RBC</name><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>4</xmax><ymax>4</ymax></bndbox></object>
    </annotation>""")
    size, boxes = M.read_voc_boxes(xml, classes=("WBC",))
    assert size == (64, 48) and boxes == [("WBC", (10.0, 4.0, 30.0, 20.0))]
    mask = M.boxes_to_mask([b for _, b in boxes], (48, 64))
    assert mask.sum() == 20 * 16 and mask[4, 10] and not mask[20, 30]
    assert M.mask_from_box((0, 0, 8, 8), (16, 16)).mask.sum() == 64
    with pytest.raises(M.MaskError, match="whole image"):
        M.mask_from_box((0, 0, 16, 16), (16, 16))


def test_bccd_mask_set_from_voc(tmp_path):
    root = tmp_path / "BCCD"
    (root / "Annotations").mkdir(parents=True)
    (root / "JPEGImages").mkdir()
    (root / "ImageSets" / "Main").mkdir(parents=True)
    image, _ = blob_image(120, 160, (60, 80), 20)
    Image.fromarray(image).save(root / "JPEGImages" / "img0.jpg")
    (root / "Annotations" / "img0.xml").write_text(
        "<annotation><size><width>160</width><height>120</height></size><object><name>WBC</name><bndbox>"
        "<xmin>61</xmin><ymin>41</ymin><xmax>100</xmax><ymax>80</ymax></bndbox></object></annotation>")
    (root / "ImageSets" / "Main" / "test.txt").write_text("img0\n")
    info = M.build_bccd_mask_set(tmp_path, tmp_path / "out", split="test", size=32)
    assert info["count"] == 1
    data = M.load_mask_set(tmp_path / "out")
    assert data.images.shape == (1, 3, 32, 32) and data.labels.tolist() == [-1]
    assert 0.1 < data.masks.float().mean() < 0.6


# ------------------------------------------------------------------ mask sets on disk
def test_mask_set_round_trip_and_refusals(tmp_path):
    image, inside = blob_image(16, 16, (8, 8), 4)
    M.write_mask_set(tmp_path / "set", [("a.jpg", image, inside, 2), ("b", image, ~inside, 1, "disk")])
    data = M.load_mask_set(tmp_path / "set")
    assert data.images.dtype == torch.uint8 and data.images.shape == (2, 3, 16, 16)
    assert torch.equal(data.masks[0], torch.from_numpy(inside)) and data.labels.tolist() == [2, 1]
    assert (tmp_path / "set" / "labels.csv").read_text().splitlines()[1] == "images/a.png,2"
    resized = M.load_mask_set(tmp_path / "set" / "masks.csv", image_hw=(32, 32))
    assert resized.images.shape == (2, 3, 32, 32) and resized.masks.shape == (2, 32, 32)
    # a mask of the wrong size on disk is refused with its file name
    Image.fromarray(np.zeros((8, 8), np.uint8) + 255 * np.eye(8, dtype=np.uint8)).save(tmp_path / "set/masks/b.png")
    with pytest.raises(M.MaskError, match="masks/b.png is 8 x 8"):
        M.load_mask_set(tmp_path / "set")
    with pytest.raises(M.MaskError, match="empty"):
        M.write_mask_set(tmp_path / "bad", [("c", image, np.zeros((16, 16), bool), 0)])
    with pytest.raises(FileNotFoundError, match="masks.csv"):
        M.load_mask_set(tmp_path / "nowhere")


def test_a_mask_sets_photo_is_read_upright_as_the_mask_was_drawn(tmp_path):
    """A user's mask set whose photo carries an EXIF rotation: the mask was drawn on the upright picture the app
    showed (load_image), so the set reads the photo upright too, not sideways under its mask."""
    image, inside = blob_image(24, 40, (12, 12), 6)  # upright: 24 x 40, the blob on the left
    M.write_mask_set(tmp_path / "set", [("a", image, inside, 1)])
    stored = Image.fromarray(image).transpose(Image.Transpose.ROTATE_90)  # stored turned; EXIF 6 turns it back
    exif = Image.Exif()
    exif[274] = 6
    stored.save(tmp_path / "set" / "images" / "a.jpg", exif=exif.tobytes(), quality=100)
    rows = (tmp_path / "set" / "masks.csv").read_text().replace("images/a.png", "images/a.jpg")
    (tmp_path / "set" / "masks.csv").write_text(rows)
    data = M.load_mask_set(tmp_path / "set")
    assert data.images.shape == (1, 3, 24, 40)
    picture = data.images[0].permute(1, 2, 0).numpy().astype(int)
    assert np.abs(picture[inside] - (90, 40, 140)).mean() < 20  # the blob lies under its mask (JPEG: on average)
    assert np.abs(picture[~inside] - (235, 210, 200)).mean() < 20


# ------------------------------------------------------------------ SAM with a tiny random-weight model
def tiny_sam(seed=0):
    from segment_anything.modeling import ImageEncoderViT, MaskDecoder, PromptEncoder, Sam, TwoWayTransformer

    torch.manual_seed(seed)
    image_size, patch, dim = 64, 16, 32
    sam = Sam(
        image_encoder=ImageEncoderViT(img_size=image_size, patch_size=patch, embed_dim=32, depth=1, num_heads=2,
                                      mlp_ratio=2.0, out_chans=dim, qkv_bias=True,
                                      norm_layer=partial(torch.nn.LayerNorm, eps=1e-6), use_rel_pos=True,
                                      window_size=0, global_attn_indexes=(0,)),
        prompt_encoder=PromptEncoder(embed_dim=dim, image_embedding_size=(image_size // patch,) * 2,
                                     input_image_size=(image_size, image_size), mask_in_chans=4),
        mask_decoder=MaskDecoder(num_multimask_outputs=3, transformer_dim=dim, iou_head_depth=1,
                                 iou_head_hidden_dim=16,
                                 transformer=TwoWayTransformer(depth=1, embedding_dim=dim, mlp_dim=32, num_heads=2)),
    )
    return sam.eval()


def test_sam_pipeline_embeds_once_and_reuses_it_for_every_click():
    sam = tiny_sam()
    calls = {"encoder": 0}
    original = sam.image_encoder.forward

    def counting(x):
        calls["encoder"] += 1
        return original(x)

    sam.image_encoder.forward = counting
    segmenter = M.SamSegmenter(sam, label="SAM (tiny test model)")
    cache = M.SegmenterCache(segmenter, max_sessions=2)
    image, _ = blob_image(48, 64)
    results = [
        cache.get(image, "s1").segment([[30, 24]], [1], validate=False),
        cache.get(image, "s1").segment([[30, 24], [2, 2]], [1, 0], validate=False),
        cache.get(image, "s1").segment(box=[15, 10, 45, 38], validate=False),
        cache.get(image, "s1").segment([[30, 24]], [1], box=[15, 10, 45, 38], multimask=False, validate=False),
    ]
    assert calls["encoder"] == 1 and segmenter.embeddings_computed == 1  # one embedding, four prompts
    for result in results:
        assert result.mask.shape == (48, 64) and result.mask.dtype == bool
        assert result.source == "SAM (tiny test model)" and not result.is_fallback
        assert isinstance(result.score, float)
    assert len(results[0].candidates) == 3 and len(results[3].candidates) == 1
    # another session, then a new image in s1: new embeddings; the LRU keeps at most 2 sessions
    cache.get(image, "s2")
    cache.get(image[::-1].copy(), "s1")
    cache.get(image, "s3")
    assert calls["encoder"] == 4 and len(cache) == 2
    with pytest.raises(M.MaskError, match="Click at least one point"):
        cache.get(image, "s3").segment()


class StubPredictor:
    """SAM's predictor with candidates chosen by the test: (masks, scores) as `SamPredictor.predict` returns."""

    def __init__(self, masks, scores):
        self.masks, self.scores = np.asarray(masks, dtype=bool), np.asarray(scores, dtype=np.float32)

    def predict(self, **_prompts):
        return self.masks, self.scores, None


def test_sam_result_validation_refuses_useless_masks():
    """Both outcomes, each forced: only an empty and a full candidate -> refused with what to do; a usable one
    among them -> it is returned, though an unusable candidate scored higher."""
    from types import SimpleNamespace

    segmenter = SimpleNamespace(label="SAM (stub)")
    empty, full = np.zeros((48, 64), dtype=bool), np.ones((48, 64), dtype=bool)
    _, blob = blob_image(48, 64)
    useless = M.SegmenterImage(segmenter, StubPredictor([empty, full], [0.9, 0.8]), np.zeros((48, 64, 3)), "a")
    with pytest.raises(M.MaskError, match="add object/background clicks or draw a box"):
        useless.segment([[30, 24]], [1])
    assert useless.segment([[30, 24]], [1], validate=False).score == pytest.approx(0.9)  # unvalidated: the best
    mixed = M.SegmenterImage(segmenter, StubPredictor([full, blob, empty], [0.95, 0.5, 0.9]), np.zeros((48, 64, 3)),
                             "b")
    result = mixed.segment([[30, 24]], [1])
    assert np.array_equal(result.mask, blob) and result.score == pytest.approx(0.5)
    assert result.source == "SAM (stub)" and len(result.candidates) == 3


def test_offline_loading_fails_fast_and_falls_back_to_grabcut(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(M.SamUnavailableError, match="could not be downloaded"):
        M.load_sam("vit_b", device="cpu", cache_dir=tmp_path)
    segmenter = M.get_segmenter("vit_b", device="cpu", cache_dir=tmp_path)
    assert isinstance(segmenter, M.GrabCutSegmenter) and "SAM ViT-B weights" in segmenter.reason
    image, truth = blob_image()
    assert M.segment(image, [[30, 24]], [1], segmenter=segmenter).source == M.GRABCUT_LABEL
    prepared = segmenter.prepare(image)
    for kwargs in ({"points": [[30, 24]], "point_labels": [1]},
                   {"box": [15, 10, 46, 39]},
                   {"points": [[30, 24], [60, 5]], "point_labels": [1, 0], "box": [15, 10, 46, 39]}):
        result = prepared.segment(**kwargs)
        assert result.source == "GrabCut (offline fallback, not SAM)" and result.is_fallback
        iou = (result.mask & truth).sum() / (result.mask | truth).sum()
        assert iou > 0.7, (kwargs, iou)


# ------------------------------------------------------------------ decoy BloodMNIST
def test_decoy_builder_places_class_squares_in_train_and_random_in_test(tmp_path):
    src = tmp_path / "blood"
    rng = np.random.default_rng(0)
    for split, count in (("train", 16), ("test", 8)):
        (src / split).mkdir(parents=True)
        lines = ["file,class_index"]
        for i in range(count):
            image, _ = blob_image(64, 64, (32 + rng.integers(-3, 4), 32 + rng.integers(-3, 4)), 14)
            Image.fromarray(image).save(src / split / f"{i}.jpg", quality=95)
            lines.append(f"{i}.jpg,{i % 8}")
        (src / split / "labels.csv").write_text("\n".join(lines) + "\n")
    summary = build_decoy_bloodmnist(src, tmp_path / "decoy", seed=0)
    assert set(summary["splits"]) == {"train", "test", "test-clean"}
    train = M.load_mask_set(tmp_path / "decoy" / "train")
    for image, mask, label in zip(train.images, train.masks, train.labels):
        from explainers.decoy import PALETTE, square_box
        y0, y1, x0, x1 = square_box(int(label) % 4, 64, 64, 6, 2)
        assert (image[:, y0:y1, x0:x1].permute(1, 2, 0) == torch.tensor(PALETTE[int(label)], dtype=torch.uint8)).all()
        assert not mask[y0:y1, x0:x1].any() and mask[32, 32]
    clean = M.load_mask_set(tmp_path / "decoy" / "test-clean")
    test = M.load_mask_set(tmp_path / "decoy" / "test")
    assert torch.equal(clean.labels, test.labels) and not torch.equal(clean.images, test.images)
    # the classical segmentation finds the blob (the mask is its hull plus a margin)
    image, truth = blob_image(64, 64, (32, 32), 14)
    mask, source = cell_mask(image)
    assert source == "segment" and mask[truth].mean() > 0.98 and mask.sum() < truth.sum() * 1.6
