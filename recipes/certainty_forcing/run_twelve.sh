#!/usr/bin/env bash
# The recipe on a shipped demo model over all twelve ParallelBench tasks (README, "On the shipped models of
# 2026-11-27"): trajectories, LoRA distillation (resumable), before/after on every official sample.
#     bash recipes/certainty_forcing/run_twelve.sh llada cf-llada-y1 1e-4   # ARCH TAG LR; PB=ParallelBench dir
set -euo pipefail
cd "$(dirname "$0")/../.."
A=${1:?ARCH}; T=${2:?TAG}; LR=${3:-1e-4}; PB=${PB:-../shared/data/parallelbench}
R=recipes/certainty_forcing; W=$R/work
twelve="waiting_line/copy waiting_line/reverse waiting_line/sort waiting_line/shuffle waiting_line/insert_index waiting_line/remove_index waiting_line/replace_index waiting_line/insert_random waiting_line/remove_random waiting_line/replace_random puzzle/latin_square_n4 puzzle/sudoku_n4_12"
python -W ignore $R/trajectories.py --model dlm_decode/demo_models/demo-$A --out $W/traj-$T --tasks $twelve \
  --data-dir "$PB" --n-per-task 150 --heldout-per-task 8 --threads 1
python -W ignore $R/train.py --model dlm_decode/demo_models/demo-$A --traj $W/traj-$T --out $W/$T --resume \
  --data-dir "$PB" --lr $LR --lora-rank 32 --batch-size 16 --micro-batch-size 16 --epochs 4 --eval-every 100 \
  --save-every 10 --threads 1
python -W ignore $R/evaluate.py --model base=dlm_decode/demo_models/demo-$A --model distilled=$W/$T/export \
  --data-dir "$PB" --tasks $twelve --etas 0.1 0.2 0.5 1 2 --out $R/results/$T.json \
  --plot $R/$T-score_vs_tps.png --threads 1
