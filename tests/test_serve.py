"""``dlm-decode serve`` against the real server (uvicorn on a free loopback port, in a thread or a subprocess): the
``openai`` client's chat, completions and streams, each answer equal to ``generate`` of that request alone (also
under concurrent clients); errors 400/401/404/408/413/429/500; a disconnect mid-stream; ``/metrics`` read with
``prometheus_client``'s parser; the SIGTERM drain."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from openai.types import Completion  # noqa: E402
from openai.types.chat import ChatCompletion, ChatCompletionChunk  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import dlm_decode  # noqa: E402
from dlm_decode.engine import Engine  # noqa: E402
from dlm_decode.serve.app import ServeConfig, create_app, request_options  # noqa: E402
from dlm_decode.serve.server import serve_in_thread  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

NAME = "demo-llada2"
CHAT = [{"role": "user", "content": "Sort: pear, apple, fig"}]
FAST = {"max_tokens": 16}  # one block of the demo model: a request takes ~0.2 s alone


@pytest.fixture(scope="module")
def demo():
    return dlm_decode.load_model(NAME)


@pytest.fixture(scope="module")
def server(demo):
    engine = Engine(*demo, max_batch=4)
    with serve_in_thread(create_app(ServeConfig(NAME), engine=engine)) as url:
        yield url, engine


def client(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)


def alone(demo, prompt, chat: bool, body: dict, defaults: dict | None = None):
    """``generate`` of one request alone, with the server's defaults under its options."""
    kw = {{"max_tokens": "gen_length"}.get(k, k): v for k, v in body.items() if k not in ("stop", "stream")}
    kw = (defaults or {}) | request_options(defaults or {}, kw)
    model, tok = demo
    return dlm_decode.generate(model, [prompt], tokenizer=tok, chat=chat, **kw).rows[0]


def post(url: str, path: str, body, **headers) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        f"{url}{path}", content=data, headers={"content-type": "application/json", **headers}, timeout=120
    )


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of ``/metrics``, parsed by prometheus_client: (name, sorted labels) -> value."""
    text = httpx.get(f"{url}/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


REQUESTS = [  # (kind, prompt, body extras as the openai client sends them, extra_body)
    ("chat", CHAT, FAST, {}),
    ("chat", [{"role": "user", "content": "Reverse: a b c"}], {"max_tokens": 32, "seed": 3, "temperature": 0.8},
     {"sampler": "threshold", "sampler_options": {"threshold": 0.7}, "cache": "none"}),
    ("completion", "Sort: pear, apple, fig", FAST, {"steps": 8, "sampler": "low_confidence"}),
    ("completion", [5, 6, 7, 8], {"max_tokens": 32, "top_p": 0.9, "temperature": 0.7, "seed": 11},
     {"block_length": 16, "top_k": 20}),
]  # fmt: skip


def ask(c: openai.OpenAI, kind, prompt, body, extra, **more):
    if kind == "chat":
        return c.chat.completions.create(model=NAME, messages=prompt, extra_body=extra, **body, **more)
    return c.completions.create(model=NAME, prompt=prompt, extra_body=extra, **body, **more)


def text_of(kind, resp) -> str:
    return resp.choices[0].message.content if kind == "chat" else resp.choices[0].text


def test_models_health_and_answers_equal_generate_alone(server, demo):
    url, _ = server
    c = client(url)
    assert [m.id for m in c.models.list().data] == [NAME]
    assert httpx.get(f"{url}/health").json() == {"status": "ready"}
    for kind, prompt, body, extra in REQUESTS:
        resp = ask(c, kind, prompt, body, extra)
        raw = resp.model_dump()
        (ChatCompletion if kind == "chat" else Completion).model_validate(raw)  # OpenAI's schema, validated
        row = alone(demo, prompt, kind == "chat", body | extra)
        assert text_of(kind, resp) == row.text and raw["dlm"]["nfe"] == row.nfe
        ids = raw["dlm"]["completion_ids"]
        assert ids == row.generated_ids[: len(ids)] and resp.usage.completion_tokens == len(ids)
        assert resp.choices[0].finish_reason == ("stop" if len(ids) < len(row.generated_ids) else "length")


def test_streams_join_to_the_plain_answer(server, demo):
    url, _ = server
    c = client(url)
    for kind, prompt, body, extra in REQUESTS[:3]:
        plain = ask(c, kind, prompt, body, extra)
        chunks = list(ask(c, kind, prompt, body, extra, stream=True, stream_options={"include_usage": True}))
        for ch in chunks:  # (OpenAI's own streamed completions carry finish_reason null, which its type refuses)
            if kind == "chat" or ch.choices and ch.choices[0].finish_reason:
                (ChatCompletionChunk if kind == "chat" else Completion).model_validate(ch.model_dump())
        parts = [ch.choices[0].delta.content or "" if kind == "chat" else ch.choices[0].text for ch in chunks[:-1]]
        assert "".join(parts) == text_of(kind, plain) and sum(1 for p in parts if p) >= 1
        assert chunks[-2].choices[0].finish_reason == plain.choices[0].finish_reason
        assert chunks[-1].choices == [] and chunks[-1].usage == plain.usage
        assert chunks[-1].model_dump()["dlm"]["nfe"] == plain.model_dump()["dlm"]["nfe"]


def test_stop_strings_cut_the_text_plain_and_streamed(server, demo):
    url, _ = server
    body = {"max_tokens": 32}
    full = alone(demo, CHAT, True, body).text
    stop = full[3:5]  # a piece inside the answer
    want = full[: full.find(stop)]
    c = client(url)
    plain = c.chat.completions.create(model=NAME, messages=CHAT, stop=[stop, "never-there"], **body)
    assert plain.choices[0].message.content == want and plain.choices[0].finish_reason == "stop"
    assert 0 < plain.usage.completion_tokens <= len(plain.model_dump()["dlm"]["completion_ids"])
    chunks = list(c.chat.completions.create(model=NAME, messages=CHAT, stop=stop, stream=True, **body))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_concurrent_clients_each_equal_generate_alone(server, demo):
    """8 clients at once, streamed and not, with their own samplers and seeds: each answer is its generate alone."""
    url, engine = server
    jobs = [
        (kind, prompt, body | {"seed": i}, extra | ({"sampler": "threshold"} if i % 2 else {}))
        for i, (kind, prompt, body, extra) in enumerate(REQUESTS * 2)
    ]
    forwards = scrape(url)[("dlm_forwards_total", ())]

    def one(n_job):
        n, (kind, prompt, body, extra) = n_job
        if n % 3:  # a third of the clients stream
            return text_of(kind, ask(client(url), kind, prompt, body, extra))
        chunks = ask(client(url), kind, prompt, body, extra, stream=True)
        return "".join((c.choices[0].delta.content or "") if kind == "chat" else c.choices[0].text for c in chunks)

    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(one, enumerate(jobs)))
    for (kind, prompt, body, extra), got in zip(jobs, answers, strict=True):
        assert got == alone(demo, prompt, kind == "chat", body | extra).text
    alone_nfe = sum(alone(demo, p, k == "chat", b | e).nfe for k, p, b, e in jobs)
    assert scrape(url)[("dlm_forwards_total", ())] - forwards < alone_nfe  # requests shared forwards


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/chat/completions", {"messages": CHAT, "tools": [{"type": "function"}]}, 400, "tools"),
        ("/v1/chat/completions", {"messages": CHAT, "n": 2}, 400, "'n'"),
        ("/v1/completions", {"prompt": "hi", "logit_bias": {"5": 1}}, 400, "logit_bias"),
        ("/v1/completions", {"prompt": "hi", "presence_penalty": 0.5}, 400, "presence_penalty"),
        ("/v1/completions", {"prompt": "hi", "sampler": "nope"}, 400, "nope"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "'max_tokens'"),
        ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
        ("/v1/completions", {"messages": CHAT}, 400, "prompt"),
        ("/v1/chat/completions", {"messages": CHAT, "stop": 3}, 400, "stop"),
        ("/v1/chat/completions", {"messages": CHAT, "timeout": -1}, 400, "timeout"),
        ("/v1/chat/completions", {"messages": CHAT, "model": "gpt-4"}, 404, "gpt-4"),
        ("/v1/chat/completions", b"{not json", 400, "not JSON"),
        ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 256, "steps": 256, "timeout": 0.05}, 408, "timeout"),
    ],
)
def test_bad_requests_get_openai_errors_naming_the_field(server, path, body, status, needle):
    url, _ = server
    r = post(url, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["code"] == status and err["type"]
    assert httpx.get(f"{url}/health").status_code == 200


def test_a_stream_past_its_timeout_ends_with_a_408_error_event(server):
    url, _ = server
    body = {"messages": CHAT, "max_tokens": 256, "steps": 256, "timeout": 0.05, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert r.status_code == 200 and events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert err["code"] == 408 and "timeout" in err["message"]
    with pytest.raises(openai.APIError, match="timeout"):
        list(
            client(url).chat.completions.create(
                model=NAME, stream=True, extra_body={"timeout": 0.05, "steps": 256}, messages=CHAT, max_tokens=256
            )
        )
    assert scrape(url)[("dlm_requests_total", (("endpoint", "chat"), ("status", "408")))] >= 2


def test_openai_client_raises_its_own_errors(server):
    c = client(server[0])
    with pytest.raises(openai.BadRequestError, match="tools"):
        c.chat.completions.create(model=NAME, messages=CHAT, tools=[{"type": "function", "function": {"name": "f"}}])
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="other", prompt="hi")
    with pytest.raises(openai.BadRequestError, match="threshold"):
        c.completions.create(model=NAME, prompt="hi", extra_body={"sampler": "threshold", "sampler_options": {"x": 1}})


def test_limits_401_413_and_prompt_length(demo):
    config = ServeConfig(NAME, api_key="s3cret", max_body_bytes=2000, max_prompt_tokens=8)
    with serve_in_thread(create_app(config, engine=Engine(*demo, max_batch=2))) as url:
        assert post(url, "/v1/completions", {"prompt": [1, 2]}).status_code == 401
        assert post(url, "/v1/completions", {"prompt": [1, 2]}, authorization="Bearer wrong").status_code == 401
        with pytest.raises(openai.AuthenticationError):
            client(url, "wrong").models.list()
        assert httpx.get(f"{url}/health").status_code == 200  # probes need no key
        good = client(url, "s3cret")
        assert good.completions.create(model=NAME, prompt=[10, 11, 12], max_tokens=16).choices[0].text is not None
        r = post(url, "/v1/completions", {"prompt": "x" * 3000}, authorization="Bearer s3cret")
        assert r.status_code == 413 and "2000" in r.json()["error"]["message"]
        with pytest.raises(openai.BadRequestError, match="at most 8"):
            good.completions.create(model=NAME, prompt=list(range(10, 22)), max_tokens=16)


@pytest.fixture(scope="module")
def slow_demo():
    """demo-llada (bidirectional; no early end at EOS): gen 256 in 256 steps takes 256 forwards, seconds."""
    return dlm_decode.load_model("demo-llada")


def test_full_queue_429_then_disconnect_cancels_and_the_server_serves_on(slow_demo):
    engine = Engine(*slow_demo, max_batch=1)
    with serve_in_thread(create_app(ServeConfig("demo-llada", max_waiting=0), engine=engine)) as url:
        long = {"messages": CHAT, "max_tokens": 256, "steps": 256, "stream": True}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=long, timeout=60) as r:
            lines = r.iter_lines()  # (kept: a dropped iterator closes the connection)
            first = next(lines)  # the role chunk: the request is in flight
            assert first.startswith("data: ") and '"role": "assistant"' in first
            assert scrape(url)[("dlm_requests_in_flight", ())] == 1
            busy = post(url, "/v1/chat/completions", {"messages": CHAT, **FAST})
            assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
        # the client closed its stream mid-answer: its row leaves, and the next request is served
        deadline = time.monotonic() + 30
        while scrape(url).get(("dlm_running_rows", ()), 1) or scrape(url)[("dlm_requests_in_flight", ())]:
            assert time.monotonic() < deadline, "the cancelled request kept its row"
            time.sleep(0.1)
        m = scrape(url)
        assert m[("dlm_requests_total", (("endpoint", "chat"), ("status", "499")))] == 1
        assert m[("dlm_requests_total", (("endpoint", "chat"), ("status", "429")))] == 1
        assert m[("dlm_forwards_total", ())] < 256  # it left before its end
        ok = client(url).chat.completions.create(model="demo-llada", messages=CHAT, **FAST)
        assert ok.choices[0].message.content == alone(slow_demo, CHAT, True, FAST).text


def test_metrics_count_each_request(server):
    url, _ = server
    before = scrape(url)
    resp = client(url).chat.completions.create(model=NAME, messages=CHAT, **FAST).model_dump()
    after = scrape(url)
    ok = ("dlm_requests_total", (("endpoint", "chat"), ("status", "200")))
    assert after[ok] - before.get(ok, 0) == 1
    assert after[("dlm_request_nfe_sum", ())] - before[("dlm_request_nfe_sum", ())] == resp["dlm"]["nfe"]
    assert after[("dlm_request_nfe_count", ())] - before[("dlm_request_nfe_count", ())] == 1
    grew = after[("dlm_completion_tokens_total", ())] - before[("dlm_completion_tokens_total", ())]
    assert grew == resp["usage"]["completion_tokens"]
    assert after[("dlm_prompt_tokens_total", ())] - before[("dlm_prompt_tokens_total", ())] == 29
    assert after[("dlm_forwards_total", ())] - before[("dlm_forwards_total", ())] == resp["dlm"]["nfe"]  # alone
    assert after[("dlm_request_latency_seconds_count", ())] > before[("dlm_request_latency_seconds_count", ())]
    assert (("dlm_request_queue_seconds_bucket", (("le", "+Inf"),))) in after
    assert after[("dlm_queue_length", ())] == 0 and after[("dlm_running_rows", ())] == 0


class Broken(Engine):
    def submit(self, prompt, **options):
        raise RuntimeError("secret internal detail")


def test_server_error_is_a_500_with_a_request_id_and_no_traceback(demo, caplog):
    with serve_in_thread(create_app(ServeConfig(NAME), engine=Broken(*demo, max_batch=1))) as url:
        r = post(url, "/v1/completions", {"prompt": "hi"})
    assert r.status_code == 500
    msg, rid = r.json()["error"]["message"], r.headers["x-request-id"]
    assert rid in msg and "secret" not in r.text and "Traceback" not in r.text
    logged = [rec for rec in caplog.records if rid in rec.getMessage()]
    assert logged and logged[0].exc_info and "secret internal detail" in str(logged[0].exc_info[1])


def test_base_install_does_not_import_the_server_and_a_missing_extra_names_the_install(monkeypatch, capsys):
    # the modules the CLI imports for its parser import no server package at their top
    import ast
    import importlib.util

    from dlm_decode import cli
    from dlm_decode.serve import cli as serve_cli

    for mod in (dlm_decode.serve, serve_cli, cli):
        tree = ast.parse(open(mod.__file__).read())
        names = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
        assert not {m.split(".")[0] for m in names} & {"fastapi", "uvicorn", "prometheus_client"}, mod.__name__
        assert not {m for m in names if m.startswith("dlm_decode.serve.") and m != "dlm_decode.serve.cli"}
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda m, *a: None if m == "fastapi" else real(m, *a))
    assert cli.main(["serve", NAME, "--port", "1"]) == 2
    assert 'pip install -e ".[serve]"' in capsys.readouterr().err


def test_bad_flags_fail_before_loading(capsys):
    from dlm_decode.cli import main

    assert main(["serve", NAME, "--sampler", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
    assert main(["serve", NAME, "--max-batch", "0"]) == 2
    assert "--max-batch" in capsys.readouterr().err
    assert main(["serve", "/nowhere/model"]) == 2


@pytest.mark.slow
def test_cli_server_drains_on_sigterm(tmp_path):
    """The real command in a subprocess: ready, a long request running, SIGTERM: new requests 503, the running one
    finishes with 200, the process exits 0."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "dlm_decode.cli", "serve", "demo-llada", "--port", str(port), "--max-batch", "2"]
    log = (tmp_path / "server.log").open("w")  # a file, not a pipe nobody reads (a full pipe blocks the server)
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        box = {}
        body = {"messages": CHAT, "max_tokens": 128, "steps": 128}  # seconds
        t = threading.Thread(target=lambda: box.setdefault("r", post(url, "/v1/chat/completions", body)))
        t.start()
        while scrape(url)[("dlm_requests_in_flight", ())] != 1:
            assert time.monotonic() < deadline and t.is_alive(), "the request never ran"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert httpx.get(f"{url}/health").json() == {"status": "draining"}
        refused = post(url, "/v1/completions", {"prompt": "hi"})
        assert refused.status_code == 503 and "draining" in refused.json()["error"]["message"]
        t.join(120)
        assert box["r"].status_code == 200 and box["r"].json()["choices"][0]["message"]["content"] is not None
        assert proc.wait(60) == 0
        assert "draining 1 request(s)" in (tmp_path / "server.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


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


def test_lm_eval_local_completions_through_the_server_scores_as_the_plugin(tmp_path, slow_demo):
    """lm-eval's own ``local-completions`` model pointed at the server runs a generate_until task with the answers
    and the score of the ``dlm_decode`` plugin (``tests/test_eval_plugin.py``'s plain task)."""
    pytest.importorskip("lm_eval")
    pytest.importorskip("tenacity", reason="lm-eval's API models need tenacity (the dev extra installs it)")
    import lm_eval
    import lm_eval.models.openai_completions  # noqa: F401  (registers local-completions)
    from lm_eval.tasks import TaskManager

    import dlm_decode.eval.lm  # noqa: F401  (registers the plugin's model name, as the entry point does)

    prompts = ['copy ["Alan Wells", "Grace Wright"]', 'copy ["Billy Ramos", "Alan Wells", "Grace Wright"]']
    out = dlm_decode.generate(slow_demo[0], prompts, tokenizer=slow_demo[1], chat=False, gen_length=32, block_length=32)
    answers = [r.text.split("\n")[0] for r in out.rows]
    assert all(answers)  # non-empty: a match is no coincidence of empty strings
    docs = [{"prompt": prompts[0], "target": answers[0]}, {"prompt": prompts[1], "target": answers[1] + " (not this)"}]
    data = tmp_path / "plain_gen.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    head = f"task: plain_gen\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
    (tmp_path / "plain_gen.yaml").write_text(head + _PLAIN_GENERATE)
    common = dict(tasks=["plain_gen"], bootstrap_iters=0, log_samples=True)
    plugin = lm_eval.simple_evaluate(
        model="dlm_decode",
        model_args="pretrained=demo-llada,gen_length=32,block_length=32,progress=false,device=cpu",
        task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
        **common,
    )
    engine = Engine(*slow_demo, max_batch=2, defaults={"block_length": 32})
    with serve_in_thread(create_app(ServeConfig("demo-llada"), engine=engine)) as url:
        args = f"model=demo-llada,base_url={url}/v1/completions,tokenized_requests=False,tokenizer_backend=None"
        served = lm_eval.simple_evaluate(
            model="local-completions",
            model_args=args + ",max_retries=1,num_concurrent=2",
            task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
            **common,
        )
    for res in (plugin, served):
        samples = sorted(res["samples"]["plain_gen"], key=lambda x: x["doc_id"])
        assert [x["filtered_resps"][0] for x in samples] == answers
        assert res["results"]["plain_gen"]["exact_match,none"] == 0.5


def test_server_and_batch_file_give_the_same_answers_and_messages(server, tmp_path):
    """One body, two paths: the server's answer (and error message) equals ``dlm-decode batch``'s for that line."""
    from dlm_decode.cli import main

    url, _ = server
    bodies = [
        (
            "/v1/chat/completions",
            {"messages": CHAT, "max_tokens": 32, "stop": ["]"], "response_format": {"type": "text"}},
        ),
        ("/v1/completions", {"prompt": "Sort: pear, apple, fig", "max_tokens": 16, "sampler": "threshold", "seed": 2}),
        ("/v1/completions", {"prompt": "hi", "echo": True}),
        ("/v1/chat/completions", {"messages": CHAT, "cache": "nope"}),
    ]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(
        "".join(json.dumps({"custom_id": str(i), "url": u, "body": b}) + "\n" for i, (u, b) in enumerate(bodies))
    )
    assert main(["batch", NAME, "-i", str(src), "-o", str(dst)]) == 0
    lines = [json.loads(x)["response"] for x in dst.read_text().splitlines()]
    for (path, body), line in zip(bodies, lines, strict=True):
        got = post(url, path, body)
        assert got.status_code == line["status_code"]
        want, have = line["body"], got.json()
        if got.status_code != 200:
            assert have["error"]["message"] == want["error"]["message"]
            continue
        assert have["choices"][0] | {"index": 0} == want["choices"][0] and have["usage"] == want["usage"]
        assert have["dlm"]["completion_ids"] == want["dlm"]["completion_ids"]


def live_tensor_bytes() -> int:
    import gc
    import warnings

    gc.collect()
    with warnings.catch_warnings():  # asking every object whether it is a tensor touches torch's deprecated aliases
        warnings.simplefilter("ignore", FutureWarning)
        return sum(o.numel() * o.element_size() for o in gc.get_objects() if torch.is_tensor(o))


def test_the_engine_keeps_no_memory_from_step_to_step(server):
    """Grad mode is per thread: without no_grad on the engine's own steps every step left tensors alive (the server
    grew by gigabytes under load: 22 GB after a few hundred steps at 16 rows). Rounds of 4 concurrent requests leave
    the live tensors as they were."""
    url, engine = server

    def round_of_four() -> None:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda i: client(url).completions.create(model=NAME, prompt=f"Sort: {i}", **FAST), range(4)))

    round_of_four()
    before = live_tensor_bytes()
    round_of_four()
    round_of_four()
    assert live_tensor_bytes() - before < 1 << 20


def test_cli_defaults_loopback_and_the_api_key_from_the_environment(monkeypatch):
    """``dlm-decode serve``'s wiring, up to uvicorn's start (replaced here): the loopback default, the port, the
    served name, the key from ``$DLM_DECODE_API_KEY`` (a flag wins), and the decoding flags as the engine's defaults."""
    from dlm_decode.cli import main
    from dlm_decode.serve import cli as serve_cli
    from dlm_decode.serve.server import DrainingServer

    seen = []
    monkeypatch.setattr(DrainingServer, "run", lambda self: seen.append(self.config))
    monkeypatch.setenv(serve_cli.API_KEY_ENV, "from-env")
    assert main(["serve", NAME, "--port", "8123", "--sampler", "threshold", "--sampler-opt", "threshold=0.8"]) == 0
    assert main(["serve", NAME, "--api-key", "flag", "--served-model-name", "m", "--host", "127.0.0.2"]) == 0
    first, second = seen
    assert (first.host, first.port, second.host, second.port) == ("127.0.0.1", 8123, "127.0.0.2", 8000)
    assert first.app.state.config.api_key == "from-env" and first.app.state.config.model_name == NAME
    assert second.app.state.config.api_key == "flag" and second.app.state.config.model_name == "m"
    from dlm_decode.cli import build_parser

    args = build_parser().parse_args(["serve", NAME, "--sampler", "threshold", "--sampler-opt", "threshold=0.8"])
    defaults = serve_cli.server_defaults(args)
    assert defaults["sampler"] == "threshold" and defaults["sampler_options"] == {"threshold": 0.8}


def test_health_is_503_while_loading_then_200_and_a_failed_load_stays_503(demo):
    gate = threading.Event()

    def load():
        gate.wait(30)
        return Engine(*demo, max_batch=1)

    with serve_in_thread(create_app(ServeConfig(NAME), load=load)) as url:
        r = httpx.get(f"{url}/health")
        assert (r.status_code, r.json()) == (503, {"status": "loading"})
        busy = post(url, "/v1/completions", {"prompt": "hi"})
        assert busy.status_code == 503 and "loading" in busy.json()["error"]["message"]
        gate.set()
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        answer = client(url).completions.create(model=NAME, prompt=[10, 11, 12], max_tokens=16)
        assert answer.choices[0].finish_reason in ("stop", "length")

    def broken():
        raise RuntimeError("no weights")

    with serve_in_thread(create_app(ServeConfig(NAME), load=broken)) as url:
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/health").json()["status"] == "loading":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        r = httpx.get(f"{url}/health")
        assert (r.status_code, r.json()) == (503, {"status": "failed"})
