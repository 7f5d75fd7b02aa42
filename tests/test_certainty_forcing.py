"""Certainty-forcing distillation recipe (recipes/certainty_forcing): masking views, the loss and its normalisation,
LoRA targets and merging, training lowers the loss, and interrupt + resume is bitwise identical."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from checkpoints import EOS, MASK, write_tokenizer
from conftest import SHARED_DATA
from safetensors.torch import load_file

import dlm_decode
from recipes.certainty_forcing import train as cf_train
from recipes.certainty_forcing.evaluate import one_per_step, parallel_decoding, threshold_decoding
from recipes.certainty_forcing.lora import LORA_TARGETS, add_lora, export, merge
from recipes.certainty_forcing.losses import certainty_forcing_loss, view_terms
from recipes.certainty_forcing.masking import complementary_views, example_ratios, example_uniforms


def left_padded(prompt_lens, resp_lens, pad=EOS, seed=0):
    """Rows of random ids (never MASK), left-padded, responses right-aligned -> ids, start, length."""
    g = torch.Generator().manual_seed(seed)
    t = max(p + r for p, r in zip(prompt_lens, resp_lens, strict=True))
    ids = torch.full((len(prompt_lens), t), pad)
    for i, (p, r) in enumerate(zip(prompt_lens, resp_lens, strict=True)):
        ids[i, t - p - r :] = torch.randint(3, MASK, (p + r,), generator=g)
    length = torch.tensor(resp_lens)
    return ids, t - length, length


# ------------------------------------------------------------------------------------------------ masking


def test_llada_views_prompt_clean_complement_exact_later_masked():
    ids, start, length = left_padded([5, 9, 3], [64, 32, 40])
    t = ids.shape[1]
    col = torch.arange(t)[None, :]
    resp = (col >= start[:, None]) & (col < (start + length)[:, None])
    seen_blocks = set()
    for s in range(40):
        v = complementary_views(ids, start, length, mask_id=MASK, generator=torch.Generator().manual_seed(s), block=32)
        for noisy in (v.noisy_a, v.noisy_b):
            assert torch.equal(noisy[~resp], ids[~resp])  # prompt and padding never masked
        assert not (v.loss_a & v.loss_b).any()  # each active token masked in exactly one view
        assert torch.equal(v.loss_a | v.loss_b, v.active)
        assert torch.equal(v.noisy_a == MASK, v.loss_a | v.later)
        assert torch.equal(v.noisy_b == MASK, v.loss_b | v.later)
        for i in range(3):
            cols = v.active[i].nonzero().flatten()
            off0, off1 = int(cols[0] - start[i]), int(cols[-1] - start[i]) + 1
            assert off0 % 32 == 0 and off1 - off0 == min(32, int(length[i]) - off0)  # one whole block
            assert len(cols) == off1 - off0  # contiguous
            assert v.later[i].sum() == length[i] - off1  # everything after the block is masked, in both views
            before = resp[i] & (col[0] < cols[0])
            assert torch.equal(v.noisy_a[i][before], ids[i][before])  # earlier blocks clean
            seen_blocks.add((i, off0 // 32))
    # every non-empty block is drawn, including the partial last one of a 40-token response; never an empty one
    assert seen_blocks == {(0, 0), (0, 1), (1, 0), (2, 0), (2, 1)}


def test_dream_views_cover_the_whole_response():
    ids, start, length = left_padded([5, 9], [64, 32])
    v = complementary_views(ids, start, length, mask_id=MASK, generator=torch.Generator().manual_seed(0), semi_ar=False)
    col = torch.arange(ids.shape[1])[None, :]
    resp = (col >= start[:, None]) & (col < (start + length)[:, None])
    assert torch.equal(v.active, resp) and not v.later.any()
    assert torch.equal(v.loss_a | v.loss_b, resp) and not (v.loss_a & v.loss_b).any()
    assert torch.equal(v.noisy_a[~resp], ids[~resp]) and torch.equal(v.noisy_b[~resp], ids[~resp])
    ratio = v.loss_a.sum() / resp.sum()
    assert 0.35 < float(ratio) < 0.65


def test_masks_depend_on_the_example_not_on_padding():
    ids, start, length = left_padded([5, 9, 3], [64, 32, 40])
    t = ids.shape[1]
    u = example_uniforms(3, 7, [10, 11, 12], start, length, t)
    batch = complementary_views(ids, start, length, mask_id=MASK, uniforms=u)
    for i in range(3):
        row = ids[i : i + 1, int(start[i]) - 1 :]  # one prompt token of context is enough
        s1, n1 = torch.tensor([1]), length[i : i + 1]
        alone = complementary_views(
            row, s1, n1, mask_id=MASK, uniforms=example_uniforms(3, 7, [10 + i], s1, n1, row.shape[1])
        )
        assert torch.equal(alone.loss_a[0, 1:], batch.loss_a[i, int(start[i]) :])


def test_per_row_ratios_mask_each_row_at_its_own_rate():
    # Dream layout (whole response active), responses of 400 tokens so a row's share of masked tokens is near its ratio
    ids, start, length = left_padded([5, 9, 3], [400, 400, 400])
    u = example_uniforms(1, 2, [0, 1, 2], start, length, ids.shape[1])
    ratios = torch.tensor([0.1, 0.5, 0.95])
    v = complementary_views(ids, start, length, mask_id=MASK, uniforms=u, semi_ar=False, ratio=ratios)
    share = v.loss_a.sum(1) / 400.0
    assert torch.allclose(share, ratios, atol=0.06), share
    assert torch.equal(v.loss_a | v.loss_b, v.active) and not (v.loss_a & v.loss_b).any()
    # a row at ratio r is masked exactly where the same draws are below r, whatever the other rows' ratios
    fixed = complementary_views(ids, start, length, mask_id=MASK, uniforms=u, semi_ar=False, ratio=0.95)
    assert torch.equal(v.loss_a[2], fixed.loss_a[2]) and not torch.equal(v.loss_a[0], fixed.loss_a[0])
    with pytest.raises(ValueError, match="one per row"):
        complementary_views(ids, start, length, mask_id=MASK, uniforms=u, ratio=torch.tensor([0.5, 0.5]))
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        complementary_views(ids, start, length, mask_id=MASK, uniforms=u, ratio=torch.tensor([0.5, 1.0, 0.5]))


def test_example_ratios_are_uniform_in_the_range_and_reproducible():
    r = example_ratios(0, 5, list(range(2000)), 0.5, 0.99)
    assert r.min() >= 0.5 and r.max() <= 0.99
    assert abs(float(r.mean()) - 0.745) < 0.01  # the middle of the range
    assert torch.equal(r[[7, 3]], example_ratios(0, 5, [7, 3], 0.5, 0.99))  # per example, not per batch position
    assert not torch.equal(r[:10], example_ratios(0, 6, list(range(10)), 0.5, 0.99))  # a new draw every step
    with pytest.raises(ValueError, match="low <= high"):
        example_ratios(0, 0, [1], 0.9, 0.5)


# ------------------------------------------------------------------------------------------------ loss


def test_loss_on_hand_built_logits():
    # 1 row, 5 positions, vocab 4; loss positions 1, 2, 3; position 4 is not masked, position 0 is prompt
    logits = torch.tensor(
        [
            [
                [9.0, 0, 0, 0],
                [2.0, 1.0, 0.0, 0.0],  # target 0, argmax 0 -> correct
                [0.0, 3.0, 1.0, 0.0],  # target 2, argmax 1 -> wrong: CE only
                [0.5, 0.0, 0.0, 1.5],  # target 3, argmax 3 -> correct
                [0.0, 0.0, 0.0, 50.0],  # not a loss position
            ]
        ]
    )
    targets = torch.tensor([[0, 0, 2, 3, 1]])
    mask = torch.tensor([[False, True, True, True, False]])

    def ce(z, y):
        return math.log(sum(math.exp(v) for v in z)) - z[y]

    def ent(z, temp=0.5):
        e = [math.exp(v / temp) for v in z]
        p = [x / sum(e) for x in e]
        return -sum(q * math.log(q) for q in p)

    rows = logits[0].tolist()
    want_ce = (ce(rows[1], 0) + ce(rows[2], 2) + ce(rows[3], 3)) / 3
    want_ent = (ent(rows[1]) + ent(rows[3])) / 2  # only the correctly predicted masked tokens
    terms = view_terms(logits, targets, mask, temperature=0.5)
    assert terms.ce.item() == pytest.approx(want_ce, rel=1e-6)
    assert terms.entropy.item() == pytest.approx(want_ent, rel=1e-6)
    assert terms.n_masked.item() == 3 and terms.n_correct.item() == 2
    # two views: the complement (position 2 only, wrong) adds CE and no entropy
    mask_b = torch.tensor([[False, False, True, False, False]])
    loss, st = certainty_forcing_loss(logits, logits, targets, mask, mask_b, beta=2.0)
    assert loss.item() == pytest.approx(want_ce + ce(rows[2], 2) + 2.0 * want_ent, rel=1e-6)
    # Dream: logits for token i are read at i - 1
    shifted = torch.cat([logits[:, 1:], logits[:, :1]], 1)
    assert view_terms(shifted, targets, mask, logit_shift=1).ce.item() == pytest.approx(want_ce, rel=1e-6)


def reference_loss(la, lb, y, ma, mb, beta, temperature=0.5):
    """dParallel's compute_loss at batch 1, written out as in the reference (log(p + 1e-12))."""
    total = 0.0
    for z, m in ((la, ma), (lb, mb)):
        ce = torch.nn.functional.cross_entropy(z[m], y[m], reduction="sum") / m.sum() if m.any() else 0.0
        p = torch.softmax(z / temperature, -1)
        h = -(p * torch.log(p + 1e-12)).sum(-1)
        correct = (z.argmax(-1) == y) & m
        e = (h * correct).sum() / correct.sum().clamp(min=1) if correct.any() else 0.0
        total = total + ce + beta * e
    return torch.as_tensor(total)


@pytest.mark.parametrize("shift", [0, 1])
def test_per_example_loss_is_batch_size_invariant(shift):
    ids, start, length = left_padded([5, 9, 3], [64, 32, 40])
    b, t = ids.shape
    v = complementary_views(ids, start, length, mask_id=MASK, generator=torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(2)
    la, lb = torch.randn(b, t, 16, generator=g) * 3, torch.randn(b, t, 16, generator=g) * 3
    y = ids % 16
    la[0, :, 3] += 6 * (y[0] == 3)  # make some predictions correct so the entropy term is not empty
    la[0] = la[0].scatter_add(-1, y[0, :, None], torch.full((t, 1), 5.0))
    batch, _ = certainty_forcing_loss(la, lb, y, v.loss_a, v.loss_b, beta=2.0, logit_shift=shift)
    for i in range(b):
        s = int(start[i]) - 1  # the unpadded row (plus one prompt token)
        z_a, z_b = la[i, s:], lb[i, s:]
        if shift:  # token j's logits sit at j - 1 in the raw output
            z_a, z_b = z_a[:-1], z_b[:-1]
            yy, ma, mb = y[i, s + 1 :], v.loss_a[i, s + 1 :], v.loss_b[i, s + 1 :]
        else:
            yy, ma, mb = y[i, s:], v.loss_a[i, s:], v.loss_b[i, s:]
        alone, _ = certainty_forcing_loss(z_a[None], z_b[None], yy[None], ma[None], mb[None], beta=2.0)
        assert alone.item() == pytest.approx(batch[i].item(), rel=1e-6)
        assert reference_loss(z_a, z_b, yy, ma, mb, 2.0).item() == pytest.approx(batch[i].item(), rel=1e-5)


# ------------------------------------------------------------------------------------------------ model fixtures


def with_tokenizer(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    write_tokenizer(dst)
    return dst


@pytest.fixture(scope="module")
def llada_tok_dir(llada_dir, tmp_path_factory):
    return with_tokenizer(llada_dir, tmp_path_factory.mktemp("cf") / "llada")


@pytest.fixture(scope="module")
def dream_tok_dir(dream_dir, tmp_path_factory):
    return with_tokenizer(dream_dir, tmp_path_factory.mktemp("cf") / "dream")


def write_trajectories(path: Path, n: int = 6, seed: int = 0) -> Path:
    """Fake trajectories over the tiny vocabulary: the response copies the prompt (something learnable)."""
    g = torch.Generator().manual_seed(seed)
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "train.jsonl", "w") as f:
        for i in range(n):
            p = torch.randint(6, 40, (4 + i % 3,), generator=g).tolist()
            gl = 64 if i % 2 else 32
            resp = (p * gl)[: gl - 8] + [2] + [EOS] * 7
            f.write(json.dumps({"task": "toy", "prompt_ids": p, "response_ids": resp, "text": ""}) + "\n")
    return path


# ------------------------------------------------------------------------------------------------ LoRA


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_lora_targets_and_merge(arch, llada_tok_dir, dream_tok_dir, tmp_path):
    src = {"llada": llada_tok_dir, "dream": dream_tok_dir}[arch]
    model, tok = dlm_decode.load_model(src)
    base_keys = set(model.state_dict())
    n_layers = model.config.num_hidden_layers if arch == "dream" else model.config.n_layers
    peft_model = add_lora(model, rank=4)
    wrapped = {n for n, m in peft_model.named_modules() if hasattr(m, "lora_A")}
    wrapped = {n.removeprefix("base_model.model.") for n in wrapped}
    if arch == "llada":
        names = ("q_proj", "k_proj", "v_proj", "attn_out", "ff_proj", "up_proj", "ff_out")
        want = {f"model.transformer.blocks.{i}.{p}" for i in range(n_layers) for p in names}
        assert "model.transformer.ff_out" not in wrapped  # the LM head shares the name ff_out: must stay frozen
    else:
        names = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
        names += ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
        want = {f"model.layers.{i}.{p}" for i in range(n_layers) for p in names}
    assert wrapped == want
    assert LORA_TARGETS[arch]
    assert all(("lora_" in n) == p.requires_grad for n, p in peft_model.named_parameters())
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # B starts at zero (a no-op adapter); make the adapters matter
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    x = torch.tensor([[3, 7, 9, MASK, MASK, 12, MASK, 5]])
    peft_logits = peft_model(input_ids=x).logits
    base_logits = dlm_decode.load_model(src)[0](x).logits
    assert not torch.allclose(peft_logits, base_logits, atol=1e-3)
    merged = merge(peft_model)
    assert set(merged.state_dict()) == base_keys  # official parameter names, no adapter left
    torch.testing.assert_close(merged(x).logits, peft_logits, atol=1e-5, rtol=1e-5)
    export(merged, tok, tmp_path / "export")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (tmp_path / "export").iterdir()}
    reloaded, tok2 = dlm_decode.load_model(tmp_path / "export")
    assert tok2 is not None
    torch.testing.assert_close(reloaded(x).logits, peft_logits, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------ training


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_gradient_is_the_same_for_any_micro_batch(arch, llada_tok_dir, dream_tok_dir, tmp_path):
    src = {"llada": llada_tok_dir, "dream": dream_tok_dir}[arch]
    rows = cf_train.load_trajectories(write_trajectories(tmp_path, n=3) / "train.jsonl")
    model, tok = dlm_decode.load_model(src)
    kw = dict(seed=0, step=5, mask_id=MASK, pad_id=EOS, arch=arch, beta=2.0)

    def grads(chunks):
        model.zero_grad()
        for ex in chunks:
            per_ex, _ = cf_train.example_losses(model, [rows[i] for i in ex], ex, **kw)
            (per_ex.sum() / len(rows)).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    one = grads([[0, 1, 2]])
    three = grads([[0], [1], [2]])
    torch.testing.assert_close(one, three, atol=1e-6, rtol=1e-4)


def train_args(model_dir, traj, out, *extra):
    return [
        "--model", str(model_dir), "--traj", str(traj), "--out", str(out), "--lr", "1e-2", "--batch-size", "3",
        "--micro-batch-size", "1", "--save-every", "2", "--lora-rank", "4", "--seed", "1", *extra,
    ]  # fmt: skip


def test_training_lowers_the_loss(llada_tok_dir, tmp_path):
    traj = write_trajectories(tmp_path / "traj", n=3)
    extra = []
    if (SHARED_DATA / "waiting_line" / "copy.jsonl").is_file():  # exercise the periodic evaluation too
        sample = json.loads((SHARED_DATA / "waiting_line" / "copy.jsonl").read_text().splitlines()[0])
        row = {"task": "waiting_line/copy", "sample": json.dumps(sample), "messages": "[]", "max_new_tokens": 32}
        (traj / "heldout.jsonl").write_text(json.dumps(row) + "\n")
        extra = ["--eval-every", "8", "--eval-per-task", "1", "--data", str(SHARED_DATA)]
    summary = cf_train.main(train_args(llada_tok_dir, traj, tmp_path / "run", "--steps", "8", *extra))
    rows = cf_train.load_trajectories(traj / "train.jsonl")
    kw = dict(seed=9, step=0, mask_id=MASK, pad_id=EOS, arch="llada", beta=2.0)
    with torch.no_grad():
        before = cf_train.example_losses(dlm_decode.load_model(llada_tok_dir)[0], rows, [0, 1, 2], **kw)[0].mean()
        after = cf_train.example_losses(dlm_decode.load_model(tmp_path / "run" / "export")[0], rows, [0, 1, 2], **kw)
    assert after[0].mean() < 0.8 * before
    log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == list(range(1, 9))
    if extra:
        evals = [r for r in log if "eval" in r]
        assert [r["step"] for r in evals] == [0, 8] and summary["eval"]["tasks"]["waiting_line/copy"]["nfe"] >= 1


def test_ratio_range_draws_a_ratio_per_example(llada_tok_dir, tmp_path):
    traj = write_trajectories(tmp_path / "traj", n=3)
    rows = cf_train.load_trajectories(traj / "train.jsonl")
    model = dlm_decode.load_model(llada_tok_dir)[0]
    kw = dict(seed=9, step=4, mask_id=MASK, pad_id=EOS, arch="llada", beta=2.0)
    with torch.no_grad():
        fixed = cf_train.example_losses(model, rows, [0, 1, 2], ratio=0.9, **kw)[0]
        ranged = cf_train.example_losses(model, rows, [0, 1, 2], ratio_range=(0.9, 0.9), **kw)[0]
        wide = cf_train.example_losses(model, rows, [0, 1, 2], ratio_range=(0.5, 0.99), **kw)[0]
        shuffled = [rows[i] for i in (2, 0, 1)]
        again = cf_train.example_losses(model, shuffled, [2, 0, 1], ratio_range=(0.5, 0.99), **kw)[0]
    assert torch.allclose(fixed, ranged)  # a one-point range is that fixed ratio
    assert not torch.allclose(fixed, wide)
    assert torch.allclose(again, wide[[2, 0, 1]], atol=1e-6)  # the ratio follows the example, not its batch slot


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--ratio-range", "0.5", "1"], "--ratio-range LOW HIGH must satisfy 0 < LOW <= HIGH < 1"),
        (["--ratio-range", "0.8", "0.6"], "--ratio-range LOW HIGH must satisfy"),
        (["--ratio", "1.5"], r"--ratio must lie in \(0, 1\)"),
    ],
)
def test_bad_mask_ratio_options_are_usage_errors(extra, message, capsys):
    with pytest.raises(SystemExit) as e:
        cf_train.parse_args(["--model", "m", "--traj", "t", "--out", "o", *extra])
    assert e.value.code == 2 and re.search(message, capsys.readouterr().err)


def test_fewer_trajectories_than_a_batch_is_a_clear_error_before_loading(llada_tok_dir, tmp_path, monkeypatch):
    # 2 verified decodes at --batch-size 3: no full batch in an epoch (this used to divide by zero at step 1)
    traj = write_trajectories(tmp_path / "traj", n=2)

    def boom(*a, **k):
        raise AssertionError("the model was loaded before the input error")

    monkeypatch.setattr(dlm_decode, "load_model", boom)
    with pytest.raises(ValueError, match=r"train\.jsonl: 2 trajectories, fewer than --batch-size 3"):
        cf_train.main(train_args(llada_tok_dir, traj, tmp_path / "run", "--steps", "2"))
    assert not (tmp_path / "run" / "log.jsonl").exists()


def test_a_missing_parallelbench_directory_is_a_clear_error_before_loading(llada_tok_dir, tmp_path, monkeypatch):
    from recipes.certainty_forcing import trajectories

    def boom(*a, **k):
        raise AssertionError("the model was loaded before the input error")

    monkeypatch.setattr(dlm_decode, "load_model", boom)
    monkeypatch.delenv("DLM_PARALLELBENCH_DATA", raising=False)
    traj = write_trajectories(tmp_path / "traj", n=3)
    with pytest.raises(ValueError, match=r"no ParallelBench data: pass --data DIR .* or set \$DLM_PARALLELBENCH_DATA"):
        cf_train.main(train_args(llada_tok_dir, traj, tmp_path / "run", "--eval-every", "2"))
    with pytest.raises(ValueError, match=r"no ParallelBench data"):
        trajectories.main(["--model", str(llada_tok_dir), "--out", str(tmp_path / "t")])
    monkeypatch.setenv("DLM_PARALLELBENCH_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match=r"\$DLM_PARALLELBENCH_DATA: ParallelBench data directory .*nowhere"):
        trajectories.main(["--model", str(llada_tok_dir), "--out", str(tmp_path / "t")])
    assert cf_train.parse_args(["--model", "m", "--traj", "x/traj-llada"]).out == "runs/certainty_forcing/llada"


def test_interrupt_and_resume_is_bitwise_identical(dream_tok_dir, tmp_path):
    traj = write_trajectories(tmp_path / "traj", n=7)  # 2 batches of 3 per epoch (1 row dropped): crosses epochs
    cf_train.main(train_args(dream_tok_dir, traj, tmp_path / "full", "--steps", "5"))
    assert cf_train.main(train_args(dream_tok_dir, traj, tmp_path / "cut", "--steps", "5", "--stop-after", "3")) == {
        "step": 3
    }
    assert not (tmp_path / "cut" / "export").exists()
    cf_train.main(train_args(dream_tok_dir, traj, tmp_path / "cut", "--steps", "5", "--resume"))
    a = load_file(str(tmp_path / "full" / "export" / "model.safetensors"))
    b = load_file(str(tmp_path / "cut" / "export" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    base = load_file(str(dream_tok_dir / "model.safetensors"))
    assert any(not torch.equal(a[k], base[k]) for k in a)  # training did change the weights
    logs = [(tmp_path / d / "log.jsonl").read_text() for d in ("full", "cut")]
    strip = [[{k: v for k, v in json.loads(x).items() if k != "elapsed"} for x in s.splitlines()] for s in logs]
    assert strip[0] == strip[1]


@pytest.mark.skipif(not (SHARED_DATA / "waiting_line").is_dir(), reason="needs the ParallelBench task configs")
@pytest.mark.parametrize("accept", [True, False])
def test_trajectories_keep_only_verified_answers(accept, llada_tok_dir, tmp_path, monkeypatch):
    from recipes.certainty_forcing import trajectories

    calls = []

    def fake_score(task, text, sample):
        calls.append(task)
        return {"score": 1.0 if accept else 0.0, "score_strict": 0.0}

    monkeypatch.setattr(trajectories, "score_sample", fake_score)
    out = tmp_path / "traj"
    argv = ["--model", str(llada_tok_dir), "--out", str(out), "--data", str(SHARED_DATA), "--n-per-task", "3"]
    trajectories.main([*argv, "--heldout-per-task", "2", "--tasks", "waiting_line/copy", "waiting_line/sort"])
    rows = trajectories.read_jsonl(out / "train.jsonl")
    held = trajectories.read_jsonl(out / "heldout.jsonl")
    meta = json.loads((out / "meta.json").read_text())
    assert len(calls) == 6 and len(held) == 4 and meta["prompts"] == 6
    assert len(rows) == (6 if accept else 0) == meta["kept"]
    tok = dlm_decode.load_model(llada_tok_dir)[1]
    for r in rows:
        assert len(r["response_ids"]) == 32 and MASK not in r["response_ids"]
        assert r["prompt_ids"][0] == tok.bos_token_id
    # held-out prompts are not training prompts
    train_prompts = {tuple(r["prompt_ids"]) for r in rows}
    for h in held:
        ids = tok.apply_chat_template(json.loads(h["messages"]), add_generation_prompt=True, tokenize=False)
        assert tuple(tok(ids, add_special_tokens=False)["input_ids"]) not in train_prompts


@pytest.mark.skipif(not (SHARED_DATA / "waiting_line").is_dir(), reason="needs the ParallelBench task configs")
def test_trajectories_with_eta_keep_the_parallel_answer_and_fall_back_one_token_per_step(
    llada_tok_dir, tmp_path, monkeypatch
):
    from recipes.certainty_forcing import trajectories

    calls = []

    def fake_score(task, text, sample):  # 3 prompts: the parallel pass accepts the first, the fallback its first
        calls.append(text)
        return {"score": 1.0 if len(calls) in (1, 4) else 0.0, "score_strict": 0.0}

    monkeypatch.setattr(trajectories, "score_sample", fake_score)
    out = tmp_path / "traj"
    argv = ["--model", str(llada_tok_dir), "--out", str(out), "--data", str(SHARED_DATA), "--n-per-task", "3"]
    trajectories.main([*argv, "--heldout-per-task", "1", "--tasks", "waiting_line/copy", "--eta", "0.5"])
    rows = trajectories.read_jsonl(out / "train.jsonl")
    meta = json.loads((out / "meta.json").read_text())
    assert len(calls) == 5  # 3 parallel decodes, then one token per step for the 2 it failed
    assert [r["decoder"] for r in rows] == ["entropy_threshold", "one_per_step"]
    assert meta["tasks"]["waiting_line/copy"]["from_entropy_threshold"] == 1 and meta["kept"] == 2
    assert meta["first_decoder"] == {"sampler": "entropy_threshold", "eta": 0.5}
    model, _ = dlm_decode.load_model(llada_tok_dir)
    for r, args in zip(rows, (parallel_decoding(0.5), one_per_step(32)), strict=True):
        again = dlm_decode.generate(model, [r["prompt_ids"]], gen_length=32, **args)
        assert again.rows[0].generated_ids == r["response_ids"]  # each row is the answer of the decoder it names
    other = dlm_decode.generate(model, [rows[0]["prompt_ids"]], gen_length=32, **one_per_step(32))
    assert other.rows[0].generated_ids != rows[0]["response_ids"]  # (the two decoders differ on this prompt)
    with pytest.raises(ValueError, match="--eta must be a finite number > 0"):
        trajectories.main([*argv, "--eta", "0"])


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="official ParallelBench data not present")
def test_one_per_step_reference_decodes_each_task_at_its_own_length():
    from recipes.certainty_forcing.evaluate import official_tasks, one_per_step_results

    model, tok = dlm_decode.load_model("demo-llada")
    tasks = official_tasks(SHARED_DATA, ["waiting_line/copy", "puzzle/sudoku_n4_12"], limit=2)
    res = one_per_step_results(model, tok, tasks, batch_size=2)
    copy, sudoku = res["tasks"]["waiting_line/copy"], res["tasks"]["puzzle/sudoku_n4_12"]
    assert (copy["gen_length"], copy["nfe"], sudoku["gen_length"], sudoku["nfe"]) == (32, 32, 64, 64)
    assert list(res["tasks"]) == ["waiting_line/copy", "puzzle/sudoku_n4_12"]  # the order asked for
    assert copy["score"] == 100.0  # the shipped model copies these (a real decode, not a read of scores.json)
    assert res["nfe"] == 48 and res["score"] == pytest.approx((copy["score"] + sudoku["score"]) / 2, abs=1e-3)


def test_equal_score_ratios_by_hand():
    from recipes.certainty_forcing.evaluate import equal_score_ratios, equal_score_table

    def pt(score, nfe):
        return {"score": score, "nfe": nfe, "tokens_per_step": 32 / nfe}

    base = {"path": "b", "eta=0.1": pt(96.7, 4.85), "eta=0.5": pt(93.0, 3.82), "eta=1": pt(77.3, 2.66)}
    other = {"eta=0.1": pt(94.2, 4.02), "eta=0.2": pt(92.4, 3.50), "eta=1": pt(77.0, 1.90), "one_per_step": pt(99, 32)}
    rows = equal_score_ratios(base, other)
    assert [r["base"] for r in rows] == ["eta=0.1", "eta=0.5", "eta=1"]
    # 96.7: nothing of the other scores >= 95.7
    assert rows[0]["other"] is None and rows[0]["ratio"] is None
    # 93.0: 94.2 @ 4.02 and 92.4 @ 3.50 are both within a point; the cheaper one counts: 3.50 / 3.82
    assert rows[1]["other"] == "eta=0.2" and rows[1]["ratio"] == pytest.approx(0.916, abs=1e-3)
    # 77.3: 77.0 @ 1.90 (0.3 below) is within a point: 1.90 / 2.66; the one-token-per-step point is never used
    assert rows[2]["other"] == "eta=1" and rows[2]["ratio"] == pytest.approx(0.714, abs=1e-3)
    table = equal_score_table(rows, "base", "cf")
    assert "| eta=1 | 77.3 / 2.66 | eta=1 | 77.0 / 1.90 | 0.71x |" in table and "none within 1 point" in table
    # a base point beaten by another base point on score and NFE costs what the better one costs: 92.0 at 4.20 is
    # reached by 93.0 at 3.82, so the other's 3.50 (92.4, within a point) is held against 3.82, not 4.20
    rows = equal_score_ratios({**base, "eta=0.3": pt(92.0, 4.20)}, other)
    slow = next(r for r in rows if r["base"] == "eta=0.3")
    assert slow["base_nfe"] == 3.82 and slow["ratio"] == pytest.approx(3.50 / 3.82, abs=1e-3)


def test_reuse_takes_an_earlier_result_only_when_it_matches(tmp_path):
    from types import SimpleNamespace

    from recipes.certainty_forcing import evaluate

    tasks = [SimpleNamespace(name="waiting_line/copy", samples=[1, 2, 3])]
    res = {"path": "p", "eta=0.5": {"score": 90.0, "nfe": 2.0, "tasks": {"waiting_line/copy": {"n": 3}}}}
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"base": res}))
    name, got = evaluate.reuse_results(f"{f}:base", tasks, [0.5])
    assert name == "base" and got["eta=0.5"]["score"] == 90.0 and got["reused_from"] == f"{f}:base"
    assert evaluate.reuse_results(f"before={f}:base", tasks, [0.5])[0] == "before"
    with pytest.raises(ValueError, match="holds \\['base'\\], not 'distilled'"):
        evaluate.reuse_results(f"{f}:distilled", tasks, [0.5])
    with pytest.raises(ValueError, match="no eta=0.2"):
        evaluate.reuse_results(f"{f}:base", tasks, [0.2])
    with pytest.raises(ValueError, match="other tasks or sample counts"):
        evaluate.reuse_results(f"{f}:base", [SimpleNamespace(name="waiting_line/copy", samples=[1, 2])], [0.5])
    with pytest.raises(ValueError, match="no such file"):
        evaluate.reuse_results(f"{tmp_path / 'none.json'}:base", tasks, [0.5])
    with pytest.raises(ValueError, match="model names must differ"):
        evaluate.main(["--reuse", f"{f}:base", "--model", "base=x", "--data", str(tmp_path)])
    with pytest.raises(ValueError, match="model names must differ"):
        evaluate.main(["--reuse", f"{f}:base", "--reuse", f"base={f}:other", "--data", str(tmp_path)])


def test_curves_read_the_periodic_evaluations_and_plot(tmp_path):
    from recipes.certainty_forcing import curves

    run = tmp_path / "run"
    run.mkdir()
    recs = [
        {"step": 0, "eval": {"score": 92.7, "nfe": 3.78}},
        {"step": 1, "loss": 0.3},
        {"step": 2, "eval": {"score": 90.6, "nfe": 3.20}},
        {"step": 1, "eval": {"score": 91.0, "nfe": 3.50}},  # out of order: sorted by step
    ]
    (run / "log.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    out = curves.main(["--run", f"a={run}", "--out", str(tmp_path / "c.png"), "--jsonl", str(tmp_path / "c.jsonl")])
    assert out["a"] == [
        {"step": 0, "score": 92.7, "nfe": 3.78},
        {"step": 1, "score": 91.0, "nfe": 3.50},
        {"step": 2, "score": 90.6, "nfe": 3.20},
    ]
    assert (tmp_path / "c.png").stat().st_size > 1000
    lines = [json.loads(x) for x in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert lines[2] == {"run": "a", "step": 2, "score": 90.6, "nfe": 3.20}
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "log.jsonl").write_text(json.dumps({"step": 1, "loss": 0.1}) + "\n")
    with pytest.raises(ValueError, match="no evaluations"):
        curves.main(["--run", f"e={tmp_path / 'empty'}"])
    with pytest.raises(ValueError, match="no log.jsonl"):
        curves.main(["--run", f"x={tmp_path}"])
    with pytest.raises(ValueError, match="names must differ"):
        curves.main(["--run", f"a={run}", "--run", f"a={run}"])


def test_evaluate_plots_score_against_parallelism_and_nfe(tmp_path):
    from recipes.certainty_forcing.evaluate import plot

    def pt(score, nfe):
        return {"score": score, "nfe": nfe, "tokens_per_step": 32 / nfe}

    res = {
        "base": {"path": "b", "eta=0.1": pt(96.7, 4.85), "eta=1": pt(77.3, 2.66), "one_per_step": pt(96.8, 32)},
        "cf": {"eta=0.1": pt(95.9, 4.10), "eta=1": pt(78.0, 2.01), "equal_score_vs_base": []},
    }
    for x in ("tokens_per_step", "nfe"):
        plot(res, tmp_path / f"{x}.png", x=x)
        assert (tmp_path / f"{x}.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="x must be"):
        plot(res, tmp_path / "bad.png", x="seconds")


def test_decode_states_repair_a_copied_list_at_its_last_open_slot():
    """replace_random decoded as a plain copy, left to right: the last state a valid answer still agrees with is the
    one before the last person's first name is committed; its target writes the word there, and that person's slots
    (with everything after them in its block) are what it scores. A verified trajectory keeps its own answer."""
    import random as _random
    from types import SimpleNamespace

    from recipes.certainty_forcing.trajectories import answer_canvases, decode_states

    tok = dlm_decode.load_model("demo-llada2")[1]
    people, word = ["Paul Payne", "Robert Riley", "Peter Stone"], "Juan Torres"
    sample = {"answer": {"input": people, "word": word}}
    row = {"task": "waiting_line/replace_random", "sample": json.dumps(sample)}
    copied = answer_canvases(tok, [json.dumps(people)], 32)[0]
    prompt = list(range(100, 140))  # 40 prompt slots: the response's grid blocks are slots 0-23 and 24-31 (block 32)
    res = SimpleNamespace(prompt_ids=prompt, generated_ids=copied.tolist())
    trace = torch.arange(32)  # committed left to right
    got = decode_states(row, res, trace, False, tok=tok, block=32, n=3, rng=_random.Random(0))
    want = answer_canvases(tok, [json.dumps(people[:2] + [word])], 32)[0]
    open_slot = int((want != copied).nonzero()[0])  # the third person's first name
    assert len(got) == 3 and all(r["repaired"] and r["response_ids"] == want.tolist() for r in got)
    last = got[-1]
    assert last["masked"] == list(range(open_slot, 32)) and last["scored"] == list(range(open_slot, 24))
    assert last["next"] == [open_slot]  # the slot the copy went wrong in: the only one state_scoring next trains
    assert all(r["masked"][0] < open_slot and r["next"] == [r["masked"][0]] for r in got[:-1])
    assert json.loads(last["text"]) == people[:2] + [word]
    mine = decode_states(row, SimpleNamespace(prompt_ids=prompt, generated_ids=want.tolist()), trace, True,
                         tok=tok, block=32, n=2, rng=_random.Random(0))  # fmt: skip
    assert len(mine) == 2 and all(not r["repaired"] and r["response_ids"] == want.tolist() for r in mine)


def test_decode_states_under_a_fixed_shuffle_rule_target_the_rules_order():
    """--shuffle-answer rotate: a shuffle trajectory in another valid order is not verified but repaired towards the
    rotated list at its last state that order still agrees with; one that wrote the rotated list keeps its answer;
    every row names the rule, and the rule leaves other tasks' rows unmarked."""
    import random as _random
    from types import SimpleNamespace

    from recipes.certainty_forcing.trajectories import answer_canvases, decode_states

    tok = dlm_decode.load_model("demo-llada2")[1]
    people = ["Paul Payne", "Robert Riley", "Peter Stone", "Juan Torres"]
    row = {"task": "waiting_line/shuffle", "sample": json.dumps({"answer": {"input": people}})}
    rotated, swapped = [*people[1:], people[0]], [people[1], people[0], *people[2:]]
    want = answer_canvases(tok, [json.dumps(rotated)], 48)[0]
    other = answer_canvases(tok, [json.dumps(swapped)], 48)[0]
    prompt, trace = list(range(100, 140)), torch.arange(48)  # committed left to right
    kw = {"tok": tok, "block": 32, "n": 3, "rng": _random.Random(0), "rule": "rotate"}
    got = decode_states(row, SimpleNamespace(prompt_ids=prompt, generated_ids=other.tolist()), trace, True, **kw)
    split = int((want != other).nonzero()[0])  # the first slot where the swap leaves the rotated order
    assert got and all(r["repaired"] and r["response_ids"] == want.tolist() for r in got)
    assert got[-1]["masked"][0] == split and all(r["answer_rule"] == "rotate" for r in got)
    same = decode_states(row, SimpleNamespace(prompt_ids=prompt, generated_ids=want.tolist()), trace, True, **kw)
    assert same and all(not r["repaired"] and r["response_ids"] == want.tolist() for r in same)
    free = decode_states(row, SimpleNamespace(prompt_ids=prompt, generated_ids=other.tolist()), trace, True,
                         **{**kw, "rule": "random"})  # fmt: skip
    assert free and all(not r["repaired"] and "answer_rule" not in r for r in free)  # any valid order is verified


@pytest.mark.skipif(not (SHARED_DATA / "waiting_line").is_dir(), reason="needs the ParallelBench task configs")
@pytest.mark.parametrize("threshold", [None, 0.7])
def test_trajectories_states_are_the_models_own_decoding_states(threshold, tmp_path):
    """--states on demo-llada2: every row's target is an answer the verifier accepts, its visible slots are the
    model's own tokens (one token per step, or the threshold sampler's with --states-threshold), and its scored
    slots are masked ones of one grid block."""
    from recipes.certainty_forcing import trajectories

    out = tmp_path / "states"
    tasks = ["waiting_line/shuffle", "waiting_line/replace_random"]
    argv = ["--model", "demo-llada2", "--out", str(out), "--data", str(SHARED_DATA), "--heldout-per-task", "0"]
    extra = [] if threshold is None else ["--states-threshold", str(threshold)]
    trajectories.main([*argv, "--n-per-task", "6", "--tasks", *tasks, "--states", "2", "--seed", "7", *extra])
    rows = trajectories.read_jsonl(out / "train.jsonl")
    meta = json.loads((out / "meta.json").read_text())
    # seed 7 on the shipped weights (seeds 8-11 have no failed prompt one token per step on them): two rows repaired
    # one token per step and four at 0.7, where some states hold several commits
    kept, repaired = (24, 2) if threshold is None else (20, 4)
    assert meta["states"] == 2 and meta["states_threshold"] == threshold and len(rows) == meta["kept"] == kept
    assert meta["decode"]["sampler"] == ("low_confidence" if threshold is None else "threshold")
    assert sum(r["repaired"] for r in rows) == repaired
    model, tok = dlm_decode.load_model("demo-llada2")
    decoder = one_per_step(32) if threshold is None else threshold_decoding(threshold)
    for r in rows:
        again = dlm_decode.generate(model, [r["prompt_ids"]], gen_length=32, **decoder).rows[0]
        seen = [i for i in range(32) if i not in r["masked"]]
        assert [r["response_ids"][i] for i in seen] == [again.generated_ids[i] for i in seen]
        assert r["next"] and set(r["next"]) <= set(r["scored"]) and (threshold or len(r["next"]) == 1)
        assert r["repaired"] or r["response_ids"] == again.generated_ids
        assert set(r["scored"]) <= set(r["masked"]) and r["scored"]
        assert len({(len(r["prompt_ids"]) + i) // 32 for i in r["scored"]}) == 1
        assert tok.decode(r["response_ids"], skip_special_tokens=True) == r["text"]
    assert threshold is None or any(len(r["next"]) > 1 for r in rows)  # a parallel step commits several slots
    for bad, message in ((["--states", "-1"], ">= 0"), (["--states", "2", "--eta", "0.5"], "drop --eta"),
                         (["--states-threshold", "0.9"], "needs --states"),
                         (["--states", "2", "--states-threshold", "1.5"], r"in \(0, 1\]"),
                         (["--shuffle-answer", "rotate"], "give --states N with it"),
                         (["--states", "2", "--tasks", "puzzle/sudoku_n4_12"], "waiting-line tasks only")):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            trajectories.main([*argv, *bad])
