#!/bin/bash
# Device call (2026-12-02, third session): InfiniTrain's 1-GPU lora tests (GPT-2 124M, Llama 3.2 1B) and GPT-2's checkpoint
# group, pytorch vs megatron; then Mixtral FP32 split three ways (mixtral-tiny; tiny_mixtral's shape with decisive routers;
# megatron-core 0.16.1).
set -u
export NCCL_NVLS_ENABLE=0 PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONPATH=/tmp/ldeps:$PWD/src LOCKSTEP_COMMIT=$(cat .carry/commit) COLUMNS=200
T0=$(date +%s)
stamp() { echo "$1 at $(( $(date +%s) - T0 )) s" >> $OUT/machine.txt; }
python3 -m pip install -q --no-deps --target /tmp/ldeps .carry/wheels/*.whl > $OUT/install.txt 2>&1
python3 -m pip install -q --no-deps --target /tmp/ldeps016 .carry/mcore016/*.whl >> $OUT/install.txt 2>&1
{ python3 -c "import torch, megatron.core; print(torch.__version__, megatron.core.__version__)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; date -u +%FT%TZ; } > $OUT/machine.txt 2>&1
python3 -m lockstep prepare --text .carry/input.txt > /dev/null 2>&1
python3 -m lockstep prepare --text .carry/input.txt --tokenizer llama3 > /dev/null 2>&1
R="python3 -m lockstep run --no-history --no-report"
stamp lora
for m in gpt2 llama3; do
  ( time timeout 150 $R --matrix .carry/test_config.json --model $m --groups lora --cases ${m}_1_lora,${m}_1_lora_bfloat16,${m}_2_lora,${m}_2_lora_bfloat16 --frameworks pytorch,megatron --out /tmp/lora-$m ) > $OUT/lora-$m.txt 2>&1
  cp /tmp/lora-$m/summary.json $OUT/lora-$m-summary.json 2>/dev/null
done
stamp checkpoint
( time timeout 150 $R --matrix .carry/test_config.json --model gpt2 --groups checkpoint --cases gpt2_ckpt_no_resume,gpt2_ckpt_resume,gpt2_ckpt_bfloat16,gpt2_ckpt_bfloat16_resume --frameworks pytorch,megatron --out /tmp/ckpt ) > $OUT/ckpt-gpt2.txt 2>&1
du -sb /tmp/ckpt/*/*.checkpoints/* 2>/dev/null | tail -30 >> $OUT/ckpt-gpt2.txt
stamp mixtral
{
  echo "== A: mixtral-tiny on the GPU, megatron-core 0.19.2"
  timeout 90 $R --matrix mixtral --cases mixtral_1 --model mixtral-tiny --frameworks pytorch,megatron --out /tmp/a 2>&1 | grep -v -i warn | tail -8
  echo "== B: mixtral-l32-c512, routers spread to N(0,0.5), megatron-core 0.19.2"
  python3 .carry/spread_router.py mixtral-l32-c512 /tmp/spread.bin
  timeout 100 $R --matrix mixtral --cases mixtral_1 --llmc /tmp/spread.bin --frameworks pytorch,megatron --out /tmp/b 2>&1 | grep -v -i warn | tail -8
  echo "== C: mixtral-l32-c512 seeded init, megatron-core 0.16.1"
  PYTHONPATH=/tmp/ldeps016:/tmp/ldeps:$PWD/src python3 -c "import megatron.core; print('megatron-core', megatron.core.__version__)"
  PYTHONPATH=/tmp/ldeps016:/tmp/ldeps:$PWD/src timeout 100 $R --matrix mixtral --cases mixtral_1 --frameworks pytorch,megatron --out /tmp/c 2>&1 | grep -v -i warn | tail -8
} > $OUT/mixtral-split.txt 2>&1
stamp end
