"""``dlm-decode serve``: an OpenAI-compatible HTTP server on the continuous-batching engine (``dlm_decode.engine``).

    dlm-decode serve demo-llada2 --port 8000 --max-batch 8 --sampler threshold --sampler-opt threshold=0.9

``POST /v1/chat/completions``, ``POST /v1/completions`` (streamed or not), ``GET /v1/models``, ``GET /health``,
``GET /metrics``. The reference for the protocol is OpenAI's API as its ``openai`` client reads it (the tests parse
every answer with that client's own types); the serving anchors read for this design (dlmserve, SGLang's dLLM mode,
vLLM's DiffusionGemma) are summarised in docs/ALGORITHMS.md section 16. Where we differ on purpose: each request
chooses its own decoding rule (sampler, cache, block length, steps) in ``extra_body``, the stream carries text as the
engine makes it final (not one chunk per request or canvas), and every answer equals ``dlm_decode.generate`` of that
request alone, under any load.

Modules: ``app`` (the FastAPI app and its routes), ``answer`` (a request's run: the engine's deltas brought to the
event loop, stop strings, SSE chunks), ``metrics`` (Prometheus series), ``cli`` (the command and the SIGTERM drain).
FastAPI, uvicorn and prometheus-client come with the optional extra ``.[serve]``; the base install never imports
this package.
"""
