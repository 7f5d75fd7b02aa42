"""benchmarks/profile_decode.py: the profile of a decode on a random tiny LLaDA (CPU), its summary and its errors."""

from __future__ import annotations

import json

import pytest
import torch

import dlm_decode
from tests.conftest import load_script


def test_profile_counts_the_decodes_forwards_and_prints_json_last(capsys):
    prof = load_script("benchmarks/profile_decode.py")
    models = load_script("benchmarks/random_models.py")
    out = prof.main(["--shape", "tiny", "--gen", "64", "--cache", "none,dual", "--rows", "4", "--repeats", "2"])
    printed = capsys.readouterr().out.strip().splitlines()
    assert json.loads(printed[-1]) == json.loads(json.dumps(out))
    # the same decode run outside the profiler: the NFE the profile reports is the decode's own
    model = models.random_llada("cpu", "tiny")
    prompt = models.random_ids(model, 1, prof.PROMPT, torch.Generator().manual_seed(0))
    for row in out["caches"]:
        ref = dlm_decode.generate(
            model,
            prompt,
            sampler="threshold",
            cache=row["cache"],
            gen_length=64,
            block_length=prof.BLOCK,
            temperature=0.0,
        )
        assert row["nfe"] == ref.nfe >= 2  # at least one forward per block
        assert 0 < row["busy_s"] and 0 < row["busy_share"] <= 1.5 and row["wall_s"] > 0
    assert [r["cache"] for r in out["caches"]] == ["none", "dual"]
    assert out["bare_forward_ms_128"] > 0 and out["bare_forward_ms_32"] > 0
    assert any(line.lstrip().startswith("aten::mm") for line in printed)  # the operator table was printed


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--cache", "none,bogus"], ["--cache", "bogus", "dual"]),
        (["--cache", ","], ["--cache"]),
        (["--sampler", "nope"], ["--sampler", "nope", "threshold"]),
    ],
)
def test_profile_refuses_unknown_names_before_building_a_model(argv, words, monkeypatch):
    prof = load_script("benchmarks/profile_decode.py")
    monkeypatch.setattr(prof, "random_llada", lambda *a, **k: pytest.fail("built a model before checking arguments"))
    with pytest.raises(SystemExit) as e:
        prof.main(argv)
    assert all(w in str(e.value) for w in words)


def test_op_sites_count_the_forwards_matmuls_exactly(capsys):
    # every forward of the tiny LLaDA (2 layers) dispatches one matmul per projection (q, k, v, out, and the MLP's
    # three) in each layer plus the LM head: 7 * 2 + 1 = 15, whatever the cache; nothing else in a threshold decode
    # multiplies matrices
    prof = load_script("benchmarks/profile_decode.py")
    out = prof.main(
        ["--shape", "tiny", "--gen", "64", "--cache", "none,dual", "--rows", "2", "--repeats", "1"]
        + ["--op-sites", "5"]
    )
    printed = capsys.readouterr().out
    for row in out["caches"]:
        assert row["ops_nfe"] == row["nfe"]
        assert row["ops"]["aten.mm.default"] == 15 * row["nfe"]
        assert row["ops_per_forward"] == pytest.approx(sum(row["ops"].values()) / row["nfe"])
        assert len(row["op_sites"]) == 5 and all(n > 0 for n in row["op_sites"].values())
        assert any(site.startswith("models/") for site in row["op_sites"])  # the layers dispatch most
    assert printed.count("per forward  dispatched from (dlm_decode/...)") == 2


def test_op_sites_must_not_be_negative(monkeypatch):
    prof = load_script("benchmarks/profile_decode.py")
    monkeypatch.setattr(prof, "random_llada", lambda *a, **k: pytest.fail("built a model before checking arguments"))
    with pytest.raises(SystemExit, match="--op-sites must be >= 0"):
        prof.main(["--op-sites", "-1"])
