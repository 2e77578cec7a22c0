"""The experiment config's schema: `base_config()`, evaluation protocols, and reading config files.

Config files in configs/ start from `base_config()` and change what their experiment needs. The
config comes back locked: its keys are fixed, so a misspelt key, in a file or in a --config.a.b=v
override, is an error naming the key (values can still change). What a config builds (the model,
tokenizer, optimiser and sampling settings) is `spiral_jax.run.setup`'s: this module depends on
nothing above the templates, so every layer may read a config's schema. `check_values` holds a config
to it: each field's type, range (RANGES) or choices (CHOICES), before anything is built.
"""
from __future__ import annotations

import math
from pathlib import Path

from ml_collections import ConfigDict

from spiral_jax.templates import INSTRUCTION, SUFFIX

EMBEDDED_TOKENIZER = Path(__file__).parent / "assets" / "tiny_tokenizer"


def base_config() -> ConfigDict:
    c = ConfigDict()
    c.seed = 0
    c.out_dir = "runs/spiral"
    # XLA's persistent compilation cache for train, eval and serve (spiral_jax/compilation.py): a run
    # that meets programs compiled before loads them. Empty: off; JAX_COMPILATION_CACHE_DIR wins.
    c.compile_cache_dir = "~/.cache/spiral_jax/xla"
    # Threads that compile the sampler's smaller batch buckets, and the decode engine's larger windows
    # and smaller inserts, while a call runs, and the train step while the old-log-prob pass compiles and runs
    # (spiral_jax/sampling/ahead.py). -1: half the host's cores, at most 8, on a GPU or TPU, none on a
    # CPU; 0: off.
    c.compile_ahead = -1
    # model.path: a Hugging Face checkpoint folder. Empty: a random model with the `random` shape.
    # model.attention: the self-attention kernel of training, scoring and prefill: auto (splash on TPU,
    # cuDNN flash attention on GPU, XLA on CPU), xla, splash or cudnn (spiral_jax/models/fused_attention.py).
    # model.decode_attention: a decode step's attention: auto (Pallas on TPU where model.attention is,
    # XLA elsewhere), pallas (Pallas kernels on TPU and NVIDIA GPUs, spiral_jax/models/decode_attention.py
    # and decode_attention_gpu.py: they read each row's filled cache only), xla.
    # model.remat_saves (with remat): what each layer keeps from its forward rather than compute again in
    # the backward: "mlp" (the gate and up projections), "qkv" (the q/k/v projections); more memory,
    # fewer FLOPs. On a GPU, scan_layers off also holds fewer gradients (docs/performance.md).
    # model.lora: rank 0 = full fine-tuning (the other lora settings left at their defaults); rank > 0
    # trains LoRA adapters (scaled alpha / rank) on the `targets` projections and freezes the weights,
    # held in compute_dtype (spiral_jax/models/lora.py).
    # sample: "merged" (the sampler reads the adapters folded into a copy of the weights, once per step)
    # or "adapters" (it applies them in its forward: no second copy, a little more work per token).
    c.model = ConfigDict(dict(
        path="", compute_dtype="float32", scan_layers=False, remat=True, remat_saves=(), attention="auto",
        decode_attention="auto",
        lora=ConfigDict(dict(rank=0, alpha=16.0, targets=("q", "k", "v", "o", "gate", "up", "down"), dropout=0.0,
                            sample="merged")),
        random=ConfigDict(dict(model_type="qwen3", vocab_size=1024, hidden_size=64, intermediate_size=128,
                               num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                               tie_word_embeddings=True, max_position_embeddings=2048,
                               rope_theta=1000000.0, rms_norm_eps=1e-6))))
    # tokenizer.path: a folder, "embedded" (the project's tiny BPE), or empty: the model's folder.
    c.tokenizer = ConfigDict(dict(path="", template="qwen_raw", instruction=INSTRUCTION, suffix=SUFFIX,
                                  enable_thinking=False))
    c.mesh = ConfigDict(dict(data=1, fsdp=-1, tensor=1))
    # Multi-host: every host runs the same command; see spiral_jax/distributed.py. Empty / 0 / -1:
    # JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, else JAX's own detection (TPU pods).
    c.distributed = ConfigDict(dict(enabled=False, coordinator_address="", num_processes=0, process_id=-1))
    c.games = ConfigDict(dict(env_ids=("TicTacToe-v0",), weights=(1.0,), max_turns=50,
                              invalid_rewards=(-1.5, 0.5)))
    # mode: self_play | fixed_opponent | pool (past snapshots). opponent (fixed_opponent): random,
    # scripted, or a Hugging Face model folder with the model's architecture (frozen, sampled in-program).
    # schedule: rounds (one sampler call per round of moves) | continuous (decode slots refilled as
    # moves end; same tokens, see spiral_jax/rollout.py). max_in_flight: games played at once per host
    # (continuous: decode slots per policy); 0: all of a step's games.
    c.rollout = ConfigDict(dict(
        mode="self_play", opponent="random", pool_size=4, pool_every=10, pool_self_weight=0.5,
        games_per_batch=32, samples_per_step=128, selection="exact", max_new_tokens=4096,
        temperature=1.0, top_p=1.0, top_k=0, max_prompt_len=2048, schedule="rounds", max_in_flight=0))
    # games_per_shard > 0: baselines per shard of that many games a step (the reference: 2; rl/rae.py)
    c.rae = ConfigDict(dict(enabled=True, decay=0.95, drop_zero=True, games_per_shard=0))
    # Fields of spiral_jax.rl.TrainConfig (optimiser, loss, micro-batching). kl_coef > 0: a KL penalty
    # to the policy RL started from (after any bootstrap), kept frozen and checkpointed: one more copy
    # of the parameters. The reference recipe has none. samples_per_row: the most samples packed into
    # one training row (1: a row each; 0: auto, rl.samples.per_row: 16, or 1 under cuDNN attention).
    c.optim = ConfigDict(dict(
        learning_rate=1e-6, schedule="constant", warmup_steps=0, decay_steps=0, final_lr_fraction=0.0,
        b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0, max_grad_norm=1.0, epochs=1, clip=0.2,
        normaliser="constant", normaliser_constant=4096.0, tis_cap=0.0, kl_coef=0.0,
        micro_batch_size=0, samples_per_row=0, logprob_chunk=512))
    # max_skipped_in_a_row: updates skipped for a non-finite loss/gradients that stop the run (0: never).
    # eval_every 0: the step-0 and final evaluations only; checkpoint_every 0: the final checkpoint only.
    c.train = ConfigDict(dict(steps=400, eval_every=16, checkpoint_every=16, keep=3,
                              async_checkpointing=True, transcripts=2, max_skipped_in_a_row=5))
    # env_ids: the games evaluated (empty: the training games), each against every opponent, both seats.
    # temperature 0 (here and in eval.math) decodes greedily.
    c.eval = ConfigDict(dict(env_ids=(), opponents=("random", "scripted"), games=64, final_games=200, temperature=0.6,
                             top_p=0.95, max_new_tokens=4096, invalid_rewards=(-1.0, 1.0),
                             kuhn_samples=-1))  # Kuhn exploitability: -1 off, 0 exact scoring, k samples
    # Math benchmarks: `spiral-jax eval --suite bench`, and during training at step 0, every `every`
    # steps and at the end (0: never; the reference runs them every 16 steps). files: "NAME=items.jsonl"
    # (format: spiral_jax/eval/benchmarks.py). samples per item; limit: items per file (0: all);
    # instruction_first: the instruction before the question, as the reference asks (else after it).
    c.eval.math = ConfigDict(dict(every=0, files=(), samples=4, limit=0, temperature=0.6, top_p=0.95,
                                  max_new_tokens=4096, instruction_first=False))
    # Imitation before RL, for random tiny models only (real checkpoints skip it). teacher: random,
    # hashed (random move distributions per observation, hash_uniform of them uniform), legal (any
    # legal move, the model's own choice): the answer format, no strategy; or scripted (imitation of
    # the game's script). See spiral_jax/rl/bootstrap.py. targets: sampled (the teacher's move) or
    # distribution (every legal move, weighted by the teacher's probability); batch_size counts turns.
    # schedule: the learning rate after warm-up, constant or cosine (decaying to 0 at the last step).
    c.bootstrap = ConfigDict(dict(enabled=False, teacher="random", hash_uniform=0.2, targets="sampled",
                                  steps=200, batch_size=64, learning_rate=1e-3, warmup_steps=50,
                                  schedule="constant", explore=0.5))
    # API opponents, written openai:MODEL@BASE_URL in eval.opponents, rollout.opponent or `eval
    # --opponents` (spiral_jax/api_player.py): the environment variable holding the key, the time one
    # request may take in all, further tries after a failure (waits doubling from 1 s), requests at
    # once, and the largest reply body accepted.
    c.api = ConfigDict(dict(key_env="OPENAI_API_KEY", timeout_s=60.0, retries=3, concurrency=8,
                            max_reply_bytes=4 * 2**20))
    # Weights & Biases (the `wandb` extra): mirrors the TensorBoard scalars when enabled.
    c.wandb = ConfigDict(dict(enabled=False, project="spiral_jax", entity="", name=""))
    c.lock()
    return c


# The numbers each numeric field takes, checked by `check_values` before anything is built: "[a, b)"
# is a <= v < b, and so on; no field takes NaN or an infinity, or a whole number past 2**31 - 1 (JAX's
# shapes and indices are int32). A note says what an edge value means.
_COUNT, _SOME, _PROB, _POSITIVE = "[0, inf)", "[1, inf)", "[0, 1]", "(0, inf)"
RANGES = {
    "seed": "[0, 4294967295]", "compile_ahead": "[-1, inf)", "model.lora.rank": _COUNT,
    **dict.fromkeys([f"model.random.{k}" for k in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                                                    "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings")],
                    _SOME), "model.random.rope_theta": _POSITIVE,
    "model.random.rms_norm_eps": _POSITIVE, "model.lora.alpha": _POSITIVE, "games.max_turns": _SOME,
    "rollout.pool_size": _SOME, "rollout.pool_every": _SOME, "rollout.pool_self_weight": _PROB,
    "rollout.games_per_batch": _SOME, "rollout.samples_per_step": _SOME, "rollout.max_new_tokens": _SOME,
    "rollout.max_prompt_len": _SOME, "rollout.max_in_flight": _COUNT, "rollout.top_k": _COUNT,
    **{f"{s}.temperature": "[1e-05, inf)" for s in ("rollout", "eval", "eval.math")},
    **{f"{s}.top_p": "(0, 1]" for s in ("rollout", "eval", "eval.math")},
    "rae.decay": _PROB, "rae.games_per_shard": _COUNT,
    "optim.learning_rate": _COUNT, "optim.warmup_steps": _COUNT, "optim.decay_steps": _COUNT,
    "optim.final_lr_fraction": _PROB, "optim.b1": "[0, 1)", "optim.b2": "[0, 1)", "optim.eps": _POSITIVE,
    "optim.weight_decay": _COUNT, "optim.max_grad_norm": _POSITIVE, "optim.epochs": _SOME, "optim.clip": _POSITIVE,
    "optim.normaliser_constant": _POSITIVE, "optim.tis_cap": _COUNT, "optim.kl_coef": _COUNT,
    "optim.micro_batch_size": _COUNT, "optim.samples_per_row": _COUNT, "optim.logprob_chunk": _SOME,
    "train.steps": _COUNT, "train.eval_every": _COUNT, "train.checkpoint_every": _COUNT, "train.keep": _SOME,
    "train.transcripts": _COUNT, "train.max_skipped_in_a_row": _COUNT,
    "eval.max_new_tokens": _SOME, "eval.kuhn_samples": "[-1, inf)", "eval.math.every": _COUNT,
    "eval.math.samples": _SOME, "eval.math.limit": _COUNT, "eval.math.max_new_tokens": _SOME,
    "bootstrap.steps": _COUNT, "bootstrap.batch_size": _SOME, "bootstrap.learning_rate": _COUNT,
    "bootstrap.warmup_steps": _COUNT, "bootstrap.explore": _PROB, "bootstrap.hash_uniform": _PROB,
    "api.timeout_s": _POSITIVE, "api.retries": _COUNT, "api.concurrency": _SOME, "api.max_reply_bytes": _SOME,
    "distributed.num_processes": _COUNT, "distributed.process_id": "[-1, inf)",
}
NOTES = {"seed": "JAX's random keys hold 32 bits", "model.lora.rank": "0: full fine-tuning",
         "compile_ahead": "threads compiling the next programs in the background: 0 for none, -1 for the default, "
                          "none on a CPU", "rollout.max_in_flight": "0: all of a batch at once",
         "train.eval_every": "0: none between the first and the last",
         "train.checkpoint_every": "0: none between the first and the last", "optim.tis_cap": "0: off",
         "optim.micro_batch_size": "0: the whole batch", "optim.samples_per_row": "0: auto",
         "rollout.top_k": "0: off", "train.max_skipped_in_a_row": "0: never stop", "eval.math.every": "0: never",
         "eval.math.limit": "0: every item", "eval.kuhn_samples": "-1: off, 0: exact scoring",
         "distributed.num_processes": "0: JAX_NUM_PROCESSES or JAX's detection",
         "distributed.process_id": "-1: JAX_PROCESS_ID or JAX's detection",
         **dict.fromkeys(("eval.temperature", "eval.math.temperature"), "0: greedy, the most likely token")}
# Evaluation may decode greedily: 0 is allowed beside RANGES' span, and means argmax.
_ZERO_IS_GREEDY = ("eval.temperature", "eval.math.temperature")
CHOICES = {"rollout.mode": ("self_play", "fixed_opponent", "pool"), "rollout.selection": ("exact", "all"),
           "rollout.schedule": ("rounds", "continuous"), "model.compute_dtype": ("float32", "bfloat16", "float16"),
           "bootstrap.targets": ("sampled", "distribution"), "optim.normaliser": ("constant", "token_mean"),
           **dict.fromkeys(("optim.schedule", "bootstrap.schedule"), ("constant", "linear", "cosine"))}
_NUMBER_TUPLES = {"games.weights": "numbers", "games.invalid_rewards": "two numbers (the invalid mover's reward, "
                  "the other player's)", "eval.invalid_rewards": "two numbers (the invalid mover's reward, the other "
                  "player's)"}


def _leaves(c: ConfigDict, prefix: str = ""):
    for name, value in c.items():
        if isinstance(value, ConfigDict):
            yield from _leaves(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(v) -> bool:
    return not isinstance(v, float) or math.isfinite(v)  # an int of any size is


def _type_wanted(key: str, default, value) -> str | None:
    """What field `key` (default `default`) takes, when `value` is not of it: a config file may set any
    field to None, and a bool where a number goes, which ml_collections lets through."""
    if isinstance(default, (tuple, list)):
        if key in _NUMBER_TUPLES:
            ok = isinstance(value, (tuple, list)) and all(_number(v) and _finite(v) for v in value) and (
                key == "games.weights" or len(value) == 2)
            return None if ok else f"a tuple of {_NUMBER_TUPLES[key]}, e.g. {tuple(default)}"
        ok = isinstance(value, (tuple, list)) and all(isinstance(v, str) for v in value)
        return None if ok else "a tuple of strings" + (f", e.g. {tuple(default)}" if default else "")
    for kind, want in ((bool, "true or false"), (int, "a whole number"), (float, "a number"), (str, "a string")):
        if isinstance(default, kind):
            ok = isinstance(value, kind) if kind in (bool, str) else _number(value) and (
                kind is float or isinstance(value, int))
            return None if ok else want


def _bound(b: float) -> str:
    return str(int(b)) if float(b).is_integer() else f"{b:g}"


def check_values(c: ConfigDict) -> None:
    """Every field of `c` holds a value of its type (base_config's), within RANGES and CHOICES; raises
    ValueError naming the first that does not, its value and what to give."""
    for key, default in _leaves(base_config()):
        node, walked, parts = c, "the config", key.split(".")
        for i, part in enumerate(parts):
            if not isinstance(node, ConfigDict) or part not in node:
                what = f"has no field {part!r}" if isinstance(node, ConfigDict) else f"is {node!r}, not a section"
                raise ValueError(f"{walked} {what}; start the config from spiral_jax.config.base_config() and "
                                 f"change its values")
            node, walked = node[part], ".".join(parts[:i + 1])
        if key in CHOICES and node not in CHOICES[key]:
            raise ValueError(f"{key}={node!r}; use one of {', '.join(CHOICES[key])}")
        if want := _type_wanted(key, default, node):
            raise ValueError(f"{key}={node!r}: give {want}")
        if isinstance(node, int) and node >= 2**31 and key != "seed":
            raise ValueError(f"{key}={node}: give at most {2**31 - 1} (JAX's shapes and indices are int32)")
        if key not in RANGES or key in _ZERO_IS_GREEDY and node == 0:
            continue
        lo, hi = (float(b) for b in RANGES[key][1:-1].split(","))
        open_lo, open_hi = RANGES[key][0] == "(", RANGES[key][-1] == ")"
        if _finite(node) and (lo < node if open_lo else lo <= node) and (node < hi if open_hi else node <= hi):
            continue
        bounds = [f"{'more than' if open_lo else 'at least'} {_bound(lo)}"] + (
            [f"{'less than' if open_hi else 'at most'} {_bound(hi)}"] if math.isfinite(hi) else [])
        finite = "" if _finite(node) else "a finite number, "
        note = f" ({NOTES[key]})" if key in NOTES else ""
        raise ValueError(f"{key}={node!r}: give {finite}{' and '.join(bounds)}{note}")


EVAL_PROTOCOLS = {
    "reference": {"eval.temperature": 0.7, "eval.top_p": 0.9, "eval.max_new_tokens": 8192, "eval.final_games": 512,
                  "eval.math.temperature": 0.6, "eval.math.top_p": 0.95, "eval.math.max_new_tokens": 8192,
                  "eval.math.samples": 4, "eval.math.instruction_first": True},
}


def with_protocol(c: ConfigDict, name: str) -> ConfigDict:
    """A copy of `c` with an evaluation protocol's settings (EVAL_PROTOCOLS); "" leaves it as it is."""
    if not name:
        return c
    if name not in EVAL_PROTOCOLS:
        raise ValueError(f"unknown evaluation protocol {name!r}; use one of {', '.join(EVAL_PROTOCOLS)}")
    c = ConfigDict(c.to_dict())
    for key, value in EVAL_PROTOCOLS[name].items():
        *path, last = key.split(".")
        node = c
        for part in path:
            node = node[part]
        node[last] = value
    return c


class ConfigFileError(ValueError):
    """A config file that cannot be loaded; the message names the file, the line and the problem."""


def error_text(e: BaseException) -> str:
    """An exception's message on one line, as written: a KeyError's str() is the repr of its message
    (escaped quotes), and ml_collections wraps one KeyError in an AttributeError."""
    while e.args and isinstance(e.args[0], BaseException):
        e = e.args[0]
    message = e.args[0] if len(e.args) == 1 and isinstance(e.args[0], str) else str(e)
    return " ".join(message.split())


def config_from_file(name: str, relative_to: str | None = None) -> ConfigDict:
    """`get_config()` of a config file (by path, or a name next to `relative_to`, so one experiment
    can start from another's settings). Raises ConfigFileError naming the file, line and problem."""
    import importlib.util
    import traceback

    path = Path(relative_to).with_name(name) if relative_to else Path(name)
    if not path.is_file() or path.suffix != ".py":
        what = "is a folder" if path.is_dir() else "is not a Python file (.py)" if path.exists() else "does not exist"
        raise ConfigFileError(f"config file {path} {what}; pass a Python file with a get_config() "
                              f"function (the presets are in configs/)")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        get_config = getattr(module, "get_config", None)
        if not callable(get_config):
            raise ConfigFileError(f"config file {path} defines no get_config() function; it must define "
                                  f"one that returns the config (start from spiral_jax.config.base_config())")
        config = get_config()
    except ConfigFileError:
        raise
    except SyntaxError as e:
        raise ConfigFileError(f"config file {e.filename}, line {e.lineno}: {e.msg}") from None
    except Exception as e:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename) == path.absolute()
                  or Path(f.filename) == path]
        where = f", line {frames[-1].lineno} ({frames[-1].line})" if frames else ""
        raise ConfigFileError(f"config file {path}{where}: {type(e).__name__}: {error_text(e)}") from None
    if not isinstance(config, ConfigDict):
        raise ConfigFileError(f"config file {path}: get_config() returned {type(config).__name__}, not an "
                              f"ml_collections ConfigDict (start from spiral_jax.config.base_config())")
    return config


def config_changes(before: str, after: str) -> list[str]:
    """What config `after` sets differently from `before` (both as JSON, as out_dir/config.json and
    checkpoints hold them): one 'key: old -> new' per dotted key, in key order. A run resumed with
    other settings is legitimate (a longer train.steps), but it says so: a changed seed, game or
    sampling setting means the run no longer repeats the uninterrupted one."""
    import json

    def flat(tree, prefix=""):
        if not isinstance(tree, dict):
            return {prefix[:-1]: tree}
        return {k: v for key, value in tree.items() for k, v in flat(value, f"{prefix}{key}.").items()}

    try:
        old, new = flat(json.loads(before)), flat(json.loads(after))
    except (json.JSONDecodeError, TypeError):
        return []
    absent = "(absent)"
    return [f"{key}: {json.dumps(old.get(key, absent))} -> {json.dumps(new.get(key, absent))}"
            for key in sorted(old.keys() | new.keys()) if old.get(key, absent) != new.get(key, absent)]
