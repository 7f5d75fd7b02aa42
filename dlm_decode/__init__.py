"""dlm_decode: fast decoding for masked-diffusion language models (LLaDA, Dream).

``import dlm_decode`` registers the native LLaDA and Dream classes with transformers' Auto classes.
"""

from dlm_decode.models import load_model  # noqa: F401  (import registers the Auto classes)

__version__ = "0.1.0"
