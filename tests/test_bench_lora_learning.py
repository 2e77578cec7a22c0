"""bench/lora_learning.py's sequence of `spiral-jax` commands, with the commands stood in for (the real
ones take minutes): it runs again into the same --out, as a train that refuses an out_dir holding a run
would not let it without --overwrite, and prints a row per run."""
import json
import subprocess
from pathlib import Path

from tests.scripts import load_script


def _summary(win: float) -> dict:
    stats = {"win": win, "win_ci": [max(win - 0.1, 0.0), min(win + 0.1, 1.0)], "invalid": 0.0}
    return {"eval": {"step0": {"PigDiceState-v1/random": dict(stats, win=0.5)},
                     "final": {"PigDiceState-v1/random": stats}}}


def _fake_cli(commands: list):
    """subprocess.run for `python -m spiral_jax.cli ...`: records the arguments, refuses a train into an
    out_dir that holds a run unless --overwrite is given (as RunDir does), and writes a summary."""
    def run(cmd, check=False, **_):
        args = cmd[cmd.index("spiral_jax.cli") + 1:]
        commands.append(args)
        if args[0] == "train":
            out = Path(next(a.split("=", 1)[1] for a in args if a.startswith("--config.out_dir=")))
            if (out / "summary.json").exists() and "--overwrite" not in args:
                raise subprocess.CalledProcessError(1, cmd)
            out.mkdir(parents=True, exist_ok=True)
            (out / "summary.json").write_text(json.dumps(_summary(0.75)))
        return subprocess.CompletedProcess(cmd, 0)
    return run


def test_it_runs_twice_into_the_same_out_and_prints_both_runs(tmp_path, monkeypatch, capsys):
    bench = load_script("bench/lora_learning.py")
    commands = []
    monkeypatch.setattr(bench.subprocess, "run", _fake_cli(commands))
    argv = ["lora_learning.py", "--out", str(tmp_path), "--steps", "3", "--rank", "4"]
    for _ in range(2):
        monkeypatch.setattr("sys.argv", argv)
        bench.main()
    assert [c[0] for c in commands] == ["train", "export", "train", "train"] * 2
    out = capsys.readouterr().out
    assert "| full fine-tuning | 50.0% | 75.0% [65.0%, 85.0%] | +25.0% |" in out, out
    assert "| LoRA rank 4 | 50.0% |" in out, out
    lora = commands[3]
    assert "--config.model.lora.rank=4" in lora and "--config.model.lora.alpha=8.0" in lora
