"""Train the demo models' BPE tokenizer (LLaDA special tokens and chat template) on generated ParallelBench text.

    python -m recipes.train_demo.tokenizer --data PARALLELBENCH_DIR --out runs/train_demo/tokenizer

The merges are learned on freshly generated prompts, short rows and answers of every task (``stream.corpus``).

Pre-tokenization keeps the task vocabulary compact: a word with its optional leading space is one piece
(``" Ramos"``), every digit is its own piece (sudoku grids stay one token per cell), and a run of punctuation and
spaces is one piece, so the list separator ``", "`` becomes a single token and a waiting-line name costs about three
tokens. Pieces are byte-level mapped (GPT-2 alphabet), so any text round-trips. The saved directory is a plain
``PreTrainedTokenizerFast`` (tokenizer.json + tokenizer_config.json with the chat template) that
``AutoTokenizer.from_pretrained`` loads offline.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from dlm_decode.cli import run_script
from recipes.pb_data import DATA_ENV, data_dir
from recipes.train_demo.stream import corpus

BOS, EOS, MASK = "<|startoftext|>", "<|endoftext|>", "<|mdm_mask|>"
HEADER_START, HEADER_END, EOT = "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"
SPECIAL_TOKENS = [BOS, EOS, MASK, HEADER_START, HEADER_END, EOT]

# LLaDA-8B-Instruct's template (Llama-3 style): bos before the first turn, contents trimmed, eot after each turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim"
    " + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# word (with its leading space) | one digit (with its leading space) | newlines | a run of other characters
PIECE = r" ?\p{L}+| ?\p{N}|\n+|[^\p{L}\p{N}\n]+"


def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PIECE), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024, min_frequency: int = 2) -> PreTrainedTokenizerFast:
    """BPE over ``texts``; the six special tokens get ids 0..5 (bos, eos/pad, mask, header start/end, eot)."""
    tok = build_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return wrap(tok)


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=EOS,
        mask_token=MASK,
        additional_special_tokens=[HEADER_START, HEADER_END, EOT],
        chat_template=CHAT_TEMPLATE,
        model_max_length=512,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(tok: PreTrainedTokenizerFast, out: str | Path) -> None:
    """``save_pretrained`` in LLaDA's published layout: the chat template inside tokenizer_config.json (no separate
    chat_template.jinja) and ``tokenizer_class`` ``PreTrainedTokenizerFast``, loadable by transformers 4 and 5."""
    tok.save_pretrained(out)
    fold_chat_template(out)


def fold_chat_template(out: str | Path) -> None:
    out = Path(out)
    cfg_path, jinja = out / "tokenizer_config.json", out / "chat_template.jinja"
    cfg = json.loads(cfg_path.read_text())
    if jinja.is_file():
        cfg["chat_template"] = jinja.read_text()
        jinja.unlink()
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help=f"official ParallelBench directory (default ${DATA_ENV})")
    ap.add_argument("--out", default="runs/train_demo/tokenizer")
    ap.add_argument("--vocab-size", type=int, default=1024)
    ap.add_argument("--per-task", type=int, default=1500, help="generated samples per task to learn the merges from")
    args = ap.parse_args(argv)
    texts = corpus(data_dir(args.data), args.per_task, seed=5_000_011)
    tok = train_tokenizer(texts, vocab_size=args.vocab_size)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    save_tokenizer(tok, args.out)
    print(f"vocab {len(tok)} -> {args.out}")


if __name__ == "__main__":
    run_script(main, "train_demo/tokenizer.py")
