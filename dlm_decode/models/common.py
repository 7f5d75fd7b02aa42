"""Building blocks shared by the native LLaDA and Dream implementations.

Both published architectures are pre-norm, bidirectional transformers with RMSNorm, rotary position embeddings
(rotate-half layout), SiLU-gated MLPs and untied LM heads. They differ in key names, biases, GQA and in the
numerics of RoPE (LLaDA rotates in fp32, Dream in the model dtype), which decide token identity in low precision;
see ``../shared/docs/MODELS.md``.

``DiffusionLMMixin`` is the decoding-facing surface every model offers: ``denoise`` computes hidden states for a
subset of canvas slots (optionally reading and writing an external K/V store, through the forward's ``KVAccess``:
which of the store's rows, written or not), and returns logits aligned so that ``logits[i]`` always predicts slot
``i`` (Dream's one-position shift is applied here, never in samplers).

Rows nobody reads are not computed past what the other rows need: every computed slot's K/V feed the attention of
every layer, so each layer runs all of them, except the last, whose K/V still are written for all but whose
attention output, MLP, final norm and LM head run only for the rows ``denoise`` returns logits for (the region's,
or the ``read`` subset a sampler asks for).

An attention rule (``visibility.AnswerBlocks``, D2F's answer blocks) given to ``denoise`` becomes one [B, 1, Q, S]
bool mask per forward (``answer_block_mask``: the rule over the query and key slots, with the key-padding mask),
shared by every layer; the attention then runs as PyTorch SDPA under it (``pairwise_attention``), never the Triton
kernel, which takes one key mask per row, not one per query.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn

from dlm_decode.cache.store import KVAccess, KVStore
from dlm_decode.kernels import masked_attention
from dlm_decode.kernels.reference import gather_keys
from dlm_decode.models.visibility import AnswerBlocks

Index = slice | torch.Tensor  # a contiguous run of canvas slots shared by all rows, or [B, Q] slot ids


def take_rows(x: torch.Tensor, rows: Index | None, dim: int = 1) -> torch.Tensor:
    """``x``'s entries at ``rows`` along its query dimension ``dim``: all (None), a view (a slice), or a gather by
    [B, N] query-row ids (``x`` [B, ..., Q, ...] -> [B, ..., N, ...])."""
    if rows is None:
        return x
    if isinstance(rows, slice):
        return x[(slice(None),) * dim + (rows,)]
    shape = list(x.shape)
    shape[dim] = rows.shape[1]
    view = [rows.shape[0]] + [1] * (x.dim() - 1)
    view[dim] = rows.shape[1]
    return x.gather(dim, rows.view(view).expand(shape))


def end_ids(config: Any, tokenizer: Any | None, *tokens: str) -> None:
    """Add the ids of those ``tokens`` the tokenizer has to ``config.extra_eos_token_ids`` (ids that end an answer,
    read by ``DiffusionLMMixin.eos_token_ids``): a family's end-of-turn or answer-padding token."""
    vocab = tokenizer.get_vocab() if tokenizer is not None and hasattr(tokenizer, "get_vocab") else {}
    found = {vocab[t] for t in tokens if isinstance(vocab.get(t), int)}
    if found:
        config.extra_eos_token_ids = sorted(set(getattr(config, "extra_eos_token_ids", None) or []) | found)


def _head_unpadded(head: Any, hid: torch.Tensor, read: torch.Tensor, width: int) -> torch.Tensor:
    """[B, width, V] logits from ``hid`` [B, N, D] at ``read`` [B, N] offsets (zeros elsewhere), the LM head run
    once over the rows laid end to end without each row's trailing repeats of its last offset (the padding of
    ``plans.rows_to_index``; a repeat computes the same logits again). At a large vocabulary the head is most of a
    step, and a static batch's rows are padded to its busiest row's count. The counts are read on the host: for
    the CPU, where that costs no sync."""
    b, n = read.shape
    tail = (read == read[:, -1:]).flip(1).long().cumprod(1).sum(1)  # [B] the trailing run of the last offset
    keep = torch.arange(n, device=read.device)[None, :] <= (n - tail)[:, None]  # [B, N] a row's own offsets
    logits = head(hid[keep][None])[0]  # [S, V], S = keep.sum()
    dest = (torch.arange(b, device=read.device)[:, None] * width + read)[keep]  # [S] rows of the flat region
    out = logits.new_zeros(b * width, logits.shape[-1])
    return out.index_copy_(0, dest, logits).view(b, width, -1)


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32, cast back to the input dtype, then scaled (LLaDA and Qwen2 agree on this order)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 tables for integer ``positions`` [B, Q] -> cos and sin, two [B, 1, Q, hd] tensors in the rotate-half
    layout, with rotate-half's sign folded into sin: cos = [c, c], sin = [-s, s] (``apply_rope`` then needs one roll,
    no negation or concatenation per call; the products are the same numbers, since negation is exact)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    freqs = positions.float()[..., None] * inv_freq  # [B, Q, hd/2]
    cos, sin = freqs.cos(), freqs.sin()
    return torch.cat([cos, cos], dim=-1)[:, None], torch.cat([-sin, sin], dim=-1)[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, full_precision: bool) -> torch.Tensor:
    """Rotate ``x`` [B, H, Q, hd] with ``rope_cos_sin``'s tables: x * cos + rotate_half(x) * [s, s], written as
    x * cos + roll(x, hd/2) * [-s, s]. ``full_precision``: LLaDA (fp32 rotation); else Dream/HF (model dtype).
    Tables narrower than hd (partial rotary, HF ``partial_rotary_factor``): the first r dims rotate, the rest pass."""
    r = cos.shape[-1]
    if r < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :r], cos, sin, full_precision), x[..., r:]], dim=-1)
    half = x.shape[-1] // 2
    if full_precision:
        xf = x.float()
        return (xf * cos + xf.roll(half, -1) * sin).to(x.dtype)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + x.roll(half, -1) * sin


class Layer(Protocol):
    """What ``layer_input`` / ``layer_output`` read from a transformer layer (LLaDA's and Dream's blocks)."""

    shape: tuple[int, int, int]  # n_heads, n_kv_heads, head_dim
    rope_fp32: bool  # rotate in fp32 (LLaDA) or in the model dtype (Dream / HF)

    def norm_attention(self, h: torch.Tensor) -> torch.Tensor: ...
    def projections(self) -> tuple[nn.Linear, nn.Linear, nn.Linear, nn.Linear]: ...  # q, k, v, out
    def norm_mlp(self, h: torch.Tensor) -> torch.Tensor: ...
    def feed_forward(self, m: torch.Tensor) -> torch.Tensor: ...

    # optional: ``norm_heads(x, "q" | "k")``, a per-head norm of q / k [B, H, Q, hd] before RoPE (qk-norm, LLaDA-MoE)


def norm_heads(block: Layer, x: torch.Tensor, which: str) -> torch.Tensor:
    """``block.norm_heads(x, which)`` when the layer has a qk-norm, else ``x`` (LLaDA, Dream)."""
    return block.norm_heads(x, which) if hasattr(block, "norm_heads") else x


def layer_input(
    block: Layer,
    h: torch.Tensor,  # [B, Q, d]
    cos: torch.Tensor,  # [B, 1, Q, hd]
    sin: torch.Tensor,
    rows: Index | None = None,  # query rows wanted (``take_rows``); None: all
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # q [B, H, N, hd], k and v [B, Hk, Q, hd]
    """The attention's inputs: norm, projections, RoPE. K/V for every row of ``h``, queries for ``rows`` alone.
    No side effects (``compiled`` relies on it: a failed compile re-runs it eagerly)."""
    n_heads, n_kv, hd = block.shape
    proj = block.projections()
    x = block.norm_attention(h)
    b, q_len, _ = x.shape
    k = proj[1](x).view(b, q_len, n_kv, hd).transpose(1, 2)  # [B, Hk, Q, hd]
    v = proj[2](x).view(b, q_len, n_kv, hd).transpose(1, 2)
    k = apply_rope(norm_heads(block, k, "k"), cos, sin, block.rope_fp32)
    x, cos, sin = take_rows(x, rows), take_rows(cos, rows, 2), take_rows(sin, rows, 2)
    n_q = x.shape[1]
    q = proj[0](x).view(b, n_q, n_heads, hd).transpose(1, 2)  # [B, H, N, hd]
    q = apply_rope(norm_heads(block, q, "q"), cos, sin, block.rope_fp32)
    return q, k, v


def attend(
    q: torch.Tensor,  # [B, H, N, hd]
    k: torch.Tensor,  # [B, Hk, Q, hd] of the computed slots
    v: torch.Tensor,
    layer: int,
    kv: KVAccess | None,
    slots: Index | None,
    key_mask: torch.Tensor | None,  # [B, S] bool, True = visible key ([B, W] with key_index)
    key_index: torch.Tensor | slice | None,  # [B, W] slots of the keys to gather, or one run shared by all rows
    visible: torch.Tensor | None = None,  # [B, 1, N, S or W] bool per query and key (key_mask folded in)
) -> torch.Tensor:  # [B, N, H * hd]
    """Bidirectional attention with GQA, heads concatenated; K/V of the computed slots go through the store ``kv``
    gives access to, when given (always eager: the store is written in place, and on CUDA the attention is the
    Triton kernel). With ``visible`` (an attention rule's mask, ``answer_block_mask``) ``key_mask`` is not read,
    and the attention is PyTorch SDPA under that mask (``pairwise_attention``), on CUDA too."""
    if kv is not None:  # attend over the store's batch (rows a forward leaves out: zero queries, see KVAccess)
        k, v = kv.update(layer, slots, k, v)  # [B of the store, Hk, S, hd]
        q, key_mask, visible = kv.spread(q), kv.spread(key_mask, True), kv.spread(visible, True)
        key_index = kv.spread(key_index) if isinstance(key_index, torch.Tensor) else key_index
    if visible is not None:
        out = pairwise_attention(q, k, v, visible, key_index)
    else:
        if isinstance(key_index, slice):  # one contiguous run of slots for every row: a view, no gather, no mask
            k, v, key_index = k[:, :, key_index], v[:, :, key_index], None
        out = masked_attention(q, k, v, key_mask=key_mask, key_index=key_index)  # [B, H, N, hd]
    if kv is not None:
        out = kv.own_rows(out)
    b, n_heads, n_q, hd = out.shape
    return out.transpose(1, 2).reshape(b, n_q, n_heads * hd)


def pairwise_attention(
    q: torch.Tensor,  # [B, H, N, hd]
    k: torch.Tensor,  # [B, Hk, S, hd]
    v: torch.Tensor,
    visible: torch.Tensor,  # [B, 1, N, S or W] bool, True = the query sees the key
    key_index: torch.Tensor | slice | None = None,  # [B, W] keys to gather, or one run of them
) -> torch.Tensor:  # [B, H, N, hd]
    """GQA attention under a per-query mask (PyTorch SDPA; its GQA broadcast, no K/V copies). A query that sees no
    key gets zeros, never NaN (as ``kernels.attention_reference``)."""
    if isinstance(key_index, slice):
        k, v = k[:, :, key_index], v[:, :, key_index]
    elif key_index is not None:
        k, v = gather_keys(k, key_index), gather_keys(v, key_index)
    gqa = q.shape[1] != k.shape[1]
    out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=gqa)
    return torch.where(visible.any(-1, keepdim=True), out, torch.zeros_like(out))


def slot_ids(slots: Index | None, shape: tuple[int, int], device: torch.device) -> torch.Tensor:  # [B or 1, Q]
    """The canvas slots of a forward's ``shape`` = (B, Q) computed rows: ``slots`` as ids (None: 0 .. Q-1)."""
    if isinstance(slots, torch.Tensor):
        return slots
    start = 0 if slots is None else slots.start or 0
    return torch.arange(start, start + shape[1], device=device)[None]


def answer_block_mask(
    rule: AnswerBlocks,
    shape: tuple[int, int],  # (B, Q): the forward's rows and computed slots
    slots: Index | None,
    kv: KVAccess | None,
    key_mask: torch.Tensor | None,  # [B, S] over the attended keys ([B, W] with key_index), True = visible
    key_index: torch.Tensor | slice | None,
    device: torch.device,
) -> torch.Tensor:  # [B, 1, Q, S or W] bool
    """Who sees whom in one forward under ``rule``, with the key-padding mask: queries are the computed slots; keys
    the store's slots 0 .. T-1 (with a store) or the computed slots (without), narrowed by ``key_index`` (a run or
    [B, W] ids into them) as the attention narrows them."""
    q_slots = slot_ids(slots, shape, device)  # [B or 1, Q]
    k_slots = q_slots if kv is None else torch.arange(kv.store.keys(0).shape[2], device=device)[None]
    if isinstance(key_index, slice):
        k_slots = k_slots[:, key_index]
    elif key_index is not None:
        k_slots = k_slots.expand(key_index.shape[0], -1).gather(1, key_index)  # [B, W]
    vis = rule.visible(q_slots, k_slots)[:, None]  # [B or 1, 1, Q, S]
    if key_mask is not None:
        vis = vis & key_mask[:, None, None, :]
    return vis.expand(shape[0], -1, -1, -1)


def forward_visibility(
    rule: AnswerBlocks | None,
    visible: torch.Tensor | None,
    layers: Any,
    shape: tuple[int, int],
    slots: Index | None,
    kv: KVAccess | None,
    key_mask: torch.Tensor | None,
    key_index: torch.Tensor | slice | None,
    device: torch.device,
) -> torch.Tensor | None:  # [B, 1, Q, S] bool, or None: the plain key mask
    """The per-query mask a ``hidden_states`` call attends under: ``visible`` as given (the official forward's 4D
    mask), else ``rule``'s (``answer_block_mask``), else None. The depth-aware layers take neither."""
    if rule is None and visible is None:
        return None
    if layers is not None:
        raise ValueError(
            "answer_blocks: the depth-aware layers (Elastic-Cache's DepthProgram, layers=...) take no attention "
            "rule; use answer_blocks with another cache (none, prefix, dual, dkv_*, window)"
        )
    if rule is not None and visible is not None:
        raise ValueError("hidden_states: give answer_blocks or visible, not both")
    return visible if visible is not None else answer_block_mask(rule, shape, slots, kv, key_mask, key_index, device)


def pairwise_mask(mask: torch.Tensor, batch: int, length: int) -> torch.Tensor:  # [B, 1, T, T] bool
    """An official forward's 4D ``attention_mask`` [B or 1, 1, T, T] as a bool mask: True where the query may look
    (bool as is; an additive float mask: its zeros, the hidden entries being -inf or the dtype's lowest value)."""
    if mask.dim() != 4 or mask.shape[1:] != (1, length, length) or mask.shape[0] not in (1, batch):
        raise ValueError(
            f"attention_mask: a 4D mask must be [{batch} or 1, 1, {length}, {length}], got {tuple(mask.shape)}"
        )
    if mask.dtype == torch.bool:
        return mask.expand(batch, -1, -1, -1)
    if not mask.is_floating_point() or not bool(((mask == 0) | (mask <= torch.finfo(mask.dtype).min)).all()):
        raise ValueError(
            "attention_mask: a 4D mask is bool (True = visible) or additive float (0 = visible, -inf = hidden); "
            f"got {mask.dtype} with other values"
        )
    return (mask == 0).expand(batch, -1, -1, -1)


def query_rows(visible: torch.Tensor | None, rows: Index | None) -> torch.Tensor | None:  # [B, 1, N, S]
    """The query ``rows`` of a [B, 1, Q, S] mask (None stays None)."""
    return None if visible is None else take_rows(visible, rows, 2)


def layer_output(
    block: Layer,
    attn: torch.Tensor,  # [B, N, H * hd] from ``attend``
    h: torch.Tensor,  # [B, Q, d] the layer's input
    rows: Index | None = None,
) -> torch.Tensor:  # [B, N, d]
    """Output projection, residual, norm, MLP, residual, for the query ``rows`` of ``h``. No side effects."""
    h = take_rows(h, rows) + block.projections()[3](attn)
    return h + block.feed_forward(block.norm_mlp(h))


class EagerLayers:
    """The layer pieces as plain PyTorch (the default; ``compiled.CompiledLayers`` has the same interface)."""

    mode: str | None = None

    def input(self, block: Layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rows: Index | None):
        return layer_input(block, h, cos, sin, rows)

    def output(self, block: Layer, attn: torch.Tensor, h: torch.Tensor, rows: Index | None) -> torch.Tensor:
        return layer_output(block, attn, h, rows)


EAGER = EagerLayers()


def layer_forward(
    block: Layer,
    h: torch.Tensor,  # [B, Q, d]
    cos: torch.Tensor,  # [B, 1, Q, hd]
    sin: torch.Tensor,
    layer: int,
    kv: KVAccess | None,
    slots: Index | None,
    key_mask: torch.Tensor | None,
    key_index: torch.Tensor | slice | None,
    rows: Index | None = None,  # query rows whose output is wanted (``take_rows``); None: all
    pieces: EagerLayers = EAGER,
    visible: torch.Tensor | None = None,  # [B, 1, Q, S] bool per query (``forward_visibility``); None: key_mask
) -> torch.Tensor:  # [B, Q, d] ([B, N, d] with rows)
    """One pre-norm transformer layer: ``layer_input``, ``attend``, ``layer_output``. ``pieces`` runs the first and
    the last, eagerly or compiled (``compiled.CompiledLayers``); the attention and the store always run eagerly.
    With ``rows``, K/V come from every row of ``h`` but only those rows are queried and go through the MLP."""
    q, k, v = pieces.input(block, h, cos, sin, rows)
    attn = attend(q, k, v, layer, kv, slots, key_mask, key_index, query_rows(visible, rows))
    return pieces.output(block, attn, h, rows)


class DiffusionLMMixin:
    """The decoding surface of a masked-diffusion LM (mixed into the transformers ``PreTrainedModel`` classes).

    Subclasses implement ``hidden_states``, ``output_logits``, ``kv_shape``, ``max_sequence_length`` and set
    ``logit_shift`` (0: hidden i predicts slot i, LLaDA; 1: hidden i-1 predicts slot i, Dream).
    """

    logit_shift: int = 0
    #: True for block-causal models (LLaDA2): decoded block by block on the absolute grid, ``denoise(block_length=)``
    block_causal: bool = False
    #: how the layers run their pieces (``common.EAGER``, or ``compiled.CompiledLayers`` set by
    #: ``compiled.set_compile`` or for one ``generate(compile=...)`` call)
    layer_pieces: EagerLayers = EAGER

    def _init_weights(self, module: nn.Module) -> None:
        """transformers' weight init for fresh models (LLaDA and Dream alike): normal(0.02) linears and embeddings,
        zero biases, unit RMSNorm scales. Checkpoints overwrite every tensor."""
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)

    # -- attributes read by the decoder -------------------------------------------------------------------
    @property
    def mask_token_id(self) -> int:
        mid = getattr(self.config, "mask_token_id", None)
        if mid is None:
            raise ValueError(f"{type(self).__name__}: config has no mask_token_id; set it in config.json")
        return int(mid)

    @property
    def eos_token_ids(self) -> list[int]:
        ids = getattr(self.config, "eos_token_id", None)
        ids = [ids] if isinstance(ids, int) else list(ids or [])
        extra = getattr(self.config, "extra_eos_token_ids", None) or []
        return sorted(set(ids) | set(extra))

    @property
    def max_sequence_length(self) -> int:
        raise NotImplementedError

    @property
    def sampling_defaults(self) -> dict[str, Any]:
        """Options (``DecodeConfig`` or sampler field names) the model's own reference generate takes from the
        checkpoint when its caller leaves them unset; samplers that re-state that generate fill their unset (None)
        options from here. Empty by default: LLaDA's ``generate()`` reads nothing from a checkpoint (neither
        config.json nor generation_config.json). Dream overrides it (``diffusion_generate``'s top-k 50, ...)."""
        return {}

    def kv_shape(self) -> tuple[int, int, int]:
        """(n_layers, n_kv_heads, head_dim) for preallocating a K/V store."""
        raise NotImplementedError

    # -- the decoding forward -----------------------------------------------------------------------------
    def hidden_states(
        self,
        input_ids: torch.Tensor,  # [B, Q] tokens at the computed slots
        positions: torch.Tensor,  # [B, Q] rope positions of those slots
        *,
        kv: KVAccess | None = None,
        slots: Index | None = None,
        key_mask: torch.Tensor | None = None,
        key_index: torch.Tensor | None = None,
        rows: Index | None = None,
        layers: Any = None,
        answer_blocks: AnswerBlocks | None = None,
        visible: torch.Tensor | None = None,
    ) -> torch.Tensor:  # [B, Q, d] ([B, N, d] with rows), after the final norm
        """Hidden states of the query slots; ``rows`` (a slice or [B, N] ids into Q): only those are returned, and
        the last layer runs its attention output and MLP for them alone (its K/V still come from every row).
        ``layers`` (a ``depth.DepthProgram``): the layer loop is ``layers.run`` (its compute set may widen per
        layer), the rest as usual. ``answer_blocks`` (bidirectional models): every layer attends under D2F's rule
        on top of ``key_mask`` (``forward_visibility``); ``visible`` [B, 1, Q, S] bool: that mask given outright
        instead of ``key_mask`` (the official forward's 4D mask)."""
        raise NotImplementedError

    def output_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    #: the step graphs of the running ``generate(cuda_graphs=True)`` call (``graphs.using_graphs``), else None
    step_graphs: Any = None

    @torch.no_grad()
    def denoise(
        self,
        canvas: torch.Tensor,  # [B, T]
        positions: torch.Tensor,  # [B, T]
        *,
        compute: Index = slice(None),
        region: tuple[int, int],
        store: KVStore | KVAccess | None = None,  # a bare store: every row, written (``KVAccess(store)``)
        key_mask: torch.Tensor | None = None,  # [B, T] (or [B, W] with key_index)
        key_index: torch.Tensor | slice | None = None,  # [B, W] slots to attend to, or a run shared by all rows
        read: torch.Tensor | None = None,  # [B, N] region offsets whose logits are wanted; None: all of the region
        layers: Any = None,  # a ``depth.DepthProgram``: the layers run depth-aware (Elastic-Cache); None: plainly
        block_length: int | None = None,  # block-causal models: the attention's block on the absolute position grid
        answer_blocks: AnswerBlocks | None = None,  # bidirectional models: D2F's answer-block rule; None: plain
    ) -> torch.Tensor:  # [B, R, V] logits; logits[:, j] predicts slot region[0] + j
        """Compute hidden states at ``compute`` slots and return aligned logits for slots ``[r0, r1)``.

        With an index tensor, region slots whose predicting hidden state was not computed get the logits of the
        nearest computed slot; cache policies always compute the states behind masked region slots. ``read``
        (offsets ``0 .. R-1``, repeats allowed): only those slots get logits, the others zeros; the hidden states
        behind them alone go through the last layer's attention output and MLP, the final norm and the LM head.
        On the CPU the head of a batch skips each row's trailing repeats (``_head_unpadded``).
        ``store``: the K/V store, with the forward's rows of it and whether it is written (a ``KVAccess``).
        ``block_length``: for a block-causal model (``block_causal``), a query sees its own block and the earlier ones
        of the absolute position grid; None on the bidirectional models. ``answer_blocks`` (a ``visibility.
        AnswerBlocks``): on the bidirectional models, a query sees a key iff the key's block (the prompt, then the
        answer blocks) is not after its own, on top of ``key_mask``; it holds on every path (computed slice or slot
        ids, a store and the rows it spreads, a key run or gathered keys), except the depth-aware ``layers``
        (ValueError). The attention then is PyTorch SDPA under a per-query mask, never the Triton kernel.
        """
        b, t = canvas.shape
        r0, r1 = region
        s = self.logit_shift
        if read is None:  # the hidden slot predicting each region slot
            want = (torch.arange(r0, r1, device=canvas.device) - s).clamp(min=0).expand(b, -1)  # [B, R]
        else:
            want = (read + (r0 - s)).clamp(min=0)  # [B, N]
        if isinstance(compute, slice):
            c0, c1, _ = compute.indices(t)
            if max(r0 - s, 0) < c0 or max(r1 - 1 - s, 0) >= c1:
                raise ValueError(f"region {region} needs hidden states outside the computed slots [{c0}, {c1})")
            contiguous = read is None and r0 - s >= 0
            rows = slice(r0 - s - c0, r1 - s - c0) if contiguous else want - c0
            ids, pos, slots = canvas[:, c0:c1], positions[:, c0:c1], slice(c0, c1)
        else:
            # row-wise lookup of the computed row holding each wanted slot (compute is sorted per row)
            rows = torch.searchsorted(compute.contiguous(), want.contiguous()).clamp(max=compute.shape[1] - 1)
            ids, pos, slots = canvas.gather(1, compute), positions.gather(1, compute), compute
        kv = KVAccess(store) if isinstance(store, KVStore) else store
        kw = {} if layers is None else {"layers": layers}
        if block_length is not None:  # only block-causal models take it
            kw["block_length"] = block_length
        if answer_blocks is not None:  # only the bidirectional ones take it
            if self.block_causal:
                raise ValueError(
                    f"answer_blocks: {type(self).__name__} is block-causal already (its rule is block_length on the "
                    "absolute position grid); answer_blocks is for the bidirectional models (LLaDA, Dream, LLaDA-MoE)"
                )
            kw["answer_blocks"] = answer_blocks
        hid = self.hidden_states(ids, pos, kv=kv, slots=slots, key_mask=key_mask, key_index=key_index, rows=rows, **kw)
        if read is None:
            return self.output_logits(hid)  # [B, R, V]
        if b > 1 and hid.device.type == "cpu":  # the head over each row's own slots, never its padding
            return _head_unpadded(self.output_logits, hid, read, r1 - r0)
        logits = self.output_logits(hid)  # [B, N, V]
        out = logits.new_zeros(b, r1 - r0, logits.shape[-1])
        return out.scatter_(1, read[..., None].expand_as(logits), logits)
