#!/usr/bin/env bash
# Check the GPU code paths on a machine with one NVIDIA GPU, in about 12 minutes (an H200: tests
# 5 min, bench 2.5 min, main job 3 min):
#   1. the model, sampler and train-step tests with JAX on the GPU (the 8-device mesh tests are left
#      out: they need 8 devices; CI runs them on fake CPU devices),
#   2. bench/sampler.py: spiral_jax against transformers on the same GPU, both in bf16,
#   3. the main job (configs/tiny_pig.py) end to end on the GPU.
# Every section runs also when one before it failed, so that one session gets all the logs; the exit
# status is 1 when any failed (the last section, "result", names them), else 0.
# Logs go to $OUT (default /tmp/gpu_check). Run from the repository root with spiral_jax importable
# (pip install -e '.[cuda,test]', or PYTHONPATH=. where the packages are already there). Wheels in
# .whl/ (for a machine that cannot reach PyPI; see scripts/gpu_rl_step.sh) are installed first.
set -u
source scripts/gpu_env.sh
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.5  # leave room for transformers on the same GPU

failed=""
# check NAME STATUS: a section that exited non-zero is named in the summary and fails the script.
check() { [ "$2" -eq 0 ] || failed="$failed, $1 (exit $2)"; }

nvidia-smi -L
check nvidia-smi $?
python3 -c "import jax, torch, transformers; print('jax', jax.__version__, jax.devices(), '| torch', \
torch.__version__, torch.cuda.is_available(), '| transformers', transformers.__version__)"
check imports $?

section "tests on the GPU"
timeout "${TESTS_S:-420}" python3 -m pytest -q -p no:cacheprovider --durations=5 \
  tests/models/test_hf_parity.py tests/sampling/test_sampler.py tests/rl/test_train_step.py \
  -k "not sharded and not reshard" 2>&1 | tee "$OUT/tests.log"
check tests "${PIPESTATUS[0]}"  # the status of the run, not of tee or grep

section "bench/sampler.py"
timeout "${BENCH_S:-300}" python3 bench/sampler.py --repeats 2 2>&1 | grep -v "Writing model" \
  | tee "$OUT/sampler.log"
check bench/sampler.py "${PIPESTATUS[0]}"

section "main job: configs/tiny_pig.py"
start=$(date +%s)
timeout "${MAIN_S:-300}" python3 -m spiral_jax.cli train --config configs/tiny_pig.py \
  --config.out_dir=/tmp/tiny_pig_gpu > "$OUT/main.log" 2>&1
status=$?
check "main job" "$status"
echo "main job: exit $status after $(( $(date +%s) - start )) s"
tr '\r' '\n' < "$OUT/main.log" | grep -v -E "^(bootstrap|self-play): " | tail -30
ls /tmp/tiny_pig_gpu

section "result"
if [ -n "$failed" ]; then
  echo "failed: ${failed#, }; logs in $OUT"
  exit 1
fi
echo "every section passed; logs in $OUT"
