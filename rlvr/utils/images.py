"""Images of a data row: read from whatever form the row stores them in.

A row's ``images`` column (``data.image_key``) is a list with one entry per ``<image>``
placeholder of its prompt, in order. An entry may be

- a path to an image file (absolute, or relative to the data file's folder);
- a base64 string, bare or as a data URL (``"data:image/png;base64,..."``), the form JSONL needs;
- a dict ``{"bytes": b"..."}`` (verl's parquet rows and Hugging Face ``datasets``' ``Image``
  feature; a ``"path"`` key is used when the bytes are missing), or raw ``bytes``;
- a ``PIL.Image.Image``.

Every image is converted to RGB. Anything unreadable raises :class:`ImageReadError`, which the
dataset turns into a data error naming the file, the row and the field.
"""

from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

__all__ = ["ImageReadError", "load_image", "row_images"]


class ImageReadError(ValueError):
    """An image entry that cannot be read (the message says what it is and why)."""


def _open(data: bytes, what: str) -> Image.Image:
    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise ImageReadError(f"{what} is not a readable image ({err})") from None


def _base64_bytes(text: str) -> bytes | None:
    """The bytes of a base64 text (a data URL's payload), or None when it is not base64."""
    payload = text.split(",", 1)[1] if text.startswith("data:") else text
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        return None


def _from_path(path: Path) -> Image.Image:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ImageReadError(f"cannot read the image file {path} ({err.strerror or err})") from None
    return _open(data, f"the file {path}")


def _from_string(text: str, base_dir: Path) -> Image.Image:
    path = Path(text).expanduser()
    if not path.is_absolute():
        path = base_dir / path
    if not text.startswith("data:") and path.is_file():
        return _from_path(path)
    data = _base64_bytes(text)
    if data is not None:
        return _open(data, "the base64 data")
    if text.startswith("data:"):
        raise ImageReadError(f"the data URL {text[:40]!r}... does not hold base64 data")
    raise ImageReadError(f"the image file {path} does not exist (and the text is not base64 image data either)")


def load_image(value: Any, base_dir: str | Path = ".") -> Image.Image:
    """One image entry as an RGB ``PIL.Image`` (the accepted forms are in the module docstring).

    Args:
        value: the entry.
        base_dir: folder that relative paths start from (the data file's folder).

    Raises:
        ImageReadError: the entry is of no accepted form or not a readable image.
    """
    if isinstance(value, Image.Image):
        return value.convert("RGB")
    if isinstance(value, (bytes, bytearray)):
        return _open(bytes(value), "the bytes")
    if isinstance(value, str):
        return _from_string(value, Path(base_dir))
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            return _open(bytes(value["bytes"]), "the 'bytes' entry")
        if value.get("path"):
            return _from_string(str(value["path"]), Path(base_dir))
        raise ImageReadError(f"a dict image entry needs 'bytes' or 'path', got the keys {sorted(value)}")
    raise ImageReadError(f"an image entry must be a path, base64 string, bytes, {{'bytes': ...}} dict or PIL image, "
                         f"got {type(value).__name__}")


def row_images(row: dict[str, Any], image_key: str, base_dir: str | Path) -> list[Image.Image]:
    """The images of a row (``[]`` when it has none).

    Raises:
        ImageReadError: naming the entry (``images[1]``) that cannot be read.
    """
    entries = row.get(image_key)
    if entries is None:
        return []
    if not isinstance(entries, (list, tuple)):
        entries = [entries]
    images = []
    for i, entry in enumerate(entries):
        try:
            images.append(load_image(entry, base_dir))
        except ImageReadError as err:
            raise ImageReadError(f"field '{image_key}[{i}]': {err}") from None
    return images
