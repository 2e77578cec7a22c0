"""`SamplingParams`: how a decode program samples, checked where a caller builds them."""
from __future__ import annotations

import dataclasses

import numpy as np

_MAX_STOP_IDS = 8
# Below this temperature, float32 logits divided by it lose their precision or overflow to inf (NaN
# probabilities); the argmax (greedy=True) is what such a temperature asks for.
MIN_TEMPERATURE = 1e-5


def _scalar(name: str, value, kinds: str, what: str):
    """`value` if it is a scalar of one of the numpy dtype `kinds`, else a TypeError: int() and float()
    would silently take a float's whole part, a string's digits or a bool as 1."""
    if isinstance(value, (str, bytes)) or np.ndim(value) != 0 or np.asarray(value).dtype.kind not in kinds:
        raise TypeError(f"{name} must be {what}, got {value!r} ({type(value).__name__})")
    return value


def _integer(name: str, value) -> int:
    return int(_scalar(name, value, "iu", "an int"))


def _real(name: str, value) -> float:
    return float(_scalar(name, value, "iuf", "a number"))


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample. top_k=0 and top_p=1.0 mean no truncation."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False
    stop_token_ids: frozenset[int] = frozenset()

    def __post_init__(self):
        if isinstance(self.stop_token_ids, (str, bytes)) or not hasattr(self.stop_token_ids, "__iter__"):
            raise TypeError(f"stop_token_ids must be a collection of token ids, got {self.stop_token_ids!r}; "
                            f"wrap one id in a set: {{id}}")
        stop = frozenset(_integer("a stop token id", t) for t in self.stop_token_ids)
        object.__setattr__(self, "stop_token_ids", stop)
        object.__setattr__(self, "greedy", bool(_scalar("greedy", self.greedy, "b", "True or False")))
        object.__setattr__(self, "max_new_tokens", _integer("max_new_tokens", self.max_new_tokens))
        object.__setattr__(self, "temperature", _real("temperature", self.temperature))
        object.__setattr__(self, "top_p", _real("top_p", self.top_p))
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        # The programs take the temperature as a float32, where one past its range is inf.
        if not self.greedy and not MIN_TEMPERATURE <= self.temperature <= float(np.finfo(np.float32).max):
            raise ValueError(f"temperature must be at least {MIN_TEMPERATURE} (use greedy=True for argmax) "
                             f"and finite in float32, got {self.temperature}")
        if not (np.float32(self.top_p) > 0 and self.top_p <= 1):  # the programs take it as a float32
            raise ValueError(f"top_p must be in (0, 1] and not round to 0 in float32, got {self.top_p}")
        if _integer("top_k", self.top_k) < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        # The programs take top_k as an int32; a cut past the vocabulary keeps all of it either way.
        object.__setattr__(self, "top_k", min(int(self.top_k), np.iinfo(np.int32).max))
        if len(stop) > _MAX_STOP_IDS:
            raise ValueError(f"at most {_MAX_STOP_IDS} stop token ids, got {len(stop)}")
        for t in stop:
            if not 0 <= t <= np.iinfo(np.int32).max:
                raise ValueError(f"stop token id {t} is no token id (outside [0, 2**31)); check the tokenizer's "
                                 f"eos id")

    @property
    def mode(self) -> str:
        """The sampling program these parameters need (`sampling.logits.MODES`): "greedy" (argmax),
        "plain" (the raw distribution: temperature 1, no truncation), "tempered" (temperature only) or
        "truncated" (top-k or top-p cuts the tempered distribution)."""
        if self.greedy:
            return "greedy"
        if self.top_k > 0 or self.top_p < 1.0:
            return "truncated"
        return "plain" if self.temperature == 1.0 else "tempered"

    def stop_array(self) -> np.ndarray:
        """The stop ids as the compiled programs take them: a fixed-size int32 array, -1 padded."""
        stop = np.full((_MAX_STOP_IDS,), -1, np.int32)
        stop[:len(self.stop_token_ids)] = sorted(self.stop_token_ids)
        return stop
