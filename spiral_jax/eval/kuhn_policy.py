"""Exploitability of a model's Kuhn poker policy (one-round KuhnPoker-v2, the textbook game).

The model's behaviour policy is read off at the 12 information sets: each set's observation is built
by playing the env to that node (the other player's card is hidden, so any deal that reaches it
gives the same text), the model is asked, and its probability of the aggressive move (bet / call)
goes to the exact `kuhn_exploitability`.  Two ways to ask:

* sampling: K responses per set, counted after the trainer's action rules; the estimate is the
  aggressive share among valid moves, with a Wilson interval; invalid responses are reported, not
  hidden (a set with no valid response is played as 1/2 and flagged);
* exact: for a template without reasoning, the log-probability of each legal answer's token sequence
  (e.g. `\\boxed{bet}`) after the prompt, renormalised over the two moves; `coverage` says how much of
  the model's probability the two answers hold.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping, Sequence

import numpy as np

from spiral_jax.envs import INFO_SETS, KuhnExploitability, extract_action, kuhn_exploitability, make
from spiral_jax.eval.games import wilson_interval
from spiral_jax.sampling.scoring import sequence_logprobs

ENV_ID = "KuhnPoker-v2"
_CARDS = "JQK"
_HISTORY_MOVES = {"": [], "c": ["[check]"], "b": ["[bet]"], "cb": ["[check]", "[bet]"]}
_AGGRESSIVE = {"": "[bet]", "c": "[bet]", "b": "[call]", "cb": "[call]"}


@dataclasses.dataclass(frozen=True)
class InfoSetPrompt:
    info_set: str
    player: int
    observation: str
    legal_actions: tuple[str, ...]
    aggressive: str


def info_set_prompts(env_id: str = ENV_ID) -> list[InfoSetPrompt]:
    """The observation shown at each of the 12 information sets of one-round Kuhn poker.

    env_id: a Kuhn game whose first hand player 0 opens (KuhnPoker-v2, KuhnPokerChips-v0), so the
    prompts are the ones a model trained on that game sees."""
    out = []
    for info in INFO_SETS:
        card, history = _CARDS.index(info[0]), info[1:]
        player = len(history) % 2  # player 0 opens
        other = (card + 1) % 3
        env = make(env_id, rounds=1)
        env.reset(seed=0, chance={"deal": [(card, other) if player == 0 else (other, card)]})
        for move in _HISTORY_MOVES[history]:
            env.step(move)
        assert env.current_player() == player and env.info_set(player) == info
        out.append(InfoSetPrompt(info, player, env.observation(player), tuple(env.legal_actions()),
                                 _AGGRESSIVE[history]))
    return out


@dataclasses.dataclass
class KuhnPolicyEstimate:
    """The estimated policy (aggressive-move probability per set), its intervals and exploitability."""

    aggression: dict[str, float]
    interval: dict[str, tuple[float, float]]
    samples: dict[str, int]        # valid responses per set (0 for the exact method)
    invalid_rate: dict[str, float]  # sampling: share of invalid responses; exact: 1 - coverage
    exploitability: KuhnExploitability

    def scalars(self, prefix: str = "kuhn") -> dict[str, float]:
        out = {f"{prefix}/exploitability": self.exploitability.exploitability,
               f"{prefix}/nash_conv": self.exploitability.nash_conv,
               f"{prefix}/self_play_value": self.exploitability.value,
               f"{prefix}/invalid_rate": float(np.mean(list(self.invalid_rate.values())))}
        out.update({f"{prefix}/p_aggressive/{k}": v for k, v in self.aggression.items() if self.measured(k)})
        return out

    def measured(self, info: str) -> bool:
        """Whether the model gave a valid answer at `info`; else its 1/2 is a stand-in, not an estimate."""
        return self.invalid_rate[info] < 1.0

    def markdown(self) -> str:
        lines = ["| info set | P(bet/call) | 95% CI | valid samples | invalid |", "|---|---|---|---|---|"]
        for info in INFO_SETS:
            lo, hi = self.interval[info]
            p = f"{self.aggression[info]:.3f}" if self.measured(info) else "n/a (played as 0.5)"
            lines.append(f"| {info} | {p} | [{lo:.3f}, {hi:.3f}] | {self.samples[info]} | "
                         f"{self.invalid_rate[info]:.2f} |")
        e = self.exploitability
        lines.append(f"\nExploitability {e.exploitability:.4f} chips/hand (NashConv {e.nash_conv:.4f}; "
                     f"self-play value for the first player {e.value:+.4f}).")
        return "\n".join(lines) + "\n"


# sample(observations, k) -> k raw responses per observation.
SampleFn = Callable[[Sequence[str], int], Sequence[Sequence[str]]]
# probs(prompts) -> per prompt, a probability for each of its legal actions.
ProbFn = Callable[[Sequence[InfoSetPrompt]], Sequence[Mapping[str, float]]]


def estimate_by_sampling(sample: SampleFn, k: int, env_id: str = ENV_ID) -> KuhnPolicyEstimate:
    """K responses per information set, counted with the trainer's strict action rules."""
    prompts = info_set_prompts(env_id)
    responses = sample([p.observation for p in prompts], k)
    aggression, interval, samples, invalid = {}, {}, {}, {}
    for p, resp in zip(prompts, responses):
        actions = [extract_action(r) for r in resp]
        valid = [a for a in actions if a in p.legal_actions]
        hits = sum(a == p.aggressive for a in valid)
        aggression[p.info_set] = hits / len(valid) if valid else 0.5
        interval[p.info_set] = wilson_interval(hits, len(valid))
        samples[p.info_set] = len(valid)
        invalid[p.info_set] = 1 - len(valid) / len(actions) if actions else 1.0
    return KuhnPolicyEstimate(aggression, interval, samples, invalid, kuhn_exploitability(aggression))


def estimate_exact(probs: ProbFn, env_id: str = ENV_ID, min_coverage: float = 0.0) -> KuhnPolicyEstimate:
    """Exact probabilities per set (renormalised over the legal moves; the rest is `invalid_rate`).

    min_coverage: raise if the two answers hold less of the model's probability than this on
    average: the scored answers are then not what the model writes (another answer format or
    end-of-turn token) and the renormalised numbers would mean nothing."""
    prompts = info_set_prompts(env_id)
    aggression, invalid = {}, {}
    for p, dist in zip(prompts, probs(prompts)):
        given = {a: float(dist.get(a, 0.0)) for a in p.legal_actions}
        if not all(math.isfinite(v) and v >= 0 for v in given.values()):  # NaN would pass as full coverage
            raise ValueError(f"exact Kuhn scoring: {p.info_set}: the probabilities of the answers are {given}, "
                             "not probabilities: the model's log-probabilities are not finite (broken weights?)")
        mass = sum(given.values())
        aggression[p.info_set] = given[p.aggressive] / mass if mass > 0 else 0.5
        invalid[p.info_set] = max(0.0, 1.0 - mass)
    coverage = 1.0 - float(np.mean(list(invalid.values())))
    if coverage < min_coverage:
        raise ValueError(f"exact Kuhn scoring: the scored answers hold only {coverage:.3g} of the model's "
                         f"probability (need {min_coverage}); the model answers in another format or ends "
                         "its turns with another token. Use sampled scoring: eval.kuhn_samples > 0 in a run, "
                         "--kuhn_samples N with spiral-jax eval")
    exact = {i: (a, a) for i, a in aggression.items()}
    return KuhnPolicyEstimate(aggression, exact, {i: 0 for i in INFO_SETS}, invalid,
                              kuhn_exploitability(aggression))


def answer_text(action: str, template: str = "\\boxed{{{move}}}") -> str:
    """The response that plays `action` ("[bet]") without reasoning, e.g. "\\boxed{bet}"."""
    return template.format(move=action.strip("[]"))


def model_prob_fn(params, cfg, tokenizer, template: str = "\\boxed{{{move}}}",
                  end_ids: Sequence[int] = ()) -> ProbFn:
    """Exact action probabilities from an LLM whose template asks for the answer alone.

    Each action's answer text (`template`) is scored after the prompt, followed by `end_ids` (the
    end-of-turn token, so that a longer answer that merely starts the same way does not count).
    """
    def probs(prompts: Sequence[InfoSetPrompt]) -> list[dict[str, float]]:
        pairs = [(tokenizer.prompt_ids(p.observation), tokenizer.encode(answer_text(a, template)) + list(end_ids))
                 for p in prompts for a in p.legal_actions]
        lp = iter(sequence_logprobs(params, cfg, pairs))
        return [{a: float(np.exp(next(lp))) for a in p.legal_actions} for p in prompts]
    return probs


def model_sample_fn(sampler, tokenizer, params, sampling, seed: int = 0) -> SampleFn:
    """K sampled responses per observation from an LLM, all in one sampler call."""
    sp = dataclasses.replace(sampling, stop_token_ids=tokenizer.stop_ids)

    def sample(observations: Sequence[str], k: int) -> list[list[str]]:
        prompts = [tokenizer.prompt_ids(o) for o in observations for _ in range(k)]
        out = sampler.generate(params, prompts, sp, seed=seed)
        texts = [tokenizer.decode(t) for t in out.tokens]
        return [texts[i * k:(i + 1) * k] for i in range(len(observations))]
    return sample
