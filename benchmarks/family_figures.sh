#!/usr/bin/env bash
# GPU figures of a model family (issues 10 and 11): the single-GPU basic cases on pytorch and
# megatron, then the two-GPU layouts, each compared with the single-GPU 5,120-token case.
#   benchmarks/family_figures.sh llama3|qwen3 OUT_DIR [TEXT_FILE] [single|parallel|all]
set -uo pipefail
family=${1:?usage: family_figures.sh llama3|qwen3 OUT_DIR [TEXT_FILE] [stage]}
out=${2:?}
text=${3:-}
stage=${4:-all}
mkdir -p "$out"
text_arg=(); [ -n "$text" ] && text_arg=(--text "$text")
case $family in
  llama3) matrix=llama3; single=llama3_1,llama3_1_bfloat16,llama3_2,llama3_2_bfloat16
          pmatrix=llama3_parallel; pcases=llama3_dp2,llama3_dp2_bfloat16,llama3_tp2,llama3_pp2 ;;
  qwen3)  matrix=qwen3; single=qwen3_1,qwen3_1_bfloat16,qwen3_2,qwen3_2_bfloat16
          pmatrix=qwen3; pcases=qwen3_dp2,qwen3_tp2,qwen3_pp2,qwen3_pp2_vpp2 ;;
  *) echo "unknown family $family"; exit 2 ;;
esac
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: ${LOCKSTEP_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  python3 -c 'import megatron.core as m; print("megatron-core", m.__version__)'
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"

if [ "$stage" = single ] || [ "$stage" = all ]; then
  python3 -m lockstep run --device cuda --matrix "$matrix" --cases "$single" --frameworks pytorch,megatron \
    "${text_arg[@]}" --out "$out/single"
fi
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')
if [ "$ngpu" -ge 2 ] && { [ "$stage" = parallel ] || [ "$stage" = all ]; }; then
  python3 -m lockstep run --device cuda --matrix "$pmatrix" --cases "$pcases" --frameworks pytorch,megatron \
    "${text_arg[@]}" --out "$out/parallel"
  # Each two-GPU layout must train like the single-GPU 5,120-token case of the same dtype.
  for fwk in pytorch megatron; do
    for f in "$out"/parallel/$fwk/*.jsonl; do
      [ -f "$f" ] || continue
      c=$(basename "$f" .jsonl)
      ref=${family}_2; case $c in *_bfloat16) ref=${family}_2_bfloat16 ;; esac
      [ -f "$out/single/$fwk/$ref.jsonl" ] || continue
      python3 -m lockstep compare "$out/single/$fwk/$ref.jsonl" "$f" --json "$out/parallel/vs_single_${fwk}_$c.json"
    done
  done
fi
exit 0
