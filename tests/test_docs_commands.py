"""Every command the README and docs/ show is checked: a command of ours is parsed by that
command's own argument parser (its subcommand, options, their values and required
arguments), a tool's options are ones its `--help` lists, a make target exists; and the
docs' Ray start runs as written on a fresh host (`test_docs_ray_start_runs_as_written`).

A doc step that failed as written (docs/scale.md's Ray start without a token) went
unnoticed for a wave: this file is that doc check.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OURS = ("lemur-data", "lemur-train", "lemur-eval", "lemur-convert")


def shown_commands() -> list[tuple[str, str]]:
    """(doc file, command line) for each command line in the docs' fenced blocks."""
    found = []
    for doc in DOCS:
        for block in re.findall(r"```[a-z]*\n(.*?)```", doc.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()  # a trailing comment
                found.append((doc.name, line))
    return found


def ours(line: str) -> bool:
    """A run of one of our commands (not its printed output, nor a synopsis of options)."""
    head = line.split(" ", 1)[0]
    synopsis = re.search(r"\[-|\|| \.\.\.|\bCHECKPOINT\b|\bRUN_DIR\b|\bDIR\b", line)
    printed = re.match(r"\S+( [\w-]+)*:( |$)", line)  # `lemur-data: error: ...`
    return head in OURS and not synopsis and not printed


def parse_only(argv: list[str]) -> str:
    """Parse `argv` with its command's own parser; argparse's complaint, or "" when it parses."""
    from lemur.convert.cli import parser as convert_parser
    from lemur.data.cli import parser as data_parser
    from lemur.eval.cli import parser as eval_parser
    from lemur.train import cli as train_cli
    from lemur.train.plan_cli import plan_parser

    command, args = argv[0], argv[1:]
    if command == "lemur-train":
        sub = args[0] if args and args[0] in ("plot", "plan") else None
        parser = {"plan": plan_parser, "plot": train_cli.plot_parser}.get(
            sub, train_cli.train_parser
        )()
        args = args[1:] if sub else args
    else:
        parser = {"lemur-data": data_parser, "lemur-eval": eval_parser}.get(
            command, convert_parser
        )()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(args)
        except SystemExit:
            return err.getvalue().strip().splitlines()[-1]
    return ""


def test_the_docs_show_commands_of_every_kind() -> None:
    lines = [line for _, line in shown_commands()]
    for command in OURS:
        assert sum(ours(x) and x.startswith(command + " ") for x in lines) >= 3, command
    assert sum(x.startswith("python tools/") for x in lines) >= 20


@pytest.mark.parametrize("command", OURS)
def test_every_shown_command_of_ours_parses(command: str) -> None:
    bad = []
    for doc, line in shown_commands():
        if ours(line) and line.startswith(command + " "):
            problem = parse_only(shlex.split(line))
            if problem:
                bad.append(f"{doc}: {line}: {problem}")
    assert bad == []


def test_every_shown_tool_option_is_one_the_tool_takes() -> None:
    helps: dict[tuple[str, ...], str] = {}
    bad = []
    for doc, line in shown_commands():
        m = re.match(r"(?:\w+=\S+ )*python (tools/\S+\.py)(.*)", line)
        if not m:
            continue
        script, rest = m.group(1), shlex.split(m.group(2))
        assert (ROOT / script).is_file(), f"{doc}: {script} does not exist"
        # The words before the first option: a subcommand (gpu_check.py run) or positionals.
        words = tuple(
            w for w in rest[: next((i for i, w in enumerate(rest) if w.startswith("-")), len(rest))]
        )
        subcommand = words[:1] if words and re.fullmatch(r"[a-z][a-z-]*", words[0]) else ()
        key = (script, *subcommand)
        if key not in helps:
            out = subprocess.run(
                [sys.executable, script, *subcommand, "--help"],
                capture_output=True,
                text=True,
                cwd=ROOT,
                timeout=120,
            )
            assert out.returncode == 0, f"{doc}: {' '.join(key)} --help: {out.stderr[-500:]}"
            helps[key] = out.stdout
        for option in (w.split("=")[0] for w in rest if w.startswith("--")):
            if not re.search(rf"(^|[\s,\[]){re.escape(option)}\b", helps[key]):
                bad.append(f"{doc}: {line}: {option} is not an option of {' '.join(key)}")
    assert bad == []


def test_every_shown_make_target_exists() -> None:
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    shown = {line.split()[1] for _, line in shown_commands() if line.startswith("make ")}
    assert shown and shown <= targets, shown - targets


def ray_start_block() -> str:
    """The shell block of docs/scale.md's "Ray, step by step", step 1."""
    text = (ROOT / "docs/scale.md").read_text()
    section = text.split("## Ray, step by step", 1)[1].split("2. **Recipe.**", 1)[0]
    return re.findall(r"```\n(.*?)```", section, re.S)[0]


@pytest.mark.cluster
def test_docs_ray_start_runs_as_written(tmp_path: Path) -> None:
    """On a fresh host (a HOME with no ~/.ray), the docs' commands start a 2-node cluster
    that a driver joins with the same environment. Only the port is ours (a free one)."""
    sys.path.insert(0, str(ROOT / "tools"))
    from localcluster import free_port, kill_groups

    port = str(free_port())
    block = ray_start_block()
    assert "6379" in block
    home = tmp_path / "home"
    home.mkdir()
    root = Path(tempfile.mkdtemp(prefix="lemur-ray-doc-"))  # short: Ray's socket paths
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(
        HOME=str(home), RAY_TMPDIR=str(root), PATH=f"{Path(sys.executable).parent}:{env['PATH']}"
    )
    script = (
        "set -e\n"
        + block.replace("6379", port)
        + (
            f'{sys.executable} -c \'import ray; ray.init(address="127.0.0.1:{port}", '
            'log_to_driver=False); print("nodes", sum(n["Alive"] for n in ray.nodes()))\'\n'
        )
    )
    proc = subprocess.Popen(
        ["bash", "-c", script],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # ray start's daemons stay in this group: ours to kill
    )
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        kill_groups([proc.pid])
        subprocess.run(["rm", "-rf", str(root)], check=False)
    assert proc.returncode == 0, out[-3000:]
    assert out.strip().splitlines()[-1] == "nodes 2", out[-3000:]


def test_the_readme_says_how_to_reach_the_commands_it_shows() -> None:
    """`make demo` installs into .venv: without activating it, every command the README and
    docs/ show is "command not found" (found by a new user)."""
    readme = [line for doc, line in shown_commands() if doc == "README.md"]
    activate = readme.index(". .venv/bin/activate")
    first_own = next(i for i, line in enumerate(readme) if ours(line))
    assert activate < first_own
