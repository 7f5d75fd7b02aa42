#!/usr/bin/env bash
# The whole recipe on a shipped demo model, CPU, resumable at every stage:
#     nohup recipes/certainty_forcing/run_demo.sh llada > recipes/certainty_forcing/work/llada.log 2>&1 &
# Stages: trajectories (skips finished tasks), training (--resume), before/after evaluation + plot.
# Override with environment variables: BASE, N_PER_TASK, EPOCHS, LR, RANK, BATCH, ETAS, THREADS.
set -euo pipefail
ARCH=${1:-llada}
cd "$(dirname "$0")/../.."
R=recipes/certainty_forcing
W=$R/work
BASE=${BASE:-dlm_decode/demo_models/demo-$ARCH}
THREADS=${THREADS:-1}
mkdir -p "$W" "$R/results"
python -W ignore "$R/trajectories.py" --model "$BASE" --out "$W/traj-$ARCH" --n-per-task "${N_PER_TASK:-150}" \
    --heldout-per-task 8 --threads "$THREADS"
python -W ignore "$R/train.py" --model "$BASE" --traj "$W/traj-$ARCH" --out "$W/$ARCH" --resume \
    --lr "${LR:-1e-3}" --lora-rank "${RANK:-32}" --batch-size "${BATCH:-16}" --micro-batch-size "${BATCH:-16}" \
    --epochs "${EPOCHS:-4}" --eval-every "${EVAL_EVERY:-50}" --save-every 10 --threads "$THREADS"
# shellcheck disable=SC2086
python -W ignore "$R/evaluate.py" --model "base=$BASE" --model "distilled=$W/$ARCH/export" \
    --etas ${ETAS:-0.05 0.1 0.25 0.5 1 2} --out "$R/results/$ARCH.json" --plot "$R/${ARCH}_score_vs_tps.png" \
    --threads "$THREADS"
