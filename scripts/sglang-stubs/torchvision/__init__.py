"""A stand-in torchvision for SGLang's CPU venv: importable, does nothing (see ../README.md)."""

from . import io, transforms

__version__ = "0.0.0+kvgeom-stub"
__all__ = ["io", "transforms"]
