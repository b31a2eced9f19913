"""Reads the files a root daemon is pointed at for a service (settings, nginx
include, pid and token files) without trusting them: never through a symbolic
link, never a device or a FIFO, never more than a cap; a token's contents never
appear in a message. Replaces a file it owns in one atomic step that keeps the
file's mode and owner, and sets aside a file of its own that it cannot read.

No link is followed in ANY component of such a path, not only the last: a
service's user who owns a folder on the way could otherwise point it at another
service's file. The path is opened with openat2(2) and RESOLVE_NO_SYMLINKS (Linux
5.6; through ctypes, as Python has no wrapper), or where the kernel or a seccomp
filter refuses that call, by a walk from / that opens one component at a time
with O_NOFOLLOW inside the folder before it. A link the distribution made
(/var/run -> /run) is refused the same way: the message names the real path. A
write holds its folder open: the temporary file is made, and renamed over the
old one, inside that folder's descriptor, so a folder swapped for a link after
the check cannot redirect it."""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import stat
import time

from slotune.model.errors import ActuatorError

TOKEN_MAX_BYTES = 4096
NEW_FILE_MODE = 0o644
AT_FDCWD = -100
RESOLVE_NO_SYMLINKS = 0x04
# openat2's number is the same on every architecture's table (new calls share numbers since 5.1);
# None: walk the path instead (set after the kernel or a seccomp filter refused the call).
OPENAT2 = 437 if platform.machine() in ("x86_64", "aarch64") else None
_libc = ctypes.CDLL(None, use_errno=True)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def open_no_links(path: str, flags: int) -> int:
    """A descriptor on path (made absolute) opened with flags, no component of it a
    symbolic link; OSError ELOOP when one is, as os.open raises its other errors."""
    global OPENAT2
    path = os.path.abspath(path)
    if OPENAT2 is not None:
        try:
            return _openat2(path, flags | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EPERM):   # EPERM: a seccomp filter older than openat2
                raise
            OPENAT2 = None
    return _walk(path, flags | os.O_CLOEXEC)


def _openat2(path: str, flags: int) -> int:
    how = _OpenHow(flags, 0, RESOLVE_NO_SYMLINKS)
    assert OPENAT2 is not None     # open_no_links calls it only where the syscall has a number
    fd = _libc.syscall(ctypes.c_long(OPENAT2), ctypes.c_int(AT_FDCWD), os.fsencode(path), ctypes.byref(how),
                       ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return fd


def _walk(path: str, flags: int) -> int:
    """openat2's resolution by hand: each folder opened (O_PATH, O_NOFOLLOW) inside the one before."""
    *folders, name = path.split("/")[1:]
    folder = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in folders:
            inner = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
            os.close(folder)
            folder = inner
            _require_folder(os.fstat(folder).st_mode, path)
        try:
            return os.open(name or ".", flags | os.O_NOFOLLOW, dir_fd=folder)
        except NotADirectoryError:         # O_DIRECTORY on a link says ENOTDIR, openat2 ELOOP
            _require_folder(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode, path)
            raise
    finally:
        os.close(folder)


def _require_folder(mode: int, path: str) -> None:
    if not stat.S_ISDIR(mode):
        code = errno.ELOOP if stat.S_ISLNK(mode) else errno.ENOTDIR
        raise OSError(code, os.strerror(code), path)


def _refusal(exc: OSError, what: str, path: str, doing: str) -> ActuatorError:
    """What an OSError opening path means to the user: a link on the way names the real path."""
    if exc.errno == errno.ELOOP:
        return ActuatorError(f"{what} {path}: {_first_link(path)} is a symbolic link; slotune runs as root and "
                             "follows no link on the way to a file (a service's user could point one at another "
                             f"service's file): name the real path, {os.path.realpath(path)}", unreachable=False)
    return ActuatorError(f"cannot {doing} {what} {path}: {exc.strerror}", unreachable=False)


def _first_link(path: str) -> str:
    """The first component of path that is a symbolic link (for a message: it may have changed since)."""
    at = "/"
    for part in os.path.abspath(path).split("/")[1:]:
        at = os.path.join(at, part)
        if os.path.islink(at):
            return at
    return path


def read_regular(path: str, what: str, limit: int) -> tuple[bytes, os.stat_result]:
    """The contents and status of the regular file at path, read from one open file.
    A missing file raises FileNotFoundError (the caller knows what that means); a
    symbolic link anywhere on the path, anything but a regular file, or more than
    limit bytes, ActuatorError."""
    try:
        fd = open_no_links(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise _refusal(exc, what, path, "read") from None
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
    then the folder fsynced, all inside the folder opened once with no link on its path.
    On failure nothing changes and ActuatorError says why."""
    path = os.path.abspath(path)
    try:
        folder = open_no_links(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise _refusal(exc, what, path, "write") from None
    try:
        _replace_in(folder, os.path.basename(path), data, st)
    except OSError as exc:
        raise ActuatorError(f"cannot write {what} {path}: {exc.strerror}", unreachable=False) from None
    finally:
        os.close(folder)


def _replace_in(folder: int, name: str, data: bytes, st: os.stat_result | None) -> None:
    tmp = f".{name}.{os.urandom(6).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), stat.S_IMODE(st.st_mode) if st is not None else NEW_FILE_MODE)
            if st is not None:   # the owner last: root sets the mode of its own file, needing no CAP_FOWNER
                os.fchown(f.fileno(), st.st_uid, st.st_gid)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=folder)
        raise
    os.fsync(folder)


def set_aside(path: str | os.PathLike, companions: tuple[str, ...] = ()) -> str:
    """Rename a file of the daemon's own that cannot be read to <name>.corrupt-<UTC time> beside
    it (never deleted, never over an earlier one), with each path+suffix in companions that exists
    (SQLite's -wal) renamed to match; the new path. OSError when it cannot be renamed."""
    path = os.fspath(path)
    aside = base = f"{path}.corrupt-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    n = 0
    while any(os.path.lexists(aside + suffix) for suffix in ("", *companions)):
        n += 1
        aside = f"{base}.{n}"
    os.rename(path, aside)
    for suffix in companions:
        with contextlib.suppress(FileNotFoundError):
            os.rename(path + suffix, aside + suffix)
    return aside
