"""Stand-in for Hugging Face datasets in kvgeom's SGLang CPU venv: nothing is loaded."""

__version__ = "0.0.0+kvgeom-stub"


def load_dataset(*args, **kwargs):
    raise RuntimeError("datasets is stubbed in kvgeom's SGLang CPU venv")
