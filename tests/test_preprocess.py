"""Image files to MNIST-style 28x28 digits (mnist_cuda.preprocess): the MNIST steps on synthetic
drawings, every kind of bad file, and, where the MNIST test set is present, the round trip of real test
digits saved as PNG."""

import errno
import gzip
import os

import numpy as np
import pytest

Image = pytest.importorskip("PIL.Image")
from PIL import ImageDraw  # noqa: E402  (after the skip: Pillow is an optional extra)

from conftest import MNIST_HINT, find_mnist_dir  # noqa: E402
from mnist_cuda.data_files import read_idx  # noqa: E402
from mnist_cuda.preprocess import ImageError, load_image, mnist_style  # noqa: E402

WIDTH, HEIGHT = 200, 120


def draw_four(ink=0, paper=255, mode="L"):
    """A '4' drawn with thick strokes, off-centre (towards the left and bottom) on a wide canvas."""
    image = Image.new(mode, (WIDTH, HEIGHT), paper)
    pen = ImageDraw.Draw(image)
    pen.line([(60, 20), (25, 80), (95, 80)], fill=ink, width=8)  # the slanted stroke and the bar
    pen.line([(75, 40), (75, 112)], fill=ink, width=8)  # the upright
    return image


def save(image, path, **options):
    image.save(path, **options)
    return path


def ink_box(digit):
    rows, cols = np.nonzero(digit)
    return rows.min(), rows.max() + 1, cols.min(), cols.max() + 1


def centre_of_mass(digit):
    weights = digit.astype(np.float64)
    indices = np.arange(digit.shape[0])
    return (weights.sum(axis=1) @ indices / weights.sum(), weights.sum(axis=0) @ indices / weights.sum())


@pytest.fixture
def reference(tmp_path):
    """The dark-on-white drawing, saved as PNG, through load_image."""
    return load_image(save(draw_four(), tmp_path / "four.png"))


def assert_mnist_style(digit):
    assert digit.shape == (28, 28) and digit.dtype == np.uint8
    border = np.concatenate([digit[0], digit[-1], digit[:, 0], digit[:, -1]])
    assert not border.any(), "the background must be 0"
    assert digit.max() > 200, "the strokes must be bright ink"
    top, bottom, left, right = ink_box(digit)
    assert max(bottom - top, right - left) == 20, "the ink box's longer side must be 20"
    row, col = centre_of_mass(digit)
    assert abs(row - 14) <= 1 and abs(col - 14) <= 1, f"centre of mass at {row:.2f}, {col:.2f}"


def test_drawing_becomes_an_mnist_style_digit(reference):
    assert_mnist_style(reference)
    top, bottom, left, right = ink_box(reference)
    assert bottom - top == 20 and right - left < 20, "the '4' is taller than wide: its height is 20"


def test_light_ink_on_dark_gives_the_same_digit(tmp_path, reference):
    light_on_dark = load_image(save(draw_four(ink=255, paper=0), tmp_path / "inverted.png"))
    assert np.array_equal(light_on_dark, reference)


def test_grey_paper_becomes_a_black_background(tmp_path, reference):
    on_grey = load_image(save(draw_four(ink=0, paper=200), tmp_path / "grey.png"))
    assert_mnist_style(on_grey)
    assert np.abs(on_grey.astype(int) - reference).max() <= 60  # weaker ink (200 levels), same shape
    assert np.array_equal(on_grey > 0, reference > 0)


def test_transparent_background_is_composited_over_white(tmp_path, reference):
    drawing = draw_four(ink=(0, 0, 0, 255), paper=(0, 0, 0, 0), mode="RGBA")  # black, also where clear
    assert np.array_equal(load_image(save(drawing, tmp_path / "clear.png")), reference)


def test_jpeg(tmp_path, reference):
    digit = load_image(save(draw_four().convert("RGB"), tmp_path / "four.jpg", quality=85))
    assert_mnist_style(digit)
    assert np.abs(digit.astype(int) - reference).mean() < 5


def test_exif_orientation_is_applied(tmp_path, reference):
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    stored_sideways = draw_four().transpose(Image.Transpose.ROTATE_90)
    assert np.array_equal(load_image(save(stored_sideways, tmp_path / "photo.png", exif=exif)), reference)


def test_first_frame_of_an_animation(tmp_path, reference):
    blank = Image.new("L", (WIDTH, HEIGHT), 255)
    path = save(draw_four(), tmp_path / "anim.gif", save_all=True, append_images=[blank])
    with Image.open(path) as animation:
        assert animation.n_frames == 2
    assert np.array_equal(load_image(path), reference)  # the blank frame would be an ImageError


def test_16_bit_grayscale_is_scaled_not_clipped(tmp_path):
    on_grey = draw_four(ink=0, paper=200)  # grey, so that clipping 200 * 257 to 255 would show
    sixteen_bit = Image.fromarray(np.asarray(on_grey, dtype=np.uint16) * 257)
    assert sixteen_bit.mode.startswith("I;16")
    expected = load_image(save(on_grey, tmp_path / "eight.png"))
    assert np.array_equal(load_image(save(sixteen_bit, tmp_path / "sixteen.png")), expected)


def mnist_like_seven():
    """A 28x28 digit as MNIST stores it: a 20x20 European '7' (with grey edges like anti-aliasing) whose
    centre of mass is at 14.33 in both directions: it rounds to pixel 14, whereas centring on 13.5 would
    move it by a pixel."""
    seven = np.zeros((20, 20), np.uint8)
    seven[0:3, 1:18] = 255  # the top bar
    seven[3, 1:18] = 90  # its grey lower edge
    for row in range(3, 20):  # the diagonal down to the foot, with a grey right edge
        col = 16 - (row - 3) // 2
        seven[row, col - 1 : col + 2] = 255
        seven[row, col + 2] = 60
    seven[8:10, 5:15] = 255  # the crossbar
    digit = np.zeros((28, 28), np.uint8)
    digit[8:28, 4:24] = seven
    return digit


def test_an_mnist_digit_is_returned_unchanged():
    digit = mnist_like_seven()
    row, col = centre_of_mass(digit)
    assert 14 < row < 14.5 and 14 < col < 14.5  # the case that tells pixel 14 from 13.5 apart
    assert np.array_equal(mnist_style(digit), digit)
    assert np.array_equal(mnist_style(255 - digit), digit)  # saved black on white
    assert np.array_equal(mnist_style(digit.astype(np.float64)), digit)


def test_an_mnist_digit_one_pixel_short_is_not_resampled():
    """3 of the 10,000 MNIST test digits have a 19-pixel ink box: enlarging them to 20 would blur them."""
    short = mnist_like_seven()
    short[27] = 0  # the foot's last row
    digit = mnist_style(short)
    top, bottom, left, right = ink_box(digit)
    assert (bottom - top, right - left) == (19, 18)
    assert np.array_equal(np.sort(digit, axis=None), np.sort(short, axis=None))  # moved, not resampled


def test_an_off_centre_mnist_digit_is_only_shifted():
    digit = mnist_like_seven()
    moved = np.zeros_like(digit)
    moved[5:25, 2:22] = digit[8:28, 4:24]  # up 3, left 2
    assert np.array_equal(mnist_style(moved), digit)


def test_a_small_digit_on_a_28x28_canvas_is_enlarged():
    small = np.zeros((28, 28), np.uint8)
    small[2:12, 3:9] = 255  # a 10x6 blob in a corner
    digit = mnist_style(small)
    top, bottom, left, right = ink_box(digit)
    assert (bottom - top, right - left) == (20, 12)
    row, col = centre_of_mass(digit)
    assert abs(row - 14) <= 0.5 and abs(col - 14) <= 0.5


def test_a_top_heavy_digit_keeps_all_its_ink():
    """A 'T' with a heavy bar: centring its mass on pixel 14 would push the bottom of its 20-pixel box
    out of the field, so the shift stops where the box touches the edge."""
    tee = np.zeros((100, 100), np.uint8)
    tee[0:30, :] = 255  # the bar: most of the mass, at the top
    tee[30:100, 45:55] = 255  # a thin stem
    digit = mnist_style(tee)
    top, bottom, left, right = ink_box(digit)
    assert (top, bottom) == (8, 28) and right - left == 20


def test_mnist_style_wants_a_2d_array():
    with pytest.raises(ValueError, match="2-D"):
        mnist_style(np.zeros((28, 28, 3), np.uint8))


# --- bad files: each an ImageError with one line that names the file --------------------------------


def png_bytes(tmp_path):
    return save(draw_four(), tmp_path / "source.png").read_bytes()


def corrupt_png(tmp_path):
    data = bytearray(png_bytes(tmp_path))
    image_data = data.index(b"IDAT") + 8  # the compressed pixels start after the chunk type
    data[image_data + 20 : image_data + 200] = bytes(180)  # overwrite the middle of the zlib stream
    return bytes(data)


BAD_FILES = {
    # name: (how to make it, what the message must say)
    "missing": (None, "no such file"),
    "folder": (lambda path, tmp: path.mkdir(), "folder"),
    "loop": (lambda path, tmp: path.symlink_to(path), os.strerror(errno.ELOOP)),  # the system's words
    "empty": (lambda path, tmp: path.write_bytes(b""), "empty file"),
    "text": (lambda path, tmp: path.write_text("this is not an image\n" * 20), "not an image"),
    "truncated": (lambda path, tmp: path.write_bytes(png_bytes(tmp)[:400]), "corrupt or truncated"),
    "corrupt": (lambda path, tmp: path.write_bytes(corrupt_png(tmp)), "corrupt or truncated"),
    "uniform": (lambda path, tmp: Image.new("L", (50, 40), 255).save(path, format="PNG"), "uniform"),
    "grey_jpeg": (lambda path, tmp: Image.new("RGB", (50, 40), (90, 90, 90)).save(path, format="JPEG"), "uniform"),
}


def assert_one_line_naming(error, path, expected):
    message = str(error.value)
    assert str(path) in message
    assert "\n" not in message
    assert expected in message


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_file(tmp_path, case):
    make, expected = BAD_FILES[case]
    path = tmp_path / f"{case}.png"
    if make:
        make(path, tmp_path)
    with pytest.raises(ImageError) as error:
        load_image(path)
    assert_one_line_naming(error, path, expected)


def test_too_large_image(tmp_path, monkeypatch):
    path = save(draw_four(), tmp_path / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 24,000 pixels is then a decompression bomb
    with pytest.raises(ImageError) as error:
        load_image(path)
    assert_one_line_naming(error, path, "too large")


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads files whatever their permissions"
)
def test_unreadable_file(tmp_path):
    path = save(draw_four(), tmp_path / "locked.png")
    path.chmod(0)
    try:
        with pytest.raises(ImageError) as error:
            load_image(path)
    finally:
        path.chmod(0o600)
    assert_one_line_naming(error, path, "permission denied")


# --- the real MNIST test digits ------------------------------------------------------------------------


def test_mnist_test_digits_saved_as_png_round_trip_exactly(tmp_path):
    folder = find_mnist_dir()
    if folder is None or not (folder / "t10k-images-idx3-ubyte.gz").is_file():
        pytest.skip(MNIST_HINT)
    images = read_idx(gzip.decompress((folder / "t10k-images-idx3-ubyte.gz").read_bytes()))
    path = tmp_path / "digit.png"
    changed = []
    for index, image in enumerate(images[:200]):
        Image.fromarray(image).save(path)
        if not np.array_equal(load_image(path), image):
            changed.append(index)
    assert changed == []  # all 10,000 test digits round-trip exactly (measured when this was written)
