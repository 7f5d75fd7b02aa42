#!/usr/bin/env bash
# The whole recipe on a shipped demo model, CPU, resumable at every stage:
#     DLM_PARALLELBENCH_DATA=PARALLELBENCH_DIR bash recipes/certainty_forcing/run_demo.sh llada
# Stages: trajectories (skips finished tasks), training (--resume), before/after evaluation + plot, all under
# runs/certainty_forcing/ (git-ignored).
# Override with environment variables: BASE, N_PER_TASK, EPOCHS, LR, RANK, BATCH, ETAS, THREADS, EVAL_EVERY;
# beyond the reference (off when unset): TRAJ_ETA (on-policy targets, trajectories.py --eta), RATIO_RANGE ("LOW HIGH",
# train.py --ratio-range), BETA (the entropy weight); TASKS (task names, or "twelve" for every waiting-line and
# puzzle task; default: the ten waiting-line tasks); PB (the ParallelBench directory; default
# $DLM_PARALLELBENCH_DATA); TAG (names the outputs; default ARCH). The run on all twelve tasks:
#     TASKS=twelve TAG=cf-llada LR=1e-4 EVAL_EVERY=100 ETAS="0.1 0.2 0.5 1 2" bash recipes/certainty_forcing/run_demo.sh llada
set -euo pipefail
ARCH=${1:-llada}
cd "$(dirname "$0")/../.."
W=runs/certainty_forcing
BASE=${BASE:-demo-$ARCH}
THREADS=${THREADS:-1}
TAG=${TAG:-$ARCH}
TASKS=${TASKS:-}
if [[ $TASKS == twelve ]]; then
  TASKS="waiting_line/copy waiting_line/reverse waiting_line/sort waiting_line/shuffle waiting_line/insert_index"
  TASKS="$TASKS waiting_line/remove_index waiting_line/replace_index waiting_line/insert_random"
  TASKS="$TASKS waiting_line/remove_random waiting_line/replace_random puzzle/latin_square_n4 puzzle/sudoku_n4_12"
fi
# shellcheck disable=SC2206
data=(${PB:+--data "$PB"}) tasks=(${TASKS:+--tasks $TASKS})
# shellcheck disable=SC2206
extra_traj=(${TRAJ_ETA:+--eta "$TRAJ_ETA"}) extra_train=(${RATIO_RANGE:+--ratio-range $RATIO_RANGE} ${BETA:+--beta "$BETA"})
mkdir -p "$W"
python -W ignore -m recipes.certainty_forcing.trajectories --model "$BASE" --out "$W/traj-$TAG" "${tasks[@]}" \
    "${data[@]}" --n-per-task "${N_PER_TASK:-150}" --heldout-per-task 8 --threads "$THREADS" "${extra_traj[@]}"
python -W ignore -m recipes.certainty_forcing.train --model "$BASE" --traj "$W/traj-$TAG" --out "$W/$TAG" --resume \
    "${data[@]}" --lr "${LR:-1e-3}" --lora-rank "${RANK:-32}" --batch-size "${BATCH:-16}" \
    --micro-batch-size "${BATCH:-16}" --epochs "${EPOCHS:-4}" --eval-every "${EVAL_EVERY:-50}" --save-every 10 \
    --threads "$THREADS" "${extra_train[@]}"
# shellcheck disable=SC2086
python -W ignore -m recipes.certainty_forcing.evaluate --model "base=$BASE" --model "distilled=$W/$TAG/export" \
    "${tasks[@]}" "${data[@]}" --etas ${ETAS:-0.05 0.1 0.25 0.5 1 2} --out "$W/$TAG.json" \
    --plot "$W/${TAG}_score_vs_tps.png" --threads "$THREADS"
