"""README.md's library example runs as written: its Python code block, with only the checkpoint
folder replaced by a tiny saved model and the inputs it leaves to the reader defined first."""
import re
from pathlib import Path

import numpy as np

from tests.tiny_models import make_hf_model

README = Path(__file__).resolve().parents[1] / "README.md"
CHECKPOINT = "/path/to/hf_checkpoint"


def _library_example() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)
    assert len(blocks) == 1, f"README.md has {len(blocks)} python code blocks; this test runs the library example"
    return blocks[0]


def test_the_readme_library_example_runs(tmp_path):
    make_hf_model("qwen3", tmp_path)
    code = _library_example()
    assert CHECKPOINT in code, "the example no longer loads from the placeholder this test replaces"
    prompts = [[1, 2, 3], [4, 5]]
    scope = {"input_ids": np.asarray([[1, 2, 3, 4], [0, 5, 6, 7]], np.int32),
             "attention_mask": np.asarray([[1, 1, 1, 1], [0, 1, 1, 1]], np.int32), "prompts": prompts}
    exec(compile(code.replace(CHECKPOINT, str(tmp_path)), "README.md", "exec"), scope)
    cfg, logits, out, env = scope["cfg"], scope["logits"], scope["out"], scope["env"]
    assert cfg.model_type == "qwen3" and logits.shape == (2, 4, cfg.vocab_size), logits.shape
    assert np.isfinite(np.asarray(logits)).all()
    assert len(out.tokens) == len(prompts) and all(0 < len(t) <= 256 for t in out.tokens)
    assert env.env_id == "TicTacToe-v0"
