"""Benchmark items from the Hugging Face hub (online machines, optional `datasets` package), written
once as the local JSONL files `benchmarks.load_items` reads, so runs never depend on the network.

Each benchmark names its dataset, config, split and how a row becomes our item; the GPQA choices are
shuffled with a fixed seed per item (the dataset lists the correct answer first).
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Callable, NamedTuple


def _problem(row: dict, problem: str = "problem", answer: str = "answer") -> dict:
    return {"problem": row[problem], "answer": str(row[answer])}


def _olympiad(row: dict) -> dict:
    answer = row["final_answer"]
    return {"problem": row["question"], "answer": answer[0] if isinstance(answer, list) else str(answer)}


def _gpqa(row: dict, seed: int) -> dict:
    choices = [row["Correct Answer"]] + [row[f"Incorrect Answer {i}"] for i in (1, 2, 3)]
    order = list(range(4))
    random.Random(f"{seed}:{row['Question']}").shuffle(order)
    return {"question": row["Question"], "choices": [choices[i].strip() for i in order],
            "answer": order.index(0)}


def _mmlu_pro(row: dict) -> dict:
    return {"question": row["question"], "choices": list(row["options"]), "answer": int(row["answer_index"])}


class HubSource(NamedTuple):
    repo: str
    config: str | None
    split: str
    convert: Callable[[dict], dict]


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
