"""The eval command's dispatch on a tiny model, with the options a CLI would pass."""
import json
from types import SimpleNamespace

import pytest

from spiral_jax.config import base_config
from spiral_jax.eval.command import run_eval


@pytest.fixture
def ctx(tiny_ctx):
    return tiny_ctx


def args(**kw):
    base = dict(suite="games", games=2, eval_out="", opponents=[], env_ids=[], players=[],
                crossplay_env="Nim-v0", kuhn_samples=0, bench=[], samples=1, shots_file="", shots=0, limit=0)
    return SimpleNamespace(**{**base, **kw})


def test_suites(ctx, tmp_path):
    c = base_config()
    c.out_dir = str(tmp_path)
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
    with pytest.raises(FileNotFoundError, match="not random, scripted or self, and no model folder nope"):
        run_eval(ctx, c, args(env_ids=["Nim-v0"], opponents=["nope"]))
    with pytest.raises(ValueError, match="suite"):
        run_eval(ctx, c, args(suite="chess"))
