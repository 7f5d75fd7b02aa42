#!/usr/bin/env bash
# Retrain and ship the Learn2PD filter of a demo model (run after the demo model's weights change):
#   DLM_PARALLELBENCH_DATA=PARALLELBENCH_DIR bash recipes/learn2pd/ship_demo.sh [demo-llada] [prompts=1200]
# The prompt set (prompts.py, once), oracle records on a seeded subset of its train split, filter training, then a
# held-out check on its eval split whose numbers go into the shipped json. About 15-30 minutes on a 2-core CPU.
# BLOCK=16 OUT=runs/learn2pd/demo-llada-b16-filter bash recipes/learn2pd/ship_demo.sh demo-llada trains a filter for
# another block length into OUT instead (not shipped: the shipped filter is the block-32 one).
set -euo pipefail
MODEL="${1:-demo-llada}"
LIMIT="${2:-1200}"
BLOCK="${BLOCK:-32}"
cd "$(dirname "$0")/../.."
WORK=runs/learn2pd
PROMPTS="$WORK/prompts"
DEST="${OUT:-dlm_decode/demo_models/$MODEL/learn2pd_filter}"
RECORDS="$WORK/$MODEL-oracle"
[[ $BLOCK == 32 ]] || RECORDS="$WORK/$MODEL-b$BLOCK-oracle"
mkdir -p "$WORK"
[[ -d $PROMPTS ]] || python -m recipes.learn2pd.prompts --out "$PROMPTS"
python -m recipes.learn2pd.oracle_data --model "$MODEL" --prompts "$PROMPTS" --split train --limit "$LIMIT" \
    --batch-size 32 --block-length "$BLOCK" --out "$RECORDS"
python -m recipes.learn2pd.train_filter --data "$RECORDS" --out "$DEST" --epochs 2000
python -m recipes.learn2pd.check_filter --model "$MODEL" --prompts "$PROMPTS" --split eval --limit 128 \
    --filter "$DEST.safetensors" --batch-size 32 --block-length "$BLOCK" --record
