"""The training objective: LLaDA's SFT loss on the response tokens, for either model family.

Nie et al. 2025, "Large Language Diffusion Models", Alg. 2 and the SFT guidelines of the LLaDA repository: the prompt
is never masked; the response (answer, ``<|eot_id|>``, then ``<|endoftext|>`` up to the task's generation length) is
masked independently per token with probability ``p = (1 - eps) t + eps``, ``t ~ U(0, 1)`` per row, and the loss is
the cross-entropy on masked response tokens weighted by ``1 / p`` and divided by the response length, averaged over
the batch. Dream's logits are shifted (``logit_shift`` 1): token ``i`` is scored from the hidden state at ``i - 1``.

A stale row (``stale``: its share and block, ``stale.py``) is scored the way a Fast-dLLM prefix or dual cache serves
it at decode time: one block of its response attends to the other positions' keys and values from the block's
refresh canvas.

A block-causal model (``family: llada2``) is trained with its decoding mask: ``block_length`` goes to the model's
``hidden_states``, so a token sees its own block and every earlier one on the absolute position grid (position 0 is
the row's first real token, as in decoding), never a later block; the forward process and loss are the same.
A clean-context row (``clean_context``: its share) is the state a block is decoded in: one grid block of the response
is masked by the row's draw, the response before it is its true text, and only that block is scored (weighted by
its length). Block diffusion's training (Arriola et al. 2025, BD3-LM; LLaDA2.0's and SDAR's recipes) noises each
block against clean earlier blocks for this reason; a whole-response draw almost never shows a heavily masked block
after clean ones, the state every block after the first starts from at decode time.

A whole-name row (``whole_names``: its share) masks a person whole: each last-name token (``joins``: the ids that
continue a name) takes the mask draw of the token before it, its first name, so the canvas often holds a person
fully masked among visible ones. Per-token draws almost never do (both halves masked at rate t**2, and a visible
last name gives its first name away), yet that is the state a random-output task's last undecided person is decoded
in: shuffle's unused name, replace_random's word when no other slot took it. This is whole-word masking (Devlin et
al., BERT's WWM release; SpanBERT's span masking, Joshi et al. 2020) with a person as the word; the per-token rate
and the loss weights are unchanged.

A decode-order row (a self row of ``trajectories.py --states``) is trained in the state the model's own decoding
was in: its ``masked`` slots are masks, the rest its target's text, and only its ``scored`` slots (the block being
decoded) are scored, each row's loss the mean cross-entropy over them (``p_mask`` 1, length = the scored count). The
other rows' draws are made first and unchanged, so a batch without such rows trains exactly as before.

Rows are left-padded (positions ``cumsum(valid) - 1``, key-padding mask), the canvas layout ``dlm_decode.generate``
decodes with. The masks of a step are drawn from ``step_generator(seed, step)``, so a resumed run draws the same.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from recipes.train_demo.stale import draw_stale_rows, stale_hidden_states


def collate(rows: list[tuple], pad_id: int) -> dict[str, torch.Tensor]:
    """Left-pad (prompt, response[, (masked, scored)]) rows -> ids, valid, response mask [B, T], response length
    [B]; with any decode-order row also ``state`` [B] bool and its ``state_masked`` / ``state_scored`` [B, T]."""
    t = max(len(row[0]) + len(row[1]) for row in rows)
    b = len(rows)
    ids = torch.full((b, t), pad_id, dtype=torch.long)
    valid = torch.zeros((b, t), dtype=torch.bool)
    resp = torch.zeros((b, t), dtype=torch.bool)
    resp_len = torch.zeros(b)
    state = torch.zeros(b, dtype=torch.bool)
    slots = {key: torch.zeros((b, t), dtype=torch.bool) for key in ("state_masked", "state_scored")}
    for i, (p, r, *st) in enumerate(rows):
        n = len(p) + len(r)
        ids[i, t - n :] = torch.tensor(p + r)
        valid[i, t - n :] = True
        resp[i, t - len(r) :] = True
        resp_len[i] = len(r)
        if st:
            state[i] = True
            for key, where in zip(slots, st[0], strict=True):
                slots[key][i, [t - len(r) + j for j in where]] = True
    batch = {"input_ids": ids, "valid": valid, "response": resp, "response_length": resp_len}
    return {**batch, "state": state, **slots} if state.any() else batch


def mask_response(
    batch: dict[str, torch.Tensor],
    mask_id: int,
    generator: torch.Generator,
    eps: float = 1e-3,
    stratified: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LLaDA forward process on the response only -> noisy ids, masked positions [B, T], p_mask [B].

    ``stratified``: the batch's t are one draw from each of B equal strata of [0, 1) in a random order (same
    marginal U(0, 1) per row, far less variance of the 1/p-weighted loss across batches)."""
    ids, resp = batch["input_ids"], batch["response"]
    b, t = ids.shape
    t_draw = torch.rand(b, generator=generator, device=generator.device)
    if stratified:
        order = torch.randperm(b, generator=generator, device=generator.device)
        t_draw = (order + t_draw) / b
    t_draw = t_draw.to(ids.device)
    p_mask = (1 - eps) * t_draw + eps  # [B]
    u = torch.rand(b, t, generator=generator, device=generator.device).to(ids.device)
    masked = (u < p_mask[:, None]) & resp  # [B, T]
    return torch.where(masked, torch.full_like(ids, mask_id), ids), masked, p_mask


def masked_logits(
    model: Any,
    batch: dict[str, torch.Tensor],
    generator: torch.Generator,
    eps: float = 1e-3,
    stratified: bool = False,
    block_length: int | None = None,
    stale: tuple[float, int] | None = None,
    clean_context: float = 0.0,
    whole_names: tuple[float, torch.Tensor] | None = None,
    noisy_prefix: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mask the responses (``mask_response``) and score the masked slots: logits [M, V] from hidden ``i -
    logit_shift`` (the LM head runs only on those), their true ids [M], each one's batch row [M], p_mask [B] and
    each row's scored length [B] (the response's; a stale or clean-context row's block's).
    ``block_length``: block-causal attention (block-causal models only); ``stale``: (share, block) of stale rows
    (bidirectional models; ``stale.py``) and ``clean_context``: the share of clean-context rows (block-causal
    models), both drawn after the masks so that share 0 draws what it always drew; ``whole_names``: (share, joins
    [V] bool) of whole-name rows, drawn right after the masks."""
    core = model.module if hasattr(model, "module") else model
    ids, valid = batch["input_ids"], batch["valid"]
    noisy, masked, p_mask = mask_response(batch, core.mask_token_id, generator, eps, stratified)
    if whole_names and whole_names[0] > 0:
        masked = whole_name_masks(batch, masked, whole_names[1], whole_names[0], generator)
        noisy = torch.where(masked, torch.full_like(ids, core.mask_token_id), ids)
    length = batch["response_length"].clone()
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    if clean_context > 0:
        if block_length is None:
            raise ValueError("clean_context rows need a block-causal model (block_length)")
        prefix = (noisy_prefix, p_mask, core.mask_token_id) if noisy_prefix > 0 else None
        noisy, masked, length = clean_context_rows(
            batch, noisy, masked, positions // block_length, clean_context, generator, prefix
        )
    if "state" in batch:
        noisy, masked, p_mask, length = decode_state_rows(batch, noisy, masked, p_mask, length, core.mask_token_id)
    spec = None
    if stale and stale[0] > 0:
        if "state" in batch:
            raise ValueError("decode-order self rows and stale rows cannot share a batch (stale rows: bidirectional)")
        spec = draw_stale_rows(batch["response"], stale[0], stale[1], generator, core.logit_shift)
    if spec is None:
        kw = {"block_length": block_length} if block_length is not None else {}
        hid = core.hidden_states(noisy, positions, key_mask=valid, **kw)  # [B, T, d]
    else:
        scored = masked[spec.rows] & spec.block  # [N, T]: only the block is scored
        masked = masked.index_put((spec.rows,), scored)
        length[spec.rows] = spec.block_length
        canvas = torch.where(spec.block, noisy[spec.rows], ids[spec.rows])  # the response before the block is text
        noisy = noisy.index_put((spec.rows,), canvas).masked_fill(spec.after, core.mask_token_id)
        hid = stale_hidden_states(core, noisy, positions, valid, spec)
    rows, cols = masked.nonzero(as_tuple=True)
    logits = core.output_logits(hid[rows, cols - core.logit_shift])  # [M, V]
    return logits, ids[rows, cols], rows, p_mask, length


def decode_state_rows(
    batch: dict[str, torch.Tensor],
    noisy: torch.Tensor,  # [B, T]
    masked: torch.Tensor,  # [B, T] bool, scored slots
    p_mask: torch.Tensor,  # [B]
    length: torch.Tensor,  # [B]
    mask_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The decode-order rows (``batch["state"]``) put in their own state: their masked slots masked, the rest text,
    their scored slots scored, p_mask 1 and length the scored count (loss = mean CE over them); other rows as given."""
    ids, row = batch["input_ids"], batch["state"][:, None]
    canvas = torch.where(batch["state_masked"], torch.full_like(ids, mask_id), ids)
    noisy = torch.where(row, canvas, noisy)
    masked = torch.where(row, batch["state_scored"], masked)
    p_mask = torch.where(batch["state"], torch.ones_like(p_mask), p_mask)
    length = torch.where(batch["state"], batch["state_scored"].sum(1).to(length.dtype), length)
    return noisy, masked, p_mask, length


def whole_name_masks(
    batch: dict[str, torch.Tensor],
    masked: torch.Tensor,  # [B, T] bool, the per-token draw's masked response slots
    joins: torch.Tensor,  # [V] bool: the ids that continue the name before them (last names)
    share: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """Rows picked with probability ``share`` get each response slot holding a ``joins`` id masked exactly when
    the slot before it is (its first name's draw); the other rows keep their draw. -> masked [B, T]."""
    ids, resp = batch["input_ids"], batch["response"]
    pick = torch.rand(ids.shape[0], generator=generator, device=generator.device).to(ids.device) < share  # [B]
    tail = joins.to(ids.device)[ids] & resp & pick[:, None]  # [B, T]
    tail[:, 0] = False
    lead = torch.zeros_like(masked)
    lead[:, 1:] = masked[:, :-1]  # masked holds response slots only
    return torch.where(tail, lead, masked)


def name_tail_ids(tokenizer: Any, names: list[list[str]]) -> torch.Tensor:
    """[V] bool: the ids that continue a person's name in an answer (every token of ``"First Last"`` but the
    first, tokenized as the answers write it, inside quotes)."""
    joins = torch.zeros(len(tokenizer), dtype=torch.bool)
    for first in names[0]:
        head = len(tokenizer(f'"{first}', add_special_tokens=False)["input_ids"])
        for last in names[1]:
            ids = tokenizer(f'"{first} {last}"', add_special_tokens=False)["input_ids"]
            joins[ids[head:-1]] = True
    return joins


def clean_context_rows(
    batch: dict[str, torch.Tensor],
    noisy: torch.Tensor,  # [B, T] the masked canvas
    masked: torch.Tensor,  # [B, T] bool, its masked response slots
    grid: torch.Tensor,  # [B, T] each slot's block on the absolute grid (positions // block_length)
    share: float,
    generator: torch.Generator,
    noisy_prefix: tuple[float, torch.Tensor, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pick rows with probability ``share`` and one block of each picked row's response (uniform over the grid
    blocks that hold response slots): the response before it becomes its true text, and only the block's masked
    slots stay scored (a block-causal block never sees the slots after it). -> noisy, masked [B, T], and each row's
    scored length [B] (the block's response slots for a picked row, the response's otherwise).

    ``noisy_prefix`` (share, p_mask [B], mask id): that share of the picked rows keep the block before the scored one
    partly masked, at a rate ``u * p_mask`` (u ~ U(0, 1): less noisy than the block), the state a block starts from
    when several blocks are in flight (D2F's noisy earlier blocks, ``core.frontier``); its slots are not scored.
    Drawn after the other draws, so share 0 draws what it always drew."""
    ids, resp = batch["input_ids"], batch["response"]
    b = ids.shape[0]
    pick = torch.rand(b, generator=generator, device=generator.device).to(ids.device) < share  # [B]
    where = torch.rand(b, generator=generator, device=generator.device).to(ids.device)
    first = torch.where(resp, grid, grid.new_tensor(2**30)).amin(1)  # [B] the response's first block
    last = torch.where(resp, grid, grid.new_tensor(-1)).amax(1)
    chosen = first + (where * (last - first + 1)).floor().long()  # [B]
    before = resp & (grid < chosen[:, None]) & pick[:, None]
    outside = resp & (grid != chosen[:, None]) & pick[:, None]
    in_block = (resp & (grid == chosen[:, None])).sum(1).float()
    length = torch.where(pick, in_block, batch["response_length"])
    canvas = torch.where(before, ids, noisy)
    if noisy_prefix is not None and noisy_prefix[0] > 0:
        canvas = _noisy_previous_block(canvas, before & (grid == chosen[:, None] - 1), noisy_prefix, generator)
    return canvas, masked & ~outside, length


def _noisy_previous_block(
    canvas: torch.Tensor, prev: torch.Tensor, noisy_prefix: tuple[float, torch.Tensor, int], generator: torch.Generator
) -> torch.Tensor:
    """``canvas`` [B, T] with the slots of ``prev`` [B, T] (a picked row's block before its scored one) masked at
    the rate ``u * p_mask`` in a ``share`` of the rows (``clean_context_rows``)."""
    share, p_mask, mask_id = noisy_prefix
    b, t = canvas.shape
    dev = generator.device
    take = torch.rand(b, generator=generator, device=dev).to(canvas.device) < share  # [B]
    rate = torch.rand(b, generator=generator, device=dev).to(canvas.device) * p_mask  # [B]
    u = torch.rand(b, t, generator=generator, device=dev).to(canvas.device)
    hide = prev & take[:, None] & (u < rate[:, None])
    return canvas.masked_fill(hide, mask_id)


def diffusion_loss(
    model: Any,
    batch: dict[str, torch.Tensor],
    generator: torch.Generator,
    eps: float = 1e-3,
    stratified: bool = False,
    block_length: int | None = None,
    stale: tuple[float, int] | None = None,
    clean_context: float = 0.0,
    whole_names: tuple[float, torch.Tensor] | None = None,
    noisy_prefix: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """LLaDA SFT loss: sum over masked response tokens of CE / p_mask, divided by the response length (a stale or
    clean-context row's block length), batch mean."""
    logits, target, rows, p_mask, length = masked_logits(
        model, batch, generator, eps, stratified, block_length, stale, clean_context, whole_names, noisy_prefix
    )
    ce = F.cross_entropy(logits.float(), target, reduction="none")  # [M]
    weight = 1.0 / (p_mask[rows] * length[rows])
    loss = (ce * weight).sum() / batch["input_ids"].shape[0]
    return loss, {"masked": int(rows.numel()), "ce": float(ce.detach().mean()) if rows.numel() else 0.0}


def step_generator(seed: int, step: int, device: Any = "cpu") -> torch.Generator:
    """The masking RNG of one step: a function of (seed, step), so a resumed run draws the same masks."""
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1_000_003 + step)
    return g
