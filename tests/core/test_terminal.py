"""core/terminal.py: control characters shown as escapes, colour kept only when every code is the report's
own, and model strings in generated source that can end no comment, string or line."""

from __future__ import annotations

import ast
import re

import pytest

from fusecli.core.terminal import Style, printable, source_comment, terminal_report

CONTROLS = [chr(c) for c in (*range(0x20), 0x7f, *range(0x80, 0xa0))] + ["\u2028", "\u2029", "\u202e",
                                                                          "\u2066"]


@pytest.mark.parametrize("ch", CONTROLS)
def test_every_control_character_is_an_escape(ch):
    shown = printable(f"a{ch}b", newlines=ch == "\n")
    if ch == "\n":
        assert shown == "a\nb"
    else:
        assert ch not in shown and shown.isascii() and shown.isprintable()
        assert shown == "a" + (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}") + "b"


def test_printable_text_is_unchanged():
    text = "model.layers.0/self_attn/MatMul_1 [batch, seq] … µ 日本"
    assert printable(text) == text


def test_colour_is_kept_for_the_reports_own_codes_only():
    def report(name):
        return lambda style: f"{style('training-safe', fg='green')} for {name}"

    assert terminal_report(report("layers.0"), color=True) == "\x1b[32mtraining-safe\x1b[0m for layers.0"
    assert terminal_report(report("layers.0"), color=False) == "training-safe for layers.0"
    for name in ("mm\x1b[31m", "mm\x1b]0;PWNED\x07", "mm\x1b[0m\x1b[32m"):  # a model's own codes
        shown = terminal_report(report(name), color=True)
        assert "\x1b" not in shown and shown.startswith("training-safe for mm\\x1b")


def test_style_counts_its_codes():
    style = Style(True)
    style("a", fg="red", bold=True)
    assert style.codes == 3  # bold, red, reset
    assert Style(False)("a", fg="red") == "a"


HOSTILE = ['"""', "'''", "\\", "\\N{", "a\nb", "\x00", "\u2028", "\U0001f600", "#", "\r"]


@pytest.mark.parametrize("text", HOSTILE)
def test_source_comment_ends_nothing(text):
    shown = source_comment(text)
    bare = re.sub(r"\\(x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})", "", shown)  # what is left but escapes
    assert shown.isascii() and shown.isprintable() and not set("\"'\\") & set(bare)
    source = f'"""{shown}"""\n# {shown}\nX = 1\n'
    tree = ast.parse(source)
    assert [type(n) for n in tree.body] == [ast.Expr, ast.Assign]  # one docstring, one assignment, no more
