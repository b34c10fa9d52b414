"""Writing output files safely: to a temporary file beside the target, renamed into place when done."""

from __future__ import annotations

import contextlib
import os
import tempfile

from .errors import FuseError


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "wb"):
    """Yield a file object; on success it replaces ``path`` whole, on any error nothing is left behind."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FuseError(f"{path}: the folder {folder} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=".fusecli-", suffix=".part", dir=folder)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; outputs get the usual permissions
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def refuse_overwriting_input(output: str, inputs: list[str]) -> None:
    """Never write over the model being read."""
    for i in inputs:
        if os.path.exists(output) and os.path.exists(i) and os.path.samefile(output, i):
            raise FuseError(f"{output}: refusing to overwrite the input model")
