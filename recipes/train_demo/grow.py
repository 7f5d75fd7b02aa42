"""Grow a trained LLaDA-architecture demo model wider and deeper without changing what it computes (a warm start).

    python recipes/train_demo/grow.py --model demo-llada --out RUN/init --d-model 256 --mlp-hidden 768 --n-layers 6
    python recipes/train_demo/train.py ... --init RUN/init   # then train the grown model

Why: the 4-layer, d_model-128 demo model retrieves by position but never learned to compare people by content
(README, sixth to tenth rounds: find rows, ``exclusion_probe.py`` 0/40), which shuffle, the random-output tasks and
sort need, and each run gains some (task, distance) routes while losing others. "A wider model" is the issue's next
approach, but from fresh weights in-context copying alone took 1,500-2,500 CPU steps here. Growing keeps every
learned route and adds room next to it (Net2Net-style function-preserving growth, Chen et al. 2016):

* width: the old ``d_model`` dimensions keep their weights; the new ones start at zero in the embedding and in every
  projection that writes the residual stream (attention output, MLP output), so the residual stream stays the old one
  padded with zeros. Head dim is kept (``d_model / n_heads``), so the new width is new heads; the new heads' and the
  new MLP neurons' input weights are the fresh model's initialisation, their output weights zero.
* RMSNorm over the padded stream: the mean of squares over ``D`` dims is ``d / D`` times the old one, so every norm
  weight is scaled by ``sqrt(d / D)`` and ``rms_norm_eps`` by ``d / D``; the normalised values are then the old ones
  exactly (up to float rounding).
* depth: new layers go on top of the old ones with their attention and MLP outputs zero, so each is the identity
  until training moves it.

The logits of the grown model equal the old model's (the script prints the largest difference on two rows of random
ids; the tests check it on a tiny model). Only LLaDA-architecture models (``demo-dream`` starts from demo-llada
with ``convert.py``).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from dlm_decode.models import load_model
from dlm_decode.models.llada import LLaDAConfig, LLaDAModelLM


def grow(old: LLaDAModelLM, d_model: int, mlp_hidden: int, n_layers: int, seed: int = 0) -> LLaDAModelLM:
    """A model of the given size that computes ``old``'s logits (module docstring); fresh init for the new parts."""
    c = old.config
    hd = c.d_model // c.n_heads
    d, m = c.d_model, c.mlp_hidden_size or c.mlp_ratio * c.d_model
    if c.n_kv_heads != c.n_heads:
        raise SystemExit("grouped-query models are not supported (n_kv_heads must equal n_heads)")
    if d_model < d or d_model % hd or mlp_hidden < m or n_layers < c.n_layers:
        raise SystemExit(
            f"the new size must contain the old one (d_model >= {d}, a multiple of the head dim {hd}; "
            f"mlp_hidden >= {m}; n_layers >= {c.n_layers}), got d_model {d_model}, mlp_hidden {mlp_hidden}, "
            f"n_layers {n_layers}"
        )
    if c.weight_tying or c.include_bias or c.include_qkv_bias:
        raise SystemExit("tied embeddings and biases are not supported (the demo models have neither)")
    ratio = d / d_model
    cfg = LLaDAConfig(
        **{
            **c.to_dict(),
            "d_model": d_model,
            "n_heads": d_model // hd,
            "n_kv_heads": d_model // hd,
            "mlp_hidden_size": mlp_hidden,
            "n_layers": n_layers,
            "rms_norm_eps": c.rms_norm_eps * ratio,
        }
    )
    torch.manual_seed(seed)
    new = LLaDAModelLM(cfg).float()
    o, g = old.model.transformer, new.model.transformer
    scale = math.sqrt(ratio)
    with torch.no_grad():
        g.wte.weight.zero_()
        g.wte.weight[:, :d] = o.wte.weight
        g.ln_f.weight.fill_(scale * float(o.ln_f.weight.mean()))
        g.ln_f.weight[:d] = o.ln_f.weight * scale
        g.ff_out.weight[:, :d] = o.ff_out.weight
        for i, nb in enumerate(g.blocks):
            for norm in (nb.attn_norm, nb.ff_norm):
                norm.weight.fill_(scale)
            nb.attn_out.weight.zero_()
            nb.ff_out.weight.zero_()
            if i >= c.n_layers:  # a new layer: the identity until trained
                continue
            ob = o.blocks[i]
            nb.attn_norm.weight[:d] = ob.attn_norm.weight * scale
            nb.ff_norm.weight[:d] = ob.ff_norm.weight * scale
            for name in ("q_proj", "k_proj", "v_proj"):  # old heads first: rows [:d] are the old heads' outputs
                getattr(nb, name).weight[:d, :d] = getattr(ob, name).weight
                getattr(nb, name).weight[:d, d:] = 0.0  # the old heads do not read the new dims (zero at the start)
            nb.attn_out.weight[:d, :d] = ob.attn_out.weight
            for name in ("ff_proj", "up_proj"):
                getattr(nb, name).weight[:m, :d] = getattr(ob, name).weight
                getattr(nb, name).weight[:m, d:] = 0.0
            nb.ff_out.weight[:d, :m] = ob.ff_out.weight
    return new


def max_logit_difference(old: LLaDAModelLM, new: LLaDAModelLM, ids: torch.Tensor) -> float:
    with torch.no_grad():
        return float((old(ids).logits - new(ids).logits).abs().max())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a trained LLaDA-architecture checkpoint directory or demo name")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--d-model", type=int, required=True)
    ap.add_argument("--mlp-hidden", type=int, required=True)
    ap.add_argument("--n-layers", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0, help="initialisation of the new parts")
    args = ap.parse_args(argv)
    old, tok = load_model(args.model, dtype=torch.float32)
    if not isinstance(old, LLaDAModelLM):
        raise SystemExit(f"--model {args.model}: grow.py grows LLaDA-architecture models only")
    new = grow(old.eval(), args.d_model, args.mlp_hidden, args.n_layers, args.seed).eval()
    ids = torch.randint(3, old.config.vocab_size, (2, 96), generator=torch.Generator().manual_seed(args.seed))
    diff = max_logit_difference(old, new, ids)
    n_old, n_new = (sum(p.numel() for p in x.parameters()) for x in (old, new))
    print(f"grew {n_old / 1e6:.2f}M -> {n_new / 1e6:.2f}M parameters; largest logit difference {diff:.2e}")
    args.out.mkdir(parents=True, exist_ok=True)
    new.save_pretrained(args.out, safe_serialization=True)
    tok.save_pretrained(args.out)


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "train_demo/grow.py")
