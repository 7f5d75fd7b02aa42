"""The decode loop: the top of the decoding package. Every import points down.

    decode/            generate (generate.py) -> prepare, Scheduler (scheduler.py) -> merged forwards (merged.py),
                       advance / prepare_step / finish_step (loop.py) -> commit_mask (commit.py)
      request.py       check_request: the one validation of a request (names, options, lengths, prompts, defaults)
      oracle.py        oracle_generate: both passes of the Learn2PD oracle
    samplers/  cache/  models/  kernels/     the rooms: one rule, policy or model per file
    core/              config (and resolve_lengths), state, proposals, input checks, masks: the floor

``samplers`` and ``cache`` stand on ``core`` only; ``decode`` stands on all of them and nothing below imports it.
"""

from dlm_decode.decode.commit import commit_mask
from dlm_decode.decode.generate import generate
from dlm_decode.decode.loop import Unit, advance, step
from dlm_decode.decode.oracle import oracle_generate
from dlm_decode.decode.output import GenerateOutput, RowResult
from dlm_decode.decode.prepare import prepare
from dlm_decode.decode.request import Request, check_request
from dlm_decode.decode.scheduler import Scheduler

__all__ = [
    "GenerateOutput",
    "Request",
    "RowResult",
    "check_request",
    "commit_mask",
    "generate",
    "oracle_generate",
    "prepare",
    "Scheduler",
    "Unit",
    "advance",
    "step",
]
