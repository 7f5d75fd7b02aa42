#!/bin/bash
# y5-llada: CPU fine-tune of the shipped demo-llada with the latin rows doubled (issue 12: latin fresh gap)
# run from the repository root with the dev environment active; .pb = the ParallelBench directory, runs/self =
# the self-row trajectories of the twenty-fourth round (outside the repository)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
ten=copy+reverse+sort+shuffle+insert_index+remove_index+replace_index+insert_random+remove_random+replace_random
puz=latin_square_n4+sudoku_n4_12+latin_rest
w=copy=3,reverse=2,sort=8,sort_close=12,shuffle=1,insert_index=3,remove_index=2,replace_index=2.5,insert_random=2
w=$w,remove_random=1,replace_random=3,next=4,missing_first=3,missing=1,latin_square_n4=32,latin_rest=24
w=$w,sudoku_n4_12=6,self=8
stage="full[$ten+sort_close+missing_first+missing+next+$puz+self]{share=0.5,pad=1,auxpad=1,icl=0.5,gap=48,auxchat=0}:${STEPS:-900}"
python recipes/train_demo/train.py --parallelbench .pb --tokenizer recipes/train_demo/runs/tokenizer \
  --out runs/y5-llada --arch llada --init dlm_decode/demo_models/demo-llada --short-format bare \
  --short-batch 128 --full-batch 64 --lr ${LR:-5e-5} --stages "$stage" --warmup 30 --decay-steps 300 \
  --task-weights "$w" --self-rows runs/self/traj-llada-shuffle/train.jsonl runs/self/traj-llada-random/train.jsonl \
  --eval-every 0 --save-every 50 --export-every 300 --keep-exports --threads 1 --time-limit ${TL:-2700} --seed 951 --resume
