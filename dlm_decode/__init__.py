"""dlm_decode: fast decoding for masked-diffusion language models (LLaDA, Dream).

``import dlm_decode`` registers the native LLaDA and Dream classes with transformers' Auto classes.

    from dlm_decode import generate, load_model
    model, tok = load_model("demo-llada")      # or AutoModel.from_pretrained(demo_model_path("demo-llada"))
    out = generate(model, ["..."], tokenizer=tok, chat=True, sampler="threshold", gen_length=32)
"""

from dlm_decode.cache import CACHES, get_cache
from dlm_decode.core.config import DecodeConfig
from dlm_decode.core.state import DecodeState
from dlm_decode.decode import GenerateOutput, generate
from dlm_decode.engine import Engine, EngineResult
from dlm_decode.models import demo_model_path, load_model
from dlm_decode.samplers import SAMPLERS, get_sampler

__version__ = "0.1.0"

__all__ = [
    "CACHES",
    "SAMPLERS",
    "DecodeConfig",
    "DecodeState",
    "Engine",
    "EngineResult",
    "GenerateOutput",
    "demo_model_path",
    "generate",
    "get_cache",
    "get_sampler",
    "load_model",
]
