"""Random LLaDA models of published widths for the benchmarks (``bench_caches.py --model random:SHAPE``,
``bench_speed.py --versus-reference --vr-size SHAPE``): real costs, meaningless tokens."""

from __future__ import annotations

from typing import Any

import torch

RANDOM_SHAPES: dict[str, dict[str, int]] = {
    "tiny": dict(d_model=128, n_layers=2, n_heads=4, n_kv_heads=4, mlp_hidden_size=344, vocab_size=512),
    # the widths of issue 16's CPU table (``versus_reference``'s demo checkpoint; not the shipped demo models' widths)
    "demo": dict(d_model=256, n_layers=6, n_heads=8, n_kv_heads=8, mlp_hidden_size=768, vocab_size=2048),
    "llada-8b": dict(d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32, mlp_hidden_size=12288, vocab_size=126464),
}


def random_llada(
    device: str, shape: str = "tiny", layers: int | None = None, dtype: str = "float32", width: int | None = None
) -> Any:
    """A random LLaDA in the official layout with the widths of ``RANDOM_SHAPES[shape]``, built on ``device``;
    ``layers`` / ``width`` shrink it (``width``: d_model, heads of 64, MLP 3x as LLaDA-8B's; the vocabulary stays)."""
    from dlm_decode.models.llada import LLaDAConfig, LLaDAModelLM
    from dlm_decode.models.loading import parse_dtype

    dims = dict(RANDOM_SHAPES[shape])
    if layers:
        dims["n_layers"] = layers
    if width:
        dims |= dict(
            d_model=width, n_heads=max(1, width // 64), n_kv_heads=max(1, width // 64), mlp_hidden_size=3 * width
        )
    vocab = dims["vocab_size"]
    mask_id, eos_id = (126336, 126081) if shape == "llada-8b" else (vocab - 1, 1)
    cfg = LLaDAConfig(
        **dims,
        embedding_size=vocab,
        max_sequence_length=4096,
        rope_theta=500000.0,
        mask_token_id=mask_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = LLaDAModelLM(cfg).to(parse_dtype(dtype))
    with torch.no_grad():  # spread the logits so confidences vary like a trained model's (logit std ~9 at any width)
        head = model.model.transformer.ff_out.weight
        head.mul_(40.0 * (128 / dims["d_model"]) ** 0.5)
        head[cfg.mask_token_id] = 0.0
    return model.eval()


def random_ids(model: Any, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """[batch, length] random token ids from 3 up, never the model's MASK, on the model's device."""
    vocab, mask = model.get_input_embeddings().weight.shape[0], model.mask_token_id
    ids = torch.randint(3, vocab, (batch, length), generator=generator)
    return ids.masked_fill(ids == mask, 3).to(next(model.parameters()).device)
