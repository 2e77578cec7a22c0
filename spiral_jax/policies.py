"""The names a player goes by in configs and on the command line, parsed in one place.

A seat is played by one of:
  "model"               the policy being trained (or evaluated)
  "self"                the evaluated model in the opponent's seat too (evaluation only)
  "random", "scripted"  a game-side player: a uniformly random legal move, or the game's script
  "pool/STEP"           a frozen snapshot of the trained model at STEP (pool mode)
  "openai:MODEL@URL"    a model behind an OpenAI-compatible endpoint (api_player.ApiPlayer)
  anything else         a Hugging Face checkpoint folder, optionally written NAME=PATH

Game-side and API players are not sampled by the LLM; the others are weights the sampler plays.
"""
from __future__ import annotations

import dataclasses

SCRIPTED = ("random", "scripted")
API_PREFIX = "openai:"
KINDS = ("model", "self", "scripted", "pool", "api", "checkpoint")
# Opponents with no weights for an evaluation to load: game-side players, the evaluated model, an API.
WEIGHTLESS = ("scripted", "self", "api")


@dataclasses.dataclass(frozen=True)
class PolicySpec:
    """One parsed player name: its `kind` (one of KINDS) and the text it was written as."""
    name: str
    kind: str

    @classmethod
    def parse(cls, name: str) -> "PolicySpec":
        if not isinstance(name, str) or not name:
            raise ValueError(f"player {name!r}: give random, scripted, self, openai:MODEL@URL or a model folder")
        if name in ("model", "self"):
            return cls(name, name)
        if name in SCRIPTED:
            return cls(name, "scripted")
        if name.startswith("pool/"):
            return cls(name, "pool")
        if name.startswith(API_PREFIX):
            return cls(name, "api")
        return cls(name, "checkpoint")

    @property
    def sampled(self) -> bool:
        """Whether the LLM sampler plays this seat (weights), rather than the game or an API."""
        return self.kind not in ("scripted", "api")


def kind(name: str) -> str:
    """The kind of player `name` is (PolicySpec.parse(name).kind)."""
    return PolicySpec.parse(name).kind
