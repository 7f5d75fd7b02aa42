"""Weight arithmetic between exports of one lineage (same config, same tokenizer): ``out = base + scale * (add -
minus)`` per tensor, the "task vector" of Ilharco et al., *Editing Models with Task Arithmetic* (ICLR 2023). With
``--minus`` left out, ``--add`` is interpolated: ``out = (1 - scale) * base + scale * add``.

    python recipes/train_demo/merge.py --base runs/u1/export --add runs/u4/export --minus runs/q4/export-step2600 \
        --scale 1.0 --out runs/m1

The output is ``--base``'s folder (config, tokenizer, card) with ``model.safetensors`` replaced; the arithmetic runs in
float32 and is stored in the base's dtype."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dlm_decode.core.files import read_json_object

WEIGHTS = "model.safetensors"
INCIDENTAL = {"transformers_version", "_name_or_path"}  # config keys that say where a model was saved, not what it is


def _weights(folder: Path, flag: str) -> dict[str, torch.Tensor]:
    path = folder / WEIGHTS
    if not path.is_file():
        raise SystemExit(f"{flag} {folder}: no {WEIGHTS} there (an export folder holds config.json and {WEIGHTS})")
    return load_file(str(path))


def _config(folder: Path) -> dict:
    try:
        return read_json_object(folder / "config.json", "model config")
    except (OSError, ValueError) as e:  # the message names the file and what is wrong with it
        raise SystemExit(str(e)) from None


def merge(base: Path, add: Path, minus: Path | None, scale: float, out: Path) -> dict[str, float]:
    """Write the merged export to ``out``; returns the relative size of the applied change per tensor group."""
    configs = {flag: _config(p) for flag, p in (("--base", base), ("--add", add), ("--minus", minus)) if p}
    first = configs["--base"]
    for flag, cfg in configs.items():
        diff = sorted(k for k in set(cfg) | set(first) if k not in INCIDENTAL and cfg.get(k) != first.get(k))
        if diff:
            raise SystemExit(f"{flag}: its config.json differs from --base's in {diff}: not one lineage")
    b, a = _weights(base, "--base"), _weights(add, "--add")
    m = _weights(minus, "--minus") if minus else None
    if set(b) != set(a) or (m is not None and set(m) != set(b)):
        raise SystemExit("--base, --add and --minus must hold the same tensor names")
    merged, change, norm = {}, 0.0, 0.0
    for k, t in b.items():
        t32 = t.float()
        delta = a[k].float() - (m[k].float() if m is not None else t32)
        merged[k] = (t32 + scale * delta).to(t.dtype).contiguous()
        change += float((scale * delta).pow(2).sum())
        norm += float(t32.pow(2).sum())
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(base, out)
    tmp = out / (WEIGHTS + ".tmp")
    save_file(merged, str(tmp), metadata={"format": "pt"})
    tmp.replace(out / WEIGHTS)
    return {"relative_change": (change / max(norm, 1e-12)) ** 0.5}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", type=Path, required=True)
    p.add_argument("--add", type=Path, required=True)
    p.add_argument("--minus", type=Path, default=None)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.out.resolve() in {x.resolve() for x in (args.base, args.add, args.minus) if x}:
        raise SystemExit("--out must be a new folder, not one of the inputs")
    print(json.dumps(merge(args.base, args.add, args.minus, args.scale, args.out)))


if __name__ == "__main__":
    from dlm_decode.cli import run_script

    run_script(main, "train_demo/merge.py")
