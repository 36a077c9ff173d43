"""Native decoders that print to file descriptor 2 (DALI's logger and its bundled libjpeg-turbo,
libtiff inside Pillow): their lines are caught and turned into per-sample warnings or errors, so
nothing gpupipe runs reaches stderr."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from typing import Callable, Optional

_lock = threading.RLock()  # re-entrant: a nested block captures into its own file, then hands on what it did not claim


@contextlib.contextmanager
def captured(is_decoder_message: Callable[[str], bool], is_fragment: Optional[Callable[[str], bool]] = None):
    """Runs the block with descriptor 2 redirected to a temporary file. Yields a list that holds,
    after the block, the lines ``is_decoder_message`` claims; anything else written meanwhile (by
    other threads) is passed on to what descriptor 2 was: the real stderr, or an enclosing block's file.
    ``is_fragment``: once one line is claimed, the lines it calls fragments are too (a library
    whose threads print at once interleaves its lines into pieces no pattern recognises)."""
    found: list = []
    with _lock, tempfile.TemporaryFile() as tmp:
        if sys.stderr is not None:  # (None in a process started without one: pythonw, a daemon)
            sys.stderr.flush()
        try:
            saved = os.dup(2)
        except OSError:  # descriptor 2 is closed (2>&-): nothing to keep from it, nothing to hand on
            yield found
            return
        os.dup2(tmp.fileno(), 2)
        try:
            yield found
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            others = []
            for line in tmp.read().decode(errors="replace").splitlines(keepends=True):
                if is_decoder_message(line):
                    found.append(line.strip())
                else:
                    others.append(line)
            if is_fragment is not None and found and others:
                found += [line.strip() for line in others if is_fragment(line)]
                others = [line for line in others if not is_fragment(line)]
            if others:
                with contextlib.suppress(OSError):  # (closed meanwhile: the lines had nowhere to go)
                    os.write(2, "".join(others).encode())
