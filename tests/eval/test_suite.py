"""The offline suite on a tiny random model: each run writes its report; weights load from HF folders."""
import json

import jax
import numpy as np
import pytest

from spiral_jax.eval.suite import run_benchmarks, run_crossplay, run_games, run_kuhn


@pytest.fixture
def ctx(tiny_ctx):
    return tiny_ctx


def test_games_kuhn_and_benchmarks(ctx, tmp_path):
    results = run_games(ctx, tmp_path, ["Nim-v0"], ["random"], 2)
    assert results["Nim-v0", "random"].games == 2
    saved = json.loads((tmp_path / "games.json").read_text())["settings"]
    assert saved["temperature"] == 0.6 and saved["top_p"] == 0.95 and saved["n_games"] == 2

    with pytest.raises(ValueError, match="exact Kuhn scoring: .* --kuhn_samples N with spiral-jax eval"):  # a random model never writes the answers
        run_kuhn(ctx, tmp_path)
    sampled = run_kuhn(ctx, tmp_path / "sampled", k=2)
    report = (tmp_path / "sampled" / "kuhn.md").read_text()
    assert "2 samples per information set" in report
    settings = json.loads(report.split("\nSettings: ")[1])  # what the samples were drawn under
    assert settings["temperature"] == 0.6 and settings["top_p"] == 0.95 and settings["kuhn_samples"] == 2
    assert all(sampled.samples[i] + round(2 * sampled.invalid_rate[i]) == 2 for i in sampled.samples)

    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n"
                     + json.dumps({"question": "Pick B", "choices": ["x", "y"], "answer": "B"}) + "\n")
    (res,) = run_benchmarks(ctx, tmp_path / "bench", {"toy": str(items)}, k=2)
    assert res.items == 2 and res.settings["temperature"] == 0.6
    assert (tmp_path / "bench" / "toy.items.jsonl").exists() and (tmp_path / "bench" / "results.md").exists()


def test_crossplay_with_a_model_folder(ctx, tmp_path):
    from spiral_jax.models import save_pretrained

    save_pretrained(ctx.cfg, ctx.params, tmp_path / "hf")
    other = ctx.load_weights(str(tmp_path / "hf"))
    for a, b in zip(jax.tree.leaves(other), jax.tree.leaves(ctx.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    result, ratings = run_crossplay(ctx, tmp_path, {"model": ctx.params, "copy": other}, "TicTacToe-v0",
                                    2, scripted=("random",))
    assert result.names == ["model", "copy", "random"] and result.games[0, 1] == 2
    # Elo follows the scores: whoever scored more against the others rates higher
    share = np.nansum(result.score, axis=1) / np.nansum(result.games, axis=1)
    assert all((ratings.elo[i] - ratings.elo[j]) * (share[i] - share[j]) >= 0
               for i in range(3) for j in range(3) if abs(share[i] - share[j]) > 1e-9)
    report = (tmp_path / "crossplay.md").read_text()
    assert "| model |" in report
    settings = json.loads(report.split("\nSettings: ")[1])  # what the games were played under
    assert settings["temperature"] == 0.6 and settings["games_per_pair"] == 2 and settings["step"] == ctx.step



def test_only_the_leader_writes_the_crossplay_report(ctx, tmp_path, monkeypatch):
    """Every host of a multi-host run holds the same results; one writes them to the shared folder."""
    from spiral_jax.eval import suite

    monkeypatch.setattr(suite, "is_leader", lambda: False)
    result, _ = run_crossplay(ctx, tmp_path / "other", {}, "Nim-v0", 2, scripted=("random", "scripted"))
    assert result.games[0, 1] == 2 and not (tmp_path / "other").exists()
    monkeypatch.setattr(suite, "is_leader", lambda: True)
    run_crossplay(ctx, tmp_path / "leader", {}, "Nim-v0", 2, scripted=("random", "scripted"))
    assert (tmp_path / "leader" / "crossplay.md").is_file()
