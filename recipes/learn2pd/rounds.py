"""Learn2PD with on-policy rounds (DAgger-style; an extension, not in Learn2PD, which trains on oracle records only).

    python -m recipes.learn2pd.rounds --model demo-llada --prompts runs/learn2pd/prompts --split train \
        --limit 400 --batch-size 32 --block-length 32 --rounds 2 --work runs/learn2pd/demo-llada-rounds

Round 0 is the plain recipe: ``oracle_data.py`` records along the oracle's trajectories (``records_0``) and
``train_filter.py`` on them (``filter_0``). Round k (1..``--rounds``): ``oracle_data.py --policy filter_{k-1}``
records along ``filter_{k-1}``'s own decodes of the same prompts (``records_k``), and ``filter_k`` is trained on the
union ``records_0 .. records_k``. Everything is written under ``--work`` (``records_k`` and ``filter_k``, each
``.safetensors`` + ``.json``); ``--out`` also gets a copy of the last filter. ``--rounds 0`` is the plain recipe.
Prints one JSON line last (per round: records, the policy's share of answers equal to one token per step, and the
filter's test precision / acceptance rate).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from dlm_decode.cli import run_script
from recipes.learn2pd import oracle_data, train_filter


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    oracle_data.add_decode_args(ap)  # passed to every round's oracle_data.py (the same prompt subset each round)
    ap.add_argument("--rounds", type=int, default=1, help="on-policy rounds after the oracle round (0: none)")
    ap.add_argument("--policy-eotp", action="store_true", help="on-policy decodes with EoTP on")
    ap.add_argument(
        "--policy-until-wrong", action="store_true", help="record each on-policy row only until its first wrong commit"
    )
    ap.add_argument("--epochs", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--work", default="runs/learn2pd/rounds", help="directory for records_k and filter_k")
    ap.add_argument("--out", default=None, help="copy the last filter here (path without suffix)")
    args = ap.parse_args(argv)
    if args.rounds < 0:
        ap.error("--rounds must be >= 0")
    work = Path(args.work)
    common = ["--model", args.model, "--prompts", args.prompts, "--split", args.split, "--seed", str(args.seed)]
    common += ["--gen-length", str(args.gen_length), "--block-length", str(args.block_length)]
    common += ["--batch-size", str(args.batch_size)]
    if args.limit is not None:
        common += ["--limit", str(args.limit)]
    if args.threads:
        common += ["--threads", str(args.threads)]
    summary = []
    records: list[str] = []
    for k in range(args.rounds + 1):
        rec, flt = str(work / f"records_{k}"), str(work / f"filter_{k}")
        extra = [] if k == 0 else ["--policy", str(work / f"filter_{k - 1}.safetensors")]
        if k and args.policy_eotp:
            extra.append("--policy-eotp")
        if k and args.policy_until_wrong:
            extra.append("--policy-until-wrong")
        data = oracle_data.main([*common, *extra, "--out", rec])
        records.append(rec)
        fit = train_filter.main(["--data", *records, "--out", flt, "--epochs", str(args.epochs), "--lr", str(args.lr)])
        summary.append(
            {
                "round": k,
                "records": data["records"],
                "records_total": fit["records"],
                # the share of training prompts on which filter_{k-1} decoded the one token per step answer
                "policy_same_as_reference": (
                    None if k == 0 else round(data["policy_same_as_reference"] / max(1, data["prompts"]), 3)
                ),
                "test": fit["test"],
                "filter": fit["filter"],
            }
        )
    result = {"rounds": args.rounds, "work": str(work), "per_round": summary}
    if args.out is not None:
        last = work / f"filter_{args.rounds}"
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        for suffix in (".safetensors", ".json"):
            shutil.copyfile(last.with_suffix(suffix), Path(args.out).with_suffix(suffix))
        result["out"] = str(Path(args.out).with_suffix(".safetensors"))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    run_script(main, "learn2pd/rounds.py")
