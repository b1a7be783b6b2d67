"""One CLI shape for lemur-data, lemur-train, lemur-eval and lemur-convert (lemur.cli_common):
a user mistake is one line and exit 2, `--debug` / LEMUR_DEBUG=1 shows its traceback, a bug
always shows its traceback (exit 1), Ctrl-C exits 130 and SIGTERM 143 after cleanup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from lemur.cli_common import EXIT_SIGINT, EXIT_USAGE, CommandError, parse_set, run_main
from lemur.convert import cli as convert
from lemur.data import cli as data_cli
from lemur.eval import agent_report
from lemur.eval import cli as eval_cli
from lemur.train import cli as train_cli


def _code(main: Callable[[list[str]], int], argv: list[str]) -> int:
    """The exit code of a command run in this process (lemur-data raises SystemExit)."""
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code or 0)


def _python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def _summary(tmp_path: Path) -> Path:
    """An agent run's summary (what `lemur-eval plot` reads)."""
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"success_rate_by_turn": [0.5, 0.75], "feedback": "exec"}))
    return path


def _mistakes(tmp_path: Path) -> dict[str, tuple[Callable, list[str], type[BaseException]]]:
    """Per command: its main, a command line with a user mistake, the error it raises."""
    from lemur.data.recipe.errors import RecipeError
    from lemur.eval.load import LoadError

    missing = str(tmp_path / "missing")
    return {
        "lemur-data": (data_cli.main, ["build", "--dry-run", "--set", "output="], RecipeError),
        "lemur-train": (train_cli.main, ["tiny", "--set", "steps=x"], CommandError),
        "lemur-eval": (eval_cli.main, ["bpb", missing, str(tmp_path)], LoadError),
        "lemur-convert": (convert.main, ["to-hf", missing, str(tmp_path / "x")], ValueError),
    }


COMMANDS = ["lemur-data", "lemur-train", "lemur-eval", "lemur-convert"]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_user_mistake_is_one_line_exit_2(command: str, tmp_path: Path, capsys) -> None:
    main, argv, _ = _mistakes(tmp_path)[command]
    assert _code(main, argv) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{command}: "), err


@pytest.mark.parametrize(
    ("main", "argv", "prog"),
    [
        (data_cli.main, ["build", "r.yaml", "--bogus"], "lemur-data build"),
        (data_cli.main, ["stats", "d", "--bogus"], "lemur-data stats"),
        (
            data_cli.main,
            ["classifier", "train", "--positive", "p", "--negative", "n", "--out", "m", "--x"],
            "lemur-data classifier train",
        ),
        (train_cli.main, ["tiny", "--bogus"], "lemur-train"),
        (train_cli.main, ["plan", "tiny", "--bogus"], "lemur-train plan"),
        (train_cli.main, ["plot", "run", "--bogus"], "lemur-train plot"),
    ],
)
def test_an_unknown_option_points_at_its_subcommands_help(
    main: Callable, argv: list[str], prog: str, capsys
) -> None:
    """One line naming the option and the --help of the subcommand it was given to, not the
    top-level usage (#44 item 12)."""
    assert _code(main, argv) == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"{prog}: unrecognized arguments: {argv[-1]} (see {prog} --help)\n"
    )


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("where", ["option", "environment"])
def test_debug_raises_the_user_mistake(
    command: str, where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--debug` (after the command, as any option) or LEMUR_DEBUG=1: the error propagates,
    so that Python prints its traceback."""
    main, argv, error = _mistakes(tmp_path)[command]
    if where == "option":
        argv = [*argv, "--debug"]
    else:
        monkeypatch.setenv("LEMUR_DEBUG", "1")
    with pytest.raises(error):
        main(argv)


def test_debug_before_the_subcommand(tmp_path: Path) -> None:
    from lemur.eval.load import LoadError

    with pytest.raises(LoadError):
        eval_cli.main(["--debug", "bpb", str(tmp_path / "missing"), str(tmp_path)])


def test_debug_shows_the_traceback_of_a_user_mistake() -> None:
    """Through the entry point: a traceback ending in the mistake's own error, exit 1."""
    res = _python(
        "import sys; from lemur.train.cli import main; sys.exit(main(['tiny', '--set', 'steps=x']))",
        env={"LEMUR_DEBUG": "1"},
    )
    assert res.returncode == 1 and "Traceback (most recent call last)" in res.stderr
    assert "ConfigError: config: steps must be an integer, got 'x'" in res.stderr


def test_an_unexpected_valueerror_in_eval_is_a_traceback_not_one_line(tmp_path: Path) -> None:
    """A bug inside lemur-eval (here a ValueError from plotting) is not reported as a user
    mistake: its traceback shows and the exit code is 1."""
    summary = _summary(tmp_path)
    script = (
        "import sys\n"
        "from lemur.eval import agent_report\n"
        "def bug(*args): raise ValueError('operands could not be broadcast together')\n"
        "agent_report.plot = bug\n"
        "from lemur.eval.cli import main\n"
        f"sys.exit(main(['plot', {str(summary)!r}, '--out', {str(tmp_path / 'p.png')!r}]))\n"
    )
    res = _python(script)
    assert res.returncode == 1, res.stderr
    assert "Traceback (most recent call last)" in res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        "ValueError: operands could not be broadcast together"
    )


def _inject(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, command: str, error: BaseException):
    """Make `command` hit `error` in the middle of its work: (main, argv)."""

    def fail(*args: object, **kwargs: object) -> None:
        raise error

    if command == "lemur-data":
        from lemur.data import stats

        monkeypatch.setattr(stats, "compute_stats", fail)
        return data_cli.main, ["stats", str(tmp_path)]
    if command == "lemur-train":
        from lemur.train import config

        monkeypatch.setattr(config, "load_train_config", fail)
        return train_cli.main, ["tiny"]
    if command == "lemur-eval":
        monkeypatch.setattr(agent_report, "plot", fail)
        return eval_cli.main, ["plot", str(_summary(tmp_path)), "--out", str(tmp_path / "p.png")]
    monkeypatch.setattr(convert, "to_hf", fail)
    return convert.main, ["to-hf", str(tmp_path), str(tmp_path / "out")]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_bug_propagates(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    main, argv = _inject(monkeypatch, tmp_path, command, ZeroDivisionError("bug"))
    with pytest.raises(ZeroDivisionError):
        main(argv)


@pytest.mark.parametrize("command", COMMANDS)
def test_ctrl_c_exits_130_with_one_line(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    main, argv = _inject(monkeypatch, tmp_path, command, KeyboardInterrupt())
    assert _code(main, argv) == EXIT_SIGINT
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"{command}: interrupted"), err


def test_sigterm_exits_143_after_cleanup(tmp_path: Path) -> None:
    """SIGTERM in the middle of a write: the temporary file is removed on the way out, one
    line, exit 143 (not a process killed with the half-written file left behind)."""
    out = tmp_path / "chat.jsonl"
    script = (
        "import os, signal, sys, time\n"
        "from lemur.data import chat_demo\n"
        "def write(path, seed, limit):\n"
        "    open(path, 'w').write('half')\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(30)\n"
        "chat_demo.write_chat_demo = write\n"
        "from lemur.data.cli import main\n"
        f"sys.exit(main(['chat-demo-data', {str(out)!r}]))\n"
    )
    res = _python(script)
    assert res.returncode == 143, res.stderr
    assert res.stderr.strip().splitlines() == ["lemur-data: terminated (SIGTERM)"]
    assert list(tmp_path.iterdir()) == []


def test_run_main_reports_die_with_its_code(capsys) -> None:
    from lemur.cli_common import die

    def body() -> int:
        die("stage failed: task 1 lost", 1)

    assert run_main(body, "lemur-x", label="error: ") == 1
    assert capsys.readouterr().err == "lemur-x: error: stage failed: task 1 lost\n"


def test_parse_set() -> None:
    assert parse_set("mix.ratio.code=8") == (["mix", "ratio", "code"], 8)
    assert parse_set("output=") == (["output"], "")
    assert parse_set("name=[unclosed") == (["name"], "[unclosed")
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        parse_set("steps")
