"""OpenAI request and response bodies, shared by the batch files (``batch_file``) and the server (``dlm_decode.serve``).

One home for the rules, so a request gives the same answer and the same messages on both paths:

* ``parse_body``: a ``/v1/chat/completions`` or ``/v1/completions`` body -> ``Body`` (prompt, engine options, stop
  strings, streaming). OpenAI's fields ``max_tokens`` (or ``max_completion_tokens``; the gen length),
  ``temperature``, ``top_p``, ``seed``, ``stop``, ``n`` (1), ``user`` and ``model`` (checked by the caller), and our
  extras ``sampler``, ``sampler_options``, ``cache``, ``cache_options``, ``block_length``, ``steps``, ``top_k``,
  ``stop_at_eos``; the server adds ``stream``, ``stream_options`` and ``timeout`` (seconds). Fields that only make
  sense at their neutral value (penalties 0, ``logprobs`` off, ``echo`` false, ``best_of`` 1) are accepted there;
  any other field is refused with a ``ValueError`` naming it.
* ``cut_at_stop``: OpenAI's ``stop``: the text ends before the first occurrence of any stop string (not included).
* ``response_body``: a finished ``EngineResult`` -> a ``chat.completion`` / ``text_completion`` object with
  ``usage`` and a ``dlm`` object (``nfe``, ``token_forwards``, ``seconds``, ``completion_ids``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from dlm_decode.engine.request import EngineResult

URLS = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
BODY_OPTIONS = {
    "max_tokens": "gen_length",
    "max_completion_tokens": "gen_length",
    "temperature": "temperature",
    "top_p": "top_p",
    "seed": "seed",
    "top_k": "top_k",
    "sampler": "sampler",
    "sampler_options": "sampler_options",
    "cache": "cache",
    "cache_options": "cache_options",
    "block_length": "block_length",
    "steps": "steps",
    "stop_at_eos": "stop_at_eos",
    "attention": "attention",
}
IGNORED = {"model", "user", "metadata"}
NEUTRAL = {  # accepted only at the value that changes nothing
    "frequency_penalty": (0, 0.0, None),
    "presence_penalty": (0, 0.0, None),
    "repetition_penalty": (1, 1.0, None),
    "logprobs": (False, None, 0),
    "top_logprobs": (0, None),
    "echo": (False, None),
    "best_of": (1, None),
    "n": (1, None),
    "logit_bias": (None, {}),
    "parallel_tool_calls": (None,),
    "tool_choice": (None, "none"),
    "response_format": (None, {"type": "text"}),
    "store": (False, None),
    "service_tier": (None, "auto", "default"),
}
SERVER_FIELDS = ("stream", "stream_options", "timeout")
MAX_STOPS = 4  # as OpenAI


@dataclass(frozen=True)
class Body:
    """A checked request body: what to decode and how, and what to do with the answer."""

    kind: str  # "chat" or "completion"
    prompt: Any  # messages, text, or token ids
    options: dict[str, Any]  # engine options (``Engine.submit`` keywords)
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    timeout: float | None = None
    model: str | None = None


def parse_body(body: Any, kind: str, *, server: bool = False) -> Body:
    """A request body -> ``Body``; ``ValueError`` naming an unsupported or bad field. ``server``: streaming and
    ``timeout`` are allowed (a batch file has neither)."""
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object")
    field = "messages" if kind == "chat" else "prompt"
    other = "prompt" if kind == "chat" else "messages"
    if field not in body:
        raise ValueError(f"body needs '{field}' for {'chat completions' if kind == 'chat' else 'completions'}")
    if other in body:
        raise ValueError(f"body has '{other}', which this url does not take; give '{field}'")
    if not server and body.get("stream", False):
        raise ValueError("'stream' is not available in a batch file")
    known = set(BODY_OPTIONS) | IGNORED | {field, "stop"} | (set(SERVER_FIELDS) if server else {"stream"})
    unknown = sorted(set(body) - known - set(NEUTRAL))
    if unknown:
        supported = sorted(set(BODY_OPTIONS) | {"stop"} | (set(SERVER_FIELDS) if server else set()))
        raise ValueError(f"unsupported field(s) {', '.join(unknown)}; supported: {', '.join(supported)}")
    for key, ok in NEUTRAL.items():
        if key in body and not _neutral(body[key], ok):
            allowed = " or ".join("null" if v is None else repr(v) for v in ok)
            raise ValueError(f"'{key}' is not supported (only {allowed}), got {body[key]!r}")
    if "max_tokens" in body and "max_completion_tokens" in body:
        raise ValueError("give 'max_tokens' or 'max_completion_tokens', not both")
    for key in ("max_tokens", "max_completion_tokens"):  # named as sent (the engine would name its gen_length)
        v = body.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"'{key}' (the generation length) must be a positive integer, got {v!r}")
    opts = {BODY_OPTIONS[k]: v for k, v in body.items() if k in BODY_OPTIONS}
    opts["chat"] = kind == "chat"
    prompt = _messages(body[field]) if kind == "chat" else _prompt(body[field])
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError(f"'model' must be a string, got {model!r}")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ValueError(f"'stream' must be true or false, got {stream!r}")
    return Body(kind, prompt, opts, _stops(body.get("stop")), stream, _include_usage(body), _timeout(body), model)


def _neutral(value: Any, ok: tuple) -> bool:
    """``value`` is one of ``ok`` (True is not 1, 0 is not False)."""
    exact = [v for v in ok if v is None or isinstance(v, bool)]
    equal = [v for v in ok if not (v is None or isinstance(v, bool))]
    return any(v is value for v in exact) or (not isinstance(value, bool) and value in equal)


def body_options(body: dict[str, Any], kind: str) -> tuple[dict[str, Any], Any]:
    """A batch file's body -> (engine options, prompt); ``ValueError`` naming an unsupported or bad field."""
    parsed = parse_body(body, kind)
    return parsed.options, parsed.prompt


def _messages(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value or not all(isinstance(m, dict) for m in value):
        raise ValueError("'messages' must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(value):
        extra = sorted(set(m) - {"role", "content", "name"})
        if extra:
            raise ValueError(f"messages[{i}]: unsupported key(s) {', '.join(extra)}; a message has role and content")
        role, content = m.get("role"), m.get("content")
        if role not in ("system", "user", "assistant", "developer"):
            raise ValueError(f"messages[{i}]: 'role' must be system, user, assistant or developer, got {role!r}")
        if isinstance(content, list):  # content parts: text only
            if not all(_text_part(p) for p in content):
                raise ValueError(f"messages[{i}]: only text parts ({{'type': 'text', 'text': ...}}) are supported")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}]: 'content' must be a string, got {content!r}")
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


def _text_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)


def _prompt(value: Any) -> str | list[int]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]  # one prompt, as a list of one
    ids = isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    if not isinstance(value, str) and not ids:
        raise ValueError("'prompt' must be a string or a list of token ids (one prompt a request)")
    return value


def _stops(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOPS:
        raise ValueError(f"'stop' must be a non-empty string or a list of up to {MAX_STOPS} of them, got {value!r}")
    return tuple(stops)


def _include_usage(body: dict[str, Any]) -> bool:
    so = body.get("stream_options")
    if so is None:
        return False
    if not isinstance(so, dict) or set(so) - {"include_usage"} or not isinstance(so.get("include_usage", False), bool):
        raise ValueError(f"'stream_options' supports only {{'include_usage': true|false}}, got {so!r}")
    if not body.get("stream", False):
        raise ValueError("'stream_options' is only allowed with 'stream': true")
    return so.get("include_usage", False)


def _timeout(body: dict[str, Any]) -> float | None:
    t = body.get("timeout")
    if t is None:
        return None
    if isinstance(t, bool) or not isinstance(t, int | float) or not t > 0:
        raise ValueError(f"'timeout' must be a positive number of seconds, got {t!r}")
    return float(t)


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """(the text before the first occurrence of any stop string, whether one occurred)."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


def stop_tokens(tokenizer: Any, ids: list[int], stops: tuple[str, ...]) -> int:
    """The completion tokens a stopped answer used: the fewest leading ids whose text holds a stop string."""
    lo, hi = 1, len(ids)
    while lo < hi:  # the decoded text of a prefix only grows
        mid = (lo + hi) // 2
        if cut_at_stop(tokenizer.decode(ids[:mid], skip_special_tokens=True), stops)[1]:
            hi = mid
        else:
            lo = mid + 1
    return lo


def response_body(
    result: EngineResult, kind: str, model_name: str, stop: tuple[str, ...] = (), tokenizer: Any | None = None
) -> dict[str, Any]:
    """A ``chat.completion`` / ``text_completion`` object for a finished request (``stop`` cuts its text)."""
    text = result.text if result.text is not None else ""
    completion = len(result.completion_ids)
    text, stopped = cut_at_stop(text, stop)
    if stopped and tokenizer is not None:
        completion = stop_tokens(tokenizer, result.completion_ids, stop)
    finish = "stop" if stopped or result.finish_reason == "stop" else "length"
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
    if kind == "chat":
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {
        "id": f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{result.id}",
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [choice],
        "usage": usage(result, completion),
        "dlm": dlm_stats(result),
    }


def usage(result: EngineResult, completion: int) -> dict[str, int]:
    prompt = len(result.prompt_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def dlm_stats(result: EngineResult) -> dict[str, Any]:
    """Our numbers for a request: its forwards (``nfe``), query slots computed, decode seconds, answer ids."""
    return {
        "nfe": result.nfe,
        "token_forwards": result.token_forwards,
        "seconds": round(result.seconds, 6),
        "completion_ids": result.completion_ids,
    }
