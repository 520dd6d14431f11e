"""Stand-in for torchvision.io (nothing is decoded)."""


def decode_image(*args, **kwargs):
    raise RuntimeError("torchvision is stubbed in kvgeom's SGLang CPU venv")


def read_image(*args, **kwargs):
    raise RuntimeError("torchvision is stubbed in kvgeom's SGLang CPU venv")
