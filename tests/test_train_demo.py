"""Tests of the demo-model training recipe (recipes/train_demo) and of the shipped demo checkpoints.

Tokenizer round trip and chat template; the LLaDA SFT masking objective (prompt never masked, 1/p weighting,
Dream's shift); a few steps on a tiny model lower the loss; an interrupted run resumed from its atomic checkpoint
ends bit-identical to an uninterrupted one; the shipped demo models load through ``AutoModel`` and decode.
All on CPU, tiny models, no downloads.
"""

from __future__ import annotations

import importlib.util
import json
import random
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
    tr = _load("train")
    samples = generate_task("waiting_line/copy", COPY_CONFIG, NAMES, n=8, seed=2)
    return [tr.encode_row(tok, build_messages(COPY_CONFIG, s), s["answer"], 24) for s in samples]


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
        _load("train").encode_row(tok, [{"role": "user", "content": "x"}], "Anna " * 40, 8)


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


def _tiny_run_dirs(tmp_path, tok):
    from datasets import Dataset, DatasetDict

    data = _load("data")
    samples = generate_task("waiting_line/copy", COPY_CONFIG, NAMES, n=12, seed=5)
    rws = data.make_rows("waiting_line/copy", samples, COPY_CONFIG, random.Random(0))
    DatasetDict({"train": Dataset.from_list(rws), "eval": Dataset.from_list(rws[:2])}).save_to_disk(tmp_path / "data")
    tok.save_pretrained(tmp_path / "tok")
    return str(tmp_path / "data"), str(tmp_path / "tok")


def test_resume_from_checkpoint_is_exact(tok, tmp_path):
    from safetensors.torch import load_file

    tr = _load("train")
    data_dir, tok_dir = _tiny_run_dirs(tmp_path, tok)
    common = ["--data", data_dir, "--tokenizer", tok_dir, "--d-model", "32", "--n-layers", "1", "--n-heads", "2"]
    common += ["--mlp-hidden", "64", "--steps", "4", "--batch-size", "4", "--save-every", "2", "--eval-every", "0"]
    common += ["--warmup", "1", "--threads", "1"]
    tr.main([*common, "--out", str(tmp_path / "a")])
    tr.main([*common, "--out", str(tmp_path / "b"), "--stop-after", "2"])
    ckpts = tmp_path / "b" / "checkpoints"
    assert (ckpts / "latest").read_text() == "step-0000002"
    assert not list(ckpts.glob(".tmp*"))  # written to a temporary directory, then renamed into place
    assert json.loads((ckpts / "step-0000002" / "trainer_state.json").read_text())["step"] == 2
    assert not (tmp_path / "b" / "export").exists()
    tr.main([*common, "--out", str(tmp_path / "b"), "--resume"])
    a = load_file(tmp_path / "a" / "export" / "model.safetensors")
    b = load_file(tmp_path / "b" / "export" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert sorted(p.name for p in ckpts.glob("step-*")) == ["step-0000002", "step-0000004"]
    cfg = json.loads((tmp_path / "a" / "export" / "config.json").read_text())
    assert cfg["model_type"] == "llada" and cfg["mask_token_id"] == tok.mask_token_id == 2
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
