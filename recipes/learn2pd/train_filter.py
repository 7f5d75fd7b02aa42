"""Learn2PD step 2: train the parallel-decoding filter on oracle records.

    python recipes/learn2pd/train_filter.py --data recipes/learn2pd/work/demo-llada-oracle \
        --out dlm_decode/demo_models/demo-llada/learn2pd_filter

The filter is ``samplers.learned_filter.FilterMLP`` (``block -> block -> block``, about 2.1k parameters for block 32)
trained as in Learn2PD's ``train.ipynb``: BCE-with-logits on the oracle labels, AdamW at lr 3e-3, full batch, a
shuffled 80/10/10 train / validation / test split; the weights with the lowest validation loss are kept. Seconds to
minutes on a CPU. Writes ``<out>.safetensors`` and ``<out>.json`` (config plus training statistics: losses, and at
the decoding threshold the acceptance rate and the precision of accepted slots on the test split). Prints one JSON
line last.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from dlm_decode.samplers.learned_filter import FilterMLP, save_filter


def split(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    a, b = int(0.8 * n), int(0.9 * n)
    return perm[:a], perm[a:b], perm[b:]


def fit_filter(
    conf: torch.Tensor,  # [N, block] float
    label: torch.Tensor,  # [N, block] 0/1
    *,
    epochs: int = 2000,
    lr: float = 3e-3,
    seed: int = 0,
    val: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[FilterMLP, dict]:
    """Full-batch AdamW on BCE-with-logits; returns the best-on-validation module (last one without ``val``)."""
    torch.manual_seed(seed)
    model = FilterMLP(conf.shape[1])
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    loss_fn = nn.BCEWithLogitsLoss()
    x, y = conf.float(), label.float()
    history = {"train_loss": [], "val_loss": []}
    best, best_val = None, float("inf")
    for _ in range(epochs):
        model.train()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        history["train_loss"].append(float(loss.detach()))
        if val is not None:
            model.eval()
            with torch.no_grad():
                v = float(loss_fn(model(val[0].float()), val[1].float()))
            history["val_loss"].append(v)
            if v < best_val:
                best_val, best = v, copy.deepcopy(model.state_dict())
    if best is not None:
        model.load_state_dict(best)
    return model.eval(), history


@torch.no_grad()
def evaluate(model: FilterMLP, conf: torch.Tensor, label: torch.Tensor, accept: float = 0.96) -> dict:
    """Loss, acceptance rate and precision of accepted slots at the decoding threshold."""
    logits = model(conf.float())
    pred = torch.sigmoid(logits) > accept
    n_pred = int(pred.sum())
    return {
        "loss": float(nn.functional.binary_cross_entropy_with_logits(logits, label.float())),
        "accept_rate": n_pred / max(1, pred.numel()),
        "precision": float((pred & (label > 0.5)).sum()) / max(1, n_pred),
        "positive_rate": float(label.float().mean()) if label.numel() else 0.0,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="oracle records (path without suffix, from oracle_data.py)")
    ap.add_argument("--out", required=True, help="filter path without suffix")
    ap.add_argument("--epochs", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--accept", type=float, default=0.96, help="decoding threshold for the reported statistics")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    data = Path(args.data)
    rec = load_file(str(data.with_suffix(".safetensors")))
    conf, label = rec["conf"], rec["label"]
    if conf.shape[0] < 10:
        raise ValueError(f"{data}: only {conf.shape[0]} records; generate more oracle data")
    tr, va, te = split(conf.shape[0], args.seed)
    start = time.perf_counter()
    model, hist = fit_filter(
        conf[tr], label[tr], epochs=args.epochs, lr=args.lr, seed=args.seed, val=(conf[va], label[va])
    )
    stats = {
        "records": int(conf.shape[0]),
        "epochs": args.epochs,
        "lr": args.lr,
        "seconds": round(time.perf_counter() - start, 1),
        "train_loss_first": hist["train_loss"][0],
        "train_loss_last": hist["train_loss"][-1],
        "val_loss_best": min(hist["val_loss"]),
        "test": evaluate(model, conf[te], label[te], args.accept),
    }
    meta = json.loads(data.with_suffix(".json").read_text()) if data.with_suffix(".json").is_file() else {}
    path = save_filter(
        model,
        args.out,
        training=stats,
        data={k: meta.get(k) for k in ("model", "model_sha256", "data", "split", "records")},
    )
    stats["filter"] = str(path)
    print(json.dumps(stats))
    return stats


if __name__ == "__main__":
    main()
