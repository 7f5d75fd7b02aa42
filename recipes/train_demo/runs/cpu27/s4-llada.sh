#!/bin/bash
# s4-llada / s5-llada (2026-11-27, README "Twenty-seventh round"): the shipped demo-llada in its own twelve-task stage
# with the model's own verified latin squares added to the self rows (issue 12: latin square 87.3 on 1,000 fresh
# squares against the official 93). As the twenty-fourth round's s1, which lifted shuffle 80 -> 95 with self rows and
# shuffle's freshly drawn answers cut to 1: s4 cuts latin_square_n4's freshly drawn squares to 4 (from 16), self 8;
# s5 keeps 8 of them and weights self 12. latin_rest (the column rule) stays at 12.
# Run from the repository root with the dev environment active: RUN=s4-llada or RUN=s5-llada; .pb = the ParallelBench
# directory; runs/self = the self-row trajectories (outside the repository: the twenty-fourth round's shuffle and
# random-task files, and traj-llada-latin from
#   python recipes/certainty_forcing/trajectories.py --model dlm_decode/demo_models/demo-llada \
#     --out runs/self/traj-llada-latin --data-dir .pb --tasks puzzle/latin_square_n4 --n-per-task 1500 \
#     --heldout-per-task 8 --seed 11000203 --heldout-seed 13000207 --batch-size 50 --threads 2 )
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
run=${RUN:-s4-llada}
ten=copy+reverse+sort+shuffle+insert_index+remove_index+replace_index+insert_random+remove_random+replace_random
puz=latin_square_n4+sudoku_n4_12+latin_rest
w=copy=3,reverse=2,sort=8,sort_close=12,shuffle=1,insert_index=3,remove_index=2,replace_index=2.5,insert_random=2
w=$w,remove_random=1,replace_random=3,next=4,missing_first=3,missing=1,latin_rest=12,sudoku_n4_12=6
case $run in
s4-llada) w=$w,latin_square_n4=4,self=8 seed=961 ;;
s5-llada) w=$w,latin_square_n4=8,self=12 seed=962 ;;
*) echo "RUN must be s4-llada or s5-llada" >&2; exit 2 ;;
esac
stage="full[$ten+sort_close+missing_first+missing+next+$puz+self]{share=0.5,pad=1,auxpad=1,icl=0.5,gap=48,auxchat=0}:${STEPS:-600}"
python recipes/train_demo/train.py --parallelbench .pb --tokenizer recipes/train_demo/runs/tokenizer \
  --out runs/$run --arch llada --init dlm_decode/demo_models/demo-llada --short-format bare \
  --short-batch 128 --full-batch 64 --lr ${LR:-1e-4} --stages "$stage" --warmup 50 --decay-steps 200 \
  --task-weights "$w" --self-rows runs/self/traj-llada-shuffle/train.jsonl runs/self/traj-llada-random/train.jsonl \
  runs/self/traj-llada-latin/train.jsonl \
  --eval-every 0 --save-every 50 --export-every 200 --keep-exports --threads 1 --time-limit ${TL:-3600} --seed $seed --resume
