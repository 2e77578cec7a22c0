"""The one evaluation path, for the trainer and for `spiral-jax eval` alike.

`evaluate_policy` plays the policy of a training step against every configured opponent on every
evaluated game (`eval.suite.run_games`, seeded by the run's seed and the step) and reads the Kuhn
exploitability where configured; `evaluate_math` runs the math benchmarks. The trainer calls them at
step 0, every `eval_every` steps and at the end, writing under out_dir/eval/step<N>/; `spiral-jax
eval` calls the same functions on a checkpoint (`run_eval`), so evaluating the checkpoint of step N
again plays the very games the run played at step N.
"""
from __future__ import annotations

import os
import tempfile
import textwrap
import time
from pathlib import Path

from spiral_jax.api_player import ApiPlayer
from spiral_jax.distributed import is_leader
from spiral_jax.envs import make
from spiral_jax.eval import benchmarks, game_report, hub
from spiral_jax.eval.suite import EvalContext, run_benchmarks, run_crossplay, run_games, run_kuhn, run_transfer
from spiral_jax.models import CheckpointError, ModelConfig
from spiral_jax.paths import file_in, is_remote, local_folder, run_path
from spiral_jax.policies import SCRIPTED, WEIGHTLESS, kind
from spiral_jax.rollout import PlayedGame
from spiral_jax.run.build import checkpoint_step
from spiral_jax.run.spec import RunSpec

SUITES = ("games", "transfer", "kuhn", "crossplay", "bench")
# The flags of `spiral-jax eval` each suite reads, besides --step, --eval_out and --protocol.
SUITE_FLAGS = {"games": ("games", "opponents", "env_ids"), "transfer": ("games", "opponents"), "kuhn": ("kuhn_samples",),
               "crossplay": ("games", "opponents", "players", "crossplay_env"),
               "bench": ("bench", "samples", "shots_file", "shots", "limit")}


def transcript(game: PlayedGame) -> str:
    """One game as markdown, for TensorBoard's text tab: each response as a code block, every line of it
    indented, so that its later lines (a reasoning model's <think>, a "#") are shown as written rather
    than rendered as markdown or HTML."""
    rec = game.record
    lines = [f"{rec.env_id} seed {rec.seed}, seats {game.seats}, rewards {rec.rewards}: {rec.reason}", ""]
    for t in rec.turns:
        lines.append(f"**player {t.player}** -> `{t.action}`{'' if t.valid else ' (invalid)'}\n\n"
                     + textwrap.indent(t.response.strip()[:500], "    ", lambda line: True))
    return "\n\n".join(lines)


def evaluate_policy(ctx: EvalContext, spec: RunSpec, n_games: int, folder, writer=None, transcripts: int = 0,
                    log=print) -> tuple[dict, object]:
    """The policy of `ctx` (step `ctx.step`) against each opponent on each evaluated game, `n_games`
    per matchup (0: no games), and the Kuhn exploitability where configured: ({(env id, opponent): GameStats},
    KuhnPolicyEstimate | None). Reports and transcripts go to `folder`; scalars under eval/ to
    `writer`, with the first `transcripts` games of each matchup as text."""
    start, e = time.perf_counter(), spec.evaluation

    def shown(env_id, opponent, games):
        for i, g in enumerate(games[:transcripts] if writer is not None else []):
            writer.text(ctx.step, f"transcripts/{env_id}/{opponent}/{i}", transcript(g))

    results = run_games(ctx, folder, e.env_ids, e.opponents, n_games, on_games=shown) if n_games else {}
    scalars = {k: v for (env_id, opponent), stats in results.items()
               for k, v in stats.scalars(f"eval/{env_id}/{opponent}").items()}
    kuhn = None
    if e.kuhn_samples >= 0:  # exploitability of the policy on one-round Kuhn poker
        try:
            kuhn = run_kuhn(ctx, folder, e.kuhn_samples, env_id=e.kuhn_env_id)
            scalars.update(kuhn.scalars("eval/kuhn"))
        except ValueError as err:  # exact scoring of a model that does not answer that way yet
            log(f"[eval] step {ctx.step}: no Kuhn exploitability: {err}")
    if writer is not None:
        writer.scalars(ctx.step, {**scalars, "time/eval": time.perf_counter() - start})
    return results, kuhn


def evaluate_math(ctx: EvalContext, spec: RunSpec, files: dict, folder, writer=None, log=print) -> list:
    """The math benchmarks `files` (NAME -> items.jsonl) on the leader, as eval.math says, logged
    under eval/math/<name>/ and written to `folder`: [BenchmarkResult]."""
    if not files or not is_leader():
        return []
    start, m = time.perf_counter(), spec.evaluation.math
    log(f"[eval] step {ctx.step}: math benchmarks {', '.join(files)}")
    results = run_benchmarks(ctx, folder, files, m.samples, limit=m.limit, writer=writer, step=ctx.step,
                             instruction_first=m.instruction_first, prefix="eval/math")
    if writer is not None:
        writer.scalars(ctx.step, {"time/eval_math": time.perf_counter() - start})
    return results


def _named(spec: str, taken: set[str]) -> tuple[str, str]:
    """(label, folder) of a model given as "name=path" or "path" (labelled by its folder's name); a
    label already in `taken` (added to it otherwise) would put one model's games under another's, and a
    label that is itself a player's name (self, random, ...) would be played or reported as that player."""
    name, _, path = spec.partition("=")
    label, path = (name, path) if path else (Path(os.path.abspath(spec)).name, spec)
    if label in taken:
        raise ValueError(f"{spec!r}: the name {label!r} is taken by another player; label each model "
                         f"folder apart with name=path (e.g. {label}_2={path})")
    if not label or kind(label) != "checkpoint":
        what = "an empty name" if not label else f"the name of the player {label!r}"
        raise ValueError(f"{spec!r}: a model folder labelled with {what}; label it with a name of its own, "
                         f"NAME=path (e.g. {Path(os.path.abspath(path)).name or 'other'}_model={path})")
    taken.add(label)
    return label, path


def _kind(flag: str, name: str) -> str:
    try:
        return kind(name)
    except ValueError as e:
        raise ValueError(f"--{flag}: {e}") from None


def _crossplay_env(spec: RunSpec, args) -> str:
    """The game cross-play plays: --crossplay_env, else the first game the run evaluates."""
    return args.crossplay_env or spec.evaluation.env_ids[0]


def _local_bench(name: str) -> bool:
    """Whether a --bench entry names a JSONL file, local or gs:// (else a benchmark to download from the hub)."""
    return "=" in name or name.endswith(".jsonl") or run_path(name).is_file()


def _check_eval_out(folder: str, out_dir: str) -> None:
    """A report folder that can be one: not below a file, writable (a local one), not inside the run's
    checkpoints or TensorBoard folders (orbax and TensorBoard read every entry there)."""
    if is_remote(folder):
        target, run = folder.rstrip("/"), out_dir.rstrip("/")
        inside = target[len(run) + 1:].split("/") if target.startswith(run + "/") else [""]
    else:
        target = Path(os.path.realpath(os.path.expanduser(folder)))
        existing = next(p for p in (target, *target.parents) if p.exists())
        if not existing.is_dir() or not os.access(existing, os.W_OK):
            what = "a file" if not existing.is_dir() else "not writable"
            raise ValueError(f"--eval_out {folder}: {existing} is {what}; give a folder for the reports you can write")
        run = Path(os.path.realpath(os.path.expanduser(out_dir)))
        inside = list(target.relative_to(run).parts) if not is_remote(out_dir) and run in target.parents else [""]
    if inside[0] in ("checkpoints", "tensorboard"):
        raise ValueError(f"--eval_out {folder} is inside the run's {inside[0]} folder; give a folder of its own, "
                         f"e.g. --eval_out {run}/eval/NAME")


def check_eval_args(spec: RunSpec, args, given=()) -> None:
    """What `run_eval` would otherwise refuse only once the weights are loaded, or never: a count below 0,
    an odd --games, a --step below -1, a name listed twice, unknown games, model folders that are not
    there, a report folder that cannot be one, benchmark and example files that are missing or
    malformed, and a flag in `given` (those on the command line) that --suite does not read."""
    suite = args.suite
    if suite not in SUITES:
        raise ValueError(f"--suite must be one of {', '.join(SUITES)}, got {suite!r}")
    if stray := [n for n in given if n not in (*SUITE_FLAGS[suite], "config", "suite", "step", "eval_out", "protocol")]:
        owners = " or ".join(s for s, names in SUITE_FLAGS.items() if stray[0] in names)
        raise ValueError(f"--{stray[0]} is for --suite {owners}; --suite {suite} does not read it: leave it out")
    for name in ("games", "kuhn_samples", "samples", "shots", "limit"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name}={getattr(args, name)}: give 0 or more (spiral-jax eval --help says what 0 means)")
    if args.games % 2:
        raise ValueError(f"--games={args.games}: evaluation plays each matchup from both seats equally; give an even "
                         f"number")
    if suite in ("games", "transfer", "crossplay") and not args.games and not spec.evaluation.final_games:
        raise ValueError(f"--suite {suite} plays eval.final_games games per matchup without --games, and the config "
                         f"sets it to 0 (no final evaluation); give --games N (an even number)")
    if suite == "games" and not args.opponents and not spec.evaluation.opponents:
        raise ValueError("--suite games plays eval.opponents without --opponents, and the config lists none; give "
                         "--opponents (random, scripted, self, openai:MODEL@URL or NAME=HF_FOLDER)")
    checkpoint_step(getattr(args, "step", -1))
    for name in ("opponents", "env_ids", "players", "bench"):
        values = list(getattr(args, name))
        if twice := next((v for i, v in enumerate(values) if v in values[:i]), None):
            raise ValueError(f"--{name} lists {twice!r} twice; give each once")
    if args.eval_out:
        _check_eval_out(args.eval_out, spec.out_dir)
    for flag, env_id in [("env_ids", e) for e in args.env_ids] + [("crossplay_env", _crossplay_env(spec, args))] * (
            suite == "crossplay"):
        try:
            make(env_id)
        except ValueError as e:
            raise ValueError(f"--{flag}: {e}") from None
    kinds = {o: _kind("opponents", o) for o in args.opponents}
    for name in [o for o in args.opponents if kinds[o] == "api"]:  # the spec; `check_endpoints` asks the endpoint
        try:
            ApiPlayer.from_spec(name, **spec.api)
        except ValueError as e:
            raise ValueError(f"--opponents: {e}") from None
    if suite == "transfer" and (folders := [o for o in args.opponents if kinds[o] not in WEIGHTLESS]):
        raise ValueError(f"--suite transfer plays scripted, self and API opponents, not the model folder "
                         f"{folders[0]!r}: play it with --suite games --env_ids ...")
    if suite == "crossplay" and (others := [o for o in args.opponents if kinds[o] != "scripted"]):
        raise ValueError(f"--opponents {others[0]}: --suite crossplay plays --players and the scripted opponents "
                         f"(random, scripted); give a model folder to --players")
    taken = {"model", *(o for o in args.opponents if kinds[o] in WEIGHTLESS)}
    for name in [o for o in args.opponents if kinds[o] not in WEIGHTLESS] if suite == "games" else ():
        if not local_folder(path := _named(name, taken)[1], f"--opponents {name}").is_dir():
            raise FileNotFoundError(f"--opponents {name}: not random, scripted, self or openai:MODEL@URL, and no "
                                    f"model folder {path} exists (name=path/to/hf_folder for a model)")
        _check_model_folder("opponents", name, path, spec.model)
    for name in args.players if suite == "crossplay" else ():
        if not local_folder(path := _named(name, taken)[1], f"--players {name}").is_dir():
            raise FileNotFoundError(f"--players {name}: no model folder {path} exists (name=path/to/hf_folder)")
        _check_model_folder("players", name, path, spec.model)
    if suite == "crossplay" and not args.players and not args.opponents:
        raise ValueError("--suite crossplay needs players besides the model: --players NAME=HF_FOLDER,... and/or "
                         "--opponents random,scripted")
    if suite == "bench":
        _check_bench(spec, args)


def _check_model_folder(flag: str, name: str, path: str, model: ModelConfig) -> None:
    """A model folder's config.json is read before the evaluated model's weights load: an adapter or a
    run's folder, a config no model is built from, or another shape than `model`'s is named now rather
    than after that wait."""
    try:
        other = ModelConfig.from_pretrained(path)
    except CheckpointError as e:
        raise CheckpointError(f"--{flag} {name}: {e}") from None
    if differ := model.base().architecture_differences(other):  # they run in the evaluated model's programs
        raise ValueError(f"--{flag} {name}: the model in {path} has another architecture than the evaluated one: "
                         + ", ".join(f"{f} {getattr(other, f)} (evaluated: {getattr(model, f)})" for f in differ)
                         + "; model opponents and cross-play players need the same one")


def _check_bench(spec: RunSpec, args) -> None:
    names, sources = args.bench or spec.evaluation.math.files, hub.hub_sources()
    if not names:
        raise ValueError("--bench needs NAME=file.jsonl (or NAME, to download from the hub) entries, "
                         "or eval.math.files in the config")
    for name in names:
        if not _local_bench(name) and name not in sources:
            raise ValueError(f"--bench {name}: no such file, and not a benchmark to download (one of "
                             f"{', '.join(sources)}); give NAME=items.jsonl")
    local = benchmarks.local_files([n for n in names if _local_bench(n)])  # each name once
    if clash := next((n for n in names if not _local_bench(n) and n in local), None):
        raise ValueError(f"--bench: the name {clash!r} is given twice (a file and the hub's benchmark); give the "
                         f"file another NAME=items.jsonl")
    for path in local.values():
        benchmarks.load_items(path, args.limit or spec.evaluation.math.limit)  # JSONL of problems and answers
    if bool(args.shots) != bool(args.shots_file):
        raise ValueError("--shots N and --shots_file FILE go together: N worked examples from FILE (give both, or "
                         "neither for zero-shot prompts)")
    if args.shots_file:
        if not run_path(args.shots_file).is_file():
            raise FileNotFoundError(f"--shots_file {args.shots_file}: no such file (JSONL of worked examples)")
        if len(shots := benchmarks.load_items(args.shots_file, args.shots)) < args.shots:
            raise ValueError(f"--shots {args.shots}: {args.shots_file} holds {len(shots)} examples; give at most "
                             f"{len(shots)}")


def check_endpoints(spec: RunSpec, args) -> None:
    """Reach each API opponent the suite plays (`ApiPlayer.check`), so that a dead endpoint, a refused key
    or a refused move fails before the weights load rather than as a run of invalid moves."""
    if args.suite not in ("games", "transfer"):
        return
    for name in args.opponents or (spec.evaluation.opponents if args.suite == "games" else ()):
        if kind(name) == "api":
            ApiPlayer.playing(name, spec.evaluation.sampling, spec.api).check()


def run_eval(ctx: EvalContext, spec: RunSpec, args, checked: bool = False) -> str:
    """`spiral-jax eval --suite ...`: run the chosen suite, write its files, return its markdown.

    Options come as attributes of `args` (the CLI's flags, or any namespace in tests): suite, games
    (per pair; 0: eval.final_games), eval_out (default <out_dir>/eval/<suite>), opponents and env_ids
    (default the config's), players (crossplay: "name=path" or "path"), crossplay_env (default the first
    evaluated game), kuhn_samples (0: eval.kuhn_samples where above 0, else exact scoring), bench
    ("NAME=file.jsonl", "file.jsonl", or "NAME" from the hub), samples, shots_file, shots, limit. Checked
    first (`check_eval_args`, `check_endpoints`) unless `checked` says the caller did, as the CLI does before
    it loads the weights."""
    if not checked:
        check_eval_args(spec, args)
        check_endpoints(spec, args)
    # run_path: a gs:// out_dir stays one (pathlib makes gs://b/x a local gs:/b/x); a shell leaves ~ as written.
    out = run_path(os.path.expanduser(args.eval_out) if args.eval_out else f"{spec.out_dir.rstrip('/')}/eval/{args.suite}")
    n, e = args.games or spec.evaluation.final_games, spec.evaluation
    if args.suite == "games":
        names = args.opponents or e.opponents
        extra, opponents = {}, []
        taken = {"model", *(o for o in names if kind(o) in WEIGHTLESS)}
        for name in names:
            if kind(name) in ("scripted", "self", "api"):
                opponents.append(name)
            else:  # a model folder (checked to be there)
                label, path = _named(name, taken)
                extra[label] = ctx.load_weights(path)
                opponents.append(label)
        results = run_games(ctx, out, args.env_ids or e.env_ids, opponents, n, extra)
        return game_report.to_markdown(results, ctx.settings(n_games=n))
    if args.suite == "transfer":
        results = run_transfer(ctx, out, n, args.opponents or SCRIPTED)
        return game_report.to_markdown(results, ctx.settings(n_games=n), "Transfer to unseen games")
    if args.suite == "kuhn":  # as the run reads it (eval.kuhn_samples where on, its Kuhn game's prompts)
        run_kuhn(ctx, out, args.kuhn_samples or max(e.kuhn_samples, 0), env_id=e.kuhn_env_id)
        return (out / "kuhn.md").read_text()
    if args.suite == "crossplay":
        scripted = [o for o in args.opponents if kind(o) == "scripted"]
        players, taken = {"model": ctx.params}, {"model", *scripted}
        players.update({name: ctx.load_weights(path) for name, path in (_named(p, taken) for p in args.players)})
        run_crossplay(ctx, out, players, _crossplay_env(spec, args), n, scripted)
        return (out / "crossplay.md").read_text()
    m = e.math
    names = args.bench or m.files
    local = iter(benchmarks.local_files([n for n in names if _local_bench(n)]).items())  # in the order given
    with tempfile.TemporaryDirectory(prefix="spiral_jax_bench_") as tmp:
        data = Path(tmp) if is_remote(out) else out / "data"  # downloads are read as local files
        files = dict(next(local) if _local_bench(n) else (n, hub.download(n, file_in(data, n, ".jsonl")))
                     for n in names)
        results = run_benchmarks(ctx, out, files, args.samples or m.samples, args.shots_file or None, args.shots,
                                 args.limit or m.limit, instruction_first=m.instruction_first)
    return benchmarks.markdown(results)
