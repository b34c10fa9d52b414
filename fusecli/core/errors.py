"""The one exception type the CLI turns into ``error: ...`` and exit code 1."""


class FuseError(Exception):
    """Bad input or an impossible request, with a message a user can act on (one line)."""


class UsageError(FuseError):
    """An option that does not fit the model (a --dim it lacks, --batch and --dim disagreeing): exit 2."""
