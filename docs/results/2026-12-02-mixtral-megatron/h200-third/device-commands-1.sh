#!/bin/bash
# Device call 1 (2026-12-02, third session): Mixtral FP32/BF16 pytorch vs megatron at tiny_mixtral's shape,
# diagnose of mixtral_1, the GPU tests, the main job twice.
set -u
export NCCL_NVLS_ENABLE=0 PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONPATH=/tmp/ldeps:$PWD/src LOCKSTEP_COMMIT=$(cat .carry/commit)
T0=$(date +%s)
python3 -m pip install -q --no-deps --target /tmp/ldeps .carry/wheels/*.whl > $OUT/install.txt 2>&1
python3 -c "import torch, megatron.core; print(torch.__version__, megatron.core.__version__)" > $OUT/machine.txt 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> $OUT/machine.txt; date -u +%FT%TZ >> $OUT/machine.txt
echo "install $(( $(date +%s) - T0 )) s" >> $OUT/machine.txt
python3 -m lockstep prepare --text .carry/input.txt > $OUT/prepare.txt 2>&1
python3 -m lockstep prepare --text .carry/input.txt --tokenizer llama3 >> $OUT/prepare.txt 2>&1
export COLUMNS=200
( time python3 -m lockstep run --matrix mixtral --cases mixtral_1,mixtral_1_bfloat16 --frameworks pytorch,megatron --no-history --out /tmp/mix ) > $OUT/mixtral-run.txt 2>&1
cp /tmp/mix/summary.json $OUT/mixtral-summary.json 2>/dev/null
( time timeout 240 python3 -m lockstep diagnose --matrix mixtral --case mixtral_1 --frameworks pytorch,megatron --no-history --out /tmp/mixd ) > $OUT/mixtral-diagnose.txt 2>&1
( time timeout 200 python3 -m pytest -q -m gpu tests/runners/test_gpu_runs.py -p no:cacheprovider ) > $OUT/gpu-tests.txt 2>&1
for i in 1 2; do ( time python3 -m lockstep run --no-history --out /tmp/main$i ) > $OUT/main-job-$i.txt 2>&1; done
echo "total $(( $(date +%s) - T0 )) s" >> $OUT/machine.txt
