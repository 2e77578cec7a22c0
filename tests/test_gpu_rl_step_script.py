"""scripts/gpu_rl_step.sh picks its hardware and preset by the card it finds.

The script runs here with stand-ins for `nvidia-smi` (naming a card) and `python3` (recording the
bench's arguments), so what it would run on a GPU machine is checked without one.
"""
import os
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(path: Path, body: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def run_script(tmp_path: Path, card: str, parts: str, part_rc: int = 0,
               **env) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The script's result and the bench runs it made; every bench and check exits `part_rc`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls.txt"
    _tool(bin_dir / "nvidia-smi", f'[ "$1" = -L ] && echo "GPU 0: {card}" || echo "{card}"\n')
    _tool(bin_dir / "python3", f'echo "$* | XLA_FLAGS=${{XLA_FLAGS:-}}" >> {calls}\necho "rl step 1.0 s"\n'
                               f'case "$1" in bench/*|scripts/*) exit {part_rc};; esac\n')
    result = subprocess.run(
        ["bash", "scripts/gpu_rl_step.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PARTS": parts,
             "OUT": str(tmp_path / "out"), **env})
    lines = calls.read_text().splitlines() if calls.exists() else []
    return result, [line for line in lines if line.startswith(("bench/rl_step.py", "bench/truncation.py"))]


@pytest.mark.parametrize("card, hardware, preset", [
    ("NVIDIA H200", "1xH200", "configs/kuhn_qwen3_4b_1xh200.py"),
    ("NVIDIA H100 80GB HBM3", "1xH100", "configs/kuhn_qwen3_1p7b_1xh100.py"),
])
def test_the_card_picks_hardware_and_preset(tmp_path, card, hardware, preset):
    result, benches = run_script(tmp_path, card, "preset rounds lora")
    assert result.returncode == 0, result.stderr
    assert len(benches) == 3, benches
    assert all(f"--hardware {hardware} " in b for b in benches)
    assert f"--config {preset} " in benches[0] and f"--config {preset} " in benches[1]
    assert "--config configs/kuhn_qwen3_8b_lora_1xh100.py" in benches[2]
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert f"{Path(preset).stem} (" in summary and "rl step 1.0 s" in summary


def test_an_unknown_card_asks_for_hardware_and_preset(tmp_path):
    result, benches = run_script(tmp_path, "NVIDIA L4", "preset")
    assert result.returncode == 2 and not benches
    assert "set HW" in result.stderr and "PRESET" in result.stderr
    result, benches = run_script(tmp_path, "NVIDIA L4", "preset", HW="1xL40S",
                                 PRESET="configs/kuhn_qwen3_0p6b_1x4090.py")
    assert result.returncode == 0, result.stderr
    assert benches and "--hardware 1xL40S --config configs/kuhn_qwen3_0p6b_1x4090.py" in benches[0]


def test_part_graphs_puts_the_loops_in_cuda_graphs_for_its_run_alone(tmp_path):
    result, benches = run_script(tmp_path, "NVIDIA H200", "continuous graphs")
    assert result.returncode == 0, result.stderr
    continuous, graphs = benches
    assert continuous.split(" | ")[0] == graphs.split(" | ")[0]  # the same step
    assert "command_buffer" not in continuous
    assert "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL --xla_gpu_graph_min_graph_size=1" in graphs


def test_part_truncation_times_every_way_at_the_rollouts_batch(tmp_path):
    result, benches = run_script(tmp_path, "NVIDIA H200", "truncation")
    assert result.returncode == 0, result.stderr
    assert [b.split(" | ")[0] for b in benches] == ["bench/truncation.py --rows 1 32 128"]
    assert "truncation: exit 0" in (tmp_path / "out" / "summary.txt").read_text()


def _programs(tmp_path: Path) -> list[str]:
    """The bench and check programs the script ran."""
    calls = tmp_path / "calls.txt"
    lines = calls.read_text().splitlines() if calls.exists() else []
    return [line.split()[0] for line in lines if line.startswith(("bench/", "scripts/"))]


def test_every_part_keeps_to_the_budget(tmp_path):
    """The checks are skipped, like the bench parts, when BUDGET_S has no room for them; skipping is no
    failure."""
    result, _ = run_script(tmp_path, "NVIDIA H200", "small decode truncation attention", BUDGET_S="1")
    assert result.returncode == 0, result.stderr
    assert not _programs(tmp_path)
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert all(f"part {p} skipped" in summary for p in ("small", "decode", "truncation", "attention"))


def test_a_check_under_120_s_runs_when_its_whole_limit_is_left(tmp_path):
    result, _ = run_script(tmp_path, "NVIDIA H200", "truncation attention", BUDGET_S="80", PER_ROW="16")
    assert result.returncode == 0, result.stderr
    assert _programs(tmp_path) == ["scripts/gpu_attention_check.py"]  # 75 s fits 80, truncation's 90 does not
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "part truncation skipped" in summary and "PER_ROW cleared" in summary  # no packed verdict


def test_a_failed_part_fails_the_script_after_the_rest_ran(tmp_path):
    result, _ = run_script(tmp_path, "NVIDIA H200", "small decode truncation attention", part_rc=1)
    assert result.returncode == 1
    assert _programs(tmp_path) == ["bench/rl_step.py", "bench/rl_step.py", "bench/decode_attention.py",
                                   "bench/truncation.py", "scripts/gpu_attention_check.py"]
    assert "failed: qwen3_0p6b_no_ahead (exit 1), decode (exit 1), truncation (exit 1), attention (exit 1)" \
        in result.stderr
    assert "=== summary" in result.stdout
