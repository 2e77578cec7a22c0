"""The static sizes decode programs compile for: bucketed lengths and row counts, cache slots, and the
attention windows of the sampler's decode stages and of a decode engine's calls. Every shape is
one of a few per doubling, so programs compile once per bucket and are reused."""
from __future__ import annotations

# Decode stages (see attention_windows): the factor each window grows by over the one before.
_WINDOW_GROWTH = 4
# The most prompts a decode engine's insert prefills at once; more wait for the next insert. Its
# transients grow with its rows (each layer gathers their windows of the cache to attend over, and
# holds their activations), while 8 prompts of a few hundred tokens are already enough rows for its
# products to be compute-bound.
INSERT_ROWS = 8


def bucket_length(n: int, min_length: int = 16, per_octave: int = 1) -> int:
    """The static size that n rounds up to: the shapes everything compiles for.

    per_octave=1: the smallest power of two >= max(n, min_length). per_octave=k: the octave above the
    previous power of two is split into k equal steps (k=4: ..., 64, 80, 96, 112, 128, 160, ...), so at
    most k shapes per doubling and at most 1/k of padding instead of up to 1/2.
    """
    n = max(n, min_length)
    top = 1 << (n - 1).bit_length()
    step = max(top // (2 * per_octave), 1)
    return -(-n // step) * step


def cache_slots(prompt_bucket: int, max_new_tokens: int) -> int:
    """KV-cache slots of one generate call: the prompt bucket plus the power-of-two new-token bucket."""
    return prompt_bucket + bucket_length(max_new_tokens, 1)


def batch_bucket(rows: int, shards: int) -> int:
    """Rows of one generate call: a power of two of at least `shards`, rounded up to a multiple of it."""
    batch = bucket_length(rows, shards)
    return -(-batch // shards) * shards


def attention_windows(prompt_bucket: int, slots: int, first: int = 256) -> list[int]:
    """Cache slots each decode stage attends over, in order; the last is the whole cache.

    Decode step s attends over slots [0, prompt_bucket + s); a stage of window w runs the steps with
    prompt_bucket + s <= w. Reading the unfilled rest of the cache would cost memory traffic only: for
    Qwen3-0.6B at 64 rows the keys and values of a 6k-slot cache are 45 GB a step against 1.2 GB of
    bf16 weights. Budgets up to `first` new tokens run as a single stage; each further stage compiles
    one more copy of the decode step.
    """
    windows, new = [], first
    while prompt_bucket + new < slots:
        windows.append(prompt_bucket + new)
        new *= _WINDOW_GROWTH
    return windows + [slots]


def engine_windows(cache_len: int) -> list[int]:
    """The attention windows of an engine's programs over a cache of `cache_len` slots: 64 and up, two
    sizes per doubling, and the whole cache. A call takes the smallest that holds its rows' tokens."""
    return sorted({min(bucket_length(n, 64, per_octave=2), cache_len) for n in range(64, cache_len + 1, 16)}
                  | {cache_len})


def halvings(bucket: int, min_length: int) -> list[int]:
    """`bucket` (a `bucket_length`) and the smaller buckets of at least `min_length` below it, largest first."""
    out = [bucket]
    while bucket_length(out[-1] // 2, min_length) == out[-1] // 2:
        out.append(out[-1] // 2)
    return out


def insert_rows(prompts: int) -> int:
    """Rows of a decode engine's insert of `prompts` prompts (at most INSERT_ROWS): a power of two."""
    return bucket_length(min(prompts, INSERT_ROWS), 1)
