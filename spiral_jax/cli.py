"""The `spiral-jax` command (train, eval, export, serve, plan, config, launch), configured by a config file + overrides.

    spiral-jax train  --config configs/tiny_tictactoe.py [--config.train.steps=10] [--resume | --overwrite]
    spiral-jax eval   --config configs/tiny_tictactoe.py [--games 200]
                      [--suite games|transfer|kuhn|crossplay|bench] [--eval_out DIR] ...
    spiral-jax export --config configs/tiny_tictactoe.py --out exported/ [--overwrite]   # HF folder
    spiral-jax serve  --config configs/tiny_tictactoe.py [--port 8000]   # OpenAI-compatible endpoint
    spiral-jax plan   --config configs/X.py [--hardware v5p-8 [--compile] | --devices 8 [--hosts 2] --device_memory_gib 16]
                      # memory per device, before a run; exit status 1 when it would not fit
    spiral-jax config --config configs/X.py [--config.a.b=v]   # print the resolved config
    spiral-jax launch tpu|gpu --config configs/X.py ...   # start on a TPU slice / GPU hosts (launch -h)

`spiral-jax COMMAND --help` lists a command's flags. A run stopped by SIGTERM or SIGINT saves a
checkpoint and exits with status 75 (requeue it with --resume); Ctrl-C anywhere else exits with 130,
a bad command line or config file with 2, any other error with 1.
"""
from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path

from absl import flags
from ml_collections import ConfigDict, config_flags

from spiral_jax.cli_errors import EXPLAINED, explain, interrupted

os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # "PyTorch was not found": not needed here

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py).",
                                lock_config=True)
flags.DEFINE_bool("resume", False, "train: continue from the newest checkpoint in out_dir.")
flags.DEFINE_bool("overwrite", False, "train: delete the run already in out_dir (what its run_manifest.json "
                  "lists) and start over; export: replace the earlier export in --out (what its "
                  "export_manifest.json lists).")
flags.DEFINE_integer("games", 0, "eval: games per (game, opponent); default eval.final_games.")
flags.DEFINE_integer("step", -1, "eval, export, serve: the checkpoint of this training step (default: the newest); "
                     "eval's games are the ones the run played when it evaluated that step.")
flags.DEFINE_string("out", "", "export: the folder to write the Hugging Face checkpoint to.")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "export: the dtype of the stored weights.")
flags.DEFINE_bool("adapter", False, "export: a LoRA run's adapters as a PEFT adapter folder (adapter_config.json, "
                  "adapter_model.safetensors; loads with peft or vLLM on top of model.path) instead of merged weights.")
flags.DEFINE_float("max_shard_gib", 5.0, "export: safetensors files up to this size; larger models are "
                   "split into shards with an index, as Hugging Face does.")
flags.DEFINE_enum("suite", "games", ["games", "transfer", "kuhn", "crossplay", "bench"],
                  "eval: games (vs --opponents on --env_ids), transfer (the unseen games), kuhn "
                  "(exploitability), crossplay (vs --players), bench (--bench files).")
flags.DEFINE_string("eval_out", "", "eval: report folder (default <out_dir>/eval/<suite>).")
flags.DEFINE_list("opponents", [], "eval: random, scripted, self, openai:MODEL@URL or HF model folders (name=path); "
                  "default eval.opponents.")
flags.DEFINE_list("env_ids", [], "eval games: the games (default eval.env_ids, else games.env_ids).")
flags.DEFINE_list("players", [], "eval crossplay: HF model folders (name=path) to play the model and each other.")
flags.DEFINE_string("crossplay_env", "", "eval crossplay: the game (default the first of eval.env_ids, else of "
                    "games.env_ids).")
flags.DEFINE_integer("kuhn_samples", 0, "eval kuhn: responses per information set (default eval.kuhn_samples "
                     "where above 0, else 0: exact scoring of the answers, for templates without reasoning).")
flags.DEFINE_list("bench", [], "eval bench: NAME=items.jsonl, items.jsonl (named after the file), or NAME "
                  "(MATH500, AIME24, ...) to download it from the hub (needs the network and the eval extra).")
flags.DEFINE_integer("samples", 0, "eval bench: samples per item (pass@1 = first sample; mean over all); "
                     "default eval.math.samples.")
flags.DEFINE_string("shots_file", "", "eval bench: JSONL of worked examples for few-shot prompts.")
flags.DEFINE_integer("shots", 0, "eval bench: how many of them (0: zero-shot).")
flags.DEFINE_integer("limit", 0, "eval bench: items per benchmark (default eval.math.limit; 0: all).")
flags.DEFINE_enum("protocol", "config", ["config", "reference"], "eval: the config's sampling settings, or the "
                  "reference's offline ones (games: temperature 0.7, top-p 0.9, 8192 new tokens, 512 games; bench: "
                  "temperature 0.6, top-p 0.95, 8192 new tokens, 4 samples, the instruction before the question).")
flags.DEFINE_string("host", "127.0.0.1", "serve: the address to listen on (0.0.0.0: every interface).")
flags.DEFINE_integer("port", 8000, "serve: the port (0: any free one).")
flags.DEFINE_string("served_name", "", "serve: the model name clients use (default: out_dir's last part).")
flags.DEFINE_integer("max_tokens", 4096, "serve: the most new tokens one request may ask for.")
flags.DEFINE_string("api_key", None, "serve: a key every request must send as 'Authorization: Bearer KEY' "
                    "(default: none; give one whenever --host is not a loopback address).")
flags.DEFINE_list("allow_origin", [], "serve: browser origins allowed to call the server (e.g. "
                  "https://app.example; '*': any); requests from any other origin get 403.")
flags.DEFINE_float("max_body_mb", 4.0, "serve: the largest request body in MB (bigger ones get 413).")
flags.DEFINE_float("timeout_s", 60.0, "serve: close a connection that sends nothing for this long.")
flags.DEFINE_float("shutdown_s", 30.0, "serve: on SIGTERM/SIGINT, how long running answers may finish "
                   "(waiting requests get 503 at once; a second signal exits at once).")
flags.DEFINE_string("hardware", "", "plan: a hardware preset (v4-8, v5e-8, v5p-8, v6e-8, any Cloud TPU type, "
                    "8xH100, 1xH200, 1xH100, 1xL40S, 1x4090); default: the devices JAX sees here.")
flags.DEFINE_integer("devices", 0, "plan: the device count, instead of --hardware.")
flags.DEFINE_integer("hosts", 1, "plan: with --devices, the machines they are spread over (one JAX process each).")
flags.DEFINE_bool("compile", False, "plan: also compile the run's programs ahead of time for --hardware and print "
                  "each one's compiled memory per device. On this machine, no accelerator needed: a TPU slice "
                  "such as v5p-8 by libtpu (pip install -e '.[tpu]'), an NVIDIA preset such as 1xH200 by XLA's "
                  "GPU compiler (pip install -e '.[cuda]'); without --hardware, this machine's devices.")
flags.DEFINE_float("device_memory_gib", 0.0, "plan: memory per device in GiB, with --devices (or to plan "
                   "for the local devices).")


# What each command does, and the flags it takes (any other flag is an error).
COMMANDS = {
    "train": ("Train: bootstrap (random tiny models), then self-play RL, with evaluations and checkpoints.",
              ("config", "resume", "overwrite")),
    "eval": ("Evaluate the newest checkpoint in out_dir (or --step's, or model.path): games, transfer, kuhn, "
             "crossplay or bench.", ("config", "step", "games", "suite", "eval_out", "opponents", "env_ids", "players",
                           "crossplay_env", "kuhn_samples", "bench", "samples", "shots_file", "shots", "limit",
                           "protocol")),
    "export": ("Write the newest checkpoint (or --step's) as a Hugging Face folder (safetensors, config, tokenizer; "
               "a LoRA run's adapters merged in, or with --adapter as a PEFT adapter folder).",
               ("config", "step", "out", "overwrite", "dtype", "max_shard_gib", "adapter")),
    "serve": ("Serve the newest checkpoint in out_dir (or --step's, or model.path) behind an OpenAI-compatible "
              "endpoint (GET /v1/models, POST /v1/chat/completions and /v1/completions, streaming included), e.g. "
              "as an openai:NAME@URL opponent.",
              ("config", "step", "host", "port", "served_name", "max_tokens", "api_key", "allow_origin",
               "max_body_mb", "timeout_s", "shutdown_s")),
    "plan": ("Memory per device of a config on some hardware, before a run; exit status 1 if it does not fit.",
             ("config", "hardware", "devices", "hosts", "device_memory_gib", "compile")),
    "config": ("Print the resolved config: the file's values with the --config.a.b=v overrides applied.",
               ("config",)),
}
OWN_FLAGS = {name for _, names in COMMANDS.values() for name in names}


def _usage() -> str:
    return __doc__.strip()


def _help(command: str) -> str:
    """`spiral-jax COMMAND --help`: what it does and its flags, with their defaults."""
    text, names = COMMANDS[command]
    lines = [f"usage: spiral-jax {command} --config FILE [--config.a.b=value ...] [flags]", "", text, "",
             "flags:"]
    for name in names:
        flag = FLAGS[name]
        said = name == "config" or flag.default in (None, "", [], False) or "default" in flag.help  # --step: -1
        default = "" if said else f" (default: {flag.default})"
        kind = "" if isinstance(flag.default, bool) else f"={name.upper()}"
        lines.append(f"  --{name}{kind}\n      {flag.help}{default}")
    lines.append("  --config.a.b=value\n      override any field of the config (spiral-jax config --config FILE "
                 "lists them)")
    return "\n".join(lines)


def _parse(argv: list[str]) -> list[str]:
    """Parse flags, returning the arguments that are not flags; repeatable in one process (tests call main()
    several times)."""
    for name in [n for n in FLAGS if n.startswith("config.")]:
        delattr(FLAGS, name)  # override flags registered by an earlier parse
    FLAGS.unparse_flags()
    saved, sys.argv = sys.argv, argv  # config_flags finds --config.a.b overrides in sys.argv
    try:
        return FLAGS(argv)[1:]
    finally:
        sys.argv = saved


def _unknown_override(argv: list[str], config: ConfigDict, file: str) -> str | None:
    """What is wrong with the first `--config.a.b` override that names no field of `config`: the flag,
    the key it lacks and the closest ones there are (None when every override names a field)."""
    for arg in argv[1:]:
        if not arg.startswith("--config."):
            continue
        path = arg[len("--config."):].split("=", 1)[0]
        node, walked = config, "config"
        for key in path.split("."):
            if not isinstance(node, ConfigDict):
                return (f"--config.{path}: {walked} is a value ({type(node).__name__}), not a group of fields; "
                        f"set it with --{walked}=VALUE")
            if key not in node:
                close = difflib.get_close_matches(key, list(node.keys()), n=3, cutoff=0.6)
                hint = f" (did you mean {' or '.join(repr(k) for k in close)}?)" if close else ""
                where = "the config" if walked == "config" else walked
                return (f"--config.{path}: {where} has no field {key!r}{hint}; spiral-jax config --config {file} "
                        f"prints every field")
            node, walked = node[key], f"{walked}.{key}"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    if len(argv) > 1 and argv[1] == "launch":
        from spiral_jax import launch
        return launch.main(argv[2:])
    if len(argv) > 1 and argv[1] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if len(argv) < 2 or argv[1] not in COMMANDS:
        print(_usage(), file=sys.stderr)
        return 2
    command = argv.pop(1)
    if any(arg in ("-h", "--help", "--helpfull", "--helpshort") for arg in argv[1:]):
        print(_help(command))
        return 0
    from spiral_jax.config import ConfigFileError, config_from_file, error_text

    if len(paths := _config_paths(argv)) > 1:  # absl would run the last, checked here as the first
        print(f"spiral-jax {command}: --config is given {len(paths)} times ({', '.join(paths)}); give one config file "
              f"and change its values with --config.a.b=value", file=sys.stderr)
        return 2
    path, config = (paths or [None])[0], None
    if path:
        try:
            config = config_from_file(path)  # names the file, line and problem, which config_flags does not
        except ConfigFileError as e:
            print(f"spiral-jax {command}: cannot load the config file: {e}", file=sys.stderr)
            return 2
    try:
        if rest := _parse(argv):  # `--resume true`, a value after a space: it would be dropped
            raise flags.Error(f"unexpected argument {rest[0]!r}; flags are --name=VALUE, boolean ones --name "
                              f"or --noname")
    except flags.Error as e:
        print(f"spiral-jax {command}: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # overrides applied to a config file that could not be read
        return _unreadable_config(command, e)
    except (AttributeError, KeyError) as e:  # ml_collections: a key the config does not have
        message = _unknown_override(argv, config, path) if config is not None else None
        if message is None:
            message = f"unknown config key in an override: {error_text(e)}"
        print(f"spiral-jax {command}: {message}", file=sys.stderr)
        return 2
    foreign = sorted(name for name in OWN_FLAGS - set(COMMANDS[command][1]) if FLAGS[name].present)
    if foreign:
        owners = {name: [c for c, (_, names) in COMMANDS.items() if name in names] for name in foreign}
        print(f"spiral-jax {command}: " + "; ".join(f"--{n} is not a {command} flag (it belongs to "
                                                     f"{' and '.join(owners[n])})" for n in foreign)
              + f"; see spiral-jax {command} --help", file=sys.stderr)
        return 2
    if FLAGS.resume and FLAGS.overwrite:
        from spiral_jax.run_dir import RESUME_AND_OVERWRITE

        print(f"spiral-jax {command}: {RESUME_AND_OVERWRITE}", file=sys.stderr)
        return 2
    if FLAGS.config is None:
        print(f"spiral-jax {command}: --config is required (e.g. --config configs/tiny_tictactoe.py)",
              file=sys.stderr)
        return 2
    if not isinstance(FLAGS.config, ConfigDict):  # ml_collections defers the error until first use
        return _unreadable_config(command, vars(FLAGS.config).get("_error"))
    try:
        return _run(command, FLAGS.config)
    except KeyboardInterrupt:  # train's loop saves and exits 75 itself; this is Ctrl-C anywhere else
        print(f"spiral-jax {command}: {interrupted(command)}", file=sys.stderr)
        return 130
    except EXPLAINED as e:
        if (message := explain(command, e)) is None:
            raise
        print(f"spiral-jax {command}: {message}", file=sys.stderr)
        return 1


def _config_paths(argv: list[str]) -> list[str]:
    """The values of --config in `argv` (either --config=X or --config X)."""
    return [arg.split("=", 1)[1] if arg.startswith("--config=") else argv[i + 1] for i, arg in enumerate(argv)
            if arg.startswith("--config=") or (arg == "--config" and i + 1 < len(argv))]


def _unreadable_config(command: str, error: Exception | None) -> int:
    reason = str(error).strip().splitlines()[-1].strip() if error else "unknown error"
    print(f"spiral-jax {command}: cannot load the config file ({reason}); pass a Python file with a "
          f"get_config() function, e.g. --config configs/tiny_tictactoe.py (the presets are in configs/)",
          file=sys.stderr)
    return 2


def _plan(spec) -> int:
    """Print the memory plan of a RunSpec; no Trainer, no weights (see spiral_jax/plan/)."""
    from spiral_jax import hardware, plan

    devices = FLAGS.devices if FLAGS["devices"].present else None
    if FLAGS.compile and devices is not None:
        raise ValueError("--compile needs --hardware (a TPU slice or an NVIDIA preset) or no hardware flag "
                         "(this machine's devices), not --devices")
    memory = FLAGS.device_memory_gib if FLAGS["device_memory_gib"].present else None
    hw = hardware.planned_hardware(FLAGS.hardware, devices, memory, FLAGS.hosts if FLAGS["hosts"].present else None)
    text, fits = plan.report(spec, hw)
    print(text)
    if not FLAGS.compile:
        return 1 if fits is False else 0
    from spiral_jax import aot

    tgt = aot.target(FLAGS.hardware)
    print(f"\nahead-of-time compilation for {tgt.name} ({len(tgt.devices)} devices"
          + (f", {tgt.memory / 2**30:.2f} GiB usable each" if tgt.memory else "") + ")", flush=True)
    results, p = aot.compile_run(spec, tgt, log=lambda m: print(m, flush=True))
    text, fits = aot.report(results, p, tgt)
    print(text)
    return 1 if fits is False else 0


def _skip_an_absent_tpu() -> None:
    """With libtpu installed (the tpu or test extra) on a machine that has no TPU, JAX starts libtpu
    anyway, which prints errors about the TPU it cannot find before JAX falls back to the CPU. Where
    nothing but the CPU can run this process (no TPU on the PCI bus, as JAX looks for one, nor its
    device files, and no other accelerator plugin), JAX is told so first. JAX_PLATFORMS and
    JAX_FORCE_TPU_INIT are left to decide."""
    import importlib.metadata
    import importlib.util

    import jax

    if jax.config.jax_platforms or os.environ.get("JAX_FORCE_TPU_INIT") or not importlib.util.find_spec("libtpu"):
        return
    tpu = any(v.read_text().strip() == "0x1ae0" for v in Path("/sys/bus/pci/devices").glob("*/vendor")) or \
        any(Path("/dev").glob("accel*")) or Path("/dev/vfio").exists()  # Google's PCI id, TPU device files
    plugins = importlib.util.find_spec("jax_plugins") or importlib.metadata.entry_points(group="jax_plugins")
    if not tpu and not plugins:
        jax.config.update("jax_platforms", "cpu")


def _run(command: str, c) -> int:
    from spiral_jax.config import with_protocol
    from spiral_jax.run.setup import run_spec

    if command == "plan" and (FLAGS.hardware or FLAGS["devices"].present):  # for other devices than these
        from spiral_jax import aot
        aot.prepare(FLAGS.hardware)  # before anything starts JAX's backends
    else:
        _skip_an_absent_tpu()
    if command == "config":  # what `train` refuses before loading anything fails here: values, games, modes
        run_spec(c, planning=True)  # a model folder only the hosts have yet is not looked for
        print(c.to_json(indent=2))
        return 0
    if command == "plan":
        return _plan(run_spec(c, planning=True))
    if command == "eval":
        c = with_protocol(c, "" if FLAGS.protocol == "config" else FLAGS.protocol)
    spec = run_spec(c, config_flags.get_config_filename(FLAGS["config"]))
    from spiral_jax.compilation import use_persistent_cache
    from spiral_jax.distributed import initialize, is_leader

    use_persistent_cache(c.compile_cache_dir)

    initialize(spec.distributed)
    if command == "train":
        from spiral_jax.run import PREEMPTED_EXIT_CODE, Trainer
        from spiral_jax.run_dir import RunDir

        with RunDir(spec.out_dir, resume=FLAGS.resume, overwrite=FLAGS.overwrite, leader=is_leader()):
            trainer = Trainer(spec, resume=FLAGS.resume)
            trainer.run()
        return PREEMPTED_EXIT_CODE if trainer.stopped else 0
    out = os.path.expanduser(FLAGS.out)  # a shell leaves --out=~/x as written
    if command == "eval":  # before any weights are loaded: flags that cannot work fail now
        from spiral_jax.run.evaluate import check_endpoints, check_eval_args
        check_eval_args(spec, FLAGS, [n for n in COMMANDS["eval"][1] if FLAGS[n].present])
        check_endpoints(spec, FLAGS)
    if command == "export":  # before any weights are loaded: a folder that is unsafe to write fails now
        from spiral_jax.export import check_export_args
        check_export_args(spec, out, FLAGS.overwrite, FLAGS.adapter, FLAGS.max_shard_gib,
                          [n for n in COMMANDS["export"][1] if FLAGS[n].present])
    if command == "serve":  # before any weights are loaded: settings that cannot work fail now
        from spiral_jax.serve.command import serve, serve_settings
        settings = serve_settings(FLAGS, spec)
    # eval / export / serve: a checkpoint's parameters in out_dir, else the weights at model.path.
    from spiral_jax.distributed import host_local_mesh
    from spiral_jax.run.build import build_tokenizer, checkpoint_step, eval_context, load_policy
    from spiral_jax.sharding import make_mesh

    mesh = host_local_mesh(make_mesh(**spec.mesh))
    tokenizer = build_tokenizer(spec)  # before the weights: a missing tokenizer fails at once
    cfg, params, source, step = load_policy(spec, mesh, what=command, log=lambda *a, **k: print(*a, **k, file=sys.stderr),
                                            adapters=command == "export" and FLAGS.adapter,
                                            step=checkpoint_step(FLAGS.step))
    print(f"[{command}] {source}", file=sys.stderr)
    if command == "eval":
        from spiral_jax.run.evaluate import run_eval

        ctx = eval_context(spec, cfg, params, tokenizer, mesh, step, math=FLAGS.suite == "bench")
        print(run_eval(ctx, spec, FLAGS, checked=True))
        return 0
    if command == "serve":
        return serve(cfg, params, tokenizer, mesh, name=FLAGS.served_name or Path(spec.out_dir.rstrip("/")).name,
                     max_prompt_len=spec.rollout.max_prompt_len, settings=settings)
    from spiral_jax.export import export_checkpoint

    return export_checkpoint(cfg, params, tokenizer, out, model_path=spec.model_path,
                             tokenizer_path=spec.tokenizer_path, dtype=FLAGS.dtype,
                             max_shard_bytes=int(FLAGS.max_shard_gib * 2**30), adapter=FLAGS.adapter)


if __name__ == "__main__":
    sys.exit(main())
