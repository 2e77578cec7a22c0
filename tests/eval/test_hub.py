"""Hub rows -> local items (offline: fake rows and a fake `datasets.load_dataset`)."""
import sys
import types

import pytest

from spiral_jax.eval.benchmarks import BENCHMARKS, load_items
from spiral_jax.eval.hub import download, hub_sources

ROWS = {
    "MATH500": {"problem": "p", "answer": "\\frac{1}{2}"},
    "AIME24": {"problem": "p", "answer": "204"},
    "AIME25": {"problem": "p", "answer": 70},
    "OlympiadBench": {"question": "p", "final_answer": ["$3$"]},
    "AMC-23": {"question": "p", "answer": 27.0},
    "Minerva-Math": {"question": "p", "answer": "1.5"},
    "GPQA-diamond": {"Question": "p", "Correct Answer": "right", "Incorrect Answer 1": "w1",
                     "Incorrect Answer 2": "w2", "Incorrect Answer 3": "w3"},
    "MMLU-Pro": {"question": "p", "options": ["a", "b", "c"], "answer": "C", "answer_index": 2},
}


def test_every_benchmark_has_a_source():
    assert set(hub_sources()) == set(BENCHMARKS) == set(ROWS)


@pytest.mark.parametrize("name", sorted(ROWS))
def test_download_writes_loadable_items(name, tmp_path, monkeypatch):
    calls = []

    def load_dataset(repo, config, split):
        calls.append((repo, config, split))
        return [ROWS[name]] * 3

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    items = load_items(download(name, tmp_path / f"{name}.jsonl", limit=2))
    assert len(items) == 2 and items[0].problem == "p" and calls[0][0] == hub_sources()[name].repo
    assert items[0].kind == BENCHMARKS[name]
    if name == "GPQA-diamond":
        assert items[0].choices["ABCD".index(items[0].answer)] == "right"
    if name == "MMLU-Pro":
        assert items[0].answer == "C"


def test_without_datasets_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match="spiral-jax\\[eval\\]"):
        download("MATH500", tmp_path / "m.jsonl")
