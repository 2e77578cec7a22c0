"""The offline evaluation suite behind `spiral-jax eval`: one model, every kind of evaluation.

An `EvalContext` holds what all of them share (model config, weights in the sampler layout,
tokenizer, sampler, the eval rollout, the sampling settings, which every report records, and the
step the weights are from, which seeds the games). A run's config describes one
(`spiral_jax.run.setup.eval_context`), for the trainer and for `spiral-jax eval` alike; tests build
one directly. Each `run_*` writes its files under `out_dir` and returns its results.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Mapping, Sequence

from spiral_jax.eval import benchmarks, crossplay, game_report, kuhn_policy
from spiral_jax.distributed import is_leader
from spiral_jax.models import load_policy_weights
from spiral_jax.paths import run_path
from spiral_jax.policies import SCRIPTED
from spiral_jax.rollout import Rollout
from spiral_jax.sampling import SamplingParams


@dataclasses.dataclass
class EvalContext:
    cfg: object
    params: object
    tokenizer: object
    sampler: object
    sampling: SamplingParams
    invalid_rewards: tuple[float, float] = (-1.0, 1.0)
    max_turns: int | None = 50
    seed: int = 0
    mesh: object = None
    max_in_flight: int | None = None  # games at once per host (the training batch's games_per_batch)
    schedule: str = "rounds"  # the rollout schedule (rollout.schedule)
    math_sampling: SamplingParams | None = None  # benchmarks (eval.math); None: `sampling`
    api: dict = dataclasses.field(default_factory=dict)  # API opponents' settings (the config's `api`)
    step: int = 0  # the training step the weights are from: with `seed`, it seeds the games

    @property
    def game_seed(self) -> int:
        """The seed of every evaluation game of this policy: the run's seed and the step, so a
        checkpoint evaluated again plays the very games its run evaluated at that step."""
        return self.seed * 31 + self.step

    @functools.cached_property
    def rollout(self) -> Rollout:
        """The games' player, built once per context (a continuous schedule's engines stay warm)."""
        return Rollout(self.sampler, self.tokenizer, self.sampling, invalid_rewards=self.invalid_rewards,
                       max_turns=self.max_turns, max_in_flight=self.max_in_flight, schedule=self.schedule,
                       api=self.api)

    def at(self, params, step: int) -> "EvalContext":
        """The same evaluation of other weights (those of training step `step`), sharing this
        context's rollout."""
        ctx = dataclasses.replace(self, params=params, step=step)
        if "rollout" in self.__dict__:
            ctx.__dict__["rollout"] = self.__dict__["rollout"]
        return ctx

    def settings(self, **more) -> dict:
        """The sampling settings every report records, with the step the weights are from."""
        sp = self.sampling
        return {"temperature": sp.temperature, "top_p": sp.top_p, "top_k": sp.top_k, "greedy": sp.greedy,
                "max_new_tokens": sp.max_new_tokens, "template": self.tokenizer.template.name,
                "seed": self.seed, "step": self.step, **more}

    def load_weights(self, source: str):
        """Weights of another model with the same architecture: an HF folder (sampler layout)."""
        return load_policy_weights(source, self.cfg, self.mesh)


def run_games(ctx: EvalContext, out_dir, env_ids: Sequence[str], opponents: Sequence[str], n_games: int,
              opponent_params: Mapping[str, object] | None = None, on_games=None):
    """The model against each opponent on each game: games.json / games.md / transcripts
    (`game_report.evaluate_games`, seeded by `ctx.game_seed`)."""
    settings = ctx.settings(n_games=n_games)
    results = game_report.evaluate_games(ctx.rollout, ctx.params, env_ids, opponents, n_games, ctx.game_seed,
                                         out_dir, opponent_params, settings, on_games)
    if is_leader():
        game_report.write_report(results, out_dir, settings)
    return results


def run_transfer(ctx: EvalContext, out_dir, n_games: int, opponents: Sequence[str] = SCRIPTED):
    return game_report.transfer_report(ctx.rollout, ctx.params, out_dir, n_games, ctx.game_seed, opponents,
                                       ctx.settings(n_games=n_games))


def run_kuhn(ctx: EvalContext, out_dir, k: int = 0, answer_template: str = "\\boxed{{{move}}}",
             env_id: str = kuhn_policy.ENV_ID):
    """Exploitability of the model's one-round Kuhn policy, asked with `env_id`'s prompts: sampled
    (k > 0, under the context's sampling settings) or exact scoring of the answers (k = 0; for
    templates without reasoning; fails when the answers hold under half the probability).
    Writes kuhn.md."""
    if k > 0:
        sample = kuhn_policy.model_sample_fn(ctx.sampler, ctx.tokenizer, ctx.params, ctx.sampling, ctx.seed)
        est, how = kuhn_policy.estimate_by_sampling(sample, k, env_id), f"{k} samples per information set"
    else:
        end = [ctx.tokenizer.end_of_turn_id]
        probs = kuhn_policy.model_prob_fn(ctx.params, ctx.cfg, ctx.tokenizer, answer_template, end)
        example = kuhn_policy.answer_text("[bet]", answer_template)
        est = kuhn_policy.estimate_exact(probs, env_id, min_coverage=0.5)
        how = f"exact scoring of answers like {example!r}"
    _write_leader(out_dir, "kuhn.md", f"## Kuhn poker exploitability (one round, {env_id}; {how})\n\n"
                  + est.markdown() + f"\n{game_report.settings_line(ctx.settings(kuhn_samples=k))}\n")
    return est


def run_crossplay(ctx: EvalContext, out_dir, players: Mapping[str, object], env_id: str,
                  games_per_pair: int, scripted: Sequence[str] = ()):
    """All pairs of `players` (name -> weights) and `scripted` opponents, both seats; writes
    crossplay.md and, with matplotlib, crossplay.png."""
    names = list(players) + list(scripted)
    play = crossplay.rollout_play(ctx.rollout, dict(players), env_id, ctx.seed)
    result = crossplay.cross_play(names, play, games_per_pair)
    ratings = crossplay.rate(result)
    out = _write_leader(out_dir, "crossplay.md", f"## Cross-play on {env_id} ({games_per_pair} games per pair)\n\n"
                        + crossplay.markdown(result, ratings)
                        + f"\n{game_report.settings_line(ctx.settings(games_per_pair=games_per_pair))}\n")
    try:
        if out is not None:
            crossplay.heatmap(result, out / "crossplay.png", f"{env_id}: score of row vs column")
    except ImportError:
        pass  # the markdown table holds the same numbers
    return result, ratings


def _write_leader(out_dir, name: str, text: str):
    """`text` to `out_dir`/`name` on the leader (every host holds the same results; one writes them, as
    to a shared bucket); the folder there, None on the other hosts."""
    if not is_leader():
        return None
    out = run_path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(text)
    return out


def run_benchmarks(ctx: EvalContext, out_dir, files: Mapping[str, str], k: int = 4,
                   shots_file: str | None = None, n_shots: int = 0, limit: int | None = None,
                   writer=None, step: int = 0, instruction_first: bool = False, prefix: str = "bench"):
    """Each benchmark from its JSONL file, sampled with `ctx.math_sampling`; per-item outputs,
    results.json / results.md, and scalars under `prefix` when a writer is given."""
    shots = benchmarks.load_items(shots_file, n_shots) if shots_file and n_shots else []
    sampling = ctx.math_sampling or ctx.sampling
    generate = benchmarks.model_generate_fn(ctx.sampler, ctx.tokenizer, ctx.params, sampling, ctx.seed)
    settings = dataclasses.replace(ctx, sampling=sampling).settings()
    results = [benchmarks.run_benchmark(name, benchmarks.load_items(path, limit), generate, k, out_dir,
                                        shots, settings, instruction_first=instruction_first)
               for name, path in files.items()]
    benchmarks.write_results(results, out_dir, writer, step, prefix)
    return results

