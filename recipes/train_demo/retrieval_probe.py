"""Does in-context copying form, and when? A small, fast control run for the demo models' retrieval stage.

    python recipes/train_demo/retrieval_probe.py --tokenizer TOK --parallelbench PB --data names --steps 3000
    python recipes/train_demo/retrieval_probe.py --tokenizer TOK --parallelbench PB --data random --steps 600
    python recipes/train_demo/retrieval_probe.py --tokenizer TOK --d-model 128 --n-layers 4 --mlp-hidden 384 --lr 1e-3

Trains a small LLaDA (default d_model 64, 2 layers, 4 heads, SwiGLU 128) with ``train.diffusion_loss`` (LLaDA SFT)
at batch 64, AdamW (default lr 3e-3, ``--warmup`` steps of linear warm-up), on one of two copy tasks, and every
``--every`` steps prints one JSON line: the share of answer tokens predicted right (argmax) when only that token is
masked and the rest of the row is visible, on 30 fixed held-out copy rows (``probe.teacher_forced``). A model that
has not learned to read the prompt scores its unigram guess (~0.01 on names).

* ``--data names``: bare short copy rows from ``stream.RowStream`` (``<bos>copy ["Ann Lee", ...]`` -> the list +
  ``<|eot_id|>``), the real demo-model data;
* ``--data random``: 3-6 random tokens copied from the prompt, padded to 8 slots (no structure, no separators).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import train as tr  # noqa: E402
from probe import teacher_forced  # noqa: E402
from stream import Mix, RowStream  # noqa: E402

from dlm_decode.models.llada import LLaDAConfig, LLaDAModelLM  # noqa: E402


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--parallelbench", default="/work/shared/data/parallelbench")
    ap.add_argument("--data", choices=("names", "random"), default="names")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--every", type=int, default=500)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--n-layers", type=int, default=2)
    ap.add_argument("--n-heads", type=int, default=4)
    ap.add_argument("--mlp-hidden", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=0, help="steps of linear lr warm-up")
    ap.add_argument("--tasks", default="waiting_line/copy", help="names rows: '+'-joined waiting-line tasks")
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    vocab, mask = len(tok), tok.mask_token_id
    structure = set(tok.convert_tokens_to_ids(['["', '",\u0120"', '"]', "<|eot_id|>", "<|endoftext|>"]))
    if args.data == "names":
        stream = RowStream(args.parallelbench, tok, seed=0)
        tasks = tuple(args.tasks.split("+"))
        mix = Mix(64, 1.0, tasks, None, bare=True)

        def batch(step: int) -> list[tuple[list[int], list[int]]]:
            return [(p, r) for p, r, _ in stream.rows(step, mix)]
    else:
        content = [i for i in range(6, vocab) if i not in structure][:50]

        def batch(step: int) -> list[tuple[list[int], list[int]]]:
            rng = random.Random(step)
            out = []
            for _ in range(64):
                xs = [rng.choice(content) for _ in range(rng.randint(3, 6))]
                eot = tok.convert_tokens_to_ids("<|eot_id|>")
                out.append(([tok.bos_token_id, *xs, eot], xs + [eot] + [tok.eos_token_id] * (7 - len(xs))))
            return out

    cfg = LLaDAConfig(
        d_model=args.d_model,
        n_layers=args.n_layers,
        n_heads=args.n_heads,
        n_kv_heads=args.n_heads,
        mlp_hidden_size=args.mlp_hidden,
        vocab_size=vocab,
        embedding_size=vocab,
        max_sequence_length=128,
        mask_token_id=mask,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = LLaDAModelLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    if args.data == "names":  # held-out rows are copy rows whatever the training mix
        held = [(p, r) for p, r, _ in stream.rows(10**7, Mix(64, 1.0, ("waiting_line/copy",), (1.0,), bare=True))][:30]
    else:
        held = batch(10**7)[:30]
    curve = []
    for step in range(args.steps):
        loss, _ = tr.diffusion_loss(model, tr.collate(batch(step), tok.pad_token_id), tr.step_generator(0, step))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / args.warmup) if args.warmup else args.lr
        opt.step()
        opt.zero_grad()
        if (step + 1) % args.every == 0:
            model.eval()
            acc = teacher_forced(model, held, mask, structure)
            model.train()
            curve.append({"step": step + 1, "loss": round(float(loss.detach()), 3), "copy_acc": round(acc, 3)})
            print(json.dumps(curve[-1]), flush=True)
    return curve


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "train_demo/retrieval_probe.py")
