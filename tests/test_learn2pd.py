"""Learn2PD: the oracle's labels and stuck rule on scripted models, filter training, safetensors round trip, block
length checks, and the recipe end to end on a tiny checkpoint."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from fake import ScriptedModel, peaked

import dlm_decode
from dlm_decode.decode.oracle import oracle_generate
from dlm_decode.samplers.learned_filter import FilterMLP, filter_config, load_filter, save_filter
from dlm_decode.samplers.oracle import Oracle

V, MASK, EOS = 16, 15, 1
RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "learn2pd"


def _recipe(name: str):
    key = f"learn2pd_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, RECIPE / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


def truth(i: int) -> int:
    return 2 + i % 10


def chain_model(n: int, prompt_len: int = 2):
    """Even slots always predict their true token; an odd slot predicts it only once its left neighbour is decoded
    (before that it predicts 12). True predictions are confident, wrong ones are not."""

    def fn(canvas, step):
        b = canvas.shape[0]
        out = torch.zeros(b, canvas.shape[1], V)
        for r in range(b):
            for i in range(n):
                ok = i % 2 == 0 or canvas[r, prompt_len + i - 1] != MASK
                out[r, prompt_len + i] = peaked(truth(i), 0.9 - 0.01 * i) if ok else peaked(12, 0.3)
        return out

    return ScriptedModel(fn, vocab=V, mask_id=MASK, eos_id=EOS)


def test_oracle_commits_exactly_the_correct_slots_and_records_labels():
    ref, out, (conf, label) = oracle_generate(
        chain_model(8), [[3, 4]], record=True, gen_length=8, block_length=4, trace=True
    )
    assert ref.rows[0].generated_ids == [truth(i) for i in range(8)] and ref.nfe == 8
    assert out.rows[0].generated_ids == ref.rows[0].generated_ids
    assert out.nfe == 4  # per block: the even slots, then the odd ones
    assert out.trace[0].tolist() == [0, 1, 0, 1, 2, 3, 2, 3]
    assert label.tolist() == [[1, 0, 1, 0], [1, 1, 1, 1]] * 2
    assert conf.shape == (4, 4) and conf.dtype == torch.float32
    assert conf[0, 0] == pytest.approx(0.9, abs=1e-6) and conf[0, 1] == pytest.approx(0.3, abs=1e-6)


def test_oracle_fills_a_stuck_block_with_the_reference():
    # a reference the model never predicts at slot 1: the block's proposals stop changing, the block is filled
    model = chain_model(4)
    reference = ((truth(0), 9, truth(2), truth(3)),)
    out = dlm_decode.generate(model, [[3, 4]], sampler=Oracle(reference=reference, record=True), gen_length=4,
                              block_length=4, trace=True)  # fmt: skip
    assert out.rows[0].generated_ids == list(reference[0])
    assert out.trace[0].tolist() == [0, 2, 0, 1]  # step 1 commits slot 3; step 2 sees no change and fills slot 1
    assert len(out.scratch["oracle"]["conf"]) == 3
    with pytest.raises(ValueError, match="needs the reference answer"):
        dlm_decode.generate(model, [[3, 4]], sampler=Oracle(), gen_length=4)
    with pytest.raises(ValueError, match="do not have gen_length"):
        dlm_decode.generate(model, [[3, 4]], sampler=Oracle(reference=((1, 2),)), gen_length=4)


def test_oracle_batches_rows_independently(llada):
    prompts = [[5, 9, 17, 3, 40, 22], [7, 2, 33]]
    _, batch, (conf, _) = oracle_generate(llada, prompts, record=True, gen_length=16, block_length=8)
    for i, p in enumerate(prompts):
        _, alone, _ = oracle_generate(llada, [p], gen_length=16, block_length=8)
        assert alone.rows[0].generated_ids == batch.rows[i].generated_ids
        assert alone.rows[0].nfe == batch.rows[i].nfe
    assert conf.shape[1] == 8


def test_fit_filter_lowers_the_loss_and_learns_the_rule():
    fit = _recipe("train_filter")
    g = torch.Generator().manual_seed(0)
    conf = torch.rand(512, 8, generator=g)
    label = (conf > 0.6).float()
    model, hist = fit.fit_filter(conf, label, epochs=400, lr=1e-2)
    assert hist["train_loss"][-1] < 0.6 * hist["train_loss"][0]
    stats = fit.evaluate(model, conf, label, accept=0.9)
    assert stats["precision"] > 0.95 and stats["accept_rate"] > 0.1


def test_filter_round_trip_and_checks(tmp_path):
    f = FilterMLP(8)
    path = save_filter(f, tmp_path / "flt", note="x")
    assert path.name == "flt.safetensors" and (tmp_path / "flt.json").is_file()
    cfg = filter_config(path)
    assert cfg["block_length"] == 8 and cfg["note"] == "x" and cfg["activation"] == "relu"
    g = load_filter(tmp_path / "flt", block_length=8)  # with or without the suffix
    x = torch.rand(5, 8)
    assert torch.equal(f(x), g(x))
    assert sum(p.numel() for p in FilterMLP(32).parameters()) == 2 * (32 * 32 + 32)  # about 2.1k for block 32
    with pytest.raises(ValueError, match="trained for block length 8, but decoding uses block length 32"):
        load_filter(path, block_length=32)
    (tmp_path / "flt.json").write_text(json.dumps({"block_length": 8}))
    with pytest.raises(ValueError, match="is not a learn2pd-filter config"):
        load_filter(path)
    with pytest.raises(ValueError, match="learned filter not found"):
        load_filter(tmp_path / "missing")


def test_recipe_end_to_end_on_a_tiny_checkpoint(llada, llada_dir, tmp_path):
    data, fit = _recipe("oracle_data"), _recipe("train_filter")
    assert len(data.model_sha256(str(llada_dir))) == 64
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["w5 w9 w17", "w7 w2", "w11 w30 w8 w19"]))
    rows = data.load_prompts(prompts, "train", None)
    assert rows[0] == ("w5 w9 w17", None)
    # token-id prompts through collect (the tiny checkpoint has no tokenizer)
    conf, label, stats = data.collect(llada, [([5, 9, 17], None), ([7, 2], 16)], gen_length=8, block_length=8)
    assert conf.shape[1] == 8 and conf.shape[0] == stats["records"] and stats["prompts"] == 2
    assert stats["oracle_nfe"] <= stats["reference_nfe"]
    from safetensors.torch import save_file

    save_file({"conf": conf.repeat(4, 1), "label": label.repeat(4, 1)}, str(tmp_path / "rec.safetensors"))
    stats = fit.main(["--data", str(tmp_path / "rec"), "--out", str(tmp_path / "flt"), "--epochs", "50"])
    assert stats["train_loss_last"] < stats["train_loss_first"]
    out = dlm_decode.generate(llada, [[5, 9, 17]], sampler="learned_filter", gen_length=16, block_length=8,
                              sampler_options={"filter": stats["filter"], "eotp": True})  # fmt: skip
    assert not (out.sequences == llada.mask_token_id).any()


DEMO_DIR = Path(__file__).resolve().parent.parent / "dlm_decode" / "demo_models"


@pytest.mark.parametrize("name", ["demo-llada", "demo-dream"])
def test_shipped_demo_filter_matches_the_shipped_model(name):
    shipped = DEMO_DIR / name
    if not (shipped / "learn2pd_filter.safetensors").is_file():
        pytest.skip(f"no Learn2PD filter shipped with {name}")
    cfg = filter_config(shipped / "learn2pd_filter.safetensors")
    assert cfg["data"]["model_sha256"] == _recipe("oracle_data").model_sha256(str(shipped)), (
        f"the {name} weights changed since its Learn2PD filter was trained; retrain it with "
        f"`bash recipes/learn2pd/ship_demo.sh {name}`"
    )
    model, tok = dlm_decode.load_model(name)
    opts = {"filter": str(shipped / "learn2pd_filter.safetensors"), "eotp": True}
    chat = [{"role": "user", "content": 'Please copy the list exactly:\n["Anna Baker", "Carl Diaz"]\n'}]
    out = dlm_decode.generate(model, [chat], tokenizer=tok, chat=True, sampler="learned_filter",
                              sampler_options=opts, gen_length=32, block_length=32, steps=32)  # fmt: skip
    assert out.nfe < 32 and not (out.sequences == model.mask_token_id).any()
