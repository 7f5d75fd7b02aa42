"""The lm-eval integration (``dlm_decode.eval``) on the tiny official-format checkpoints, fully offline.

Covers model_args validation before loading, generate_until (until cuts, order, batch invariance), the Monte Carlo
likelihood against a brute-force ELBO, the shipped tasks through ``simple_evaluate`` (an instance and the
registered name), HumanEval's execution opt-in, the CLI wrapper, data parallelism (slow), the shipped demo model and
the block diffusion ELBO of a block-causal model.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import lm_eval
import pytest
import torch
from checkpoints import write_tokenizer
from conftest import REPO, SHARED_DATA
from llada2_reference import MASK, write_llada2
from lm_eval.api.instance import Instance

import dlm_decode
import dlm_decode.eval as dlm_eval
from dlm_decode.eval import likelihood
from dlm_decode.eval.answers import Generation, StatsTask, stats_of
from dlm_decode.eval.block_likelihood import block_row_losses
from dlm_decode.eval.cli import lm_eval_argv, stats_file
from dlm_decode.eval.lm import DLMDecodeLM
from dlm_decode.eval.options import parse_model_args
from dlm_decode.models.loading import load_model

needs_pb = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="official ParallelBench files not available")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tok_dirs(tmp_path_factory, llada_dir, dream_dir) -> dict[str, Path]:
    out = {}
    for name, src in (("llada", llada_dir), ("dream", dream_dir)):
        dst = tmp_path_factory.mktemp(f"{name}_tok") / name
        shutil.copytree(src, dst)
        write_tokenizer(dst)
        out[name] = dst
    return out


@pytest.fixture(scope="module")
def lms(tok_dirs) -> dict[str, DLMDecodeLM]:
    common = dict(gen_length=16, block_length=8, mc_num=64, progress=False, device="cpu")
    return {name: DLMDecodeLM(pretrained=str(path), **common) for name, path in tok_dirs.items()}


@pytest.fixture(scope="module")
def task_manager():
    return dlm_eval.task_manager(parallelbench_dir=str(SHARED_DATA) if SHARED_DATA.is_dir() else None)


def _req(kind: str, args: tuple, i: int = 0) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=args, idx=0, metadata=("t", i, 1))


# ---------------------------------------------------------------------------------------------- model_args


def test_model_args_syntax_and_types():
    o = parse_model_args(
        {
            "pretrained": "x",
            "sampler": "low_confidence",
            "cache": "none",
            "gen_length": "64",
            "temperature": 0,
            "apply_chat_template": "true",
            "sampler_options": "",
            "trust_remote_code": True,
        }
    )
    assert (o.gen_length, o.temperature, o.chat, o.sampler_options) == (64, 0.0, True, None)
    a = parse_model_args({"sampler": "threshold", "sampler.threshold": 0.8})
    b = parse_model_args({"sampler": "threshold", "sampler_options": "threshold:0.8"})
    c = parse_model_args({"sampler": "threshold", "sampler_options": {"threshold": "0.8"}})
    assert a.sampler_options == {"threshold": 0.8} and b == c


@pytest.mark.parametrize(
    "args, needle",
    [
        ({"bogus": 1}, "no option(s) bogus; valid options:"),
        ({"gen_length": "many"}, "gen_length expects an integer"),
        ({"chat": "maybe"}, "chat expects true/false"),
        ({"batch_size": 4}, "batch_size is lm-eval's own option"),
        ({"sampler": "nope"}, "unknown sampler 'nope'; valid samplers:"),
        ({"sampler.bogus": 1}, "has no option(s) bogus"),
        ({"cache_options": "interval"}, "is not key:value"),
        ({"gen_length": 24, "block_length": 16}, "multiple of block_length"),
        ({"ll_method": "exact"}, "ll_method must be one of"),
        ({"dtype": "int8"}, "dtype must be one of"),
        ({"mc_num": 0}, "mc_num must be >= 1"),
        ({"chat": True, "apply_chat_template": True}, "either chat or its alias"),
    ],
)
def test_bad_model_args_fail_before_any_loading(monkeypatch, args, needle):
    calls = []
    monkeypatch.setattr("dlm_decode.eval.lm.load_model", lambda *a, **k: calls.append(a))
    with pytest.raises(ValueError) as e:
        lm_eval.simple_evaluate(model="dlm_decode", model_args={"pretrained": "/nowhere", **args}, tasks=["x"])
    assert needle in str(e.value)
    with pytest.raises(ValueError, match="model_args"):
        DLMDecodeLM.create_from_arg_string("pretrained=/nowhere,batch_size=4,bogus=1")
    assert calls == []


def test_options_given_twice_are_rejected():
    with pytest.raises(ValueError, match="given twice"):
        parse_model_args({"sampler": "threshold", "sampler_options": "threshold:0.5", "sampler.threshold": 0.7})
    with pytest.raises(ValueError, match="expects a number"):
        parse_model_args({"sampler": "threshold", "sampler.threshold": "high"})


# ---------------------------------------------------------------------------------------------- generate_until


@pytest.mark.parametrize("which", ["llada", "dream"])
def test_generate_until_order_cuts_and_batch_invariance(lms, which):
    lm = lms[which]
    contexts = ["w5 w6 w7 w8 w9 w10", "w11", "w12 w13 w14", "w15 w16"]
    reqs = [_req("generate_until", (c, {"until": [], "max_gen_toks": 16}), i) for i, c in enumerate(contexts)]
    lm.batch_size = 1
    alone = lm.generate_until(reqs)
    # each answer is what generate gives for that prompt alone, in request order
    for c, a in zip(contexts, alone, strict=True):
        ids = lm.tokenizer(c)["input_ids"]
        direct = dlm_decode.generate(lm.model, [ids], tokenizer=lm.tokenizer, gen_length=16, block_length=8)
        assert a == direct.rows[0].text and type(a) is str  # plain text: lm-eval casts gold answers to its type
    for req, record in zip(reqs, lm.request_stats[-len(reqs) :], strict=True):
        assert stats_of(req) == [record] and record["nfe"] >= 1 and record["tokens_per_step"] > 0
    lm.batch_size = 3
    assert lm.generate_until(reqs) == alone
    # gen lengths mixed in one call (the engine starts the longest first): the same answers, in request order
    gens = [16, 32, 16, 32]
    mixed = []
    for i, (c, g) in enumerate(zip(contexts, gens, strict=True)):
        mixed.append(_req("generate_until", (c, {"until": [], "max_gen_toks": g}), i))
    lm.batch_size = 1
    one = [lm.generate_until([r])[0] for r in mixed]  # each request on its own
    lm.batch_size = 3
    assert lm.generate_until(mixed) == one and one[0::2] == alone[0::2]
    # cut at every until string: at the second word of each answer that has one, and a missing string cuts nothing
    cut_reqs, expected = [], []
    for i, (c, a) in enumerate(zip(contexts, alone, strict=True)):
        words = a.split()
        stop = (" " + words[1]) if len(words) > 1 else "zzz"
        cut_reqs.append(_req("generate_until", (c, {"until": ["zzz", stop], "max_gen_toks": 16}), i))
        expected.append(a[: a.find(stop)] if stop in a else a)
    assert lm.generate_until(cut_reqs) == expected
    assert any(e != a for e, a in zip(expected, alone, strict=True))


def test_gen_length_follows_the_task_budget_and_chat_wraps_the_context(lms):
    model, tok = lms["llada"].model, lms["llada"].tokenizer
    lm = DLMDecodeLM(model=model, tokenizer=tok, block_length=8, chat=True, progress=False)
    out = lm.generate_until([_req("generate_until", ("w5 w6", {"until": [], "max_gen_toks": 12}))])
    (stats,) = lm.request_stats
    assert stats["gen_length"] == 16  # 12 rounded up to whole blocks of 8
    direct = dlm_decode.generate(model, ["w5 w6"], tokenizer=tok, chat=True, gen_length=16, block_length=8)
    assert out[0] == direct.rows[0].text and stats["prompt_tokens"] == len(direct.rows[0].prompt_ids)
    with pytest.raises(ValueError, match="model="):
        DLMDecodeLM(model="demo-llada", tokenizer=None)


# ---------------------------------------------------------------------------------------------- likelihood


@torch.no_grad()
def _aligned_logprobs(model, ids: list[int]) -> torch.Tensor:
    """[T, V] log-probs where row i predicts slot i, from the official forward (Dream: hidden i-1 predicts i)."""
    logits = model(torch.tensor([ids])).logits[0].float()
    if model.logit_shift:
        logits = torch.cat([logits[:1], logits[:-1]])
    return torch.log_softmax(logits, -1)


def brute_force_elbo(model, ctx: list[int], cont: list[int]) -> float:
    """-sum over non-empty masked subsets S of CE(S) / (|S| C(L, |S|)): the expectation of both estimators."""
    n, total = len(cont), 0.0
    for k in range(1, n + 1):
        for subset in itertools.combinations(range(n), k):
            noisy = list(cont)
            for i in subset:
                noisy[i] = model.mask_token_id
            lp = _aligned_logprobs(model, ctx + noisy)
            ce = -sum(float(lp[len(ctx) + i, cont[i]]) for i in subset)
            total += ce / (k * math.comb(n, k))
    return -total


@pytest.mark.parametrize("which", ["llada", "dream"])
def test_single_token_likelihood_is_exact(lms, which):
    model = lms[which].model
    ctx = [5, 6, 7, 8]
    for tok in (9, 30):
        for method in ("llada", "dream"):
            (est,) = likelihood.loglikelihoods(model, [(ctx, [tok])], mc_num=64, method=method)
            assert est == pytest.approx(brute_force_elbo(model, ctx, [tok]), abs=1e-5)
    # classifier-free guidance: un + (s + 1)(cond - un), the context masked in the unconditional copy
    m = model.mask_token_id
    with torch.no_grad():
        raw_c, raw_u = model(torch.tensor([ctx + [m], [m] * 4 + [m]])).logits.float()
    i = len(ctx) - model.logit_shift  # the hidden state that predicts the continuation slot
    guided = torch.log_softmax(raw_u[i] + 2.5 * (raw_c[i] - raw_u[i]), -1)
    (est,) = likelihood.loglikelihoods(model, [(ctx, [9])], cfg_scale=1.5)
    assert est == pytest.approx(float(guided[9]), abs=1e-5)


# Dream's continuous-time estimator weighs rare small mask ratios by 1/t: measured here, its standard deviation
# is ~30x LLaDA's at the same sample count (2 tokens, 512 samples: 0.8-2.3 nats vs 0.08), hence its wider bound.
@pytest.mark.parametrize("which, method, mc_num, tol", [("dream", "llada", 256, 0.4), ("llada", "dream", 8192, 1.0)])
def test_two_token_estimate_matches_brute_force(lms, which, method, mc_num, tol):
    model = lms[which].model
    ctx, cont = [5, 6, 7], [9, 10]
    (est,) = likelihood.loglikelihoods(model, [(ctx, cont)], mc_num=mc_num, method=method, max_batch=1024)
    assert est == pytest.approx(brute_force_elbo(model, ctx, cont), abs=tol)


def test_estimate_is_seeded_per_request_not_per_batch(lms):
    model = lms["llada"].model
    pairs = [([5, 6, 7], [9, 10]), ([11, 12], [13, 14, 15]), ([16], [17, 18])]
    est = likelihood.loglikelihoods(model, pairs, mc_num=64, max_batch=256)
    assert likelihood.loglikelihoods(model, pairs, mc_num=64, max_batch=256) == est
    # other batching and request order: the same numbers up to the float noise of padding
    again = likelihood.loglikelihoods(model, pairs[::-1], mc_num=64, max_batch=7)
    assert again[::-1] == pytest.approx(est, abs=1e-6)
    assert likelihood.loglikelihoods(model, pairs, mc_num=64, max_batch=256, seed=1) != est


def test_loglikelihood_requests_greedy_flag_and_rolling(lms):
    lm = lms["llada"]
    ctx = "w5 w6 w7"
    ids = lm.tokenizer(ctx)["input_ids"]
    greedy = dlm_decode.generate(lm.model, [ids], gen_length=2, block_length=2, steps=2).rows[0].generated_ids
    words = [f"w{t}" for t in greedy]
    lm_g = DLMDecodeLM(model=lm.model, tokenizer=lm.tokenizer, mc_num=8, progress=False)
    first = lm_g.loglikelihood([_req("loglikelihood", (ctx, " " + " ".join(words)))])
    assert first[0][1] is True  # decoding the masked continuation one token per step reproduces it
    other = next(f"w{i}" for i in range(6, 60) if f"w{i}" != words[1])
    res = lm_g.loglikelihood([_req("loglikelihood", (ctx, f" {words[0]} {other}")), _req("loglikelihood", (ctx, ""))])
    assert res[0][1] is False and res[0][0] < first[0][0] and res[1] == (0.0, True)
    assert lm_g.loglikelihood([_req("loglikelihood", (ctx, f" {words[0]} {other}"))]) == res[:1]  # deterministic
    short = DLMDecodeLM(model=lm.model, tokenizer=lm.tokenizer, mc_num=4, max_length=5, progress=False)
    text = " ".join(f"w{i}" for i in range(10, 20))
    (total,) = short.loglikelihood_rolling([_req("loglikelihood_rolling", (text,))])
    bos = short.prefix_token_id
    ids = [int(t) for t in short.tokenizer(text, add_special_tokens=False)["input_ids"]]
    parts = likelihood.loglikelihoods(lm.model, [([bos], ids[s : s + 4]) for s in range(0, 10, 4)], mc_num=4)
    assert total == pytest.approx(sum(parts), abs=1e-9)


# ---------------------------------------------------------------------------------------------- tasks end to end


@needs_pb
def test_simple_evaluate_with_an_instance(lms, task_manager, tmp_path):
    lm = DLMDecodeLM(
        model=lms["llada"].model,
        tokenizer=lms["llada"].tokenizer,
        mc_num=4,
        gen_length=16,
        stats_path=str(tmp_path / "stats.jsonl"),
        progress=False,
    )
    res = lm_eval.simple_evaluate(
        model=lm,
        tasks=["dlm_tiny_mc", "parallelbench_waiting_line_copy"],
        task_manager=task_manager,
        limit=2,
        apply_chat_template=True,
        bootstrap_iters=0,
    )
    mc, pb = res["results"]["dlm_tiny_mc"], res["results"]["parallelbench_waiting_line_copy"]
    assert 0.0 <= mc["acc,none"] <= 1.0
    assert 0.0 <= pb["score,none"] <= 1.0 and pb["nfe,none"] >= 1 and pb["tokens_per_step,none"] > 0
    sample = res["samples"]["parallelbench_waiting_line_copy"][0]
    assert {"score", "score_strict", "nfe", "tokens_per_step"} <= set(sample)
    # the prompt is the official chat, rendered by the model's chat template
    messages = json.loads(sample["doc"]["messages"])
    rendered = lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert sample["arguments"][0][0] == rendered
    stats = [json.loads(line) for line in (tmp_path / "stats.jsonl").read_text().splitlines()]
    assert len(stats) == 2 and {s["task"] for s in stats} == {"parallelbench_waiting_line_copy"}
    assert res["config"]["dlm_decode"]["summary"]["generate_requests"] == 2


@needs_pb
def test_simple_evaluate_with_the_registered_name(tok_dirs, task_manager):
    res = lm_eval.simple_evaluate(
        model="dlm_decode",
        model_args=f"pretrained={tok_dirs['dream']},gen_length=16,block_length=16,mc_num=2,progress=false",
        tasks=["dlm_tiny_mc", "parallelbench_puzzle_sudoku_n4_12"],
        task_manager=task_manager,
        limit=2,
        apply_chat_template=True,
        bootstrap_iters=0,
    )
    assert set(res["results"]) == {"dlm_tiny_mc", "parallelbench_puzzle_sudoku_n4_12"}
    assert res["config"]["dlm_decode"]["ll_method_resolved"] == "dream"


@needs_pb
def test_parallelbench_tasks_refuse_to_run_without_the_chat_template(lms, task_manager):
    with pytest.raises(ValueError, match="--apply_chat_template"):
        lm_eval.simple_evaluate(
            model=lms["llada"], tasks=["parallelbench_waiting_line_copy"], task_manager=task_manager, limit=1
        )


def _local_task(folder: Path, name: str, docs: list[dict], body: str):
    """A YAML task over a jsonl written to ``folder`` (lm-eval's ``dataset_path: json``), and a TaskManager that sees
    only it."""
    from lm_eval.tasks import TaskManager

    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    head = f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
    (folder / f"{name}.yaml").write_text(head + textwrap.dedent(body))
    return TaskManager(include_path=str(folder), include_defaults=False)


_PLAIN_GENERATE = """
    output_type: generate_until
    doc_to_text: "{{prompt}}"
    doc_to_target: "{{target}}"
    generation_kwargs:
      until: ["\\n"]
      max_gen_toks: 32
    metric_list:
      - metric: exact_match
"""


def test_plain_generate_until_task_scores_exact_match(tmp_path):
    """An ordinary generate_until task (string target, exact_match, no filters) through the registered name: lm-eval
    casts each gold answer to the answer's type, which crashed on the old ``str`` subclass."""
    model, tok = dlm_decode.load_model("demo-llada")
    # two prompts the demo model answers with a non-empty first line at 32 tokens (it learned padded 32-token answers;
    # without the chat template the text is not the list, but the test needs only a known, non-empty answer)
    prompts = ['copy ["Alan Wells", "Grace Wright"]', 'copy ["Billy Ramos", "Alan Wells", "Grace Wright"]']
    # chat=False: the plugin without apply_chat_template encodes the bare text (the demo's generation_config says chat)
    out = dlm_decode.generate(model, prompts, tokenizer=tok, chat=False, gen_length=32, block_length=32)
    answers = [r.text.split("\n")[0] for r in out.rows]
    assert all(answers)  # non-empty, so matching one is not a coincidence of empty strings
    docs = [{"prompt": prompts[0], "target": answers[0]}, {"prompt": prompts[1], "target": answers[1] + " (not this)"}]
    tm = _local_task(tmp_path, "plain_gen", docs, _PLAIN_GENERATE)
    res = lm_eval.simple_evaluate(
        model="dlm_decode",
        model_args="pretrained=demo-llada,gen_length=32,block_length=32,progress=false,device=cpu",
        tasks=["plain_gen"],
        task_manager=tm,
        bootstrap_iters=0,
        log_samples=True,
    )
    assert res["results"]["plain_gen"]["exact_match,none"] == 0.5  # the first target is the answer, the second not
    samples = sorted(res["samples"]["plain_gen"], key=lambda x: x["doc_id"])
    got = [x["filtered_resps"][0] for x in samples]
    assert got == answers and all(type(g) is str for g in got)  # the batched plugin answers as a direct generate
    assert [x["exact_match"] for x in samples] == [float(g == d["target"]) for g, d in zip(got, docs, strict=True)]
    assert res["config"]["dlm_decode"]["summary"]["generate_requests"] == 2


_PLAIN_CHOICE = """
    output_type: multiple_choice
    doc_to_text: "{{question}}"
    doc_to_choice: "{{choices}}"
    doc_to_target: answer
    metric_list:
      - metric: acc
"""


@pytest.mark.parametrize("pretrained", ["demo-llada", "demo-llada2"])
def test_plain_multiple_choice_task_scores_what_loglikelihood_ranks(tmp_path, pretrained):
    """demo-llada2 is block-causal: its scores are the block diffusion ELBO on the 32 grid (eval.block_likelihood)."""
    docs = [
        {"question": "Copy the list: Alice, Bob", "choices": ["Alice, Bob", "Bob", "Carol, Dan"], "answer": 0},
        {"question": "Hello", "choices": ["there", "Alice", "Bob, Carol"], "answer": 2},
    ]
    tm = _local_task(tmp_path, "plain_mc", docs, _PLAIN_CHOICE)
    lm = DLMDecodeLM(pretrained=pretrained, mc_num=4, progress=False, device="cpu")
    res = lm_eval.simple_evaluate(model=lm, tasks=["plain_mc"], task_manager=tm, bootstrap_iters=0, log_samples=True)
    # the same scores straight from the model: deterministic per request, so the ranking is known
    picks = []
    for d in docs:
        lls = lm.loglikelihood([_req("loglikelihood", (d["question"], " " + c)) for c in d["choices"]])
        picks.append(max(range(len(lls)), key=lambda i: lls[i][0]))
    expected = sum(p == d["answer"] for p, d in zip(picks, docs, strict=True)) / len(docs)
    assert res["results"]["plain_mc"]["acc,none"] == pytest.approx(expected)
    samples = sorted(res["samples"]["plain_mc"], key=lambda x: x["doc_id"])
    assert [x["acc"] for x in samples] == [float(p == d["answer"]) for p, d in zip(picks, docs, strict=True)]
    if "llada2" in pretrained:  # the plugin's number is the block ELBO of the encoded pair
        (req,) = [_req("loglikelihood", (docs[0]["question"], " " + docs[0]["choices"][0]))]
        ((got, _),) = lm.loglikelihood([req])
        pair = lm._encode_pair(docs[0]["question"], " " + docs[0]["choices"][0])
        (want,) = likelihood.loglikelihoods(lm.model, [pair], mc_num=4, block_length=32)
        assert got == pytest.approx(want)


def test_generation_survives_lm_evals_gold_cast():
    """What a StatsTask hands process_results: lm-eval's ``type(result)(gold)`` builds one from the gold text."""
    g = Generation("a b", {"nfe": 3})
    gold = type(g)("a b")
    assert gold == g and gold.stats == {} and g.stats == {"nfe": 3}
    assert issubclass(StatsTask, lm_eval.api.task.ConfigurableTask)


def test_every_shipped_task_is_indexed(task_manager):
    names = set(task_manager.all_tasks)
    pb = {f"parallelbench_waiting_line_{op}" for op in ("copy", "reverse", "sort", "shuffle", "insert_random")}
    assert {"dlm_tiny_mc", "dlm_humaneval", "parallelbench", "parallelbench_puzzle_sudoku_n4_12"} | pb <= names


def test_humaneval_runs_through_lm_eval(lms, task_manager, monkeypatch):
    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    with pytest.raises(ValueError, match="confirm_run_unsafe_code"):
        lm_eval.simple_evaluate(model=lms["llada"], tasks=["dlm_humaneval"], task_manager=task_manager, limit=1)
    res = lm_eval.simple_evaluate(
        model=lms["llada"], tasks=["dlm_humaneval"], task_manager=task_manager, limit=1, confirm_run_unsafe_code=True
    )
    assert res["results"]["dlm_humaneval"]["pass@1,none"] == 0.0  # a random model's words are not Python
    assert res["results"]["dlm_humaneval"]["nfe,none"] >= 1  # statistics reach the task through StatsTask


def test_humaneval_executes_only_with_the_opt_in(monkeypatch):
    from dlm_decode.eval.tasks import humaneval

    docs = humaneval.load()["test"]
    assert len(docs) == 164 and docs[0]["task_id"] == "HumanEval/0"
    doc = docs[2]
    monkeypatch.delenv("HF_ALLOW_CODE_EVAL", raising=False)
    with pytest.raises(RuntimeError, match="HF_ALLOW_CODE_EVAL=1"):
        humaneval.process_results(doc, [doc["canonical_solution"]])
    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    assert humaneval.process_results(doc, [doc["canonical_solution"]])["pass@1"] == 1.0
    fenced = f"Here:\n```python\n{doc['prompt']}{doc['canonical_solution']}```\nDone."
    assert humaneval.completion_of(doc, fenced).lstrip().startswith(doc["prompt"].lstrip()[:10])
    assert humaneval.process_results(doc, ["    return None\n"])["pass@1"] == 0.0


# ---------------------------------------------------------------------------------------------- CLI


def test_cli_fills_in_model_include_path_and_stats(tmp_path):
    argv = lm_eval_argv(["--model_args", "pretrained=demo-llada", "--tasks", "dlm_tiny_mc", "-o", str(tmp_path)])
    assert argv[0] == "run" and argv[argv.index("--model") + 1] == "dlm_decode"
    assert argv[argv.index("--include_path") + 1] == str(dlm_eval.TASKS_DIR)
    assert f"stats_path={tmp_path / 'dlm_decode_stats.jsonl'}" in argv
    assert lm_eval_argv(["ls", "tasks"]) == ["ls", "tasks", "--include_path", str(dlm_eval.TASKS_DIR)]
    mine = lm_eval_argv(["run", "--model", "hf", "--include_path", "/x", "-o", "o.json"])
    assert mine == ["run", "--model", "hf", "--include_path", "/x", "-o", "o.json"]
    assert stats_file("out/res.json") == "out/res.dlm_decode_stats.jsonl"
    from dlm_decode.cli import build_parser

    args = build_parser().parse_args(["eval", "--model_args", "pretrained=x", "-h"])
    assert args.lm_eval_args == ["--model_args", "pretrained=x", "-h"]


@pytest.mark.slow
@needs_pb
def test_cli_end_to_end(tok_dirs, tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "dlm_decode.eval", "--model_args", f"pretrained={tok_dirs['llada']}",
           "gen_length=16", "mc_num=2", "--tasks", "dlm_tiny_mc,parallelbench_waiting_line_copy", "--limit", "2",
           "--apply_chat_template", "--metadata", f"parallelbench_dir={SHARED_DATA}", "--output_path", str(out),
           "--log_samples"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dlm_tiny_mc" in proc.stdout and "parallelbench_waiting_line_copy" in proc.stdout
    assert list(out.rglob("results_*.json")) and list(out.rglob("samples_parallelbench_waiting_line_copy_*.jsonl"))
    stats = (out / "dlm_decode_stats.jsonl").read_text().splitlines()
    assert len(stats) == 2 and json.loads(stats[0])["nfe"] >= 1


# ---------------------------------------------------------------------------------------------- data parallel

_DP_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import lm_eval
    import dlm_decode.eval as E
    path, data, out = sys.argv[1:4]
    res = lm_eval.simple_evaluate(
        model="dlm_decode", model_args=f"pretrained={path},gen_length=16,mc_num=4,progress=false",
        tasks=["dlm_tiny_mc", "parallelbench_waiting_line_copy"], task_manager=E.task_manager(parallelbench_dir=data),
        limit=4, apply_chat_template=True, bootstrap_iters=0, log_samples=True,
    )
    if res is not None:
        keep = {t: sorted([s["doc_id"], s["resps"]] for s in v) for t, v in res["samples"].items()}
        json.dump({"results": res["results"], "samples": keep}, open(out, "w"), default=str)
    """
)


@pytest.mark.slow
@needs_pb
def test_data_parallel_two_cpu_processes_match_one(tok_dirs, tmp_path):
    script = tmp_path / "dp.py"
    script.write_text(_DP_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    args = [str(tok_dirs["llada"]), str(SHARED_DATA)]
    subprocess.run([sys.executable, str(script), *args, str(one)], check=True, env=env, timeout=600)
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517"]
    proc = subprocess.run([*launch, str(script), *args, str(two)], env=env, timeout=600, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    assert a["samples"] == b["samples"]
    assert a["results"] == b["results"]


# ---------------------------------------------------------------------------------------------- demo model


D3LLM = {"eta": 0.2, "block_add_threshold": 0.5, "decoded_token_threshold": 0.75, "early_stop": True}
D2F = {"threshold": 0.9, "block_add_threshold": 0.5, "decoded_token_threshold": 0.75, "early_stop": True}
ANSWER = "answer_block_causal"


@needs_pb
@pytest.mark.parametrize(
    "op, decoding, lm_batch, runner_batch",
    [
        ("copy", dict(sampler="low_confidence", steps=32), 2, 4),
        ("reverse", dict(sampler="threshold", cache="dual"), 3, 2),
        # several blocks in flight: d3LLM's rule and cache, and D2F's attention with its exact cache
        ("copy", dict(sampler="entropy_threshold", sampler_options=D3LLM, cache="delayed", block_length=8), 2, 3),
        (
            "reverse",
            dict(sampler="threshold", sampler_options=D2F, attention=ANSWER, cache="prefix", block_length=8),
            3,
            2,
        ),
    ],
)
def test_demo_lm_eval_equals_the_runner_and_direct_decoding(task_manager, op, decoding, lm_batch, runner_batch):
    """demo-llada: lm-eval's score and texts equal the ParallelBench runner's and a direct generate's."""
    from dlm_decode.parallelbench import build_messages, load_task, score_sample
    from dlm_decode.parallelbench.runner import run_task

    decoding = dict(gen_length=32, block_length=32, temperature=0.0, seed=0) | decoding
    name, n = f"parallelbench_waiting_line_{op}", 4
    lm = DLMDecodeLM(pretrained="demo-llada", batch_size=lm_batch, progress=False, **decoding)
    res = lm_eval.simple_evaluate(
        model=lm, tasks=[name], task_manager=task_manager, limit=n, apply_chat_template=True, bootstrap_iters=0
    )
    lm_score = res["results"][name]["score,none"]
    texts = [s["resps"][0][0] for s in sorted(res["samples"][name], key=lambda s: s["doc_id"])]

    task = load_task(SHARED_DATA, f"waiting_line/{op}", limit=n)
    out = dlm_decode.generate(
        lm.model, [build_messages(task.config, s) for s in task.samples], tokenizer=lm.tokenizer, chat=True, **decoding
    )
    direct = [score_sample(task.name, r.text, s)["score"] for r, s in zip(out.rows, task.samples, strict=True)]
    assert texts == [r.text for r in out.rows]
    assert lm_score == pytest.approx(sum(direct) / n)

    pb = run_task(lm.model, lm.tokenizer, task, decoding, batch_size=runner_batch)
    assert [o["text"] for o in pb.outputs] == texts
    assert pb.score == pytest.approx(100 * lm_score)


# ------------------------------------------------------------------ the block diffusion ELBO (eval.block_likelihood)
# A block-causal model's likelihood: every masked subset's loss equals a brute-force evaluation (a plain forward over
# the clean earlier blocks and the token's own noisy block, later blocks cut off), a one-token continuation is exact,
# and the Monte Carlo estimate is the subsets' weighted mean.

B = 4  # grid: context [9, 4, 7] ends mid-block, the continuation spans blocks 0 and 1
CTX, CONT = [9, 4, 7], [11, 5, 20]


@pytest.fixture(scope="module")
def block_model(tmp_path_factory):
    return load_model(write_llada2(tmp_path_factory.mktemp("bl") / "m", seed=2))[0]


@torch.no_grad()
def block_brute_loss(model, ctx, cont, masked: set[int]) -> float:
    """Sum over masked continuation tokens of -log p(token | earlier blocks clean, its block with the masked set)."""
    ids = ctx + cont
    total = 0.0
    for j in sorted(masked):
        slot = len(ctx) + j
        end = (slot // B + 1) * B  # the end of the token's block: later blocks are cut off
        seq = [MASK if (k - len(ctx)) in masked and k // B == slot // B else t for k, t in enumerate(ids)][:end]
        x = torch.tensor([seq])
        logits = model(x, block_length=B).logits[0, slot].double()
        total -= float(torch.log_softmax(logits, -1)[ids[slot]])
    return total


def test_every_masked_subset_matches_brute_force(block_model):
    subsets = [set(c) for n in range(1, 4) for c in itertools.combinations(range(3), n)]
    rows = [likelihood.Row(0, CTX, CONT, torch.tensor([j in s for j in range(3)]), len(s) / 3) for s in subsets]
    got = block_row_losses(block_model, rows, block_length=B)
    want = [block_brute_loss(block_model, CTX, CONT, s) / (len(s) / 3) for s in subsets]
    assert got.tolist() == pytest.approx(want, rel=1e-4, abs=1e-4)


def test_one_token_is_exact_and_the_estimate_is_the_subsets_mean(block_model):
    (one,) = likelihood.loglikelihoods(block_model, [(CTX, [11])], mc_num=4, block_length=B)
    assert one == pytest.approx(-block_brute_loss(block_model, CTX, [11], {0}), abs=1e-5)
    exact = -sum(
        block_brute_loss(block_model, CTX, CONT, set(c)) / (n * math.comb(3, n))
        for n in range(1, 4)
        for c in itertools.combinations(range(3), n)
    )
    (est,) = likelihood.loglikelihoods(block_model, [(CTX, CONT)], mc_num=3000, block_length=B, seed=1)
    assert est == pytest.approx(exact, abs=0.05 * abs(exact))


def test_guidance_and_the_greedy_check_run_on_the_grid(block_model):
    plain, guided = (
        likelihood.loglikelihoods(block_model, [(CTX, CONT)] * 2, mc_num=8, block_length=B)[0],
        likelihood.loglikelihoods(block_model, [(CTX, CONT)], mc_num=8, block_length=B, cfg_scale=1.0)[0],
    )
    assert math.isfinite(guided) and guided != plain
    out = dlm_decode.generate(
        block_model, [CTX], sampler="llada2", sampler_options={"threshold": 1.0}, gen_length=3, block_length=B,
        steps=B, stop_at_eos=False,
    )  # fmt: skip
    greedy = out.rows[0].generated_ids
    pairs = [(CTX, greedy), (CTX, [g + 1 for g in greedy])]
    assert likelihood.greedy_matches(block_model, pairs, block_length=B) == [True, False]
