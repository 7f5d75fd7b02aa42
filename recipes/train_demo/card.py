"""The README model card of a shipped block-causal demo model (``ship.py``), in the other demo models' layout:
what it is, the model, the training, the ParallelBench scores against the demo targets, the exact-cache check.
Sections written by hand after a ship (how the model got here, parallel decoding, the Learn2PD filter) are not
generated: ``hand_sections`` finds them in a card so that ``ship.py --notes keep`` carries them over, and
``model_card(notes=...)`` appends them after the generated ones."""

from __future__ import annotations

from typing import Any

from recipes.train_demo.scoring import OPEN_GEN, TARGETS

GENERATED = ("Model", "Training", "ParallelBench scores (official test files)", "Exact cache")


def hand_sections(card: str) -> dict[str, str]:
    """The ``## `` sections of a card that ``model_card`` does not write, title -> the section's markdown (its
    heading line included, trailing blank lines dropped), in the card's order."""
    found: dict[str, str] = {}
    for chunk in card.split("\n## ")[1:]:
        title = chunk.split("\n", 1)[0].strip()
        if title not in GENERATED:
            found[title] = ("## " + chunk).rstrip("\n")
    return found


def _model_lines(model: Any) -> list[str]:
    c = model.config
    params = sum(p.numel() for p in model.parameters())
    return [
        f"- architecture: llada2_moe, hidden {c.hidden_size}, {c.num_hidden_layers} layers, {c.num_attention_heads} "
        f"heads ({c.num_key_value_heads} K/V heads), first {c.first_k_dense_replace} layer(s) dense (SwiGLU "
        f"{c.intermediate_size}), then MoE: {c.num_experts} routed experts of width {c.moe_intermediate_size}, top "
        f"{c.num_experts_per_tok} (groups {c.n_group}, kept {c.topk_group}, scale {c.routed_scaling_factor:g}) and "
        f"a shared expert of width {c.moe_intermediate_size * c.num_shared_experts}; qk-norm "
        f"{'on' if c.use_qk_norm else 'off'}, rotary share {c.partial_rotary_factor:g}, RoPE theta "
        f"{c.rope_theta:g}; {params / 1e6:.2f}M parameters, fp32 safetensors",
        "- attention: block-causal (a block sees itself and every earlier block on the absolute position grid); "
        "the keys and values of a finished block never change, so the `prefix` cache is exact",
        "- tokenizer: demo-llada's (byte-level BPE, LLaDA special tokens and chat template)",
    ]


def _score_table(scores: dict[str, Any]) -> list[str]:
    rows = ["| task | score | strict | n | target |", "|---|---|---|---|---|"]
    for task, target in TARGETS.items():
        if task not in scores["scores"]:
            continue
        s = scores["scores"][task]
        met = "met" if s >= target else "missed"
        strict = scores.get("strict", {}).get(task, "")
        rows.append(f"| {task} | {s} | {strict} | {scores.get('n', {}).get(task, '')} | {target} ({met}) |")
    rows.append(f"| mean | {scores.get('mean')} | | | |")
    return rows


# demo-llada2's stages before its final one (configs/demo-llada2.yaml), in the order they ran
EARLIER_STAGES = tuple(f"demo-llada2-stage{i}.yaml" for i in range(1, 16))


def _earlier_stages() -> str:
    """The chain of stage configs that led to the final stage, as card links."""
    links = [f"[`configs/{c}`](../../../recipes/train_demo/configs/{c})" for c in EARLIER_STAGES]
    return f"; its stages before the final one below, in order: {', '.join(links)}"


def model_card(name: str, model: Any, training: dict, scores: dict, nfe: dict, block: int, notes: str = "") -> str:
    """The card's markdown; ``notes`` (hand-written markdown sections) follow the generated ones."""
    cfg = training.get("config", {})
    stages = cfg.get("stages", [])
    lines = [
        f"# {name}",
        "",
        "A tiny block-causal masked-diffusion LM in the official LLaDA2.0 checkpoint format (`model_type` "
        "`llada2_moe`, official parameter names), trained by `recipes/train_demo` so that dlm_decode's block-causal "
        "decoding, its exact K/V cache and the samplers have a real LLaDA2-format model with a real MoE path to "
        "work on without downloads. It only knows the ParallelBench waiting-line and puzzle tasks.",
        "",
        "```python",
        "import dlm_decode",
        f'model, tok = dlm_decode.load_model("{name}")',
        "```",
        "",
        "## Model",
        *_model_lines(model),
        "",
        "## Training",
        "- start: demo-llada's weights upcycled (`recipes/train_demo/upcycle.py`: fused q/k/v, the dense MLP as the "
        "shared expert, routed experts cut from it with a zero output projection, so step 0 computes demo-llada on "
        "a bidirectional mask), then trained with the block-causal mask from the first step"
        + (_earlier_stages() if cfg.get("model", {}).get("init") else ""),
        "- objective: LLaDA SFT on the response (answer + `<|eot_id|>` + EOS padding), block-causal attention of "
        f"block {block}; the EOS padding teaches it to stop, so it decodes open-ended",
        f"- run: {training.get('step')} steps, {training.get('train_seconds')} s of training; stages "
        + ", ".join(f"{s.get('kind')}:{s.get('steps')}" for s in stages),
        "- config: [`recipes/train_demo/configs/demo-llada2.yaml`]"
        "(../../../recipes/train_demo/configs/demo-llada2.yaml)",
        "",
        "## ParallelBench scores (official test files)",
        f"One token per step, open-ended: `sampler=low_confidence`, gen length {OPEN_GEN} as a cap, block {block}, "
        f"steps {OPEN_GEN}, temperature 0, the model's default exact `prefix` cache (the same tokens as no cache, "
        "below), stopping after the block holding the first EOS; "
        "`dlm-decode parallelbench --model DIR --data PB --sampler low_confidence --gen-length 128 "
        f"--block-length {block} --steps 128 --batch-size 50 --json`"
        + (f" (limit: {scores['limit']} samples a task)" if scores.get("limit") else "")
        + ".",
        "",
        *_score_table(scores),
        "",
        "## Exact cache",
        f"On {nfe['samples']} official samples decoded as above, the `prefix` cache gave the same tokens as no cache "
        f"on every sample ({nfe['none']} forwards without it, {nfe['prefix']} with it).",
        "",
    ]
    if notes.strip():
        lines += [notes.strip("\n"), ""]
    return "\n".join(lines)
