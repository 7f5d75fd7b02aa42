"""Tests of the demo-model training recipe (recipes/train_demo) and of the shipped demo checkpoints.

Tokenizer round trip and chat template; the LLaDA SFT masking objective (prompt never masked, 1/p weighting,
Dream's shift); a few steps on a tiny model lower the loss; an interrupted run resumed from its atomic checkpoint
ends bit-identical to an uninterrupted one; the shipped demo models load through ``AutoModel`` and decode; stale
rows (``stale.py``): the scored forward equals the decoder's cached forward at that state, the oracle being the
decoder's own K/V store (one forward over the refresh canvas writes every slot, the next computes only the block
(dual) or the block and everything after it (prefix), as the ``dual`` / ``prefix`` policies do in a block's later
steps). All on CPU, tiny models, no downloads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

import dlm_decode
from dlm_decode.cache.store import KVAccess, KVStore
from dlm_decode.parallelbench.generator import generate_task, list_to_str
from dlm_decode.parallelbench.tasks import build_messages
from recipes.train_demo import card as cd
from recipes.train_demo import config as cf
from recipes.train_demo import model as md
from recipes.train_demo import objective as ob
from recipes.train_demo import prefetch as pf
from recipes.train_demo import schedule as sc
from recipes.train_demo import self_rows as sr
from recipes.train_demo import stream as st
from recipes.train_demo import tokenizer as tk
from recipes.train_demo import train as tr
from recipes.train_demo.stale import StaleRows, draw_stale_rows, stale_hidden_states

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "dlm_decode" / "demo_models"
NAMES = [
    ["Anna", "Billy", "Carol", "David", "Emma", "Frank", "Grace", "Henry"],
    ["Adams", "Baker", "Clark", "Diaz", "Evans", "Foster", "Gray", "Hall"],
]
COPY_CONFIG = {
    "name": "waiting_line/copy",
    "prompt": "You are managing a waiting line.\nPlease copy the list exactly:\n{context}\n",
    "icl_example_count": 1,
    "min_length": 3,
    "max_length": 4,
    "samples_per_length": 2,
}


def _stage(**entry) -> cf.Stage:
    """A stage entry as the YAML file gives it, loaded and checked (a bad one raises the config's ValueError)."""
    raw = {"model": {"tokenizer": "t"}, "stages": [{"kind": "full", "steps": 3, **entry}]}
    return cf.config_from_dict(raw).stages[0]


def _config(tmp_path: Path, tok, stages: list[dict], **sections) -> Path:
    """A YAML config of a tiny run: one small llada layer, the test tokenizer (saved under tmp_path), one thread;
    ``sections`` (model=..., data=..., optim=..., run=...) add to or replace those keys."""
    import yaml

    tok.save_pretrained(tmp_path / "tok")
    raw = {
        "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "mlp_hidden": 64, "tokenizer": str(tmp_path / "tok")},
        "optim": {"warmup": 1},
        "run": {"threads": 1},
    }
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value}
    raw["stages"] = stages
    path = tmp_path / f"config-{len(list(tmp_path.glob('config-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _train(config: Path, data: Path, out: Path, *extra: str) -> None:
    tr.main(["--config", str(config), "--data", str(data), "--out", str(out), *extra])


@pytest.fixture(scope="module")
def tok():
    """A tokenizer trained on a few generated chats (names, template words, digits)."""
    samples = generate_task("waiting_line/copy", COPY_CONFIG, NAMES, n=40, seed=1)
    texts = [COPY_CONFIG["prompt"].format(**s["input"]) for s in samples] + ["1342\n4213\n2134\n3421"] * 5
    return tk.train_tokenizer(texts * 3, vocab_size=400)


@pytest.fixture(scope="module")
def rows(tok):
    samples = generate_task("waiting_line/copy", COPY_CONFIG, NAMES, n=8, seed=2)
    return [st.encode_row(tok, build_messages(COPY_CONFIG, s), s["answer"], 24) for s in samples]


def _tiny(tok, arch: str):
    torch.manual_seed(0)
    size = cf.ModelConfig(family=arch, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, mlp_hidden=64)
    return md.make_model(size, tok)


# ------------------------------------------------------------------------------------------ tokenizer


def test_tokenizer_round_trip_special_ids_and_chat_template(tok, tmp_path):
    from transformers import AutoTokenizer

    assert tok.convert_tokens_to_ids(tk.SPECIAL_TOKENS) == list(range(6))
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.mask_token) == (tk.BOS, tk.EOS, tk.EOS, tk.MASK)
    text = list_to_str(["Anna Adams", "Billy Baker", "Carol Clark"])
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    assert tok.convert_ids_to_tokens(ids).count('",\u0120"') == 2  # the separator ", " is one token
    grid = "1342\n4213\n2134\n3421"
    assert tok.decode(tok(grid)["input_ids"]) == grid
    assert len(tok(grid)["input_ids"]) == 19  # one token per digit and per newline

    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    msgs = [
        {"role": "user", "content": "Hi\n"},
        {"role": "assistant", "content": "Yo"},
        {"role": "user", "content": "Q"},
    ]
    rendered = loaded.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert rendered == (
        "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nYo<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nQ<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    ids = loaded(rendered, add_special_tokens=False)["input_ids"]
    assert ids[:2] == [0, 3] and ids.count(5) == 3 and ids.count(4) == 4  # bos, header start; 3 eot; 4 headers
    assert loaded.decode(ids) == rendered
    assert loaded(text, add_special_tokens=False)["input_ids"] == tok(text, add_special_tokens=False)["input_ids"]


def test_encode_row_pads_response_to_gen_length(tok, rows):
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    for prompt, resp in rows:
        assert len(resp) == 24
        assert tok.mask_token_id not in prompt + resp
        end = resp.index(eot)
        assert all(t == tok.eos_token_id for t in resp[end + 1 :])
        assert prompt[-1] != tok.eos_token_id  # the prompt ends with the assistant header
    with pytest.raises(ValueError, match="does not fit"):
        st.encode_row(tok, [{"role": "user", "content": "x"}], "Anna " * 40, 8)


# ------------------------------------------------------------------------------------------ objective


def test_masking_never_touches_prompt_or_padding(tok, rows):
    batch = ob.collate(rows, tok.pad_token_id)
    g = torch.Generator().manual_seed(0)
    seen = torch.zeros_like(batch["response"])
    for _ in range(50):
        noisy, masked, p_mask = ob.mask_response(batch, tok.mask_token_id, g)
        assert not masked[~batch["response"]].any()
        assert torch.equal(noisy[~masked], batch["input_ids"][~masked])
        assert (noisy[masked] == tok.mask_token_id).all()
        assert ((p_mask >= 1e-3) & (p_mask <= 1)).all()
        seen |= masked
    assert torch.equal(seen, batch["response"])  # every response slot gets masked at some ratio
    # left padding: every row ends at the same column, prompts and pads never count as response
    assert batch["response"].sum(1).tolist() == [24] * len(rows)
    assert torch.equal(batch["valid"].sum(1), torch.tensor([len(p) + len(r) for p, r in rows]))


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_loss_is_weighted_ce_on_masked_response(tok, rows, arch):
    """diffusion_loss == sum over masked response tokens of CE / p_mask / L, over B, from the official forward."""
    model = _tiny(tok, arch)
    batch = ob.collate(rows, tok.pad_token_id)
    loss, info = ob.diffusion_loss(model, batch, torch.Generator().manual_seed(3))
    noisy, masked, p_mask = ob.mask_response(batch, tok.mask_token_id, torch.Generator().manual_seed(3))
    valid = batch["valid"]
    pos = (valid.long().cumsum(1) - 1).clamp(min=0)
    logits = model(noisy, attention_mask=valid, position_ids=pos).logits  # official (unshifted) forward
    if arch == "dream":  # hidden i predicts token i+1
        logits = torch.cat([logits[:, :1], logits[:, :-1]], 1)
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch["input_ids"], reduction="none")  # [B, T]
    want = ((ce * masked) / (p_mask[:, None] * 24)).sum() / len(rows)
    assert info["masked"] == int(masked.sum()) > 0
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)


def test_a_few_steps_reduce_the_loss(tok, rows):
    model = _tiny(tok, "llada")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = ob.collate(rows, tok.pad_token_id)
    losses = []
    for step in range(25):
        loss, _ = ob.diffusion_loss(model, batch, ob.step_generator(0, step % 2))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    assert sum(losses[-2:]) < 0.5 * sum(losses[:2])


# ------------------------------------------------------------------------------------------ checkpoints


WAITING_PROMPTS = {
    "copy": "Copy:\n{context}\n",
    "reverse": "Reverse:\n{context}\n",
    "sort": "Sort:\n{context}\n",
    "shuffle": "Shuffle:\n{context}\n",
    "insert_index": 'Insert "{word}" at {index}:\n{context}\n',
    "insert_random": 'Insert "{word}" anywhere:\n{context}\n',
    "remove_index": "Remove {index}:\n{context}\n",
    "remove_random": "Remove one:\n{context}\n",
    "replace_index": 'Replace {index} with "{word}":\n{context}\n',
    "replace_random": 'Replace one with "{word}":\n{context}\n',
}


@pytest.fixture(scope="module")
def mini_pb(tmp_path_factory):
    """A ParallelBench-shaped directory (our own configs, names and 'official' files) for the twelve demo tasks."""
    import yaml

    root = tmp_path_factory.mktemp("pb")
    (root / "first_last_names.yaml").write_text(yaml.safe_dump(NAMES))
    wl = {}
    for op, prompt in WAITING_PROMPTS.items():
        action, _, mode = op.partition("_")
        wl[f"waiting_line/{op}"] = {
            "name": f"waiting_line/{op}",
            "type": action,
            "prompt": prompt,
            "icl_example_count": 1,
            "min_length": 3,
            "max_length": 4,
            "seed": 11,
            "num_samples": 4,
            "samples_per_length": 2,
            "metric": "list_match_score",
            **({"random_index": mode == "random"} if mode else {}),
        }
    pz = {
        "puzzle/latin_square_n4": {
            "name": "puzzle/latin_square_n4",
            "type": "latin_square",
            "size": 4,
            "prompt": "Latin square {size} over {symbols}.",
            "icl_example_count": 1,
            "seed": 12,
            "num_samples": 4,
            "samples_per_length": 4,
            "metric": "latin_square_score",
        },
        "puzzle/sudoku_n4_12": {
            "name": "puzzle/sudoku_4x4_4",
            "prompt": "Solve:\n{sudoku}\n",
            "icl_example_count": 1,
            "metric": "sudoku_score",
        },
    }
    for folder, configs in (("waiting_line", wl), ("puzzle", pz)):
        (root / folder).mkdir()
        (root / folder / "task_config.yaml").write_text(yaml.safe_dump(configs))
        for name, config in configs.items():
            samples = generate_task(name, config, NAMES, n=4, seed=3)
            lines = "".join(json.dumps(x) + "\n" for x in samples)
            (root / folder / (name.split("/")[1] + ".jsonl")).write_text(lines)
    return root


def test_short_prompts_carry_operands_and_targets_are_right(mini_pb, tok):
    stream = st.RowStream(mini_pb, tok, seed=0)
    for task in st.TASKS:
        s = stream.samples(task, 1, seed=5)[0]
        prompt = st.short_prompt(task, s)
        inp = s["input"]
        op = task.split("/", 1)[1]
        if task.startswith("waiting_line/"):
            assert prompt.startswith(op.split("_")[0] + " ") and prompt.endswith(inp["context"]), (task, prompt)
            assert ("word" in inp) == (f'"{inp.get("word")}"' in prompt)
            if "index" in inp:
                assert f" {inp['index']} " in prompt
            assert "You are" not in prompt and "\n" not in prompt
        elif op.startswith("sudoku"):
            assert prompt == "sudoku\n" + inp["sudoku"]
        else:
            assert prompt == f"latin {inp['symbols']}"
    short = st.eval_items({"waiting_line/reverse": stream.samples("waiting_line/reverse", 2, 9)}, mini_pb, short=True)
    (chats, samples, gen_length) = short["short/waiting_line/reverse"]
    assert gen_length == 32 and chats[0] == [{"role": "user", "content": "reverse " + samples[0]["input"]["context"]}]


def test_stream_is_a_function_of_seed_and_step_and_mixes_as_asked(mini_pb, tok):
    a, b = st.RowStream(mini_pb, tok, seed=0), st.RowStream(mini_pb, tok, seed=0)
    mix = st.Mix(batch=24, short_share=0.25)
    assert a.rows(7, mix) == b.rows(7, mix)
    assert a.rows(7, mix) != a.rows(8, mix) and a.rows(7, mix) != st.RowStream(mini_pb, tok, seed=1).rows(7, mix)
    rows = a.rows(3, mix)
    kinds = [label.split("/", 1)[0] for _, _, label in rows]
    assert len(rows) == 24 and kinds.count("short") == 6 and kinds.count("full") == 18
    only = a.rows(3, st.Mix(batch=16, short_share=1.0, tasks=("waiting_line/sort",)))
    assert {label for _, _, label in only} == {"short/waiting_line/sort"}
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    for prompt, resp, label in rows:
        assert len(resp) == (64 if "puzzle" in label else 32) and eot in resp
        text = tok.decode(prompt)
        assert ("You are" not in text) if label.startswith("short/") else True


def test_stream_never_yields_an_excluded_sample(mini_pb, tok):
    from dlm_decode.parallelbench.generator import sample_key

    plain = st.RowStream(mini_pb, tok, seed=0)
    for task in ("waiting_line/copy", "waiting_line/insert_random", "puzzle/sudoku_n4_12"):
        first = plain.samples(task, 6, seed=21)
        banned = {task: {sample_key(s) for s in first[:3]}}
        guarded = st.RowStream(mini_pb, tok, seed=0, exclude=banned)
        again = guarded.samples(task, 6, seed=21)
        assert len(again) == 6 and not {sample_key(s) for s in again} & banned[task]
        assert [sample_key(s) for s in again[:3]] != [sample_key(s) for s in first[:3]]


def _stages(*entries: dict) -> tuple[cf.Stage, ...]:
    return cf.config_from_dict({"model": {"tokenizer": "t"}, "stages": list(entries)}).stages


def _weights(weights: dict) -> dict[str, float]:
    """The task weights a config's data.task_weights give the stage's tasks (all stage tasks named)."""
    cfg = cf.config_from_dict({"model": {"tokenizer": "t"}, "data": {"task_weights": weights}})
    mix = tr.mix_for(cfg, _stage(tasks=[t for t in st.STAGE_TASKS if t != st.SELF]))
    named = {cf.task_name(k, "test") for k in weights}
    return {t: w for t, w in zip(mix.tasks, mix.weights, strict=True) if t in named}


def test_stages_weights_and_schedule():
    stages = _stages(
        {"kind": "short", "steps": 5}, {"kind": "short", "steps": 3, "tasks": ["sort", "puzzle/sudoku_n4_12"]},
        {"kind": "full", "steps": 10},
    )  # fmt: skip
    assert [(s.kind, s.steps) for s in stages] == [("short", 5), ("short", 3), ("full", 10)]
    assert stages[1].tasks == ("waiting_line/sort", "puzzle/sudoku_n4_12") and stages[0].tasks is None
    assert [sc.stage_at(stages, i)[0] for i in (0, 4, 5, 7, 8, 17, 30)] == [0, 0, 1, 1, 2, 2, 2]
    bad = {
        "stages[0].kind: 'mid'": {"kind": "mid", "steps": 5},
        "stages[0].steps must be >= 1": {"kind": "short", "steps": 0},
        "stages[0].tasks: unknown task 'nope'": {"kind": "short", "steps": 3, "tasks": ["nope"]},
        "stages[0]: needs steps": {"kind": "short"},
        "stages[0].steps: expected a whole number": {"kind": "short", "steps": 2.5},
    }
    for message, entry in bad.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            _stages(entry)
    with pytest.raises(ValueError, match="stages: give a non-empty list"):
        cf.config_from_dict({"model": {"tokenizer": "t"}, "stages": []})
    weights = {"sort": 2, "sudoku_n4_12": 3}
    cfg = cf.config_from_dict({"model": {"tokenizer": "t"}, "data": {"task_weights": weights}})
    mix = tr.mix_for(cfg, _stage(kind="short", tasks=["copy", "sort", "sudoku_n4_12"]))
    assert mix.tasks == ("waiting_line/copy", "waiting_line/sort", "puzzle/sudoku_n4_12") and mix.weights == (1, 2, 3)
    with pytest.raises(ValueError, match="data.task_weights: unknown task 'sortt'"):
        cf.config_from_dict({"model": {"tokenizer": "t"}, "data": {"task_weights": {"sortt": 2}}})
    f = sc.wsd_lambda(warmup=4, total=100, decay=10)
    assert [f(0), f(3), f(50), f(89)] == [0.25, 1.0, 1.0, 1.0]
    assert f(90) == pytest.approx(1.0) and f(95) == pytest.approx(0.55) and f(99) == pytest.approx(0.19)
    # a later stage ramps the rate again over restart_warmup steps, also inside the final decay
    assert sc.stage_starts(stages) == (5, 8)
    g = sc.wsd_lambda(warmup=4, total=100, decay=10, restarts=(40, 92), restart_warmup=10)
    assert [g(39), g(40), g(44), g(49), g(50)] == pytest.approx([1.0, 0.1, 0.5, 1.0, 1.0])
    assert g(92) == pytest.approx(0.1 * f(92)) and g(97) == pytest.approx(0.6 * f(97))
    assert sc.wsd_lambda(4, 100, 10, restarts=(40,), restart_warmup=0)(40) == 1.0


def test_stage_options_set_rate_share_icl_padding_and_reset():
    stages = _stages(
        {"kind": "short", "steps": 5, "tasks": ["copy"]},
        {"kind": "full", "steps": 10, "tasks": ["copy", "reverse"], "lr": "2.5e-4", "share": 0.5, "icl": 1,
         "pad": True, "reset": True},
        {"kind": "full", "steps": 3},
    )  # fmt: skip
    assert stages[0] == cf.Stage("short", 5, ("waiting_line/copy",))
    assert stages[1] == cf.Stage(
        "full", 10, ("waiting_line/copy", "waiting_line/reverse"), lr=2.5e-4, share=0.5, icl=1.0, pad=True, reset=True
    )
    assert stages[2].lr is None and not stages[2].reset
    bad = {
        "stages[0].lr must be > 0": {"lr": 0},
        "stages[0].share must be in [0, 1]": {"share": 1.5},
        "stages[0].icl: expected a number": {"icl": "x"},
        "stages[0]: unknown key(s) ['speed']": {"speed": 2},
        "stages[0].pad: expected true or false": {"pad": "yes"},
    }
    for message, entry in bad.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            _stages({"kind": "full", "steps": 3, **entry})
    # the stage's own peak rate scales the whole schedule shape (warm-up, restarts, final decay) for its steps
    scale = lambda step: (sc.stage_at(stages, step)[1].lr or 1e-3) / 1e-3  # noqa: E731
    f = sc.wsd_lambda(warmup=2, total=18, decay=2, scale_at=scale)
    assert [f(0), f(4), f(5), f(14), f(15), f(17)] == pytest.approx([0.5, 1.0, 0.25, 0.25, 1.0, 0.55])
    with pytest.raises(ValueError, match=re.escape("data.short_icl must be in [0, 1], got 2.0")):
        cf.config_from_dict({"model": {"tokenizer": "t"}, "data": {"short_icl": 2}})


def test_row_workers_build_the_rows_the_stream_builds(mini_pb, tok):
    stream = st.RowStream(mini_pb, tok, seed=3)
    small, large = st.Mix(batch=6, short_share=0.5), st.Mix(batch=10, short_share=1.0)
    source = pf.RowSource(stream, workers=2, ahead=3)
    try:

        def mix_of(step: int):
            return small if step < 4 else large

        for step in [0, 1, 2, 3, 4, 5, 9, 10]:  # a stage change at 4, a jump (resume) to 9
            got = source.rows(step, mix_of(step), mix_of)
            assert got == stream.rows(step, mix_of(step)) and len(got) == mix_of(step).batch
        assert set(source.pending) == {11, 12, 13}  # prefetched ahead
        assert source.rows(11, small) == stream.rows(11, small)  # a prefetch for another mix is not used
    finally:
        source.close()
    assert pf.RowSource(stream).rows(2, small) == stream.rows(2, small)  # no workers: built on the spot


def test_time_limit_saves_exports_and_resumes(tok, tmp_path, mini_pb):
    run = {"save_every": 4, "eval_every": 0, "export_every": 0}
    config = _config(tmp_path, tok, [{"kind": "short", "steps": 5}], data={"short_batch": 4}, run=run)
    _train(config, mini_pb, tmp_path / "r", "--set", "run.time_limit=1e-6")  # past the limit after the first step
    ckpts = tmp_path / "r" / "checkpoints"
    assert (ckpts / "latest").read_text() == "step-0000001"  # saved although 1 is not a multiple of save_every
    assert json.loads((tmp_path / "r" / "export" / "training.json").read_text())["step"] == 1
    _train(config, mini_pb, tmp_path / "r", "--resume")
    assert json.loads((tmp_path / "r" / "export" / "training.json").read_text())["step"] == 5
    assert [json.loads(ln)["step"] for ln in (tmp_path / "r" / "log.jsonl").read_text().splitlines()] == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="run.time_limit must be > 0"):
        cf.load_config(config, ["run.time_limit=0"])


def test_resume_with_another_lr_follows_the_new_peak_rate(tok, tmp_path, mini_pb):
    run = {"save_every": 2, "eval_every": 0, "export_every": 0}
    optim = {"stage_warmup": 0, "decay_steps": 2}
    data = {"short_batch": 4}
    first = [{"kind": "short", "steps": 2}, {"kind": "short", "steps": 2, "lr": 2e-3}]
    config = _config(tmp_path, tok, first, data=data, optim={**optim, "lr": 1e-3}, run={**run, "stop_after": 2})
    _train(config, mini_pb, tmp_path / "r")
    # resumed at half the rate with the second stage lengthened: its own rate (scaled by optim.lr as in a fresh run),
    # constant, then the decay to a tenth over the last two steps (the rate logged at step s is the next step's)
    second = [{"kind": "short", "steps": 2}, {"kind": "short", "steps": 4, "lr": 1e-3}]
    config = _config(tmp_path, tok, second, data=data, optim={**optim, "lr": 5e-4}, run=run)
    _train(config, mini_pb, tmp_path / "r", "--resume")
    log = [json.loads(x) for x in (tmp_path / "r" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6]
    assert [r["lr"] for r in log[:2]] == [1e-3, 2e-3]  # written by the first run
    assert [r["lr"] for r in log[2:]] == pytest.approx([1e-3, 1e-3, 5.5e-4, 1e-4])  # the old peak gave twice these

    # the optimizer's rate for the very next step is the new one too (not only the scheduler's bookkeeping)
    w = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([w], lr=1e-3)
    shape = sc.wsd_lambda(1, 10, 4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, shape)
    for _ in range(7):
        opt.step()
        sched.step()
    state = (opt.state_dict(), sched.state_dict())
    opt2 = torch.optim.AdamW([w], lr=3e-4)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, shape)
    opt2.load_state_dict(state[0])
    sched2.load_state_dict(state[1])
    assert opt2.param_groups[0]["lr"] == pytest.approx(1e-3 * shape(7))  # what a plain resume would use
    said = []
    sc.apply_peak_rate(sched2, 3e-4, said.append)
    assert opt2.param_groups[0]["lr"] == pytest.approx(3e-4 * shape(7)) and "0.0003" in said[0]
    sched2.step()
    assert opt2.param_groups[0]["lr"] == pytest.approx(3e-4 * shape(8))
    sc.apply_peak_rate(sched2, 3e-4, said.append)  # the same rate: nothing to say, nothing changed
    assert len(said) == 1 and opt2.param_groups[0]["lr"] == pytest.approx(3e-4 * shape(8))


def test_chat_short_rows_are_scored_as_chats(tok, tmp_path, mini_pb):
    data = {"short_batch": 2, "short_format": "chat"}
    run = {"eval_every": 1, "eval_samples": 1, "export_every": 0}
    config = _config(tmp_path, tok, [{"kind": "short", "steps": 1, "tasks": ["copy"]}], data=data, run=run)
    _train(config, mini_pb, tmp_path / "r")
    record = json.loads((tmp_path / "r" / "log.jsonl").read_text().splitlines()[-1])
    assert set(record["eval"]) == {f"short/{t}" for t in st.TASKS} and record["eval_mean"] is None


@pytest.mark.slow
def test_resume_from_checkpoint_is_exact(tok, tmp_path, mini_pb):
    from safetensors.torch import load_file

    stages = [
        {"kind": "short", "steps": 2},
        {"kind": "full", "steps": 2, "lr": 5e-4, "reset": True, "share": 0.5, "icl": 0.5},
    ]
    data = {"short_batch": 6, "full_batch": 4}
    run = {"save_every": 2, "eval_every": 4, "eval_samples": 1, "export_every": 0}
    config = _config(tmp_path, tok, stages, model={"rope_theta": 5e5}, data=data, run=run)
    _train(config, mini_pb, tmp_path / "a")
    _train(config, mini_pb, tmp_path / "b", "--set", "run.stop_after=3")
    ckpts = tmp_path / "b" / "checkpoints"
    # a run that stop_after ends keeps its last step: saved and exported off the periods (the shipped configs end so)
    assert (ckpts / "latest").read_text() == "step-0000003"
    assert json.loads((tmp_path / "b" / "export" / "training.json").read_text())["step"] == 3
    assert not list(ckpts.glob(".tmp*"))  # written to a temporary directory, then renamed into place
    assert json.loads((ckpts / "step-0000002" / "trainer_state.json").read_text())["step"] == 2
    # as a kill after step 3 and before its save leaves the run: step 3 was run but not saved, so it runs again
    shutil.rmtree(ckpts / "step-0000003")
    (ckpts / "latest").write_text("step-0000002")
    # the resumed half builds its rows in two worker processes: the same batches, so the same weights
    _train(config, mini_pb, tmp_path / "b", "--resume", "--set", "run.row_workers=2")
    a = load_file(tmp_path / "a" / "export" / "model.safetensors")
    b = load_file(tmp_path / "b" / "export" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert sorted(p.name for p in ckpts.glob("step-*")) == ["step-0000002", "step-0000004"]
    # the full stage started with fresh Adam moments: two steps counted at the end, not four
    opt_state = torch.load(ckpts / "step-0000004" / "optimizer.bin", weights_only=False)["state"]
    assert {int(v["step"]) for v in opt_state.values()} == {2}
    log_a = [json.loads(x) for x in (tmp_path / "a" / "log.jsonl").read_text().splitlines()]
    log_b = [json.loads(x) for x in (tmp_path / "b" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log_b] == [1, 2, 3, 4]  # the re-run step 3 replaced, not repeated
    assert [r["loss"] for r in log_a] == [r["loss"] for r in log_b] and [r["stage"] for r in log_a] == [0, 0, 1, 1]
    # bare short rows (the default format) are not scored as chats: the held-out official prompts alone
    assert set(log_a[-1]["eval"]) == set(st.TASKS) and log_a[-1]["eval_short_mean"] is None
    cfg = json.loads((tmp_path / "a" / "export" / "config.json").read_text())
    assert cfg["model_type"] == "llada" and cfg["mask_token_id"] == tok.mask_token_id == 2
    assert cfg["rope_theta"] == 5e5  # model.rope_theta reaches the exported config
    run_json = json.loads((tmp_path / "a" / "run.json").read_text())
    assert run_json["config"]["stages"][1]["lr"] == 5e-4 and run_json["config"]["model"]["rope_theta"] == 5e5
    # with --init the model keeps its own base unless model.rope_theta names another, which then reaches the export
    cont = _config(tmp_path, tok, [{"kind": "short", "steps": 1}], data={"short_batch": 2}, run=run)
    for out, extra, base in (("c", [], 5e5), ("d", ["--set", "model.rope_theta=1e6"], 1e6)):
        init = ["--init", str(tmp_path / "a" / "export"), "--set", "run.eval_every=0"]
        _train(cont, mini_pb, tmp_path / out, *init, *extra)
        assert json.loads((tmp_path / out / "export" / "config.json").read_text())["rope_theta"] == base
    assert cfg["eos_token_id"] == cfg["pad_token_id"] == tok.eos_token_id == 1
    tok_cfg = json.loads((tmp_path / "a" / "export" / "tokenizer_config.json").read_text())
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and "<|eot_id|>" in tok_cfg["chat_template"]
    with pytest.raises(ValueError, match="is not a dream model"):
        _train(cont, mini_pb, tmp_path / "e", "--init", str(tmp_path / "a" / "export"), "--set", "model.family=dream")


# ------------------------------------------------------------------------------------------ shipped models


@pytest.mark.parametrize("name,model_type", [("demo-llada", "llada"), ("demo-dream", "Dream")])
def test_shipped_demo_model_loads_and_decodes_a_list(name, model_type):
    from transformers import AutoModel

    path = DEMO / name
    if not (path / "model.safetensors").is_file():
        pytest.skip(f"{name} is not shipped yet")
    model = AutoModel.from_pretrained(path)
    assert type(model).__name__ == {"llada": "LLaDAModelLM", "Dream": "DreamModel"}[model_type]
    assert model.config.model_type == model_type
    model, tok = dlm_decode.load_model(name)
    assert model.mask_token_id == tok.mask_token_id
    prompt = (
        "You are managing a waiting line at a customer service desk.\nYou need to record the following people in the "
        "order they arrived:\n{context}\nPlease copy the list exactly and provide only the final list.\n"
    )
    config = {**COPY_CONFIG, "prompt": prompt}
    names = [["Billy", "Alan", "Grace", "Maria", "Susan", "Kyle"], ["Ramos", "Wells", "Wright", "Bennett", "Romero"]]
    samples = generate_task("waiting_line/copy", config, names, n=4, seed=11)
    out = dlm_decode.generate(
        model,
        [build_messages(config, s) for s in samples],
        tokenizer=tok,
        chat=True,
        sampler="low_confidence",
        gen_length=32,
        block_length=32,
        steps=32,
    )
    assert out.nfe == 32
    assert all(text is not None and text.startswith('["') for text in out.texts), out.texts
    scores = path / "scores.json"
    if scores.is_file() and json.loads(scores.read_text())["scores"]["waiting_line/copy"] >= 95:
        right = sum(text == s["answer"] for text, s in zip(out.texts, samples, strict=True))
        assert right >= 3, out.texts  # the card claims >= 95% on copy


def test_stratified_mask_ratios_cover_every_stratum(tok, rows):
    batch = ob.collate(rows, tok.pad_token_id)  # 8 rows
    _, _, p = ob.mask_response(batch, tok.mask_token_id, ob.step_generator(0, 3), eps=0.0, stratified=True)
    assert sorted(int(x * 8) for x in p) == list(range(8))  # one ratio in each eighth of [0, 1)
    _, _, q = ob.mask_response(batch, tok.mask_token_id, ob.step_generator(0, 3), eps=0.0, stratified=True)
    assert torch.equal(p, q)  # still a function of (seed, step)


def test_bare_short_rows_and_tied_embeddings(mini_pb, tok):
    stream = st.RowStream(mini_pb, tok, seed=0)
    rows = stream.rows(2, st.Mix(batch=6, short_share=1.0, tasks=("waiting_line/copy",), bare=True))
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    for prompt, resp, _ in rows:
        assert prompt[0] == tok.bos_token_id and tok.convert_tokens_to_ids("<|start_header_id|>") not in prompt
        text = tok.decode(prompt[1:])
        assert text.startswith("copy [") and resp[-1] == eot and eot not in resp[:-1]
        assert tok.decode(resp[:-1]) == text[len("copy ") :].rstrip("\n")  # copy: the answer is the list itself
    # with the in-context example first the row holds two lists, and the answer is the last one's
    icl = stream.rows(2, st.Mix(batch=6, short_share=1.0, tasks=("waiting_line/copy",), bare=True, icl=1.0))
    for (p0, r0, _), (p1, r1, _) in zip(rows, icl, strict=True):
        assert r1 == r0 and p1[-len(p0) + 1 :] == p0[1:] and p1[0] == tok.bos_token_id
        example = tok.decode(p1[1 : len(p1) - len(p0) + 1])
        shown, answer = example.removesuffix("<|eot_id|>").split("\n")
        assert shown == "copy " + answer and answer != tok.decode(r0[:-1])  # another list, answered
    half = stream.rows(2, st.Mix(batch=6, short_share=1.0, tasks=("waiting_line/copy",), bare=True, icl=0.5))
    assert 0 < sum(len(a[0]) > len(b[0]) for a, b in zip(half, rows, strict=True)) < 6
    chat = stream.rows(2, st.Mix(batch=6, short_share=1.0, tasks=("waiting_line/copy",), icl=1.0))
    assert all(tok.decode(p).count("<|start_header_id|>user") == 2 for p, _, _ in chat)
    padded = stream.rows(2, st.Mix(batch=6, short_share=1.0, tasks=("waiting_line/copy",), bare=True, pad=True))
    for (p0, r0, _), (p1, r1, _) in zip(rows, padded, strict=True):
        # same rows, the response padded with EOS to the task's 32 tokens, like the official rows' responses
        assert p1 == p0 and len(r1) == 32 and r1[: len(r0)] == r0
        assert set(r1[len(r0) :]) == {tok.eos_token_id} and len(r0) < 32
    size = cf.ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, mlp_hidden=64, tie_embeddings=True)
    model = md.make_model(size, tok)
    assert model.config.weight_tying and not hasattr(model.model.transformer, "ff_out")
    with torch.no_grad():
        model.get_input_embeddings().weight[5].fill_(0.5)
    h = torch.zeros(1, 32)
    h[0, 0] = 1.0
    with torch.no_grad():
        assert float(model.output_logits(h)[0, 5]) == 0.5  # the output projection is the embedding
    with pytest.raises(ValueError, match="tie_embeddings is for family llada"):
        cf.config_from_dict({"model": {"family": "dream", "tie_embeddings": True, "tokenizer": "t"}})


def _aux_rows(st, mini_pb, tok, kind: str, step: int, batch: int) -> list[tuple[str, str, list[int], str]]:
    """A step's rows of one training-only kind, half short and half full: (prompt text, answer text, response ids,
    label)."""
    stream = st.RowStream(mini_pb, tok, seed=0)
    rows = stream.rows(step, st.Mix(batch=batch, short_share=0.5, tasks=(kind,), bare=True, pad=True))
    assert {label for _, _, label in rows} == {f"short/{kind}", f"full/{kind}"}
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    return [(tok.decode(p), tok.decode(r[: r.index(eot)]), r, label) for p, r, label in rows]


def test_find_rows_ask_for_last_names_by_first_name(mini_pb, tok):
    import random

    sample = {"input": {"context": '["Ann Lee", "Bo Kim", "Ann Fox", "Cy Day"]'}}
    seen = set()
    for seed in range(40):
        query, answer = st.lookup_query(sample, random.Random(seed))
        # only people whose first name is unique in the list are asked for, each once, answered in the query's order
        assert answer and len(set(answer)) == len(answer) and set(answer) <= {"Bo Kim", "Cy Day"}
        assert query == [a.split(" ")[0] for a in answer]
        seen.add(tuple(answer))
    assert ("Cy Day", "Bo Kim") in seen and ("Bo Kim", "Cy Day") in seen and ("Bo Kim",) in seen
    for text, answer, resp, label in _aux_rows(st, mini_pb, tok, st.LOOKUP, step=4, batch=12):
        lists = list(re.finditer(r"\[[^\]]*\]", text))
        at = text.index("find ") + 5
        query = json.loads(next(m.group() for m in lists if m.start() == at))
        people = json.loads([m.group() for m in lists if m.start() != at][-1])
        # the answer is the queried first names completed from the list, and the full row is the official copy chat
        assert json.loads(answer) == [next(p for p in people if p.split(" ")[0] == q) for q in query], text
        assert len(resp) == 32 and ("<|start_header_id|>" in text) == label.startswith("full/")
    assert _stage(kind="short", tasks=["find", "copy"]).tasks == (st.LOOKUP, "waiting_line/copy")
    assert _weights({"find": 3}) == {st.LOOKUP: 3.0}


def test_exclude_rows_keep_the_people_the_remove_line_does_not_name(mini_pb, tok):
    import random

    sample = {"input": {"context": '["Ann Lee", "Bo Kim", "Ann Fox", "Cy Day"]'}}
    people = json.loads(sample["input"]["context"])
    sizes, orders = set(), set()
    for seed in range(60):
        named, kept = st.exclude_query(sample, random.Random(seed))
        # kept and named split the list; the kept stay in list order, at least one of each
        assert kept and named and sorted(kept + named) == sorted(people)
        assert kept == [p for p in people if p in kept]
        sizes.add(len(kept))
        orders.add(tuple(named))
    assert sizes == {1, 2, 3}
    survivors = set()
    for seed in range(20):  # a missing row keeps exactly one person, whoever it is
        named, kept = st.missing_query(sample, random.Random(seed))
        assert len(kept) == 1 and sorted(kept + named) == sorted(people)
        survivors.add(kept[0])
    assert survivors == set(people)
    assert ("Bo Kim", "Ann Lee") in orders and ("Ann Lee", "Bo Kim") in orders  # the named come in any order
    for text, answer, resp, label in _aux_rows(st, mini_pb, tok, st.EXCLUDE, step=2, batch=10):
        answer = json.loads(answer)
        at = text.index("remove ") + 7
        lists = list(re.finditer(r"\[[^\]]*\]", text))
        named = json.loads(next(m.group() for m in lists if m.start() == at))
        whole = json.loads([m.group() for m in lists if m.start() != at][-1])
        assert answer == [p for p in whole if p not in named] and answer, text
        assert len(resp) == 32 and ("<|start_header_id|>" in text) == label.startswith("full/")
    assert _stage(kind="full", tasks=["exclude", "copy"]).tasks == (st.EXCLUDE, "waiting_line/copy")
    assert _weights({"exclude": 4}) == {st.EXCLUDE: 4.0}
    assert _stage(kind="full", tasks=["missing"]).tasks == (st.MISSING,)


def test_missing_first_rows_ask_the_missing_question_over_first_names(mini_pb, tok):
    sample = {"input": {"context": '["Ann Lee", "Bo Kim", "Ann Fox", "Cy Day"]'}, "output": "x"}
    assert st.first_names_only(sample)["input"]["context"] == '["Ann", "Bo", "Cy"]'  # distinct, in list order
    assert st.first_names_only(sample)["output"] == "x" and sample["input"]["context"].startswith('["Ann Lee"')
    survivors = set()
    for text, answer, _, _label in _aux_rows(st, mini_pb, tok, st.MISSING_FIRST, step=5, batch=12):
        (kept,) = json.loads(answer)
        at = text.index("remove ") + 7
        lists = list(re.finditer(r"\[[^\]]*\]", text))
        named = json.loads(next(m.group() for m in lists if m.start() == at))
        whole = json.loads([m.group() for m in lists if m.start() != at][-1])
        assert all(" " not in p for p in whole + named) and len(set(whole)) == len(whole), text  # first names only
        assert sorted(named + [kept]) == sorted(whole), text
        assert len(tok(kept, add_special_tokens=False)["input_ids"]) == 1  # one token: no second token to copy
        survivors.add(whole.index(kept))
    assert len(survivors) > 1  # the survivor is not always at the same place
    assert _stage(kind="short", tasks=["missing_first"]).tasks == (st.MISSING_FIRST,)
    assert _weights({"missing_first": 2, "missing": 1}) == {st.MISSING_FIRST: 2.0, st.MISSING: 1.0}


def test_latin_fill_rows_give_part_of_a_valid_square_and_ask_for_all_of_it(mini_pb, tok):
    import random

    square = "H,4,A,C\n4,C,H,A\nC,A,4,H\nA,H,C,4"
    blanks = set()
    for seed in range(60):
        grid = st.latin_fill_grid(square, random.Random(seed))
        cells, given = grid.replace("\n", ",").split(","), square.replace("\n", ",").split(",")
        assert len(cells) == 16 and grid.count("\n") == 3
        assert all(c == st.BLANK or c == g for c, g in zip(cells, given, strict=True))  # givens are the square's own
        blanks.add(cells.count(st.BLANK))
    assert min(blanks) >= 1 and 16 in blanks and 1 in blanks and len(blanks) > 8  # 1..16 blanks
    seen = set()
    stream = st.RowStream(mini_pb, tok, seed=0)
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    rows = stream.rows(3, st.Mix(batch=12, short_share=0.5, tasks=(st.LATIN_FILL,), bare=True, pad=True))
    assert {label for _, _, label in rows} == {"short/aux/latin_fill", "full/aux/latin_fill"}
    for prompt, resp, label in rows:
        text, answer = tok.decode(prompt), tok.decode(resp[: resp.index(eot)]).replace(" ", "")
        symbols = sorted(re.findall(r"(?:over|latin) \[([^\]]*)\]", text)[-1].replace(" ", "").split(","))
        square_rows = [r.split(",") for r in answer.split("\n")]
        assert all(sorted(r) == symbols for r in square_rows), answer  # a valid square over the prompt's symbols
        assert all(sorted(c) == symbols for c in zip(*square_rows, strict=True)), answer
        grid_lines = re.findall(r"^([^,\n<]+(?:,[^,\n<]+){3})", text, re.M)[-4:]  # the last four CSV lines
        grid = [ln.replace(" ", "").split(",") for ln in grid_lines]
        assert all(
            g in (st.BLANK, a) for gr, ar in zip(grid, square_rows, strict=True) for g, a in zip(gr, ar, strict=True)
        ), (text, answer)
        assert label.startswith("short/") == ("Latin square" not in text)  # full rows are the official chat
        seen.add(answer)
    assert len(seen) > 1
    stage = _stage(kind="full", tasks=["latin_square_n4", "latin_fill"])
    assert stage.tasks == ("puzzle/latin_square_n4", st.LATIN_FILL)


def test_canvas_widens_the_full_rows_eos_padding_to_drawn_lengths(mini_pb, tok):
    stream = st.RowStream(mini_pb, tok, seed=0)
    tasks = ("waiting_line/copy", "puzzle/latin_square_n4")
    plain = stream.rows(7, st.Mix(batch=16, short_share=0.5, tasks=tasks, bare=True, pad=True))
    wide = stream.rows(7, st.Mix(batch=16, short_share=0.5, tasks=tasks, bare=True, pad=True, canvas=200))
    assert st.RowStream(mini_pb, tok, seed=0).rows(7, st.Mix(16, 0.5, tasks, bare=True, pad=True, canvas=200)) == wide
    eos = tok.eos_token_id
    grown = set()
    assert [(p, label) for p, _, label in plain] == [(p, label) for p, _, label in wide]  # same rows, same order
    for (_, a, label), (_, b, _) in zip(plain, wide, strict=True):
        assert b[: len(a)] == a and set(b[len(a) :]) <= {eos}  # only EOS is added, after the row's own response
        if label.startswith("short/"):
            assert b == a
        else:
            assert len(a) <= len(b) <= 200
            grown.add(len(b) - len(a))
    assert len(grown) > 2 and max(grown) > 50  # drawn lengths, not one fixed pad
    import random

    state = ((1, 2, 3), (1, 2))  # a decode-order row: its added slots are masked and never scored
    (_, resp, _, (masked, scored)), *_ = stream.widen(
        [([9], [5, 6, 7, 8], "full/aux/self", state)], 40, random.Random(3)
    )
    assert len(resp) > 4 and masked == (1, 2, 3, *range(4, len(resp))) and scored == (1, 2)
    assert _stage(canvas=256).canvas == 256 and _stage().canvas == 0
    for bad in (-1, 257, "x"):
        with pytest.raises(ValueError, match="canvas"):
            _stage(canvas=bad)


def test_latin_rest_rows_give_the_first_rows_and_ask_for_the_rest(mini_pb, tok):
    import random

    from dlm_decode.parallelbench.tasks import max_new_tokens

    square = "H,4,A,C\n4,C,H,A\nC,A,4,H\nA,H,C,4"
    splits = [st.latin_rest_split(square, random.Random(seed)) for seed in range(40)]
    assert all(lead + rest == square and lead.endswith("\n") for lead, rest in splits)
    assert {lead.count("\n") for lead, _ in splits} == {1, 2, 3}  # one to three whole rows given
    assert sum(lead.count("\n") == 3 for lead, _ in splits) > 12  # three rows (the column rule alone) most often
    stream = st.RowStream(mini_pb, tok, seed=0)
    eot, gen = tok.convert_tokens_to_ids("<|eot_id|>"), max_new_tokens("puzzle/latin_square_n4")
    rows = stream.rows(2, st.Mix(batch=12, short_share=0.5, tasks=(st.LATIN_REST,), bare=True, pad=True))
    assert {label for _, _, label in rows} == {"short/aux/latin_rest", "full/aux/latin_rest"}
    for prompt, resp, _ in rows:
        text, rest = tok.decode(prompt), tok.decode(resp[: resp.index(eot)]).replace(" ", "")
        lead_lines = re.findall(r"^([^,\n<]+(?:,[^,\n<]+){3})\n", text, re.M)[-(4 - rest.count("\n") - 1) :]
        lead = "".join(ln.replace(" ", "") + "\n" for ln in lead_lines)
        assert text.endswith(lead_lines[-1] + "\n")  # the given rows end the prompt: the canvas goes on from there
        square_rows = [r.split(",") for r in (lead + rest).split("\n")]
        assert len(square_rows) == 4 and all(
            sorted(c) == sorted(square_rows[0]) for c in zip(*square_rows, strict=True)
        )
        assert len(resp) + len(tok(lead, add_special_tokens=False)["input_ids"]) == gen  # ends where the canvas does
    assert _stage(kind="full", tasks=["latin_rest"]).tasks == (st.LATIN_REST,)


def test_sort_close_rows_sort_people_with_neighbouring_first_names(mini_pb, tok):
    import random

    from dlm_decode.parallelbench.generator import sample_key

    firsts = sorted(NAMES[0])
    for seed in range(30):
        people = st.close_people(3, random.Random(seed), NAMES)
        ranks = sorted(firsts.index(p.split()[0]) for p in people)
        assert len(set(ranks)) == 3 and ranks[-1] - ranks[0] <= 3 + 2  # a window of 3..6 consecutive first names
        assert all(p.split()[1] in NAMES[1] for p in people)
    with pytest.raises(ValueError, match="9 people from 8 first names"):
        st.close_people(9, random.Random(0), NAMES)
    stream = st.RowStream(mini_pb, tok, seed=6)
    rows = stream.rows(1, st.Mix(batch=16, short_share=0.5, tasks=(st.SORT_CLOSE,), bare=True, pad=True))
    assert {label for _, _, label in rows} == {"short/aux/sort_close", "full/aux/sort_close"}
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    for prompt, resp, label in rows:
        listed = json.loads(re.findall(r"\[[^\[\]]*\]", tok.decode(prompt))[-1])
        answer = json.loads(tok.decode(resp[: resp.index(eot)]))
        assert answer == sorted(listed)  # the row's own list, sorted
        spread = [firsts.index(p.split()[0]) for p in listed]
        assert max(spread) - min(spread) <= len(listed) + 2
        if label.startswith("full/"):  # the official sort chat
            assert "sort" in tok.decode(prompt).lower() and "<|start_header_id|>" in tok.decode(prompt)
    # an official (excluded) sample is never produced: with every draw colliding, a clear error
    sample = stream.samples("waiting_line/sort", 1, seed=3)[0]
    stream.exclude["waiting_line/sort"] = {sample_key(st.close_sort_sample(sample, random.Random(9), NAMES))}
    assert (
        sample_key(stream.variant_sample(st.SORT_CLOSE, sample, random.Random(9)))
        not in stream.exclude["waiting_line/sort"]
    )

    class Always(set):
        def __contains__(self, key):
            return True

    stream.exclude["waiting_line/sort"] = Always()
    with pytest.raises(RuntimeError, match="collided"):
        stream.variant_sample(st.SORT_CLOSE, sample, random.Random(9))
    # under auxchat=0 the variant still fills official slots, as the sort chat
    stream = st.RowStream(mini_pb, tok, seed=6)
    mix = st.Mix(batch=20, short_share=0.5, tasks=("waiting_line/copy", st.SORT_CLOSE), bare=True, aux_chat=False)
    assert "full/aux/sort_close" in {label for _, _, label in stream.rows(2, mix)}
    assert _stage(tasks=["copy", "sort_close"], aux_chat=False).tasks == ("waiting_line/copy", st.SORT_CLOSE)


def test_gap_rows_put_own_template_words_between_list_and_answer(mini_pb, tok):
    stream = st.RowStream(mini_pb, tok, seed=0)
    tasks = ("waiting_line/reverse", "waiting_line/insert_index")
    plain = st.Mix(batch=16, short_share=1.0, tasks=tasks, bare=True, pad=True)
    gapped = st.Mix(batch=16, short_share=1.0, tasks=tasks, bare=True, pad=True, gap=30)
    # no gap: the rows of runs from before the option, byte for byte (resume); the answers do not change with a gap
    assert stream.rows(7, plain) == stream.rows(7, st.Mix(**{**plain.__dict__, "gap": 0}))
    a, b = stream.rows(7, plain), stream.rows(7, gapped)
    assert [r for _, r, _ in a] == [r for _, r, _ in b]
    lengths = []
    for (pa, _, label), (pb, _, _) in zip(a, b, strict=True):
        text_a, text_b = tok.decode(pa), tok.decode(pb)
        assert text_b.startswith(text_a.rstrip("\n"))  # the short row, then its filler
        filler = text_b[len(text_a.rstrip("\n")) :].split()
        lengths.append(len(filler))
        assert len(filler) <= 30 and set(filler) <= set(stream.filler_words[label.split("/", 1)[1]])
        # the filler is a span of the row's own template: it never names another operation
        other = "insert" if "reverse" in label else "reverse"
        assert other not in filler
    assert min(lengths) < 10 and max(lengths) > 20  # drawn, not fixed
    assert _stage(kind="short", gap=48).gap == 48
    with pytest.raises(ValueError, match="gap"):
        _stage(kind="short", gap=-1)


def test_uniform_lengths_draws_every_list_length_where_the_buckets_give_the_shortest(mini_pb, tok):
    """The official length buckets fill first bucket first: a task drawn once in a step only ever gets its shortest
    list. ``uniform_lengths`` draws each row's length over the whole range (mini_pb's lists: 3 or 4 people)."""
    stream = st.RowStream(mini_pb, tok, seed=0)

    def people(uniform: bool) -> list[int]:  # one reverse sample per seed: its list's length
        return [
            len(json.loads(stream.samples("waiting_line/reverse", 1, seed, uniform=uniform)[0]["input"]["context"]))
            for seed in range(40)
        ]

    assert set(people(False)) == {3}
    drawn = people(True)
    assert set(drawn) == {3, 4} and 10 <= drawn.count(4) <= 30
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    tasks = ("waiting_line/copy", "waiting_line/reverse", "waiting_line/sort")
    mix = st.Mix(batch=3, short_share=1.0, tasks=tasks, bare=True, pad=True)

    def lone(m: st.Mix) -> list[int]:  # the list lengths of the rows that were their task's one row in a step
        out = []
        for step in range(40):
            rows = stream.rows(step, m)
            labels = [label for _, _, label in rows]
            out += [len(json.loads(tok.decode(r[: r.index(eot)]))) for _, r, lb in rows if labels.count(lb) == 1]
        return out

    bucketed, uniform = lone(mix), lone(dataclasses.replace(mix, uniform_lengths=True))
    assert len(bucketed) > 20 and set(bucketed) == {3}
    assert 0.25 < uniform.count(4) / len(uniform) < 0.75
    assert cf.DataConfig().uniform_lengths is False  # the shipped stages' data stays as it was


def test_len_stage_option_sets_the_people_per_list(mini_pb, tok):
    stream = st.RowStream(mini_pb, tok, seed=0)
    tasks = ("waiting_line/sort", "waiting_line/copy")
    pairs = st.Mix(batch=24, short_share=0.5, tasks=tasks, bare=True, pad=True, icl=1.0, lengths=(2, 3))
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    seen = set()
    for prompt, resp, label in stream.rows(3, pairs):
        text = tok.decode(prompt)
        lists = [json.loads(m) for m in re.findall(r"\[\"[^\]]*\]", text)]
        assert len(lists) >= 2  # the in-context example's list (and its answer) and the row's own
        for people in lists:
            seen.add(len(people))
            assert 2 <= len(people) <= 3
        answer = json.loads(tok.decode(resp[: resp.index(eot)]))
        assert answer == (sorted(lists[-1]) if label.endswith("sort") else lists[-1])
    assert seen == {2, 3}
    # without the option: the task's own range (official sort lists hold 3 to 6 people), rows as before
    plain = st.Mix(batch=24, short_share=0.5, tasks=tasks, bare=True, pad=True, icl=1.0)
    assert stream.rows(3, plain) == stream.rows(3, st.Mix(**{**plain.__dict__, "lengths": None}))
    own = {len(json.loads(tok.decode(r[: r.index(eot)]))) for _, r, _ in stream.rows(3, plain)}
    assert min(own) >= 3 and max(own) > 3
    assert _stage(tasks=["sort"], lengths="2-3").lengths == (2, 3)
    assert _stage(tasks=["sort", "find"], lengths=4).lengths == (4, 4)
    for bad in ("1-3", "3-2", "2-9", "a"):
        with pytest.raises(ValueError, match="len"):
            _stage(kind="short", tasks=["sort"], lengths=bad)
    with pytest.raises(ValueError, match="latin_square"):
        _stage(kind="short", tasks=["sort", "latin_square_n4"], lengths="2-3")
    with pytest.raises(ValueError, match="lengths sets"):
        _stage(kind="short", lengths="2-3")  # all twelve tasks: the puzzles have no list


def test_auxchat_0_keeps_training_only_rows_out_of_the_official_slots(mini_pb, tok):
    stream = st.RowStream(mini_pb, tok, seed=4)
    tasks = ("waiting_line/copy", st.MISSING_FIRST, st.MISSING)
    chat = st.Mix(batch=40, short_share=0.5, tasks=tasks, weights=(1.0, 3.0, 2.0), bare=True)
    short_only = st.Mix(**{**chat.__dict__, "aux_chat": False})
    with_chats, without = stream.rows(3, chat), stream.rows(3, short_only)
    labels = [label for _, _, label in with_chats]
    assert {"full/aux/missing_first", "full/aux/missing"} & set(labels)  # the default: questions in the copy chat
    assert sorted(label for _, _, label in without if label.startswith("full/")) == ["full/waiting_line/copy"] * 20
    # the short rows are drawn alike either way (their tasks; the samples follow the batch's other draws)
    assert sorted(lb for lb in labels if lb.startswith("short/")) == sorted(
        lb for _, _, lb in without if lb.startswith("short/")
    )
    stage = _stage(tasks=["copy", "missing_first"], share=0.5, aux_chat=False)
    assert stage.aux_chat is False and _stage().aux_chat is True
    with pytest.raises(ValueError, match="aux_chat false needs an official task"):
        _stage(tasks=["missing_first"], aux_chat=False)


def test_auxpad_0_leaves_training_only_rows_unpadded_beside_padded_task_rows(mini_pb, tok):
    stream = st.RowStream(mini_pb, tok, seed=5)
    tasks = ("waiting_line/copy", st.MISSING_FIRST)
    padded = st.Mix(batch=24, short_share=1.0, tasks=tasks, bare=True, pad=True)
    mixed = st.Mix(**{**padded.__dict__, "aux_pad": False})
    eos, eot = tok.eos_token_id, tok.convert_tokens_to_ids("<|eot_id|>")
    for mix, aux_padded in ((padded, True), (mixed, False)):
        rows = stream.rows(2, mix)
        kinds = {label for _, _, label in rows}
        assert kinds == {"short/waiting_line/copy", "short/aux/missing_first"}
        for _, resp, label in rows:
            if label.endswith("copy"):  # the official task's rows keep their padding either way
                assert resp[-1] == eos and eot in resp
            else:  # one first name answered, then <|eot_id|>; EOS padding only when the aux rows follow pad
                assert (resp[-1] == eos) is aux_padded
                assert resp[resp.index(eot) + 1 :] == ([eos] * (len(resp) - resp.index(eot) - 1))
                assert (len(resp) > resp.index(eot) + 1) is aux_padded
    # the same draws either way: only the padding of the training-only rows differs
    a, b = stream.rows(2, padded), stream.rows(2, mixed)
    assert [(p, lb) for p, _, lb in a] == [(p, lb) for p, _, lb in b]
    stage = _stage(tasks=["copy", "missing_first"], pad=True, aux_pad=False)
    assert stage.pad is True and stage.aux_pad is False and _stage().aux_pad is None


def test_train_only_updates_the_named_layers_and_keeps_the_rest_exactly(tok, tmp_path, mini_pb):
    from safetensors.torch import load_file

    run = {"eval_every": 0, "export_every": 0}
    config = _config(
        tmp_path, tok, [{"kind": "short", "steps": 3}], model={"n_layers": 2}, data={"short_batch": 4},
        optim={"lr": 1e-2}, run=run,
    )  # fmt: skip
    _train(config, mini_pb, tmp_path / "base")
    init = str(tmp_path / "base" / "export")
    _train(config, mini_pb, tmp_path / "f", "--init", init, "--set", r"optim.train_only=['blocks\.1\.']")
    before = load_file(tmp_path / "base" / "export" / "model.safetensors")
    after = load_file(tmp_path / "f" / "export" / "model.safetensors")
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(".blocks.1." in k for k in moved)  # the named layer trained, nothing else changed
    assert {k for k in before if ".blocks.1." in k and k.endswith(("attn_out.weight", "ff_out.weight"))} <= moved
    with pytest.raises(ValueError, match="matches no parameter"):
        _train(config, mini_pb, tmp_path / "x", "--init", init, "--set", "optim.train_only=[nothing_here]")
    with pytest.raises(ValueError, match="optim.train_only: 'blocks\\[\\('"):
        cf.load_config(config, ["optim.train_only=['blocks[(']"])


def test_keep_exports_leaves_every_periodic_export_beside_the_latest(tok, tmp_path, mini_pb):
    stages = [{"kind": "short", "steps": 2}, {"kind": "short", "steps": 3, "tasks": ["copy"]}]
    run = {"eval_every": 0, "export_every": 2, "keep_exports": True}
    _train(_config(tmp_path, tok, stages, data={"short_batch": 2}, run=run), mini_pb, tmp_path / "r")
    kept = sorted(p.name for p in (tmp_path / "r").glob("export-step*"))
    assert kept == ["export-step2", "export-step4", "export-step5"]  # 2 and 4 periodic (2 also a stage end), 5 the last
    steps = {name: json.loads((tmp_path / "r" / name / "training.json").read_text())["step"] for name in kept}
    assert steps == {"export-step2": 2, "export-step4": 4, "export-step5": 5}
    assert json.loads((tmp_path / "r" / "export" / "training.json").read_text())["step"] == 5


def test_last_rows_ask_for_one_last_name_by_its_first_name(mini_pb, tok):
    import random

    sample = {"input": {"context": '["Ann Lee", "Bo Kim", "Ann Fox", "Cy Day"]'}}
    seen = set()
    for seed in range(40):
        query, answer = st.last_query(sample, random.Random(seed))
        # one person whose first name is unique in the list (never an Ann), answered by the last name alone
        assert (query, answer) in ((["Bo"], ["Kim"]), (["Cy"], ["Day"])), (query, answer)
        seen.add(answer[0])
    assert seen == {"Kim", "Day"}
    # the find rows' draws are unchanged by the one-person option (a resumed find stage sees the same rows)
    assert st.lookup_query(sample, random.Random(3)) == st.lookup_query(sample, random.Random(3), one=False)
    places, eot = set(), tok.convert_tokens_to_ids("<|eot_id|>")
    for text, answer, resp, label in _aux_rows(st, mini_pb, tok, st.LAST, step=6, batch=16):
        at = text.index("last ") + 5
        lists = list(re.finditer(r"\[[^\]]*\]", text))
        (first,) = json.loads(next(m.group() for m in lists if m.start() == at))
        people = json.loads([m.group() for m in lists if m.start() != at][-1])
        (person,) = [p for p in people if p.split(" ")[0] == first]  # the first name names exactly one person
        last = person.split(" ")[1]
        assert answer == " " + last, text
        ids = tok(" " + last, add_special_tokens=False)["input_ids"]
        assert resp[:2] == [*ids, eot] and len(ids) == 1  # one token, the one the list has after the first name
        assert len(resp) == 32 and ("<|start_header_id|>" in text) == label.startswith("full/")
        places.add(people.index(person))
    assert len(places) > 1  # the asked-for person is not always at the same place: no position route
    assert _stage(kind="short", tasks=["last", "copy"]).tasks == (st.LAST, "waiting_line/copy")
    assert _weights({"last": 4}) == {st.LAST: 4.0}


def test_next_rows_begin_the_answer_with_the_first_name(mini_pb, tok):
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    labels = set()
    for text, answer, resp, label in _aux_rows(st, mini_pb, tok, st.NEXT, step=7, batch=12):
        at = text.index("last ") + 5
        lists = list(re.finditer(r"\[[^\]]*\]", text))
        (first,) = json.loads(next(m.group() for m in lists if m.start() == at))
        people = json.loads([m.group() for m in lists if m.start() != at][-1])
        (person,) = [p for p in people if p.split(" ")[0] == first]
        # the prompt ends with the answer's start '["First'; the response is ' Last"]', so the whole answer reads as
        # the one-person list, tokenised as the list spells it
        assert text.endswith('["' + first), text
        assert answer == " " + person.split(" ")[1] + '"]'
        whole = tok('["' + person + '"]', add_special_tokens=False)["input_ids"]
        assert whole[-2:] == resp[: resp.index(eot)]
        assert len(resp) == 32 and ("<|start_header_id|>" in text) == label.startswith("full/")
        labels.add(label)
    assert labels == {"short/aux/next", "full/aux/next"}
    assert _stage(kind="short", tasks=["next", "last"]).tasks == (st.NEXT, st.LAST)


def _export(folder: Path, tensors: dict[str, torch.Tensor], **config) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "llada", "d_model": 4, **config}))
    (folder / "tokenizer.json").write_text("{}")
    return folder


def _self_file(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _self_row(st, tok, mini_pb, task: str, sample: dict, target: str) -> dict:
    """A row as trajectories.py writes it: the chat prompt ids and the canvas of a verified answer."""
    from dlm_decode.parallelbench.tasks import load_task, max_new_tokens

    config = load_task(mini_pb, task, limit=0).config
    prompt, resp = st.encode_row(tok, build_messages(config, sample), target, max_new_tokens(task))
    return {"task": task, "prompt_ids": prompt, "response_ids": resp, "text": target, "score": 1.0}


def test_self_rows_are_verified_answers_and_never_an_official_prompt(mini_pb, tok, tmp_path):
    import random

    from dlm_decode.parallelbench.generator import random_answer
    from dlm_decode.parallelbench.tasks import load_task, max_new_tokens

    task = "waiting_line/shuffle"
    fresh = st.RowStream(mini_pb, tok, seed=0).samples(task, 3, seed=77)
    official = load_task(mini_pb, task).samples[0]
    rng = random.Random(0)
    good = [_self_row(st, tok, mini_pb, task, s, random_answer(task, s, rng)) for s in fresh]
    leak = _self_row(st, tok, mini_pb, task, official, random_answer(task, official, rng))
    path = _self_file(tmp_path / "a.jsonl", [*good, leak])
    canvas = {t: max_new_tokens(t) for t in st.TASKS}
    excluded = st.excluded_prompts(mini_pb, tok, {})
    assert tuple(leak["prompt_ids"]) in excluded and not any(tuple(r["prompt_ids"]) in excluded for r in good)
    rows, meta = sr.load_self_rows([path], vocab_size=len(tok), canvas=canvas, excluded_prompts=excluded)
    assert rows == [(r["prompt_ids"], r["response_ids"], task) for r in good]
    assert meta == {
        "rows": 3,
        "per_task": {task: 3},
        "dropped_excluded": 1,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }
    # what cannot be a training target is refused, naming the file and the line
    bad = {
        "unverified": {**good[0], "score": 0.5},
        "canvas is 32": {**good[0], "response_ids": good[0]["response_ids"][:-1]},
        "unknown task": {**good[0], "task": "waiting_line/juggle"},
        "outside the tokenizer": {**good[0], "prompt_ids": [len(tok), *good[0]["prompt_ids"]]},
        "not a trajectories.py row": {"task": task},
    }
    for message, row in bad.items():
        p = _self_file(tmp_path / "bad.jsonl", [good[1], row])
        with pytest.raises(ValueError, match=rf"bad.jsonl, line 2: .*{message}"):
            sr.load_self_rows([p], vocab_size=len(tok), canvas=canvas, excluded_prompts=excluded)
    with pytest.raises(ValueError, match="no usable row"):
        only_leak = _self_file(tmp_path / "b.jsonl", [leak])
        sr.load_self_rows([only_leak], vocab_size=len(tok), canvas=canvas, excluded_prompts=excluded)
    with pytest.raises(ValueError, match="is not a file"):
        sr.load_self_rows([tmp_path / "none.jsonl"], vocab_size=len(tok), canvas=canvas, excluded_prompts=excluded)

    # the stream draws them reproducibly, in official slots also under auxchat=0, beside the generated rows
    stream = st.RowStream(mini_pb, tok, seed=4, self_rows=rows)
    mix = st.Mix(batch=24, short_share=0.5, tasks=("waiting_line/copy", st.SELF), bare=True, aux_chat=False)
    drawn = stream.rows(3, mix)
    assert drawn == st.RowStream(mini_pb, tok, seed=4, self_rows=rows).rows(3, mix)
    mine = [(p, r) for p, r, label in drawn if label.endswith("/aux/self")]
    assert "full/aux/self" in {label for _, _, label in drawn} and mine
    assert all((p, r, task) in rows for p, r in mine)
    assert {label for _, _, label in drawn} >= {"full/waiting_line/copy"}
    with pytest.raises(ValueError, match="no self rows"):
        st.RowStream(mini_pb, tok, seed=4).rows(3, mix)


def test_train_takes_self_rows_only_with_a_stage_that_names_them_and_resumes_only_on_the_same(tok, tmp_path, mini_pb):
    import random

    from dlm_decode.parallelbench.generator import random_answer

    task = "waiting_line/shuffle"
    fresh = st.RowStream(mini_pb, tok, seed=0).samples(task, 4, seed=78)
    rng = random.Random(1)
    written = [_self_row(st, tok, mini_pb, task, s, random_answer(task, s, rng)) for s in fresh]
    written[:2] = [{**r, "masked": list(range(4, 32)), "scored": list(range(4, 12))} for r in written[:2]]  # states
    path = _self_file(tmp_path / "self.jsonl", written)
    canvas = {t: 32 for t in st.TASKS}
    loaded, _ = sr.load_self_rows([path], vocab_size=len(tok), canvas=canvas, excluded_prompts=set())
    mix = st.Mix(batch=6, short_share=0.0, tasks=("waiting_line/copy", st.SELF), weights=(1.0, 3.0), aux_chat=False)
    drawn = [row for step in range(3) for row in st.RowStream(mini_pb, tok, seed=4, self_rows=loaded).rows(step, mix)]
    states = [row for row in drawn if len(row) == 4]
    assert states and all(row[3] == (tuple(range(4, 32)), tuple(range(4, 12))) for row in states)
    stage = {"kind": "full", "steps": 3, "tasks": ["copy", "self"], "aux_chat": False}
    raw = {"model": {"tokenizer": "t"}, "stages": [stage]}
    with pytest.raises(ValueError, match="a stage names self; give the files"):
        cf.config_from_dict(raw)
    with pytest.raises(ValueError, match="no stage names self"):
        cf.config_from_dict({**raw, "stages": [{**stage, "tasks": ["copy"]}], "data": {"self_rows": [str(path)]}})
    data = {"full_batch": 6, "task_weights": {"self": 3}}
    run = {"save_every": 1, "eval_every": 0, "export_every": 0}
    good = _config(tmp_path, tok, [stage], data={**data, "self_rows": [str(path)]}, run=run)
    with pytest.raises(ValueError, match="none.jsonl is not a file"):
        _train(good, mini_pb, tmp_path / "n", "--set", f"data.self_rows=[{tmp_path / 'none.jsonl'}]")
    _train(good, mini_pb, tmp_path / "r", "--set", "run.stop_after=2")
    meta = json.loads((tmp_path / "r" / "run.json").read_text())["self_rows"]
    assert meta["rows"] == 4 and meta["dropped_excluded"] == 0 and len(meta["sha256"]) == 64
    other = _self_file(tmp_path / "other.jsonl", [json.loads(x) for x in path.read_text().splitlines()[:3]])
    with pytest.raises(ValueError, match="other self rows"):
        _train(good, mini_pb, tmp_path / "r", "--resume", "--set", f"data.self_rows=[{other}]")
    _train(good, mini_pb, tmp_path / "r", "--resume")
    assert [json.loads(x)["step"] for x in (tmp_path / "r" / "log.jsonl").read_text().splitlines()] == [1, 2, 3]


# ------------------------------------------------------------------------------------------ config files


@pytest.mark.parametrize(
    "name,family,seed,stop", [("demo-llada", "llada", 911, 3631), ("demo-dream", "dream", 921, 3619)]
)
def test_shipped_final_stage_configs_load_as_the_shipped_runs_were_set(name, family, seed, stop):
    cfg = cf.load_config(ROOT / "recipes" / "train_demo" / "configs" / f"{name}.yaml", [f"model.init={DEMO / name}"])
    assert cfg.model.family == family and cfg.run.seed == seed and cfg.run.stop_after == stop
    assert cfg.data.short_batch == cfg.data.full_batch == 128 and cfg.optim.lr == 1.5e-4
    assert cfg.optim.decay_steps == 1500 and cfg.optim.warmup == 100 and cfg.total_steps == 3800
    (stage,) = cfg.stages
    assert len(stage.tasks) == 18 and stage.tasks[-1] == st.SELF and stage.aux_chat is False and stage.gap == 48
    assert cfg.data.task_weights["sort_close"] == 12 and len(cfg.data.self_rows) == 2
    assert tr.tokenizer_dir(cfg) == DEMO / name  # the init checkpoint's tokenizer


def test_demo_llada2_configs_load_as_the_shipped_runs_were_set(monkeypatch):
    monkeypatch.chdir(ROOT)  # the first stage names demo-llada (its upcycle source) relative to the repository
    first = cf.load_config(ROOT / "recipes" / "train_demo" / "configs" / "demo-llada2-stage1.yaml")
    assert first.model.upcycle == "dlm_decode/demo_models/demo-llada" and first.total_steps == 240
    configs = ROOT / "recipes" / "train_demo" / "configs"
    init = [f"model.init={DEMO / 'demo-llada2'}"]
    second = cf.load_config(configs / "demo-llada2-stage2.yaml", init)
    third = cf.load_config(configs / "demo-llada2-stage3.yaml", init)
    fourth = cf.load_config(configs / "demo-llada2-stage4.yaml", init)
    fifth = cf.load_config(configs / "demo-llada2-stage5.yaml", init)
    sixth = cf.load_config(configs / "demo-llada2-stage6.yaml", init)
    seventh = cf.load_config(configs / "demo-llada2-stage7.yaml", init)
    eighth = cf.load_config(configs / "demo-llada2-stage8.yaml", init)
    ninth = cf.load_config(configs / "demo-llada2-stage9.yaml", init)
    tenth = cf.load_config(configs / "demo-llada2-stage10.yaml", init)
    eleventh = cf.load_config(configs / "demo-llada2-stage11.yaml", init)
    twelfth = cf.load_config(configs / "demo-llada2-stage12.yaml", init)
    thirteenth = cf.load_config(configs / "demo-llada2-stage13.yaml", init)
    fourteenth = cf.load_config(configs / "demo-llada2-stage14.yaml", init)
    fifteenth = cf.load_config(configs / "demo-llada2-stage15.yaml", init)
    final = cf.load_config(configs / "demo-llada2.yaml", init)
    assert final.model.family == "llada2" and final.model.attention == "block_causal" and final.model.block_length == 32
    assert second.total_steps == 1675 and third.total_steps == 2400 and third.optim.decay_steps == 600
    assert third.run.seed == second.run.seed == first.run.seed
    (stage,) = third.stages
    assert stage.pad and stage.aux_pad and third.data.task_weights["shuffle"] == 3
    assert dataclasses.replace(third, stages=second.stages) == second  # the same stage, run longer
    # the fourth stage: the third's, with three clean-context rows in four, half the peak rate and its own seed
    assert fourth.stages == (dataclasses.replace(stage, clean_context=0.75),) and fourth.optim.lr == third.optim.lr / 2
    assert fourth.data == third.data and fourth.total_steps == 2400 and fourth.run.seed == 4646
    # the fifth: the fourth's, plus demo-llada's self rows (demo-llada.yaml's) at weight 8, and its own seed
    (with_self,) = fifth.stages
    assert with_self == dataclasses.replace(fourth.stages[0], tasks=(*fourth.stages[0].tasks, st.SELF))
    assert fifth.data.self_rows == cf.load_config(configs / "demo-llada.yaml", init).data.self_rows
    assert fifth.data.task_weights == {**fourth.data.task_weights, "self": 8.0}
    assert fifth.optim == fourth.optim and fifth.total_steps == 2400 and fifth.run.seed == 4648
    # the sixth: the fifth's stage and rate, four new self-row files at weight 12, two index tasks up, its own seed
    index_up = {"remove_index": 3.0, "replace_index": 3.5}
    assert sixth.stages == fifth.stages and sixth.optim == fifth.optim and sixth.run.seed == 4652
    assert sixth.data.task_weights == {**fifth.data.task_weights, **index_up, "self": 12.0}
    assert len(sixth.data.self_rows) == 4 and not set(sixth.data.self_rows) & set(fifth.data.self_rows)
    # the seventh: the sixth's rows with self 16 and reverse 3, half the peak rate, its own seed
    assert seventh.stages == sixth.stages and seventh.data.self_rows == sixth.data.self_rows
    assert seventh.data.task_weights == {**sixth.data.task_weights, "reverse": 3.0, "self": 16.0}
    assert seventh.optim == dataclasses.replace(sixth.optim, lr=sixth.optim.lr / 2) and seventh.run.seed == 4654
    # the eighth, ninth, tenth and twelfth: each the previous stage with two more self-row files and its own seed;
    # self 20, then 28, then the same 28 with three deterministic tasks up, then the same weights
    det_up = {"sort": 10.0, "insert_index": 4.0, "replace_index": 4.5}
    for before, after, up, seed in (
        (seventh, eighth, {"self": 20.0}, 4655),
        (eighth, ninth, {"self": 28.0}, 4658),
        (ninth, tenth, det_up, 4660),
        (eleventh, twelfth, {}, 4665),
    ):
        assert after.stages == before.stages and after.optim == before.optim and after.run.seed == seed
        assert after.data.task_weights == {**before.data.task_weights, **up} and after.total_steps == 2400
        assert (
            after.data.self_rows[:-2] == before.data.self_rows
            and len(set(after.data.self_rows)) == len(before.data.self_rows) + 2
        )
    # the eleventh: the tenth with list lengths drawn uniformly (the one change) and its own seed
    assert eleventh.stages == tenth.stages and eleventh.optim == tenth.optim and eleventh.run.seed == 4663
    assert eleventh.data == dataclasses.replace(tenth.data, uniform_lengths=True) and not tenth.data.uniform_lengths
    # the twelfth (in the loop above): the eleventh with two more of demo-llada's self-row files and nothing else; the
    # thirteenth: the twelfth with two files of the twelfth stage's own answers, self 28 -> 36 and half the rate
    assert twelfth.data == dataclasses.replace(eleventh.data, self_rows=twelfth.data.self_rows)
    assert thirteenth.stages == twelfth.stages
    own = ("runs/self/traj-l2-shuffle/train.jsonl", "runs/self/traj-l2-random/train.jsonl")
    assert thirteenth.data.self_rows == (*twelfth.data.self_rows, *own) and thirteenth.run.seed == 4670
    assert thirteenth.data.task_weights == {**twelfth.data.task_weights, "self": 36.0}
    assert thirteenth.optim == dataclasses.replace(twelfth.optim, lr=twelfth.optim.lr / 2)
    assert thirteenth.total_steps == 2400
    # the fourteenth: the thirteenth with its self rows replaced by the thirteenth stage's own verified shuffle
    # answers and its decode-order rows (every open slot of the block scored), self 36 -> 54, the same rate, own seed
    rows = {n: f"runs/self/{n}/train.jsonl" for n in ("traj-l3-shuffle", "states-1", "states-2", "states-3")}
    listed = (*[rows["traj-l3-shuffle"]] * 4, *[rows["states-1"]] * 2, rows["states-2"], rows["states-3"])
    assert fourteenth.stages == thirteenth.stages and fourteenth.optim == thirteenth.optim
    weights = {**thirteenth.data.task_weights, "self": 54.0}
    assert fourteenth.data == dataclasses.replace(thirteenth.data, self_rows=listed, task_weights=weights)
    assert fourteenth.data.state_scoring == "block" and fourteenth.run.seed == 4730 and fourteenth.total_steps == 2400
    # the fifteenth: the fourteenth with shuffle trained on one fixed order (rotate), its files without the verified
    # shuffle answers (all of them shuffle rows, which the fixed order skips: the same rows), shuffle 3 -> 18 and
    # self 54 -> 36, half the steps (the same rate and decay), its own seed
    assert fifteenth.data == dataclasses.replace(
        fourteenth.data,
        self_rows=listed[4:],
        task_weights={**fourteenth.data.task_weights, "shuffle": 18.0, "self": 36.0},
        shuffle_answer="rotate",
    )
    (stage,) = fifteenth.stages
    assert stage == dataclasses.replace(fourteenth.stages[0], steps=1200) and fifteenth.optim == fourteenth.optim
    assert fifteenth.run.seed == 4751 and fourteenth.data.shuffle_answer == "random"
    # the final: the fifteenth with the threshold decoder's own states (two files, listed twice), self 36 -> 72,
    # 800 steps at the same rate with a 400-step decay, its own seed
    thr = tuple(f"runs/self/thr-{k}/train.jsonl" for k in (1, 2))
    assert final.data == dataclasses.replace(
        fifteenth.data,
        self_rows=(*fifteenth.data.self_rows, *thr, *thr),
        task_weights={**fifteenth.data.task_weights, "self": 72.0},
    )
    assert final.stages == (dataclasses.replace(stage, steps=800),) and final.run.seed == 4761
    assert final.optim == dataclasses.replace(fifteenth.optim, decay_steps=400)
    # the card links every earlier stage's config, in the order they ran, and not the final one
    stages = sorted((p.name for p in configs.glob("demo-llada2-stage*.yaml")), key=lambda n: int(n[17:-5]))
    assert cd.EARLIER_STAGES == tuple(stages) and len(stages) == 15


def test_config_files_overrides_and_bad_configs_name_the_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {tokenizer: t, family: dream}\nstages:\n  - {kind: short, steps: 4}\nrun: {seed: 3}\n")
    cfg = cf.load_config(path, ["run.seed=7", "optim.lr=2e-4", "data.task_weights={sort: 2}"])
    assert cfg.model.family == "dream" and cfg.model.kv_heads == 2 and cfg.run.seed == 7 and cfg.optim.lr == 2e-4
    assert cfg.data.task_weights == {"sort": 2.0} and cfg.run.threads == cf.RunConfig().threads  # one default
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.run.seed = 1  # type: ignore[misc]
    bad = {
        "run: {seed: [1]}\n": "run.seed: expected a number",
        "model: {tokenizer: t}\nsurprise: 1\n": "unknown key(s) ['surprise']",
        "model: {tokenizer: t, family: gpt}\n": "model.family: 'gpt'; choose one of llada, dream, llada2",
        "model: {tokenizer: t, family: llada2}\n": "family llada2 trains block-causally",
        "model: {tokenizer: t, family: llada2, attention: block_causal, block_length: 8, n_group: 3}\n": "n_group 3",
        "model: {tokenizer: t, upcycle: x}\n": "model.upcycle builds a llada2 model",
        "model: {tokenizer: t, grow_after: [1]}\n": "model.grow_after deepens the model of model.init",
        "model: {tokenizer: t, attention: block_causal}\n": "block_causal needs family llada2",
        "model: {tokenizer: t, block_length: 32}\n": "block_length is for block_causal attention",
        "model: {d_model: 64}\n": "model.tokenizer: a fresh model",
        "model: [1, 2]\n": "model: expected a mapping",
        "- 1\n": "expected a mapping of sections",
        "model: {tokenizer: t\n": "not valid YAML",
        "model: {tokenizer: t}\noptim: {train_only: []}\n": "optim.train_only: give at least one",
        "model: {tokenizer: t}\ndata: {state_scoring: last}\n": "data.state_scoring: 'last'; choose one of block, next",
        "model: {tokenizer: t}\ndata: {shuffle_answer: sorted}\n": "shuffle_answer: 'sorted'; choose one of random",
        "model: {tokenizer: t}\nstages: {kind: short}\n": "stages: give a non-empty list",
    }
    for text, message in bad.items():
        path.write_text(text)
        with pytest.raises(ValueError, match=re.escape(message)):
            cf.load_config(path)
    path.write_text("model: {tokenizer: t}\n")
    for item, message in (
        ("seed=1", "expected SECTION.KEY=VALUE"),
        ("stages.x=1", "section model, data"),
        ("run.x=1", "run: unknown key(s) ['x']"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            cf.load_config(path, [item])
    with pytest.raises(ValueError, match="--config: .*none.yaml is not a file"):
        cf.load_config(tmp_path / "none.yaml")


def test_train_stops_on_a_bad_input_before_loading_anything(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("loaded before the input error")

    monkeypatch.setattr(tr, "setup", boom)
    path = tmp_path / "c.yaml"
    path.write_text("model: {tokenizer: " + str(tmp_path) + "}\n")
    monkeypatch.delenv("DLM_PARALLELBENCH_DATA", raising=False)
    with pytest.raises(ValueError, match=r"no ParallelBench data: pass --data DIR .* or set \$DLM_PARALLELBENCH_DATA"):
        tr.main(["--config", str(path)])
    with pytest.raises(ValueError, match="--data: ParallelBench data directory .* not found"):
        tr.main(["--config", str(path), "--data", str(tmp_path / "nope")])
    with pytest.raises(ValueError, match="has no waiting_line/task_config.yaml"):
        tr.main(["--config", str(path), "--data", str(tmp_path)])
    (tmp_path / "pb" / "waiting_line").mkdir(parents=True)
    (tmp_path / "pb" / "puzzle").mkdir()
    for g in ("waiting_line", "puzzle"):
        (tmp_path / "pb" / g / "task_config.yaml").write_text("{}")
    with pytest.raises(ValueError, match="holds no tokenizer.json"):
        tr.main(["--config", str(path), "--data", str(tmp_path / "pb")])


# ------------------------------------------------------------------------------------------ llada2 (block-causal)

DEMO_LLADA = Path(dlm_decode.__file__).parent / "demo_models" / "demo-llada"
LLADA2 = dict(family="llada2", attention="block_causal", block_length=8)


def test_fresh_llada2_is_a_block_causal_moe(tok):
    torch.manual_seed(0)
    size = cf.ModelConfig(d_model=32, n_layers=3, n_heads=2, mlp_hidden=64, moe_hidden=16, **LLADA2)
    model = md.make_model(size, tok)
    assert type(model).__name__ == "LLaDA2MoeModelLM" and model.block_causal and model.logit_shift == 0
    layers = model.model.layers
    assert not hasattr(layers[0].mlp, "experts")  # first_dense: 1
    assert all(len(layer.mlp.experts) == 4 and layer.mlp.shared_experts is not None for layer in layers[1:])
    assert model.mask_token_id == tok.mask_token_id and model.config.num_experts_per_tok == 2


def _upcycled(**kw):
    m = cf.ModelConfig(upcycle=str(DEMO_LLADA), **LLADA2, **kw)
    return md.initial_model(m, None, say=lambda *_: None)


def test_upcycled_llada2_computes_demo_llada_on_a_bidirectional_mask():
    """Step 0 of the upcycled model is demo-llada's function: equal logits with every key visible (qk_norm off and
    full-head RoPE; the routed experts add zero). With qk_norm on they differ: RMSNorm per head rescales q and k."""
    src, _ = dlm_decode.load_model(DEMO_LLADA, dtype=torch.float32, tokenizer=False)
    ids = torch.randint(3, src.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    want = src(ids).logits
    model = _upcycled(qk_norm=False, partial_rotary=1.0)
    torch.testing.assert_close(model(ids).logits, want, rtol=1e-5, atol=1e-4)
    moe = model.model.layers[1].mlp
    assert all(float(e.down_proj.weight.abs().sum()) == 0 for e in moe.experts)
    assert not torch.equal(moe.experts[0].gate_proj.weight, moe.experts[1].gate_proj.weight)  # distinct slices
    assert (model(ids, block_length=8).logits - want).abs().max() > 1e-2  # the block-causal mask changes them
    assert (_upcycled(qk_norm=True, partial_rotary=1.0)(ids).logits - want).abs().max() > 1e-2


@pytest.mark.parametrize(
    "family, name, after",
    [("llada", "demo-llada", (0, 3)), ("dream", "demo-dream", (2,)), ("llada2", "demo-llada2", (1, 3))],
)
def test_grown_model_computes_its_init_and_its_new_layers_train(family, name, after):
    """model.grow_after (LLaMA Pro block expansion): each listed layer gets a copy right after it whose residual
    outputs are zero, so at step 0 the deeper model gives the init model's logits; one backward reaches the new
    layers' output projections (and so, from the next step, the rest of them)."""
    init = DEMO_LLADA.parent / name
    attn = dict(attention="block_causal", block_length=32) if family == "llada2" else {}
    m = cf.ModelConfig(family=family, init=str(init), grow_after=after, **attn)
    src, _ = dlm_decode.load_model(init, dtype=torch.float32, tokenizer=False)
    model = md.initial_model(m, None, say=lambda *_: None)
    n = len(list(src.parameters()))
    count = "n_layers" if family == "llada" else "num_hidden_layers"
    assert getattr(model.config, count) == getattr(src.config, count) + len(after)
    ids = torch.randint(3, 1300, (2, 40), generator=torch.Generator().manual_seed(1))
    want = src(ids).logits.detach()
    torch.testing.assert_close(model(ids).logits.detach(), want, rtol=1e-4, atol=1e-4)
    assert len(list(model.parameters())) > n and float(want.abs().max()) > 1
    model.train()
    model(ids).logits.logsumexp(-1).mean().backward()
    new = {k: p for k, p in model.named_parameters() if re.search(rf"\b(?:blocks|layers)\.{after[0] + 1}\.", k)}
    outs = [p for k, p in new.items() if md.RESIDUAL_OUT.search(k)]
    assert outs and all(float(p.abs().sum()) == 0 and float(p.grad.abs().sum()) > 0 for p in outs)
    if family == "llada2":
        with pytest.raises(ValueError, match=r"grow_after: \[0\].*MoE layers"):
            md.initial_model(dataclasses.replace(m, grow_after=(0,)), None, say=lambda *_: None)
    with pytest.raises(ValueError, match=r"grow_after: \[9\]"):
        md.initial_model(dataclasses.replace(m, grow_after=(9,)), None, say=lambda *_: None)


def test_block_causal_loss_uses_the_decoding_mask(tok, rows):
    """diffusion_loss with block_length == the loss from the official forward under an explicit 4D mask: a query
    sees the valid keys of its own block and of earlier blocks, on the grid of positions from each row's first real
    token (left padding shifts slots, not positions); the mask is not a bidirectional one."""
    torch.manual_seed(0)
    size = cf.ModelConfig(d_model=32, n_layers=2, n_heads=2, mlp_hidden=64, moe_hidden=16, **LLADA2)
    model = md.make_model(size, tok)
    batch = ob.collate(rows[:2] + [(rows[2][0][:-5], rows[2][1])], tok.pad_token_id)  # rows of unequal lengths
    loss, _ = ob.diffusion_loss(model, batch, torch.Generator().manual_seed(3), block_length=8)
    noisy, masked, p_mask = ob.mask_response(batch, tok.mask_token_id, torch.Generator().manual_seed(3))
    valid = batch["valid"]
    pos = (valid.long().cumsum(1) - 1).clamp(min=0)
    blk = pos // 8
    mask4d = (valid[:, None, :] & (blk[:, None, :] <= blk[:, :, None]))[:, None]  # [B, 1, T, T]
    mask4d |= torch.eye(valid.shape[1], dtype=torch.bool)  # padding queries see themselves (never scored)
    logits = model(noisy, attention_mask=mask4d, position_ids=pos).logits
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch["input_ids"], reduction="none")
    want = ((ce * masked) / (p_mask[:, None] * 24)).sum() / 3
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    bidirectional, _ = ob.diffusion_loss(model, batch, torch.Generator().manual_seed(3))
    assert abs(float(bidirectional - loss)) > 1e-4


def test_clean_context_rows_score_one_block_in_the_state_it_is_decoded_in(tok, rows):
    """Every row clean-context (share 1): the loss equals the official forward's on the decode-time canvas of each
    row's drawn block (the response before it true, the block masked by the row's draw, everything after it MASK)
    under the block-causal mask, scoring the block's masked slots weighted by 1 / (p_mask * its length). The drawn
    blocks include later ones (whose context the row makes clean), and the loss differs from the whole-response one."""
    torch.manual_seed(0)
    size = cf.ModelConfig(d_model=32, n_layers=2, n_heads=2, mlp_hidden=64, moe_hidden=16, **LLADA2)
    model = md.make_model(size, tok)
    batch = ob.collate(rows[:3] + [(rows[3][0][:-5], rows[3][1])], tok.pad_token_id)  # rows of unequal lengths
    loss, _ = ob.diffusion_loss(model, batch, torch.Generator().manual_seed(5), block_length=8, clean_context=1.0)
    g = torch.Generator().manual_seed(5)
    noisy, masked, p_mask = ob.mask_response(batch, tok.mask_token_id, g)
    torch.rand(4, generator=g)  # the pick draw (share 1 picks every row)
    where = torch.rand(4, generator=g)
    valid, resp, ids = batch["valid"], batch["response"], batch["input_ids"]
    pos = (valid.long().cumsum(1) - 1).clamp(min=0)
    blk = pos // 8
    canvas, scored, chosen = ids.clone(), torch.zeros_like(masked), []
    for i in range(4):
        blocks = sorted({int(b) for b in blk[i][resp[i]]})
        c = blocks[int(float(where[i]) * len(blocks))]
        chosen.append(c > blocks[0])
        in_block = resp[i] & (blk[i] == c)
        canvas[i] = torch.where(in_block, noisy[i], ids[i]).masked_fill(resp[i] & (blk[i] > c), tok.mask_token_id)
        scored[i] = masked[i] & in_block
        p_mask[i] = p_mask[i] * in_block.sum()
    assert any(chosen) and int(scored.sum()) > 0
    mask4d = (valid[:, None, :] & (blk[:, None, :] <= blk[:, :, None]))[:, None]  # [B, 1, T, T]
    mask4d |= torch.eye(valid.shape[1], dtype=torch.bool)
    logits = model(canvas, attention_mask=mask4d, position_ids=pos).logits
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids, reduction="none")
    want = ((ce * scored) / p_mask[:, None]).sum() / 4
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    whole, _ = ob.diffusion_loss(model, batch, torch.Generator().manual_seed(5), block_length=8)
    assert abs(float(whole - loss)) > 1e-4
    with pytest.raises(ValueError, match=r"clean_context must be in \[0, 1\]"):
        _stage(clean_context=1.5)
    raw = {"model": {"tokenizer": "t"}, "stages": [{"kind": "full", "steps": 3, "clean_context": 0.5}]}
    with pytest.raises(ValueError, match=r"stages\[0\].clean_context: rows for block-causal models"):
        cf.config_from_dict(raw)
    with pytest.raises(ValueError, match="need a block-causal model"):
        ob.diffusion_loss(model, batch, torch.Generator().manual_seed(5), clean_context=0.5)


def test_noisy_prefix_rows_keep_the_previous_block_partly_masked():
    """noisy_prefix share 1 on clean-context rows: the block before each row's scored block is masked at a rate
    under the row's own (u * p_mask), never outside that block (earlier slots true text, later ones as before),
    the scored slots and lengths are those of the clean-context rows, and share 0 leaves the canvas unchanged."""
    b, t, mask_id = 64, 40, 99
    ids = torch.arange(b * t).view(b, t) % 50
    resp = torch.zeros(b, t, dtype=torch.bool)
    resp[:, 8:] = True
    batch = {"input_ids": ids, "response": resp, "response_length": resp.sum(1).float()}
    g = torch.Generator().manual_seed(1)
    p_mask = torch.full((b,), 0.9)
    masked = resp & (torch.rand(b, t, generator=g) < 0.9)
    noisy = torch.where(masked, mask_id, ids)
    grid = torch.arange(t).expand(b, t) // 8
    plain = ob.clean_context_rows(batch, noisy, masked, grid, 1.0, torch.Generator().manual_seed(2))
    off = ob.clean_context_rows(batch, noisy, masked, grid, 1.0, torch.Generator().manual_seed(2), (0.0, p_mask, 99))
    assert all(torch.equal(x, y) for x, y in zip(plain, off, strict=True))
    out = ob.clean_context_rows(batch, noisy, masked, grid, 1.0, torch.Generator().manual_seed(2), (1.0, p_mask, 99))
    assert torch.equal(out[1], plain[1]) and torch.equal(out[2], plain[2])  # the same scored slots and lengths
    changed = out[0] != plain[0]
    assert bool((out[0][changed] == mask_id).all())  # only masks added
    scored_block = torch.where(plain[1], grid, 10**6).amin(1)  # [B] each row's scored block (rows with a mask)
    has = scored_block < 10**6
    prev = grid == (scored_block - 1)[:, None]
    assert not bool((changed & ~prev).any())  # nothing outside the block before the scored one
    share = (changed & prev).sum() / (prev & has[:, None] & (grid >= 1)).sum()
    assert 0.2 < float(share) < 0.7  # about E[u] * 0.9 = 0.45 of that block's slots
    raw = {
        "model": {"tokenizer": "t", "family": "llada2", "attention": "block_causal", "block_length": 8},
        "stages": [{"kind": "full", "steps": 3, "noisy_prefix": 0.5}],
    }
    with pytest.raises(ValueError, match=r"stages\[0\].noisy_prefix: a share of the clean-context rows"):
        cf.config_from_dict(raw)


def test_whole_name_rows_mask_a_person_whole_and_score_the_usual_loss(tok, rows):
    """whole_names share 1: every last-name slot of the response is masked exactly when the first name before it is
    (so whole people are masked and, at a low rate, one person among visible ones), nothing else moves, and the
    loss is the ordinary one on that canvas; share 0 draws and scores exactly as before. The joined ids are the
    last names' tokens and no first name's."""
    joins = ob.name_tail_ids(tok, NAMES)
    last = {i for n in NAMES[1] for i in tok(f" {n}", add_special_tokens=False)["input_ids"]}
    first = {i for n in NAMES[0] for i in tok(f'"{n}', add_special_tokens=False)["input_ids"][1:]}
    assert set(joins.nonzero().flatten().tolist()) == last and not first & last
    batch = ob.collate(rows[:4], tok.pad_token_id)
    ids, resp = batch["input_ids"], batch["response"]
    _, masked, p_mask = ob.mask_response(batch, tok.mask_token_id, torch.Generator().manual_seed(7))
    whole = ob.whole_name_masks(batch, masked, joins, 1.0, torch.Generator().manual_seed(1))
    tail = joins[ids] & resp
    assert int(tail.sum()) >= 12 and torch.equal(whole[tail], masked.roll(1, 1)[tail])
    assert torch.equal(whole[~tail], masked[~tail]) and not torch.equal(whole, masked)
    assert torch.equal(ob.whole_name_masks(batch, masked, joins, 0.0, torch.Generator().manual_seed(1)), masked)
    torch.manual_seed(0)
    size = cf.ModelConfig(d_model=32, n_layers=2, n_heads=2, mlp_hidden=64, moe_hidden=16, **LLADA2)
    model = md.make_model(size, tok)
    loss, _ = ob.diffusion_loss(
        model, batch, torch.Generator().manual_seed(7), block_length=8, whole_names=(1.0, joins)
    )
    canvas = torch.where(whole, tok.mask_token_id, ids)
    pos = (batch["valid"].long().cumsum(1) - 1).clamp(min=0)
    logits = model.output_logits(model.hidden_states(canvas, pos, key_mask=batch["valid"], block_length=8))
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids, reduction="none")
    want = ((ce * whole) / (p_mask[:, None] * batch["response_length"][:, None])).sum() / 4
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    plain, _ = ob.diffusion_loss(model, batch, torch.Generator().manual_seed(7), block_length=8)
    none, _ = ob.diffusion_loss(
        model, batch, torch.Generator().manual_seed(7), block_length=8, whole_names=(0.0, joins)
    )
    assert float(plain.detach()) == float(none.detach()) and abs(float((plain - loss).detach())) > 1e-4
    with pytest.raises(ValueError, match=r"whole_names must be in \[0, 1\]"):
        _stage(whole_names=1.5)


def test_decode_order_rows_train_in_their_state_and_leave_other_rows_alone(tok, rows):
    """A decode-order row is scored in its own state: its masked slots are masks, the rest its text, and its loss is
    the mean CE of the official forward over its scored slots. The other rows of the batch draw and score exactly
    what they draw without it (the state is applied after every draw)."""
    torch.manual_seed(0)
    size = cf.ModelConfig(d_model=32, n_layers=2, n_heads=2, mlp_hidden=64, moe_hidden=16, **LLADA2)
    model = md.make_model(size, tok)
    (p0, r0, *_), (p1, r1, *_) = rows[:2]
    masked, scored = (1, 2, 4, 5, len(r1) - 1), (1, 2, 4)
    plain = ob.collate([(p0, r0), (p1, r1)], tok.pad_token_id)
    mixed = ob.collate([(p0, r0), (p1, r1, (masked, scored))], tok.pad_token_id)
    assert "state" not in plain and mixed["state"].tolist() == [False, True]
    start = mixed["input_ids"].shape[1] - len(r1)
    assert mixed["state_scored"][1].nonzero().flatten().tolist() == [start + j for j in scored]
    out_plain = ob.masked_logits(model, plain, torch.Generator().manual_seed(3), block_length=8, clean_context=0.5)
    out_mixed = ob.masked_logits(model, mixed, torch.Generator().manual_seed(3), block_length=8, clean_context=0.5)
    keep_plain, keep_mixed = out_plain[2] == 0, out_mixed[2] == 0
    # the same draw and targets, bit for bit; the logits up to float rounding (a batch's other row changes how this
    # CPU's kernels block the sums: 6e-8 seen on one machine, 0 on another)
    torch.testing.assert_close(out_mixed[0][keep_mixed], out_plain[0][keep_plain], rtol=1e-5, atol=1e-6)
    assert torch.equal(out_mixed[1][keep_mixed], out_plain[1][keep_plain]) and int(keep_mixed.sum()) > 0
    ids, valid = mixed["input_ids"], mixed["valid"]
    canvas = torch.where(mixed["state_masked"], tok.mask_token_id, ids)
    pos = (valid.long().cumsum(1) - 1).clamp(min=0)
    logits = model.output_logits(model.hidden_states(canvas, pos, key_mask=valid, block_length=8))[1]
    ce = torch.nn.functional.cross_entropy(logits[[start + j for j in scored]], ids[1, [start + j for j in scored]])
    rows_plain = out_plain[2]
    ce0 = torch.nn.functional.cross_entropy(out_plain[0], out_plain[1], reduction="none")[rows_plain == 0]
    first = (ce0 / (out_plain[3][0] * out_plain[4][0])).sum()
    loss, _ = ob.diffusion_loss(model, mixed, torch.Generator().manual_seed(3), block_length=8, clean_context=0.5)
    torch.testing.assert_close(loss, (first + ce) / 2, rtol=1e-5, atol=1e-6)
    assert float(ce.detach()) > 0.1  # an untrained model: a real loss, not zeros
    with pytest.raises(ValueError, match="stale rows"):
        ob.diffusion_loss(model, mixed, torch.Generator().manual_seed(3), stale=(0.5, 8))


def test_decode_order_self_rows_are_checked_and_kept_with_their_state(tmp_path):
    good = {"task": "waiting_line/copy", "prompt_ids": [5, 6], "response_ids": [7, 8, 9], "score": 1.0}
    path = tmp_path / "train.jsonl"
    cases = [({"masked": [0, 2], "scored": [2]}, None), ({"masked": [0], "scored": []}, "non-empty subset"),
             ({"masked": [0], "scored": [1]}, "non-empty subset"), ({"masked": [0, 3], "scored": [0]}, "0-2"),
             ({"masked": [0]}, "masked and scored")]  # fmt: skip
    for extra, error in cases:
        path.write_text(json.dumps({**good, **extra}) + "\n" + json.dumps(good) + "\n")
        load = lambda: sr.load_self_rows([path], vocab_size=20, canvas={"waiting_line/copy": 3}, excluded_prompts=set())  # noqa: E731
        if error:
            with pytest.raises(ValueError, match=error):
                load()
        else:
            got, _ = load()
            row = ([5, 6], [7, 8, 9], "waiting_line/copy")
            assert got == [(*row, ((0, 2), (2,))), row]


def test_state_scoring_next_scores_the_slots_the_decoder_committed(tmp_path):
    """data.state_scoring next: a decode-order row keeps its masked slots but is scored on its next list (checked
    as scored is); a file without next lists is refused with what to do (an unknown choice: the bad-config test)."""
    good = {"task": "waiting_line/copy", "prompt_ids": [5, 6], "response_ids": [7, 8, 9, 4], "score": 1.0}
    path = tmp_path / "train.jsonl"
    kw = {"vocab_size": 20, "canvas": {"waiting_line/copy": 4}, "excluded_prompts": set()}
    row = ([5, 6], [7, 8, 9, 4], "waiting_line/copy")
    path.write_text(json.dumps({**good, "masked": [1, 2, 3], "scored": [1, 2], "next": [2]}) + "\n")
    assert sr.load_self_rows([path], **kw)[0] == [(*row, ((1, 2, 3), (1, 2)))]
    assert sr.load_self_rows([path], state_scoring="next", **kw)[0] == [(*row, ((1, 2, 3), (2,)))]
    with pytest.raises(ValueError, match="state_scoring 'last'; choose one of block, next"):
        sr.load_self_rows([path], state_scoring="last", **kw)  # a direct caller's typo is not read as block
    bad = (({"next": [0]}, "non-empty subset"), ({"next": []}, "non-empty subset"), ({}, "write it again"))
    for extra, error in bad:
        path.write_text(json.dumps({**good, "masked": [1, 2, 3], "scored": [1, 2], **extra}) + "\n")
        with pytest.raises(ValueError, match=error):
            sr.load_self_rows([path], state_scoring="next", **kw)


def test_a_fixed_shuffle_answer_trains_one_valid_order_and_leaves_every_other_row_as_it_was(mini_pb, tok):
    """data.shuffle_answer: shuffle's rows (short and full, the prompt unchanged) take the rule's one order of their
    list, a valid answer by the benchmark's own metric; every other row of the step is byte-identical to the random
    draw's, so the option changes shuffle's targets and nothing else."""
    from dlm_decode.parallelbench.metrics import list_shuffle_score

    stream = st.RowStream(mini_pb, tok, seed=0)
    people = ["Ann Lee", "Bo Kim", "Cy Fox", "Di Ray"]
    sample = {"answer": {"input": people}}
    assert st.fixed_shuffle(sample, "swap_first") == list_to_str(["Bo Kim", "Ann Lee", "Cy Fox", "Di Ray"])
    assert st.fixed_shuffle(sample, "rotate") == list_to_str(["Bo Kim", "Cy Fox", "Di Ray", "Ann Lee"])
    for rule in st.SHUFFLE_RULES:
        assert list_shuffle_score(st.fixed_shuffle(sample, rule), sample["answer"]) == 1.0
    assert st.fixed_shuffle(sample, "reverse") == list_to_str(people[::-1])
    for rule, same in (("rotate", ["Ann Lee", "Ann Lee"]), ("reverse", ["Ann Lee", "Bo Kim", "Ann Lee"]),
                       ("swap_first", ["Ann Lee"])):  # fmt: skip
        with pytest.raises(ValueError, match="in its order, which is not a shuffle"):
            st.fixed_shuffle({"answer": {"input": same}}, rule)
    with pytest.raises(ValueError, match="choose one of random, swap_first, rotate, reverse"):
        st.fixed_shuffle(sample, "sort")
    tasks = ("waiting_line/shuffle", "waiting_line/copy", "waiting_line/insert_random")
    base = st.Mix(batch=24, short_share=0.5, tasks=tasks)
    drawn = stream.rows(3, base)
    n_shuffle = 0
    for rule in st.SHUFFLE_RULES:
        fixed = stream.rows(3, dataclasses.replace(base, shuffle_answer=rule))
        assert [(p, t) for p, _, t in fixed] == [(p, t) for p, _, t in drawn]  # the same prompts, in the same order
        for (prompt, resp, task), (_, resp0, _) in zip(fixed, drawn, strict=True):
            if not task.endswith("/shuffle"):
                assert resp == resp0
                continue
            n_shuffle += 1
            listed = re.findall(r"\[[^\[\]]*\]", tok.decode(prompt))[-1]  # the list to shuffle, last in the prompt
            want = st.fixed_shuffle({"answer": {"input": json.loads(listed)}}, rule)
            assert tok.decode(resp).startswith(want + "<|eot_id|>"), (rule, tok.decode(resp))
    assert n_shuffle >= 4  # shuffle rows were in the step (short and full), so the checks above ran on some
    assert stream.rows(3, base) == drawn  # the option left the random draw itself alone
    assert st.fixed_answer_tasks("rotate") == ("waiting_line/shuffle",) and st.fixed_answer_tasks("random") == ()
    cfg = cf.config_from_dict({"model": {"tokenizer": "t"}, "data": {"shuffle_answer": "rotate"}})
    assert tr.mix_for(cfg, _stage()).shuffle_answer == "rotate"  # the config's choice reaches the stream's mix


def test_a_fixed_shuffle_answer_drops_the_self_rows_other_orders(tmp_path):
    """The self rows' shuffle answers are other valid orders than the rule's, so a fixed-answer run skips them (and
    counts them), except rows written for that rule (``answer_rule``); a file of shuffle rows alone leaves no row,
    which stops the run with the file named."""
    path = tmp_path / "train.jsonl"
    kw = {"vocab_size": 20, "canvas": {"waiting_line/copy": 2, "waiting_line/shuffle": 2}, "excluded_prompts": set()}
    rows = [{"task": t, "prompt_ids": [5, i], "response_ids": [7, 8], "score": 1.0} for i, t in
            enumerate(["waiting_line/shuffle", "waiting_line/copy", "waiting_line/shuffle"])]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got, meta = sr.load_self_rows([path], shuffle_answer="rotate", **kw)
    assert got == [([5, 1], [7, 8], "waiting_line/copy")] and meta["skipped_tasks"] == 2
    got, meta = sr.load_self_rows([path], **kw)
    assert len(got) == 3 and "skipped_tasks" not in meta
    rows[2]["answer_rule"] = "rotate"  # trajectories.py --shuffle-answer rotate: the row targets the rule's order
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got, meta = sr.load_self_rows([path], shuffle_answer="rotate", **kw)
    assert [g[0] for g in got] == [[5, 1], [5, 2]] and meta["skipped_tasks"] == 1
    got, meta = sr.load_self_rows([path], shuffle_answer="swap_first", **kw)
    assert [g[0] for g in got] == [[5, 1]] and meta["skipped_tasks"] == 2  # another rule's order is still skipped
    path.write_text(json.dumps(rows[0]) + "\n")
    with pytest.raises(ValueError, match="no usable row in .*train.jsonl"):
        sr.load_self_rows([path], shuffle_answer="rotate", **kw)


def test_whole_names_and_grow_after_run_through_the_trainer(tok, tmp_path, mini_pb):
    """The two options reach a real run: a stage of whole-name rows trains (its joined ids from the stream's names),
    and a run grown from that export exports one layer more."""
    run = {"save_every": 2, "eval_every": 0, "export_every": 0}
    data = {"short_batch": 4, "full_batch": 4}
    first = _config(tmp_path, tok, [{"kind": "full", "steps": 2, "share": 0.5, "whole_names": 1.0}], data=data, run=run)
    _train(first, mini_pb, tmp_path / "a")
    init = {"init": str(tmp_path / "a" / "export"), "grow_after": [0]}
    second = _config(tmp_path, tok, [{"kind": "full", "steps": 1}], model=init, data=data, run=run)
    _train(second, mini_pb, tmp_path / "b")
    assert json.loads((tmp_path / "a" / "export" / "config.json").read_text())["n_layers"] == 1
    assert json.loads((tmp_path / "b" / "export" / "config.json").read_text())["n_layers"] == 2


def test_block_causal_hidden_states_see_earlier_blocks_only(tok):
    torch.manual_seed(0)
    size = cf.ModelConfig(d_model=32, n_layers=2, n_heads=2, mlp_hidden=64, moe_hidden=16, **LLADA2)
    model = md.make_model(size, tok).eval()
    ids = torch.randint(4, len(tok), (1, 24), generator=torch.Generator().manual_seed(2))
    pos = torch.arange(24)[None]
    base = model.hidden_states(ids, pos, block_length=8)
    for changed, same_before in ((20, 16), (9, 8)):  # a token of block 2, of block 1
        other = ids.clone()
        other[0, changed] = (other[0, changed] + 1) % len(tok)
        hid = model.hidden_states(other, pos, block_length=8)
        torch.testing.assert_close(hid[:, :same_before], base[:, :same_before])  # earlier blocks: blind to it
        assert (hid[:, same_before:] - base[:, same_before:]).abs().max() > 1e-4  # its own block sees it


def _runner_json(tasks: list[str]) -> dict:
    rows = [dict(task=t, n=1, score=50.0, score_strict=25.0, nfe=3.0, seconds=0.5) for t in tasks]
    return {"tasks": rows, "decoding": {"sampler": "low_confidence", "block_length": 8, "gen_length": 128}}


def test_shipped_mean_is_of_the_exact_scores_not_the_rounded_ones():
    """Per-task scores are kept to one decimal, but the mean is taken before that rounding: 10.0 and 10.05 average
    10.025, which is 10.0 (the mean of the rounded 10.0 and 10.1 would read 10.1)."""
    from recipes.train_demo import ship as sh

    runner = _runner_json(["waiting_line/copy", "waiting_line/sort"])
    runner["tasks"][0]["score"], runner["tasks"][1]["score"] = 10.0, 10.05
    shipped = sh.shipped_scores(runner, "m")
    assert shipped["scores"] == {"waiting_line/copy": 10.0, "waiting_line/sort": 10.1} and shipped["mean"] == 10.0


def test_ship_notes_replace_or_keep_the_cards_hand_sections(tmp_path):
    """--notes FILE puts that markdown after the generated card (an empty file drops the hand sections); a missing
    file is named; hand_sections finds exactly the sections the generator does not write, in order."""
    from recipes.train_demo import ship as sh

    card = "# m\n\n## Model\n- x\n\n## Parallel decoding (every sample)\n| a |\n\n## Exact cache\nsame\n\n## Zeta\nz\n"
    assert list(cd.hand_sections(card)) == ["Parallel decoding (every sample)", "Zeta"]
    assert cd.hand_sections(card)["Zeta"] == "## Zeta\nz"
    (tmp_path / "README.md").write_text(card)
    notes = tmp_path / "notes.md"
    notes.write_text("## New history\ntext\n")
    assert sh.card_notes(str(notes), tmp_path) == "## New history\ntext\n"
    assert sh.card_notes("keep", tmp_path) == "## Parallel decoding (every sample)\n| a |\n\n## Zeta\nz"
    notes.write_text("")
    assert sh.card_notes(str(notes), tmp_path) == ""
    with pytest.raises(ValueError, match="--notes .*missing.md: no such file"):
        sh.card_notes(str(tmp_path / "missing.md"), tmp_path)
    assert sh.card_notes(None, tmp_path / "no-card-yet") == ""  # a first ship has nothing to keep


def test_ship_checks_the_exact_cache_and_writes_a_demo_directory(tok, tmp_path, mini_pb, capsys):
    """ship.py on a tiny llada2 export: the exact-cache check runs over the twelve tasks (prefix cache = no cache),
    then the weights, tokenizer, generation_config (gen 128 cap, the scores' block), scores and card are written; a
    bidirectional export or a file that is not the runner's JSON is refused with a one-line error before any work."""
    from recipes.train_demo import checkpoint as ck
    from recipes.train_demo import ship as sh

    torch.manual_seed(0)
    size = cf.ModelConfig(d_model=32, n_layers=2, n_heads=2, mlp_hidden=64, moe_hidden=16, **LLADA2)
    ck.export_model(md.make_model(size, tok), tok, tmp_path / "export", {"step": 7, "train_seconds": 3})
    scores = tmp_path / "scores.json"
    scores.write_text("progress line\n" + json.dumps(_runner_json(["waiting_line/copy", "puzzle/sudoku_n4_12"])))
    args = ["--export", str(tmp_path / "export"), "--scores", str(scores), "--data", str(mini_pb), "--limit", "1"]
    sh.main([*args, "--out", str(tmp_path / "ship")])
    out = tmp_path / "ship"
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["gen_length"] == 128 and gen["block_length"] == 8 and gen["eos_token_id"] == tok.eos_token_id
    assert gen["chat"] is True
    # the keys core.generation_config reads, and the ids; no key that nothing reads (sampler, temperature, note)
    assert set(gen) == {"gen_length", "block_length", "steps", "chat", "mask_token_id", "eos_token_id"}
    shipped = json.loads((out / "scores.json").read_text())
    assert shipped["scores"] == {"puzzle/sudoku_n4_12": 50.0, "waiting_line/copy": 50.0} and shipped["mean"] == 50.0
    card = (out / "README.md").read_text()
    assert "| waiting_line/copy | 50.0 | 25.0 | 1 | 95 (missed) |" in card and "llada2_moe" in card
    assert "On 12 official samples" in card  # one sample of each of the twelve tasks, decoded both ways
    assert cd.hand_sections(card) == {}  # card.GENERATED names every section the generator writes
    model, _ = dlm_decode.load_model(out, dtype=torch.float32)
    assert type(model).__name__ == "LLaDA2MoeModelLM"
    hand = "## How it got here\nThree stages.\n\n## Learn2PD filter\nA filter."
    (out / "README.md").write_text(card + "\n" + hand + "\n")
    with pytest.raises(SystemExit) as e:  # a re-ship would drop the hand sections: refused, the card untouched
        sh.main([*args, "--out", str(out)])
    assert e.value.code == 1 and (out / "README.md").read_text() == card + "\n" + hand + "\n"
    assert "(How it got here, Learn2PD filter)" in capsys.readouterr().err
    sh.main([*args, "--out", str(out), "--notes", "keep"])
    kept = (out / "README.md").read_text()
    assert kept.count("## How it got here\nThree stages.") == 1 and kept.rstrip().endswith("A filter.")
    assert kept.index("## Exact cache") < kept.index("## How it got here")  # generated sections, then the notes
    ck.export_model(_tiny(tok, "llada"), tok, tmp_path / "bidir", {"step": 1})
    for bad, message in (
        (["--export", str(tmp_path / "bidir")], "is not block-causal"),
        (["--scores", str(tmp_path / "export" / "config.json")], "not a dlm-decode parallelbench --json output"),
    ):
        argv = [*args, "--out", str(tmp_path / "bad")]
        argv[argv.index(bad[0]) + 1] = bad[1]
        with pytest.raises(SystemExit) as e:
            sh.main(argv)
        assert e.value.code == 1 and not (tmp_path / "bad").exists()
        assert message in capsys.readouterr().err


@pytest.fixture(scope="module", params=["demo-llada", "demo-dream"])
def stale_model(request):
    m, tok = dlm_decode.load_model(request.param)
    return m.eval(), tok


def _stale_canvas(tok):
    """Two left-padded rows: a prompt (the second one shorter) and the same 40-token response."""
    prompt = tok.encode("Sort the list: pear, fig, apple, kiwi, plum, date, lime, yam. Answer:")
    answer = tok.encode(" apple, date, fig, kiwi, lime, pear, plum, yam")
    answer = (answer + [tok.eos_token_id] * 40)[:40]
    batch = ob.collate([(prompt, answer), (prompt[3:], answer)], tok.pad_token_id)
    return batch


def _stale_oracle(m, ids, refresh_ids, positions, valid, start, end, dual):  # one row [1, T] each -> hidden [1, T', d]
    """The refresh forward writes every slot; the next computes [start - shift, end) (dual) or [start - shift, T)."""
    n_layers, n_kv, hd = m.kv_shape()
    store = KVStore(n_layers, 1, n_kv, ids.shape[1], hd, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        m.hidden_states(refresh_ids, positions, kv=KVAccess(store), key_mask=valid)
        stop = end if dual else ids.shape[1]
        part = slice(start - m.logit_shift, stop)
        return m.hidden_states(ids[:, part], positions[:, part], kv=KVAccess(store), slots=part, key_mask=valid), part


@pytest.mark.parametrize("dual", [False, True])
def test_stale_forward_equals_the_cached_forward(stale_model, dual):
    m, tok = stale_model
    batch = _stale_canvas(tok)
    ids, valid, resp = batch["input_ids"], batch["valid"], batch["response"]
    t = ids.shape[1]
    start, end = t - 40 + 32, t  # the response's second block (8 tokens)
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    col = torch.arange(t)[None]
    block = ((col >= start) & (col < end)).expand(2, t)
    noisy = ids.clone()
    noisy[block & (col % 2 == 0)] = m.mask_token_id  # half the block masked
    refresh = resp & (col >= start)
    computed = (col >= start - m.logit_shift) & (col < end)  # Dream's caches compute the slot before the block too
    stale = (~computed & ((col < start - m.logit_shift) | dual)).expand(2, t)  # [2, T]
    rows = torch.tensor([1])
    spec = StaleRows(rows, block[[0]], refresh[[0]], stale[[0]], torch.zeros_like(resp), torch.tensor([8.0]))
    with torch.no_grad():
        got = stale_hidden_states(m, noisy, positions, valid, spec)  # [2, T, d]
        fresh = m.hidden_states(noisy, positions, key_mask=valid)
    refresh_ids = noisy[[1]].masked_fill(refresh[[0]], m.mask_token_id)
    want, part = _stale_oracle(m, noisy[[1]], refresh_ids, positions[[1]], valid[[1]], start, end, dual)
    # the hidden states that score the block (Dream: slot i from hidden i - 1)
    s0, s1 = start - m.logit_shift, end - m.logit_shift
    torch.testing.assert_close(got[1, s0:s1], want[0, s0 - part.start : s1 - part.start], atol=1e-5, rtol=1e-5)
    assert (got[1, start:end] - fresh[1, start:end]).abs().max() > 1e-3  # the stale keys do change the block
    torch.testing.assert_close(got[0], fresh[0])  # a fresh row is untouched
    assert "layer_pieces" not in m.__dict__  # the eager pieces are back


def test_share_zero_draws_the_old_masks_and_share_one_scores_only_blocks(stale_model):
    m, tok = stale_model
    batch = _stale_canvas(tok)
    old = ob.masked_logits(m, batch, ob.step_generator(3, 5))
    zero = ob.masked_logits(m, batch, ob.step_generator(3, 5), stale=(0.0, 32))
    for a, b in zip(old, zero, strict=True):
        torch.testing.assert_close(a, b)
    spec = draw_stale_rows(batch["response"], 1.0, 32, ob.step_generator(3, 9))
    assert spec is not None and spec.rows.tolist() == [0, 1]
    for i in range(2):  # a block is one of the response's two blocks (32 + 8 tokens), the refresh covers it onward
        n = int(spec.block[i].sum())
        assert n in (32, 8) and spec.block_length[i] == n
        first = int(spec.block[i].nonzero()[0])
        assert spec.refresh[i].nonzero()[0] == first and not spec.stale[i][spec.block[i]].any()
    _, _, rows, _, length = ob.masked_logits(m, batch, ob.step_generator(3, 9), stale=(1.0, 32))
    assert set(length.tolist()) <= {32.0, 8.0} and rows.numel() <= 40


def test_stale_options_are_checked_before_work(tmp_path):
    base = {"model": {"init": "x"}, "stages": [{"kind": "full", "steps": 5, "stale": 0.5}]}
    assert cf.config_from_dict(base).stages[0].stale == 0.5
    with pytest.raises(ValueError, match=r"stages\[0\]\.stale must be in \[0, 1\]"):
        cf.config_from_dict({**base, "stages": [{"kind": "full", "steps": 5, "stale": 1.5}]})
    with pytest.raises(ValueError, match=r"stages\[0\]\.stale_block must be >= 1"):
        cf.config_from_dict({**base, "stages": [{"kind": "full", "steps": 5, "stale_block": 0}]})
    llada2 = {"model": {"family": "llada2", "attention": "block_causal", "block_length": 32, "init": "x"}}
    with pytest.raises(ValueError, match="cache is exact"):
        cf.config_from_dict({**llada2, "stages": base["stages"]})


@pytest.mark.parametrize("name, family, seed", [("demo-llada-stale", "llada", 49), ("demo-dream-stale", "dream", 51)])
def test_the_stale_experiment_configs_load_as_they_were_run(name, family, seed):
    path = ROOT / "recipes" / "train_demo" / "configs" / f"{name}.yaml"
    cfg = cf.load_config(path, ["model.init=x"])
    (stage,) = cfg.stages
    assert (stage.stale, stage.stale_block, stage.steps) == (0.5, 32, 1200)
    assert (cfg.model.family, cfg.data.full_batch, cfg.optim.lr, cfg.optim.decay_steps) == (family, 32, 1e-4, 300)
    assert cfg.run.seed == seed
