#!/usr/bin/env bash
# One device lease, prepared: issue 47's reproduction of demo-llada's final stage, then issue 48's measurements, each
# part bounded by the time left, so that a single call of about ten minutes brings everything back.
#
#   bash benchmarks/gpu_lease.sh prepare        # here: the carried inputs into runs/gpu_carry (git-ignored)
#   bash benchmarks/gpu_lease.sh run            # there, with OUT set, carrying runs/gpu_carry and runs/self
#   bash benchmarks/gpu_lease.sh stale          # a second call there: issue 49's stale-rows runs at batch 128
#
# `prepare` copies the official ParallelBench files ($DLM_PARALLELBENCH_DATA or --data's default place beside the
# checkout) and the previous demo-llada (git commit bf25d0f, the config's --init) into runs/gpu_carry; the self rows
# the config names must already be in runs/self (recipes/train_demo/configs/demo-llada.yaml says how to make them).
# `run` writes at most eight files into $OUT (the device returns no more):
#   machine.txt     the GPU and the versions;
#   train.log       the training run's output; repro.tar its log.jsonl, run.json and last export (score it here:
#                   dlm-decode parallelbench --model EXPORT --data $PB --sampler low_confidence --batch-size 50 --json);
#   gpu_tests.log   the `gpu` tests of tests/test_graphs.py (run beside the training: no timing then);
#   blockdiff.log   gpu_checks.sh blockdiff (LLaDA2.0-mini widths, bf16: eager, step graphs, reference, SDAR-style);
#   profile8b.log   gpu_checks.sh profile8b with the dual cache and step graphs (where a graphed step's time goes);
#   versus8b.log    gpu_checks.sh versus8b, threshold+prefix and threshold+dual with step graphs.
# DEADLINE (seconds, default 555) is when the last part must end; the timed parts run only after the training.
# `stale` trains configs/demo-llada-stale.yaml and demo-dream-stale.yaml side by side from the shipped models at
# batch 128 (four times the CPU runs' rows), each bounded by STALE_SECONDS (default 240), and brings back
# demo-llada-stale.tar / demo-dream-stale.tar (log, config, last export) and their logs; score the exports here with
# `dlm-decode parallelbench --model EXPORT --data $PB --sampler threshold --sampler-opt threshold=0.9 --block-length 32
# --cache none|prefix|dual --limit 25 --batch-size 25 --json`. It needs the dream self rows in runs/self too.
set -uo pipefail
cd "$(dirname "$0")/.."
carry=runs/gpu_carry

prepare() {
  local pb=${DLM_PARALLELBENCH_DATA:-../shared/data/parallelbench}
  [[ -d $pb/waiting_line ]] || { echo "no ParallelBench files at $pb (set DLM_PARALLELBENCH_DATA)" >&2; exit 2; }
  for f in runs/self/traj-{llada,dream}-{shuffle,random}/train.jsonl; do
    [[ -f $f ]] || { echo "missing $f (the trajectories.py commands at the top of the config that names it)" >&2; exit 2; }
  done
  rm -rf "$carry" && mkdir -p "$carry/init"
  cp -r "$pb" "$carry/pb"
  git archive bf25d0f dlm_decode/demo_models/demo-llada | tar -x -C "$carry/init" --strip-components=3
  du -sh "$carry" runs/self
}

device_env() {  # the device side's environment: the checkout importable, the carried ParallelBench files
  export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 DLM_PARALLELBENCH_DATA=$PWD/$carry/pb TOKENIZERS_PARALLELISM=false
}

run() {
  local out=${OUT:?OUT: the folder whose files come back} t0=$SECONDS deadline=${DEADLINE:-555} l train
  left() { echo $((deadline - (SECONDS - t0))); }
  cap() { l=$(left); ((l < $1)) && echo "$l" || echo "$1"; }
  device_env
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    nproc
    python3 -c "import torch, triton, transformers, accelerate as a
print(torch.__version__, triton.__version__, transformers.__version__, a.__version__)"
  } >"$out/machine.txt" 2>&1
  (
    timeout 400 python3 -m recipes.train_demo.train --config recipes/train_demo/configs/demo-llada.yaml \
      --init "$carry/init" --out /tmp/repro --set run.row_workers=12 >"$out/train.log" 2>&1
    echo "train rc $? at $((SECONDS - t0)) s" >>"$out/train.log"
    last=$(cd /tmp/repro && ls -d export* 2>/dev/null | sort -V | tail -1)
    tar -C /tmp/repro -cf "$out/repro.tar" log.jsonl run.json ${last:+"$last"}
  ) &
  train=$!
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_graphs.py >"$out/gpu_tests.log" 2>&1
  echo "tests rc $? at $((SECONDS - t0)) s" >>"$out/gpu_tests.log"
  wait $train
  echo "training done at $((SECONDS - t0)) s, $(left) s left"
  tail -3 "$out/train.log"
  l=$(cap 170) && ((l > 30)) && timeout "$l" bash benchmarks/gpu_checks.sh "$out" blockdiff
  l=$(cap 120) && ((l > 30)) && CACHES=dual GRAPHS=1 timeout "$l" bash benchmarks/gpu_checks.sh "$out" profile8b
  l=$(left) && ((l > 40)) &&
    VR_ROWS=threshold+prefix,threshold+dual GRAPHS=1 REPEATS=1 timeout "$l" bash benchmarks/gpu_checks.sh "$out" versus8b
  echo "done at $((SECONDS - t0)) s"
}

stale_one() {  # stale_one NAME MODEL: one stale-rows run, its files into $OUT
  local out=$OUT name=$1 model=$2 bound=${STALE_SECONDS:-240}
  timeout "$bound" python3 -m recipes.train_demo.train --config "recipes/train_demo/configs/$name.yaml" \
    --init "dlm_decode/demo_models/$model" --out "/tmp/$name" --set data.full_batch=128 --set data.short_batch=128 \
    --set run.row_workers=6 --set run.time_limit=$((bound - 30)) >"$out/$name.log" 2>&1
  echo "rc $?" >>"$out/$name.log"
  local last
  last=$(cd "/tmp/$name" && ls -d export* 2>/dev/null | sort -V | tail -1)
  tar -C "/tmp/$name" -cf "$out/$name.tar" log.jsonl run.json ${last:+"$last"}
}

stale() {
  : "${OUT:?OUT: the folder whose files come back}"
  device_env
  stale_one demo-llada-stale demo-llada &
  stale_one demo-dream-stale demo-dream
  wait
}

case ${1:-} in
prepare) prepare ;;
run) run ;;
stale) stale ;;
*) echo "usage: bash benchmarks/gpu_lease.sh prepare|run|stale" >&2; exit 2 ;;
esac
