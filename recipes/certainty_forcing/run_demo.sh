#!/usr/bin/env bash
# The whole recipe on a shipped demo model, CPU, resumable at every stage:
#     nohup recipes/certainty_forcing/run_demo.sh llada > recipes/certainty_forcing/work/llada.log 2>&1 &
# Stages: trajectories (skips finished tasks), training (--resume), before/after evaluation + plot.
# Override with environment variables: BASE, N_PER_TASK, EPOCHS, LR, RANK, BATCH, ETAS, THREADS, EVAL_EVERY;
# beyond the reference (off when unset): TRAJ_ETA (on-policy targets, trajectories.py --eta), RATIO_RANGE ("LOW HIGH",
# train.py --ratio-range), BETA (the entropy weight);
# TASKS (task names, or "twelve" for every waiting-line and puzzle task; default: the scripts' ten waiting-line
# tasks), PB (the ParallelBench directory; default: the scripts'), TAG (names the work directory, results and plot;
# default ARCH). The run on all twelve tasks of the README ("On the shipped models of 2026-11-27"):
#     TASKS=twelve TAG=cf-llada-y1 LR=1e-4 EVAL_EVERY=100 ETAS="0.1 0.2 0.5 1 2" bash recipes/certainty_forcing/run_demo.sh llada
set -euo pipefail
ARCH=${1:-llada}
cd "$(dirname "$0")/../.."
R=recipes/certainty_forcing
W=$R/work
BASE=${BASE:-dlm_decode/demo_models/demo-$ARCH}
THREADS=${THREADS:-1}
TAG=${TAG:-$ARCH}
TASKS=${TASKS:-}
if [[ $TASKS == twelve ]]; then
  TASKS="waiting_line/copy waiting_line/reverse waiting_line/sort waiting_line/shuffle waiting_line/insert_index"
  TASKS="$TASKS waiting_line/remove_index waiting_line/replace_index waiting_line/insert_random"
  TASKS="$TASKS waiting_line/remove_random waiting_line/replace_random puzzle/latin_square_n4 puzzle/sudoku_n4_12"
fi
# shellcheck disable=SC2206
data=(${PB:+--data-dir "$PB"}) tasks=(${TASKS:+--tasks $TASKS})
# shellcheck disable=SC2206
extra_traj=(${TRAJ_ETA:+--eta "$TRAJ_ETA"}) extra_train=(${RATIO_RANGE:+--ratio-range $RATIO_RANGE} ${BETA:+--beta "$BETA"})
mkdir -p "$W" "$R/results"
python -W ignore "$R/trajectories.py" --model "$BASE" --out "$W/traj-$TAG" "${tasks[@]}" "${data[@]}" \
    --n-per-task "${N_PER_TASK:-150}" --heldout-per-task 8 --threads "$THREADS" "${extra_traj[@]}"
python -W ignore "$R/train.py" --model "$BASE" --traj "$W/traj-$TAG" --out "$W/$TAG" --resume "${data[@]}" \
    --lr "${LR:-1e-3}" --lora-rank "${RANK:-32}" --batch-size "${BATCH:-16}" --micro-batch-size "${BATCH:-16}" \
    --epochs "${EPOCHS:-4}" --eval-every "${EVAL_EVERY:-50}" --save-every 10 --threads "$THREADS" "${extra_train[@]}"
# shellcheck disable=SC2086
python -W ignore "$R/evaluate.py" --model "base=$BASE" --model "distilled=$W/$TAG/export" "${tasks[@]}" "${data[@]}" \
    --etas ${ETAS:-0.05 0.1 0.25 0.5 1 2} --out "$R/results/$TAG.json" --plot "$R/${TAG}_score_vs_tps.png" \
    --threads "$THREADS"
