"""Benchmark runner: loading, prompts, pass@1 vs mean over samples, and end to end on a tiny model."""
import json

import numpy as np
import pytest

from spiral_jax.eval.benchmarks import (Item, Response, load_items, markdown, model_generate_fn,
                                        prompt_text, run_benchmark, write_results)

ITEMS = [
    {"id": "half", "problem": "What is 1 divided by 2?", "answer": "\\frac{1}{2}"},
    {"id": "sum", "question": "What is 2 + 3?", "answer": "5"},
    {"id": "mc", "question": "Which is prime?", "choices": ["4", "6", "7", "9"], "answer": 2},
]


@pytest.fixture
def items_file(tmp_path):
    path = tmp_path / "items.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ITEMS) + "\n")
    return path


def test_load_and_prompts(items_file):
    items = load_items(items_file)
    assert [i.id for i in items] == ["half", "sum", "mc"]
    assert items[2].answer == "C" and items[2].kind == "choice" and items[0].kind == "math"
    assert load_items(items_file, limit=2)[-1].id == "sum"
    zero = prompt_text(items[2])
    assert zero.startswith("Question: Which is prime?") and "(C) 7" in zero and "\\boxed{A}" in zero
    shot = Item("s", "What is 3 - 1?", "2", solution="3 - 1 = 2.")
    few = prompt_text(items[0], [shot])
    assert few.index("What is 3 - 1?") < few.index("1 divided by 2")
    assert "3 - 1 = 2. The answer is \\boxed{2}." in few
    first = prompt_text(items[2], instruction_first=True)  # the reference's order
    assert first.startswith("Think it through") and first.endswith("(D) 9")
    assert sorted(first.splitlines()) == sorted(zero.splitlines())  # the same lines, reordered



def test_load_accepts_a_bom_numbers_and_answer_lists(tmp_path):
    path = tmp_path / "items.jsonl"
    path.write_text('\ufeff{"problem": "a", "answer": 27.0}\n{"problem": "b", "answer": ["$3$", "$5$"]}\n'
                    '{"question": "c", "choices": ["x", "y"], "answer": " b"}\n', encoding="utf-8")
    assert [(i.answer, i.choices) for i in load_items(path)] == [("27", ()), ("3, 5", ()), ("B", ("x", "y"))]


@pytest.mark.parametrize("text, line, message", [
    ('{"problem": "a", "answer": "1"}\n{"problem": "b", "answer": \n', 2, "not valid JSON"),
    ('["a", "1"]\n', 1, "expected a JSON object"),
    ('{"problem": "a", "answer": null}\n', 1, "'answer' must be"),
    ('{"problem": "a", "answer": "  "}\n', 1, "'answer' is empty"),
    ('{"problem": "a", "answer": [[1]]}\n', 1, "'answer' must be"),
    ('{"problem": 7, "answer": "7"}\n', 1, "'problem' (or 'question') must be"),
    ('{"question": "a", "choices": ["x", "y"], "answer": 4}\n', 1, "index (0 to 1) or the letter (A to B)"),
    ('{"question": "a", "choices": ["x", "y"], "answer": -1}\n', 1, "index (0 to 1)"),
    ('{"question": "a", "choices": ["x", "y"], "answer": true}\n', 1, "index (0 to 1)"),
    ('{"question": "a", "choices": ["x", "y"], "answer": "C"}\n', 1, "index (0 to 1)"),
    ('{"question": "a", "choices": ["x", "y"], "answer": "y"}\n', 1, "index (0 to 1)"),
    ('{"question": "a", "choices": "xyz", "answer": "B"}\n', 1, "'choices' must be a list"),
    ('{"question": "a", "choices": [], "answer": "A"}\n', 1, "'choices' must be a list"),
    ('{"problem": "a", "answer": "1"}\n{"id": 0, "problem": "b", "answer": "2"}\n', 2, "id '0' is already used on line 1"),
    ('\n\n', None, "no items"),
    (b'{"problem": "\xff", "answer": "1"}\n', None, "not UTF-8"),
    ('{"problem": "a", "answer": ' + "9" * 5000 + '}\n', 1, "not valid JSON"),  # past int's 4,300 digits
    ('{"problem": "a", "answer": NaN}\n', 1, "finite number"),
    ('{"problem": "a", "answer": [1, 1e400]}\n', 1, "finite number"),
    ('{"problem": "a", "answer": "1", "solution": 7}\n', 1, "'solution' must be a string"),
])
def test_load_refuses_bad_files_naming_the_line(tmp_path, text, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError) as e:
        load_items(path)
    assert str(e.value).startswith(f"{path}:{line}: " if line else f"{path}: ")
    assert message in str(e.value)

def test_a_folder_null_solution_and_repeated_names(tmp_path):
    from spiral_jax.eval.benchmarks import local_files

    with pytest.raises(ValueError, match="a folder, not a JSONL file"):
        load_items(tmp_path)  # named as a folder, not an IsADirectoryError
    with pytest.raises(FileNotFoundError, match="is a folder"):
        local_files([str(tmp_path)])
    path = tmp_path / "items.jsonl"
    path.write_text('{"problem": "a", "answer": "1", "solution": null}\n')
    assert load_items(path)[0].solution == ""  # no solution, not the text "None"
    with pytest.raises(ValueError, match="the name 'A' is given twice"):
        local_files([f"A={path}", f"A={path}"])  # one would replace the other's results
    with pytest.raises(ValueError, match="no name"):
        local_files([f"={path}"])


def test_generate_must_answer_every_prompt(items_file, tmp_path):
    """A generate that answers fewer prompts than items was graded on the first items under the count
    of all of them (and none gave a NaN pass@1)."""
    items = load_items(items_file)
    for n in (0, 1, 4):
        with pytest.raises(ValueError, match=f"responses for {n} prompts, expected 3"):
            run_benchmark("b", items, lambda prompts, k: [["\\boxed{5}"] * k] * n, 1, tmp_path)


def test_pass_at_1_is_first_sample_and_mean_is_over_samples(items_file, tmp_path):
    answers = {"half": ["\\boxed{0.5}", "\\boxed{2}"], "sum": ["I think 5", "\\boxed{5}"],
               "mc": ["\\boxed{C}", Response("\\boxed{C", 8, "length")]}

    items = load_items(items_file)

    def generate(prompts, k):
        assert k == 2
        return [answers[next(i.id for i in items if i.problem in p)] for p in prompts]

    result = run_benchmark("toy", items, generate, 2, tmp_path / "out",
                           settings={"temperature": 0.6})
    assert result.pass_at_1 == pytest.approx(2 / 3)       # half (0.5), mc (C); sum's first has no box
    assert result.mean_accuracy == pytest.approx(3 / 6)   # 0.5, 5, C
    assert result.boxed_rate == pytest.approx(4 / 6) and result.truncated_rate == pytest.approx(1 / 6)
    rows = [json.loads(line) for line in (tmp_path / "out" / "toy.items.jsonl").read_text().splitlines()]
    assert [r["correct"] for r in rows] == [[True, False], [False, True], [True, False]]
    from spiral_jax.eval.math_grader import math_verify_available
    math = "math-verify" if math_verify_available() else "normaliser"
    assert [r["graded_by"] for r in rows] == [[math, math], ["no box", math], ["choice letter", "choice letter"]]
    assert rows[1]["extracted"] == [None, "5"] and rows[2]["finish_reasons"] == ["stop", "length"]
    assert result.settings["prompt"] == "zero-shot" and result.settings["temperature"] == 0.6
    table = markdown([result])
    assert "pass@1 (first sample)" in table and "mean accuracy over k=2" in table and "| toy | 3 |" in table


def test_end_to_end_tiny_model(tiny_model, items_file, tmp_path):
    """A random model scores ~0; the pipeline, files and counts are what is checked."""
    from spiral_jax.metrics import MetricsWriter, read_scalars
    from spiral_jax.sampling import Sampler, SamplingParams

    cfg, params, tok = tiny_model
    sampler = Sampler(cfg, None, max_prompt_len=192, max_cache_len=256)
    items = load_items(items_file) + [Item("long", "7 " * 400, "7")]  # too long for the sampler
    sp = SamplingParams(max_new_tokens=8, temperature=0.6, top_p=0.95)
    generate = model_generate_fn(sampler, tok, params, sp, seed=3)
    result = run_benchmark("tiny", items, generate, 2, tmp_path / "bench",
                           settings={"temperature": 0.6, "top_p": 0.95, "max_new_tokens": 8})
    assert result.items == 4 and result.samples_per_item == 2
    rows = [json.loads(line) for line in (tmp_path / "bench" / "tiny.items.jsonl").read_text().splitlines()]
    assert result.pass_at_1 == np.mean([r["first_correct"] for r in rows])  # the summary is the items'
    assert result.mean_accuracy == np.mean([c for r in rows for c in r["correct"]])
    assert [r["id"] for r in rows] == ["half", "sum", "mc", "long"]
    assert all(len(r["responses"]) == 2 and len(r["correct"]) == 2 for r in rows)
    assert rows[3]["finish_reasons"] == ["prompt_too_long"] * 2
    assert all("prompt_too_long" not in r["finish_reasons"] for r in rows[:3])
    assert 0 < result.mean_response_tokens <= 8
    run_benchmark("tiny", items, generate, 2, tmp_path / "again")
    assert (tmp_path / "again" / "tiny.items.jsonl").read_text() == \
        (tmp_path / "bench" / "tiny.items.jsonl").read_text()  # seeded: reproducible
    writer = MetricsWriter(tmp_path / "tb")
    path = write_results([result], tmp_path / "bench", writer=writer, step=7)
    writer.close()
    assert json.loads(path.read_text())[0]["name"] == "tiny"
    assert "| tiny | 4 |" in (tmp_path / "bench" / "results.md").read_text()
    assert read_scalars(tmp_path / "tb")["bench/tiny/pass@1_first_sample"][0][0] == 7
