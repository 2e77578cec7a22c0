"""What a run writes stays in its out_dir and what it deletes is its own: transcript names made from
hostile opponent specs, --overwrite by the run's manifest, export folders that are never the current,
home or run folder, an atomic lock takeover, and an unwritable out_dir as one line."""
import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from spiral_jax.cli import main as cli_main
from spiral_jax.run import Trainer
from spiral_jax.run_dir import RunDir, RunDirError, write_manifest
from tests.eval.test_api_player import _serve
from tests.trainer.test_trainer import REPO, _config_file, tiny_config


def test_training_eval_transcripts_of_a_hostile_spec_stay_in_out_dir(tmp_path):
    """`openai:m@http://host/ok/../../../../../../../escaped/v1` as an evaluation opponent: each step's
    transcript is a file in out_dir/eval/step<N>/, none is written outside out_dir or overwritten."""
    server = _serve()
    try:
        spec = f"openai:m@http://127.0.0.1:{server.server_port}/ok/../../../../../../../escaped/v1"
        trainer = Trainer.from_config(tiny_config(tmp_path / "deep" / "er", **{"eval.opponents": (spec,), "eval.kuhn_samples": -1}),
                          log=lambda *_: None)
        for step in (0, 1):
            trainer.state.step = step
            trainer.evaluate(2)
    finally:
        server.shutdown()
        server.server_close()
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.jsonl"))
    assert [p.parts[:5] for p in written] == [("deep", "er", "run", "eval", "step0"),
                                              ("deep", "er", "run", "eval", "step1")], written
    assert not list(tmp_path.rglob("escaped*"))


# ---------------------------------------------------------------------------------------- export

def _export(config, out, *extra):
    return cli_main(["spiral-jax", "export", f"--config={config}", f"--out={out}", "--overwrite", *extra])


def test_export_refuses_the_current_home_and_run_folders(tmp_path, monkeypatch, capsys):
    """`export --out . --overwrite` once deleted the current folder's contents: each of these folders is
    refused before any weights load, and what is in them stays."""
    config = _config_file(tmp_path)  # out_dir tmp_path/run (no run needed: the check comes first)
    here, home = tmp_path / "work" / "here", tmp_path / "home"
    for folder in (here, home, tmp_path / "run" / "checkpoints"):
        folder.mkdir(parents=True)
        (folder / "precious.txt").write_text("keep")
    monkeypatch.chdir(here)
    monkeypatch.setenv("HOME", str(home))
    cases = {".": "is the current folder", "..": "is a parent of the current folder",
             str(tmp_path): "is a parent of the current folder", "~": "is the home folder",
             str(tmp_path / "run"): "is the run's out_dir", str(tmp_path / "run" / "checkpoints"): "inside the run's checkpoints",
             str(tmp_path / "run" / "checkpoints" / "x"): "inside the run's checkpoints"}
    for out, message in cases.items():
        assert _export(config, out) == 1, out
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, (out, err)
    assert all((f / "precious.txt").read_text() == "keep" for f in (here, home, tmp_path / "run" / "checkpoints"))
    (tmp_path / "file").write_text("x")
    assert _export(config, tmp_path / "file" / "hf") == 1
    assert f"{tmp_path / 'file'} is a file, not a folder" in capsys.readouterr().err


def test_a_run_refuses_the_current_and_home_folders_as_its_out_dir(tmp_path, monkeypatch):
    """A run writes its files (and --overwrite clears them) in out_dir: the current folder, the home
    folder and their parents are refused before anything is written, as export refuses them."""
    from spiral_jax.run_dir import RunDir, RunDirError

    here, home = tmp_path / "work" / "here", tmp_path / "home"
    here.mkdir(parents=True)
    home.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setenv("HOME", str(home))
    for out, message in {".": "is the current folder", "..": "is a parent of the current folder",
                         "~": "is the home folder", "/": "is a parent of the current folder"}.items():
        with pytest.raises(RunDirError, match=message):
            RunDir(out, resume=False)
    assert not list(here.iterdir()) and not list(home.iterdir())
    with RunDir("runs/x", resume=False, log=lambda *_: None):  # a folder of its own
        assert (here / "runs" / "x" / "run_manifest.json").is_file()


def test_resume_takes_a_step_kept_while_it_was_saved_again(tmp_path):
    """A process killed while saving step 0 again leaves only `0.replaced`, which the Checkpointer
    restores: --resume's early look for a checkpoint counts it."""
    from spiral_jax.run_dir import RunDir, RunDirError

    (tmp_path / "run" / "checkpoints" / "0.replaced").mkdir(parents=True)
    with RunDir(str(tmp_path / "run"), resume=True, log=lambda *_: None):
        pass
    (tmp_path / "run" / "checkpoints" / "0.replaced").rename(tmp_path / "run" / "checkpoints" / "0.unreadable")
    with pytest.raises(RunDirError, match="no checkpoint to resume from"):
        RunDir(str(tmp_path / "run"), resume=True).__enter__()


# -------------------------------------------------------------------------------------- --overwrite

def test_overwrite_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    """Files with a run's names (config.json, eval/) but no run manifest are a user's: --overwrite
    deletes nothing and says why."""
    config = _config_file(tmp_path, **{"train.steps": 1})
    (tmp_path / "run" / "eval" / "mydata").mkdir(parents=True)
    (tmp_path / "run" / "eval" / "mydata" / "results.csv").write_text("a,b\n1,2\n")
    (tmp_path / "run" / "config.json").write_text('{"mine": true}')
    for extra in ((), ("--overwrite",)):
        assert cli_main(["spiral-jax", "train", f"--config={config}", *extra]) == 1
        err = capsys.readouterr().err
        assert "holds files a run writes (eval, config.json) but no run_manifest.json" in err, err
        assert "nothing was deleted" in err and "Traceback" not in err
    assert (tmp_path / "run" / "eval" / "mydata" / "results.csv").read_text() == "a,b\n1,2\n"
    assert (tmp_path / "run" / "config.json").read_text() == '{"mine": true}'
    assert not (tmp_path / "run" / "run.lock").exists()


def test_overwrite_deletes_only_what_the_manifest_lists(tmp_path):
    run = tmp_path / "run"
    (run / "eval" / "step0").mkdir(parents=True)
    (run / "eval" / "step0" / "games.jsonl").write_text("{}")
    (run / "summary.json").write_text("{}")
    (run / "notes.txt").write_text("mine")
    write_manifest(run, ("eval", "summary.json"))
    logged = []
    with RunDir(str(run), resume=False, overwrite=True, log=logged.append):
        assert sorted(p.name for p in run.iterdir()) == ["notes.txt", "run.lock", "run_manifest.json"]
    assert "eval, summary.json as its run_manifest.json lists" in logged[0]
    write_manifest(run, ("../elsewhere",))
    (run / "summary.json").write_text("{}")
    with pytest.raises(RunDirError, match=r"lists \['../elsewhere'\], which are not names of entries"):
        RunDir(str(run), resume=False, overwrite=True).__enter__()

    for entries in ('"eval"', '{"e": 1}'):  # read as letters or keys, these named files to delete
        (run / "e").write_text("mine")
        (run / "run_manifest.json").write_text('{"entries": %s}' % entries)
        with pytest.raises(RunDirError, match="lists no entries .* nothing was deleted"):
            RunDir(str(run), resume=False, overwrite=True).__enter__()
        assert (run / "e").read_text() == "mine"


def test_a_lock_that_is_no_run_s_is_one_line(tmp_path):
    """A run.lock that is not UTF-8, or names no process (pid 0 or -1 would be a process group for
    os.kill, a huge one overflows it), is refused as unreadable, not a traceback nor a live run."""
    run = tmp_path / "run"
    run.mkdir()
    for text in (b"\xff\xfe", *(b'{"pid": %d, "host": "%s", "started": "x"}' % (pid, socket.gethostname().encode())
                                 for pid in (0, -1, 10 ** 20))):
        (run / "run.lock").write_bytes(text)
        with pytest.raises(RunDirError, match="run.lock exists but cannot be read"):
            RunDir(str(run), resume=False).__enter__()
        assert (run / "run.lock").read_bytes() == text


# -------------------------------------------------------------------------------------------- lock

def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_stale_lock_is_taken_over_by_exactly_one_of_many_at_once(tmp_path):
    """Rounds of 12 threads taking over the same stale lock at the same moment: each round exactly one
    holds the lock, and the others refuse naming it."""
    out = tmp_path / "run"
    out.mkdir()
    lock, stale = out / "run.lock", _dead_pid()
    for round_ in range(40):
        lock.write_text(json.dumps({"pid": stale, "host": socket.gethostname(), "started": f"round {round_}"}))
        start, held = threading.Barrier(12), threading.Barrier(12)
        winners, refusals = [], []

        def contend():
            claim = RunDir(str(out), resume=True, log=lambda *_: None)
            start.wait()
            try:
                claim.acquire()
                winners.append(claim)
            except RunDirError as e:
                refusals.append(str(e))
            held.wait()  # everyone has tried while the winner still holds the lock

        threads = [threading.Thread(target=contend) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(winners) == 1 and len(refusals) == 11, (round_, len(winners), refusals[:2])
        assert json.loads(lock.read_text())["token"] == winners[0].token
        assert all(f"in use by process {os.getpid()}" in r for r in refusals), refusals[:2]
        winners[0].release()
        assert not lock.exists() and not list(out.glob("run.lock.*"))


CONTENDER = """
import os, sys, time
from spiral_jax.run_dir import RunDir, RunDirError
out, go, done = sys.argv[1:]
claim = RunDir(out, resume=True, log=lambda *_: None)
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
try:
    claim.acquire()
    print("won", flush=True)
except RunDirError:
    print("refused", flush=True)
while not os.path.exists(done):  # a winner holds the lock, alive, until every process has tried
    time.sleep(0.01)
"""


def test_a_stale_lock_is_taken_over_by_exactly_one_of_many_processes(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    lock, stale = out / "run.lock", _dead_pid()
    env = dict(os.environ, PYTHONPATH=REPO)
    for round_ in range(3):
        lock.write_text(json.dumps({"pid": stale, "host": socket.gethostname(), "started": f"round {round_}"}))
        go, done = tmp_path / f"go{round_}", tmp_path / f"done{round_}"
        procs = [subprocess.Popen([sys.executable, "-c", CONTENDER, str(out), str(go), str(done)], env=env,
                                  stdout=subprocess.PIPE, text=True) for _ in range(8)]
        assert [p.stdout.readline().strip() for p in procs] == ["ready"] * 8
        go.touch()  # all at once
        results = [p.stdout.readline().strip() for p in procs]
        done.touch()
        for p in procs:
            p.wait(timeout=30)
        assert sorted(results) == ["refused"] * 7 + ["won"], (round_, results)
        lock.unlink()  # the winner has exited: its lock is stale now, as the next round needs


# --------------------------------------------------------------------------------- unwritable out_dir

def test_an_unwritable_out_dir_is_one_line(tmp_path, capsys):
    """An out_dir below a regular file cannot be created, for root too: one line, no traceback."""
    (tmp_path / "afile").write_text("x")
    config = _config_file(tmp_path, **{"out_dir": str(tmp_path / "afile" / "run")})
    assert cli_main(["spiral-jax", "train", f"--config={config}"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"spiral-jax train: RunDirError: cannot write to {tmp_path / 'afile' / 'run'}: a file is "
                          f"in the way") and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("name", ["run.lock", "run_manifest.json"])
def test_a_folder_where_the_run_keeps_a_file_is_named(tmp_path, name):
    """A folder called run.lock or run_manifest.json is named as being in the way, and stays."""
    run = tmp_path / "run"
    (run / name).mkdir(parents=True)
    with pytest.raises(RunDirError, match=f"cannot write to {run}: {run / name} is a folder where spiral-jax keeps a "
                                          f"file; move it away"):
        RunDir(str(run), resume=False, overwrite=True, log=lambda *_: None).__enter__()
    assert (run / name).is_dir() and not (run / "run.lock").is_file()


def test_overwrite_deletes_a_listed_link_and_never_what_it_points_to(tmp_path):
    """eval/ made a link to a folder of the user's: --overwrite removes the link, the folder stays whole."""
    run, mine = tmp_path / "run", tmp_path / "mine"
    (mine / "step0").mkdir(parents=True)
    (mine / "step0" / "games.jsonl").write_text("{}")
    run.mkdir()
    (run / "eval").symlink_to(mine, target_is_directory=True)
    (run / "summary.json").write_text("{}")
    write_manifest(run, ("eval", "summary.json"))
    with RunDir(str(run), resume=False, overwrite=True, log=lambda *_: None):
        assert not (run / "eval").exists() and not (run / "eval").is_symlink()
    assert (mine / "step0" / "games.jsonl").read_text() == "{}"
