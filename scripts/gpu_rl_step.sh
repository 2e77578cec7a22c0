#!/usr/bin/env bash
# One RL step of the paper's Kuhn recipe on one NVIDIA GPU (an H200, or an 80 GB H100), in parts. PARTS lists them, run
# in that order (default "preset small continuous"), each within its own limit and within BUDGET_S
# seconds for the whole script (default 570: a call's 590 s less the machine's start); a part with
# fewer than 120 s left is skipped and says so, for the next call to run.
# The card picks the planner's hardware (HW) and part preset's config (PRESET), both overridable:
# on an H200, 1xH200 and Qwen3-4B (configs/kuhn_qwen3_4b_1xh200.py, the issue's targets); on an H100 or
# A100 80 GB, whose memory a full fine-tune of Qwen3-4B does not fit, 1xH100 and Qwen3-1.7B
# (configs/kuhn_qwen3_1p7b_1xh100.py). Parts full and rounds run PRESET too.
#   preset: Qwen3-4B as the H200 preset (configs/kuhn_qwen3_4b_1xh200.py: micro-batch 2, layers
#      unrolled, remat keeping the MLP's gate and up, each batch of 32 games through a decode engine
#      of 16 slots, the continuous schedule; the recipe's micro-batch 8 and 64 games a call do not
#      fit by the planner), responses capped at
#      1024 new tokens (mean 251), two steps, the issue's targets. Measured on two H200 machines
#      with the rounds schedule (32 games a sampler call), before the preset took the engine: the
#      first step took 317 and 409 s, of which 236 and 330 s tracing and compiling 10-11 programs
#      (one sampler program per batch bucket and prompt bucket, each with its decode step unrolled
#      over 36 layers, plus the train step and the old-log-prob pass), so about 80 s of step; a
#      machine's start takes its seconds too. The engine's first step meets about 22 smaller
#      programs instead (a decode program per attention window, compiled ahead, and an insert per
#      rows, block and window met: JAX_LOG_COMPILES=1 at the tiny shape on CPU, 10 and 12). Those
#      runs compiled one program at a time; now the
#      sampler compiles its smaller batch buckets ahead on background threads (8 on a 16-core host),
#      and the learner its train step beside the old-log-prob pass, which the step line counts apart,
#      so the first step should make its programs faster (not yet measured on a GPU; compare
#      --compile_ahead 0). The bench starts the second step only if it ends by
#      PRESET_S less 100 s (--time_limit), which leaves the report its time (its batch-1 decode
#      and kernel traces run programs the step compiled). Limit PRESET_S, default 560 s.
#   small: bench/rl_step.py at the Qwen3-0.6B shape with the paper's sizes (128 samples, 64 games per
#      call, micro-batch 8, 2 PPO epochs, bf16, remat) at the same cap, one step (SMALL_S, 240 s). At
#      these sizes the first step makes about six sampler programs (JAX_LOG_COMPILES=1 at the tiny
#      shape on CPU), each 29.5 s of XLA's compiling without a GPU on 2 cores; the 4B program's 52.5
#      s there took 25-30 s on the H200's host, so about 15 s each there, plus the train step.
#   continuous: the step of part small with the continuous schedule, 16 decode slots for its 64
#      games (rollout.max_in_flight): about the same tokens as the rounds step, so the two steps' times say
#      whether the presets should use it (CONTINUOUS_S, 240 s: the engine makes about six decode
#      programs, one per attention window met, 10.5 s each without a GPU, and about thirteen inserts;
#      run after part small in the same call, the train step loads from the compilation cache).
#   packed: part small with up to 16 samples packed into each training row (--samples_per_row 16:
#      cuDNN's packed attention layout), whose train MFU against part small's says whether the GPU
#      presets should pack (PACKED_S, 240 s; run part attention first, which checks that layout).
#   medium: part small at the Qwen3-1.7B shape (MEDIUM_S, 210 s).
#   full: the preset at the paper's full lengths (up to 4096 new tokens, mean 1005), two steps if they
#      fit (FULL_S, 560 s: about four times part preset's tokens; a call of its own).
#   rounds: part preset with the rounds schedule (--schedule rounds --max_in_flight 0: 32 games a
#      sampler call), one step (ROUNDS_S, 450 s): against part preset's step, the schedules' decode
#      on the GPU itself.
#   attention: scripts/gpu_attention_check.py, cuDNN fused attention against XLA's, packed rows
#      included (ATTENTION_S, 75 s). When its packed layout fails (or never says OK), PER_ROW is
#      cleared for the parts after it.
#   decode: bench/decode_attention.py, the Pallas decode kernel (model.decode_attention=pallas)
#      against XLA's decode attention at Qwen3-4B's heads, 1, 16 and 32 rows, rows at the window's
#      end and spread over it, with a parity check (DECODE_S, 120 s: 12 small programs to compile).
#      Where the kernel wins, part pallas says what it makes of a step.
#   pallas: part continuous with --decode_attention pallas (PALLAS_S, 240 s), against part continuous.
#   graphs: part continuous with XLA's CUDA graphs holding its loops too (GRAPHS_S, 240 s): XLA:GPU runs a
#      while loop from the host by default, so each decode step reads its condition back before the
#      next step's graph launches; with --xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL the loop
#      is a conditional node of one graph, and --xla_gpu_graph_min_graph_size=1 keeps a program of a
#      few top-level thunks (the engine's decode) from losing its graphs (docs/performance.md).
#      Against part continuous's decode lines.
#   lora: Qwen3-8B with LoRA as its one-H100 preset (configs/kuhn_qwen3_8b_lora_1xh100.py: frozen bf16
#      weights, rank-32 adapters, 16 decode slots), at part preset's cap, one step (LORA_S, 450 s).
# PER_ROW=N packs up to N samples into each training row in parts preset, rounds, full and medium
# (--samples_per_row; unset: the config's auto, one a row under cuDNN). Run part attention before
# them, so a failed check of cuDNN's packed layout falls back to one a row: with a session's
# 15 minutes, PER_ROW=16 PARTS="attention preset" first, then PARTS="decode continuous" (or "decode
# pallas" where an earlier session's part decode found the kernel faster; "continuous graphs" after).
# A session's 15 minutes of device time take two calls at most, the second at once (a machine idle
# for 30 s is given back, and a fresh one compiles everything again): first the default with
# timeout_s 590, then the parts it skipped (or PARTS="attention packed medium") with the time left.
# Logs go to $OUT (default /tmp/gpu_rl_step), one per part, and
# summary.txt collects each bench's last line (appended to); NEW_TOKENS changes the cap. Run from the
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
  # Compiling ahead (several XLA compiles at once, autotuning beside a running program) is not yet
  # proven on a GPU: a run that broke before its first step ended, not by the time limit, runs again
  # without it in the time left (the last --time_limit given is the one the bench takes).
  if [ "$status" -ne 0 ] && [ "$status" -ne 124 ] && ! grep -q "^step 1 of" "$OUT/$name.log" \
      && [ "$left" -gt 150 ] && [[ " $* " != *" --compile_ahead "* ]]; then
    echo "$name broke before its first step ended: again with --compile_ahead 0"
    run "${name}_no_ahead" "$left" "$@" --compile_ahead 0 --time_limit $(( left - 100 ))
  fi
}

PER_ROW=${PER_ROW:-}
# packing: the --samples_per_row flag of the parts that take PER_ROW (none when it is unset).
packing() { [ -n "$PER_ROW" ] && echo "--samples_per_row $PER_ROW"; }

PRESET_S=${PRESET_S:-560}
BUDGET_S=${BUDGET_S:-570}
began=$(date +%s)
# limit PART PART_S: the part's limit cut to what is left of BUDGET_S; 0 (and a note) under 120 s.
limit() {
  local left=$(( BUDGET_S - ($(date +%s) - began) ))
  local s=$(( $2 < left ? $2 : left ))
  if [ "$s" -lt 120 ]; then
    echo "part $1 skipped: $s s left of BUDGET_S=$BUDGET_S; run it in the next call" | tee -a "$OUT/summary.txt" >&2
    echo 0
  else
    echo "$s"
  fi
}

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
      section "bench/decode_attention.py"
      timeout "${DECODE_S:-120}" python3 bench/decode_attention.py 2>&1 | tee "$OUT/decode.log" | tail -12
      echo "decode attention: exit ${PIPESTATUS[0]}: $(tail -1 "$OUT/decode.log")" | tee -a "$OUT/summary.txt";;
    attention)
      section "scripts/gpu_attention_check.py"
      timeout "${ATTENTION_S:-75}" python3 scripts/gpu_attention_check.py 2>&1 | tee "$OUT/attention.log" | tail -30
      status=${PIPESTATUS[0]}
      echo "attention check: exit $status" | tee -a "$OUT/summary.txt"
      # Packing rests on the packed layout's own verdict, which a timeout in the later timings leaves standing.
      if [ -n "$PER_ROW" ] && ! grep -q "^packed attention: OK" "$OUT/attention.log"; then
        echo "packed attention check failed: the parts after it train one sample a row (PER_ROW cleared)" | tee -a "$OUT/summary.txt"
        PER_ROW=
      fi;;
    *) echo "unknown part $part: preset, rounds, small, continuous, pallas, packed, medium, full, graphs," \
         "lora, attention or decode" >&2; exit 2;;
  esac
done

section "summary"
cat "$OUT/summary.txt"
