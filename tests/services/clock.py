"""A clock that moves only when a test moves it (for code that takes a ``clock`` callable)."""

from __future__ import annotations


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now
