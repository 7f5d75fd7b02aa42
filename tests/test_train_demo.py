"""Tests of the demo-model training recipe (recipes/train_demo) and of the shipped demo checkpoints.

Tokenizer round trip and chat template; the LLaDA SFT masking objective (prompt never masked, 1/p weighting,
Dream's shift); a few steps on a tiny model lower the loss; an interrupted run resumed from its atomic checkpoint
ends bit-identical to an uninterrupted one; the shipped demo models load through ``AutoModel`` and decode.
All on CPU, tiny models, no downloads.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import torch

import dlm_decode
from dlm_decode.parallelbench.generator import generate_task, list_to_str
from dlm_decode.parallelbench.tasks import build_messages

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "train_demo"
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


def _load(name: str):
    """Import a recipe script under a unique module name (``evaluate`` would shadow the HF package)."""
    key = f"train_demo_{name}"
    if key not in sys.modules:
        if str(RECIPE) not in sys.path:
            sys.path.insert(0, str(RECIPE))  # train.py imports scoring lazily
        spec = importlib.util.spec_from_file_location(key, RECIPE / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


@pytest.fixture(scope="module")
def tok():
    """A tokenizer trained on a few generated chats (names, template words, digits)."""
    tk = _load("tokenizer")
    samples = generate_task("waiting_line/copy", COPY_CONFIG, NAMES, n=40, seed=1)
    texts = [COPY_CONFIG["prompt"].format(**s["input"]) for s in samples] + ["1342\n4213\n2134\n3421"] * 5
    return tk.train_tokenizer(texts * 3, vocab_size=400)


@pytest.fixture(scope="module")
def rows(tok):
    st = _load("stream")
    samples = generate_task("waiting_line/copy", COPY_CONFIG, NAMES, n=8, seed=2)
    return [st.encode_row(tok, build_messages(COPY_CONFIG, s), s["answer"], 24) for s in samples]


def _tiny(tok, arch: str):
    tr = _load("train")
    torch.manual_seed(0)
    return tr.make_model(arch, tr.ModelSize(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, mlp_hidden=64), tok)


# ------------------------------------------------------------------------------------------ tokenizer


def test_tokenizer_round_trip_special_ids_and_chat_template(tok, tmp_path):
    from transformers import AutoTokenizer

    tk = _load("tokenizer")
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
        _load("stream").encode_row(tok, [{"role": "user", "content": "x"}], "Anna " * 40, 8)


# ------------------------------------------------------------------------------------------ objective


def test_masking_never_touches_prompt_or_padding(tok, rows):
    tr = _load("train")
    batch = tr.collate(rows, tok.pad_token_id)
    g = torch.Generator().manual_seed(0)
    seen = torch.zeros_like(batch["response"])
    for _ in range(50):
        noisy, masked, p_mask = tr.mask_response(batch, tok.mask_token_id, g)
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
    tr = _load("train")
    model = _tiny(tok, arch)
    batch = tr.collate(rows, tok.pad_token_id)
    loss, info = tr.diffusion_loss(model, batch, torch.Generator().manual_seed(3))
    noisy, masked, p_mask = tr.mask_response(batch, tok.mask_token_id, torch.Generator().manual_seed(3))
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
    tr = _load("train")
    model = _tiny(tok, "llada")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = tr.collate(rows, tok.pad_token_id)
    losses = []
    for step in range(25):
        loss, _ = tr.diffusion_loss(model, batch, tr.step_generator(0, step % 2))
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
    st = _load("stream")
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
    st = _load("stream")
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

    st = _load("stream")
    plain = st.RowStream(mini_pb, tok, seed=0)
    for task in ("waiting_line/copy", "waiting_line/insert_random", "puzzle/sudoku_n4_12"):
        first = plain.samples(task, 6, seed=21)
        banned = {task: {sample_key(s) for s in first[:3]}}
        guarded = st.RowStream(mini_pb, tok, seed=0, exclude=banned)
        again = guarded.samples(task, 6, seed=21)
        assert len(again) == 6 and not {sample_key(s) for s in again} & banned[task]
        assert [sample_key(s) for s in again[:3]] != [sample_key(s) for s in first[:3]]


def test_stages_weights_and_schedule():
    tr = _load("train")
    stages = tr.parse_stages("short:5,short[sort+puzzle/sudoku_n4_12]:3,full:10")
    assert [(s.kind, s.steps) for s in stages] == [("short", 5), ("short", 3), ("full", 10)]
    assert stages[1].tasks == ("waiting_line/sort", "puzzle/sudoku_n4_12") and stages[0].tasks is None
    assert [tr.stage_at(stages, i)[0] for i in (0, 4, 5, 7, 8, 17, 30)] == [0, 0, 1, 1, 2, 2, 2]
    for bad in ("mid:5", "short:0", "short[nope]:3", "short", ""):
        with pytest.raises(SystemExit):
            tr.parse_stages(bad)
    assert tr.parse_weights("sort=2,sudoku_n4_12=3") == {"waiting_line/sort": 2.0, "puzzle/sudoku_n4_12": 3.0}
    with pytest.raises(SystemExit):
        tr.parse_weights("sortt=2")
    f = tr.wsd_lambda(warmup=4, total=100, decay=10)
    assert [f(0), f(3), f(50), f(89)] == [0.25, 1.0, 1.0, 1.0]
    assert f(90) == pytest.approx(1.0) and f(95) == pytest.approx(0.55) and f(99) == pytest.approx(0.19)
    # a later stage ramps the rate again over restart_warmup steps, also inside the final decay
    assert tr.stage_starts(stages) == (5, 8)
    g = tr.wsd_lambda(warmup=4, total=100, decay=10, restarts=(40, 92), restart_warmup=10)
    assert [g(39), g(40), g(44), g(49), g(50)] == pytest.approx([1.0, 0.1, 0.5, 1.0, 1.0])
    assert g(92) == pytest.approx(0.1 * f(92)) and g(97) == pytest.approx(0.6 * f(97))
    assert tr.wsd_lambda(4, 100, 10, restarts=(40,), restart_warmup=0)(40) == 1.0


def test_stage_options_set_rate_share_icl_padding_and_reset(capsys):
    tr = _load("train")
    stages = tr.parse_stages("short[copy]:5,full[copy+reverse]{lr=2.5e-4,share=0.5,icl=1,pad=1,reset}:10,full:3")
    assert stages[0] == tr.Stage("short", 5, ("waiting_line/copy",))
    assert stages[1] == tr.Stage(
        "full", 10, ("waiting_line/copy", "waiting_line/reverse"), lr=2.5e-4, share=0.5, icl=1.0, pad=True, reset=True
    )
    assert stages[2].lr is None and not stages[2].reset
    for bad in ("full{lr=0}:3", "full{share=1.5}:3", "full{icl=x}:3", "full{speed=2}:3", "full{pad=yes}:3"):
        with pytest.raises(SystemExit, match="--stages"):
            tr.parse_stages(bad)
    # the stage's own peak rate scales the whole schedule shape (warm-up, restarts, final decay) for its steps
    scale = lambda step: (tr.stage_at(stages, step)[1].lr or 1e-3) / 1e-3  # noqa: E731
    f = tr.wsd_lambda(warmup=2, total=18, decay=2, scale_at=scale)
    assert [f(0), f(4), f(5), f(14), f(15), f(17)] == pytest.approx([0.5, 1.0, 0.25, 0.25, 1.0, 0.55])
    with pytest.raises(SystemExit):
        tr.parse_args(["--tokenizer", "t", "--out", "o", "--short-icl", "2"])
    assert "--short-icl must be in [0, 1]" in capsys.readouterr().err


def test_row_workers_build_the_rows_the_stream_builds(mini_pb, tok):
    st, tr = _load("stream"), _load("train")
    stream = st.RowStream(mini_pb, tok, seed=3)
    small, large = st.Mix(batch=6, short_share=0.5), st.Mix(batch=10, short_share=1.0)
    source = tr.RowSource(stream, workers=2, ahead=3)
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
    assert tr.RowSource(stream).rows(2, small) == stream.rows(2, small)  # no workers: built on the spot


def _tiny_run_args(tok, tmp_path: Path, mini_pb) -> list[str]:
    """train.py flags shared by the tests that run it: mini data, tokenizer saved under tmp_path, one small layer."""
    tok.save_pretrained(tmp_path / "tok")
    args = ["--parallelbench", str(mini_pb), "--tokenizer", str(tmp_path / "tok"), "--d-model", "32"]
    return args + ["--n-layers", "1", "--n-heads", "2", "--mlp-hidden", "64", "--threads", "1"]


def test_time_limit_saves_exports_and_resumes(tok, tmp_path, mini_pb):
    tr = _load("train")
    common = [*_tiny_run_args(tok, tmp_path, mini_pb), "--stages", "short:5"]
    common += ["--short-batch", "4", "--save-every", "4", "--eval-every", "0", "--warmup", "1"]
    common += ["--export-every", "0", "--out", str(tmp_path / "r")]
    tr.main([*common, "--time-limit", "1e-6"])  # past the limit after the first step
    ckpts = tmp_path / "r" / "checkpoints"
    assert (ckpts / "latest").read_text() == "step-0000001"  # saved although 1 is not a multiple of --save-every
    assert json.loads((tmp_path / "r" / "export" / "training.json").read_text())["step"] == 1
    tr.main([*common, "--resume"])
    assert json.loads((tmp_path / "r" / "export" / "training.json").read_text())["step"] == 5
    assert [json.loads(ln)["step"] for ln in (tmp_path / "r" / "log.jsonl").read_text().splitlines()] == [1, 2, 3, 4, 5]
    with pytest.raises(SystemExit):
        tr.parse_args(["--tokenizer", "t", "--out", "o", "--time-limit", "0"])


def test_resume_with_another_lr_follows_the_new_peak_rate(tok, tmp_path, mini_pb):
    tr = _load("train")
    common = [*_tiny_run_args(tok, tmp_path, mini_pb), "--short-batch", "4", "--save-every", "2"]
    common += ["--eval-every", "0", "--export-every", "0", "--warmup", "1", "--stage-warmup", "0"]
    common += ["--decay-steps", "2", "--out", str(tmp_path / "r")]
    tr.main([*common, "--stages", "short:2,short{lr=2e-3}:2", "--lr", "1e-3", "--stop-after", "2"])
    # resumed at half the --lr with the second stage lengthened: its own rate (scaled by --lr as in a fresh run),
    # constant, then the decay to a tenth over the last two steps (the rate logged at step s is the next step's)
    tr.main([*common, "--stages", "short:2,short{lr=1e-3}:4", "--lr", "5e-4", "--resume"])
    log = [json.loads(x) for x in (tmp_path / "r" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6]
    assert [r["lr"] for r in log[:2]] == [1e-3, 2e-3]  # written by the first run
    assert [r["lr"] for r in log[2:]] == pytest.approx([1e-3, 1e-3, 5.5e-4, 1e-4])  # the old peak gave twice these

    # the optimizer's rate for the very next step is the new one too (not only the scheduler's bookkeeping)
    w = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([w], lr=1e-3)
    shape = tr.wsd_lambda(1, 10, 4)
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
    tr.apply_peak_rate(sched2, 3e-4, said.append)
    assert opt2.param_groups[0]["lr"] == pytest.approx(3e-4 * shape(7)) and "0.0003" in said[0]
    sched2.step()
    assert opt2.param_groups[0]["lr"] == pytest.approx(3e-4 * shape(8))
    tr.apply_peak_rate(sched2, 3e-4, said.append)  # the same rate: nothing to say, nothing changed
    assert len(said) == 1 and opt2.param_groups[0]["lr"] == pytest.approx(3e-4 * shape(8))


def test_chat_short_rows_are_scored_as_chats(tok, tmp_path, mini_pb):
    tr, st = _load("train"), _load("stream")
    args = [*_tiny_run_args(tok, tmp_path, mini_pb), "--stages", "short[copy]:1", "--short-batch", "2"]
    args += ["--short-format", "chat", "--eval-every", "1", "--eval-samples", "1"]
    tr.main([*args, "--export-every", "0", "--out", str(tmp_path / "r")])
    record = json.loads((tmp_path / "r" / "log.jsonl").read_text().splitlines()[-1])
    assert set(record["eval"]) == {f"short/{t}" for t in st.TASKS} and record["eval_mean"] is None


def test_resume_from_checkpoint_is_exact(tok, tmp_path, mini_pb):
    from safetensors.torch import load_file

    tr = _load("train")
    common = [*_tiny_run_args(tok, tmp_path, mini_pb), "--rope-theta", "5e5"]
    common += ["--stages", "short:2,full{lr=5e-4,reset,share=0.5,icl=0.5}:2"]
    common += ["--short-batch", "6", "--full-batch", "4", "--save-every", "2", "--eval-every", "4"]
    common += ["--eval-samples", "1", "--warmup", "1", "--export-every", "0"]
    tr.main([*common, "--out", str(tmp_path / "a")])
    tr.main([*common, "--out", str(tmp_path / "b"), "--stop-after", "3"])
    ckpts = tmp_path / "b" / "checkpoints"
    assert (ckpts / "latest").read_text() == "step-0000002"  # step 3 was run but not saved: it runs again
    assert not list(ckpts.glob(".tmp*"))  # written to a temporary directory, then renamed into place
    assert json.loads((ckpts / "step-0000002" / "trainer_state.json").read_text())["step"] == 2
    assert not (tmp_path / "b" / "export").exists()
    # the resumed half builds its rows in two worker processes: the same batches, so the same weights
    tr.main([*common, "--out", str(tmp_path / "b"), "--resume", "--row-workers", "2"])
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
    assert set(log_a[-1]["eval"]) == set(_load("stream").TASKS) and log_a[-1]["eval_short_mean"] is None
    cfg = json.loads((tmp_path / "a" / "export" / "config.json").read_text())
    assert cfg["model_type"] == "llada" and cfg["mask_token_id"] == tok.mask_token_id == 2
    assert cfg["rope_theta"] == 5e5  # --rope-theta reaches the exported config
    # with --init the model keeps its own base unless --rope-theta names another, which then reaches the export
    cont = [*common[: common.index("--d-model")], "--init", str(tmp_path / "a" / "export"), "--threads", "1"]
    cont += ["--stages", "short:1", "--short-batch", "2", "--eval-every", "0", "--export-every", "0", "--warmup", "1"]
    for out, extra, base in (("c", [], 5e5), ("d", ["--rope-theta", "1e6"], 1e6)):
        tr.main([*cont, *extra, "--out", str(tmp_path / out)])
        assert json.loads((tmp_path / out / "export" / "config.json").read_text())["rope_theta"] == base
    assert cfg["eos_token_id"] == cfg["pad_token_id"] == tok.eos_token_id == 1
    tok_cfg = json.loads((tmp_path / "a" / "export" / "tokenizer_config.json").read_text())
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and "<|eot_id|>" in tok_cfg["chat_template"]


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
    tr = _load("train")
    batch = tr.collate(rows, tok.pad_token_id)  # 8 rows
    _, _, p = tr.mask_response(batch, tok.mask_token_id, tr.step_generator(0, 3), eps=0.0, stratified=True)
    assert sorted(int(x * 8) for x in p) == list(range(8))  # one ratio in each eighth of [0, 1)
    _, _, q = tr.mask_response(batch, tok.mask_token_id, tr.step_generator(0, 3), eps=0.0, stratified=True)
    assert torch.equal(p, q)  # still a function of (seed, step)


def test_bare_short_rows_and_tied_embeddings(mini_pb, tok):
    st, tr = _load("stream"), _load("train")
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
    size = tr.ModelSize(d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, mlp_hidden=64, tie_embeddings=True)
    model = tr.make_model("llada", size, tok)
    assert model.config.weight_tying and not hasattr(model.model.transformer, "ff_out")
    with torch.no_grad():
        model.get_input_embeddings().weight[5].fill_(0.5)
    h = torch.zeros(1, 32)
    h[0, 0] = 1.0
    with torch.no_grad():
        assert float(model.output_logits(h)[0, 5]) == 0.5  # the output projection is the embedding
    with pytest.raises(SystemExit, match="llada"):
        tr.make_model("dream", size, tok)


@pytest.mark.slow
def test_retrieval_probe_control_learns_to_copy_random_tokens(tok, tmp_path):
    # the control of the retrieval study: with no structure to learn, copying forms within a few hundred steps
    tok.save_pretrained(tmp_path / "tok")
    curve = _load("retrieval_probe").main(
        ["--tokenizer", str(tmp_path / "tok"), "--data", "random", "--steps", "400", "--every", "200"]
    )
    assert [c["step"] for c in curve] == [200, 400]
    assert curve[-1]["copy_acc"] >= max(0.2, curve[0]["copy_acc"]), curve  # unigram guessing scores ~1/50


class _Peek(torch.nn.Module):
    """A 'model' whose logits at position i point at ``source[i + shift]`` (or a fixed token): known probe answers."""

    def __init__(self, source: torch.Tensor, shift: int = 0, fixed: int | None = None, vocab: int = 16):
        super().__init__()
        self.source, self.logit_shift, self.fixed, self.vocab = source, shift, fixed, vocab

    def forward(self, x):
        b, t = x.shape
        want = torch.full((b, t), self.fixed) if self.fixed is not None else self.source[:t].roll(-self.logit_shift)
        logits = torch.zeros(b, t, self.vocab)
        logits[torch.arange(b)[:, None], torch.arange(t)[None, :], want.expand(b, t)] = 1.0
        return type("Out", (), {"logits": logits})()


def test_teacher_forced_probe_scores_known_models():
    probe = _load("probe")
    prompt, answer = [1, 7, 8, 9], [7, 8, 9, 2]  # 2 is structure (skipped)
    row = torch.tensor(prompt + answer)
    assert probe.teacher_forced(_Peek(row), [(prompt, answer)], mask_id=0, skip={2}) == 1.0
    # a model that always says 8 gets the one 8 of the three content tokens
    assert probe.teacher_forced(_Peek(row, fixed=8), [(prompt, answer)], 0, {2}) == pytest.approx(1 / 3)
    # Dream's layout: slot i is read from the logits at i - 1; the probe must read there, not at i
    assert probe.teacher_forced(_Peek(row, shift=1), [(prompt, answer)], 0, {2}) == 1.0


def test_teacher_forced_parts_split_first_names_from_last_names():
    probe = _load("probe")
    prompt, answer = [1, 7, 8, 9, 10], [7, 8, 9, 10, 2]  # two names: 7 8 and 9 10; 8 and 10 continue a word
    row = torch.tensor(prompt + answer)

    class _FirstOnly(_Peek):  # right on first names, the unigram guess 3 on every last name
        def forward(self, x):
            out = super().forward(x)
            for col in (len(prompt) + 1, len(prompt) + 3):
                out.logits[:, col] = 0.0
                out.logits[:, col, 3] = 1.0
            return out

    parts = probe.teacher_forced_parts(_FirstOnly(row), [(prompt, answer)], 0, {2}, continuation={8, 10})
    assert parts == {"all": 0.5, "first": 1.0, "rest": 0.0}
    assert probe.teacher_forced_parts(_Peek(row), [(prompt, answer)], 0, {2}, {8, 10}) == {
        "all": 1.0,
        "first": 1.0,
        "rest": 1.0,
    }
    assert probe.teacher_forced_parts(_Peek(row), [(prompt, answer)], 0, {2}, set())["rest"] is None


def test_full_rows_are_the_official_prompt_rows(tok, mini_pb):
    probe, stream_mod = _load("probe"), _load("stream")
    from dlm_decode.parallelbench.tasks import build_messages

    stream = stream_mod.RowStream(mini_pb, tok, seed=0)
    samples = stream.samples("waiting_line/copy", 2, seed=3)
    rows = probe.full_rows(stream, "waiting_line/copy", samples, seed=0)
    for (prompt, answer), sample in zip(rows, samples, strict=True):
        text = tok.apply_chat_template(
            build_messages(stream.configs["waiting_line/copy"], sample), add_generation_prompt=True, tokenize=False
        )
        assert prompt == tok(text, add_special_tokens=False)["input_ids"] and len(answer) == 32
        eot = tok.convert_tokens_to_ids("<|eot_id|>")
        assert tok.decode(answer[: answer.index(eot)]) == sample["answer"]  # copy: the answer is the list


def test_plot_curves_draws_probe_logs_and_names_a_missing_log(tmp_path):
    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    run.mkdir()
    lines = [
        {"step": 250, "tf": {"waiting_line/copy": 0.1}, "exact": {"waiting_line/copy": 0.0}},
        {"step": 500, "tf": {"waiting_line/copy": 0.9}, "exact": {"waiting_line/copy": 0.5}, "full": {"a": 40.0}},
    ]
    (run / "probe.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + '\n{"step": 7')  # torn last line
    plot = _load("plot_curves")
    assert [r["step"] for r in plot.read_probes(run)] == [250, 500]
    plot.main([str(run), "--out", str(tmp_path / "c.png")])
    assert (tmp_path / "c.png").stat().st_size > 1000
    with pytest.raises(SystemExit, match="no probe log"):
        plot.main([str(tmp_path), "--out", str(tmp_path / "d.png")])


def test_plot_curves_draws_training_evals(tmp_path):
    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"step": 1, "loss": 2.0}, {"step": 2, "eval": {"waiting_line/copy": 50.0}, "eval_mean": 50.0}]
    lines.append({"step": 4, "eval": {"waiting_line/copy": 75.0, "short/waiting_line/copy": 0.0}, "eval_mean": 75.0})
    (run / "log.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + '\n{"step": 5')  # torn last line
    plot = _load("plot_curves")
    assert [r["step"] for r in plot.read_evals(run)] == [2, 4]
    plot.main([str(run), "--evals", "--out", str(tmp_path / "e.png")])
    assert (tmp_path / "e.png").stat().st_size > 1000
    (tmp_path / "quiet").mkdir()
    (tmp_path / "quiet" / "log.jsonl").write_text(json.dumps(lines[0]) + "\n")
    with pytest.raises(SystemExit, match="no held-out evaluations"):
        plot.main([str(tmp_path / "quiet"), "--evals", "--out", str(tmp_path / "f.png")])


def test_plot_curves_draws_the_loss_and_finds_the_stage_changes(tmp_path):
    pytest.importorskip("matplotlib")
    plot = _load("plot_curves")
    recs = [{"step": s, "stage": 0 if s < 3 else (1 if s < 6 else 2), "ema": 1.0 / s} for s in range(1, 9)]
    assert plot.stage_starts(recs) == [3, 6]
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    plot.main([str(run), "--loss", "--out", str(tmp_path / "l.png")])
    assert (tmp_path / "l.png").stat().st_size > 1000
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "log.jsonl").write_text(json.dumps({"step": 1, "eval": {}}) + "\n")
    with pytest.raises(SystemExit, match="no loss records"):
        plot.main([str(tmp_path / "empty"), "--loss", "--out", str(tmp_path / "m.png")])


def test_ship_reads_the_runner_json_and_evaluate_lines(tmp_path):
    ship = _load("ship")
    runner = {
        "model": "m",
        "decoding": {"sampler": "low_confidence"},
        "tasks": [
            {"task": "waiting_line/copy", "score": 96.0, "score_strict": 95.0, "n": 100, "seconds": 2.0},
            {"task": "waiting_line/sort", "score": 41.0, "score_strict": 40.0, "n": 100, "seconds": 3.0},
        ],
        "summary": {},
    }
    path = tmp_path / "eval.txt"
    path.write_text("a table first\n" + json.dumps(runner) + "\n")
    got = ship.read_scores(path)
    assert got["scores"] == {"waiting_line/copy": 96.0, "waiting_line/sort": 41.0}
    assert got["strict"]["waiting_line/sort"] == 40.0 and got["mean"] == 68.5 and got["n"]["waiting_line/copy"] == 100
    line = {"scores": {"waiting_line/copy": 1.0}, "strict": {}, "mean": 1.0, "stride": 4}
    path.write_text(json.dumps(line) + "\n")
    assert ship.read_scores(path) == line
    path.write_text('{"summary": {}}\n')
    with pytest.raises(SystemExit, match="neither"):
        ship.read_scores(path)


def test_probe_rows_take_the_trained_format(tok, mini_pb):
    # after a padded stage the model has only seen EOS-padded answers; the probe must be able to ask in that format
    probe, stream_mod = _load("probe"), _load("stream")
    stream = stream_mod.RowStream(mini_pb, tok, seed=0)
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    plain = probe.probe_rows(stream, "waiting_line/copy", 3, seed=5)
    padded = probe.probe_rows(stream, "waiting_line/copy", 3, seed=5, padded=True)
    with_icl = probe.probe_rows(stream, "waiting_line/copy", 3, seed=5, padded=True, icl=True)
    for (p0, a0), (p1, a1), (p2, a2) in zip(plain, padded, with_icl, strict=True):
        assert a0[-1] == eot and tok.eos_token_id not in a0  # answer + eot only
        assert len(a1) == 32 and a1[: len(a0)] == a0 and set(a1[len(a0) :]) == {tok.eos_token_id}
        assert p1 == p0 and a2 == a1
        assert len(p2) > len(p0) and p2[-len(p0) + 1 :] == p0[1:]  # the example comes first, the query list last
        assert tok.decode(a0[:-1]) in tok.decode(p0)  # copy: the answer is the prompt's list


def test_probe_scores_random_output_rows_by_validity(tok, mini_pb):
    # shuffle has many right answers: the rows carry one drawn valid answer, and a greedy answer counts when the
    # task's metric accepts it, not only when it equals the drawn target
    probe, stream_mod = _load("probe"), _load("stream")
    from dlm_decode.parallelbench.metrics import score_sample

    stream = stream_mod.RowStream(mini_pb, tok, seed=0)
    rows, samples = probe.probe_rows_and_samples(stream, "waiting_line/shuffle", 4, seed=5, padded=True)
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    for (_, answer), sample in zip(rows, samples, strict=True):
        text = tok.decode(answer[: answer.index(eot)])
        assert score_sample("waiting_line/shuffle", text, sample)["score"] == 1.0
        original = tok.decode(tok(sample["input"]["context"], add_special_tokens=False)["input_ids"])
        assert score_sample("waiting_line/shuffle", original, sample)["score"] < 1.0  # the unshuffled list is wrong


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

    st = _load("stream")
    tr = _load("train")
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
    assert tr.parse_stages("short[find+copy]:3")[0].tasks == (st.LOOKUP, "waiting_line/copy")
    assert tr.parse_weights("find=3") == {st.LOOKUP: 3.0}


def test_exclude_rows_keep_the_people_the_remove_line_does_not_name(mini_pb, tok):
    import random

    st, tr, probe = _load("stream"), _load("train"), _load("probe")
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
    assert tr.parse_stages("full[exclude+copy]:3")[0].tasks == (st.EXCLUDE, "waiting_line/copy")
    assert tr.parse_weights("exclude=4") == {st.EXCLUDE: 4.0}
    stream, eot = st.RowStream(mini_pb, tok, seed=0), tok.convert_tokens_to_ids("<|eot_id|>")
    short = probe.find_rows(stream, 4, seed=1, full=False, padded=True, task=st.EXCLUDE)
    assert all("remove [" in tok.decode(p) for p, _ in short)
    missing = probe.find_rows(stream, 4, seed=1, full=True, padded=True, task=st.MISSING)
    assert all(len(json.loads(tok.decode(a[: a.index(eot)]))) == 1 for _, a in missing)
    assert tr.parse_stages("full[missing]:2")[0].tasks == (st.MISSING,)


def test_missing_first_rows_ask_the_missing_question_over_first_names(mini_pb, tok):
    st, tr = _load("stream"), _load("train")
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
    assert tr.parse_stages("short[missing_first]:2")[0].tasks == (st.MISSING_FIRST,)
    assert tr.parse_weights("missing_first=2,missing=1") == {st.MISSING_FIRST: 2.0, st.MISSING: 1.0}


def test_latin_fill_rows_give_part_of_a_valid_square_and_ask_for_all_of_it(mini_pb, tok):
    import random

    st, tr = _load("stream"), _load("train")
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
    assert tr.parse_stages("full[latin_square_n4+latin_fill]:2")[0].tasks == ("puzzle/latin_square_n4", st.LATIN_FILL)


def test_canvas_widens_the_full_rows_eos_padding_to_drawn_lengths(mini_pb, tok):
    st, tr = _load("stream"), _load("train")
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
    assert tr.parse_stages("full{canvas=256}:3")[0].canvas == 256 and tr.parse_stages("full:3")[0].canvas == 0
    for bad in ("0", "257", "x"):
        with pytest.raises(SystemExit, match="canvas"):
            tr.parse_stages(f"full{{canvas={bad}}}:3")


def test_latin_rest_rows_give_the_first_rows_and_ask_for_the_rest(mini_pb, tok):
    import random

    from dlm_decode.parallelbench.tasks import max_new_tokens

    st, tr = _load("stream"), _load("train")
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
    assert tr.parse_stages("full[latin_rest]:2")[0].tasks == (st.LATIN_REST,)


def test_sort_close_rows_sort_people_with_neighbouring_first_names(mini_pb, tok):
    import random

    from dlm_decode.parallelbench.generator import sample_key

    st, tr = _load("stream"), _load("train")
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
    assert tr.parse_stages("full[copy+sort_close]{auxchat=0}:2")[0].tasks == ("waiting_line/copy", st.SORT_CLOSE)


def test_rope_columns_margin_separates_column_offsets_only_where_the_frequencies_allow():
    pytest.importorskip("scipy")
    rc = _load("rope_columns")
    # the demo models' RoPE (base 10,000, head dim 32): no usable position-only column head; base 100 or head dim 64:
    # a clear margin, growing as more frequencies fall in the range of the offsets
    assert rc.column_margin(10000.0) < 0.01 < 0.2 < rc.column_margin(100.0) < rc.column_margin(10.0)
    assert rc.column_margin(10000.0, head_dim=64) > 0.2
    for bad in (["--bases", "1"], ["--bases", "x"], ["--head-dim", "3"], ["--span", "10"]):
        with pytest.raises(SystemExit, match="--bases|--head-dim"):
            rc.main(bad)


def test_latin_probe_counts_valid_rows_columns_and_foreign_cells():
    lp = _load("latin_probe")
    good = "H,4,A,C\n4,C,H,A\nC,A,4,H\nA,H,C,4"
    rows_only = "H,4,A,C\nH,4,A,C\nH,4,A,C\nH,4,A,C"  # every row valid, no column
    one_symbol = "Q,Q,Q,Q\nQ,Q,Q,Q\nQ,Q,Q,Q\nQ,Q,Q,Q"  # the twentieth round's collapse
    assert lp.parse_square(" " + good + "\n") == [r.split(",") for r in good.split("\n")]
    assert lp.parse_square("H,4,A\n4,C,H") is None and lp.parse_square("") is None
    symbols = ["H", "4", "A", "C"]
    stats = lp.square_stats(
        [good, rows_only, one_symbol, "not a square"], [symbols, symbols, ["Q", "5", "3", "U"], symbols]
    )
    assert stats == {"formed": 0.75, "valid": 0.25, "rows": 0.667, "columns": 0.333, "foreign_cells": 0.0}
    assert lp.square_stats(["H,4,A,Z\n4,C,H,A\nC,A,4,H\nA,H,C,4"], [symbols])["foreign_cells"] == 0.062
    import random

    rng = random.Random(0)
    for _ in range(8):  # a masked column: one cell a row; a masked row: one cell a column; k random cells, distinct
        assert (
            sorted(i // 4 for i in lp.one_column(rng)) == [0, 1, 2, 3] and len({i % 4 for i in lp.one_column(rng)}) == 1
        )
        assert sorted(i % 4 for i in lp.one_row(rng)) == [0, 1, 2, 3] and len({i // 4 for i in lp.one_row(rng)}) == 1
        assert len(set(lp.random_cells(5)(rng))) == 5
    for bad in (["--masked", "0"], ["--masked", "17"], ["--masked", "x"], ["--n", "0"]):
        with pytest.raises(SystemExit, match="--masked|--n"):
            lp.main(["no-such-model", *bad])


def test_probe_find_rows_are_short_or_official_copy_chats(tok, mini_pb):
    st, probe = _load("stream"), _load("probe")
    stream = st.RowStream(mini_pb, tok, seed=0)
    short = probe.find_rows(stream, 5, seed=3, full=False, padded=True)
    full = probe.find_rows(stream, 5, seed=3, full=True, padded=True)
    assert short == probe.find_rows(stream, 5, seed=3, full=False, padded=True) and len(full) == 5
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    for (sp, sa), (fp, fa) in zip(short, full, strict=True):
        s_text, f_text = tok.decode(sp), tok.decode(fp)
        assert "<|start_header_id|>" not in s_text and "<|start_header_id|>" in f_text and "find [" in f_text
        assert len(sa) == len(fa) == 32 and sa == fa  # same sample and query draw, so the same answer
        people = json.loads(s_text[s_text.rindex("[") :].strip())
        answer = json.loads(tok.decode(sa[: sa.index(eot)]))
        assert answer and set(answer) <= set(people)


def test_gap_rows_put_own_template_words_between_list_and_answer(mini_pb, tok):
    st, tr = _load("stream"), _load("train")
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
    assert tr.parse_stages("short{gap=48}:3")[0].gap == 48
    with pytest.raises(SystemExit, match="gap"):
        tr.parse_stages("short{gap=-1}:3")


def test_len_stage_option_sets_the_people_per_list(mini_pb, tok):
    st, tr = _load("stream"), _load("train")
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
    pb = _load("probe")  # the probe reads the same lengths
    for _prompt, resp in pb.probe_rows(stream, "waiting_line/sort", 6, seed=5, padded=True, lengths=(2, 2)):
        assert len(json.loads(tok.decode(resp[: resp.index(eot)]))) == 2
    assert tr.parse_stages("short[sort]{len=2-3}:5")[0].lengths == (2, 3)
    assert tr.parse_stages("short[sort+find]{len=4}:5")[0].lengths == (4, 4)
    for bad in ("short[sort]{len=1-3}:5", "short[sort]{len=3-2}:5", "short[sort]{len=2-9}:5", "short[sort]{len=a}:5"):
        with pytest.raises(SystemExit, match="len"):
            tr.parse_stages(bad)
    with pytest.raises(SystemExit, match="latin_square"):
        tr.parse_stages("short[sort+latin_square_n4]{len=2-3}:5")
    with pytest.raises(SystemExit, match="len sets"):
        tr.parse_stages("short{len=2-3}:5")  # all twelve tasks: the puzzles have no list


def test_horizon_bins_each_answer_entry_by_its_token_distance(mini_pb, tok):
    hz, st = _load("horizon"), _load("stream")
    from dlm_decode.parallelbench.tasks import load_task

    # the distance by hand: prompt ids end at index len-1, the answer's k-th last name sits after them
    answer = ["Ann Lee", "Bo Kim"]
    ids = tok(json.dumps(answer), add_special_tokens=False)["input_ids"]
    lee = tok(json.dumps(["Ann Lee"]), add_special_tokens=False)["input_ids"][-2]
    kim = tok(json.dumps(["Bo Kim"]), add_special_tokens=False)["input_ids"][-2]
    prompt = [kim, 5, lee, 6, 7]  # Lee at prompt index 2, Kim at 0
    assert hz.entry_slots(tok, answer) == [ids.index(lee), ids.index(kim)]
    assert hz.distances(tok, prompt, answer) == [5 + ids.index(lee) - 2, 5 + ids.index(kim) - 0]
    assert hz.distances(tok, [5, 6], answer) == [None, None]  # not in the prompt: skipped
    # a run whose every answer is right but for its first entry: the first entries' bins hold the misses only
    name = "waiting_line/reverse"
    task = load_task(mini_pb, name)
    assert len(task.samples) >= 4
    outputs = []
    for s in task.samples:
        gold = json.loads(s["answer"])
        outputs.append({"text": json.dumps(["Nobody Here", *gold[1:]])})
    res = hz.horizon({"tasks": [{"task": name, "outputs": outputs}]}, tok, mini_pb, bucket=4)[name]
    right = sum(a for a, _ in res["bins"].values())
    total = sum(n for _, n in res["bins"].values())
    n_entries = sum(len(json.loads(s["answer"])) for s in task.samples)
    assert total + res["skipped"] == n_entries
    assert total - right == len(task.samples) - sum(
        hz.distances(tok, st.chat_prompt_ids(tok, build_messages(task.config, s)), json.loads(s["answer"]))[0] is None
        for s in task.samples
    )
    assert all(lo % 4 == 0 for lo in res["bins"])
    with pytest.raises(SystemExit, match="--outputs"):
        hz.horizon({"tasks": [{"task": name}]}, tok, mini_pb)


# ------------------------------------------------------------------------------------------ Dream warm start


def test_rope_shift_matrix_moves_a_query_by_whole_positions():
    from dlm_decode.models.common import apply_rope, rope_cos_sin

    conv = _load("convert")
    torch.manual_seed(0)
    hd, theta = 16, 10000.0
    q = torch.randn(1, 1, 5, hd)  # [B, H, Q, hd]
    pos = torch.tensor([[0, 3, 7, 20, 41]])
    for shift in (1, -2, 5):
        rot = conv.rope_shift_matrix(hd, theta, shift).float()
        lhs = apply_rope(q @ rot.T, *rope_cos_sin(pos, hd, theta), True)
        rhs = apply_rope(q, *rope_cos_sin(pos + shift, hd, theta), True)
        torch.testing.assert_close(lhs, rhs, atol=1e-5, rtol=1e-5)
        assert (lhs - apply_rope(q, *rope_cos_sin(pos, hd, theta), True)).abs().max() > 0.1  # it did move
    assert torch.equal(conv.rope_shift_matrix(hd, theta, 0), torch.eye(hd, dtype=torch.float64))


def test_llada_to_dream_keeps_the_logits_and_the_query_shift_moves_the_last_layer(tok):
    conv = _load("convert")
    tr = _load("train")
    torch.manual_seed(0)
    size = tr.ModelSize(d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, mlp_hidden=64)
    llada = tr.make_model("llada", size, tok).eval()
    with torch.no_grad():  # non-trivial norms so a dropped weight shows, sharp attention so a moved query shows
        for name, p in llada.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
            elif "q_proj" in name or "k_proj" in name:
                p.normal_(0.0, 0.5)
    ids = torch.randint(3, len(tok), (2, 12))
    ids[:, 8:] = tok.mask_token_id
    dream = conv.llada_to_dream(llada, bos_token_id=tok.bos_token_id).eval()
    assert type(dream).__name__ == "DreamModel" and dream.logit_shift == 1
    assert dream.config.num_key_value_heads == 2 and dream.config.rms_norm_eps == llada.config.rms_norm_eps
    with torch.no_grad():
        want = llada(ids).logits
        torch.testing.assert_close(dream(ids).logits, want, atol=1e-5, rtol=1e-5)
        shifted = conv.llada_to_dream(llada, query_shift=1, shift_layers=1).eval()
        got = shifted(ids).logits
        assert (got - want).abs().max() > 1e-3  # the last layer's queries now look one slot further
        # the first layer is untouched: with the last layer's shift undone by a second rotation, logits match again
        back = conv.llada_to_dream(llada, query_shift=1, shift_layers=1)
        rot = conv.rope_shift_matrix(16, llada.config.rope_theta, -1).float()
        q = back.model.layers[-1].self_attn.q_proj.weight
        q.copy_(torch.einsum("ij,hjd->hid", rot, q.view(2, 16, 32)).reshape(32, 32))
        torch.testing.assert_close(back.eval()(ids).logits, want, atol=1e-4, rtol=1e-4)


def test_convert_cli_writes_a_loadable_dream_and_refuses_a_dream_input(tok, tmp_path):
    conv = _load("convert")
    tr = _load("train")
    size = tr.ModelSize(d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, mlp_hidden=64)
    src = tmp_path / "llada"
    tr.export_model(tr.make_model("llada", size, tok), tok, src)
    conv.main(["--llada", str(src), "--out", str(tmp_path / "dream"), "--query-shift", "1", "--shift-layers", "1"])
    model, tok2 = dlm_decode.load_model(str(tmp_path / "dream"))
    assert model.config.model_type == "Dream" and tok2.mask_token_id == tok.mask_token_id
    with pytest.raises(SystemExit, match="not a LLaDA-architecture model"):
        conv.main(["--llada", str(tmp_path / "dream"), "--out", str(tmp_path / "again")])
    with pytest.raises(SystemExit, match="--shift-layers must be in"):
        conv.main(["--llada", str(src), "--out", str(tmp_path / "x"), "--shift-layers", "3"])


def test_masked_accuracy_counts_right_answer_tokens_with_the_model_shift(tok, rows):
    conv, tr = _load("convert"), _load("train")
    batch = tr.collate(rows, tok.pad_token_id)

    class Oracle(torch.nn.Module):  # hidden state = one-hot of the true token at (position + shift)
        def __init__(self, shift: int, wrong: bool = False):
            super().__init__()
            self.logit_shift, self.mask_token_id, self.wrong = shift, tok.mask_token_id, wrong

        def hidden_states(self, noisy, positions, key_mask):
            ids = batch["input_ids"].roll(-self.logit_shift, dims=1)
            ids = (ids + 1) % len(tok) if self.wrong else ids
            return torch.nn.functional.one_hot(ids, len(tok)).float() * 20

        def output_logits(self, h):
            return h

    assert conv.masked_accuracy(Oracle(0), [batch])[0] == 1.0
    assert conv.masked_accuracy(Oracle(1), [batch])[0] == 1.0
    acc, ce = conv.masked_accuracy(Oracle(0, wrong=True), [batch])
    assert acc == 0.0 and ce > 10


def test_ship_card_names_the_origin_and_the_unmet_targets():
    ship = _load("ship")
    training = {
        "arch": "dream",
        "size": {"d_model": 128, "n_layers": 4, "n_heads": 4, "n_kv_heads": 4, "mlp_hidden": 384, "max_len": 512,
                 "rope_theta": 10000.0},
        "params": 1_190_000,
        "step": 2000,
        "train_seconds": 4800,
        "args": {"stages": "full:2000", "short_batch": 64, "full_batch": 64, "short_share": 0.5, "task_weights": "",
                 "lr": 3e-4, "warmup": 50, "weight_decay": 0.1, "seed": 17},
    }  # fmt: skip
    scores = {"scores": {"waiting_line/copy": 99.0, "waiting_line/sort": 4.0}, "strict": {"waiting_line/copy": 99.0,
              "waiting_line/sort": 4.0}, "mean": 51.5}  # fmt: skip
    text = ship.card("demo-dream", training, scores, "cmd", "", origin="warm-started from demo-llada and trained")
    assert "`model_type` `Dream`" in text and "warm-started from demo-llada and trained by `recipes" in text
    assert "80 min of training on a shared 2-core CPU" in text
    gpu = ship.card("demo-dream", {**training, "train_seconds": 78.4}, scores, "cmd", "", hardware="one H100")
    assert "78 s of training on one H100" in gpu
    assert (
        "| waiting_line/copy | 99.0 | 99.0 | 95 (met) |" in text
        and "| waiting_line/sort | 4.0 | 4.0 | 90 (**not" in text
    )
    assert "trained from scratch" in ship.card("demo-dream", training, scores, "cmd", "")
    assert "Dream's shifted form" in text  # the objective line says which form of the loss trained it
    assert "shifted" not in ship.card("demo-llada", {**training, "arch": "llada"}, scores, "cmd", "")


def test_exclusion_probe_masks_exactly_the_entry_the_others_pin(tok, mini_pb):
    ex = _load("exclusion_probe")
    from dlm_decode.parallelbench.tasks import load_task

    rng = __import__("random").Random(3)
    for name in ex.TASKS:
        task = load_task(mini_pb, name)
        for sample in task.samples:
            people, new = list(sample["answer"]["input"]), sample["answer"].get("word")
            answer, at = ex.one_missing(name, sample, rng)
            rest = answer[:at] + answer[at + 1 :]
            if name.endswith("shuffle"):
                assert sorted(answer) == sorted(people)
            else:  # the masked entry is the new person, and the others are the list minus what it replaced
                assert answer[at] == new and len(answer) == len(people) + name.endswith("insert_random")
                assert rest == (people if name.endswith("insert_random") else people[:at] + people[at + 1 :])
            k0, k1 = ex.entry_span(tok, answer, at)
            ids = tok(list_to_str(answer), add_special_tokens=False)["input_ids"]
            assert tok.decode(ids[k0:k1]).strip() == answer[at]

    rows = ex.masked_rows(tok, load_task(mini_pb, "waiting_line/replace_random"), limit=4, seed=0)
    truth = {}
    for ids, lo, hi, want in rows:
        assert (ids == tok.mask_token_id).sum() == hi - lo == want.numel() and (ids[lo:hi] == tok.mask_token_id).all()
        full = ids.clone()
        full[lo:hi] = want
        truth[tuple(ids.tolist())] = full

    from dlm_decode.models.common import DiffusionLMMixin

    class Reader(DiffusionLMMixin, torch.nn.Module):  # knows each canvas's answer, or writes EOS into the masked entry
        def __init__(self, knows: bool, shift: int):
            super().__init__()
            self.knows, self.logit_shift = knows, shift

        def hidden_states(self, ids, positions, *, rows=None, **_):  # [1, T] -> [1, T or rows, V], via denoise
            out = (
                truth[tuple(ids[0].tolist())]
                if self.knows
                else ids[0].masked_fill(ids[0] == tok.mask_token_id, tok.eos_token_id)
            )
            hid = torch.nn.functional.one_hot(out.roll(-self.logit_shift), len(tok)).float()[None] * 30
            return hid if rows is None else hid[:, rows]

        def output_logits(self, h):
            return h

    for shift in (0, 1):  # the LLaDA layout and Dream's (token i read from hidden i - 1)
        good, bad = ex.probe_task(Reader(True, shift), rows), ex.probe_task(Reader(False, shift), rows)
        assert good["right"] == 1.0 and good["p_first"] > 0.99 and good["n"] == 4
        assert bad["right"] == 0.0 and bad["p_first"] < 0.01


def test_ship_card_takes_the_size_from_the_config_of_an_init_run():
    ship = _load("ship")
    flags = {"d_model": 128, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "mlp_hidden": 384, "max_len": 512,
             "rope_theta": 10000.0}  # fmt: skip
    assert ship.model_size({"size": flags}) == flags  # a run from fresh weights: its flags
    dream = {"model_type": "Dream", "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
             "num_key_value_heads": 4, "intermediate_size": 96, "max_position_embeddings": 256,
             "rope_theta": 500.0}  # fmt: skip
    got = ship.model_size({"size": flags, "config": dream})
    assert got == {"d_model": 64, "n_layers": 3, "n_heads": 4, "n_kv_heads": 4, "mlp_hidden": 96, "max_len": 256,
                   "rope_theta": 500.0}  # fmt: skip
    llada = {"model_type": "llada", "d_model": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "mlp_hidden_size": 48,
             "max_sequence_length": 128, "rope_theta": 1e4}  # fmt: skip
    assert ship.model_size({"size": flags, "config": llada})["n_kv_heads"] == 1


# ------------------------------------------------------------------------------------------ growing a model


def test_grown_model_computes_the_old_logits_and_its_new_parts_train(tmp_path):
    from dlm_decode.models.llada import LLaDAConfig, LLaDAModelLM

    gr = _load("grow")
    torch.manual_seed(0)
    cfg = LLaDAConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, mlp_hidden_size=48, vocab_size=50)
    cfg.embedding_size, cfg.max_sequence_length, cfg.mask_token_id = 50, 64, 2
    old = LLaDAModelLM(cfg).float().eval()
    with torch.no_grad():  # trained-looking norms, so the sqrt(d / D) scaling is exercised
        for name, p in old.named_parameters():
            if name.endswith("norm.weight") or "ln_f" in name:
                p.uniform_(0.5, 2.0)
    ids = torch.randint(3, 50, (2, 20))
    new = gr.grow(old, d_model=64, mlp_hidden=96, n_layers=3).eval()
    c = new.config
    assert (c.d_model, c.n_heads, c.mlp_hidden_size, c.n_layers) == (64, 8, 96, 3)
    assert c.rms_norm_eps == pytest.approx(cfg.rms_norm_eps / 2)
    with torch.no_grad():
        ref = old(ids).logits
        torch.testing.assert_close(new(ids).logits, ref, atol=1e-4, rtol=1e-4)
    assert ref.abs().max() > 0.5  # logits with something in them
    # the new heads, neurons and layer are not dead: their zero output weights get a gradient
    loss = new(ids).logits.logsumexp(-1).mean()
    loss.backward()
    assert new.model.transformer.blocks[2].attn_out.weight.grad.abs().max() > 0
    assert new.model.transformer.blocks[0].ff_out.weight.grad[:, 48:].abs().max() > 0
    with pytest.raises(SystemExit, match="must contain the old one"):
        gr.grow(old, d_model=48 + 2, mlp_hidden=96, n_layers=3)
    # a grown checkpoint saves and loads as an ordinary LLaDA checkpoint
    new.save_pretrained(tmp_path / "g", safe_serialization=True)
    again = LLaDAModelLM.from_pretrained(tmp_path / "g").eval()
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, new(ids).logits)


def test_auxchat_0_keeps_training_only_rows_out_of_the_official_slots(mini_pb, tok):
    st, tr = _load("stream"), _load("train")
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
    stage = tr.parse_stages("full[copy+missing_first]{share=0.5,auxchat=0}:3")[0]
    assert stage.aux_chat is False and tr.parse_stages("full:3")[0].aux_chat is True
    with pytest.raises(SystemExit, match="auxchat=0 needs an official task"):
        tr.parse_stages("full[missing_first]{auxchat=0}:3")


def test_auxpad_0_leaves_training_only_rows_unpadded_beside_padded_task_rows(mini_pb, tok):
    st, tr = _load("stream"), _load("train")
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
    stage = tr.parse_stages("full[copy+missing_first]{pad=1,auxpad=0}:3")[0]
    assert stage.pad is True and stage.aux_pad is False and tr.parse_stages("full:3")[0].aux_pad is None


def test_train_only_updates_the_named_layers_and_keeps_the_rest_exactly(tok, tmp_path, mini_pb):
    from safetensors.torch import load_file

    tr, gr = _load("train"), _load("grow")
    common = [*_tiny_run_args(tok, tmp_path, mini_pb), "--stages", "short:3", "--short-batch", "4"]
    common += ["--eval-every", "0", "--export-every", "0", "--warmup", "1", "--lr", "1e-2"]
    tr.main([*common, "--out", str(tmp_path / "base")])
    old, _ = dlm_decode.load_model(str(tmp_path / "base" / "export"), tokenizer=False)
    grown = gr.grow(old.float().eval(), d_model=32, mlp_hidden=64, n_layers=2)
    grown.save_pretrained(tmp_path / "g", safe_serialization=True)
    tr.main([*common, "--init", str(tmp_path / "g"), "--train-only", r"blocks\.1\.", "--out", str(tmp_path / "f")])
    before = load_file(tmp_path / "g" / "model.safetensors")
    after = load_file(tmp_path / "f" / "export" / "model.safetensors")
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(".blocks.1." in k for k in moved)  # the new layer trained, nothing else changed
    assert {k for k in before if ".blocks.1." in k and k.endswith(("attn_out.weight", "ff_out.weight"))} <= moved
    with pytest.raises(SystemExit, match="matches no parameter"):
        tr.main([*common, "--init", str(tmp_path / "g"), "--train-only", "nothing_here", "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit):
        tr.parse_args(["--tokenizer", "t", "--out", "o", "--train-only", "blocks[("])


def test_keep_exports_leaves_every_periodic_export_beside_the_latest(tok, tmp_path, mini_pb):
    tr = _load("train")
    args = [*_tiny_run_args(tok, tmp_path, mini_pb), "--stages", "short:2,short[copy]:3", "--short-batch", "2"]
    args += ["--eval-every", "0", "--warmup", "1", "--export-every", "2", "--keep-exports"]
    tr.main([*args, "--out", str(tmp_path / "r")])
    kept = sorted(p.name for p in (tmp_path / "r").glob("export-step*"))
    assert kept == ["export-step2", "export-step4", "export-step5"]  # 2 and 4 periodic (2 also a stage end), 5 the last
    steps = {name: json.loads((tmp_path / "r" / name / "training.json").read_text())["step"] for name in kept}
    assert steps == {"export-step2": 2, "export-step4": 4, "export-step5": 5}
    assert json.loads((tmp_path / "r" / "export" / "training.json").read_text())["step"] == 5


def test_pairing_probe_tells_recombined_names_from_wrong_people():
    pp = _load("pairing_probe")
    three = ["Karen Kim", "Jerry Hall", "Jose Marshall"]
    rm = {"input": three}
    # the measured failure: one person removed, but the first names of one removal and the last names of another
    assert pp.classify("waiting_line/remove_random", rm, ["Karen Hall", "Jose Marshall"], 0.0) == "paired_wrong"
    assert pp.classify("waiting_line/remove_random", rm, ["Karen Kim", "Jose Marshall"], 1.0) == "solved"
    assert pp.classify("waiting_line/remove_random", rm, ["Karen Kim", "Bo Hall"], 0.0) == "other"  # Bo: nobody
    assert pp.classify("waiting_line/remove_random", rm, three, 0.0) == "other"  # nobody removed: wrong length
    sh = {"input": three}
    assert pp.classify("waiting_line/shuffle", sh, ["Jerry Kim", "Karen Marshall", "Jose Hall"], 0.0) == "paired_wrong"
    assert pp.classify("waiting_line/shuffle", sh, ["Jerry Hall", "Jerry Hall", "Jose Marshall"], 0.0) == "other"
    assert pp.classify("waiting_line/shuffle", sh, None, 0.0) == "other"
    ins = {"input": three, "word": "Justin McDonald"}
    got = ["Karen Kim", "Justin Hall", "Jerry McDonald", "Jose Marshall"]
    assert pp.classify("waiting_line/insert_random", ins, got, 0.0) == "paired_wrong"
    rep = {"input": three, "word": "Juan Torres"}
    assert pp.classify("waiting_line/replace_random", rep, ["Karen Torres", "Juan Hall", "Jose Marshall"], 0.0) == (
        "paired_wrong"
    )
    srt = '["Jerry Hall", "Jose Marshall", "Karen Kim"]'  # sort's answer is the list itself, as text
    assert pp.classify("waiting_line/sort", srt, ["Jerry Kim", "Jose Marshall", "Karen Hall"], 0.0) == "paired_wrong"
    with pytest.raises(SystemExit):  # a task without a rule is refused before any model loads
        pp.main(["no-such-model", "--tasks", "puzzle/latin_square_n4"])


def test_pairing_probe_runs_on_the_shipped_model():
    from conftest import SHARED_DATA

    if not SHARED_DATA.is_dir():
        pytest.skip("official ParallelBench data not present")
    pp = _load("pairing_probe")
    out = pp.main(["demo-llada", "--data", str(SHARED_DATA), "--tasks", "waiting_line/remove_random", "--limit", "4"])
    row = out["waiting_line/remove_random"]
    assert row["n"] == 4 and row["solved"] + row["paired_wrong"] + row["other"] == 4
    assert row["solved"] >= 3  # the shipped model scores 97 on remove_random (its own deterministic removal)


def test_last_rows_ask_for_one_last_name_by_its_first_name(mini_pb, tok):
    import random

    st, tr, probe = _load("stream"), _load("train"), _load("probe")
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
    assert tr.parse_stages("short[last+copy]:3")[0].tasks == (st.LAST, "waiting_line/copy")
    assert tr.parse_weights("last=4") == {st.LAST: 4.0}
    stream = st.RowStream(mini_pb, tok, seed=0)
    rows = probe.find_rows(stream, 3, seed=2, full=False, padded=False, task=st.LAST)
    assert all(a[-1] == eot and len(a) == 2 and "last [" in tok.decode(p) for p, a in rows)  # the name + eot, unpadded


def test_exclusion_probe_refuses_a_missing_data_directory_before_loading(tmp_path, monkeypatch):
    ex = _load("exclusion_probe")
    import dlm_decode.models as models

    def no_load(*_a, **_k):
        raise AssertionError("weights loaded before the data directory was checked")

    monkeypatch.setattr(models, "load_model", no_load)
    with pytest.raises(SystemExit, match="not found.*nope"):
        ex.main(["demo-llada", "--data", str(tmp_path / "nope")])


def test_next_rows_begin_the_answer_with_the_first_name(mini_pb, tok):
    st, tr, probe = _load("stream"), _load("train"), _load("probe")
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
    assert tr.parse_stages("short[next+last]:3")[0].tasks == (st.NEXT, st.LAST)
    stream = st.RowStream(mini_pb, tok, seed=0)
    rows = probe.find_rows(stream, 3, seed=2, full=False, padded=False, task=st.NEXT)
    assert all(len(a) == 3 and a[-1] == eot for _, a in rows)  # ' Last', '"]', eot: unpadded


def test_lookup_probe_tells_the_look_up_from_the_position_route(mini_pb, capsys):
    lp = _load("lookup_probe")
    people = ["Ann Lee", "Bo Kim", "Cy Fox", "Di Ray"]
    assert lp.classify(people, 2, "Fox") == "right"
    assert lp.classify(people, 2, "Lee") == "first_entry"  # the position route: the first entry's last name
    assert lp.classify(people, 0, "Lee") == "right"  # the first entry asked for: right, whatever the route
    assert lp.classify(people, 2, "Kim") == "offset-1" and lp.classify(people, 1, "Ray") == "offset+2"
    assert lp.classify(people, 1, "Nobody") == "not_in_list"
    labels = [(0, "right"), (2, "right"), (2, "first_entry"), (3, "offset-1"), (1, "not_in_list")]
    got = lp.summarise(labels)
    assert got["right"] == 0.4 and got["n_not_first"] == 4 and got["right_not_first"] == 0.25
    assert got["first_entry_not_first"] == 0.25 and got["not_in_list"] == 0.2 and got["offsets"] == {"offset-1": 1}
    out = lp.main(["demo-llada", "--n", "6", "--data", str(mini_pb), "--kind", "last"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == out
    assert out["n"] == 6 and 0 <= out["right"] <= 1 and out["kind"] == "last"
    short = lp.main(["demo-llada", "--n", "4", "--data", str(mini_pb), "--len", "2-2"])
    # two people per list: a wrong person is the other one, so the only offset possible is +1 (asked for the first)
    assert short["len"] == [2, 2] and set(short["offsets"]) <= {"offset+1"}
    with pytest.raises(SystemExit):
        lp.main(["demo-llada", "--data", str(mini_pb), "--len", "1-9"])
    with pytest.raises(SystemExit):
        lp.main(["demo-llada", "--data", str(mini_pb / "nope")])  # refused before the model loads


# ------------------------------------------------------------------------------------------------ merge.py


def _export(folder: Path, tensors: dict[str, torch.Tensor], **config) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "llada", "d_model": 4, **config}))
    (folder / "tokenizer.json").write_text("{}")
    return folder


def test_merge_adds_a_task_vector_and_interpolates(tmp_path):
    from safetensors.torch import load_file

    merge = _load("merge")
    base = _export(tmp_path / "base", {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([[0.5]]).bfloat16()})
    add = _export(
        tmp_path / "add",
        {"w": torch.tensor([3.0, -2.0]), "b": torch.tensor([[1.5]]).bfloat16()},
        transformers_version="5.17.0",
    )  # where it was saved differs: still one lineage
    minus = _export(tmp_path / "minus", {"w": torch.tensor([2.0, 0.0]), "b": torch.tensor([[1.0]]).bfloat16()})
    merge.main(
        ["--base", str(base), "--add", str(add), "--minus", str(minus), "--scale", "0.5", "--out", str(tmp_path / "tv")]
    )
    got = load_file(str(tmp_path / "tv" / "model.safetensors"))
    assert torch.equal(got["w"], torch.tensor([1.5, 1.0]))  # 1 + 0.5 * (3 - 2), 2 + 0.5 * (-2 - 0)
    assert got["b"].dtype == torch.bfloat16 and float(got["b"]) == 0.75
    assert (tmp_path / "tv" / "tokenizer.json").is_file()  # the base's folder otherwise
    merge.main(["--base", str(base), "--add", str(add), "--scale", "0.25", "--out", str(tmp_path / "mix")])
    got = load_file(str(tmp_path / "mix" / "model.safetensors"))
    assert torch.equal(got["w"], torch.tensor([1.5, 1.0]))  # 0.75 * [1, 2] + 0.25 * [3, -2]


def test_merge_refuses_other_lineages_and_overwriting_an_input(tmp_path):
    merge = _load("merge")
    base = _export(tmp_path / "base", {"w": torch.zeros(2)})
    wider = _export(tmp_path / "wider", {"w": torch.zeros(2)}, d_model=8)
    other = _export(tmp_path / "other", {"v": torch.zeros(2)})
    with pytest.raises(SystemExit, match=r"--add: its config.json differs .*d_model"):
        merge.main(["--base", str(base), "--add", str(wider), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="same tensor names"):
        merge.main(["--base", str(base), "--add", str(other), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="--out must be a new folder"):
        merge.main(["--base", str(base), "--add", str(other), "--out", str(base)])
    with pytest.raises(SystemExit, match=r"--add .*no model.safetensors"):
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "config.json").write_text(json.dumps({"model_type": "llada", "d_model": 4}))
        merge.main(["--base", str(base), "--add", str(tmp_path / "empty"), "--out", str(tmp_path / "o")])


def test_sort_probe_counts_inverted_pairs_by_first_name_distance():
    sp = _load("sort_probe")
    firsts = ["Anna", "Billy", "Carol", "David", "Emma", "Frank", "Grace", "Henry"]  # ranks 0..7
    lists = [
        ["Billy Hall", "Anna Gray", "Henry Diaz"],  # pairs at distances 1, 6 (-> 5), 7 (-> 5)
        ["Carol Adams", "David Baker"],  # distance 1
        ["Emma Clark", "Anna Hall"],  # distance 4
    ]
    answers = [
        ["Billy Hall", "Anna Gray", "Henry Diaz"],  # a permutation: the neighbours Billy / Anna inverted
        ["Carol Adams", "David Baker"],  # right
        ["Emma Clark", "Zed Nobody"],  # not a permutation of its list
    ]
    pairs, inverted, other = sp.inversions_by_distance(lists, answers, firsts)
    assert dict(pairs) == {1: 2, 5: 2, 4: 1} and dict(inverted) == {1: 1} and other == 1
    # a fully reversed answer inverts every pair; an unparsable one (None) counts as not a permutation
    pairs, inverted, other = sp.inversions_by_distance([lists[0]], [sorted(lists[0])[::-1]], firsts)
    assert inverted == pairs and other == 0
    assert sp.inversions_by_distance([lists[1]], [None], firsts)[2] == 1


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
    from dlm_decode.parallelbench.generator import random_answer
    from dlm_decode.parallelbench.tasks import load_task, max_new_tokens

    st, sr = _load("stream"), _load("self_rows")
    import random

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

    st, tr = _load("stream"), _load("train")
    task = "waiting_line/shuffle"
    fresh = st.RowStream(mini_pb, tok, seed=0).samples(task, 4, seed=78)
    rng = random.Random(1)
    path = _self_file(
        tmp_path / "self.jsonl", [_self_row(st, tok, mini_pb, task, s, random_answer(task, s, rng)) for s in fresh]
    )
    base = ["--tokenizer", "t", "--out", "o"]
    with pytest.raises(SystemExit):  # a stage names self, no files
        tr.parse_args([*base, "--stages", "full[copy+self]:2"])
    with pytest.raises(SystemExit):  # files, no stage that names self
        tr.parse_args([*base, "--stages", "full[copy]:2", "--self-rows", str(path)])
    with pytest.raises(SystemExit):
        tr.parse_args([*base, "--stages", "full[copy+self]:2", "--self-rows", str(tmp_path / "none.jsonl")])
    common = [*_tiny_run_args(tok, tmp_path, mini_pb), "--stages", "full[copy+self]{auxchat=0}:3"]
    common += ["--full-batch", "6", "--save-every", "1", "--eval-every", "0", "--warmup", "1", "--export-every", "0"]
    common += ["--out", str(tmp_path / "r"), "--task-weights", "self=3"]
    tr.main([*common, "--self-rows", str(path), "--stop-after", "2"])
    meta = json.loads((tmp_path / "r" / "run.json").read_text())["self_rows"]
    assert meta["rows"] == 4 and meta["dropped_excluded"] == 0 and len(meta["sha256"]) == 64
    other = _self_file(tmp_path / "other.jsonl", [json.loads(x) for x in path.read_text().splitlines()[:3]])
    with pytest.raises(SystemExit, match="other self rows"):
        tr.main([*common, "--self-rows", str(other), "--resume"])
    tr.main([*common, "--self-rows", str(path), "--resume"])
    assert [json.loads(x)["step"] for x in (tmp_path / "r" / "log.jsonl").read_text().splitlines()] == [1, 2, 3]
