"""Stage names of a long analysis (reading, shape inference, backward, liveness, fusion) as a spinner.

The spinner is drawn on stderr, and only when a person is watching: ``sys.stderr.isatty()`` and neither
``CI`` nor ``NO_COLOR`` is set. Everywhere else (pipes, tests, CI logs) nothing is printed and rich is
not even imported. ``stdout`` is never touched, so ``--json`` output stays clean.

``stages(callback)`` makes the reporter for one analysis; code deeper down (the loaders) reports with
the module-level ``stage(name)``, which goes to the active reporter, or nowhere.

With ``FUSECLI_STAGE_TIMES`` set, each stage's duration is printed on stderr when the analysis ends (for
benchmarks: one run, its stages' times; never on stdout).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from .terminal import printable

StageCallback = Callable[[str], None]

_active: ContextVar[StageCallback | None] = ContextVar("fusecli_progress", default=None)


def should_show(stream=None) -> bool:
    """True when progress may be drawn on ``stream`` (stderr): a terminal, not CI, colour not refused."""
    stream = sys.stderr if stream is None else stream
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
    return bool(tty) and not os.environ.get("CI") and not os.environ.get("NO_COLOR")


def stage(name: str) -> None:
    """Report that the analysis has entered stage ``name`` (nothing happens outside ``stages``)."""
    callback = _active.get()
    if callback is not None:
        callback(name)


@contextmanager
def stages(callback: StageCallback | None = None) -> Iterator[StageCallback]:
    """The reporter of one analysis, also made active for ``stage()``: ``callback`` when given, else a
    spinner on stderr when ``should_show()``, else a no-op. Nested uses report to the outer one."""
    outer = _active.get()
    if outer is not None and callback is None:
        yield outer
        return
    if os.environ.get("FUSECLI_STAGE_TIMES"):
        with _timed(callback) as timed, _activated(timed):
            yield timed
        return
    if callback is not None:
        with _activated(callback):
            yield callback
        return
    if not should_show():
        yield _ignore
        return
    with _spinner() as spin, _activated(spin):
        yield spin


def _ignore(name: str) -> None:
    pass


@contextmanager
def _timed(callback: StageCallback | None) -> Iterator[StageCallback]:
    """``callback`` (or nothing), and each stage's duration (wall and this process's CPU seconds) on stderr
    at the end, one line per stage."""
    times: list[list] = []

    def enter(name: str) -> None:
        times.append([name, time.perf_counter(), time.process_time()])
        if callback is not None:
            callback(name)

    try:
        yield enter
    finally:
        end = [None, time.perf_counter(), time.process_time()]
        for (name, start, cpu), nxt in zip(times, [*times[1:], end], strict=True):
            line = f"fusecli stage: {name}: {nxt[1] - start:.3f} s (cpu {nxt[2] - cpu:.3f} s)"
            print(printable(line), file=sys.stderr)


@contextmanager
def _activated(callback: StageCallback) -> Iterator[None]:
    token = _active.set(callback)
    try:
        yield
    finally:
        _active.reset(token)


class _Line:
    """'fusecli: <stage> (time in the stage; in all)', re-rendered on each refresh of the spinner."""

    def __init__(self) -> None:
        self.start = self.since = time.perf_counter()
        self.name = "starting"

    def enter(self, name: str) -> None:
        self.name, self.since = name, time.perf_counter()

    def __rich__(self):
        from rich.text import Text

        now = time.perf_counter()  # a file's name is text, never markup, its control characters escaped
        line = f"fusecli: {self.name} ({now - self.since:.1f} s; {now - self.start:.1f} s in all)"
        return Text(printable(line))


@contextmanager
def _spinner() -> Iterator[StageCallback]:
    """A transient rich spinner on stderr, cleared when the analysis ends."""
    from rich.console import Console
    from rich.status import Status

    line = _Line()
    with Status(line, console=Console(stderr=True), spinner="dots"):
        yield line.enter
