"""A scripted stand-in model whose logits a test dictates, for hand-built sampler and loop tests."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import torch
from torch import nn

from dlm_decode.models.common import DiffusionLMMixin


class ScriptedModel(DiffusionLMMixin, nn.Module):
    """``logits_fn(canvas [B, T], step) -> [B, T, V]`` aligned logits; counts calls."""

    def __init__(
        self,
        logits_fn: Callable[[torch.Tensor, int], torch.Tensor],
        vocab: int = 16,
        mask_id: int = 15,
        eos_id: int = 1,
        max_len: int = 512,
    ) -> None:
        nn.Module.__init__(self)
        self.fn = logits_fn
        self.emb = nn.Embedding(vocab, 4)
        self.config = SimpleNamespace(mask_token_id=mask_id, eos_token_id=eos_id, pad_token_id=eos_id)
        self._max = max_len
        self.calls = 0

    @property
    def max_sequence_length(self) -> int:
        return self._max

    def kv_shape(self) -> tuple[int, int, int]:
        return 1, 1, 4

    def get_input_embeddings(self) -> nn.Embedding:
        return self.emb

    def denoise(
        self, canvas, positions, *, compute=slice(None), region, store=None, key_mask=None, key_index=None, read=None
    ):
        logits = self.fn(canvas, self.calls)[:, region[0] : region[1]].float()
        self.calls += 1
        if read is not None:  # the model's contract: logits at the read offsets only, zeros elsewhere
            kept = torch.zeros(logits.shape[:2], dtype=torch.bool, device=logits.device).scatter_(1, read, True)
            logits = logits.masked_fill(~kept[..., None], 0.0)
        return logits


def peaked(token: int, conf: float, vocab: int = 16) -> torch.Tensor:
    """Logits over ``vocab`` whose softmax puts probability ``conf`` on ``token`` (rest uniform)."""
    rest = (1 - conf) / (vocab - 1)
    p = torch.full((vocab,), rest)
    p[token] = conf
    return p.log()


def table_model(confs: list[float], tokens: list[int] | None = None, vocab: int = 16, prompt_len: int = 2):
    """Fixed per-slot confidences for the generation slots (same every step)."""
    tokens = tokens or [2 + (i % 10) for i in range(len(confs))]

    def fn(canvas, step):
        b, t = canvas.shape
        out = torch.zeros(b, t, vocab)
        for i, (c, tok) in enumerate(zip(confs, tokens, strict=True)):
            out[:, prompt_len + i] = peaked(tok, c, vocab)
        return out

    return ScriptedModel(fn, vocab=vocab)


def step_filter(path, n: int, cut: float = 0.5) -> str:
    """A hand-set Learn2PD filter over blocks of ``n``: logit_i = 100 * (relu(conf_i) - cut), so sigmoid > 0.96 (the
    sampler's default ``accept``) iff conf_i > cut + 0.0318. Saved at ``path`` (no suffix); returns the
    .safetensors path as a string, as ``sampler_options={"filter": ...}`` takes it."""
    from dlm_decode.samplers.learned_filter import FilterMLP, save_filter

    f = FilterMLP(n)
    with torch.no_grad():
        f.net[0].weight.copy_(torch.eye(n))
        f.net[0].bias.zero_()
        f.net[2].weight.copy_(100 * torch.eye(n))
        f.net[2].bias.fill_(-100 * cut)
    return str(save_filter(f, path))
