"""Stand-in for torchvision.transforms."""

import enum

from . import functional, v2


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def __getattr__(name):
    def _missing(*args, **kwargs):
        raise RuntimeError(f"torchvision.transforms.{name} is stubbed in kvgeom's SGLang CPU venv")

    return _missing
