"""Damaged or wrong files give one error naming the file and what is wrong: checkpoints (config.json, safetensors,
shard index), Learn2PD filters (safetensors + .json sidecar) and sweep grids. Missing, unexpected or differently
shaped weights are errors, never randomly initialised layers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from checkpoints import llada_config, llada_state_dict, write_checkpoint
from conftest import SHARED_DATA
from safetensors.torch import save_file
from test_checks_before_loading import cli_error

import dlm_decode
from dlm_decode.models.loading import DEMO_DIR
from dlm_decode.parallelbench.sweep import load_grid
from dlm_decode.samplers.learned_filter import load_filter

needs_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="official ParallelBench data not present")
DAMAGED = "is damaged or not a safetensors file"


def _checkpoint(root: Path, shards: int = 1, **config) -> Path:
    cfg = llada_config()
    return write_checkpoint(root / "ckpt", llada_config(**config), llada_state_dict(cfg), shards=shards)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _damage(kind: str, root: Path) -> tuple[Path, Path, list[str]]:
    """A checkpoint with one defect -> (directory, the file to name, phrases the message must hold)."""
    if kind == "truncated weights":
        d = _checkpoint(root)
        _truncate(d / "model.safetensors")
        return d, d / "model.safetensors", [DAMAGED, "incomplete metadata"]
    if kind == "garbage weights":
        d = _checkpoint(root)
        (d / "model.safetensors").write_bytes(b"\x00" * 3)
        return d, d / "model.safetensors", [DAMAGED]
    if kind == "config not JSON":
        d = _checkpoint(root)
        (d / "config.json").write_text('{"model_type": "llada",')
        return d, d / "config.json", ["is not valid JSON (line 1, column 24", "expected the model config"]
    if kind == "config not an object":
        d = _checkpoint(root)
        (d / "config.json").write_text("[1, 2]")
        return d, d / "config.json", ["must be a JSON object", "got a JSON list"]
    if kind == "more layers than weights":
        d = _checkpoint(root, n_layers=3)
        needles = ["does not match", "config.json", "9 tensor(s) missing (model.transformer.blocks.2.attn_norm.weight"]
        return d, d / "model.safetensors", needles
    if kind == "unexpected tensor":
        d = write_checkpoint(root / "ckpt", llada_config(), llada_state_dict(llada_config()) | {"extra": torch.ones(2)})
        return d, d / "model.safetensors", ["does not match", "1 unexpected (extra)"]
    if kind == "other shapes":
        d = _checkpoint(root, mlp_hidden_size=40)
        needle = "6 with another shape (model.transformer.blocks.0.ff_proj.weight: [48, 32] (expected [40, 32])"
        return d, d / "model.safetensors", ["does not match", needle]
    if kind == "truncated shard":
        d = _checkpoint(root, shards=2)
        _truncate(d / "model-00002-of-00002.safetensors")
        return d, d / "model-00002-of-00002.safetensors", [DAMAGED]
    if kind == "missing shard":
        d = _checkpoint(root, shards=2)
        (d / "model-00001-of-00002.safetensors").unlink()
        return d, d / "model.safetensors.index.json", ["lists the shard model-00001-of-00002.safetensors"]
    if kind == "index not JSON":
        d = _checkpoint(root, shards=2)
        (d / "model.safetensors.index.json").write_text("{")
        return d, d / "model.safetensors.index.json", ["is not valid JSON", "expected the checkpoint index"]
    raise AssertionError(kind)


CHECKPOINT_DEFECTS = [
    "truncated weights",
    "garbage weights",
    "config not JSON",
    "config not an object",
    "more layers than weights",
    "unexpected tensor",
    "other shapes",
    "truncated shard",
    "missing shard",
    "index not JSON",
]


@pytest.mark.parametrize("kind", CHECKPOINT_DEFECTS)
def test_damaged_checkpoint_cli_one_line_naming_the_file(kind, tmp_path, capsys):
    d, named, needles = _damage(kind, tmp_path)
    line = cli_error(capsys, ["generate", str(d), "--input-ids", "5,6", "--gen-length", "8"])
    assert str(named) in line
    for n in needles:
        assert n in line


@pytest.mark.parametrize("kind", CHECKPOINT_DEFECTS)
def test_damaged_checkpoint_python_api_raises_naming_the_file(kind, tmp_path):
    d, named, needles = _damage(kind, tmp_path)
    error = FileNotFoundError if kind == "missing shard" else ValueError
    with pytest.raises(error) as e:
        dlm_decode.load_model(d)
    assert str(named) in str(e.value) and all(n in str(e.value) for n in needles)


def test_sharded_checkpoint_still_loads(tmp_path, llada_dir):
    d = _checkpoint(tmp_path, shards=2)
    ids = torch.tensor([[5, 6, 7]])
    a, b = dlm_decode.load_model(d)[0], dlm_decode.load_model(llada_dir)[0]
    assert torch.equal(a(ids).logits, b(ids).logits)


# ------------------------------------------------------------------------------------------------ Learn2PD filters


def _filter(kind: str, root: Path) -> tuple[Path, Path, list[str]]:
    """A copy of the shipped demo filter (block 32) with one defect -> (filter path, file to name, phrases)."""
    src = DEMO_DIR / "demo-llada" / "learn2pd_filter"
    w, c = root / "f.safetensors", root / "f.json"
    shutil.copy(src.with_suffix(".safetensors"), w)
    shutil.copy(src.with_suffix(".json"), c)
    if kind == "truncated weights":
        _truncate(w)
        return w, w, [DAMAGED, "re-export the learn2pd-filter weights"]
    if kind == "sidecar not JSON":
        c.write_text('{"format": "learn2pd-filter", "block_length": 32')
        return w, c, ["is not valid JSON", "expected the learn2pd-filter config"]
    if kind == "sidecar missing":
        c.unlink()
        return w, c, [f"learned filter {w} has no config", "next to it"]
    if kind == "not a filter":
        save_file({"weight": torch.zeros(4, 4)}, str(w))
        needles = [
            "does not match the learn2pd-filter described by",
            "4 tensor(s) missing (net.0.weight",
            "1 unexpected",
        ]
        return w, w, needles
    raise AssertionError(kind)


FILTER_DEFECTS = ["truncated weights", "sidecar not JSON", "sidecar missing", "not a filter"]


@pytest.mark.parametrize("kind", FILTER_DEFECTS)
def test_damaged_filter_cli_one_line_naming_the_file(kind, llada_dir, tmp_path, capsys):
    path, named, needles = _filter(kind, tmp_path)
    args = ["--input-ids", "5,6", "--gen-length", "32", "--block-length", "32", "--sampler", "learned_filter"]
    line = cli_error(capsys, ["generate", str(llada_dir), *args, "--sampler-opt", f"filter={path}"])
    assert str(named) in line and all(n in line for n in needles)


@pytest.mark.parametrize("kind", FILTER_DEFECTS)
def test_damaged_filter_python_api_raises_naming_the_file(kind, tmp_path):
    path, named, needles = _filter(kind, tmp_path)
    with pytest.raises(ValueError) as e:
        load_filter(path, block_length=32)
    assert str(named) in str(e.value) and all(n in str(e.value) for n in needles)


# ------------------------------------------------------------------------------------------------ sweep grids


@pytest.mark.parametrize(
    "text,needle",
    [('{"top_k": [1, 2],}', "is not valid JSON (line 1, column 18"), ("[1]", "must be a JSON object")],
)
def test_bad_sweep_grid_python_api_names_the_file(tmp_path, text, needle):
    grid = tmp_path / "grid.json"
    grid.write_text(text)
    with pytest.raises(ValueError) as e:
        load_grid(str(grid))
    assert str(grid) in str(e.value) and needle in str(e.value) and "sweep grid" in str(e.value)


@needs_data
def test_bad_sweep_grid_cli_one_line_naming_the_file(llada_dir, tmp_path, capsys):
    grid = tmp_path / "grid.json"
    grid.write_text('{"top_k": [1, 2],}')
    argv = ["parallelbench", "--model", str(llada_dir), "--data", str(SHARED_DATA), "--tasks", "waiting_line/copy"]
    line = cli_error(capsys, [*argv, "--sweep", str(grid), "--out", str(tmp_path / "s.jsonl")])
    assert f"{grid} is not valid JSON (line 1, column 18" in line and "expected the sweep grid" in line
    assert not (tmp_path / "s.jsonl").exists()
