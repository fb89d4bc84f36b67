"""Tests for explainers/images.py: loading, geometry, mapping back, colour maps, overlays."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import png_header_only

from explainers.images import (
    COLORMAPS,
    ImageError,
    colorize,
    compute_geometry,
    image_to_uint8,
    load_image,
    map_to_original,
    overlay,
    prepare_for_model,
    prepare_image,
    to_pil,
)


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
def _gradient_rgb(width=64, height=48) -> np.ndarray:
    xs = np.linspace(0, 255, width, dtype=np.float32)[None, :].repeat(height, 0)
    ys = np.linspace(0, 255, height, dtype=np.float32)[:, None].repeat(width, 1)
    return np.stack([xs, ys, 255 - xs], axis=2).round().astype(np.uint8)


def _assert_rgb(image, size):
    assert image.mode == "RGB" and image.size == size
    assert np.asarray(image).shape == (size[1], size[0], 3) and np.asarray(image).dtype == np.uint8


# ------------------------------------------------------------------------------------------------
# load_image: formats and modes
# ------------------------------------------------------------------------------------------------
def test_png_rgb_roundtrip_from_path_str_bytes_and_file(tmp_path):
    pixels = _gradient_rgb()
    path = tmp_path / "gradient.png"
    Image.fromarray(pixels).save(path)
    for source in (path, str(path), path.read_bytes(), io.BytesIO(path.read_bytes())):
        image = load_image(source)
        _assert_rgb(image, (64, 48))
        np.testing.assert_array_equal(np.asarray(image), pixels)
    with open(path, "rb") as handle:
        np.testing.assert_array_equal(np.asarray(load_image(handle)), pixels)


def test_jpeg(tmp_path):
    pixels = np.full((32, 40, 3), (200, 40, 90), dtype=np.uint8)
    path = tmp_path / "flat.jpg"
    Image.fromarray(pixels).save(path, quality=95)
    image = load_image(path)
    _assert_rgb(image, (40, 32))
    assert np.abs(np.asarray(image).astype(int) - pixels).max() <= 6


def test_bmp(tmp_path):
    pixels = _gradient_rgb(20, 12)
    path = tmp_path / "gradient.bmp"
    Image.fromarray(pixels).save(path)
    np.testing.assert_array_equal(np.asarray(load_image(path)), pixels)


def test_tiff_16bit_grayscale_is_scaled_by_257(tmp_path):
    values = np.array([0, 257, 1000, 32768, 65535, 12850, 514, 65000], dtype=np.uint16)
    data = np.tile(values, (8, 2))  # 8 x 16
    path = tmp_path / "deep.tif"
    Image.fromarray(data).save(path)
    with Image.open(path) as raw:
        assert raw.mode == "I;16"  # the test really exercises the 16-bit path
    image = load_image(path)
    _assert_rgb(image, (16, 8))
    result = np.asarray(image)
    expected = np.round(data / 257.0).astype(np.uint8)
    for channel in range(3):
        np.testing.assert_array_equal(result[:, :, channel], expected)
    assert result[0, 4, 0] == 255 and result[0, 0, 0] == 0 and result[0, 1, 0] == 1


def test_png_16bit_grayscale(tmp_path):
    data = np.full((10, 10), 65535, dtype=np.uint16)
    data[:5] = 25700  # -> 100
    path = tmp_path / "deep.png"
    Image.fromarray(data).save(path)
    result = np.asarray(load_image(path))
    assert result[0, 0].tolist() == [100, 100, 100]
    assert result[9, 9].tolist() == [255, 255, 255]


def test_float_tiff_in_unit_range(tmp_path):
    data = np.linspace(0, 1, 100, dtype=np.float32).reshape(10, 10)
    path = tmp_path / "float.tif"
    Image.fromarray(data).save(path)
    result = np.asarray(load_image(path))[:, :, 0]
    np.testing.assert_array_equal(result, np.round(data * 255).astype(np.uint8))


def test_grayscale_l_and_bilevel(tmp_path):
    gray = np.arange(100, dtype=np.uint8).reshape(10, 10) * 2
    path = tmp_path / "gray.png"
    Image.fromarray(gray, "L").save(path)
    result = np.asarray(load_image(path))
    assert result.shape == (10, 10, 3)
    for channel in range(3):
        np.testing.assert_array_equal(result[:, :, channel], gray)

    bilevel = Image.new("1", (12, 9), 0)
    bilevel.putpixel((3, 4), 1)
    path = tmp_path / "bilevel.png"
    bilevel.save(path)
    result = np.asarray(load_image(path))
    assert result[4, 3].tolist() == [255, 255, 255]
    assert result[0, 0].tolist() == [0, 0, 0]


def test_rgba_is_composited_over_white(tmp_path):
    rgba = np.zeros((10, 10, 4), dtype=np.uint8)
    rgba[..., 0] = 255  # red
    rgba[:5, :, 3] = 255  # top half opaque
    rgba[5:, :, 3] = 0  # bottom half fully transparent
    rgba[9, 9, 3] = 128  # one half-transparent pixel
    path = tmp_path / "alpha.png"
    Image.fromarray(rgba, "RGBA").save(path)
    result = np.asarray(load_image(path)).astype(int)
    assert result[0, 0].tolist() == [255, 0, 0]
    assert result[7, 2].tolist() == [255, 255, 255]
    red, green, blue = result[9, 9]
    assert red == 255 and abs(green - 127) <= 1 and abs(blue - 127) <= 1


def test_la_is_composited_over_white(tmp_path):
    la = Image.new("LA", (10, 10), (0, 0))
    la.putpixel((1, 1), (0, 255))
    path = tmp_path / "la.png"
    la.save(path)
    result = np.asarray(load_image(path))
    assert result[1, 1].tolist() == [0, 0, 0]
    assert result[5, 5].tolist() == [255, 255, 255]


def test_palette_with_and_without_transparency(tmp_path):
    palette_image = Image.new("P", (10, 10), 0)
    palette_image.putpalette([0, 0, 255, 0, 255, 0] + [0] * (256 * 3 - 6))
    palette_image.putpixel((2, 3), 1)
    path = tmp_path / "palette.png"
    palette_image.save(path)
    result = np.asarray(load_image(path))
    assert result[0, 0].tolist() == [0, 0, 255]
    assert result[3, 2].tolist() == [0, 255, 0]

    path = tmp_path / "palette_transparent.png"
    palette_image.save(path, transparency=0)  # entry 0 (blue) transparent
    result = np.asarray(load_image(path))
    assert result[0, 0].tolist() == [255, 255, 255]
    assert result[3, 2].tolist() == [0, 255, 0]


def test_animated_gif_gives_first_frame(tmp_path):
    frames = [Image.new("RGB", (16, 16), colour) for colour in ((255, 0, 0), (0, 0, 255))]
    path = tmp_path / "anim.gif"
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=100, loop=0)
    result = np.asarray(load_image(path))
    assert result[8, 8].tolist() == [255, 0, 0]


def test_cmyk_jpeg(tmp_path):
    cmyk = Image.new("CMYK", (16, 16), (0, 0, 0, 0))  # white
    for x in range(8):
        for y in range(16):
            cmyk.putpixel((x, y), (255, 0, 0, 0))  # cyan on the left half
    path = tmp_path / "cmyk.jpg"
    cmyk.save(path, quality=95)
    with Image.open(path) as raw:
        assert raw.mode == "CMYK"
    result = np.asarray(load_image(path)).astype(int)
    assert result.shape == (16, 16, 3)
    assert np.abs(result[8, 2] - [0, 255, 255]).max() <= 12
    assert np.abs(result[8, 13] - [255, 255, 255]).max() <= 12


def test_exif_orientation_is_applied(tmp_path):
    stored = np.zeros((20, 40, 3), dtype=np.uint8)  # stored landscape: 40 wide, 20 high
    stored[:6, :6] = (255, 0, 0)  # red block top-left as stored
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    path = tmp_path / "rotated.jpg"
    Image.fromarray(stored).save(path, exif=exif, quality=95)
    image = load_image(path)
    assert image.size == (20, 40)  # transposed
    result = np.asarray(image).astype(int)
    # Clockwise rotation moves the stored top-left corner to the displayed top-right corner.
    assert result[2, 17, 0] > 200 and result[2, 17, 1] < 60
    assert result[2, 2, 0] < 60


# ------------------------------------------------------------------------------------------------
# load_image: other sources
# ------------------------------------------------------------------------------------------------
def test_numpy_sources():
    rgb = _gradient_rgb(16, 12)
    np.testing.assert_array_equal(np.asarray(load_image(rgb)), rgb)

    gray = np.arange(144, dtype=np.uint8).reshape(12, 12)
    np.testing.assert_array_equal(np.asarray(load_image(gray))[:, :, 1], gray)

    deep = np.full((10, 10, 3), 257 * 7, dtype=np.uint16)
    assert np.asarray(load_image(deep))[0, 0].tolist() == [7, 7, 7]

    unit = np.full((10, 10, 3), 0.5, dtype=np.float32)
    assert np.asarray(load_image(unit))[0, 0].tolist() == [128, 128, 128]

    rgba = np.zeros((10, 10, 4), dtype=np.uint8)
    rgba[:, :5] = (0, 0, 0, 255)
    result = np.asarray(load_image(rgba))
    assert result[0, 0].tolist() == [0, 0, 0] and result[0, 9].tolist() == [255, 255, 255]

    with pytest.raises(ImageError, match="shape"):
        load_image(np.zeros((10, 10, 5), dtype=np.uint8))
    with pytest.raises(ImageError, match="NaN"):
        load_image(np.full((10, 10), np.nan, dtype=np.float32))


def test_pil_sources_are_copied_and_converted():
    source = Image.new("RGBA", (12, 10), (10, 20, 30, 255))
    image = load_image(source)
    _assert_rgb(image, (12, 10))
    assert image.getpixel((0, 0)) == (10, 20, 30)
    source.putpixel((0, 0), (200, 200, 200, 255))  # the caller's picture changes later: the loaded one must not
    assert image.getpixel((0, 0)) == (10, 20, 30)
    rgb = Image.new("RGB", (12, 10), (1, 2, 3))
    loaded = load_image(rgb)
    loaded.putpixel((0, 0), (9, 9, 9))  # and the other way round: drawing on the loaded copy leaves the source
    assert rgb.getpixel((0, 0)) == (1, 2, 3) and loaded.getpixel((1, 1)) == (1, 2, 3)


# ------------------------------------------------------------------------------------------------
# load_image: refusals
# ------------------------------------------------------------------------------------------------
def test_random_bytes_are_refused():
    noise = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    with pytest.raises(ImageError, match="not a readable image"):
        load_image(noise)


def test_truncated_png_is_refused(tmp_path):
    noise = np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(noise).save(buffer, "PNG")
    data = buffer.getvalue()
    path = tmp_path / "truncated.png"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageError, match="truncated.png is not a readable image"):
        load_image(path)


def test_text_file_is_refused(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("this is not an image\n" * 20)
    with pytest.raises(ImageError, match="notes.txt is not a readable image"):
        load_image(path)


def test_missing_and_empty_and_wrong_type(tmp_path):
    with pytest.raises(ImageError, match="does not exist"):
        load_image(tmp_path / "missing.png")
    with pytest.raises(ImageError, match="not a file"):
        load_image(tmp_path)
    with pytest.raises(ImageError, match="empty"):
        load_image(b"")
    with pytest.raises(ImageError, match="No image"):
        load_image(None)
    with pytest.raises(ImageError):
        load_image(12345)


def test_oversized_file_is_refused(tmp_path):
    path = tmp_path / "big.png"
    Image.fromarray(_gradient_rgb()).save(path)
    data = path.read_bytes()
    limit = len(data) - 1
    for source in (path, data, io.BytesIO(data)):
        with pytest.raises(ImageError, match="too large"):
            load_image(source, max_bytes=limit)
    assert load_image(path, max_bytes=len(data)).size == (64, 48)


def test_too_many_pixels_is_refused_before_decoding(tmp_path):
    path = tmp_path / "wide.png"
    Image.fromarray(_gradient_rgb(100, 100)).save(path)
    with pytest.raises(ImageError, match="too large"):
        load_image(path, max_pixels=5_000)
    assert load_image(path, max_pixels=10_000).size == (100, 100)
    with pytest.raises(ImageError, match="too large"):
        load_image(_gradient_rgb(100, 100), max_pixels=5_000)


def test_decompression_bomb_header_is_refused_without_decoding():
    before = Image.MAX_IMAGE_PIXELS
    bomb = png_header_only(30_000, 30_000)  # 900 M pixels claimed in a few dozen bytes
    assert len(bomb) < 200
    with pytest.raises(ImageError, match="too large"):
        load_image(bomb)  # default max_pixels and PIL's own bomb check both refuse it
    moderate = png_header_only(9_000, 9_000)  # 81 M pixels: under PIL's limit, over ours
    with pytest.raises(ImageError, match="too large"):
        load_image(moderate)
    assert Image.MAX_IMAGE_PIXELS == before


@pytest.mark.filterwarnings("error::PIL.Image.DecompressionBombWarning")
def test_decompression_bomb_warning_raised_as_error_is_converted():
    # 100 M pixels: above PIL's warning threshold (~89 M), below its hard error (~179 M).
    with pytest.raises(ImageError, match="too large"):
        load_image(png_header_only(10_000, 10_000), max_pixels=200_000_000)


def test_too_small_image_is_refused():
    with pytest.raises(ImageError, match="too small"):
        load_image(np.zeros((4, 4, 3), dtype=np.uint8))
    buffer = io.BytesIO()
    Image.new("RGB", (7, 30)).save(buffer, "PNG")
    with pytest.raises(ImageError, match="too small"):
        load_image(buffer.getvalue())
    assert load_image(np.zeros((8, 8, 3), dtype=np.uint8)).size == (8, 8)


def test_image_error_is_a_value_error():
    assert issubclass(ImageError, ValueError)


# ------------------------------------------------------------------------------------------------
# prepare_image and geometry
# ------------------------------------------------------------------------------------------------
def _timm_reference(image, input_size, crop_pct, interpolation):
    timm_transforms = pytest.importorskip("timm.data.transforms_factory")
    transform = timm_transforms.transforms_imagenet_eval(
        img_size=input_size, crop_pct=crop_pct, interpolation=interpolation, mean=(0, 0, 0), std=(1, 1, 1))
    return transform(image).unsqueeze(0)


def test_prepare_square_original_crop_pct_0875():
    image = Image.fromarray(_gradient_rgb(300, 300))
    tensor, geometry = prepare_image(image, (224, 224), crop_pct=0.875, interpolation="bicubic")
    assert tensor.shape == (1, 3, 224, 224) and tensor.dtype == torch.float32
    assert 0.0 <= tensor.min().item() and tensor.max().item() <= 1.0
    assert geometry.original_size == (300, 300)
    assert geometry.resized_size == (256, 256)
    assert geometry.input_size == (224, 224)
    scale = 300 / 256
    np.testing.assert_allclose(geometry.crop_box, (16 * scale, 16 * scale, 240 * scale, 240 * scale))
    reference = _timm_reference(image, 224, 0.875, "bicubic")
    torch.testing.assert_close(tensor, reference, atol=1e-6, rtol=0)


def test_prepare_landscape_original_crop_pct_1():
    image = Image.fromarray(_gradient_rgb(400, 200))
    tensor, geometry = prepare_image(image, (224, 224), crop_pct=1.0, interpolation="bilinear")
    assert tensor.shape == (1, 3, 224, 224)
    assert geometry.resized_size == (448, 224)
    np.testing.assert_allclose(geometry.crop_box, (100.0, 0.0, 300.0, 200.0))
    torch.testing.assert_close(tensor, _timm_reference(image, 224, 1.0, "bilinear"), atol=1e-6, rtol=0)


def test_prepare_portrait_original_crop_pct_0875():
    image = Image.fromarray(_gradient_rgb(150, 333))
    tensor, geometry = prepare_image(image, 224, crop_pct=0.875)
    assert tensor.shape == (1, 3, 224, 224)
    assert geometry.resized_size == (256, int(256 * 333 / 150))
    left, top, right, bottom = geometry.crop_box
    assert 0 < left < right < 150 and 0 < top < bottom < 333
    np.testing.assert_allclose((right - left) / (bottom - top), 1.0, atol=0.01)
    torch.testing.assert_close(tensor, _timm_reference(image, 224, 0.875, "bicubic"), atol=1e-6, rtol=0)


def test_prepare_non_square_input_size():
    image = Image.fromarray(_gradient_rgb(300, 300))
    tensor, geometry = prepare_image(image, (192, 256), crop_pct=1.0)
    assert tensor.shape == (1, 3, 192, 256)
    assert geometry.resized_size == (256, 256)  # both sides cover the 192 x 256 target
    np.testing.assert_allclose(geometry.crop_box, (0.0, 32 * 300 / 256, 300.0, 224 * 300 / 256))
    torch.testing.assert_close(tensor, _timm_reference(image, (192, 256), 1.0, "bicubic"), atol=1e-6, rtol=0)


def test_prepare_identity_when_sizes_match():
    pixels = _gradient_rgb(32, 32)
    tensor, geometry = prepare_image(Image.fromarray(pixels), (32, 32), crop_pct=1.0)
    assert geometry.crop_box == (0.0, 0.0, 32.0, 32.0)
    np.testing.assert_array_equal(image_to_uint8(tensor[0]), pixels)


def test_prepare_for_model_reads_the_bundle():
    class FakeBundle:
        input_size = (64, 64)
        crop_pct = 0.875
        interpolation = "bilinear"

    image = Image.fromarray(_gradient_rgb(100, 80))
    tensor, geometry = prepare_for_model(image, FakeBundle())
    expected_tensor, expected_geometry = prepare_image(image, (64, 64), 0.875, "bilinear")
    assert geometry == expected_geometry
    torch.testing.assert_close(tensor, expected_tensor)
    assert geometry.resized_size == (int(73 * 100 / 80), 73)  # floor(64 / 0.875) = 73


def test_prepare_rejects_bad_arguments():
    image = Image.fromarray(_gradient_rgb(40, 40))
    with pytest.raises(ImageError, match="interpolation"):
        prepare_image(image, 32, interpolation="cubic-ish")
    with pytest.raises(ImageError, match="crop_pct"):
        prepare_image(image, 32, crop_pct=0)
    with pytest.raises(ImageError, match="input_size"):
        prepare_image(image, (0, 32))


def test_compute_geometry_crop_box_stays_inside_image():
    for size in ((8, 8), (9, 1000), (1000, 9), (224, 224), (640, 480), (333, 777)):
        for input_size in ((224, 224), (384, 384), (192, 256)):
            for crop_pct in (0.875, 0.9, 0.95, 1.0):
                geometry = compute_geometry(size, input_size, crop_pct)
                left, top, right, bottom = geometry.crop_box
                assert -1e-9 <= left < right <= size[0] + 1e-9
                assert -1e-9 <= top < bottom <= size[1] + 1e-9


# ------------------------------------------------------------------------------------------------
# map_to_original
# ------------------------------------------------------------------------------------------------
def test_map_to_original_quadrant_lands_in_matching_quadrant_of_crop_box():
    geometry = compute_geometry((400, 200), (224, 224), 1.0)  # crop box (100, 0, 300, 200)
    attribution = np.zeros((224, 224), dtype=np.float32)
    attribution[:112, :112] = 1.0  # top-left quadrant of the model input
    result = map_to_original(attribution, geometry)
    assert result.shape == (200, 400) and result.dtype == np.float32
    assert np.all(result[:, :100] == 0) and np.all(result[:, 300:] == 0)  # outside the crop box
    assert np.all(result[2:98, 102:198] == 1.0)  # inside the matching quadrant, away from edges
    assert np.all(result[102:, 100:300] == 0)  # bottom half of the crop box
    assert np.all(result[:, 202:300] == 0)  # right half of the crop box
    assert abs(result.sum() - 100 * 100) < 150  # the quadrant's area, up to edge blur


def test_map_to_original_with_crop_pct_and_tensor_input():
    image = Image.fromarray(_gradient_rgb(320, 240))
    tensor, geometry = prepare_image(image, (224, 224), crop_pct=0.875)
    attribution = torch.zeros(1, 224, 224)
    attribution[0, 112:, 112:] = 1.0  # bottom-right quadrant
    result = map_to_original(attribution, geometry)
    assert result.shape == (240, 320)
    left, top, right, bottom = geometry.crop_box
    mid_x, mid_y = (left + right) / 2, (top + bottom) / 2
    ys, xs = np.nonzero(result > 0.5)
    assert xs.min() >= mid_x - 1 and xs.max() <= right and ys.min() >= mid_y - 1 and ys.max() <= bottom
    assert result[int(mid_y) + 5: int(bottom) - 2, int(mid_x) + 5: int(right) - 2].min() == pytest.approx(1.0)
    assert result[: int(top), :].max(initial=0) == 0 and result[:, : int(left)].max(initial=0) == 0


def test_map_to_original_identity_and_coarse_grid():
    geometry = compute_geometry((32, 32), (32, 32), 1.0)
    attribution = np.random.default_rng(2).random((32, 32)).astype(np.float32)
    np.testing.assert_allclose(map_to_original(attribution, geometry), attribution, atol=1e-6)

    coarse = np.zeros((2, 2), dtype=np.float32)
    coarse[0, 0] = 1.0
    result = map_to_original(coarse, compute_geometry((64, 64), (32, 32), 1.0))
    assert result.shape == (64, 64)
    assert result[0, 0] == 1.0 and result[63, 63] == 0.0
    assert np.isfinite(result).all()


def test_map_to_original_rejects_bad_shapes_and_clears_nan():
    geometry = compute_geometry((50, 50), (32, 32), 1.0)
    with pytest.raises(ImageError):
        map_to_original(np.zeros((3, 32, 32)), geometry)
    attribution = np.full((32, 32), np.nan, dtype=np.float32)
    assert np.all(map_to_original(attribution, geometry) == 0)


# ------------------------------------------------------------------------------------------------
# colorize / overlay / tensors
# ------------------------------------------------------------------------------------------------
def test_colorize_shapes_and_endpoints():
    ramp = np.linspace(-3, 5, 256, dtype=np.float32).reshape(16, 16)
    for name in COLORMAPS:
        colours = colorize(ramp, name)
        assert colours.shape == (16, 16, 3) and colours.dtype == np.uint8
    cividis = colorize(ramp, "cividis")
    assert cividis[0, 0].tolist() == [0, 34, 78]
    assert cividis[-1, -1].tolist() == [254, 232, 56]
    gray = colorize(ramp, "gray")
    assert gray[0, 0].tolist() == [0, 0, 0] and gray[-1, -1].tolist() == [255, 255, 255]
    assert gray.reshape(-1, 3)[:, 0].tolist() == list(range(256))
    viridis = colorize(torch.from_numpy(ramp), "viridis")
    assert viridis[0, 0].tolist() == [68, 1, 84] and viridis[-1, -1].tolist() == [253, 231, 37]
    with pytest.raises(ImageError, match="colour map"):
        colorize(ramp, "jet")


def test_colour_maps_are_monotonic_in_luminance():
    ramp = np.arange(256, dtype=np.float32).reshape(1, 256)
    for name in ("cividis", "viridis"):
        lut = colorize(ramp, name)[0].astype(np.float64)
        luminance = lut @ np.array([0.2126, 0.7152, 0.0722])
        assert np.all(np.diff(luminance) > -1.0), name


def test_colour_maps_match_matplotlib_when_available():
    matplotlib = pytest.importorskip("matplotlib")
    ramp = np.arange(256, dtype=np.float32).reshape(1, 256)
    for name in ("cividis", "viridis"):
        ours = colorize(ramp, name)[0].astype(int)
        theirs = np.round(matplotlib.colormaps[name](np.arange(256) / 255.0)[:, :3] * 255).astype(int)
        assert np.abs(ours - theirs).max() <= 3, name


def test_colorize_constant_and_non_finite_maps():
    for value in (0.0, 1.0, -7.5):
        colours = colorize(np.full((9, 11), value), "cividis")
        assert colours.shape == (9, 11, 3)
        assert np.all(colours == colours[0, 0])
    nan_map = np.full((9, 9), np.nan)
    assert colorize(nan_map).shape == (9, 9, 3)
    partial = np.zeros((9, 9))
    partial[0, 0] = np.inf
    partial[1, 1] = 1.0
    colours = colorize(partial, "gray")
    assert colours[1, 1].tolist() == [255, 255, 255] and colours[0, 0].tolist() == [0, 0, 0]


def test_overlay_shapes_and_opacity_extremes():
    pixels = _gradient_rgb(40, 30)
    image = Image.fromarray(pixels)
    attribution = np.random.default_rng(3).random((30, 40))
    for source in (image, pixels):
        result = overlay(source, attribution, opacity=0.5)
        _assert_rgb(result, (40, 30))
        np.testing.assert_array_equal(np.asarray(overlay(source, attribution, opacity=0.0)), pixels)
        np.testing.assert_array_equal(np.asarray(overlay(source, attribution, opacity=1.0, colormap="viridis")),
                                      colorize(attribution, "viridis"))
    half = np.asarray(overlay(image, attribution, opacity=0.5)).astype(int)
    expected = np.round((pixels.astype(float) + colorize(attribution).astype(float)) / 2)
    assert np.abs(half - expected).max() <= 1
    constant = overlay(image, np.ones((30, 40)), opacity=0.3)
    _assert_rgb(constant, (40, 30))


def test_overlay_refusals():
    image = Image.fromarray(_gradient_rgb(40, 30))
    with pytest.raises(ImageError, match="map"):
        overlay(image, np.zeros((30, 41)))
    with pytest.raises(ImageError, match="opacity"):
        overlay(image, np.zeros((30, 40)), opacity=1.5)
    with pytest.raises(ImageError):
        overlay(np.zeros((30, 40), dtype=np.uint8), np.zeros((30, 40)))


def test_image_to_uint8_and_to_pil():
    tensor = torch.zeros(3, 4, 5)
    tensor[0] = 1.0
    tensor[1, 0, 0] = 0.5
    tensor[2, 1, 1] = 2.0  # clamped
    tensor[2, 2, 2] = -1.0  # clamped
    array = image_to_uint8(tensor)
    assert array.shape == (4, 5, 3) and array.dtype == np.uint8
    assert array[0, 0].tolist() == [255, 128, 0]
    assert array[1, 1].tolist() == [255, 0, 255]
    assert array[2, 2].tolist() == [255, 0, 0]
    np.testing.assert_array_equal(image_to_uint8(tensor.unsqueeze(0)), array)
    pil = to_pil(tensor)
    _assert_rgb(pil, (5, 4))
    np.testing.assert_array_equal(np.asarray(pil), array)
    with pytest.raises(ImageError):
        image_to_uint8(torch.zeros(4, 4, 5))


def test_load_prepare_roundtrip(tmp_path):
    pixels = _gradient_rgb(64, 48)
    path = tmp_path / "round.png"
    Image.fromarray(pixels).save(path)
    tensor, geometry = prepare_image(load_image(path), (48, 64), crop_pct=1.0)
    assert geometry.crop_box == (0.0, 0.0, 64.0, 48.0)
    np.testing.assert_array_equal(image_to_uint8(tensor), pixels)


def test_crop_region_marks_the_centre_crop_and_overlay_leaves_the_margin_as_it_is():
    """Issue 11.14: a model with a centre crop (efficientnet-lite0: crop_pct 0.875) never saw the margin; the
    overlay used to paint it in the colour of "least important", a square around the crop."""
    from explainers.images import colormap_lut, crop_region

    grey = np.full((100, 100, 3), 128, np.uint8)
    _, geometry = prepare_image(Image.fromarray(grey), (32, 32), crop_pct=0.875)
    left, top, right, bottom = geometry.crop_box
    assert 0 < left < 10 and 90 < right < 100  # a real margin on each side
    region = crop_region(geometry)
    assert region.shape == (100, 100) and not region[0, 0] and not region[99, 50] and region[50, 50]
    full = map_to_original(np.linspace(1.0, 2.0, 32 * 32).reshape(32, 32), geometry)
    assert np.array_equal(full != 0, region)  # exactly the pixels map_to_original fills
    plain = np.asarray(overlay(grey, full, opacity=0.6))
    assert (plain[~region] != 128).any()  # without a region: the margin is coloured (the old square)
    kept = np.asarray(overlay(grey, full, opacity=0.6, region=region))
    assert np.array_equal(kept[~region], grey[~region])  # the margin is the image itself
    assert np.array_equal(kept[region], plain[region]) is False  # the stretch is over the region only:
    low = np.round(128 * 0.4 + colormap_lut("cividis")[0] * 0.6).astype(np.uint8)
    first = np.argwhere(region)[0]  # the crop's top-left pixel holds the map's minimum (1.0 -> low end)
    assert np.abs(kept[tuple(first)].astype(int) - low.astype(int)).max() <= 1
    whole = np.ones((100, 100), bool)
    assert np.array_equal(np.asarray(overlay(grey, full, 0.6, region=whole)), plain)  # all True: no change
    with pytest.raises(ImageError, match="region"):
        overlay(grey, full, 0.6, region=np.ones((10, 10), bool))
