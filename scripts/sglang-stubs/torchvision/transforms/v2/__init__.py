"""Stand-in for torchvision.transforms.v2."""

from . import functional  # noqa: F401
