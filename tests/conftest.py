"""Shared fixtures: tiny official-format checkpoints (written once per session) and loaded models."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from checkpoints import (  # noqa: E402
    dream_config,
    dream_state_dict,
    llada_config,
    llada_state_dict,
    write_checkpoint,
    write_tokenizer,
)

import dlm_decode  # noqa: E402,F401  (registers the Auto classes)

REPO = Path(__file__).resolve().parent.parent
# the official ParallelBench files are not in the repository: $DLM_PARALLELBENCH_DATA, else ../shared beside it
SHARED_DATA = Path(os.environ.get("DLM_PARALLELBENCH_DATA") or REPO.parent / "shared" / "data" / "parallelbench")


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """One hint line when tests skipped for want of the official ParallelBench data (they say "ParallelBench" in
    their skip reason), so a fresh clone knows why and how to run them."""
    if SHARED_DATA.is_dir():
        return
    n = sum("ParallelBench" in str(r.longrepr) for r in terminalreporter.stats.get("skipped", []))
    if n:
        terminalreporter.write_line(
            f"{n} test{'s' if n != 1 else ''} skipped: no official ParallelBench data at {SHARED_DATA}; put the "
            "files in ../shared/data/parallelbench beside the repository, or point DLM_PARALLELBENCH_DATA at them"
        )


def decode_small(model, prompts, sampler, cache, **kw):
    """``dlm_decode.generate`` at the small sizes the decode-path tests share: gen 24 in blocks of 8, ``threshold``
    at 0.5 (at 0.9 the tiny random checkpoints commit one slot per step), ``low_confidence`` one token per step."""
    kw.setdefault("gen_length", 24)
    kw.setdefault("block_length", 8)
    if sampler == "threshold":
        kw.setdefault("sampler_options", {"threshold": 0.5})
    if sampler == "low_confidence":
        kw.setdefault("steps", kw["gen_length"])
    return dlm_decode.generate(model, prompts, sampler=sampler, cache=cache, **kw)


def load_script(relpath: str):
    """A script of the repository (a benchmark; they are not a package) imported as a module from its path."""
    path = REPO / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def llada_dir(tmp_path_factory) -> Path:
    cfg = llada_config()
    return write_checkpoint(tmp_path_factory.mktemp("llada"), cfg, llada_state_dict(cfg))


@pytest.fixture(scope="session")
def dream_dir(tmp_path_factory) -> Path:
    cfg = dream_config()
    return write_checkpoint(tmp_path_factory.mktemp("dream"), cfg, dream_state_dict(cfg))


@pytest.fixture(scope="session")
def llada(llada_dir):
    return dlm_decode.load_model(llada_dir)[0]


@pytest.fixture(scope="session")
def dream(dream_dir):
    return dlm_decode.load_model(dream_dir)[0]


@pytest.fixture(scope="session", params=["llada", "dream"])
def tiny_model(request, llada, dream):
    return {"llada": llada, "dream": dream}[request.param]


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(1234)
    yield


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core machine threads spin: 10x slower.
    Modules opt in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tok_dir(llada_dir, tmp_path_factory) -> Path:
    """A copy of the tiny LLaDA checkpoint with a tokenizer beside it (one per module, so a module may change it)."""
    path = tmp_path_factory.mktemp("tok") / "llada"
    shutil.copytree(llada_dir, path)
    write_tokenizer(path)
    return path
