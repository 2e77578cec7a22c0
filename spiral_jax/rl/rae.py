"""Role-conditioned advantage estimation (RAE): one moving-average baseline per (game, role).

In self-play a zero-sum game's two seats can have very different expected returns (first-mover
advantage, information asymmetry), so one shared baseline would leave a constant bias in each seat's
advantage. RAE keeps an exponential moving average of the reward per (game, role), initialised at 0.
For each finished game and role the baseline b is *read first*, then updated with the game's reward R
(b <- decay * b + (1 - decay) * R), and every turn of that role gets the advantage R - b (the value
read before the update). Switching RAE off (the paper's ablation) uses baseline 0: advantage = R.

Memory: the reference runs 8 actors, each with its own baselines and about 2 games a step, so each
moving average spans roughly 10 steps of games. One set of baselines updated by every game of a
64-game round would forget within one step, and its memory would change with the batch size.
`games_per_shard` reproduces the reference: the games of a batch are dealt, in order, to shards of
that many games, each shard with its own baselines (shard k of every batch shares them: a step that
plays a second batch to gather its samples gives each shard more games, as a longer step gives each
of the reference's actors more).

The state is a plain nested dict of floats, {"baselines": {game_id: {role: b}}} (roles as strings),
which orbax checkpoints as it is. Pure Python: no JAX needed.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from spiral_jax.rl.samples import TurnSample
from spiral_jax.rollout import PlayedGame


@dataclasses.dataclass(frozen=True)
class RAEConfig:
    decay: float = 0.95
    enabled: bool = True  # False: baseline 0 (the paper's "no RAE" ablation)
    drop_zero: bool = True  # drop samples whose advantage is exactly 0 (they carry no gradient)
    games_per_shard: int = 0  # >0: game i of a batch uses the baselines of shard i // games_per_shard

    def key(self, game_id: str, index: int) -> str:
        """Where the baselines of a batch's `index`-th game live."""
        return f"{game_id}@{index // self.games_per_shard}" if self.games_per_shard > 0 else game_id


def init_rae_state() -> dict:
    return {"baselines": {}}


def baseline(state: dict, game_id: str, role) -> float:
    return float(state["baselines"].get(game_id, {}).get(str(role), 0.0))


def assign_advantages(state: dict, game_id: str, rewards_by_role: Mapping, cfg: RAEConfig = RAEConfig()
                      ) -> tuple[dict, dict]:
    """Advantages {role: R - b} for one finished game, and the state with each role's baseline updated.

    game_id: the key of the baselines (a game id, or `RAEConfig.key` of one for sharded baselines).
    The input state is not modified. Games that finish in the same step must be passed one by one in
    a fixed order: each sees the baselines left by the previous one.
    """
    if not cfg.enabled:
        return {role: float(r) for role, r in rewards_by_role.items()}, state
    game = dict(state["baselines"].get(game_id, {}))
    advantages = {}
    for role, reward in rewards_by_role.items():
        b = float(game.get(str(role), 0.0))
        advantages[role] = float(reward) - b
        game[str(role)] = cfg.decay * b + (1.0 - cfg.decay) * float(reward)
    return advantages, {**state, "baselines": {**state["baselines"], game_id: game}}


def label_game(state: dict, game_id: str, samples: Sequence[TurnSample], rewards_by_role: Mapping,
               cfg: RAEConfig = RAEConfig(), index: int = 0) -> tuple[list[TurnSample], dict]:
    """Give every turn of one finished game its role's advantage (dropping zeros if configured).

    rewards_by_role: the final reward of every role whose baseline this game updates (normally both
    seats in self-play; only the trained seat against a fixed opponent). index: the game's place
    in its batch of games (picks its baseline shard).
    """
    for s in samples:
        if s.game_id != game_id or s.role not in rewards_by_role:
            raise ValueError(f"turn {s.turn} (game {s.game_id!r}, role {s.role!r}) does not belong to "
                             f"game {game_id!r} with rewarded roles {list(rewards_by_role)}")
    advantages, state = assign_advantages(state, cfg.key(game_id, index), rewards_by_role, cfg)
    labelled = [dataclasses.replace(s, advantage=advantages[s.role]) for s in samples]
    if cfg.drop_zero:
        labelled = [s for s in labelled if s.advantage != 0.0]
    return labelled, state


def baseline_metrics(state: dict) -> dict[str, float]:
    """Flat {"rae/baseline/<game>/<role>": b} for logging (sharded baselines: the mean over shards)."""
    values: dict[str, list[float]] = {}
    for key, roles in state["baselines"].items():
        game = key.rsplit("@", 1)[0]
        for role, b in roles.items():
            values.setdefault(f"rae/baseline/{game}/{role}", []).append(float(b))
    return {name: sum(v) / len(v) for name, v in sorted(values.items())}


def label_games(games: Sequence[PlayedGame], rae_state: dict, rae: RAEConfig, trained: str = "model"
                ) -> tuple[list[TurnSample], dict]:
    """Turn samples (with RAE advantages) from the `trained` policy's turns of one batch of games, in
    order (a game's place in the batch picks its RAE baseline shard)."""
    samples: list[TurnSample] = []
    for index, game in enumerate(games):
        rec = game.record
        roles = {p: rec.rewards[p] for p in (0, 1) if game.seats[p] == trained}
        if not roles:
            continue
        mine = [TurnSample(t.prompt_ids, t.response_ids, t.logprobs, rec.env_id, t.player, i)
                for i, t in enumerate(game.model_turns) if t.policy == trained and t.response_ids]
        labelled, rae_state = label_game(rae_state, rec.env_id, mine, roles, rae, index)
        samples += labelled
    return samples, rae_state
