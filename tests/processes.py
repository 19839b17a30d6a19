"""Child processes for the tests that race real processes against each other."""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import BaseContext

__all__ = ["preloaded_context"]


def preloaded_context(*modules: str) -> BaseContext:
    """A forkserver context whose server imports `modules` once; each child is a fork of that
    server. The children share none of the test process's threads or connections (as with
    spawn), without each spending a second or two importing the project again.

    The preload counts only for the first call in a test run (the server is started once); a
    later call's children import what they need themselves, which is slower, not wrong.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(modules))
    return context
