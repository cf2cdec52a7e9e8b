"""Fork safety: an object's own handlers around ``os.fork`` (``os.register_at_fork``), held by a weak reference, so
that registering never keeps an object alive and a handler of an object already gone does nothing.

A forked child has one thread (the one that forked): locks another thread held stay held, threads are gone, and
connections are shared with the parent. Each object that holds such things says what to do (servers fork workers:
gunicorn, multiprocessing, an engine's helpers)."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import TypeVar

__all__ = ["at_fork"]

T = TypeVar("T")


def at_fork(obj: T, *, before: Callable[[T], None] | None = None,
            after_in_parent: Callable[[T], None] | None = None,
            after_in_child: Callable[[T], None] | None = None) -> None:
    """Call ``before(obj)`` before every ``os.fork`` (in the forking thread), ``after_in_parent(obj)`` after it in the
    parent and ``after_in_child(obj)`` in the child, for as long as ``obj`` lives."""
    ref = weakref.ref(obj)

    def bound(handler: Callable[[T], None] | None) -> Callable[[], None] | None:
        if handler is None:
            return None

        def run() -> None:
            target = ref()
            if target is not None:
                handler(target)

        return run

    handlers = {"before": bound(before), "after_in_parent": bound(after_in_parent),
                "after_in_child": bound(after_in_child)}
    os.register_at_fork(**{k: v for k, v in handlers.items() if v is not None})
