"""``dlm-decode serve MODEL``: load a model and serve it over OpenAI's HTTP API (see ``dlm_decode.serve``).

The decoding flags (``--sampler``, ``--sampler-opt``, ``--cache``, ``--gen-length``, ...) are ``generate``'s and set the
server's defaults; a request overrides them in its body (``extra_body`` in the ``openai`` client). Everything the
flags and the checkpoint's files decide is checked before any weight is read (exit 2, one line). The server binds
127.0.0.1 unless ``--host`` says otherwise; ``--api-key`` (or ``$DLM_DECODE_API_KEY``) makes ``/v1`` ask for
``Authorization: Bearer KEY``. SIGTERM drains: ``/health`` and new requests answer 503, the running ones finish, then
the process exits 0; a second SIGTERM, or Ctrl-C, is uvicorn's own shutdown.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

from dlm_decode.cli import add_decoding_args, check_components, decoding_kwargs
from dlm_decode.core.generation_config import resolve_chat
from dlm_decode.core.inputs import encode_prompts
from dlm_decode.decode import check_request
from dlm_decode.models.loading import check_device, load_tokenizer, model_facts

API_KEY_ENV = "DLM_DECODE_API_KEY"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="checkpoint directory or shipped demo name (demo-llada, demo-dream, demo-llada2)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--max-batch", type=int, default=8, help="requests decoded at once (default 8)")
    p.add_argument(
        "--max-waiting", type=int, default=64, help="requests waiting beyond --max-batch before a 429 (default 64)"
    )
    p.add_argument(
        "--max-batch-tokens", type=int, default=None, help="cap on the running requests' canvas slots summed"
    )
    p.add_argument("--served-model-name", default=None, help="the `model` requests name (default: MODEL's last part)")
    p.add_argument("--api-key", default=None, help=f"require `Authorization: Bearer KEY` (default: ${API_KEY_ENV})")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body (default 1 MiB)")
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="longest prompt in tokens (default: any)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_decoding_args(p)


def server_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """The decoding flags -> the engine's default request options (unset flags left to the checkpoint)."""
    kw = decoding_kwargs(args)
    check_components(kw)
    return {k: v for k, v in kw.items() if v is not None}


def check_args(args: argparse.Namespace) -> dict[str, Any]:
    """Every flag checked, and the defaults checked against the checkpoint, before any weight is read."""
    check_device(args.device, "--device")
    for name in ("max_batch", "max_waiting", "max_body_bytes", "max_prompt_tokens", "max_batch_tokens"):
        value = getattr(args, name)
        if value is not None and (value < 1 if name != "max_waiting" else value < 0):
            raise ValueError(f"--{name.replace('_', '-')} must be {'>= 0' if name == 'max_waiting' else '>= 1'}")
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    defaults = server_defaults(args)
    facts, tok = model_facts(args.model), load_tokenizer(args.model)
    probe = encode_prompts([[1]], tok, resolve_chat(facts.generation, False))
    check_request(facts, probe, **defaults)
    return defaults


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from dlm_decode.serve.app import ServeConfig, create_app
    from dlm_decode.serve.server import DrainingServer

    defaults = check_args(args)
    name = args.served_model_name or Path(str(args.model)).name
    config = ServeConfig(
        model_name=name,
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        max_waiting=args.max_waiting,
        max_body_bytes=args.max_body_bytes,
        max_prompt_tokens=args.max_prompt_tokens,
    )
    if args.host not in ("127.0.0.1", "localhost", "::1") and config.api_key is None:
        print(f"dlm-decode serve: warning: listening on {args.host} without an API key", flush=True)
    app = create_app(config, load=lambda: _engine(args, defaults))
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    server = DrainingServer(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level))
    server.run()
    return 0


def _engine(args: argparse.Namespace, defaults: dict[str, Any]):
    import dlm_decode
    from dlm_decode.engine import Engine

    model, tok = dlm_decode.load_model(args.model, dtype=args.dtype, device=args.device)
    return Engine(model, tok, max_batch=args.max_batch, max_tokens=args.max_batch_tokens, defaults=defaults)
