"""Native LLaDA and Dream models, registered with transformers' Auto classes on import."""

from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM

from dlm_decode.models.dream import DreamConfig, DreamModel
from dlm_decode.models.fast_dllm_v2 import FastDLLMV2Config, FastDLLMV2ForCausalLM
from dlm_decode.models.llada import LLaDAConfig, LLaDAModelLM
from dlm_decode.models.llada2 import LLaDA2MoeConfig, LLaDA2MoeModelLM
from dlm_decode.models.llada_moe import LLaDAMoEConfig, LLaDAMoEModelLM
from dlm_decode.models.loading import DEMO_MODELS, demo_model_path, load_model, resolve_model_path
from dlm_decode.models.sdar import SDARConfig, SDARForCausalLM
from dlm_decode.models.sdar_moe import SDARMoeConfig, SDARMoeForCausalLM
from dlm_decode.models.visibility import AnswerBlocks

for _cfg, _model in (
    (LLaDAConfig, LLaDAModelLM),
    (DreamConfig, DreamModel),
    (LLaDA2MoeConfig, LLaDA2MoeModelLM),
    (LLaDAMoEConfig, LLaDAMoEModelLM),  # config.json says model_type "llada": dispatched on architectures
):
    AutoConfig.register(_cfg.model_type, _cfg, exist_ok=True)
    AutoModel.register(_cfg, _model, exist_ok=True)
    AutoModelForMaskedLM.register(_cfg, _model, exist_ok=True)
for _cfg, _model in (
    (SDARConfig, SDARForCausalLM),  # SDAR / TraDo
    (SDARMoeConfig, SDARMoeForCausalLM),
    (FastDLLMV2Config, FastDLLMV2ForCausalLM),  # Fast-dLLM v2
):
    AutoConfig.register(_cfg.model_type, _cfg, exist_ok=True)
    AutoModel.register(_cfg, _model, exist_ok=True)
    AutoModelForMaskedLM.register(_cfg, _model, exist_ok=True)

SUPPORTED_MODEL_TYPES = (
    LLaDAConfig.model_type,
    DreamConfig.model_type,
    LLaDA2MoeConfig.model_type,
    LLaDAMoEConfig.model_type,  # dllm's saved name; the hub's config.json says "llada"
    SDARConfig.model_type,
    SDARMoeConfig.model_type,
    FastDLLMV2Config.model_type,
)

__all__ = [
    "DEMO_MODELS",
    "AnswerBlocks",
    "SUPPORTED_MODEL_TYPES",
    "DreamConfig",
    "DreamModel",
    "FastDLLMV2Config",
    "FastDLLMV2ForCausalLM",
    "LLaDA2MoeConfig",
    "LLaDA2MoeModelLM",
    "LLaDAConfig",
    "LLaDAMoEConfig",
    "LLaDAMoEModelLM",
    "LLaDAModelLM",
    "SDARConfig",
    "SDARForCausalLM",
    "SDARMoeConfig",
    "SDARMoeForCausalLM",
    "demo_model_path",
    "load_model",
    "resolve_model_path",
]
