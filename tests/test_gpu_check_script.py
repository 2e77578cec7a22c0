"""scripts/gpu_check.sh runs every section and fails when one of them failed.

The script runs here with stand-ins for `nvidia-smi` and `python3`, so its exit status is checked
without a GPU.
"""
import os
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("failing, rc, failed", [
    ("", 0, None),
    ("-m pytest", 1, "failed: tests (exit 3)"),
    ("bench/sampler.py", 1, "failed: bench/sampler.py (exit 3)"),
    ("-m spiral_jax.cli", 1, "failed: main job (exit 3)"),
])
def test_a_failed_section_fails_the_script(tmp_path, failing, rc, failed):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in [("nvidia-smi", 'echo "GPU 0: NVIDIA H200"\n'),
                       ("python3", f'echo "ran $*" >> {tmp_path}/calls.txt\n'
                                   + (f'case "$*" in "{failing}"*) exit 3;; esac\n' if failing else ""))]:
        tool = bin_dir / name
        tool.write_text("#!/usr/bin/env bash\n" + body)
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "out"
    result = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out)})
    assert result.returncode == rc, result.stdout + result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["main.log", "sampler.log", "tests.log"]  # every section ran
    assert (failed in result.stdout) if failed else "every section passed" in result.stdout
