"""Reading a row's images in every accepted form (rlvr.utils.images)."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from mm_helpers import picture

from rlvr.utils.images import ImageReadError, load_image, row_images


def png_bytes(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_every_accepted_form_gives_the_same_rgb_pixels(tmp_path):
    image = picture((10, 120, 240), mark=2)
    image.save(tmp_path / "a.png")
    data = png_bytes(image)
    encoded = base64.b64encode(data).decode()
    forms = [str(tmp_path / "a.png"), "a.png", encoded, f"data:image/png;base64,{encoded}", {"bytes": data},
             {"bytes": None, "path": "a.png"}, data, image.convert("RGBA")]
    expected = np.asarray(image)
    for form in forms:
        loaded = load_image(form, base_dir=tmp_path)
        assert loaded.mode == "RGB" and np.array_equal(np.asarray(loaded), expected), type(form)


@pytest.mark.parametrize("value, message", [
    ("missing.png", "missing.png does not exist"),
    ("bm90IGFuIGltYWdl", "the base64 data is not a readable image"),
    ("%%% not base64 %%%", "does not exist .and the text is not base64 image data either"),
    ("data:image/png;base64,%%%", "does not hold base64 data"),
    (b"not an image", "the bytes is not a readable image"),
    ({"path": None}, "needs 'bytes' or 'path'"),
    (3.5, "got float"),
])
def test_unreadable_entries_say_what_is_wrong(tmp_path, value, message):
    with pytest.raises(ImageReadError, match=message):
        load_image(value, base_dir=tmp_path)


def test_row_images_names_the_field_of_a_bad_entry(tmp_path):
    picture((1, 2, 3)).save(tmp_path / "ok.png")
    assert len(row_images({"images": ["ok.png", "ok.png"]}, "images", tmp_path)) == 2
    assert row_images({"other": 1}, "images", tmp_path) == []
    assert len(row_images({"images": "ok.png"}, "images", tmp_path)) == 1  # one entry without a list
    with pytest.raises(ImageReadError, match=r"field 'images\[1\]'.*gone.png does not exist"):
        row_images({"images": ["ok.png", "gone.png"]}, "images", tmp_path)
