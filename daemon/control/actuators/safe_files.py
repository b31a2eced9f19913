"""Reads the files a root daemon is pointed at (settings, pid and token files)
without trusting them: never through a symbolic link, never a device or a FIFO,
never more than a cap; a token's contents never appear in a message. Replaces
a file it owns in one atomic step that keeps the file's mode and owner."""
from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile

from daemon.control.actuators import ActuatorError

TOKEN_MAX_BYTES = 4096
NEW_FILE_MODE = 0o644


def read_regular(path: str, what: str, limit: int) -> tuple[bytes, os.stat_result]:
    """The contents and status of the regular file at path, read from one open file.
    A missing file raises FileNotFoundError (the caller knows what that means); a
    symbolic link, anything but a regular file, or more than limit bytes, ActuatorError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ActuatorError(f"{what} {path} is a symbolic link; slotune runs as root and opens no links: "
                                "name the file itself", unreachable=False) from None
        raise ActuatorError(f"cannot read {what} {path}: {exc.strerror}", unreachable=False) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ActuatorError(f"{what} {path} is not a regular file; name a plain file", unreachable=False)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise ActuatorError(f"{what} {path} is larger than {limit} bytes", unreachable=False)
        return b"".join(chunks), st
    except OSError as exc:
        raise ActuatorError(f"cannot read {what} {path}: {exc.strerror}", unreachable=False) from None
    finally:
        os.close(fd)


def read_token(path: str) -> str:
    """The bearer token in path: one line of visible ASCII in a regular file that only
    its owner can write. A missing file is unreachable (the service may not have made it yet)."""
    try:
        data, st = read_regular(path, "token file", TOKEN_MAX_BYTES)
    except FileNotFoundError:
        raise ActuatorError(f"token file {path} does not exist (yet)") from None
    writers = [who for who, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if st.st_mode & bit]
    if writers:
        raise ActuatorError(f"token file {path} is writable by {' and '.join(writers)} "
                            f"(mode {stat.S_IMODE(st.st_mode):04o}); chmod go-w {path}", unreachable=False)
    token = data.strip()
    lines = token.splitlines()
    if len(lines) != 1:
        raise ActuatorError(f"token file {path} holds {len(lines)} lines; it must hold exactly one line, the token",
                            unreachable=False)
    if not all(0x21 <= c <= 0x7e for c in token):
        raise ActuatorError(f"token file {path} holds a character that cannot go in an HTTP header "
                            "(a token is visible ASCII, no spaces)", unreachable=False)
    return token.decode("ascii")


def replace_file(path: str, data: bytes, st: os.stat_result | None, what: str) -> None:
    """Replace the file at path with data, with the owner and mode st had (a new file: root's, 0644):
    a temporary file beside it, fsynced, renamed over it (a link there is replaced, never followed),
    then the folder fsynced. On failure nothing changes and ActuatorError says why."""
    folder, tmp = os.path.dirname(os.path.abspath(path)), ""
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.")
        with os.fdopen(fd, "wb") as f:
            if st is not None:
                os.fchown(f.fileno(), st.st_uid, st.st_gid)
            os.fchmod(f.fileno(), stat.S_IMODE(st.st_mode) if st is not None else NEW_FILE_MODE)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        if tmp:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise ActuatorError(f"cannot write {what} {path}: {exc.strerror}", unreachable=False) from None
