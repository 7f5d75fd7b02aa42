"""Loading checkpoints by path or shipped demo name, with early, specific errors.

Weights load from safetensors only (``use_safetensors=True``): a directory holding only ``pytorch_model.bin`` is
refused rather than unpickled. Before any weight is read, ``config.json`` is parsed, checked against the model
family's schema (``models/schema.py``) and the model is built on the meta device (no memory); ``model_facts``
stops there, so entry points check a decoding request against the checkpoint first. ``load_model`` then checks
every safetensors header against that model: a damaged file, and missing, unexpected or differently shaped
tensors, are errors naming the file, never randomly initialised weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dlm_decode.core.files import check_shapes, read_json_object, safetensors_shapes
from dlm_decode.core.inputs import ModelFacts
from dlm_decode.core.special_ids import check_tokenizer_ids, no_eos_notice, vocabulary
from dlm_decode.models.layout import resolve_layout, set_layout

DEMO_DIR = Path(__file__).resolve().parent.parent / "demo_models"
DEMO_MODELS = ("demo-llada", "demo-dream", "demo-llada2")  # demo-llada2: block-causal (LLaDA2 format)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_model_path(name_or_path: str | Path) -> Path:
    """A shipped demo name (``demo-llada``) or a checkpoint directory -> the directory, checked for its files."""
    p = Path(name_or_path)
    if str(name_or_path) in DEMO_MODELS and not p.exists():
        p = DEMO_DIR / str(name_or_path)
        if not p.is_dir():
            raise FileNotFoundError(f"demo model {name_or_path!r} is not shipped in this install (looked in {p})")
    if not p.is_dir():
        raise FileNotFoundError(
            f"model {str(name_or_path)!r} is neither a checkpoint directory nor a shipped demo model "
            f"({', '.join(DEMO_MODELS)}); hub downloads are not attempted"
        )
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"{p} has no config.json: not a checkpoint directory")
    if not (p / "model.safetensors").is_file() and not (p / "model.safetensors.index.json").is_file():
        found = sorted(x.name for x in p.iterdir())
        raise FileNotFoundError(
            f"{p} has no model.safetensors or model.safetensors.index.json (found: {found}); "
            "weights are loaded from safetensors only"
        )
    return p


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype {dtype} not supported; choose one of {sorted(DTYPES)}")
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} not supported; choose one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def demo_model_path(name: str = "demo-llada") -> Path:
    """The directory of a shipped demo model inside the installed package, from any working directory:
    ``AutoModel.from_pretrained(demo_model_path("demo-llada"))`` works once ``dlm_decode`` is imported."""
    if name not in DEMO_MODELS:
        raise ValueError(f"unknown demo model {name!r}; shipped demo models: {', '.join(DEMO_MODELS)}")
    path = DEMO_DIR / name
    if not path.is_dir():
        raise FileNotFoundError(f"demo model {name!r} is not shipped in this install (looked in {path})")
    return path


def check_device(device: str | torch.device, what: str = "device") -> torch.device:
    """``device`` as a torch device that exists here; ``what`` names the option in the error (``--device``)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"{what} {str(device)!r} is not a torch device (cpu, cuda, cuda:N, mps)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise ValueError(f"{what} {str(device)!r}: CUDA is not available here ({why}); use {what} cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"{what} {str(device)!r}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{what} {str(device)!r}: MPS is not available here; use {what} cpu")
    return dev


def read_config(path: Path) -> Any:
    """``config.json`` of a checkpoint directory -> its registered transformers config. JSON, ``model_type`` and
    every key the model reads (the family's ``config_schema``, ``models/schema.py``: types, ranges, required keys)
    are checked first, with errors naming the file and the key."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    import dlm_decode.models  # noqa: F401  (registers the Auto classes)
    from dlm_decode.models import SUPPORTED_MODEL_TYPES
    from dlm_decode.models.llada import llada_variant

    raw = read_json_object(path / "config.json", "model config")
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{path}: config model_type {model_type!r} is not supported; supported: {SUPPORTED_MODEL_TYPES}"
        )
    config_class = llada_variant(raw) if model_type == "llada" else None  # LLaDA-MoE: same model_type
    (config_class or CONFIG_MAPPING[model_type]).config_schema.check(raw, path / "config.json")
    return AutoConfig.from_pretrained(path)


def empty_model(config: Any) -> Any:
    """The model ``config`` describes, built on the meta device: parameter names, shapes and facts, no memory."""
    from transformers import AutoModel

    with torch.device("meta"):
        try:
            return AutoModel.from_config(config)
        except ValueError as e:  # the model's own config check: name the file
            where = getattr(config, "_name_or_path", "")
            raise ValueError(f"{Path(where) / 'config.json' if where else 'config'}: {e}") from None


def model_facts(name_or_path: str | Path) -> ModelFacts:
    """What ``config.json`` decides about decoding (vocabulary, MASK id, maximum length) and the decoding lengths of
    ``generation_config.json`` (``core.generation_config``), read without weights."""
    path = resolve_model_path(name_or_path)
    model = empty_model(read_config(path))
    check_tokenizer(path, model, load_tokenizer(path))
    return checkpoint_facts(model, path)


def checkpoint_facts(model: Any, path: Path) -> ModelFacts:
    """``ModelFacts.of_model`` of a model built from ``path`` (its ``generation_config.json`` read once)."""
    facts = ModelFacts.of_model(model)
    return facts if facts.checkpoint_dir == str(path) else facts.in_checkpoint(path)


def check_tokenizer(path: Path, model: Any, tokenizer: Any | None) -> None:
    """The tokenizer's special ids inside the model's vocabulary; then the ids config.json leaves out are taken from
    it (LLaDA2); a model left with no usable EOS gets its one notice (it decodes to the gen length)."""
    files = [f for f in ("tokenizer_config.json", "tokenizer.json") if (path / f).is_file()]
    check_tokenizer_ids(tokenizer, vocabulary(model), str(path / (files[0] if files else "tokenizer")))
    if hasattr(model, "adopt_tokenizer_ids"):  # ids config.json leaves out come from the tokenizer (LLaDA2)
        model.adopt_tokenizer_ids(tokenizer)
    if not model.eos_token_ids and getattr(tokenizer, "eos_token_id", None) is None:
        no_eos_notice(str(path))


#: tokenizer classes published as remote code that are a transformers class under another name: Dream's
#: ``tokenization_dream.DreamTokenizer`` (Dream, DiffuCoder, Dream-Coder) is Qwen2's byte-level BPE (vocab.json,
#: merges.txt, the same pre-tokenizer pattern and special-token defaults)
REMOTE_TOKENIZERS = {"DreamTokenizer": "Qwen2Tokenizer"}


def load_tokenizer(name_or_path: str | Path) -> Any | None:
    """The checkpoint's tokenizer (from its tokenizer files alone, never remote code), or None when it ships none."""
    import transformers

    path = resolve_model_path(name_or_path)
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    config = path / "tokenizer_config.json"
    named = read_json_object(config, "tokenizer config").get("tokenizer_class") if config.is_file() else None
    if named in REMOTE_TOKENIZERS:
        return getattr(transformers, REMOTE_TOKENIZERS[named]).from_pretrained(path)
    try:
        return transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except ValueError as e:
        if "trust_remote_code" not in str(e):
            raise
        raise ValueError(
            f"{config}: the tokenizer class {named!r} is remote code, which dlm_decode does not run; ship a "
            f"tokenizer.json, or use --input-ids (covered remote classes: {', '.join(REMOTE_TOKENIZERS)})"
        ) from None


def check_weights(path: Path, model: Any) -> None:
    """Every safetensors header of ``path`` against ``model``'s parameters (names and shapes), no tensor read."""
    index = path / "model.safetensors.index.json"
    if (path / "model.safetensors").is_file():
        files, where = [path / "model.safetensors"], str(path / "model.safetensors")
    else:
        weight_map = read_json_object(index, "checkpoint index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index}: the checkpoint index has no weight_map (tensor name -> shard file)")
        files, where = [path / f for f in sorted(set(map(str, weight_map.values())))], f"the shards of {index}"
        for f in files:
            if not f.is_file():
                raise FileNotFoundError(f"{index} lists the shard {f.name}, which is not in {path}")
    found: dict[str, tuple[int, ...]] = {}
    for f in files:
        found |= safetensors_shapes(f, "checkpoint weights")
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    check_shapes(found, expected, where, f"{path / 'config.json'}")


def load_model(
    name_or_path: str | Path,
    *,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    tokenizer: bool = True,
    layout: str = "auto",
):
    """Load (model, tokenizer or None) from a checkpoint directory or a demo name; the model is in eval mode.

    ``layout``: how the linear weights sit in memory (``models/layout.py``): ``"auto"`` (default) stores them
    column-major on CPU in float32, where a decoding step's few-row products run 1.1-1.6x faster, and as loaded
    elsewhere; ``"decode"`` always column-major; ``"official"`` always as the checkpoint stores them."""
    from transformers import AutoModel

    check_device(device)
    path = resolve_model_path(name_or_path)
    config = read_config(path)
    torch_dtype = parse_dtype(dtype)
    layout = resolve_layout(layout, device, torch_dtype)
    meta = empty_model(config)
    tok = load_tokenizer(path)
    check_tokenizer(path, meta, tok)  # the ids, the tokenizer's and the fallbacks included, before any weight
    checkpoint_facts(meta, path)
    check_weights(path, meta)
    model = AutoModel.from_pretrained(path, config=config, dtype=torch_dtype, use_safetensors=True).to(device).eval()
    set_layout(model, layout)
    if hasattr(model, "adopt_tokenizer_ids"):  # ids config.json leaves out come from the tokenizer (LLaDA2, -MoE)
        model.adopt_tokenizer_ids(tok)
    return model, (tok if tokenizer else None)
