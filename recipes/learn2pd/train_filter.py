"""Learn2PD step 2: train the parallel-decoding filter on oracle records.

    python -m recipes.learn2pd.train_filter --data runs/learn2pd/demo-llada-oracle \
        --out dlm_decode/demo_models/demo-llada/learn2pd_filter

The filter is ``samplers.learned_filter.FilterMLP`` (``block -> block -> block``, about 2.1k parameters for block 32)
trained as in Learn2PD's ``train.ipynb``: BCE-with-logits on the oracle labels, AdamW at lr 3e-3, full batch, a
shuffled 80/10/10 train / validation / test split; the weights with the lowest validation loss are kept. Seconds to
minutes on a CPU. Writes ``<out>.safetensors`` and ``<out>.json`` (config plus training statistics: losses, and at
the decoding threshold the acceptance rate and the precision of accepted slots on the test split). Prints one JSON
line last.

Several ``--data`` (an extension, for ``oracle_data.py --policy`` records; Learn2PD trains on one oracle set): the
records are concatenated in the order given and split as one set; they must share the block length and the model
weights they were collected from. The filter's json then also lists every source (``data.sources``). One ``--data``
trains exactly as before.
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

from dlm_decode.cli import run_script
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


def load_records(paths: list[str | Path]) -> tuple[torch.Tensor, torch.Tensor, list[dict]]:
    """``conf``, ``label`` of every record file (path without suffix) concatenated, and each file's json (or {}).
    Refuses files without both tensors, tensors of other shapes, and files of other block lengths or weights."""
    confs, labels, metas = [], [], []
    for p in map(Path, paths):
        f = p.with_suffix(".safetensors")
        if not f.is_file():
            raise ValueError(f"{p}: records {f} not found (oracle_data.py --out {p} writes them)")
        rec = load_file(str(f))
        if set(rec) != {"conf", "label"} or rec["conf"].dim() != 2 or rec["conf"].shape != rec["label"].shape:
            shapes = {k: tuple(v.shape) for k, v in rec.items()}
            raise ValueError(f"{f}: not oracle_data.py records (conf and label of one [N, block] shape): {shapes}")
        if confs and rec["conf"].shape[1] != confs[0].shape[1]:
            raise ValueError(
                f"block length mismatch: {f} has records of block {rec['conf'].shape[1]}, "
                f"{paths[0]} of block {confs[0].shape[1]}"
            )
        meta = json.loads(p.with_suffix(".json").read_text()) if p.with_suffix(".json").is_file() else {}
        shas = {m.get("model_sha256") for m in metas} | {meta.get("model_sha256")}
        if len(shas - {None}) > 1:
            raise ValueError(f"{p}: records come from other model weights than {paths[0]} (model_sha256 differs)")
        confs.append(rec["conf"])
        labels.append(rec["label"])
        metas.append(meta)
    if len(confs) == 1:  # one source: the tensors as stored
        return confs[0], labels[0], metas
    return torch.cat(confs), torch.cat(labels), metas


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--data",
        required=True,
        action="extend",
        nargs="+",
        help="records (path without suffix, from oracle_data.py); several: trained on their union",
    )
    ap.add_argument("--out", required=True, help="filter path without suffix")
    ap.add_argument("--epochs", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--accept", type=float, default=0.96, help="decoding threshold for the reported statistics")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    conf, label, metas = load_records(args.data)
    data = args.data[0] if len(args.data) == 1 else " + ".join(args.data)
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
    meta = metas[0]
    data_meta = {k: meta.get(k) for k in ("model", "model_sha256", "data", "split", "records")}
    if len(metas) > 1:
        data_meta["records"] = int(conf.shape[0])
        data_meta["sources"] = [
            {"path": str(p)} | {k: m.get(k) for k in ("records", "policy", "policy_eotp")}
            for p, m in zip(args.data, metas, strict=True)
        ]
    path = save_filter(model, args.out, training=stats, data=data_meta)
    stats["filter"] = str(path)
    print(json.dumps(stats))
    return stats


if __name__ == "__main__":
    run_script(main, "learn2pd/train_filter.py")
