#!/usr/bin/env bash
# The reference's online evaluation protocol, end to end, on a laptop: the paper's Kuhn config with a
# tiny random model (its sizes overridden), 16 self-play steps, evaluations at step 0 and step 16 on
# Kuhn poker and TicTacToe against random, scripted and an API opponent served locally by
# `spiral-jax serve`, plus one math file. The served opponent is a short tiny_kuhn run's checkpoint.
#
#   scripts/paper_protocol_check.sh [OUT]      # default runs/paper_protocol_check; a few minutes on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/paper_protocol_check}
PORT=${PORT:-8765}
SJ=${SJ:-.venv/bin/spiral-jax}
rm -rf "$OUT" && mkdir -p "$OUT"

# 1. The opponent: a tiny_kuhn model after a short bootstrap, served on localhost.
$SJ train --config configs/tiny_kuhn.py --config.out_dir="$OUT/opponent" --config.train.steps=0 \
  --config.bootstrap.steps=200 --config.eval.final_games=2 --config.eval.kuhn_samples=-1 > "$OUT/opponent.log" 2>&1
$SJ serve --config configs/tiny_kuhn.py --config.out_dir="$OUT/opponent" --port "$PORT" \
  --served_name kuhn-tiny --max_tokens 64 > "$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 60); do curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null && break; sleep 1; done

# 2. A math file (three problems).
printf '%s\n' '{"problem": "What is 2 + 3?", "answer": "5"}' '{"problem": "What is 7 times 6?", "answer": "42"}' \
  '{"problem": "What is 10 - 4?", "answer": "6"}' > "$OUT/toy_math.jsonl"

# 3. The paper's Kuhn config, tiny sizes, evaluated at steps 0 and 16 as the reference does online.
$SJ train --config configs/spiral_kuhn_qwen3_4b.py --config.out_dir="$OUT/run" --config.model.path= \
  --config.model.compute_dtype=float32 --config.model.random.vocab_size=2048 --config.model.random.hidden_size=32 \
  --config.model.random.intermediate_size=64 --config.model.random.num_layers=2 --config.model.random.num_heads=4 \
  --config.model.random.num_kv_heads=2 --config.model.random.head_dim=16 --config.tokenizer.path=embedded \
  --config.rollout.games_per_batch=8 --config.rollout.samples_per_step=16 --config.rollout.max_new_tokens=16 \
  --config.rollout.max_prompt_len=512 --config.optim.micro_batch_size=8 --config.train.steps=16 \
  --config.eval.games=16 --config.eval.final_games=16 --config.eval.max_new_tokens=16 \
  --config.eval.opponents="('random', 'scripted', 'openai:kuhn-tiny@http://127.0.0.1:$PORT/v1')" \
  --config.eval.math.every=16 --config.eval.math.files="('toy=$OUT/toy_math.jsonl',)" \
  --config.eval.math.samples=2 --config.eval.math.max_new_tokens=16 2>&1 | tee "$OUT/run.log" | grep -v "it/s\|step/s\|s/step"
echo "summary: $OUT/run/summary.json"
