"""Stand-in for torchvision.transforms.functional."""


def __getattr__(name):
    def _missing(*args, **kwargs):
        raise RuntimeError(f"torchvision.transforms.functional.{name} is stubbed in kvgeom's SGLang CPU venv")

    return _missing
