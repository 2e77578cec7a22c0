"""`spiral-jax eval --suite ...`: turns the command's options into one suite run and its report.

Options come as attributes of `args` (the CLI's absl FLAGS, or any namespace in tests):
suite ("games", "transfer", "kuhn", "crossplay", "bench"), games (per pair; 0: eval.final_games),
eval_out (the report folder; default <out_dir>/eval/<suite>), opponents and env_ids (lists; default the config's), players
(crossplay: HF folders, "name=path" or "path"), crossplay_env, kuhn_samples (0: exact scoring),
bench ("NAME=file.jsonl", "file.jsonl" named after the file, or "NAME" to download it from the hub
first), samples (0: eval.math.samples), shots_file, shots, limit (0: eval.math.limit, then all items).
Benchmarks are sampled and prompted as `eval.math` says (`--protocol reference`: as the reference).
"""
from __future__ import annotations

from pathlib import Path

from spiral_jax.policies import SCRIPTED, kind
from spiral_jax.eval import benchmarks, game_report, hub, suite
from spiral_jax.paths import file_in

SUITES = ("games", "transfer", "kuhn", "crossplay", "bench")


def _named(spec: str) -> tuple[str, str]:
    name, _, path = spec.partition("=")
    return (name, path) if path else (Path(spec).name, spec)


def run_eval(ctx: suite.EvalContext, c, args) -> str:
    """Run the chosen suite, write its files, and return its markdown report."""
    if args.suite not in SUITES:
        raise ValueError(f"--suite must be one of {', '.join(SUITES)}, got {args.suite!r}")
    out = Path(args.eval_out) if args.eval_out else Path(c.out_dir) / "eval" / args.suite
    n = args.games or c.eval.final_games
    if args.suite == "games":
        extra = {}
        opponents = []
        for spec in args.opponents or c.eval.opponents:
            if kind(spec) in ("scripted", "self"):
                opponents.append(spec)
            elif kind(spec) == "api":  # reached now: a dead endpoint fails before any game
                ctx.rollout.api_player(spec).check()
                opponents.append(spec)
            else:  # a model folder
                name, path = _named(spec)
                if not Path(path).is_dir():
                    raise FileNotFoundError(f"--opponents {spec}: not random, scripted, self or "
                                            f"openai:MODEL@URL, and no model folder {path} exists "
                                            "(name=path/to/hf_folder for a model)")
                extra[name] = ctx.load_weights(path)
                opponents.append(name)
        results = suite.run_games(ctx, out, args.env_ids or c.games.env_ids, opponents, n, extra)
        return game_report.to_markdown(results, ctx.settings(n_games=n))
    if args.suite == "transfer":
        results = suite.run_transfer(ctx, out, n, args.opponents or SCRIPTED)
        return game_report.to_markdown(results, ctx.settings(n_games=n), "Transfer to unseen games")
    if args.suite == "kuhn":
        suite.run_kuhn(ctx, out, args.kuhn_samples)
        return (out / "kuhn.md").read_text()
    if args.suite == "crossplay":
        players = {"model": ctx.params}
        players.update({name: ctx.load_weights(path) for name, path in map(_named, args.players)})
        scripted = [o for o in args.opponents if kind(o) == "scripted"]
        suite.run_crossplay(ctx, out, players, args.crossplay_env, n, scripted)
        return (out / "crossplay.md").read_text()
    files, m = {}, c.eval.math
    for spec in args.bench or m.files:
        local = "=" in spec or spec.endswith(".jsonl") or Path(spec).is_file()
        files.update(benchmarks.local_files([spec]) if local else {spec: hub.download(spec, file_in(out / "data", spec, ".jsonl"))})
    if not files:
        raise ValueError("--bench needs NAME=file.jsonl (or NAME, to download from the hub) entries, "
                         "or eval.math.files in the config")
    results = suite.run_benchmarks(ctx, out, files, args.samples or m.samples, args.shots_file or None, args.shots,
                                   args.limit or m.limit or None, instruction_first=m.instruction_first)
    return benchmarks.markdown(results)
