"""Model strings on a terminal and in generated source: a model file is untrusted input.

A name may hold control characters (an ESC that sets the terminal's title or writes its clipboard, a
NUL, a carriage return that hides what came before), Unicode line separators or bidi overrides.
``printable`` shows each as an escape (``\\x1b``), as ``git`` and ``ls`` do; ``terminal_report`` is
the one way a text report reaches a terminal, colour included; ``source_comment`` makes a model string
safe in a comment or docstring of generated Python (``ascii()`` makes its literals). JSON keeps the
exact string (json escapes it itself).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

# DEL, C1, surrogates, line/paragraph separators, bidi embeddings/overrides/isolates and marks (the
# "Trojan source" characters); with C0 but newline, or with all of C0
_OTHER_UNSAFE = "\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE = re.compile(f"[\x00-\x09\x0b-\x1f{_OTHER_UNSAFE}]")
_UNSAFE_LINE = re.compile(f"[\x00-\x1f{_OTHER_UNSAFE}]")
_SGR = re.compile("\x1b\\[[0-9;]*m")  # what click.style writes


def _escaped(c: int) -> str:
    """One character as Python writes it in a string literal: \\xNN, \\uNNNN or \\UNNNNNNNN."""
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"


def printable(text: str, newlines: bool = True) -> str:
    """``text`` with every control character shown as an escape; newlines kept unless ``newlines=False``."""
    return (_UNSAFE if newlines else _UNSAFE_LINE).sub(lambda m: _escaped(ord(m.group(0))), text)


def dims_line(values: Mapping[str, int]) -> str:
    """'batch=2, seq=128', each dim's name one line with its controls escaped ('' when there are none)."""
    return ", ".join(f"{printable(name, newlines=False)}={v}" for name, v in values.items())


class Style:
    """Colour on or off for a report's own words (never a model string), counting what it writes so that
    ``terminal_report`` can tell its codes from codes a model string carries."""

    def __init__(self, color: bool) -> None:
        self.color = color
        self.codes = 0

    def __call__(self, text: str, **kw) -> str:
        if not self.color:
            return text
        import click

        styled = click.style(text, **kw)
        self.codes += len(_SGR.findall(styled))
        return styled


def terminal_report(build: Callable[[Style], str], color: bool = False) -> str:
    """The text ``build(style)`` makes, as it may reach a terminal: control characters escaped. With
    colour on, the text keeps its codes only when every control character in it is one of the style's
    own codes; when a model string brought codes of its own, it is built again without colour, escaped."""
    style = Style(color)
    text = build(style)
    if not color:
        return printable(text)
    if len(_SGR.findall(text)) == style.codes and not _UNSAFE.search(_SGR.sub("", text)):
        return text
    return printable(build(Style(False)))


def source_comment(text: str) -> str:
    """A model string for a comment or docstring of generated Python: printable ASCII only, quotes and
    backslashes escaped too, so it can end no comment, string or line (``ascii()`` is for literals)."""
    return "".join(ch if " " <= ch <= "~" and ch not in "\"'\\" else _escaped(ord(ch)) for ch in text)
