#!/usr/bin/env bash
# Retrain and ship the Learn2PD filter of a demo model (run after the demo model's weights change):
#   bash recipes/learn2pd/ship_demo.sh [demo-llada] [prompts=1200]
# Oracle records on a seeded subset of the demo training data, filter training, then a held-out check whose numbers
# go into the shipped json. About 15-30 minutes on a 2-core CPU. On-policy rounds (rounds.py) are not used: on
# demo-llada they did not raise the held-out same-text share and cost more forwards (README.md, "On-policy rounds").
# BLOCK=16 OUT=recipes/learn2pd/work/demo-llada-b16-filter bash recipes/learn2pd/ship_demo.sh demo-llada trains a
# filter for another block length into OUT instead (not shipped: the shipped filter is the block-32 one).
set -euo pipefail
MODEL="${1:-demo-llada}"
LIMIT="${2:-1200}"
BLOCK="${BLOCK:-32}"
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WORK="$HERE/work"
DEST="${OUT:-$ROOT/dlm_decode/demo_models/$MODEL/learn2pd_filter}"
RECORDS="$WORK/$MODEL-oracle"
[[ $BLOCK == 32 ]] || RECORDS="$WORK/$MODEL-b$BLOCK-oracle"
mkdir -p "$WORK"
cd "$ROOT"
python "$HERE/oracle_data.py" --model "$MODEL" --data recipes/train_demo/work/data --split train --limit "$LIMIT" \
    --batch-size 32 --block-length "$BLOCK" --out "$RECORDS"
python "$HERE/train_filter.py" --data "$RECORDS" --out "$DEST" --epochs 2000
python "$HERE/check_filter.py" --model "$MODEL" --data recipes/train_demo/work/data --split eval --limit 128 \
    --filter "$DEST.safetensors" --batch-size 32 --block-length "$BLOCK" --record
