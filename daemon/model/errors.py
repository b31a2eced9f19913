"""Errors that cross layers: a settings surface, an API or a file refused a
change or did not answer."""
from __future__ import annotations


class ActuatorError(RuntimeError):
    """unreachable: the surface did not answer (back off and retry); else it refused the change."""

    def __init__(self, message: str, unreachable: bool = True):
        super().__init__(message)
        self.unreachable = unreachable
