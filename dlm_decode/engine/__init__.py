"""The continuous-batching engine (``Engine``) and what stands on it (offline batch files, ``batch_file``).

Imports point down: ``engine`` stands on ``decode`` (its step scheduler is the one decode loop), never the reverse.
"""

from dlm_decode.engine.engine import Delta, Engine, Handle
from dlm_decode.engine.request import REQUEST_OPTIONS, EngineResult

__all__ = ["REQUEST_OPTIONS", "Delta", "Engine", "EngineResult", "Handle"]
