"""Learn2PD: the oracle's labels and stuck rule on scripted models, filter training, safetensors round trip, block
length checks, and the recipe end to end on a tiny checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fake import ScriptedModel, peaked, step_filter

import dlm_decode
from dlm_decode.decode.oracle import oracle_generate
from dlm_decode.samplers.learned_filter import FilterMLP, filter_config, load_filter, save_filter
from dlm_decode.samplers.oracle import Oracle
from recipes.learn2pd import oracle_data, rounds, train_filter

V, MASK, EOS = 16, 15, 1


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
    fit = train_filter
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
    data, fit = oracle_data, train_filter
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
    assert cfg["data"]["model_sha256"] == oracle_data.model_sha256(str(shipped)), (
        f"the {name} weights changed since its Learn2PD filter was trained; retrain it with "
        f"`bash recipes/learn2pd/ship_demo.sh {name}`"
    )
    model, tok = dlm_decode.load_model(name)
    opts = {"filter": str(shipped / "learn2pd_filter.safetensors"), "eotp": True}
    chat = [{"role": "user", "content": 'Please copy the list exactly:\n["Anna Baker", "Carl Diaz"]\n'}]
    out = dlm_decode.generate(model, [chat], tokenizer=tok, chat=True, sampler="learned_filter",
                              sampler_options=opts, gen_length=32, block_length=32, steps=32)  # fmt: skip
    assert out.nfe < 32 and not (out.sequences == model.mask_token_id).any()


def test_filter_shipped_resolves_to_the_file_beside_the_weights(llada):
    """``filter="shipped"`` decodes exactly as the explicit path of the model's own filter, for either demo model; a
    checkpoint without a filter, or a model not loaded from a directory, is a clear error before any decoding."""
    from dlm_decode.decode.request import check_request
    from dlm_decode.models.llada import LLaDAModelLM

    chat = [{"role": "user", "content": 'Please copy the list exactly:\n["Anna Baker", "Carl Diaz"]\n'}]
    kw = dict(chat=True, sampler="learned_filter", gen_length=32, block_length=32, steps=32)
    for name in ("demo-llada", "demo-dream"):
        if not (DEMO_DIR / name / "learn2pd_filter.safetensors").is_file():
            continue
        model, tok = dlm_decode.load_model(name)
        path = str(DEMO_DIR / name / "learn2pd_filter.safetensors")
        explicit = dlm_decode.generate(
            model, [chat], tokenizer=tok, sampler_options={"filter": path, "eotp": True}, **kw
        )
        shipped = dlm_decode.generate(
            model, [chat], tokenizer=tok, sampler_options={"filter": "shipped", "eotp": True}, **kw
        )
        assert shipped.texts == explicit.texts and shipped.nfe == explicit.nfe < 32
    ids = [[5, 9, 17]]
    with pytest.raises(
        ValueError, match=r'filter="shipped": .* ships no Learn2PD filter \(learn2pd_filter.safetensors\)'
    ):
        dlm_decode.generate(llada, ids, sampler="learned_filter", sampler_options={"filter": "shipped"}, gen_length=8)
    bare = LLaDAModelLM(llada.config.__class__(**{**llada.config.to_dict(), "_name_or_path": ""})).eval()
    with pytest.raises(ValueError, match="was not loaded from a checkpoint directory; give filter=PATH"):
        dlm_decode.generate(bare, ids, sampler="learned_filter", sampler_options={"filter": "shipped"}, gen_length=8)
    # without the model (a sweep's task check), the value waits to be resolved
    req = check_request(None, None, sampler="learned_filter", sampler_options={"filter": "shipped"}, gen_length=8)
    assert req.sampler.filter == "shipped"


# on-policy records (oracle_data.py --policy, train_filter.py with several --data, rounds.py): an extension


def trap_model(prompt_len: int = 2):
    """One block of 4. Slot 0: 2 (0.9). Slot 1: 12 (0.6) while slot 0 is masked, then 3 (0.95). Slot 2: 4 (0.4)
    while slot 1 is masked, 4 (0.8) after slot 1 = 3, 13 (0.45) after any other slot-1 token. Slot 3: 5 (0.2).
    One token per step gives 2 3 4 5; a filter that accepts conf > 0.53 commits slot 1's 12 at the first step."""

    def fn(canvas, step):
        out = torch.zeros(canvas.shape[0], canvas.shape[1], V)
        for r in range(canvas.shape[0]):
            c = canvas[r, prompt_len:]
            out[r, prompt_len] = peaked(2, 0.9)
            out[r, prompt_len + 1] = peaked(3, 0.95) if c[0] != MASK else peaked(12, 0.6)
            if c[1] == MASK:
                out[r, prompt_len + 2] = peaked(4, 0.4)
            else:
                out[r, prompt_len + 2] = peaked(4, 0.8) if c[1] == 3 else peaked(13, 0.45)
            out[r, prompt_len + 3] = peaked(5, 0.2)
        return out

    return ScriptedModel(fn, vocab=V, mask_id=MASK, eos_id=EOS)


def test_policy_records_follow_the_filters_own_trajectory(tmp_path):
    data = oracle_data
    flt = step_filter(tmp_path / "flt", 4, 0.5)
    kw = dict(gen_length=4, block_length=4)
    ref, out, (conf, label) = data.policy_generate(trap_model(), [[3, 4]], policy=flt, **kw)
    assert ref.rows[0].generated_ids == [2, 3, 4, 5]  # y
    # step 1 commits 2 and the wrong 12 (accepted), step 2 the top-1 masked slot (13, after 12), step 3 slot 3
    assert out.rows[0].generated_ids == [2, 12, 13, 5] and out.nfe == 3
    # labels: proposal == y at every block slot, decoded or not (step 2: slot 1 now proposes 3, slot 2 proposes 13)
    assert label.tolist() == [[1, 0, 1, 1], [1, 1, 0, 1], [1, 1, 0, 1]]
    assert conf[:, 1].tolist() == pytest.approx([0.6, 0.95, 0.95], abs=1e-6)
    assert conf[:, 2].tolist() == pytest.approx([0.4, 0.45, 0.45], abs=1e-6)
    # recording leaves the policy's decode unchanged
    plain = dlm_decode.generate(trap_model(), [[3, 4]], sampler="learned_filter", sampler_options={"filter": flt},
                                steps=4, **kw)  # fmt: skip
    assert plain.rows[0].generated_ids == out.rows[0].generated_ids and plain.nfe == out.nfe
    # the oracle never sees slot 2 after a wrong slot 1: its records differ
    _, orc, (_, olabel) = oracle_generate(trap_model(), [[3, 4]], record=True, **kw)
    assert orc.rows[0].generated_ids == [2, 3, 4, 5]
    assert olabel.tolist() == [[1, 0, 1, 1], [1, 1, 1, 1]]
    # until_wrong: the step that commits the wrong 12 is kept, the steps after it are not; the decode is the same
    _, cut, (_, ulabel) = data.policy_generate(trap_model(), [[3, 4]], policy=flt, until_wrong=True, **kw)
    assert cut.rows[0].generated_ids == [2, 12, 13, 5] and ulabel.tolist() == [[1, 0, 1, 1]]


def test_policy_records_of_a_filter_that_accepts_nothing_are_one_token_per_step(tmp_path):
    data = oracle_data
    flt = step_filter(tmp_path / "never", 4, 2.0)
    ref, out, (conf, label) = data.policy_generate(chain_model(8), [[3, 4], [3, 4]], policy=flt, gen_length=8,
                                                   block_length=4)  # fmt: skip
    assert (
        [r.generated_ids for r in out.rows] == [r.generated_ids for r in ref.rows] == [[truth(i) for i in range(8)]] * 2
    )
    assert out.nfe == 8 and conf.shape == (16, 4)  # one record per row and step
    per_step = [[1, 0, 1, 0], [1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1]]  # odd slots right once their left one is in
    assert label.tolist() == [row for s in per_step for row in (s, s)] * 2


def test_policy_records_batch_rows_independently(llada, tmp_path):
    data = oracle_data
    flt = step_filter(tmp_path / "flt", 8, 0.5)
    prompts = [[5, 9, 17, 3, 40, 22], [7, 2, 33]]
    _, batch, (conf, label) = data.policy_generate(llada, prompts, policy=flt, gen_length=16, block_length=8)
    nfe = [r.nfe for r in batch.rows]
    assert nfe[0] != nfe[1]  # the rows finish at different steps
    assert conf.shape[0] == sum(nfe)  # a row is recorded only at the steps it takes part in
    total = 0.0
    for i, p in enumerate(prompts):
        _, alone, (_, lab) = data.policy_generate(llada, [p], policy=flt, gen_length=16, block_length=8)
        assert alone.rows[0].generated_ids == batch.rows[i].generated_ids and alone.rows[0].nfe == batch.rows[i].nfe
        total += float(lab.sum())
    assert float(label.sum()) == total


def test_policy_option_refuses_bad_filters_before_decoding(llada_dir, tmp_path):
    data = oracle_data
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "w5 w9"}) + "\n")
    argv = ["--model", str(llada_dir), "--prompts", str(prompts), "--block-length", "8", "--out", str(tmp_path / "r")]
    with pytest.raises(ValueError, match="learned filter not found"):
        data.main([*argv, "--policy", str(tmp_path / "missing.safetensors")])
    flt = step_filter(tmp_path / "b4", 4, 0.5)
    with pytest.raises(ValueError, match="trained for block length 4, but decoding uses block length 8"):
        data.main([*argv, "--policy", flt])
    for flag in ("--policy-eotp", "--policy-until-wrong"):
        with pytest.raises(SystemExit):
            data.main([*argv, flag])  # without --policy
    assert not (tmp_path / "r.safetensors").exists()


def _records(path: Path, n: int, block: int, **meta) -> str:
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(n)
    conf = torch.rand(n, block, generator=g)
    save_file({"conf": conf, "label": (conf > 0.5).float()}, str(path.with_suffix(".safetensors")))
    path.with_suffix(".json").write_text(json.dumps({"records": n, **meta}))
    return str(path)


def test_train_filter_on_several_record_files(tmp_path):
    fit = train_filter
    a = _records(tmp_path / "a", 40, 8, model_sha256="s", model="m")
    b = _records(tmp_path / "b", 30, 8, model_sha256="s", policy="f0.safetensors", policy_eotp=False)
    one = fit.main(["--data", a, "--out", str(tmp_path / "f1"), "--epochs", "5"])
    assert one["records"] == 40 and "sources" not in filter_config(one["filter"])["data"]
    both = fit.main(["--data", a, "--data", b, "--out", str(tmp_path / "f2"), "--epochs", "5"])
    cfg = filter_config(both["filter"])["data"]
    assert both["records"] == cfg["records"] == 70 and cfg["model_sha256"] == "s"
    assert [s["records"] for s in cfg["sources"]] == [40, 30] and cfg["sources"][1]["policy"] == "f0.safetensors"
    c = _records(tmp_path / "c", 30, 4, model_sha256="s")
    with pytest.raises(ValueError, match="block length mismatch"):
        fit.main(["--data", a, c, "--out", str(tmp_path / "f3")])
    d = _records(tmp_path / "d", 30, 8, model_sha256="other")
    with pytest.raises(ValueError, match="other model weights"):
        fit.main(["--data", a, d, "--out", str(tmp_path / "f3")])
    with pytest.raises(ValueError, match="not found"):
        fit.main(["--data", a, str(tmp_path / "nope"), "--out", str(tmp_path / "f3")])
    assert not (tmp_path / "f3.safetensors").exists()


def test_rounds_loop_writes_every_round(tok_dir, tmp_path):
    data, fit = oracle_data, train_filter
    prompts = tmp_path / "prompts.jsonl"
    words = ["w5 w9 w17", "w7 w2", "w11 w30 w8 w19", "w6 w12", "w20 w21 w22", "w9 w9"]
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in words))
    common = ["--model", str(tok_dir), "--prompts", str(prompts), "--gen-length", "16", "--block-length", "8"]
    work = tmp_path / "work"
    res = rounds.main(
        [*common, "--rounds", "1", "--epochs", "20", "--work", str(work), "--out", str(tmp_path / "last")]
    )
    for name in ("records_0", "filter_0", "records_1", "filter_1"):
        assert (work / f"{name}.safetensors").is_file() and (work / f"{name}.json").is_file()
    rec1 = json.loads((work / "records_1.json").read_text())
    assert rec1["policy"] == str(work / "filter_0.safetensors") and rec1["records"] == rec1["policy_nfe"] > 0
    assert "policy" not in json.loads((work / "records_0.json").read_text())
    cfg = filter_config(work / "filter_1.safetensors")["data"]
    assert [s["path"] for s in cfg["sources"]] == [str(work / "records_0"), str(work / "records_1")]
    assert cfg["records"] == res["per_round"][1]["records_total"] == res["per_round"][0]["records"] + rec1["records"]
    assert (tmp_path / "last.safetensors").read_bytes() == (work / "filter_1.safetensors").read_bytes()
    # round 0 is the plain recipe
    data.main([*common, "--out", str(tmp_path / "plain")])
    fit.main(["--data", str(tmp_path / "plain"), "--out", str(tmp_path / "plain_f"), "--epochs", "20"])
    assert (tmp_path / "plain.safetensors").read_bytes() == (work / "records_0.safetensors").read_bytes()
    assert (tmp_path / "plain_f.safetensors").read_bytes() == (work / "filter_0.safetensors").read_bytes()


def test_prompt_sets_are_fresh_samples_never_an_official_one(tmp_path, monkeypatch):
    from conftest import SHARED_DATA

    from dlm_decode.parallelbench.generator import sample_key
    from dlm_decode.parallelbench.tasks import load_task
    from recipes.learn2pd import prompts

    pytest.importorskip("datasets")
    if not (SHARED_DATA / "waiting_line").is_dir():
        pytest.skip("needs the ParallelBench task configs")
    monkeypatch.delenv("DLM_PARALLELBENCH_DATA", raising=False)
    with pytest.raises(ValueError, match="no ParallelBench data: pass --data DIR"):
        prompts.main(["--out", str(tmp_path / "x")])
    prompts.main(["--data", str(SHARED_DATA), "--out", str(tmp_path / "p"), "--n-train", "4", "--n-eval", "2"])
    rows = {split: oracle_data.load_prompts(tmp_path / "p", split, None) for split in ("train", "eval")}
    from datasets import load_from_disk

    ds = load_from_disk(str(tmp_path / "p"))
    assert len(ds["eval"]) <= 2 * len(prompts.TASKS) and len(rows["eval"]) == len(ds["eval"])
    assert sum(r["task"] == "waiting_line/sort" for r in ds["train"]) <= 6  # weight 1.5
    for split in ("train", "eval"):
        keys = {(r["task"], sample_key(json.loads(r["sample"]))) for r in ds[split]}
        for task in prompts.TASKS:
            official = {sample_key(s) for s in load_task(SHARED_DATA, task).samples}
            assert not {k for t, k in keys if t == task} & official
    eval_keys = {(r["task"], sample_key(json.loads(r["sample"]))) for r in ds["eval"]}
    assert not eval_keys & {(r["task"], sample_key(json.loads(r["sample"]))) for r in ds["train"]}
