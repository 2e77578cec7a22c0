#!/usr/bin/env bash
# One RL step of the paper's Kuhn recipe on one NVIDIA GPU, in parts: bench/rl_step.py and the GPU
# checks, run in the order PARTS lists them (default "preset small continuous"), each within its own
# limit and all within BUDGET_S seconds (default 570: a device call's 590 s less the machine's start).
# A part with fewer than 120 s left is skipped and says so, for the next call to run; so is a check
# whose limit is under 120 s (attention, truncation) when less than its whole limit is left. A part
# that ran and failed makes the exit status 1, after the summary; a skipped part does not. Timings and
# what they decided are in docs/performance.md ("One RL step at a real size").
#
# The card picks the planner's hardware (HW) and the preset the preset-sized parts run (PRESET); both
# can be set instead, and must be on any other card:
#   H200: 1xH200 and configs/kuhn_qwen3_4b_1xh200.py (Qwen3-4B, the issue's targets);
#   H100 or A100 80 GB: 1xH100 and configs/kuhn_qwen3_1p7b_1xh100.py (a full fine-tune of Qwen3-4B
#   does not fit 80 GB).
#
# Parts, each with its time limit in seconds (variable, default):
#   preset      PRESET with responses capped at NEW_TOKENS (default 1024), two steps: the second
#               starts only if it ends by the limit less 100 s (--time_limit), which leaves the
#               report its time (PRESET_S, 560).
#   full        PRESET at the paper's full lengths (up to 4096 new tokens), two steps if they fit
#               (FULL_S, 560: a call of its own).
#   rounds      part preset with the rounds schedule (32 games a sampler call), one step, to set
#               the two schedules' decode against each other on the GPU (ROUNDS_S, 450).
#   small       the Qwen3-0.6B shape at the recipe's sizes (128 samples, 64 games a call,
#               micro-batch 8, 2 PPO epochs, bf16, remat), one step (SMALL_S, 240).
#   continuous  part small with the continuous schedule, 16 decode slots for its 64 games
#               (CONTINUOUS_S, 240); after part small in the same call its train step loads from
#               the compilation cache.
#   packed      part small with up to 16 samples packed a training row (cuDNN's packed layout), whose
#               train MFU against part small's says whether the GPU presets should pack (PACKED_S,
#               240; run part attention first).
#   medium      part small at the Qwen3-1.7B shape (MEDIUM_S, 210).
#   attention   scripts/gpu_attention_check.py: cuDNN's fused attention against XLA's, packed rows
#               included (ATTENTION_S, 75). If the packed layout's check does not say OK, PER_ROW
#               is cleared for the parts after it.
#   decode      bench/decode_attention.py: the Pallas decode kernel against XLA's decode attention
#               at Qwen3-4B's heads, with a parity check (DECODE_S, 120).
#   pallas      part continuous with --decode_attention pallas, against part continuous (PALLAS_S, 240).
#   graphs      part continuous with XLA's CUDA graphs holding the decode loops as well
#               (--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL; --xla_gpu_graph_min_graph_size=1
#               keeps a program of few top-level thunks, the engine's decode, from losing its graphs),
#               against part continuous's decode lines (GRAPHS_S, 240).
#   lora        Qwen3-8B with LoRA as its one-H100 preset (configs/kuhn_qwen3_8b_lora_1xh100.py), at
#               part preset's cap, one step (LORA_S, 450).
#   truncation  bench/truncation.py at 1, 32 and 128 rows: top-p by halving, as GPU programs find it
#               every step, against the sort it replaced and against the candidates of CPU and TPU
#               programs (whose conditional XLA:GPU runs from the host) (TRUNCATION_S, 90).
# PER_ROW=N packs up to N samples a training row in parts preset, full, rounds and medium
# (--samples_per_row; unset: the config's choice). Run part attention before them, so that a failed
# check of cuDNN's packed layout falls back to one sample a row.
#
# A session's device time takes two calls at most, the second at once (a machine idle for 30 s is
# given back, and a fresh one compiles everything again): PER_ROW=16 PARTS="attention preset" with
# timeout_s 590 first, then PARTS="decode continuous" ("decode pallas" where part decode found the
# kernel faster; "continuous graphs" after; "truncation" last) with the time left.
#
# Logs go to $OUT (default /tmp/gpu_rl_step), one per part; summary.txt collects each bench's last
# line. Run from the repository root with spiral_jax importable (pip install -e '.[cuda]', or
# PYTHONPATH=. where the packages are already there). On a machine that cannot reach PyPI, put the
# wheels of what it lacks in .whl/ (an image with JAX, flax and transformers lacks ml-collections:
# pip download --no-deps --only-binary=:all: -d .whl ml-collections==1.1.0); scripts/gpu_env.sh
# installs them to /tmp/site first.
set -u
source scripts/gpu_env.sh
OUT=${OUT:-/tmp/gpu_rl_step}
NEW_TOKENS=${NEW_TOKENS:-1024}
mkdir -p "$OUT"
# Programs compiled once load from here in a rerun on the same machine.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/spiral_jax_xla_cache}

nvidia-smi -L
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case $card in
  *H200*) HW=${HW:-1xH200}; PRESET=${PRESET:-configs/kuhn_qwen3_4b_1xh200.py};;
  *H100*|*A100*) HW=${HW:-1xH100}; PRESET=${PRESET:-configs/kuhn_qwen3_1p7b_1xh100.py};;
  *) if [ -z "${HW:-}" ] || [ -z "${PRESET:-}" ]; then
       echo "no preset for the card '$card' here: set HW (spiral-jax plan's --hardware) and PRESET (a config)" >&2
       exit 2
     fi;;
esac
preset_name=$(basename "$PRESET" .py)
echo "card: $card; hardware $HW; preset $PRESET"
python3 -c "import jax, ml_collections; print('jax', jax.__version__, jax.devices())" || exit 1

# run NAME LIMIT_S ARGS...: one bench run, its log in $OUT/NAME.log, its last line in summary.txt.
run() {
  local name=$1 limit=$2 start
  shift 2
  section "$name: bench/rl_step.py $*"
  start=$(date +%s)
  timeout "$limit" python3 bench/rl_step.py --hardware "$HW" "$@" > "$OUT/$name.log" 2>&1
  local status=$?
  tail -25 "$OUT/$name.log"
  local left=$(( limit - ($(date +%s) - start) ))
  echo "$name: exit $status after $(( limit - left )) s (limit $limit s)"
  echo "$name ($*): $(tail -1 "$OUT/$name.log")" >> "$OUT/summary.txt"
  # A run that broke before its first step ended, not by the time limit, runs again in the time left
  # without compiling ahead (several XLA compiles at once, autotuning beside a running program), so
  # that a failure there still leaves the part's figures (the last --time_limit given is the one the
  # bench takes).
  if [ "$status" -ne 0 ] && [ "$status" -ne 124 ] && ! grep -q "^step 1 of" "$OUT/$name.log" \
      && [ "$left" -gt 150 ] && [[ " $* " != *" --compile_ahead "* ]]; then
    echo "$name broke before its first step ended: again with --compile_ahead 0"
    run "${name}_no_ahead" "$left" "$@" --compile_ahead 0 --time_limit $(( left - 100 ))
    return  # the part's outcome is the second run's
  fi
  failed_if "$name" "$status"
}

failed=""
# failed_if NAME STATUS: a run that exited non-zero fails the script at the end (after the summary).
failed_if() { [ "$2" -eq 0 ] || failed="$failed, $1 (exit $2)"; }

PER_ROW=${PER_ROW:-}
# packing: the --samples_per_row flag of the parts that take PER_ROW (none when it is unset).
packing() { [ -n "$PER_ROW" ] && echo "--samples_per_row $PER_ROW"; }

PRESET_S=${PRESET_S:-560}
BUDGET_S=${BUDGET_S:-570}
began=$(date +%s)
# limit PART PART_S [MIN_S]: the part's limit cut to what is left of BUDGET_S; 0 (and a note) under
# MIN_S (default 120).
limit() {
  local left=$(( BUDGET_S - ($(date +%s) - began) ))
  local s=$(( $2 < left ? $2 : left ))
  if [ "$s" -lt "${3:-120}" ]; then
    echo "part $1 skipped: $s s left of BUDGET_S=$BUDGET_S; run it in the next call" | tee -a "$OUT/summary.txt" >&2
    echo 0
  else
    echo "$s"
  fi
}
# limit_check PART PART_S: limit for the GPU checks, which run whole or not at all under 120 s.
limit_check() { limit "$1" "$2" $(( $2 < 120 ? $2 : 120 )); }

for part in ${PARTS:-preset small continuous}; do
  case $part in
    preset)
      s=$(limit preset "$PRESET_S")
      [ "$s" -gt 0 ] && run "$preset_name" "$s" --config "$PRESET" \
        --max_new_tokens "$NEW_TOKENS" --steps 2 --time_limit $(( s - 100 )) $(packing);;
    small)
      s=$(limit small "${SMALL_S:-240}")
      [ "$s" -gt 0 ] && run qwen3_0p6b "$s" --shape 0.6b --max_new_tokens "$NEW_TOKENS" --steps 1;;
    continuous)
      s=$(limit continuous "${CONTINUOUS_S:-240}")
      [ "$s" -gt 0 ] && run qwen3_0p6b_continuous "$s" --shape 0.6b --max_new_tokens "$NEW_TOKENS" --steps 1 \
        --schedule continuous --max_in_flight 16;;
    packed)
      s=$(limit packed "${PACKED_S:-240}")
      [ "$s" -gt 0 ] && run qwen3_0p6b_packed "$s" --shape 0.6b --max_new_tokens "$NEW_TOKENS" --steps 1 \
        --samples_per_row 16;;
    medium)
      s=$(limit medium "${MEDIUM_S:-210}")
      [ "$s" -gt 0 ] && run qwen3_1p7b "$s" --shape 1.7b --max_new_tokens "$NEW_TOKENS" --steps 1 $(packing);;
    full)
      s=$(limit full "${FULL_S:-560}")
      [ "$s" -gt 0 ] && run "${preset_name}_full" "$s" --config "$PRESET" --steps 2 \
        --time_limit $(( s - 100 )) $(packing);;
    rounds)
      s=$(limit rounds "${ROUNDS_S:-450}")
      [ "$s" -gt 0 ] && run "${preset_name}_rounds" "$s" --config "$PRESET" \
        --max_new_tokens "$NEW_TOKENS" --steps 1 --schedule rounds --max_in_flight 0 $(packing);;
    pallas)
      s=$(limit pallas "${PALLAS_S:-240}")
      [ "$s" -gt 0 ] && run qwen3_0p6b_continuous_pallas "$s" --shape 0.6b --max_new_tokens "$NEW_TOKENS" \
        --steps 1 --schedule continuous --max_in_flight 16 --decode_attention pallas;;
    graphs)
      s=$(limit graphs "${GRAPHS_S:-240}")
      graphs="--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL --xla_gpu_graph_min_graph_size=1"
      [ "$s" -gt 0 ] && XLA_FLAGS="${XLA_FLAGS:-} $graphs" run qwen3_0p6b_continuous_graphs "$s" --shape 0.6b \
        --max_new_tokens "$NEW_TOKENS" --steps 1 --schedule continuous --max_in_flight 16;;
    lora)
      s=$(limit lora "${LORA_S:-450}")
      [ "$s" -gt 0 ] && run kuhn_qwen3_8b_lora_1xh100 "$s" --config configs/kuhn_qwen3_8b_lora_1xh100.py \
        --max_new_tokens "$NEW_TOKENS" --steps 1;;
    decode)
      s=$(limit_check decode "${DECODE_S:-120}")
      if [ "$s" -gt 0 ]; then
        section "bench/decode_attention.py"
        timeout "$s" python3 bench/decode_attention.py 2>&1 | tee "$OUT/decode.log" | tail -12
        status=${PIPESTATUS[0]}
        echo "decode attention: exit $status: $(tail -1 "$OUT/decode.log")" | tee -a "$OUT/summary.txt"
        failed_if decode "$status"
      fi;;
    truncation)
      s=$(limit_check truncation "${TRUNCATION_S:-90}")
      if [ "$s" -gt 0 ]; then
        section "bench/truncation.py"
        timeout "$s" python3 bench/truncation.py --rows 1 32 128 2>&1 | tee "$OUT/truncation.log" | tail -13
        status=${PIPESTATUS[0]}
        echo "truncation: exit $status: $(tail -1 "$OUT/truncation.log")" | tee -a "$OUT/summary.txt"
        failed_if truncation "$status"
      fi;;
    attention)
      s=$(limit_check attention "${ATTENTION_S:-75}")
      if [ "$s" -gt 0 ]; then
        section "scripts/gpu_attention_check.py"
        timeout "$s" python3 scripts/gpu_attention_check.py 2>&1 | tee "$OUT/attention.log" | tail -30
        status=${PIPESTATUS[0]}
        echo "attention check: exit $status" | tee -a "$OUT/summary.txt"
        failed_if attention "$status"
      else
        rm -f "$OUT/attention.log"  # an earlier call's verdict is not this one's
      fi
      # Packing rests on the packed layout's own verdict, which a timeout in the later timings leaves standing.
      if [ -n "$PER_ROW" ] && ! grep -q "^packed attention: OK" "$OUT/attention.log" 2>/dev/null; then
        echo "packed attention check failed or was skipped: the parts after it train one sample a row (PER_ROW cleared)" | tee -a "$OUT/summary.txt"
        PER_ROW=
      fi;;
    *) echo "unknown part $part: preset, rounds, small, continuous, pallas, packed, medium, full, graphs," \
         "lora, truncation, attention or decode" >&2; exit 2;;
  esac
done

section "summary"
cat "$OUT/summary.txt"
if [ -n "$failed" ]; then
  echo "failed: ${failed#, }" >&2
  exit 1
fi
