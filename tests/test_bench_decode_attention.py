"""bench/decode_attention.py on CPU (the kernel in Pallas' interpreter): it times XLA's path and each
variant of the kernel at each row count and fill, and its parity check passes on agreeing outputs and
fails on a kernel that is off."""
import re
import sys

import pytest

from tests.scripts import load_script

bench = load_script("bench/decode_attention.py")
ARGS = ["--shape", "tiny", "--interpret", "--rows", "1", "3", "--window", "192", "--prompt", "64", "--layers", "2",
        "--repeats", "1", "--dtype", "float32", "--split_slots", "128", "64"]


def _run(monkeypatch, capsys) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["decode_attention.py", *ARGS])
    status = bench.main()
    return status, capsys.readouterr().out


def test_it_times_both_paths_for_each_row_count_and_fill(monkeypatch, capsys):
    status, out = _run(monkeypatch, capsys)
    assert status == 0 and "OK" in out
    lines = re.findall(r"^\s*(\d+) rows, (full|spread)\s*: xla .* pallas/xla ([\d.]+)$", out, re.M)
    assert [(rows, fill) for rows, fill, _ in lines] == [("1", "full"), ("1", "spread"), ("3", "full"), ("3", "spread")]
    assert all(float(ratio) > 0 for *_, ratio in lines)
    assert out.count("pallas 128 ") == out.count("pallas 64 ") == 4  # each kernel variant, each row count and fill
    assert out.splitlines()[-1].startswith("pallas 128/xla 1 full ")


def test_a_kernel_that_disagrees_fails_the_check(monkeypatch, capsys):
    kernel = bench.gpu.decode_attention
    monkeypatch.setattr(bench.gpu, "decode_attention", lambda *a, **kw: kernel(*a, **kw) * 1.01)
    status, out = _run(monkeypatch, capsys)
    assert status == 1 and "MISMATCH" in out


@pytest.mark.parametrize("fill, want", [("full", [191, 191, 191]), ("spread", [96, 128, 160])])
def test_rows_sit_at_the_windows_end_or_spread_over_the_new_tokens(fill, want):
    assert bench.query_slots(fill, 3, 64, 192).tolist() == want
