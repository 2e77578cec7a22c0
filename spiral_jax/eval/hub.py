"""Benchmark items from the Hugging Face hub (online machines, optional `datasets` package), written
once as the local JSONL files `benchmarks.load_items` reads, so runs never depend on the network.

Each benchmark names its dataset, config, split and how a row becomes our item; the GPQA choices are
shuffled with a fixed seed per item (the dataset lists the correct answer first).
"""
from __future__ import annotations

import json
import numbers
import random
from pathlib import Path
from typing import Callable, NamedTuple


def answer_text(value) -> str:
    """A gold answer as text: integral numbers without a trailing ".0" (AMC's 27.0 -> "27"), other
    numbers as the shortest text of their own precision (a float32 column's 0.1 is "0.1", not the
    float64 expansion 0.10000000149011612), strings stripped."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return str(int(value)) if float(value).is_integer() else str(value)
    return str(value).strip()


def _unwrap_dollars(s: str) -> str:
    s = s.strip()
    while len(s) >= 2 and s.startswith("$") and s.endswith("$"):
        s = s[1:-1].strip()
    return s


def _problem(row: dict, problem: str = "problem", answer: str = "answer") -> dict:
    return {"problem": str(row[problem]), "answer": answer_text(row[answer])}


def _olympiad(row: dict) -> dict:
    answer = row["final_answer"]
    parts = answer if isinstance(answer, (list, tuple)) else [answer]
    gold = ", ".join(a for a in (_unwrap_dollars(answer_text(p)) for p in parts) if a)
    context = str(row.get("context") or "").strip()
    question = str(row["question"])
    return {"problem": f"{context}\n{question}" if context else question, "answer": gold}


def _gpqa(row: dict, seed: int) -> dict:
    def text(key: str) -> str:
        return str(row[key] or "").strip()

    choices = [text("Correct Answer")] + [text(f"Incorrect Answer {i}") for i in (1, 2, 3)]
    order = list(range(4))
    random.Random(f"{seed}:{row['Question']}").shuffle(order)
    return {"question": text("Question"), "choices": [choices[i] for i in order], "answer": order.index(0)}


def _mmlu_pro(row: dict) -> dict:
    correct = int(row["answer_index"])
    kept = [(i, str(o)) for i, o in enumerate(row["options"]) if i == correct or str(o).strip() != "N/A"]
    return {"question": str(row["question"]), "choices": [o for _, o in kept],
            "answer": [i for i, _ in kept].index(correct)}


class HubSource(NamedTuple):
    repo: str
    config: str | None
    split: str
    convert: Callable[[dict], dict]


# Where each schema (repo, config, split, columns, value types) was checked:
# - MATH500: HF card and eval.yaml of HuggingFaceH4/MATH-500 (test.jsonl; problem, answer: str).
# - AIME24: HF card of HuggingFaceH4/aime_2024 (split train; problem, answer: string).
# - AIME25: HF file list of math-ai/aime25 (test.jsonl); Jellyfish042/rwkv_mmlu
#   prepare_data/prepare_aime2025.py reads problem/answer and int()s the answer (number or string).
# - OlympiadBench: huggingface/lighteval tasks/extended/olympiade_bench/main.py (subset
#   OE_TO_maths_en_COMP, split train, question, final_answer); public loaders read final_answer as a
#   list of "$...$" strings and prepend an optional context.
# - AMC-23: HF file list of math-ai/amc23 (test parquet); adaravsian/rscale utils.py (question,
#   answer); public fixtures of its rows have float answers (27.0).
# - Minerva-Math: HF file list of math-ai/minervamath (test.jsonl); yuki-younai/verl-alignment
#   examples/data_preprocess/math/eval_math_minerva-math.py (question, answer).
# - GPQA-diamond: lighteval tasks/extended/gpqa/main.py and lm-evaluation-harness tasks/gpqa
#   (config gpqa_diamond, train is the only split; Question, Correct Answer, Incorrect Answer 1..3).
#   Gated on the hub: accept its terms and log in before downloading.
# - MMLU-Pro: TIGER-AI-Lab/MMLU-Pro evaluate_from_local.py and lighteval instruct/mmlu_pro.py
#   (split test; question, options, answer_index); the official loader drops "N/A" options.
def hub_sources(seed: int = 0) -> dict[str, HubSource]:
    return {
        "MATH500": HubSource("HuggingFaceH4/MATH-500", None, "test", _problem),
        "AIME24": HubSource("HuggingFaceH4/aime_2024", None, "train", _problem),
        "AIME25": HubSource("math-ai/aime25", None, "test", _problem),
        "OlympiadBench": HubSource("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train", _olympiad),
        "AMC-23": HubSource("math-ai/amc23", None, "test", lambda r: _problem(r, "question")),
        "Minerva-Math": HubSource("math-ai/minervamath", None, "test", lambda r: _problem(r, "question")),
        "GPQA-diamond": HubSource("Idavidrein/gpqa", "gpqa_diamond", "train", lambda r: _gpqa(r, seed)),
        "MMLU-Pro": HubSource("TIGER-Lab/MMLU-Pro", None, "test", _mmlu_pro),
    }


def download(name: str, path, limit: int | None = None, seed: int = 0) -> Path:
    """Fetch benchmark `name` and write it as local JSONL at `path` (ids: the row index)."""
    sources = hub_sources(seed)
    if name not in sources:
        raise ValueError(f"unknown benchmark {name!r}; one of {', '.join(sources)}")
    try:
        from datasets import load_dataset
    except ImportError as e:
        raise ImportError("downloading benchmarks needs the datasets package: pip install "
                          "'spiral-jax[eval]' (or pass local JSONL files)") from e
    src = sources[name]
    rows = load_dataset(src.repo, src.config, split=src.split)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for i, row in enumerate(rows):
            if limit is not None and i == limit:
                break
            f.write(json.dumps({"id": f"{name}-{i}", **src.convert(dict(row))}) + "\n")
    return path
