#!/usr/bin/env bash
# One RL step of the paper's Kuhn recipe on one NVIDIA GPU (an H200), in 12-18 minutes:
#   1. scripts/gpu_attention_check.py (cuDNN fused attention against XLA's), when it exists: 1 min at
#      most (its own estimate is about a minute; cut at 60 s so the benches keep their time);
#   2. bench/rl_step.py at the Qwen3-0.6B and 1.7B shapes with the paper's sizes (128 samples, 64
#      games per sampler call, micro-batch 8, 2 PPO epochs, bf16, remat) but responses capped at
#      1024 new tokens (mean 256) instead of 4096, one step each: 2-3 min each (cut at 180 and
#      210 s). Compiling is most of it: the rounds schedule compiles one sampler program per batch
#      bucket (64 games down to 1) and prompt bucket, about ten, plus the train step and the
#      old-log-prob pass; the bench leaves it out of every phase. A GPU's decode programs unroll the
#      layers (docs/performance.md), which compiles about 3x longer than a scanned stack: an engine
#      decode program of the 0.6B shape takes 8 s against 2.5 s on a 2-core CPU without a GPU
#      (bench/decode_program.py). The step itself is 10-30 s at this cap;
#   3. Qwen3-4B as the H200 preset (configs/kuhn_qwen3_4b_1xh200.py: micro-batch 4, 32 games per call;
#      the recipe's micro-batch 8 and 64 games do not fit by the planner), two real steps at the same
#      cap: 5-7 min (cut at 450 s), most of it compiling. The second step runs warm: the
#      steady-state figures. Each 4B decode step reads 8 GB of weights and up to 6 GB of cache, some
#      thousands of steps a rollout. At the full 4096-token cap the step alone is about 4-5 min by
#      that arithmetic (four times the decode steps, each reading up to four times the cache), so it
#      is not part of this run: the command printed at the end runs it (about 8 min).
#   4. (part "continuous", not in the default) the Qwen3-0.6B step of part 2 with the continuous
#      schedule, 16 decode slots for its 64 games (rollout.max_in_flight): the same tokens as the
#      rounds step, so the two steps' times say whether the presets should use it (cut at 240 s: the
#      engine compiles a decode program per attention window and a prefill per block size).
# Logs go to $OUT (default /tmp/gpu_rl_step), one per part, and summary.txt collects each bench's
# last line. Override a part's limit with ATTENTION_S, SMALL_S, CONTINUOUS_S, MEDIUM_S, PRESET_S,
# the cap with NEW_TOKENS; PARTS picks parts (default "attention small medium preset"). A machine
# that runs one command for at most 10 minutes takes it in two calls, the issue's targets first:
# PARTS=preset (limit 480 s), then PARTS="attention small continuous" with the time left (summary.txt
# is appended to). Run from the
# repository root with spiral_jax importable (pip install -e '.[cuda]', or PYTHONPATH=. where the
# packages are already there). On a machine that cannot reach PyPI, put the wheels of what it lacks
# in .whl/ (an image with JAX, flax and transformers lacks ml-collections: pip download --no-deps
# --only-binary=:all: -d .whl ml-collections==1.1.0); they are installed to /tmp/site first.
set -u
source scripts/gpu_env.sh
OUT=${OUT:-/tmp/gpu_rl_step}
NEW_TOKENS=${NEW_TOKENS:-1024}
mkdir -p "$OUT"
# Programs compiled once load from here in a rerun on the same machine.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/spiral_jax_xla_cache}

nvidia-smi -L
python3 -c "import jax, ml_collections; print('jax', jax.__version__, jax.devices())" || exit 1

# run NAME LIMIT_S ARGS...: one bench run, its log in $OUT/NAME.log, its last line in summary.txt.
run() {
  local name=$1 limit=$2 start
  shift 2
  section "$name: bench/rl_step.py $*"
  start=$(date +%s)
  timeout "$limit" python3 bench/rl_step.py --hardware 1xH200 "$@" > "$OUT/$name.log" 2>&1
  local status=$?
  tail -25 "$OUT/$name.log"
  echo "$name: exit $status after $(( $(date +%s) - start )) s (limit $limit s)"
  echo "$name ($*): $(tail -1 "$OUT/$name.log")" >> "$OUT/summary.txt"
}

PARTS=" ${PARTS:-attention small medium preset} "
want() { [[ "$PARTS" == *" $1 "* ]]; }

if want attention && [ -f scripts/gpu_attention_check.py ]; then
  section "scripts/gpu_attention_check.py"
  timeout "${ATTENTION_S:-60}" python3 scripts/gpu_attention_check.py 2>&1 | tee "$OUT/attention.log" | tail -30
  echo "attention check: exit ${PIPESTATUS[0]}"
fi

want small && run qwen3_0p6b "${SMALL_S:-180}" --shape 0.6b --max_new_tokens "$NEW_TOKENS" --steps 1
want continuous && run qwen3_0p6b_continuous "${CONTINUOUS_S:-240}" --shape 0.6b --max_new_tokens "$NEW_TOKENS" \
  --steps 1 --schedule continuous --max_in_flight 16
want medium && run qwen3_1p7b "${MEDIUM_S:-210}" --shape 1.7b --max_new_tokens "$NEW_TOKENS" --steps 1
want preset && run qwen3_4b_1xh200 "${PRESET_S:-450}" --config configs/kuhn_qwen3_4b_1xh200.py --max_new_tokens "$NEW_TOKENS" --steps 2

section "summary"
cat "$OUT/summary.txt"
echo "the paper's full lengths, when time allows:"
echo "  python3 bench/rl_step.py --hardware 1xH200 --config configs/kuhn_qwen3_4b_1xh200.py --steps 1"
