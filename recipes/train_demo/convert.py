"""Start a Dream-architecture demo model from a trained LLaDA-architecture one (a warm start, not a checkpoint format
conversion of official weights).

    python recipes/train_demo/convert.py --llada RUN/export --out RUN2/init [--query-shift 1] [--shift-layers 1]
    python recipes/train_demo/convert.py --llada demo-llada --compare   # which warm start reads best

``--compare`` scores the variants (no shift; shift +1 / -1 in the last 1, 2 or all layers) by the share of masked
answer tokens the Dream-layout model predicts right before any training: 128 fresh official-format rows of copy,
reverse, remove_index and insert_index, answers masked at t ~ U(0, 1) as in training.

Why: three Dream runs from fresh weights ended on the same plateau (first names found on the official prompts, last
names never, README "Fifth round"), while the LLaDA demo model, trained with the same rows, reads both. The two
architectures are the same transformer here (pre-norm RMSNorm, SwiGLU, RoPE with rotate-half pairs, untied output
head); Dream adds q/k/v biases (set to zero) and scores token ``i`` from the hidden state at ``i - 1``. So a Dream
model with the LLaDA model's weights computes the LLaDA model's logits exactly (``rms_norm_eps`` is copied), only
read one slot too early; fine-tuning with the Dream loss (``train.py --arch dream --init``) then has to learn that
one-slot shift, not in-context retrieval from nothing.

``--query-shift s`` additionally rotates every head's query projection by ``s`` RoPE positions in the last
``--shift-layers`` layers (default: all): a query at position ``p`` then scores keys as the LLaDA query at ``p + s``
did, so attention that retrieves by relative position looks one slot further on, which is where the source of the
token Dream must predict at ``p`` sits for position-copying tasks. The rotation is exact (RoPE is a rotation of each
(j, j + hd/2) pair by ``p * inv_freq[j]``; rotating by ``s`` more is a fixed linear map folded into ``q_proj``).
The number of layers and heads, the width and the vocabulary are the LLaDA model's; ``num_key_value_heads`` is its
``n_kv_heads`` (4 for the demo, where the official Dream-7B uses grouped queries: both are valid Dream configs).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from dlm_decode.models.dream import DreamConfig, DreamModel
from dlm_decode.models.llada import LLaDAModelLM


def rope_shift_matrix(head_dim: int, theta: float, shift: float) -> torch.Tensor:
    """[hd, hd] ``R`` with ``rope(R q, p) == rope(q, p + shift)`` (the rotate-half layout of ``apply_rope``)."""
    half = head_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))  # [hd/2]
    ang = shift * inv_freq
    c, s = ang.cos(), ang.sin()
    r = torch.zeros(head_dim, head_dim, dtype=torch.float64)
    idx = torch.arange(half)
    r[idx, idx] = c  # x1' = x1 cos - x2 sin
    r[idx, idx + half] = -s
    r[idx + half, idx + half] = c  # x2' = x2 cos + x1 sin
    r[idx + half, idx] = s
    return r


def llada_to_dream(
    llada: LLaDAModelLM, *, bos_token_id: int | None = None, query_shift: float = 0.0, shift_layers: int | None = None
) -> DreamModel:
    """A ``DreamModel`` whose unshifted logits equal ``llada``'s (``query_shift`` 0); weights copied, biases zero."""
    c = llada.config
    if c.weight_tying:
        raise ValueError("the LLaDA model ties its output head to the embedding; Dream checkpoints here are untied")
    if c.include_qkv_bias:
        raise ValueError("a LLaDA model with q/k/v biases is not supported by this warm start")
    cfg = DreamConfig(
        vocab_size=c.embedding_size or c.vocab_size,
        hidden_size=c.d_model,
        intermediate_size=c.mlp_hidden_size or c.mlp_ratio * c.d_model,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_kv_heads,
        max_position_embeddings=c.max_sequence_length,
        rope_theta=c.rope_theta,
        rms_norm_eps=c.rms_norm_eps,
        bos_token_id=bos_token_id,
        eos_token_id=c.eos_token_id,
        pad_token_id=c.pad_token_id,
        mask_token_id=c.mask_token_id,
    )
    dream = DreamModel(cfg)
    src = llada.model.transformer
    hd = c.d_model // c.n_heads
    n_shift = c.n_layers if shift_layers is None else shift_layers
    rot = rope_shift_matrix(hd, c.rope_theta, query_shift)
    with torch.no_grad():
        dream.model.embed_tokens.weight.copy_(src.wte.weight)
        dream.lm_head.weight.copy_(src.ff_out.weight)
        dream.model.norm.weight.copy_(src.ln_f.weight)
        for i, (a, b) in enumerate(zip(src.blocks, dream.model.layers, strict=True)):
            q = a.q_proj.weight.double().view(c.n_heads, hd, c.d_model)  # [H, hd, d]
            if query_shift and i >= c.n_layers - n_shift:
                q = torch.einsum("ij,hjd->hid", rot, q)
            att = b.self_attn
            att.q_proj.weight.copy_(q.reshape(c.d_model, c.d_model).float())
            att.k_proj.weight.copy_(a.k_proj.weight)
            att.v_proj.weight.copy_(a.v_proj.weight)
            for bias in (att.q_proj.bias, att.k_proj.bias, att.v_proj.bias):
                bias.zero_()
            att.o_proj.weight.copy_(a.attn_out.weight)
            b.mlp.gate_proj.weight.copy_(a.ff_proj.weight)
            b.mlp.up_proj.weight.copy_(a.up_proj.weight)
            b.mlp.down_proj.weight.copy_(a.ff_out.weight)
            b.input_layernorm.weight.copy_(a.attn_norm.weight)
            b.post_attention_layernorm.weight.copy_(a.ff_norm.weight)
    return dream


def masked_accuracy(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]]) -> tuple[float, float]:
    """(share of masked response tokens predicted right, mean CE), masked as in training (``train.masked_logits``)."""
    from train import masked_logits, step_generator  # recipes/train_demo siblings

    right = total = 0
    ces = []
    model.eval()
    with torch.no_grad():
        for i, b in enumerate(batches):
            logits, target, _, _ = masked_logits(model, b, step_generator(5, i))  # [M, V], [M]
            right += int((logits.argmax(-1) == target).sum())
            total += target.numel()
            ces.append(float(torch.nn.functional.cross_entropy(logits, target)))
    return right / total, sum(ces) / len(ces)


def compare(llada: LLaDAModelLM, tok: object, data_dir: str) -> list[dict]:
    """The warm-start variants scored by ``masked_accuracy`` on fresh official-format rows (seed 777)."""
    from stream import Mix, RowStream
    from train import collate

    stream = RowStream(data_dir, tok, 777)
    tasks = tuple(f"waiting_line/{t}" for t in ("copy", "reverse", "remove_index", "insert_index"))
    batches = [collate([(p, r) for p, r, _ in stream.rows(s, Mix(32, 0.0, tasks))], tok.pad_token_id) for s in range(4)]
    acc, ce = masked_accuracy(llada, batches)
    out = [{"model": "llada (its own layout)", "acc": acc, "ce": ce}]
    variants = [(0.0, None)] + [(s, n) for s in (1.0, -1.0) for n in (1, 2, None)]
    for shift, layers in variants:
        dream = llada_to_dream(llada, bos_token_id=tok.bos_token_id, query_shift=shift, shift_layers=layers)
        acc, ce = masked_accuracy(dream, batches)
        where = (layers or "all") if shift else 0
        out.append({"model": "dream", "query_shift": shift, "shift_layers": where, "acc": acc, "ce": ce})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llada", required=True, help="exported LLaDA-architecture model directory (or demo-llada)")
    ap.add_argument("--out", help="directory for the Dream-architecture model and tokenizer")
    ap.add_argument("--compare", action="store_true", help="score the warm-start variants instead of writing one")
    ap.add_argument("--parallelbench", default="/work/shared/data/parallelbench", help="task configs for --compare")
    ap.add_argument("--query-shift", type=float, default=0.0, help="RoPE positions to rotate the queries by")
    ap.add_argument("--shift-layers", type=int, default=None, help="rotate the queries of the last N layers")
    args = ap.parse_args(argv)
    if not args.compare and not args.out:
        ap.error("--out is required (or --compare)")
    from dlm_decode.models import load_model

    model, tok = load_model(args.llada, dtype=torch.float32)
    if model.logit_shift != 0:
        sys.exit(f"--llada {args.llada}: not a LLaDA-architecture model (model_type {model.config.model_type!r})")
    if args.shift_layers is not None and not 0 <= args.shift_layers <= model.config.n_layers:
        sys.exit(f"--shift-layers must be in [0, {model.config.n_layers}], got {args.shift_layers}")
    if args.compare:  # train.py / stream.py are importable: this script's folder is on sys.path
        for line in compare(model, tok, args.parallelbench):
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in line.items()}))
        return
    dream = llada_to_dream(
        model, bos_token_id=tok.bos_token_id, query_shift=args.query_shift, shift_layers=args.shift_layers
    )
    out = Path(args.out)
    dream.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    print(f"wrote {out}: Dream architecture from {args.llada} (query shift {args.query_shift})")


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "train_demo/convert.py")
