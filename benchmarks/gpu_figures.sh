#!/usr/bin/env bash
# The device figures of the README: GPT-2 124M on H200(s), every framework against pytorch.
#   benchmarks/gpu_figures.sh OUT_DIR [TEXT_FILE] [INFINITRAIN_BUILD] [single|parallel|drift|dp8|all]
# Single-GPU basic cases on pytorch, megatron (and infinitrain when a build is given); with two
# or more GPUs also the 2-GPU variants (DP=2, TP=2, PP=2), each compared with single-GPU gpt2_2.
set -uo pipefail
out=${1:?usage: gpu_figures.sh OUT_DIR [TEXT_FILE] [INFINITRAIN_BUILD]}
text=${2:-}
build=${3:-}
stage=${4:-all}
mkdir -p "$out"
text_arg=(); [ -n "$text" ] && text_arg=(--text "$text")
fw=pytorch,megatron; [ -n "$build" ] && fw=$fw,infinitrain
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: ${LOCKSTEP_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  python3 -c 'import megatron.core as m; print("megatron-core", m.__version__)'
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"

if [ "$stage" = single ] || [ "$stage" = all ]; then
python3 -m lockstep run --model gpt2 --device cuda --matrix gpt2 \
  --cases gpt2_1,gpt2_1_bfloat16,gpt2_2,gpt2_2_bfloat16 --frameworks "$fw" \
  ${build:+--infinitrain-build "$build"} "${text_arg[@]}" --out "$out/single"
fi

if [ -n "$build" ] && { [ "$stage" = drift ] || [ "$stage" = all ]; }; then
  python3 -m lockstep run --model gpt2 --device cuda --matrix benchmarks/matrices/lr_sensitivity.toml \
    --frameworks pytorch,infinitrain --infinitrain-build "$build" "${text_arg[@]}" --out "$out/drift"
fi

ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')
if [ "$ngpu" -ge 2 ] && { [ "$stage" = parallel ] || [ "$stage" = all ]; }; then
  python3 -m lockstep run --model gpt2 --device cuda --matrix gpt2_parallel --frameworks pytorch,megatron \
    "${text_arg[@]}" --out "$out/parallel"
  # Each 2-GPU variant must train like single-GPU gpt2_2 / gpt2_2_bfloat16 (same global batch).
  for fwk in pytorch megatron; do
    for c in gpt2_dp2 gpt2_tp2 gpt2_pp2; do
      f="$out/parallel/$fwk/$c.jsonl"; [ -f "$f" ] && [ -f "$out/single/$fwk/gpt2_2.jsonl" ] || continue
      python3 -m lockstep compare "$out/single/$fwk/gpt2_2.jsonl" "$f" --json "$out/parallel/vs_single_${fwk}_${c}.json"
    done
    f="$out/parallel/$fwk/gpt2_dp2_bfloat16.jsonl"
    [ -f "$f" ] && [ -f "$out/single/$fwk/gpt2_2_bfloat16.jsonl" ] && python3 -m lockstep compare "$out/single/$fwk/gpt2_2_bfloat16.jsonl" "$f" \
      --json "$out/parallel/vs_single_${fwk}_gpt2_dp2_bfloat16.json"
  done
fi
# Issue 7: the 8-GPU data-parallel cases of the basic matrix, each against single-GPU gpt2_2(_bfloat16).
if [ "$ngpu" -ge 8 ] && { [ "$stage" = dp8 ] || [ "$stage" = all ]; }; then
  python3 -m lockstep run --model gpt2 --device cuda --matrix gpt2 --cases gpt2_3,gpt2_3_bfloat16 \
    --frameworks pytorch,megatron "${text_arg[@]}" --out "$out/dp8"
  for fwk in pytorch megatron; do
    for dt in "" _bfloat16; do
      f="$out/dp8/$fwk/gpt2_3$dt.jsonl"; s="$out/single/$fwk/gpt2_2$dt.jsonl"
      [ -f "$f" ] && [ -f "$s" ] && python3 -m lockstep compare "$s" "$f" --json "$out/dp8/vs_single_${fwk}_gpt2_3$dt.json"
    done
  done
fi
exit 0
