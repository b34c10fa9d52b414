"""The one exception type the CLI turns into ``error: ...`` and exit code 1."""


class FuseError(Exception):
    """Bad input or an impossible request, with a message a user can act on (one line)."""


class UsageError(FuseError):
    """An option that does not fit the model (a --dim it lacks, --batch and --dim disagreeing): exit 2."""


class OverBudget(FuseError):
    """A size over one of ``core.budgets``' budgets: the whole command is refused, never one match."""


def one_line(text: object, limit: int | None = None) -> str:
    """``text`` as one line: every run of whitespace (newlines too) one space; cut at ``limit`` characters
    with '...'. A library's message may hold its own newlines (onnxruntime quotes node names whole)."""
    line = " ".join(str(text).split())
    return line if limit is None or len(line) <= limit else line[:limit - 3].rstrip() + "..."


def error_text(e: BaseException, limit: int | None = 300) -> str:
    """An exception's message as one line (its type's name when it has none)."""
    return one_line(e, limit) or type(e).__name__
