"""lemur/progress.py: plain progress lines where no terminal shows bars (#44 item 9, 10)."""

from __future__ import annotations

import io
import re
import time

import pytest

from lemur.progress import (
    Progress,
    eta_seconds,
    format_duration,
    heartbeat,
    progress_interval,
)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0, 45.4, 185, 7380, 370800)] == [
        "0s",
        "45s",
        "3m05s",
        "2h03m",
        "4d07h",
    ]


def test_eta_counts_only_this_runs_work() -> None:
    assert eta_seconds(0, 8, 10.0) is None
    assert eta_seconds(4, 8, 10.0) == 10.0
    # 3 tasks were done by an earlier run: the 1 done now in 10 s sets the rate.
    assert eta_seconds(4, 8, 10.0, done_at_start=3) == 40.0
    assert eta_seconds(8, 8, 10.0) is None


def test_interval_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEMUR_PROGRESS_INTERVAL", "2.5")
    assert progress_interval() == 2.5
    for bad in ("0", "-1", "nan", "x"):
        monkeypatch.setenv("LEMUR_PROGRESS_INTERVAL", bad)
        assert progress_interval() == 30.0


def test_plain_lines_at_a_steady_interval() -> None:
    out = io.StringIO()
    with Progress("lemur-data", interval=0.05, stream=out, terminal=False) as progress:
        progress("tokenize", 0, 4)
        time.sleep(0.2)
        progress("tokenize", 2, 4)
        time.sleep(0.2)
        progress("tokenize", 4, 4)
    lines = out.getvalue().splitlines()
    assert lines[-1] == "lemur-data: tokenize: 4/4 tasks done in 0s"
    ticks = lines[:-1]
    # A line every 0.05 s while it ran 0.4 s (fewer on a busy machine), with an ETA once a
    # task is done.
    assert re.fullmatch(r"lemur-data: tokenize: 0/4 tasks, \d+s elapsed", ticks[0])
    assert re.fullmatch(r"lemur-data: tokenize: 2/4 tasks, \d+s elapsed, ETA \d+s", ticks[-1])


def test_resume_and_already_done_are_said() -> None:
    out = io.StringIO()
    with Progress("lemur-data", interval=60, stream=out, terminal=False) as progress:
        progress("tokenize", 3, 8)
        progress("tokenize", 8, 8)
        progress("dedup buckets", 4, 4)
        progress("dedup cluster", 1, 1)
        progress.note("build done in 3s")
    assert out.getvalue().splitlines() == [
        "lemur-data: tokenize: 3 of 8 tasks already done, resuming",
        "lemur-data: tokenize: 8/8 tasks done in 0s",
        "lemur-data: dedup buckets: all 4 tasks already done",
        "lemur-data: dedup cluster: already done",
        "lemur-data: build done in 3s",
    ]


def test_one_step_stages_print_no_counts() -> None:
    out = io.StringIO()
    with heartbeat(
        "lemur-train plan", "compiling the train step", interval=0.05, stream=out, terminal=False
    ):
        time.sleep(0.12)
    lines = out.getvalue().splitlines()
    assert lines[0] == "lemur-train plan: compiling the train step, 0s elapsed"
    assert lines[-1] == "lemur-train plan: compiling the train step done in 0s"


def test_a_stage_shorter_than_the_interval_prints_nothing() -> None:
    out = io.StringIO()
    with Progress("lemur-data", interval=60, stream=out, terminal=False) as progress:
        progress("list inputs", 0, 1)
        progress("list inputs", 1, 1)
        progress("tokenize", 0, 2)
        progress("tokenize", 2, 2)
    assert out.getvalue() == ""


def test_a_terminal_gets_bars_and_the_resume_note_only() -> None:
    out = io.StringIO()
    with Progress("lemur-data", interval=0.01, stream=out, terminal=True) as progress:
        progress("tokenize", 3, 8)
        time.sleep(0.05)
        progress("tokenize", 8, 8)
    text = out.getvalue()
    assert "tokenize: 3 of 8 tasks already done, resuming" in text
    assert "lemur-data:" not in text  # no plain lines under the bars
