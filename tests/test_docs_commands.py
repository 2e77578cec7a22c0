"""The commands README.md and docs/*.md show still work as written: a renamed flag, a config key that
moved, a preset or script that was renamed fails here instead of for the user who copies the command.

Every command in a shell code block (and in an inline `code span` that starts with a program) is checked
without running it: no weights are loaded, no model is built.
  spiral-jax COMMAND   cli.main itself with its last step (cli._run) replaced by the config's planning
                       resolution (what `spiral-jax config` does): the command and its flags, their
                       values, the --config file and its --config.a.b=value overrides; plan's --hardware,
                       eval's flags as eval checks them before loading weights. Without --config (a
                       mention in prose: `spiral-jax eval --opponents`), the flag names only
  spiral-jax launch    launch.main with --dry_run (it prints the gcloud/ssh steps, runs none), and the
                       `spiral-jax train` it would start on the hosts, checked as above
  python -m spiral_jax.X, python bench/X.py, python scripts/X.py
                       the file exists and its flags parse with its own argparse arguments (read from
                       its source: importing a bench would start JAX with its own settings); configs/
                       files and compile_presets.py's presets exist
  scripts/X.sh         the file exists and reads the variables set before it
  python -m pytest     the test paths exist
Placeholders (--config C, HW, N, ...) are replaced by the values in PLACEHOLDERS; a model.path such as
/ckpt/Qwen3-4B-Base need not exist (planning mode does not look for it).
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import re
import shlex
from pathlib import Path

import pytest

from spiral_jax import cli

REPO = Path(__file__).resolve().parents[1]
DOCS = ["README.md", *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))]
INDENTED = "    "  # the language of a code block indented by four spaces
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console", INDENTED}  # code blocks whose lines may be commands
PROGRAMS = {"spiral-jax", "python", "python3", "bash"}
CONFIG = "configs/spiral_kuhn_qwen3_4b.py"  # stands for "your config" (--config C)
# Placeholder words in the docs, whole arguments or a --flag=VALUE's value, and what is checked instead.
PLACEHOLDERS = {"C": CONFIG, "X": CONFIG, "configs/X.py": CONFIG, "configs/PRESET": "configs/kuhn_qwen3_4b_v5p_8.py",
                "PRESET": "kuhn_qwen3_4b_v5p_8", "HW": "v5p-8", "N": "8", "K": "1", "G": "32"}
# Commands that cannot be checked as written, left out of the checks: (doc file, the command as the doc
# writes it): why.
SKIP = {
    ("README.md", "spiral-jax COMMAND --help"): "COMMAND stands for every command; tests/test_cli.py checks each",
    ("docs/performance.md", "bench/rl_step.py --rollout_only"): "the flag named in prose, without its value (a shape)",
}


@dataclasses.dataclass(frozen=True)
class DocCommand:
    file: str
    line: int
    argv: tuple[str, ...]  # the program first (spiral-jax, python, bench/X.py, ...), shell words
    text: str  # as the doc writes it (a continued command joined into one line)
    env: tuple[tuple[str, str], ...] = ()  # VAR=value words before the program

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}: {self.text}"

    @property
    def kind(self) -> str:
        a = self.argv
        if a[0] == "spiral-jax":
            return "launch" if a[1:2] == ("launch",) else "spiral-jax"
        if a[0] in ("python", "python3") and a[1:2] == ("-m",):  # not -m venv, -m pip
            module = a[2] if len(a) > 2 else ""
            return "pytest" if module == "pytest" else "python" if module.startswith("spiral_jax") else "other"
        script = a[1] if a[0] in ("python", "python3", "bash") and len(a) > 1 else a[0]
        if script.startswith(("bench/", "scripts/")):
            return "shell" if script.endswith(".sh") else "python"
        return "other"


def _words(text: str) -> list[str]:
    """Shell words; `#` starts a comment, and ; && | & are words of their own (command separators)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split, lexer.commenters = True, "#"
    return list(lexer)


def _commands(file: str, line: int, text: str, variables: dict[str, str], code_block: bool) -> list[DocCommand]:
    """The commands in one logical line of a doc; `NAME=value` lines of a code block go to `variables`."""
    if not re.search(r"(^|[\s;&|])(\.venv/bin/)?(spiral-jax|python3?|bash|bench/|scripts/)|^\s*[A-Z_]+=", text):
        return []  # output or prose in a block
    try:
        words = _words(text)
    except ValueError as e:  # an unclosed quote: a command that cannot be copied as it is
        raise AssertionError(f"{file}:{line}: {e}: {text}") from None
    found, segment = [], []
    for word in [*words, ";"]:
        if word not in (";", "&&", "||", "|", "&"):
            segment.append(re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m.group(1), m.group(0)), word))
            continue
        argv, segment, env = segment, [], []
        while argv and argv[0] == "$":  # a shell prompt
            argv = argv[1:]
        while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):
            env.append(tuple(argv.pop(0).split("=", 1)))
        if not argv:
            variables.update(env)  # S='...' on a line of its own: used later in the block as "$S"
            continue
        program = argv[0].removeprefix(".venv/bin/")
        bare_script = program.startswith(("bench/", "scripts/"))  # a mere path in prose is no command
        if program in PROGRAMS or (bare_script and (code_block or env or len(argv) > 1)):
            found.append(DocCommand(file, line, (program, *argv[1:]), " ".join(text.split()), tuple(env)))
    return found


def doc_commands() -> list[DocCommand]:
    """Every command in README.md and docs/*.md: each line of a shell code block, fenced or indented by
    four spaces (continued lines, ending with a backslash, joined), and each inline code span outside
    code blocks that starts with a program."""
    found = []
    for file in DOCS:
        lines = (REPO / file).read_text().split("\n")
        prose, block, variables, pending, start = [], None, {}, "", 0
        for number, line in enumerate(lines, 1):
            if fence := re.match(r"\s*```\s*(\S*)", line):
                block = None if block is not None else fence.group(1)
                variables, pending = {}, ""
                prose.append("")
                continue
            if block in (None, INDENTED):  # prose, or an indented block that goes on or starts here
                indented = line.startswith(INDENTED) and (block == INDENTED or not lines[number - 2].strip())
                block = INDENTED if indented else None
                if not indented:
                    prose.append(line)
                    continue
            prose.append("")
            if block not in SHELL_BLOCKS:
                continue
            if not pending:
                start = number
            pending += line
            if line.rstrip().endswith("\\"):
                pending = pending.rstrip()[:-1] + " "
                continue
            found += _commands(file, start, pending, variables, code_block=True)
            pending = ""
        text = "\n".join(prose)  # code spans may wrap lines
        for span in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
            number = text.count("\n", 0, span.start()) + 1
            found += _commands(file, number, " ".join(span.group(1).split()), {}, code_block=False)
    return found


COMMANDS = doc_commands()


def _cases(kind: str):
    cases = [c for c in COMMANDS if c.kind == kind and (c.file, c.text) not in SKIP]
    ids = [f"{c.file}:{c.line}:{' '.join(c.argv[:2 if kind != 'launch' else 3])}" for c in cases]
    return pytest.mark.parametrize("command", cases, ids=ids)


def _substituted(argv) -> list[str]:
    """The argv with placeholder arguments and values replaced, [--optional] brackets and ... dropped."""
    out = []
    for word in argv:
        if word == "...":
            continue
        word = word[1:] if word.startswith("[--") else word  # [--resume], [--kuhn_samples 64]
        word = word[:-1] if word.count("]") > word.count("[") else word
        name, eq, value = word.partition("=")
        if eq and name.startswith("--") and value in PLACEHOLDERS:
            word = f"{name}={PLACEHOLDERS[value]}"
        out.append(PLACEHOLDERS.get(word, word))
    return out


def _run_cli(argv: list[str], monkeypatch, capsys) -> tuple[int, str]:
    """cli.main(argv) up to the point where the command would start: cli._run resolves the config as
    `spiral-jax config` does (its values, games and modes checked; a model folder not looked for), plan's
    --hardware / --devices are read and eval's flags checked as eval checks them before loading weights
    (but for the user's own files: /ckpt/a, math500.jsonl); nothing is loaded, trained or served."""
    def resolve(command, config):
        from spiral_jax.hardware import planned_hardware
        from spiral_jax.run.evaluate import check_eval_args
        from spiral_jax.run.setup import run_spec

        spec = run_spec(config, planning=True)
        flags = cli.FLAGS
        if command == "plan" and (flags.hardware or flags["devices"].present):
            planned_hardware(flags.hardware, flags.devices if flags["devices"].present else None,
                             flags.device_memory_gib if flags["device_memory_gib"].present else None,
                             flags.hosts if flags["hosts"].present else None)
        if command == "eval":
            try:
                check_eval_args(spec, flags, [n for n in cli.COMMANDS["eval"][1] if flags[n].present])
            except (FileNotFoundError, ValueError) as e:
                if not isinstance(e, FileNotFoundError) and "no such file" not in str(e):
                    raise
        return 0

    monkeypatch.setattr(cli, "_run", resolve)
    capsys.readouterr()
    code = cli.main(argv)
    return code, capsys.readouterr().err


def _flag_names(argv) -> list[str]:
    return [w[2:].split("=", 1)[0] for w in argv if w.startswith("--") and w != "--"]


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)  # the docs' paths (configs/..., bench/...) are relative to the repository


def test_the_docs_show_commands_of_every_kind():
    """The extraction finds the commands (a change to the docs' layout that hid them fails here)."""
    counts = {kind: sum(c.kind == kind for c in COMMANDS) for kind in ("spiral-jax", "launch", "python", "shell",
                                                                         "pytest")}
    assert counts["spiral-jax"] >= 40 and counts["launch"] >= 6 and counts["python"] >= 20, counts
    assert counts["shell"] >= 2 and counts["pytest"] >= 2, counts
    unused = [key for key in SKIP if not any((c.file, c.text) == key for c in COMMANDS)]
    assert not unused, f"SKIP entries that match no doc command any more: {unused}"


def _check_spiral_jax(where: str, argv: list[str], monkeypatch, capsys) -> None:
    """A `spiral-jax COMMAND ...` argv (placeholders substituted): the command and its flag names; with a
    --config, the whole command line as cli.main reads it."""
    name = argv[1] if len(argv) > 1 else ""
    assert name in cli.COMMANDS, f"{where}\n  no command {name!r}; there are {sorted(cli.COMMANDS)}"
    own = cli.COMMANDS[name][1]
    if bad := [f for f in _flag_names(argv) if not f.startswith("config.") and f not in own
               and not (f.startswith("no") and f[2:] in own)]:
        pytest.fail(f"{where}\n  --{bad[0]} is not a flag of spiral-jax {name} ({', '.join(own)})")
    config = next((w.split("=", 1)[1] if "=" in w else argv[i + 1] for i, w in enumerate(argv)
                   if w == "--config" or w.startswith("--config=")), None)
    if config is None:  # a mention in prose (`spiral-jax eval --opponents`): its names are checked above
        return
    assert (REPO / config).is_file(), f"{where}\n  no config file {config}"
    code, err = _run_cli(argv, monkeypatch, capsys)
    assert code == 0, f"{where}\n  {err.strip()}"


@_cases("spiral-jax")
def test_spiral_jax_command(command, monkeypatch, capsys):
    argv = _substituted(command.argv)
    if command.argv[2:3] == ("...",):  # `spiral-jax plan ... --compile --config.a.b=v`: a config elided
        argv[2:2] = ["--config", CONFIG]
    _check_spiral_jax(command.where, argv, monkeypatch, capsys)


@_cases("launch")
def test_launch_command(command, monkeypatch, capsys):
    """launch.main with --dry_run, and the train command it would start checked like the ones above."""
    from spiral_jax import launch
    from spiral_jax.launch import gpu, tpu

    trains = []

    def recorded(*args, **kwargs):
        trains.append(argv := launch.train_argv(*args, **kwargs))
        return argv

    for module in (tpu, gpu):  # the train command here, in this process (check_overrides starts a Python)
        monkeypatch.setattr(module, "train_argv", recorded)
        monkeypatch.setattr(module, "check_overrides", lambda config, extra: None)
    argv = _substituted(command.argv)
    if len(argv) == 3:  # `spiral-jax launch tpu` in prose
        assert argv[2] in ("tpu", "gpu"), command.where
        return
    capsys.readouterr()
    code = launch.main([argv[2], "--dry_run", *argv[3:]])
    err = capsys.readouterr().err
    assert code == 0, f"{command.where}\n  {err.strip()}"
    for train in trains:
        assert train[1:4] == ["-m", "spiral_jax.cli", "train"], train
        code, err = _run_cli(["spiral-jax", *train[3:]], monkeypatch, capsys)
        assert code == 0, f"{command.where}\n  the train command on the hosts: {err.strip()}"


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _Refused(message)


def _script_parser(path: Path) -> argparse.ArgumentParser | None:
    """An argparse parser with the arguments `path` gives its own (its add_argument calls, read from the
    source): names, nargs, actions, int/float types and literal choices; None when it has no parser."""
    tree = ast.parse(path.read_text())
    parsers = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
               and getattr(node.value.func, "attr", getattr(node.value.func, "id", "")) == "ArgumentParser"
               for t in node.targets if isinstance(t, ast.Name)}
    if not parsers:
        return None
    calls = sorted((node for node in ast.walk(tree) if isinstance(node, ast.Call)
                    and getattr(node.func, "attr", "") == "add_argument"
                    and getattr(node.func.value, "id", "") in parsers), key=lambda node: node.lineno)
    parser = _Parser(prog=path.as_posix(), add_help=False, allow_abbrev=False)  # the docs name flags in full
    for call in calls:
        kwargs = {}
        for kw in call.keywords:
            if kw.arg == "type":
                kwargs["type"] = {"int": int, "float": float}.get(getattr(kw.value, "id", ""), str)
            elif kw.arg == "action":
                literal = isinstance(kw.value, ast.Constant)
                kwargs["action"] = kw.value.value if literal else getattr(argparse, kw.value.attr)
            elif kw.arg in ("nargs", "required", "choices"):
                try:
                    kwargs[kw.arg] = ast.literal_eval(kw.value)
                except ValueError:  # choices=list(SHAPES): not known without importing the script
                    pass
        parser.add_argument(*(ast.literal_eval(a) for a in call.args), **kwargs)
    return parser


@_cases("python")
def test_python_command(command, monkeypatch, capsys):
    """python -m spiral_jax.X / python bench/X.py / python scripts/X.py: the file, and its arguments as its
    own parser reads them (or, for a script that reads sys.argv itself, its --flags in its source)."""
    argv = _substituted(command.argv)
    if argv[0] in ("python", "python3"):
        argv = argv[1:]
    if argv[0] == "-m":
        module = argv[1]
        assert module.split(".")[0] == "spiral_jax", f"{command.where}\n  not a spiral_jax module: {module}"
        base = REPO / module.replace(".", "/")
        path = next((p for p in (base.with_suffix(".py"), base / "__main__.py") if p.is_file()), None)
        assert path is not None, f"{command.where}\n  no module {module}"
        args = argv[2:]
    else:
        path, args = REPO / argv[0], argv[1:]
        assert path.is_file(), f"{command.where}\n  no file {argv[0]}"
    strings = {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)}
    if path == REPO / "scripts/plateau_probes.py":  # PROBE, then a spiral-jax command line
        assert args[0] in strings, f"{command.where}\n  plateau_probes.py has no probe {args[0]}"
        _check_spiral_jax(command.where, ["spiral-jax", *args[1:]], monkeypatch, capsys)
        return
    parser = _script_parser(path)
    if parser is None:
        unknown = [w for w in args if w.startswith("--") and w.split("=")[0] not in strings]
        assert not unknown, f"{command.where}\n  {path.name} reads no {' '.join(unknown)}"
        return
    try:
        parsed = parser.parse_args(args)
    except _Refused as e:
        raise AssertionError(f"{command.where}\n  {path.relative_to(REPO)}: {e}") from None
    missing = [w for w in args if w.startswith("configs/") and not (REPO / w).is_file()]
    assert not missing, f"{command.where}\n  no config file {missing[0]}"
    if path == REPO / "scripts/compile_presets.py":  # its arguments name presets: keys of its PRESETS
        presets = next(ast.literal_eval(n.value) for n in ast.parse(path.read_text()).body
                       if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "PRESETS")
        unknown = [p for p in parsed.presets if p not in presets or not (REPO / f"configs/{p}.py").is_file()]
        assert not unknown, f"{command.where}\n  no preset {unknown[0]} (configs/NAME.py in PRESETS)"


@_cases("shell")
def test_shell_script_command(command):
    """scripts/X.sh: the file exists, and reads the variables the command sets (PARTS=truncation: a part
    of that name)."""
    argv = list(command.argv[1:] if command.argv[0] == "bash" else command.argv)
    path = REPO / argv[0]
    assert path.is_file(), f"{command.where}\n  no file {argv[0]}"
    source = path.read_text()
    for name, value in command.env:
        assert re.search(rf"\$\{{?{name}\b", source), f"{command.where}\n  {argv[0]} does not read ${name}"
        for word in value.split():
            if "/" not in word:  # a folder (OUT=/tmp/x) is the user's; a part name is the script's
                assert re.search(rf"\b{re.escape(word)}\)", source), (
                    f"{command.where}\n  {argv[0]} has no {name} value {word!r}")


@_cases("pytest")
def test_pytest_command(command):
    missing = [w for w in command.argv[3:] if w.startswith("tests") and not (REPO / w.split("::")[0]).exists()]
    assert not missing, f"{command.where}\n  no such test path: {' '.join(missing)}"
