"""``dlm-decode batch MODEL -i requests.jsonl -o results.jsonl``: offline batch files in the OpenAI batch format.

The convention of OpenAI's Batch API and vLLM's ``run_batch``. An input line:

    {"custom_id": "q1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 64, "temperature": 0, "seed": 1,
              "sampler": "threshold", "sampler_options": {"threshold": 0.9}, "cache": "prefix"}}

``url`` is ``/v1/chat/completions`` (``messages``) or ``/v1/completions`` (``prompt``: text, or token ids). Body
fields: ``max_tokens`` (the gen length), ``temperature``, ``top_p``, ``seed``, ``stop``, and our extras ``sampler``,
``sampler_options``, ``cache``, ``cache_options``, ``block_length``, ``steps``, ``top_k``, ``stop_at_eos``;
``model`` is accepted and ignored, ``n`` must be 1 and ``stream`` false. The bodies are read and answered by
``openai_format``, as the server (``dlm-decode serve``) reads and answers them. Unset options take the checkpoint's
``generation_config.json`` defaults, as ``generate`` does. An output line, in input order:

    {"id": "batch_req_0", "custom_id": "q1", "response": {"status_code": 200, "request_id": "...", "body": {...}},
     "error": null}

with a ``chat.completion`` or ``text_completion`` body holding ``usage`` and a ``dlm`` object (``nfe``,
``token_forwards``, ``seconds``). A bad line gets status 400 with the message (and ``error`` set); the others run.
``--resume`` skips the custom_ids the output file already holds; lines are written as soon as every earlier line is,
so an interrupted run (Ctrl-C) keeps every finished line. Under ``accelerate launch`` / ``torchrun`` (N processes,
one per device), each process takes every N-th line left, writes ``OUTPUT.partR``, and rank 0 merges the parts into
the output in input order: the same file one process writes. Every line runs through one ``Engine``: requests with
different options share its forwards, and each answer equals ``dlm-decode generate`` of that request alone.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

import dlm_decode
from dlm_decode.engine.engine import Engine, Handle
from dlm_decode.engine.openai_format import URLS, Body, parse_body, response_body
from dlm_decode.models.loading import check_device, model_facts


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="checkpoint directory or shipped demo name")
    p.add_argument("-i", "--input", required=True, help="requests, one JSON object per line (OpenAI batch format)")
    p.add_argument("-o", "--output", required=True, help="results, one JSON object per line, in input order")
    p.add_argument("--max-batch", type=int, default=8, help="requests decoded at once (default 8)")
    p.add_argument("--resume", action="store_true", help="skip the custom_ids the output file already holds")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")


def parse_line(text: str, n: int) -> tuple[str, Body]:
    """-> (custom_id, checked body) of input line ``n``; ``ValueError`` naming the field otherwise."""
    try:
        line = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"line {n}: not JSON ({err.msg})") from None
    if not isinstance(line, dict):
        raise ValueError(f"line {n}: must be a JSON object")
    cid = line.get("custom_id")
    if not isinstance(cid, str) or not cid:
        raise ValueError(f"line {n}: 'custom_id' must be a non-empty string")
    if line.get("method", "POST") != "POST":
        raise ValueError(f"line {n}: 'method' must be POST")
    kind = URLS.get(line.get("url"))
    if kind is None:
        raise ValueError(f"line {n}: 'url' must be one of {', '.join(URLS)}, got {line.get('url')!r}")
    body = line.get("body")
    if not isinstance(body, dict):
        raise ValueError(f"line {n}: 'body' must be a JSON object")
    return cid, parse_body(body, kind)


def output_line(n: int, cid: str | None, body: dict[str, Any] | None, error: str | None) -> dict[str, Any]:
    if error is not None:
        err = {"message": error, "type": "invalid_request_error"}
        return {
            "id": f"batch_req_{n}",
            "custom_id": cid,
            "response": {"status_code": 400, "request_id": f"req_{n}", "body": {"error": err}},
            "error": {"code": "invalid_request", "message": error},
        }
    return {
        "id": f"batch_req_{n}",
        "custom_id": cid,
        "response": {"status_code": 200, "request_id": f"req_{n}", "body": body},
        "error": None,
    }


def read_requests(path: Path) -> list[tuple[int, str | None, Any]]:
    """(line number, custom_id, its ``Body`` or the error message) of every line."""
    out, seen = [], set()
    for n, text in enumerate(path.read_text().splitlines()):
        if not text.strip():
            continue
        try:
            cid, item = parse_line(text, n)
            if cid in seen:
                raise ValueError(f"line {n}: custom_id {cid!r} repeats an earlier line's")
            seen.add(cid)
        except ValueError as err:
            cid, item = _custom_id(text), str(err)
        out.append((n, cid, item))
    return out


def _custom_id(text: str) -> str | None:
    try:
        cid = json.loads(text).get("custom_id")
    except (json.JSONDecodeError, AttributeError):
        return None
    return cid if isinstance(cid, str) else None


def run(args: argparse.Namespace) -> int:
    check_device(args.device, "--device")
    src, dst = Path(args.input), Path(args.output)
    if not src.is_file():
        raise FileNotFoundError(f"--input {src}: no such file")
    if isinstance(args.max_batch, bool) or args.max_batch < 1:
        raise ValueError(f"--max-batch must be a positive integer, got {args.max_batch}")
    rank, world = shard()
    parts = [part_path(dst, r) for r in range(world)] if world > 1 else []
    if (dst.exists() or (parts and parts[rank].exists())) and not args.resume:  # each its own: no race
        raise ValueError(f"--output {dst} (or its parts) exists; pass --resume to continue it, or choose another file")
    written = [line for f in [dst, *parts] for line in _lines(f)]
    done = {x["custom_id"] for x in written} | {int(x["id"].rsplit("_", 1)[1]) for x in written if not x["custom_id"]}
    todo = read_requests(src)[rank::world]  # each process its share of the lines (not racing the others)
    todo = [t for t in todo if (t[1] or t[0]) not in done]  # less the lines written (by custom_id, else line)
    model_facts(args.model)  # config.json checked before any weight is read
    device = f"cuda:{os.environ.get('LOCAL_RANK', rank)}" if world > 1 and args.device == "cuda" else args.device
    model, tok = dlm_decode.load_model(args.model, dtype=args.dtype, device=device)
    engine = Engine(model, tok, max_batch=args.max_batch)
    name = Path(str(args.model)).name
    out = parts[rank] if world > 1 else dst
    with out.open("a") as fh, tqdm(total=len(todo), desc="batch", unit="req", disable=rank > 0) as bar:
        write_in_order(engine, todo, fh, bar, name)
    if world > 1:
        merge_parts(dst, parts, rank)
    return 0


def shard() -> tuple[int, int]:
    """(this process's rank, the number of processes) under ``accelerate launch`` / ``torchrun``, else (0, 1)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return (int(os.environ.get("RANK", "0")), world) if world > 1 else (0, 1)


def part_path(dst: Path, rank: int) -> Path:
    return dst.with_name(f"{dst.name}.part{rank}")


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def merge_parts(dst: Path, parts: list[Path], rank: int) -> None:
    """Once every process has written its part, rank 0 appends the parts' lines to ``dst`` in input order (the
    line number in each ``id``) and removes the parts: the same file one process writes."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="gloo")
    dist.barrier()
    if rank == 0:
        lines = sorted((x for p in parts for x in _lines(p)), key=lambda x: int(x["id"].rsplit("_", 1)[1]))
        with dst.open("a") as fh:
            fh.writelines(json.dumps(x) + "\n" for x in lines)
        for p in parts:
            p.unlink()
    dist.barrier()
    dist.destroy_process_group()


def write_in_order(engine: Engine, todo: list, fh: Any, bar: Any, name: str) -> None:
    """Submit every line, step the engine, and write each line once every earlier one is written."""
    pending: list[tuple[int, str | None, Handle | str, Body | None]] = []
    for n, cid, item in todo:
        if isinstance(item, str):
            pending.append((n, cid, item, None))
            continue
        try:
            pending.append((n, cid, engine.submit(item.prompt, **item.options), item))
        except ValueError as err:
            pending.append((n, cid, str(err), item))
    pos = 0
    while pos < len(pending):
        n, cid, h, body = pending[pos]
        if isinstance(h, Handle) and not h.done:
            engine.step()
            continue
        if isinstance(h, str):
            line = output_line(n, cid, None, h)
        else:
            r = h.result()
            line = (
                output_line(n, cid, response_body(r, body.kind, name, body.stop, engine.tokenizer), None)
                if r.error is None
                else output_line(n, cid, None, r.error)
            )
        fh.write(json.dumps(line) + "\n")
        fh.flush()
        bar.update(1)
        pos += 1
