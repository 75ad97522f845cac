"""Small helpers shared by the generators: writing files only when their
content changes, and progress lines on stderr.

    >>> write_if_changed("out/ns_ops.cc", text)   # first run
    True
    >>> write_if_changed("out/ns_ops.cc", text)   # same text: file untouched
    False
"""

from __future__ import annotations

import os
import sys
import tempfile


def write_if_changed(path: str, text: str) -> bool:
    """Writes `text` to `path` unless the file already holds exactly it.

    Leaving an identical file alone keeps its mtime, so a rebuild after an
    identical regeneration has nothing to do. Returns True if it wrote.
    """
    data = text.encode("utf-8")
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
