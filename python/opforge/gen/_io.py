"""Small helpers shared by the generators: the output directory, writing
files only when their content changes, and progress lines on stderr.

    >>> write_if_changed("out/ns_ops.cc", text)   # first run
    True
    >>> write_if_changed("out/ns_ops.cc", text)   # same text: file untouched
    False
"""

from __future__ import annotations

import os
import sys
import tempfile

from ._aten import GenError


def ensure_directory(path: str, option: str, create: bool = True) -> None:
    """Creates directory `path` (and its parents) unless it exists; raises
    GenError naming `option` (e.g. "--out") when it cannot be one, such as
    when `path` is an existing file. `create=False` only checks that."""
    if os.path.isdir(path):
        return
    if os.path.exists(path):
        raise GenError(f"{option} {path}: is a file, not a directory; pass a directory (it is created if missing).")
    if not create:
        return
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise GenError(f"{option} {path}: cannot create the directory ({_reason(e)}); pass a directory that "
                       "can be created or written.") from None


def _reason(e: OSError) -> str:
    """'Not a directory: out/x' for an OSError about another path than the one named."""
    return f"{e.strerror}: {e.filename}" if e.filename else (e.strerror or str(e))


def write_if_changed(path: str, text: str) -> bool:
    """Writes `text` to `path` unless the file already holds exactly it.

    Leaving an identical file alone keeps its mtime, so a rebuild after an
    identical regeneration has nothing to do. Returns True if it wrote.
    Raises GenError naming `path` when it cannot be read or written.
    """
    try:
        return _write_if_changed(path, text.encode("utf-8"))
    except OSError as e:
        raise GenError(f"cannot write {path} ({_reason(e)}); make its directory a writable directory, or pass "
                       "another one.") from None


def _write_if_changed(path: str, data: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return False
    except FileNotFoundError:
        pass
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    # Write then rename, so an interrupted run never leaves half a file that
    # a later run would take as up to date.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        # mkstemp creates 0600; give the file the mode open() would have.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class Progress:
    """Progress lines on stderr, e.g. `[120/713] generating myaten::add`.

    Long loops print at most about `lines` lines, so a 700-op run stays
    readable; `quiet=True` prints nothing.
    """

    def __init__(self, quiet: bool = False, stream=None, lines: int = 20):
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stderr
        self.lines = max(1, lines)

    def say(self, message: str) -> None:
        if not self.quiet:
            print(message, file=self.stream, flush=True)

    def step(self, index: int, total: int, message: str) -> None:
        """Prints `[index/total] message` for the first, the last and every
        total/lines-th step."""
        if self.quiet:
            return
        every = max(1, total // self.lines)
        if index == 1 or index == total or index % every == 0:
            width = len(str(total))
            print(f"[{index:>{width}}/{total}] {message}", file=self.stream, flush=True)
