"""Hub rows -> local items (offline: fake rows and a fake `datasets.load_dataset`).

Each fake row uses the column names and value types found for the real dataset (see the sources
listed in spiral_jax/eval/hub.py); `EXPECTED` is the item each row must become."""
import sys
import types

import pytest

from spiral_jax.eval.benchmarks import BENCHMARKS, load_items
from spiral_jax.eval.hub import answer_text, download, hub_sources

ROWS = {
    # HuggingFaceH4/MATH-500 test: problem, solution, answer (str), subject, level (int), unique_id
    "MATH500": {"problem": "p", "solution": "s", "answer": "\\frac{1}{2}", "subject": "Algebra",
                "level": 3, "unique_id": "test/algebra/1.json"},
    # HuggingFaceH4/aime_2024 train: id (int), problem, solution, answer (str), url, year (str)
    "AIME24": {"id": 60, "problem": "p", "solution": "s", "answer": "204", "url": "u", "year": "2024"},
    # math-ai/aime25 test: problem, answer, id (answer may arrive as an int)
    "AIME25": {"problem": "p", "answer": 70, "id": "0"},
    # Hothan/OlympiadBench OE_TO_maths_en_COMP train: question, final_answer (list of "$..$"), context
    "OlympiadBench": {"id": 1606, "question": "p", "final_answer": ["$3$"], "context": None,
                      "is_multiple_answer": False, "answer_type": "Numerical", "unit": None},
    # math-ai/amc23 test: id, question, answer (float), url
    "AMC-23": {"id": 0, "question": "p", "answer": 27.0,
               "url": "https://artofproblemsolving.com/wiki/index.php/2023_AMC_12A_Problems/Problem_1"},
    # math-ai/minervamath test: question, answer (str)
    "Minerva-Math": {"question": "p", "answer": "1.5"},
    # Idavidrein/gpqa gpqa_diamond train: Question, Correct Answer, Incorrect Answer 1..3 (+ others)
    "GPQA-diamond": {"Question": "p", "Correct Answer": " right\n", "Incorrect Answer 1": "w1",
                     "Incorrect Answer 2": "w2", "Incorrect Answer 3": "w3", "Explanation": "e"},
    # TIGER-Lab/MMLU-Pro test: question_id, question, options (list, "N/A" padding), answer (letter),
    # answer_index (int), cot_content, category, src
    "MMLU-Pro": {"question_id": 70, "question": "p", "options": ["a", "b", "c", "N/A"], "answer": "C",
                 "answer_index": 2, "cot_content": "", "category": "law", "src": "ori_mmlu-law"},
}

EXPECTED = {  # name -> (answer, choices) of the loaded item
    "MATH500": ("\\frac{1}{2}", ()),
    "AIME24": ("204", ()),
    "AIME25": ("70", ()),
    "OlympiadBench": ("3", ()),
    "AMC-23": ("27", ()),
    "Minerva-Math": ("1.5", ()),
    "MMLU-Pro": ("C", ("a", "b", "c")),
}


def test_every_benchmark_has_a_source():
    assert set(hub_sources()) == set(BENCHMARKS) == set(ROWS)


def test_verified_repos_configs_and_splits():
    got = {name: (s.repo, s.config, s.split) for name, s in hub_sources().items()}
    assert got == {
        "MATH500": ("HuggingFaceH4/MATH-500", None, "test"),
        "AIME24": ("HuggingFaceH4/aime_2024", None, "train"),
        "AIME25": ("math-ai/aime25", None, "test"),
        "OlympiadBench": ("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train"),
        "AMC-23": ("math-ai/amc23", None, "test"),
        "Minerva-Math": ("math-ai/minervamath", None, "test"),
        "GPQA-diamond": ("Idavidrein/gpqa", "gpqa_diamond", "train"),
        "MMLU-Pro": ("TIGER-Lab/MMLU-Pro", None, "test"),
    }


def _download(name, rows, tmp_path, monkeypatch, limit=None):
    calls = []

    def load_dataset(repo, config, split):
        calls.append((repo, config, split))
        return rows

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    items = load_items(download(name, tmp_path / f"{name}.jsonl", limit=limit))
    src = hub_sources()[name]
    assert calls == [(src.repo, src.config, src.split)]
    return items


@pytest.mark.parametrize("name", sorted(ROWS))
def test_download_writes_loadable_items(name, tmp_path, monkeypatch):
    items = _download(name, [ROWS[name]] * 3, tmp_path, monkeypatch, limit=2)
    assert [i.id for i in items] == [f"{name}-0", f"{name}-1"]
    item = items[0]
    assert item.problem == "p" and item.kind == BENCHMARKS[name]
    if name == "GPQA-diamond":
        assert sorted(item.choices) == ["right", "w1", "w2", "w3"]
        assert item.choices["ABCD".index(item.answer)] == "right"
    else:
        assert (item.answer, item.choices) == EXPECTED[name]


def test_olympiad_multiple_answers_and_context(tmp_path, monkeypatch):
    row = {"question": "Find all n.", "final_answer": ["$1$", "$ 2 $"], "context": "Let n > 0."}
    (item,) = _download("OlympiadBench", [row], tmp_path, monkeypatch)
    assert item.answer == "1, 2" and item.problem == "Let n > 0.\nFind all n."


def test_mmlu_pro_keeps_the_answer_index_when_dropping_padding(tmp_path, monkeypatch):
    row = {"question": "q", "options": ["a", "N/A", "b", "c"], "answer": "C", "answer_index": 2}
    (item,) = _download("MMLU-Pro", [row], tmp_path, monkeypatch)
    assert item.choices == ("a", "b", "c") and item.answer == "B"


def test_answer_text():
    assert [answer_text(v) for v in (27.0, 70, "204", " 1.5 ", 0.5, -3.0)] == ["27", "70", "204", "1.5", "0.5", "-3"]
    import numpy as np  # dataset columns come as numpy scalars, float32 ones too
    assert [answer_text(v) for v in (np.float32(0.1), np.float64(2.5), np.float32(4.0), np.int64(7))] == \
        ["0.1", "2.5", "4", "7"]


def test_without_datasets_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match="spiral-jax\\[eval\\]"):
        download("MATH500", tmp_path / "m.jsonl")
