"""Kuhn exploitability of a policy read off a "model": exact when the probabilities are exact."""
import re

import jax.numpy as jnp
import numpy as np
import pytest

from spiral_jax.envs import INFO_SETS, kuhn_exploitability, make, nash_policy
from spiral_jax.eval.kuhn_policy import (answer_text, estimate_by_sampling, estimate_exact,
                                         info_set_prompts, model_prob_fn, sequence_logprobs)

# A deliberately exploitable policy: P(bet or call) at each information set.
LEAKY = {"J": 0.5, "Q": 0.2, "K": 0.9, "Jcb": 0.3, "Qcb": 0.6, "Kcb": 1.0,
         "Jc": 0.6, "Qc": 0.1, "Kc": 0.8, "Jb": 0.2, "Qb": 0.5, "Kb": 1.0}


def read_info_set(observation):
    """What a scripted player wrapped as a model sees: its card and the betting so far, from text."""
    card = re.search(r"Your card is ([JQK])", observation).group(1)
    moves = re.findall(r"\[Player \d\] \[(check|bet)\]", observation)
    return card + "".join(m[0] for m in moves)


def test_prompts_identify_the_information_sets():
    prompts = info_set_prompts()
    assert [p.info_set for p in prompts] == list(INFO_SETS)
    assert [read_info_set(p.observation) for p in prompts] == list(INFO_SETS)
    assert len({p.observation for p in prompts}) == 12
    # the other player's card is hidden: another deal reaching "Kb" shows the same text
    env = make("KuhnPoker-v2", rounds=1)
    env.reset(seed=5, chance={"deal": [(0, 2)]})
    env.step("[bet]")
    assert env.observation(1) == prompts[INFO_SETS.index("Kb")].observation


@pytest.mark.parametrize("policy", [LEAKY, nash_policy(0.2)], ids=["leaky", "nash"])
def test_exact_probabilities_give_exact_exploitability(policy):
    def probs(prompts):
        out = []
        for p in prompts:
            q = policy[read_info_set(p.observation)]
            passive = next(a for a in p.legal_actions if a != p.aggressive)
            out.append({p.aggressive: q, passive: 1 - q})
        return out

    est = estimate_exact(probs)
    assert est.aggression == pytest.approx(policy)
    assert est.exploitability == kuhn_exploitability(policy)
    assert all(v == 0 for v in est.invalid_rate.values())
    if policy is not LEAKY:
        assert est.exploitability.exploitability == pytest.approx(0, abs=1e-12)
    assert "Exploitability" in est.markdown() and "kuhn/exploitability" in est.scalars()


def test_exact_scoring_refuses_nan_probabilities():
    """NaN log-probabilities (broken weights) are an error: they passed as full coverage, every set
    played as 1/2 and its exploitability reported as exact."""
    def probs(prompts):
        return [{a: float("nan") for a in p.legal_actions} for p in prompts]

    with pytest.raises(ValueError, match="not finite"):
        estimate_exact(probs, min_coverage=0.5)


def test_sampling_a_pure_policy_is_exact_and_counts_invalid():
    pure = {k: float(v >= 0.5) for k, v in LEAKY.items()}

    def sample(observations, k):
        out = []
        for obs in observations:
            info = read_info_set(obs)
            p = next(p for p in info_set_prompts() if p.info_set == info)
            act = p.aggressive if pure[info] else next(a for a in p.legal_actions if a != p.aggressive)
            out.append([answer_text(act)] * (k - 1) + ["I refuse to box"])  # one invalid reply each
        return out

    est = estimate_by_sampling(sample, 5)
    assert est.aggression == pure and all(n == 4 for n in est.samples.values())
    assert all(v == pytest.approx(0.2) for v in est.invalid_rate.values())
    assert est.exploitability == kuhn_exploitability(pure)
    lo, hi = est.interval["K"]
    assert lo < 1.0 == hi  # 4 of 4: the Wilson interval stays open below


def test_a_set_without_a_valid_answer_is_marked_not_measured():
    """No valid response at a set: its 1/2 is played, but not shown or logged as the model's estimate."""
    def sample(observations, k):
        return [[answer_text("[bet]" if "[bet]" in p.legal_actions else "[fold]")] * k
                if p.info_set != "Kb" else ["no box"] * k for p in info_set_prompts()]

    est = estimate_by_sampling(sample, 3)
    assert est.aggression["Kb"] == 0.5 and est.samples["Kb"] == 0 and est.invalid_rate["Kb"] == 1.0
    assert "| Kb | n/a (played as 0.5) |" in est.markdown() and "| Jb | 0.000 |" in est.markdown()
    assert "kuhn/p_aggressive/Kb" not in est.scalars() and est.scalars()["kuhn/p_aggressive/Jb"] == 0.0


def test_sampling_a_mixed_policy_intervals_cover():
    """Over 5 seeds x 12 sets, the 95% Wilson intervals cover the true probability ~95% of the time."""
    covered, errors = 0, []
    for seed in range(5):
        rng = np.random.default_rng(seed)

        def sample(observations, k, rng=rng):
            out = []
            for obs in observations:
                info = read_info_set(obs)
                agg, pas = ("bet", "check") if info[1:] in ("", "c") else ("call", "fold")
                out.append([answer_text(agg if rng.random() < LEAKY[info] else pas) for _ in range(k)])
            return out

        est = estimate_by_sampling(sample, 400)
        covered += sum(est.interval[i][0] <= LEAKY[i] <= est.interval[i][1] for i in INFO_SETS)
        errors.append(est.exploitability.exploitability - kuhn_exploitability(LEAKY).exploitability)
    assert covered >= 0.85 * 60
    assert np.max(np.abs(errors)) < 0.05


@pytest.mark.slow
def test_llm_exact_scoring_matches_token_by_token(tiny_model):
    cfg, params, tok = tiny_model
    # The reference logits from one compiled forward pass per sequence: run eagerly, every primitive
    # compiled anew for each of the sequences' lengths took most of the test's time.
    from tests.tiny_models import jit_forward as forward

    prompt = tok.encode("Your card is K.")
    conts = [tok.encode("\\boxed{bet}"), tok.encode("\\boxed{check}")]
    got = sequence_logprobs(params, cfg, [(prompt, c) for c in conts])
    for c, value in zip(conts, got):
        logits = np.asarray(forward(params, cfg, jnp.asarray([prompt + c]))[0], np.float64)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        want = sum(logp[len(prompt) + t - 1, tok_id] for t, tok_id in enumerate(c))
        assert value == pytest.approx(want, abs=1e-4)

    end = [tok.end_of_turn_id]
    est = estimate_exact(model_prob_fn(params, cfg, tok, end_ids=end))

    def answer_prob(observation, action):  # the whole answer after the prompt, read off one forward pass
        prompt, answer = tok.prompt_ids(observation), tok.encode(answer_text(action)) + end
        logits = np.asarray(forward(params, cfg, jnp.asarray([prompt + answer]))[0], np.float64)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        return np.exp(sum(logp[len(prompt) + t - 1, i] for t, i in enumerate(answer)))

    for p in info_set_prompts()[::3]:  # J, Qcb, Jc, Jb: each kind of decision
        passive = next(a for a in p.legal_actions if a != p.aggressive)
        aggressive, other = answer_prob(p.observation, p.aggressive), answer_prob(p.observation, passive)
        assert est.aggression[p.info_set] == pytest.approx(aggressive / (aggressive + other), rel=1e-3)
        assert est.invalid_rate[p.info_set] == pytest.approx(1 - aggressive - other, abs=1e-6)
    assert est.exploitability == kuhn_exploitability(est.aggression)  # the policy is what gets scored
