"""How `spiral-jax launch` runs its steps: each command with what it does and how to retry it, run by
subprocess or printed (`--dry_run`), and an error that names the step that failed."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

PREFIX = "spiral-jax launch"


class LaunchError(Exception):
    """A launch step that cannot go on; the message says what failed and how to retry."""


class UsageError(LaunchError):
    """Bad command-line arguments (exit status 2)."""


@dataclass
class Step:
    argv: list[str]
    what: str                 # "create the TPU VM", "install on every worker", ...
    retry: str = ""           # how to retry when it fails
    note: str = ""            # printed after the command in --dry_run, as a shell comment
    cwd: str | None = None    # folder to run in (Runner.exec); None: the current one

    def line(self) -> str:
        text = shlex.join(self.argv)
        if self.cwd:
            text = f"cd {shlex.quote(self.cwd)} && {text}"
        return f"{text}  # {self.note}" if self.note else text


_INSTALL_HINTS = {
    "gcloud": "install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install), then run "
              "`gcloud auth login` and `gcloud config set project PROJECT`",
    "ssh": "install an OpenSSH client and set up key-based ssh to every host",
}


@dataclass
class Runner:
    """Runs steps with subprocess, or prints them (dry run). Tests swap in a fake."""
    dry_run: bool = False
    out: object = None

    def _print(self, text: str) -> None:
        print(text, file=self.out or sys.stdout, flush=True)

    def _check_tool(self, step: Step) -> None:
        tool = step.argv[0]
        if shutil.which(tool) is None:
            hint = _INSTALL_HINTS.get(os.path.basename(tool), f"install {tool} or put it on PATH")
            raise LaunchError(f"cannot {step.what}: `{tool}` is not on PATH; {hint}")

    def run(self, step: Step, capture: bool = False, check: bool = True) -> subprocess.CompletedProcess:
        if self.dry_run:
            self._print(step.line())
            return subprocess.CompletedProcess(step.argv, 0, "", "")
        self._check_tool(step)
        print(f"[{PREFIX}] {step.what}: {step.line()}", file=sys.stderr, flush=True)
        proc = subprocess.run(step.argv, text=True, capture_output=capture)
        if check and proc.returncode != 0:
            raise LaunchError(failure_message(step, proc))
        return proc

    def run_parallel(self, steps: list[Step]) -> None:
        """All steps at once (one ssh per host: a coordinator waits only so long for the others);
        then one error naming every step that failed."""
        if self.dry_run:
            for step in steps:
                self.run(step)
            return
        for step in steps:
            self._check_tool(step)
            print(f"[{PREFIX}] {step.what}: {step.line()}", file=sys.stderr, flush=True)
        with ThreadPoolExecutor(max_workers=min(len(steps), 64) or 1) as pool:
            procs = list(pool.map(lambda st: subprocess.run(st.argv, text=True, capture_output=False), steps))
        failed = [failure_message(st, p) for st, p in zip(steps, procs) if p.returncode != 0]
        if failed:
            raise LaunchError(f"{len(failed)} of {len(steps)} failed:\n" + "\n".join(failed))

    def exec(self, step: Step) -> int:
        """Replace this process by the step (a foreground run keeps Ctrl-C / SIGTERM semantics)."""
        if self.dry_run:
            self._print(step.line())
            return 0
        if step.cwd:
            os.chdir(step.cwd)  # first: a relative program (.venv/bin/python) is found from there
        self._check_tool(step)
        print(f"[{PREFIX}] {step.what}: {step.line()}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os.execvp(step.argv[0], step.argv)
        return 0  # not reached


def failure_message(step: Step, proc: subprocess.CompletedProcess) -> str:
    lines = [f"step failed: {step.what} (exit status {proc.returncode})", f"  command: {step.line()}"]
    err = (proc.stderr or "").strip()
    if err:
        lines.append("  stderr: " + "\n          ".join(err.splitlines()[-12:]))
    if step.retry:
        lines.append(f"  retry: {step.retry}")
    return "\n".join(lines)
