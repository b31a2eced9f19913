"""What the daemon's signals ask of its main loop (SIGTERM and SIGINT stop it, SIGHUP
reloads the config), with no lock taken in a handler. A Python handler runs in the main
thread between two bytecodes, wherever that thread is: one that set a threading.Event
while the loop was inside that Event's wait deadlocked on the Event's own lock (a clean-
clone CI run on 2026-12-05; py-spy showed Event.set under Condition.wait), and systemd
would then have killed the daemon without its restore-on-exit. So the handlers only set
flags, and the loop sleeps in select() on the pipe that signal.set_wakeup_fd writes to,
which a signal wakes at once."""
from __future__ import annotations

import os
import select
import signal


class Signals:
    def __init__(self) -> None:
        self.stop = False
        self.reload = False
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._installed = False

    def install(self) -> None:
        """From the main thread, before the daemon says READY=1."""
        signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_reload)
        self._installed = True

    def _on_stop(self, *_) -> None:
        self.stop = True

    def _on_reload(self, *_) -> None:
        self.reload = True

    def sleep(self, seconds: float) -> None:
        """Up to `seconds`; sooner when a signal arrives (its handler has run on return)."""
        if self.stop:
            return
        select.select([self._read], [], [], max(seconds, 0.0))
        self._drain()

    def _drain(self) -> None:
        try:
            while os.read(self._read, 64):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        if self._installed:
            signal.set_wakeup_fd(-1)
            self._installed = False
        for fd in (self._read, self._write):
            if fd >= 0:
                os.close(fd)
        self._read = self._write = -1
