"""Named presets for the published settings of the fast samplers: a sampler, its options and decoding overrides.

    from dlm_decode.samplers.presets import get_preset
    out = dlm_decode.generate(model, prompts, tokenizer=tok, **get_preset("prophet_gsm8k").generate_kwargs())

Each preset records where its numbers come from (paper table or reference script). Decoding overrides are what the
reference scripts run with (generation length, block length, step budget); override any of them with keywords,
e.g. ``get_preset("fast_dllm_threshold").generate_kwargs(gen_length=64)``. A preset's step budget follows an
overridden gen length (same tokens per step) and its block is clipped to it, unless ``steps`` / ``block_length`` are
given too. A preset may also set the published ``temperature`` / ``top_p`` (the code models' sampling settings),
the attention (D2F's ``answer_block_causal``) and the cache the method runs with; the caller's win. Presets that
need an artefact take it as an option, and ``needs`` lists the ones they cannot run
without: ``learn2pd`` needs ``filter`` (a trained filter), Prophet's forced answer prefix needs ``prefix_ids``
(``early_commit.answer_prefix_ids(tokenizer)``), AdaBlock on a non-LLaDA / non-Dream tokenizer needs
``delimiter_ids`` (``adaptive_block.delimiter_ids_from_tokenizer(tokenizer)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlm_decode.samplers.adaptive_block import DREAM_DELIMITER_IDS, LLADA_DELIMITER_IDS


@dataclass(frozen=True)
class Preset:
    name: str
    sampler: str
    options: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)  # DecodeConfig overrides (lengths; temperature, top_p)
    source: str = ""
    needs: tuple[str, ...] = ()  # sampler options the preset cannot run without (artefacts)
    cache: str | None = None  # the cache the method runs with (None: the request's default)
    cache_options: dict[str, Any] = field(default_factory=dict)

    def generate_kwargs(self, options: dict[str, Any] | None = None, **config: Any) -> dict[str, Any]:
        """Keywords for ``dlm_decode.generate``: sampler, sampler_options and the decoding overrides (``config``
        wins; a preset's steps and block follow an overridden gen length). A missing ``needs`` option is an error."""
        options = self.options | dict(options or {})
        missing = [k for k in self.needs if options.get(k) in (None, "")]
        if missing:
            others = [p.name for p in PRESETS.values() if p.sampler == self.sampler and not p.needs]
            raise ValueError(
                f"preset {self.name!r} needs the sampler option {missing[0]!r} ({NEEDS_HELP.get(missing[0], '')}); "
                f"presets that run without it: {', '.join(others) or '(none)'}"
            )
        cache = {"cache": self.cache, "cache_options": dict(self.cache_options)} if self.cache else {}
        return {"sampler": self.sampler, "sampler_options": options} | cache | self.lengths(**config)

    def lengths(self, **config: Any) -> dict[str, Any]:
        """The preset's gen length, block length and steps under ``config``'s overrides: over another gen length the
        steps keep the preset's tokens per step and the block is clipped to the gen length, unless given."""
        out = self.config | config
        gen, own = config.get("gen_length"), self.config.get("gen_length")
        if gen is not None and own and gen != own:
            if "steps" not in config and self.config.get("steps") is not None:
                out["steps"] = max(1, self.config["steps"] * gen // own)
            if "block_length" not in config and (self.config.get("block_length") or 0) > gen:
                out["block_length"] = gen
        return out


NEEDS_HELP = {
    "filter": "a trained Learn2PD filter: filter=PATH, or filter=shipped for the one beside the model's weights "
    "(the demo models ship one)"
}


_GSM8K_256 = {"gen_length": 256, "block_length": 32}

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("fast_dllm_threshold", "threshold", {"threshold": 0.9}, _GSM8K_256, "Fast-dLLM paper / llada/eval"),
        Preset("fast_dllm_factor", "factor", {"factor": 1.0}, _GSM8K_256, "Fast-dLLM llada/generate.py"),
        Preset(
            "prophet",
            "early_commit",
            {"thresholds": (7.5, 5.0, 2.5)},
            _GSM8K_256 | {"steps": 256},
            "Prophet generate_earlyexit.py defaults",
        ),
        Preset(
            "prophet_gsm8k",
            "early_commit",
            {"thresholds": (8.0, 5.0, 3.5)},
            _GSM8K_256 | {"steps": 256},
            "Prophet paper, GSM8K row",
        ),
        Preset(
            "prophet_code",
            "early_commit",
            {"thresholds": (7.5, 5.0, 4.5)},
            _GSM8K_256 | {"steps": 256},
            "Prophet paper, code rows",
        ),
        Preset(
            "prophet_fast_dllm",
            "early_commit",
            {"thresholds": (7.5, 5.0, 2.5), "base": "threshold", "threshold": 0.9},
            _GSM8K_256,
            "Prophet paper, stacked on Fast-dLLM's threshold rule",
        ),
        Preset(
            "adablock_llada",
            "adaptive_block",
            {"delimiter_ids": LLADA_DELIMITER_IDS, "delimiter_threshold": 0.3, "threshold": 0.9},
            {"gen_length": 512, "block_length": 32},
            "AdaBlock llada/eval_adablock.sh",
        ),
        Preset(
            "adablock_dream",
            "adaptive_block",
            {"delimiter_ids": DREAM_DELIMITER_IDS, "delimiter_threshold": 0.5, "threshold": 0.9},
            {"gen_length": 512, "block_length": 32},
            "AdaBlock dream/eval_adablock.sh",
        ),
        Preset("dparallel_llada", "entropy_threshold", {"eta": 0.5}, _GSM8K_256, "dParallel LLaDA/eval.sh"),
        Preset("dparallel_llada_mbpp", "entropy_threshold", {"eta": 0.45}, _GSM8K_256, "dParallel LLaDA/eval.sh"),
        Preset(
            "dparallel_dream", "entropy_threshold", {"eta": 0.45}, _GSM8K_256, "dParallel Dream eval.sh (GSM8K, MATH)"
        ),
        Preset("dparallel_dream_code", "entropy_threshold", {"eta": 0.5}, _GSM8K_256, "dParallel Dream eval.sh (code)"),
        Preset(
            "localleap",
            "local_leap",
            {"kappa": 0.9, "tau_relaxed": 0.75, "radius": 4},
            _GSM8K_256,
            "LocalLeap paper defaults",
        ),
        Preset(
            "learn2pd",
            "learned_filter",
            {"accept": 0.96, "eotp": True},
            _GSM8K_256 | {"steps": 256},
            "Learn2PD llada/eval_llada.sh (needs the filter option)",
            needs=("filter",),
        ),
        Preset(
            "eotp_only",
            "learned_filter",
            {"eotp": True},
            _GSM8K_256 | {"steps": 256},
            "Learn2PD llada/eval_llada.sh method=EoT (no filter)",
        ),
        Preset(
            "learn2pd_no_eotp",
            "learned_filter",
            {"accept": 0.96, "eotp": False},
            _GSM8K_256 | {"steps": 256},
            "Learn2PD generate_learn2parallel (needs the filter option)",
            needs=("filter",),
        ),
        Preset(
            "diffucoder",
            "entropy",
            {"alg_temp": 0.0},
            {"gen_length": 256, "steps": 256, "temperature": 0.4, "top_p": 0.95},
            "DiffuCoder README, Instruct / cpGRPO usage: diffusion_generate(max_new_tokens=256, steps=256, "
            "temperature=0.4, top_p=0.95, alg='entropy', alg_temp=0) (Base: temperature 0.2)",
        ),
        Preset(
            "dream_coder",
            "entropy",
            {"alg_temp": 0.0},
            {"gen_length": 768, "steps": 768, "temperature": 0.1, "top_p": 0.95},
            "Dream-Coder README, Instruct usage: diffusion_generate(max_new_tokens=768, steps=768, temperature=0.1, "
            "top_p=0.95, alg='entropy', alg_temp=0)",
        ),
        Preset(
            "llada2",
            "llada2",
            {"threshold": 0.95},
            {"block_length": 32, "steps": 32},
            "LLaDA2.0 generate() defaults (steps per block; block-causal models)",
        ),
        Preset(
            "llada21",
            "token_editing",
            {"threshold": 0.95, "editing_threshold": 0.9, "max_post_steps": 16, "num_to_transfer": 1},
            {"block_length": 32},
            "LLaDA2.1 generate() defaults (token editing; block-causal models)",
        ),
        Preset(
            "sdar",
            "sdar",
            {"remasking": "low_confidence_dynamic", "threshold": 0.9},
            {"block_length": 4, "steps": 4},
            "SDAR README (JetEngine / LMDeploy examples; block-causal models)",
        ),
        Preset(
            "trado",
            "sdar",
            {"remasking": "low_confidence_dynamic", "threshold": 0.9},
            {"block_length": 4, "steps": 4},
            "TraDo: dLLM-RL README and configs/trado_eval.yaml (block-causal models)",
        ),
        Preset(
            "fast_dllm_v2",
            "fast_dllm_v2",
            {"threshold": 0.9, "small_block_size": 8},
            {"block_length": 32},
            "Fast-dLLM v2 eval.py (threshold 0.9, block 32, sub-block 8; its gsm8k / math / ifeval scripts use "
            "--sampler-opt threshold=1; block-causal models)",
        ),
    )
}


_D2F = {"block_add_threshold": 0.1, "decoded_token_threshold": 0.95, "early_stop": True}
_D3LLM = {"block_add_threshold": 0.1, "decoded_token_threshold": 0.95, "early_stop": True}
PRESETS.update(
    {
        p.name: p
        for p in (
            Preset(
                "d2f_llada",
                "threshold",
                {"threshold": 0.9} | _D2F,
                {"gen_length": 512, "block_length": 32, "attention": "answer_block_causal"},
                "D2F D2F-eval/eval_llada.sh (MATH / HumanEval rows: block 32, block_add_threshold 0.1, "
                "decoded_token_threshold 0.95, skip_threshold 0.9, gen 512; GSM8K uses block 64 / add 0.7, MBPP "
                "add 0.9)",
                cache="prefix",
            ),
            Preset(
                "d2f_dream",
                "threshold",
                {"threshold": 0.9} | _D2F,
                {"gen_length": 256, "block_length": 32, "attention": "answer_block_causal"},
                "D2F D2F-eval/eval_dream.sh (GSM8K row: block 32, block_add_threshold 0.1, decoded_token_threshold "
                "0.95, skip_threshold 0.9, gen 256)",
                cache="prefix",
            ),
            Preset(
                "d3llm_llada",
                "entropy_threshold",
                {"eta": 0.5} | _D3LLM,
                {"gen_length": 256, "block_length": 32},
                "d3LLM eval_scripts/llada_*.sh, generate_multi_block_kv_cache: threshold 0.5, block_add_threshold 0.1, "
                "decoded_token_threshold 0.95, block 32, cache_delay_iter 1, refresh_interval 10000, early_stop",
                cache="delayed",
                cache_options={"cache_delay_iter": 1},
            ),
            Preset(
                "d3llm_dream",
                "entropy_threshold",
                {"eta": 0.4, "global_best": False} | _D3LLM,
                {"gen_length": 256, "block_length": 32},
                "d3LLM eval_scripts/dream_gsm8k_cot.sh, generation_multi_block without a cache (cache_delay_iter "
                "10000): threshold 0.4, block_add_threshold 0.1, decoded_token_threshold 0.95, block 32, early_stop, "
                "temperature 0 (its cached Dream loop is not matched on purpose: docs/caches.md)",
                cache="none",
            ),
        )
    }
)


def get_preset(name: str) -> Preset:
    """The preset called ``name``; an unknown name lists the valid ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]
