"""bench/truncation.py runs and reports the three ways of truncating, at a small vocabulary."""
import re
import sys

from tests.scripts import load_script


def test_the_truncation_bench_times_every_way_and_reports_the_nucleus(capsys, monkeypatch):
    bench = load_script("bench/truncation.py")
    monkeypatch.setattr(sys, "argv", ["truncation.py", "--rows", "2", "--vocab", "50000"])
    bench.main()
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if re.match(r"\s+2 ", line)]
    assert [r[1] for r in rows] == ["peaked", "flat", "mixed", "wide"]
    peaked, flat, mixed, wide = (int(r[2].replace(",", "")) for r in rows)
    assert mixed == flat  # the widest row of the mixed batch is its flat one
    # The peaked rows' nucleus fits among the candidates; the flat rows' does not; the wide rows' holds
    # more than half the vocabulary.
    assert 0 < peaked < bench.logits_module.CANDIDATES < flat < 25_000 < wide
    assert all(float(x) > 0 for r in rows for x in r[3:7]) and all(r[7].endswith("x") and r[8].endswith("x")
                                                                   for r in rows)
