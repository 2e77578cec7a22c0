"""The eval command's dispatch on a tiny model, with the options a CLI would pass."""
import json
from types import SimpleNamespace

import pytest

from spiral_jax.config import EVAL_PROTOCOLS, base_config, with_protocol
from spiral_jax.run.evaluate import check_eval_args, run_eval
from spiral_jax.run.setup import run_spec


@pytest.fixture
def ctx(tiny_ctx):
    return tiny_ctx


def args(**kw):
    base = dict(suite="games", games=2, eval_out="", opponents=[], env_ids=[], players=[],
                crossplay_env="Nim-v0", kuhn_samples=0, bench=[], samples=1, shots_file="", shots=0, limit=0,
                protocol="")
    return SimpleNamespace(**{**base, **kw})


def test_suites(ctx, tmp_path):
    c = base_config()
    c.out_dir = str(tmp_path)
    c = run_spec(c)
    md = run_eval(ctx, c, args(env_ids=["Nim-v0"], opponents=["random"]))
    assert "| Nim-v0 | random | both | 2 |" in md and (tmp_path / "eval" / "games" / "games.json").exists()
    assert "Exploitability" in run_eval(ctx, c, args(suite="kuhn", kuhn_samples=2))
    with pytest.raises(ValueError, match="exact Kuhn scoring"):
        run_eval(ctx, c, args(suite="kuhn"))
    md = run_eval(ctx, c, args(suite="crossplay", opponents=["random"]))
    assert "| random |" in md
    items = tmp_path / "toy.jsonl"
    items.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    md = run_eval(ctx, c, args(suite="bench", bench=[f"toy={items}"], eval_out=str(tmp_path / "o")))
    assert "| toy | 1 |" in md and (tmp_path / "o" / "toy.items.jsonl").exists()  # --eval_out is the folder
    md = run_eval(ctx, c, args(suite="bench", bench=[str(items)], eval_out=str(tmp_path / "p")))
    assert "| toy | 1 |" in md  # a file without NAME= is named after itself
    with pytest.raises(FileNotFoundError, match="no such file .*missing.jsonl"):
        run_eval(ctx, c, args(suite="bench", bench=[str(tmp_path / "missing.jsonl")]))
    with pytest.raises(FileNotFoundError, match="not random, scripted, self or openai:MODEL@URL, and no model folder nope"):
        run_eval(ctx, c, args(env_ids=["Nim-v0"], opponents=["nope"]))
    with pytest.raises(ValueError, match="suite"):
        run_eval(ctx, c, args(suite="chess"))


def test_two_model_folders_of_one_name_are_refused_before_any_game(ctx, tmp_path, monkeypatch):
    """Both would be labelled "hf": one model's games would go under the other's name."""
    c = base_config()
    c.out_dir = str(tmp_path)
    c = run_spec(c)
    for run in ("a", "b"):
        (tmp_path / run / "hf").mkdir(parents=True)
        (tmp_path / run / "hf" / "config.json").write_text(json.dumps(c.model.to_hf_dict()))
    folders = [str(tmp_path / "a" / "hf"), str(tmp_path / "b" / "hf")]
    monkeypatch.setattr(ctx, "load_weights", lambda path: f"weights of {path}")
    with pytest.raises(ValueError, match="the name 'hf' is taken by another player; .*name=path"):
        run_eval(ctx, c, args(env_ids=["Nim-v0"], opponents=folders))
    with pytest.raises(ValueError, match="the name 'random' is taken"):
        run_eval(ctx, c, args(env_ids=["Nim-v0"], opponents=["random", f"random={folders[0]}"]))
    with pytest.raises(ValueError, match="the name 'model' is taken"):
        run_eval(ctx, c, args(suite="crossplay", players=[f"model={folders[0]}"]))
    # The transfer suite has no weights for a model folder: refused before its first game too.
    with pytest.raises(ValueError, match="--suite transfer plays scripted, self and API opponents"):
        run_eval(ctx, c, args(suite="transfer", opponents=["random", folders[0]]))


@pytest.mark.parametrize("changes, given, message", [
    (dict(games=3), (), "--games=3: evaluation plays each matchup from both seats equally; give an even number"),
    (dict(games=-2), (), r"--games=-2: give 0 or more"),
    (dict(suite="kuhn", kuhn_samples=-1), (), r"--kuhn_samples=-1: give 0 or more"),
    (dict(step=-5), (), r"--step=-5: give the training step of a checkpoint \(0 or more\)"),
    (dict(opponents=["random", "random"]), (), "--opponents lists 'random' twice"),
    (dict(opponents=[""]), (), "--opponents: player '': give random"),
    (dict(opponents=["nope"]), (), "--opponents nope: not random, scripted, self or openai:MODEL@URL, and no model"),
    (dict(opponents=["openai:gpt"]), (), "--opponents: API opponent 'openai:gpt': write it openai:MODEL@BASE_URL"),
    (dict(env_ids=["Nope-v0"]), (), "--env_ids: unknown env id 'Nope-v0'"),
    (dict(suite="kuhn", env_ids=["Nim-v0"]), ("env_ids",), "--env_ids is for --suite games; --suite kuhn does not"),
    (dict(players=["x"]), ("players",), "--players is for --suite crossplay; --suite games does not read it"),
    (dict(suite="crossplay"), (), "--suite crossplay needs players besides the model"),
    (dict(suite="crossplay", opponents=["self"]), (), "--opponents self: --suite crossplay plays --players and"),
    (dict(suite="crossplay", players=["a=/no/such"]), (), "--players a=/no/such: no model folder /no/such"),
    (dict(opponents=["a={tmp}/adapter"]), (), "--opponents a=.*adapter: .*adapter is a PEFT adapter folder"),
    (dict(suite="crossplay", players=["{tmp}/empty"]), (), "--players .*empty: no config.json at"),
    (dict(suite="crossplay", crossplay_env="Nope-v0", opponents=["random"]), (), "--crossplay_env: unknown env id"),
    (dict(suite="bench", bench=["NOPE"]), (), "--bench NOPE: no such file, and not a benchmark to download"),
    (dict(suite="bench", bench=["{tmp}/bad.jsonl"]), (), "bad.jsonl:1: not valid JSON"),
    (dict(suite="bench", bench=["a={tmp}/toy.jsonl", "a={tmp}/bad.jsonl"]), (), "the name 'a' is given twice"),
    (dict(suite="bench", bench=["MATH500={tmp}/toy.jsonl", "MATH500"]), (), "the name 'MATH500' is given twice .a file"),
    (dict(suite="bench", bench=["{tmp}/toy.jsonl"], shots=2), (), "--shots N and --shots_file FILE go together"),
    (dict(suite="bench", bench=["{tmp}/toy.jsonl"], shots=2, shots_file="{tmp}/toy.jsonl"), (),
     "--shots 2: .*toy.jsonl holds 1 examples; give at most 1"),
    (dict(suite="bench", bench=["{tmp}/toy.jsonl"], shots=1, shots_file="{tmp}/no.jsonl"), (),
     "--shots_file .*no.jsonl: no such file"),
    (dict(eval_out="{tmp}/toy.jsonl/x"), (), "--eval_out .*toy.jsonl/x: .*toy.jsonl is a file"),
    (dict(eval_out="{tmp}/checkpoints/0"), (), "--eval_out .*checkpoints/0 is inside the run's checkpoints folder"),
])
def test_flags_that_cannot_work_are_refused_before_anything_loads(changes, given, message, tmp_path):
    """`check_eval_args`, which the CLI calls before the weights load, and run_eval too."""
    (tmp_path / "toy.jsonl").write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    (tmp_path / "bad.jsonl").write_text("{nope\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    c = base_config()
    c.out_dir = str(tmp_path)
    changes = {k: [x.format(tmp=tmp_path) for x in v] if isinstance(v, list) else v.format(tmp=tmp_path)
               if isinstance(v, str) else v for k, v in changes.items()}
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        check_eval_args(run_spec(c), args(**{"step": -1, **changes}), given)
    check_eval_args(run_spec(c), args(step=-1))  # the defaults pass


def test_a_report_folder_in_a_bucket_is_not_taken_inside_the_runs_own_folders():
    c = base_config()
    c.out_dir = "gs://bucket/run/"
    for inside in ("gs://bucket/run/checkpoints/x", "gs://bucket/run/tensorboard"):
        with pytest.raises(ValueError, match=f"--eval_out {inside} is inside the run's .* gs://bucket/run/eval/NAME"):
            check_eval_args(run_spec(c), args(step=-1, eval_out=inside))
    for fine in ("gs://bucket/run/eval/x", "gs://bucket/run-checkpoints", "gs://other/run/checkpoints"):
        check_eval_args(run_spec(c), args(step=-1, eval_out=fine))


@pytest.mark.parametrize("out_dir, eval_out, folder", [
    ("gs://bucket/run", "", "gs://bucket/run/eval/games"), ("{tmp}/run", "~/report", "{tmp}/home/report")])
def test_the_report_folder_is_the_one_given(out_dir, eval_out, folder, tmp_path, monkeypatch):
    """A gs:// out_dir's reports go to the bucket, not to a local folder named gs:; --eval_out=~/x (a
    shell leaves the ~) is in the home folder, not in a folder named ~."""
    import spiral_jax.run.evaluate as evaluate

    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))

    def run_games(ctx, out, *rest):
        raise StopIteration(str(out))

    monkeypatch.setattr(evaluate, "run_games", run_games)
    c = base_config()
    c.out_dir = out_dir.format(tmp=tmp_path)
    with pytest.raises(StopIteration) as played:
        run_eval(None, run_spec(c), args(opponents=["random"], eval_out=eval_out))
    assert str(played.value) == folder.format(tmp=tmp_path)


def test_bench_samples_and_prompts_as_eval_math_says(ctx, tmp_path):
    """Without --bench the suite runs eval.math.files; eval.math sets the sampling, the samples, the
    limit and the prompt order (the context carries its sampling, as the CLI builds it)."""
    import dataclasses

    items = tmp_path / "toy.jsonl"
    items.write_text("".join(json.dumps({"problem": f"{i}+1?", "answer": str(i + 1)}) + "\n" for i in range(3)))
    c = base_config()
    c.out_dir = str(tmp_path)
    c.eval.math.update(files=(f"toy={items}",), samples=3, limit=2, temperature=0.8, max_new_tokens=5,
                       instruction_first=True)
    c = run_spec(c)
    ctx = dataclasses.replace(ctx, math_sampling=c.evaluation.math.sampling)
    run_eval(ctx, c, args(suite="bench", samples=0, eval_out=str(tmp_path / "o")))
    rows = [json.loads(line) for line in (tmp_path / "o" / "toy.items.jsonl").open()]
    assert len(rows) == 2 and all(len(r["responses"]) == 3 for r in rows)
    assert all(r["prompt"].startswith("Think it through") for r in rows)
    settings = json.loads((tmp_path / "o" / "results.json").read_text())[0]["settings"]
    assert settings["temperature"] == 0.8 and settings["max_new_tokens"] == 5 and settings["k"] == 3


def test_reference_protocol():
    c = with_protocol(base_config(), "reference")
    assert (c.eval.temperature, c.eval.top_p, c.eval.max_new_tokens, c.eval.final_games) == (0.7, 0.9, 8192, 512)
    m = c.eval.math
    assert (m.temperature, m.top_p, m.max_new_tokens, m.samples, m.instruction_first) == (0.6, 0.95, 8192, 4, True)
    assert base_config().eval.final_games == 200  # a copy: the config given is unchanged
    assert with_protocol(base_config(), "").eval.temperature == base_config().eval.temperature
    assert set(EVAL_PROTOCOLS) == {"reference"}
    with pytest.raises(ValueError, match="unknown evaluation protocol 'paper'; use one of reference"):
        with_protocol(base_config(), "paper")


def test_kuhn_suite_reads_the_policy_as_the_run_does(ctx, tmp_path, monkeypatch):
    """Without --kuhn_samples the suite samples eval.kuhn_samples answers where the config sets some (it
    scored exactly, the refusal of a reasoning model that names eval.kuhn_samples), and always asks with
    the prompts of the run's Kuhn game (KuhnPokerChips-v0 for tiny_kuhn, not KuhnPoker-v2), so that it
    repeats the trainer's reading of a step."""
    import spiral_jax.run.evaluate as evaluate

    calls = []

    def run_kuhn(ctx, out, k, env_id):
        calls.append((k, env_id))
        out.mkdir(parents=True, exist_ok=True)
        (out / "kuhn.md").write_text("Exploitability")

    monkeypatch.setattr(evaluate, "run_kuhn", run_kuhn)
    c = base_config()
    c.out_dir = str(tmp_path)
    c.games.update(env_ids=("KuhnPokerChips-v0",), weights=(1.0,))
    for configured, flag, expected in [(16, 0, 16), (16, 2, 2), (0, 0, 0), (-1, 0, 0), (-1, 4, 4)]:
        c.eval.kuhn_samples = configured
        run_eval(ctx, run_spec(c), args(suite="kuhn", kuhn_samples=flag))
        assert calls.pop() == (expected, "KuhnPokerChips-v0"), (configured, flag)


def test_bench_suite_sampler_has_room_for_eval_math_answers(tiny_model):
    """`spiral-jax eval --suite bench --bench F` on a config that names no math files: its sampler still
    holds eval.math.max_new_tokens (it was sized for the games' 8 and refused every benchmark)."""
    from spiral_jax.run.build import eval_context
    from spiral_jax.sampling.buckets import bucket_length

    cfg, params, tok = tiny_model
    c = base_config()
    c.rollout.update(max_new_tokens=8, max_prompt_len=128)
    c.eval.max_new_tokens = 8
    c.eval.math.max_new_tokens = 512
    spec = run_spec(c)
    assert eval_context(spec, cfg, params, tok, None).sampler.max_cache_len < 128 + 512  # the trainer's size
    assert eval_context(spec, cfg, params, tok, None, math=True).sampler.max_cache_len >= bucket_length(128) + 512
