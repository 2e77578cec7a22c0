"""Bootstrap by imitation: teach a random tiny model the answer format before RL.

A randomly initialised model never writes `\\boxed{...}`, so every game would end at its first
(invalid) move and RL would have nothing to learn from. This stage plays games in which both seats
follow a teacher (with probability `explore` a random legal move instead, to visit varied positions)
and trains on the teacher's moves written as `\\boxed{move}` + end of turn: plain maximum likelihood,
i.e. the policy-gradient step with advantage 1. Real checkpoints skip it.

Teachers:

* "random": a uniformly random legal move. It carries no strategy, so whatever the model plays
  better than chance afterwards was learned by RL. This is the format-only start of the tiny configs.
* "scripted": the game's scripted player, made deterministic where it would choose at random among
  equally good moves (for TicTacToe, minimax with ties going to the centre, then corners, then
  edges). This is imitation of a strategic teacher: results after it are not self-play RL's.
"""
from __future__ import annotations

import hashlib

import numpy as np

from spiral_jax.envs import RandomOpponent, TicTacToeMinimax, extract_action, make, scripted_opponent
from spiral_jax.rl.samples import TurnSample


def boxed(action: str) -> str:
    """The shortest response the trainer-side rules read back as `action`."""
    text = f"\\boxed{{{action[1:-1]}}}" if action.startswith("[") and action.endswith("]") else action
    return text if extract_action(text) == action else action


CENTRE_CORNERS_EDGES = (4, 0, 2, 6, 8, 1, 3, 5, 7)


def imitation_teacher(env_id: str, seed: int):
    """The scripted player to imitate: deterministic where the game's own script breaks ties at random."""
    if env_id == "TicTacToe-v0":
        return TicTacToeMinimax(seed, prefer=CENTRE_CORNERS_EDGES)
    return scripted_opponent(env_id, seed)


# The bootstrap's teachers (config `bootstrap.teacher`), each with what its imitation teaches.
TEACHERS = {"random": "uniformly random legal moves (the answer format, no strategy)",
            "hashed": "a random move distribution fixed per observation (no strategy)",
            "legal": "any legal move, the model's own choice (the answer format, no strategy)",
            "scripted": "the scripted players (imitation of a strategic teacher)"}
TARGETS = ("sampled", "distribution")


def check_teacher(teacher: str, targets: str) -> None:
    """A teacher and a kind of targets that go together (config `bootstrap.teacher` / `.targets`)."""
    if teacher not in TEACHERS:
        raise ValueError(f"bootstrap.teacher={teacher!r}; use one of {', '.join(TEACHERS)}")
    if targets not in TARGETS:
        raise ValueError(f"bootstrap.targets={targets!r}; use one of {', '.join(TARGETS)}")
    if targets == "distribution" and teacher not in ("random", "hashed"):
        raise ValueError(f"bootstrap.targets='distribution' needs a random or hashed teacher (one with a move "
                         f"distribution), not {teacher!r}; use bootstrap.targets='sampled'")


class HashedRandomPlayer:
    """A random legal move from a distribution fixed per observation: Dirichlet(1) weights over the
    legal moves, seeded by a hash of (seed, observation text), mixed with `uniform` of uniform play.

    Over observations its preferences are as strategy-free as uniform play (they are pseudo-random
    functions of the text, not of the game's value), but unlike uniform play they depend on the whole
    observation, so a model imitating it has to read the state (the card, the board) and not only the
    list of legal moves. The uniform share keeps every legal move likely enough for RL to explore;
    too much of it and the per-observation differences are too small to make the model read the state.
    """

    def __init__(self, seed: int, play_seed: int | None = None, uniform: float = 0.2):
        self._seed, self._uniform = seed, uniform
        self._rng = np.random.default_rng(play_seed)

    def distribution(self, env) -> np.ndarray:
        text = f"{self._seed}\n{env.observation(env.current_player())}".encode()
        key = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")
        n = len(env.legal_actions())
        return self._uniform / n + (1 - self._uniform) * np.random.default_rng(key).dirichlet(np.ones(n))

    def act(self, env) -> str:
        legal = env.legal_actions()
        return legal[int(self._rng.choice(len(legal), p=self.distribution(env)))]


def _teacher_turns(env_ids, weights, rng: np.random.Generator, explore: float, teacher: str, hash_seed: int,
                   hash_uniform: float):
    """Endless (env id, env, turn, action, demonstrator): each teacher move of freshly played games,
    yielded before it is played (the env shows the state the move is chosen in)."""
    p = np.asarray(weights, float) / np.sum(weights)
    while True:
        env_id = env_ids[rng.choice(len(env_ids), p=p)]
        env = make(env_id)
        env.reset(int(rng.integers(1 << 31)))
        teacher_seed, explorer = int(rng.integers(1 << 31)), RandomOpponent(int(rng.integers(1 << 31)))
        demonstrator = (imitation_teacher(env_id, teacher_seed) if teacher == "scripted" else
                        HashedRandomPlayer(hash_seed, teacher_seed, hash_uniform) if teacher == "hashed" else explorer)
        turn = 0
        while not env.done:
            if rng.random() < explore:
                env.step(explorer.act(env))
            else:
                action = demonstrator.act(env)
                yield env_id, env, turn, action, demonstrator
                env.step(action)
            turn += 1


def imitation_samples(env_ids, weights, tokenizer, n: int, seed: int, explore: float,
                      teacher: str = "random", score=None, hash_seed: int = 0,
                      hash_uniform: float = 0.2, targets: str = "sampled") -> list[TurnSample]:
    """Imitation samples (advantage = target weight) from `n` teacher turns of freshly played games.

    targets="sampled": one sample per turn, the teacher's move, with weight 1. targets="distribution"
    (random and hashed teachers): one sample per legal answer, weighted by the teacher's probability
    of it. Both have the same expected gradient, the cross-entropy to the teacher's move distribution;
    the second without the sampling noise, and with every legal move pushed up at every turn, which
    teaches legality in fewer turns (at about as many samples per turn as there are legal moves).
    "legal" gives one sample per legal answer, weighted by the model's own probability of that
    answer among the legal ones (`score(pairs)` -> log p(answer | prompt) per (prompt, answer) pair):
    the gradient of log P(some legal answer), which teaches the format and legality while leaving
    the model's preferences among legal moves, and what it reads from the prompt, to RL.
    """
    check_teacher(teacher, targets)
    if teacher == "legal" and score is None:
        raise ValueError("the 'legal' teacher weighs answers by the model's probabilities: pass score")
    rng = np.random.default_rng(seed)
    eos = tokenizer.end_of_turn_id
    samples: list[TurnSample] = []
    every_move = teacher == "legal" or targets == "distribution"
    turns = _teacher_turns(env_ids, weights, rng, explore, teacher, hash_seed, hash_uniform)
    for _, (env_id, env, turn, action, demonstrator) in zip(range(n), turns):
        player = env.current_player()
        prompt = tokenizer.prompt_ids(env.observation(player))
        moves = env.legal_actions() if every_move else [action]
        answers = [tokenizer.encode(boxed(m)) + [eos] for m in moves]
        if teacher == "legal":
            logp = np.asarray(score([(prompt, r) for r in answers]), np.float64)
            weight = np.exp(logp - logp.max())
            weight /= weight.sum()
        elif every_move:
            weight = (demonstrator.distribution(env) if teacher == "hashed" else
                      np.full(len(moves), 1.0 / len(moves)))
        else:
            weight = np.ones(1)
        samples += [TurnSample(prompt, r, np.zeros(len(r), np.float32), env_id, player, turn, advantage=float(w))
                    for r, w in zip(answers, weight)]
    return samples
