"""PIL images in a request payload: accepted as pixels, never as Pillow's code.

A vision-language request carries the user's images as PIL objects (the
processor turns them into pixel values on the server). Pickled, an image is
``NEWOBJ`` of its class with no arguments, then ``BUILD`` with the state
``Image.__getstate__`` wrote: ``[info, mode, size, palette, raw pixel bytes]``
(an image opened from a file adds its file name). The class is
``PIL.Image.Image``, or a format plugin's (``PIL.PngImagePlugin.PngImageFile``,
``PIL.JpegImagePlugin.JpegImageFile`` ...) for an image read from a file.

What this lets through, and why each is safe:

* **Naming** ``PIL.Image.Image``, or a name of the form
  ``PIL.<Format>ImagePlugin.<Format>ImageFile``: every one of them is answered
  with ``PIL.Image.Image`` itself, and no plugin module is imported. A plugin's
  class differs only in how it reads a file, which a request has no use for;
  the pixels, mode, size and info are the same. No other Pillow name
  (``Image.open``, ``ImageShow``, ``ImageMath.eval``, a plugin's ``_open``) can
  be named, and nothing of Pillow can be called (``REDUCE``).
* **Making** an ``Image`` with ``NEWOBJ``: ``Image`` has no ``__new__`` of its
  own, so this is ``object.__new__``: no Pillow code runs.
* **Filling it in** with ``BUILD``: the state is checked here first (a table
  for ``info``, a known raw mode, a size of two non-negative ints, a palette of
  at most 768 small ints, and pixel bytes of exactly the length that mode and
  size need), and only then handed to ``Image.__setstate__``, which allocates
  that many pixels and copies the bytes in with Pillow's raw decoder (never a
  file format's decoder). The exact length check means a payload cannot ask for
  more pixel memory than it carries. Any other state (a dict that would set
  attributes, a second ``BUILD`` on an image already filled) is refused.

Nothing here imports Pillow unless a payload names an image.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Optional

from .allowlist import RefusedPayload

#: Raw modes a request's image may have, with their bits per pixel. The modes
#: ``Image.__getstate__`` writes for the images users make and load.
IMAGE_MODES = {
    "1": 1, "L": 8, "P": 8, "LA": 16, "PA": 16, "La": 16, "I;16": 16,
    "RGB": 24, "YCbCr": 24, "LAB": 24, "HSV": 24,
    "RGBA": 32, "RGBa": 32, "RGBX": 32, "CMYK": 32, "I": 32, "F": 32,
}
_PLUGIN_MODULE = re.compile(r"PIL\.[A-Za-z0-9]{1,20}ImagePlugin")
_PLUGIN_CLASS = re.compile(r"[A-Za-z0-9]{1,20}ImageFile")
_MAX_SIDE = 1 << 16


def _refuse(what: str, why: str = "") -> RefusedPayload:
    return RefusedPayload(
        f"Your request's payload holds {what}, which this server does not accept"
        f"{': ' + why if why else ''}. Send images as PIL images (or tensors)."
    )


def image_class_for(module: str, name: str) -> Optional[type]:
    """``PIL.Image.Image`` for a global that names an image class, else None."""
    if (module, name) == ("PIL.Image", "Image") or (
        _PLUGIN_MODULE.fullmatch(module) and _PLUGIN_CLASS.fullmatch(name)
    ):
        try:
            from PIL import Image
        except ImportError:
            raise _refuse(
                "a PIL image", "pillow is not installed on this server (the operator installs "
                "nnhost[models])"
            ) from None
        return Image.Image
    return None


def is_image_class(cls: Any) -> bool:
    """Whether ``cls`` is the one image class a payload may make (`image_class_for`)."""
    image = sys.modules.get("PIL.Image")
    return image is not None and cls is image.Image


def is_image(obj: Any) -> bool:
    return is_image_class(type(obj))


def build_image(image: Any, state: Any) -> None:
    """Fill in an image a payload made (``BUILD``), after checking ``state`` is only pixels."""
    if vars(image):  # made by NEWOBJ, so empty until its one BUILD
        raise _refuse("an image filled in twice")
    if not isinstance(state, (list, tuple)) or len(state) not in (5, 6):
        raise _refuse("a malformed image", "its state is not Pillow's [info, mode, size, palette, data]")
    info, mode, size, palette, data = state[:5]
    if not isinstance(info, dict):
        raise _refuse("a malformed image", "its info is not a table")
    if not isinstance(mode, str) or mode not in IMAGE_MODES:
        raise _refuse(f"an image of mode {str(mode)[:20]!r}", f"modes accepted: {', '.join(IMAGE_MODES)}")
    if not (
        isinstance(size, tuple) and len(size) == 2
        and all(type(side) is int and 0 <= side <= _MAX_SIDE for side in size)
    ):
        raise _refuse("a malformed image", "its size is not two pixel counts")
    if palette is not None and not (
        isinstance(palette, (list, tuple)) and len(palette) <= 768
        and all(type(value) is int and 0 <= value <= 255 for value in palette)
    ):
        raise _refuse("a malformed image", "its palette is not a list of byte values")
    width, height = size
    expected = (width * IMAGE_MODES[mode] + 7) // 8 * height
    if not isinstance(data, bytes) or len(data) != expected:
        raise _refuse(
            "a malformed image",
            f"a {mode} image of {width}x{height} has {expected} bytes of pixels, not "
            f"{len(data) if isinstance(data, bytes) else type(data).__name__}",
        )
    image.__setstate__([info, mode, size, list(palette) if palette is not None else None, data])
