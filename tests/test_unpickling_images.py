"""PIL images read from a payload as pixels only (`execution.unpickling.images`).

The end-to-end proof is in `test_model_kinds` (a vision-language request with a
PNG image) and the refusals through a server in `security/test_pickle_gadgets`;
here every mode a request's image may have round-trips exactly, and each
malformed state is refused before Pillow sees it.
"""

from __future__ import annotations

import sys

import pytest
from PIL import Image

from nnhost.execution.unpickling.allowlist import RefusedPayload
from nnhost.execution.unpickling.images import IMAGE_MODES, build_image, image_class_for


def _made() -> Image.Image:
    return Image.Image.__new__(Image.Image)  # as NEWOBJ makes it


def _sample(mode: str) -> Image.Image:
    image = Image.linear_gradient("L").resize((7, 5)).convert(mode) if mode not in ("I;16",) else (
        Image.new(mode, (7, 5), 300)
    )
    if mode == "P":
        image.putpalette([value % 256 for value in range(768)])
    image.info["dpi"] = (72, 72)
    return image


@pytest.mark.parametrize("mode", sorted(set(IMAGE_MODES) - {"La", "RGBa", "PA", "LAB", "HSV"}) + ["PA"])
def test_every_mode_round_trips_exactly(mode):
    original = _sample(mode) if mode != "PA" else _sample("P").convert("PA")
    rebuilt = _made()
    build_image(rebuilt, original.__getstate__())
    assert (rebuilt.mode, rebuilt.size, rebuilt.info) == (original.mode, original.size, original.info)
    assert rebuilt.tobytes() == original.tobytes()
    assert rebuilt.getpalette() == original.getpalette()


def test_an_image_read_from_a_file_comes_back_as_a_plain_image():
    import io

    encoded = io.BytesIO()
    _sample("RGB").save(encoded, format="PNG")
    encoded.seek(0)
    opened = Image.open(encoded)
    cls = image_class_for(type(opened).__module__, type(opened).__name__)
    assert cls is Image.Image
    rebuilt = _made()
    build_image(rebuilt, opened.__getstate__())  # six items: the file name is dropped
    assert rebuilt.tobytes() == opened.tobytes() and not hasattr(rebuilt, "filename")


def test_only_image_classes_are_named_and_no_plugin_is_imported():
    assert image_class_for("PIL.NotARealImagePlugin", "NotARealImageFile") is Image.Image
    assert "PIL.NotARealImagePlugin" not in sys.modules
    for module, name in [("PIL.Image", "open"), ("PIL.Image", "Image.frombytes"), ("PIL.ImageMath", "eval"),
                         ("PIL.PngImagePlugin", "_open"), ("PIL.Png.ImagePlugin", "PngImageFile"),
                         ("os", "PngImageFile"), ("PIL.PngImagePlugin", "PngImageFile.__init__")]:
        assert image_class_for(module, name) is None, (module, name)


GOOD = [{}, "L", (2, 2), None, b"abcd"]


@pytest.mark.parametrize("change, refused", [
    ({0: []}, "info is not a table"),
    ({1: "XYZ"}, "modes accepted"),
    ({1: 3}, "modes accepted"),
    ({2: (2, -2)}, "not two pixel counts"),
    ({2: (2.0, 2)}, "not two pixel counts"),
    ({2: (1 << 17, 1)}, "not two pixel counts"),
    ({2: (2, 3)}, "has 6 bytes of pixels, not 4"),
    ({2: (60000, 60000)}, "has 3600000000 bytes of pixels, not 4"),
    ({4: b"abc"}, "has 4 bytes of pixels, not 3"),
    ({4: "abcd"}, "not str"),
    ({3: list(range(769))}, "palette"),
    ({3: [256]}, "palette"),
])
def test_a_malformed_state_is_refused(change, refused):
    state = list(GOOD)
    for index, value in change.items():
        state[index] = value
    with pytest.raises(RefusedPayload, match=refused):
        build_image(_made(), state)


@pytest.mark.parametrize("state", [{"im": None}, ({}, "L"), [{}, "L", (1, 1)], "pixels"])
def test_a_state_that_is_not_pillows_is_refused(state):
    with pytest.raises(RefusedPayload, match="malformed image"):
        build_image(_made(), state)


def test_an_image_is_filled_in_once():
    image = _made()
    build_image(image, list(GOOD))
    with pytest.raises(RefusedPayload, match="filled in twice"):
        build_image(image, list(GOOD))
