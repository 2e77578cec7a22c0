"""Math and general-reasoning benchmarks from local JSONL files: prompt, sample k, grade, report.

Items: one JSON object a line (UTF-8), `{"problem": ..., "answer": ...}` for math (`question` is
accepted for `problem`; the answer a string or a number, or a list of them read as "a, b") or
`{"question": ..., "choices": [...], "answer": "B" | 1}` for multiple choice (the answer the letter or
the index of a choice); an optional unique `id` (default: the item's position) and `solution`.
Every item is asked zero-shot ("Question: ..." then our reason-and-box instruction) or after a few
worked examples, inside the model's own chat template.  k samples per item; the report gives
pass@1 from the FIRST sample (the reference's number) and the mean accuracy over all k samples,
labelled as such, with the settings that produced them (the reference's scores move a lot with the
prompt).  Every item's responses and grades are saved.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

import numpy as np
from tqdm import tqdm

from spiral_jax.eval.games import wilson_interval
from spiral_jax.eval.hub import _unwrap_dollars, answer_text
from spiral_jax.eval.math_grader import grade_choice, judge, last_boxed, math_verify_available
from spiral_jax.paths import file_in, run_path

# name -> kind; all read from local JSONL here.
BENCHMARKS = {"MATH500": "math", "AIME24": "math", "AIME25": "math", "OlympiadBench": "math",
              "AMC-23": "math", "Minerva-Math": "math", "GPQA-diamond": "choice", "MMLU-Pro": "choice"}
MATH_INSTRUCTION = "Think it through step by step, then write the final answer inside \\boxed{}."
CHOICE_INSTRUCTION = ("Think it through step by step, then write the letter of the correct choice "
                      "inside \\boxed{}, e.g. \\boxed{A}.")
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclasses.dataclass(frozen=True)
class Item:
    id: str
    problem: str
    answer: str
    choices: tuple[str, ...] = ()
    solution: str = ""  # a worked solution, used when the item is a few-shot example

    @property
    def kind(self) -> str:
        return "choice" if self.choices else "math"


def _math_answer(answer, where: str) -> str:
    """A math item's gold answer as text: a non-empty string or a number, or a list of them joined with
    ", " as `hub` writes OlympiadBench's multi-part answers."""
    parts = answer if isinstance(answer, list) else [answer]
    if not parts or not all(isinstance(a, (str, int)) and not isinstance(a, bool)
                            or isinstance(a, float) and math.isfinite(a) for a in parts):
        raise ValueError(f"{where}: 'answer' must be a non-empty string or a finite number (or a list of them), "
                         f"not {answer!r}")
    text = (", ".join(a for a in (_unwrap_dollars(answer_text(p)) for p in parts) if a)
            if isinstance(answer, list) else answer_text(answer))
    if not text:
        raise ValueError(f"{where}: 'answer' is empty; give the reference answer")
    return text


def _choice_answer(choices, answer, where: str) -> tuple[tuple[str, ...], str]:
    """A multiple-choice item's choices and its answer as a letter, from an index or a letter in range."""
    if not (isinstance(choices, list) and 0 < len(choices) <= len(LETTERS)
            and all(isinstance(c, (str, int, float)) and not isinstance(c, bool) for c in choices)):
        raise ValueError(f"{where}: 'choices' must be a list of 1 to {len(LETTERS)} choices "
                         f"(strings or numbers), not {choices!r}")
    letters = LETTERS[:len(choices)]
    if isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(choices):
        return tuple(str(c) for c in choices), letters[answer]
    if isinstance(answer, str) and answer.strip() and answer.strip().upper() in letters:
        return tuple(str(c) for c in choices), answer.strip().upper()
    raise ValueError(f"{where}: 'answer' must be the index (0 to {len(choices) - 1}) or the letter "
                     f"(A to {letters[-1]}) of the correct choice, not {answer!r}")


def load_items(path, limit: int | None = None) -> list[Item]:
    """Read benchmark items from a JSONL file, local or gs:// (see the module docstring for the fields);
    a malformed line, a bad answer, a repeated id or a file without items raises ValueError naming the
    file (and the line)."""
    items, lines = [], {}
    if run_path(path).is_dir():
        raise ValueError(f"{path}: a folder, not a JSONL file; give the file of items in it")
    try:
        text = run_path(path).read_bytes().decode("utf-8-sig")  # epath's read_text ignores its encoding
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e}); save it as UTF-8") from None
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except ValueError as e:  # a JSONDecodeError, or an integer past Python's 4,300 digits
            raise ValueError(f"{where}: not valid JSON ({e}); write one JSON object a line (a number "
                             "that long as a string)") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object with 'problem' and 'answer', "
                             f"got a {type(row).__name__}")
        problem = row.get("problem", row.get("question"))
        if problem is None or "answer" not in row:
            raise ValueError(f"{where}: need 'problem' (or 'question') and 'answer'")
        if not isinstance(problem, str) or not problem.strip():
            raise ValueError(f"{where}: 'problem' (or 'question') must be a non-empty string")
        if "choices" in row:
            choices, answer = _choice_answer(row["choices"], row["answer"], where)
        else:
            choices, answer = (), _math_answer(row["answer"], where)
        item_id = str(row.get("id", len(items)))
        if item_id in lines:
            raise ValueError(f"{where}: id {item_id!r} is already used on line {lines[item_id]}; "
                             "give every item its own id")
        lines[item_id] = n
        solution = row.get("solution") or ""
        if not isinstance(solution, str):
            raise ValueError(f"{where}: 'solution' must be a string (the worked solution), not {solution!r}")
        items.append(Item(item_id, problem, answer, choices, solution))
        if limit is not None and len(items) == limit:
            break
    if not items:
        raise ValueError(f"{path}: no items (an empty file?); write one JSON object a line")
    return items


def question_text(item: Item, instruction_first: bool = False) -> str:
    """The question with its choices and the instruction (our wording), after the question or, as the
    reference asks, before it."""
    text = f"Question: {item.problem}"
    if item.choices:
        text += "\n" + "\n".join(f"({LETTERS[i]}) {c}" for i, c in enumerate(item.choices))
    instruction = CHOICE_INSTRUCTION if item.choices else MATH_INSTRUCTION
    return f"{instruction}\n\n{text}" if instruction_first else f"{text}\n\n{instruction}"


def prompt_text(item: Item, shots: Sequence[Item] = (), instruction_first: bool = False) -> str:
    """Zero-shot, or `shots` worked examples first (their solution, plus the boxed answer when the
    solution has no box)."""
    def worked(s: Item) -> str:
        answer = s.solution if "\\boxed" in s.solution else f"{s.solution} The answer is \\boxed{{{s.answer}}}."
        return f"{question_text(s, instruction_first)}\nAnswer: {answer.strip()}"
    return "\n\n".join([worked(s) for s in shots] + [question_text(item, instruction_first)])


def local_files(specs: Sequence[str]) -> dict[str, str]:
    """{name: path} from "NAME=items.jsonl" or "items.jsonl" (named after the file; a local path or
    gs://, as opposed to a benchmark downloaded from the hub), each checked to exist and every name to
    be given once (one benchmark's results would replace another's), so a typo fails before any model
    runs."""
    files = {}
    for spec in specs:
        name, _, path = spec.partition("=")
        name, path = (name, path) if path else (Path(spec).stem, spec)
        if run_path(path).is_dir():
            raise FileNotFoundError(f"benchmark {spec!r}: {path} is a folder; give the JSONL file of items in it")
        if not run_path(path).is_file():
            raise FileNotFoundError(f"benchmark {spec!r}: no such file {path} (give NAME=items.jsonl)")
        if not name or name in files:
            raise ValueError(f"benchmark {spec!r}: " + (f"the name {name!r} is given twice" if name else "no name")
                             + "; give every benchmark its own NAME=items.jsonl")
        files[name] = path
    return files


class Response(NamedTuple):
    text: str
    tokens: int = 0
    finish_reason: str = "stop"  # "stop", "length" or "prompt_too_long"


# generate(prompt texts, k) -> k responses (Response or plain str) per prompt.
GenerateFn = Callable[[Sequence[str], int], Sequence[Sequence[Response | str]]]


@dataclasses.dataclass
class BenchmarkResult:
    name: str
    items: int
    samples_per_item: int
    pass_at_1: float        # accuracy of the first sample of each item
    pass_at_1_ci: tuple[float, float]
    mean_accuracy: float    # accuracy over all k samples of all items
    boxed_rate: float       # share of samples with a gradable answer
    mean_response_tokens: float
    truncated_rate: float
    settings: dict

    def scalars(self, prefix: str = "bench") -> dict[str, float]:
        p = f"{prefix}/{self.name}"
        return {f"{p}/pass@1_first_sample": self.pass_at_1,
                f"{p}/mean_accuracy_over_{self.samples_per_item}_samples": self.mean_accuracy,
                f"{p}/boxed_rate": self.boxed_rate, f"{p}/response_tokens": self.mean_response_tokens,
                f"{p}/truncated_rate": self.truncated_rate}


def grade(item: Item, response: str, timeout: float) -> tuple[str | None, bool, str]:
    """(the extracted answer or None, whether it is correct, the grader that decided)."""
    if item.choices:
        return (*grade_choice(response, item.answer), "choice letter")
    pred = last_boxed(response)
    if pred is None:
        return None, False, "no box"
    return (pred, *judge(pred, item.answer, timeout))


def run_benchmark(name: str, items: Sequence[Item], generate: GenerateFn, k: int, out_dir,
                  shots: Sequence[Item] = (), settings: dict | None = None, timeout: float = 5.0,
                  instruction_first: bool = False) -> BenchmarkResult:
    """Ask every item k times, grade, save `<name>.items.jsonl`, and return the summary."""
    if k < 1 or not items:
        raise ValueError(f"need k >= 1 and at least one item (k={k}, {len(items)} items)")
    prompts = [prompt_text(item, shots, instruction_first) for item in items]
    start = time.perf_counter()
    outputs = generate(prompts, k)
    seconds = time.perf_counter() - start
    if len(outputs) != len(items):  # zip would grade the first items only, under the count of all
        raise ValueError(f"{name}: generate gave responses for {len(outputs)} prompts, expected {len(items)}")
    out_dir = run_path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    first, every, boxed, tokens, cut = [], [], [], [], []
    with file_in(out_dir, name, ".items.jsonl").open("w") as f:
        for item, prompt, responses in zip(items, prompts, outputs):
            responses = [r if isinstance(r, Response) else Response(str(r)) for r in responses]
            if len(responses) != k:
                raise ValueError(f"item {item.id}: {len(responses)} responses, expected {k}")
            graded = [grade(item, r.text, timeout) for r in responses]
            first.append(graded[0][1])
            every += [ok for _, ok, _ in graded]
            boxed += [pred is not None for pred, _, _ in graded]
            tokens += [r.tokens for r in responses]
            cut += [r.finish_reason == "length" for r in responses]
            f.write(json.dumps({"id": item.id, "prompt": prompt, "answer": item.answer,
                                "responses": [r.text for r in responses],
                                "finish_reasons": [r.finish_reason for r in responses],
                                "extracted": [p for p, _, _ in graded], "correct": [ok for _, ok, _ in graded],
                                "graded_by": [g for _, _, g in graded], "first_correct": graded[0][1],
                                "mean_correct": float(np.mean([ok for _, ok, _ in graded]))}) + "\n")
    settings = {"k": k, "prompt": f"{len(shots)}-shot" if shots else "zero-shot",
                "instruction": "before the question" if instruction_first else "after the question",
                "grader": "math-verify, the normaliser where it cannot parse" if math_verify_available()
                else "the normaliser only (math-verify not installed)",
                "grader_timeout_s": timeout, "seconds": seconds, **(settings or {})}
    return BenchmarkResult(name, len(items), k, float(np.mean(first)), wilson_interval(sum(first), len(first)),
                           float(np.mean(every)), float(np.mean(boxed)), float(np.mean(tokens)),
                           float(np.mean(cut)), settings)


def model_generate_fn(sampler, tokenizer, params, sampling, seed: int = 0, batch_size: int = 64
                      ) -> GenerateFn:
    """k samples per prompt from an LLM, in the tokenizer's chat template without the game wording.

    Prompts longer than the sampler allows get an empty response ("prompt_too_long", graded wrong
    and counted), never an exception.
    """
    sp = dataclasses.replace(sampling, stop_token_ids=tokenizer.stop_ids)

    def generate(prompts: Sequence[str], k: int) -> list[list[Response]]:
        rows = [(i, tokenizer.chat_prompt_ids([{"role": "user", "content": p}])) for i, p in enumerate(prompts)]
        rows = [(i, ids) for i, ids in rows for _ in range(k)]
        out: list[list[Response]] = [[] for _ in prompts]
        live = []
        for r, (i, ids) in enumerate(rows):
            if len(ids) > sampler.max_prompt_len:
                out[i].append(Response("", 0, "prompt_too_long"))
            else:
                live.append((r, i, ids))
        for b in tqdm(range(0, len(live), batch_size), desc="bench", unit="batch", dynamic_ncols=True,
                      leave=False):
            chunk = live[b:b + batch_size]
            res = sampler.generate(params, [ids for _, _, ids in chunk], sp, seed=seed,
                                   row_ids=[r for r, _, _ in chunk])
            for (_, i, _), toks, reason in zip(chunk, res.tokens, res.finish_reasons):
                out[i].append(Response(tokenizer.decode(toks), len(toks), reason))
        return out
    return generate


def markdown(results: Sequence[BenchmarkResult]) -> str:
    """One row per benchmark; the two accuracies are labelled by how they were computed."""
    if not results:
        return ""
    k = sorted({r.samples_per_item for r in results})
    lines = [f"| benchmark | items | pass@1 (first sample) [95% CI] | mean accuracy over k={'/'.join(map(str, k))} "
             "samples | boxed | truncated |", "|---|---|---|---|---|---|"]
    for r in results:
        lo, hi = r.pass_at_1_ci
        lines.append(f"| {r.name} | {r.items} | {100 * r.pass_at_1:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}] | "
                     f"{100 * r.mean_accuracy:.1f}% | {100 * r.boxed_rate:.1f}% | {100 * r.truncated_rate:.1f}% |")
    s = results[0].settings
    shown = {key: s[key] for key in s if key != "seconds"}
    return "\n".join(lines) + f"\n\nSettings: {json.dumps(shown)}\n"


def write_results(results: Sequence[BenchmarkResult], out_dir, writer=None, step: int = 0,
                  prefix: str = "bench") -> Path:
    """results.json and results.md in `out_dir`; scalars (under `prefix`) to a `MetricsWriter` when given."""
    out_dir = run_path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1))
    (out_dir / "results.md").write_text(markdown(results))
    if writer is not None:
        for r in results:
            writer.scalars(step, r.scalars(prefix))
        writer.flush()
    return out_dir / "results.json"
