#!/usr/bin/env bash
# GPU checks of the attention kernel and the caches, in one go, on a CUDA machine with torch + triton installed:
#   1. the `gpu`-marked tests (kernel vs twin in fp32/fp16/bf16; decoding through the kernel with every cache);
#   2. bench_attention.py at the shapes the caches produce with LLaDA-8B / Dream-7B widths (one JSON line each);
#   3. bench_caches.py on random weights with LLaDA-8B's widths in bf16 ($GENS, $BATCHES, $SAMPLERS, $CACHES,
#      $LAYERS, $REPEATS override its settings; $TAG names the log);
#   4. tune_attention.py: the kernel's launch parameters swept at those shapes (not in the default set);
#   5. versus8b: bench_speed.py --versus-reference on a random LLaDA of LLaDA-8B's widths in bf16, batch 1, gen 256
#      (issue 16's GPU target: threshold+dual's share of the memory-bandwidth roofline, and its speed against the
#      re-stated Fast-dLLM dual-cache loop timed in the same run; $VR_ROWS, $VR_CONFIGS, $REPEATS override;
#      $COMPILE=MODE adds the compiled generate as a further side, $GRAPHS=1 the one with step graphs);
#   6. profile8b: profile_decode.py at LLaDA-8B widths in bf16 (where a decode's time goes: the device's busy share,
#      the top kernels, bare-forward times; $CACHES, $COMPILE as above, $GRAPHS=1 with step graphs);
#   7. blockdiff: bench_block_diffusion.py on a random LLaDA2 of LLaDA2.0-mini's widths in bf16 (issue 48's block
#      diffusion target: the exact cache eager and with step graphs against the reference's uncached rule and an
#      SDAR-style loop, each way's share of the roofline counting the routed experts a forward reaches;
#      $BD_BATCHES, $REPEATS, $BD_GEN override).
#   8. engine8b: bench_engine.py on a random LLaDA of LLaDA-8B's widths in bf16 (issue 74's GPU target: the engine's
#      tokens/s at 16 rows against one request at a time and static batches; $ENGINE_LAYERS (32), $ENGINE_REQUESTS
#      (32), $ENGINE_CACHE (dual) override; offline only).
# Usage: bash benchmarks/gpu_checks.sh OUTDIR [tests|attention|caches|tune|versus8b|profile8b|blockdiff|engine8b ...]
#        (default: tests attention caches)
# Runs from a checkout without installing (PYTHONPATH); writes gpu_tests.log, attention.jsonl, caches*.log, tune.log,
# versus8b.log.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu_checks.sh OUTDIR [tests|attention|caches ...]}
shift
parts=${*:-tests attention caches}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', transformers.__version__, torch.cuda.get_device_name())" | tee "$out/versions.txt"

for part in $parts; do
  case $part in
  tests)
    python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels.py tests/test_gpu_decode.py tests/test_graphs.py 2>&1 |
      tee "$out/gpu_tests.log" | tail -15
    ;;
  attention)
    # name|flags: B H Hk Q S W D. S = prompt + gen slots; W = 0 attends to all S under a key mask.
    : >"$out/attention.jsonl"
    while IFS='|' read -r name flags; do
      [[ -z $name ]] && continue
      line=$(python3 benchmarks/bench_attention.py $flags | tail -1)
      echo "{\"case\": \"$name\", \"result\": $line}" | tee -a "$out/attention.jsonl"
    done <<'CASES'
llada8b-dual-step-b1|--batch 1 --heads 32 --kv-heads 32 --queries 32 --keys 1088 --window 0 --head-dim 128
llada8b-dual-step-b8|--batch 8 --heads 32 --kv-heads 32 --queries 32 --keys 1088 --window 0 --head-dim 128
llada8b-window-step-b1|--batch 1 --heads 32 --kv-heads 32 --queries 16 --keys 1088 --window 192 --head-dim 128
llada8b-window-step-b8|--batch 8 --heads 32 --kv-heads 32 --queries 16 --keys 1088 --window 192 --head-dim 128
llada8b-full-forward-b1|--batch 1 --heads 32 --kv-heads 32 --queries 1088 --keys 1088 --window 0 --head-dim 128
llada8b-full-forward-b8|--batch 8 --heads 32 --kv-heads 32 --queries 1088 --keys 1088 --window 0 --head-dim 128
dream7b-dual-step-b1|--batch 1 --heads 28 --kv-heads 4 --queries 32 --keys 1088 --window 0 --head-dim 128
dream7b-dual-step-b8|--batch 8 --heads 28 --kv-heads 4 --queries 32 --keys 1088 --window 0 --head-dim 128
dream7b-full-forward-b8|--batch 8 --heads 28 --kv-heads 4 --queries 1088 --keys 1088 --window 0 --head-dim 128
default-gather-bf16|--dtype bf16
default-gather-fp16|--dtype fp16
default-gather-fp32|--dtype fp32
CASES
    ;;
  caches)
    extra=()
    [[ -n ${CACHES:-} ]] && extra=(--caches "$CACHES")
    python3 benchmarks/bench_caches.py --model "random:llada-8b${LAYERS:+:$LAYERS}" --dtype bfloat16 --device cuda \
      --gen-lengths "${GENS:-256}" --batches "${BATCHES:-1,8}" --repeats "${REPEATS:-1}" \
      --samplers "${SAMPLERS:-low_confidence,threshold}" "${extra[@]}" 2>&1 | tee "$out/caches${TAG:-}.log" |
      grep -v '^{'
    ;;
  tune)
    python3 benchmarks/tune_attention.py 2>&1 | tee "$out/tune.log" | grep -v '^{'
    ;;
  versus8b)
    python3 benchmarks/bench_speed.py --versus-reference --vr-size llada-8b --dtype bfloat16 --device cuda \
      --vr-configs "${VR_CONFIGS:-256x1}" --vr-rows "${VR_ROWS:-threshold,threshold+dual}" \
      --repeats "${REPEATS:-3}" --warmup 1 ${COMPILE:+--compile "$COMPILE"} ${GRAPHS:+--vr-graphs} 2>&1 |
      tee "$out/versus8b${TAG:-}.log" |
      grep -v '^{'
    ;;
  profile8b)
    python3 benchmarks/profile_decode.py --shape llada-8b --device cuda --dtype bfloat16 --cache "${CACHES:-none,dual}" \
      ${COMPILE:+--compile "$COMPILE"} ${GRAPHS:+--graphs} 2>&1 | grep -v '^USDT' | tee "$out/profile8b${TAG:-}.log" | grep -v '^{'
    ;;
  blockdiff)
    python3 benchmarks/bench_block_diffusion.py --shape mini --device cuda --dtype bfloat16 \
      --batches "${BD_BATCHES:-1}" --gen "${BD_GEN:-256}" --repeats "${REPEATS:-2}" 2>&1 |
      tee "$out/blockdiff${TAG:-}.log" | grep -v '^{'
    ;;
  engine8b)
    python3 benchmarks/bench_engine.py --model random:llada-8b --layers "${ENGINE_LAYERS:-32}" --device cuda \
      --dtype bfloat16 --max-batch 16 --requests "${ENGINE_REQUESTS:-32}" --online-requests 0 \
      --prompt-lengths 16-512 --gen-lengths 32-256 --cache "${ENGINE_CACHE:-dual}" --repeats 1 2>&1 |
      tee "$out/engine8b${TAG:-}.log" | grep -v '^{'
    ;;
  *) echo "unknown part $part (tests, attention, caches, tune, versus8b, profile8b, blockdiff, engine8b)" >&2; exit 2 ;;
  esac
done
