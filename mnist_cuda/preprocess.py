"""Turn an image file into a 28x28 MNIST-style input for the trained network.

The network has only seen MNIST, so an image has to look like an MNIST digit before it is classified.
MNIST was made from scanned black-and-white digits: each was scaled, with anti-aliasing, to fit a 20x20
box keeping its aspect ratio, then placed in a 28x28 field so that its centre of mass falls on the
centre pixel. load_image repeats those steps:

1. Decoding. Pillow decodes the file (the first frame of a multi-frame file such as an animated GIF),
   turns it upright as its EXIF orientation tag says (phone photos are often stored sideways),
   composites any transparency over white (a drawing on a transparent canvas is meant to be seen on
   paper) and converts it to 8-bit grayscale. 16-bit grayscale is scaled down rather than clipped, so
   that a 16-bit scan does not turn white.
2. Polarity. MNIST is light ink (255) on a black background (0). The median of the border pixels gives
   the background level, since a digit rarely covers half of the border; a light background (above 127)
   means dark ink on paper, and the image is inverted. The background level is then subtracted, so that
   grey paper becomes 0 like the MNIST background.
3. Ink box. The ink is every pixel above INK_THRESHOLD (10%) of the brightest one: a threshold relative
   to the ink, so that paper texture, noise and JPEG artefacts do not widen the box. An image with no
   pixel more than MIN_CONTRAST above the background holds no digit and is an ImageError ("the image is
   uniform").
4. Size. The ink box is cropped and resampled with Pillow's LANCZOS filter (anti-aliased when shrinking,
   sharp when enlarging) on the float image, so that its longer side is 20 pixels; values are clipped
   back to 0..255. One exception: an image that already is a 28x28 MNIST digit is left unresampled, so
   that a test sample saved as a PNG gives the network the very same pixels as the raw test set. Such an
   image is recognised by its size, 28x28, and an ink box whose longer side is 19 or 20 pixels: that is
   true of all 10,000 MNIST test digits (9,996 have 20 at this threshold, 4 have 19), and resampling
   those by 20/19 would only blur every pixel for a 5% change of size. A smaller digit drawn on a 28x28
   canvas is enlarged as usual. With this rule and step 5, every MNIST test digit saved as a PNG comes
   back from load_image exactly, in either polarity (and 59,998 of the 60,000 training digits do;
   without the exception only 8,284 test digits would, as cropping drops their faintest pixels).
5. Centring. The digit is placed in the 28x28 field so that its centre of mass (pixel indices 0..27,
   weighted by intensity) lands on pixel 14, by a whole-pixel shift, the exact halfway cases rounded
   towards no shift. That is MNIST's own convention: the centres of mass of the MNIST test digits all lie
   in [13.5, 14.5], around pixel 14 and not around the field's geometric centre 13.5. The shift is
   limited so that no ink box pixel leaves the field (a digit whose mass is far from its box's middle
   could otherwise lose its edge).

The result is uint8 like the MNIST IDX bytes: 0 is background, 255 is ink.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from .paths import kind_of, os_error

FIELD = 28  # the MNIST image side
BOX = 20  # the side of the square the digit's ink box is fitted into
CENTRE = 14  # the pixel index the centre of mass is placed on (measured on the MNIST test set)
INK_THRESHOLD = 0.10  # a pixel is ink above this fraction of the brightest pixel (for the ink box)
MIN_CONTRAST = 16  # below this (of 255) above the background, the image is taken to hold no digit
ALREADY_NORMALISED = (BOX - 1, BOX)  # ink box longer sides of a 28x28 image left unresampled


class ImageError(Exception):
    """An image file that cannot become an MNIST-style input; the message is one line naming the file
    and what is wrong."""


def load_image(path) -> np.ndarray:
    """Read an image file (anything Pillow reads) and return it as a uint8 [28, 28] MNIST-style digit:
    0 is background, 255 is ink. Raises ImageError for a file that is missing, unreadable, not an
    image, corrupt, too large, or holds no digit. Pillow is imported here, as it is an optional extra;
    without it the ImportError propagates."""
    gray = _read_grayscale(path)
    try:
        return mnist_style(gray)
    except ImageError as e:
        raise ImageError(f"{path}: {e}") from None


def mnist_style(gray: np.ndarray) -> np.ndarray:
    """The MNIST preprocessing (see the module docstring) of a 2-D grayscale array of any size, uint8 or
    float in 0..255, in either polarity. Returns uint8 [28, 28]; raises ImageError if there is no digit."""
    gray = np.asarray(gray)
    if gray.ndim != 2 or gray.size == 0:
        raise ValueError(f"expected a non-empty 2-D grayscale array, got shape {gray.shape}")
    ink = _ink_on_black(gray.astype(np.float32))
    if ink.max() < MIN_CONTRAST:
        raise ImageError("no digit found: the image is uniform")
    top, bottom, left, right = _ink_box(ink)
    if gray.shape == (FIELD, FIELD) and max(bottom - top, right - left) in ALREADY_NORMALISED:
        digit, box = ink, (top, bottom, left, right)
    else:
        digit = _fit_box(ink[top:bottom, left:right])
        box = (0, digit.shape[0], 0, digit.shape[1])
    return _place_by_centre_of_mass(digit, box)


def _read_grayscale(path) -> np.ndarray:
    """Decode the first frame of an image file into a 2-D float32 array in 0..255, turned upright,
    transparency over white. Every way the file can fail becomes a one-line ImageError."""
    from PIL import Image, ImageOps, UnidentifiedImageError  # optional extra: imported only when used

    file, kind = Path(path), kind_of(path)
    if kind == "missing":
        raise ImageError(f"{path}: no such file")
    if kind == "unusable":
        raise ImageError(f"{path}: {os_error(path)}")
    if kind == "unreachable":
        raise ImageError(f"{path}: permission denied (a folder on the way cannot be searched)")
    if kind == "folder":
        raise ImageError(f"{path}: is a folder, not an image file")
    if kind == "other":
        raise ImageError(f"{path}: not a regular file (a device or a pipe?)")
    if file.stat().st_size == 0:
        raise ImageError(f"{path}: empty file (0 bytes)")
    try:
        with warnings.catch_warnings():
            # Pillow's notes on a file it decodes anyway (a damaged EXIF block, a palette's transparency) are not
            # the user's concern; its warning of a decompression bomb becomes ours, in one line
            warnings.simplefilter("ignore")
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(file) as image:
                image.load()  # Image.open reads only the header; the decoding errors come from here
                upright = ImageOps.exif_transpose(image)  # a copy, usable after the file is closed
                gray = _to_grayscale(upright)
    except PermissionError:
        raise ImageError(f"{path}: permission denied (cannot read the file)") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageError(f"{path}: image too large to process ({_one_line(e)})") from None
    except UnidentifiedImageError:
        raise ImageError(f"{path}: not an image file (Pillow cannot identify its format)") from None
    except Exception as e:  # noqa: BLE001 - Pillow's decoders raise many types on corrupt data
        # (OSError for truncated data, SyntaxError for a broken header, ValueError, struct.error,
        # EOFError...); none of them should reach the user as a traceback.
        raise ImageError(f"{path}: corrupt or truncated image ({type(e).__name__}: {_one_line(e)})") from None
    return gray


def _to_grayscale(image) -> np.ndarray:
    from PIL import Image

    if image.mode.startswith("I"):  # 16-bit grayscale (I;16, or I as Pillow opens some 16-bit PNGs)
        # convert("L") would clip at 255 rather than scale, turning the image white
        gray = np.asarray(image, dtype=np.float32)
        return gray / 257 if gray.max() > 255 else gray
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, rgba)
    return np.asarray(image.convert("L"), dtype=np.float32)


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split()) or "no details"


def _ink_on_black(gray: np.ndarray) -> np.ndarray:
    """Light ink on a 0 background: inverted if the background (the border median) is light, then
    the background level subtracted."""
    border = np.concatenate([gray[0, :], gray[-1, :], gray[:, 0], gray[:, -1]])
    if np.median(border) > 127:
        gray = 255 - gray
        border = 255 - border
    return np.clip(gray - np.median(border), 0, 255)


def _ink_box(ink: np.ndarray) -> tuple[int, int, int, int]:
    """(top, bottom, left, right), bottom and right exclusive, of the pixels above INK_THRESHOLD."""
    rows, cols = np.nonzero(ink > INK_THRESHOLD * ink.max())
    return int(rows.min()), int(rows.max()) + 1, int(cols.min()), int(cols.max()) + 1


def _fit_box(crop: np.ndarray) -> np.ndarray:
    """Resample so that the longer side is BOX, keeping the aspect ratio (the shorter side at least 1)."""
    from PIL import Image

    height, width = crop.shape
    scale = BOX / max(height, width)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    # a float32 array becomes a mode "F" image: no rounding before the final one, and LANCZOS's
    # overshoot past 0..255 is clipped below instead of wrapping
    resized = Image.fromarray(crop.astype(np.float32)).resize(size, Image.Resampling.LANCZOS)
    return np.clip(np.asarray(resized), 0, 255)


def _place_by_centre_of_mass(digit: np.ndarray, box: tuple[int, int, int, int]) -> np.ndarray:
    """Paste digit into a FIELD x FIELD zero image with its centre of mass on pixel CENTRE, keeping
    digit[box] (its ink) inside the field."""
    top, bottom, left, right = box
    rows = np.arange(digit.shape[0], dtype=np.float64)
    cols = np.arange(digit.shape[1], dtype=np.float64)
    mass = digit.sum(dtype=np.float64)
    centre_row = (digit.sum(axis=1, dtype=np.float64) @ rows) / mass
    centre_col = (digit.sum(axis=0, dtype=np.float64) @ cols) / mass
    # where digit's pixel (0, 0) goes in the field, limited so that the ink box stays inside
    row_offset = int(np.clip(_round_half_to_zero(CENTRE - centre_row), -top, FIELD - bottom))
    col_offset = int(np.clip(_round_half_to_zero(CENTRE - centre_col), -left, FIELD - right))

    field = np.zeros((FIELD, FIELD), dtype=np.float32)
    field_rows = slice(max(0, row_offset), min(FIELD, row_offset + digit.shape[0]))
    field_cols = slice(max(0, col_offset), min(FIELD, col_offset + digit.shape[1]))
    field[field_rows, field_cols] = digit[
        field_rows.start - row_offset : field_rows.stop - row_offset,
        field_cols.start - col_offset : field_cols.stop - col_offset,
    ]
    return np.rint(field).astype(np.uint8)


def _round_half_to_zero(x: float) -> int:
    """Round to the nearest integer, exact halves towards 0: a digit whose centre of mass lies exactly
    halfway between two pixels (as one MNIST test digit's does) is not moved."""
    return int(np.sign(x) * np.ceil(abs(x) - 0.5))
