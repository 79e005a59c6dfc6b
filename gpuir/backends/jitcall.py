"""Calling a compiled (Numba) function without its dispatcher's per-call type resolution.

A Numba dispatcher types every argument of every call to pick the compiled
version to run. For arrays and numbers that is quick; for a typed list of tuples
of arrays (a memory's segments, :mod:`gpuir.memory.segscan`) the type is a tree
of some fifty array types, hashed afresh on each call: about 70 microseconds,
as much as a whole question's scoring over a small memory. A caller whose
arguments keep their types from call to call (the same containers, arrays made
the same way) types them once with :func:`entry_point` and calls the compiled
version directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def signature_of(args: Sequence[Any]) -> tuple:
    """The Numba argument types of ``args`` (what a dispatcher would resolve)."""
    from numba import typeof
    from numba.core.typing.typeof import Purpose

    return tuple(typeof(a, Purpose.argument) for a in args)


def entry_point(dispatcher, args: Sequence[Any]) -> Callable[..., Any]:
    """The compiled version of ``dispatcher`` for the types of ``args`` (compiled, or loaded from Numba's
    cache, if need be), to be called with arguments of exactly these types.

    Calling it with arguments of other types is undefined: the caller guarantees they do not change
    (a test should compare :func:`signature_of` of every kind of call it makes). Anything else than a
    Numba dispatcher (a test's stand-in) is returned as it is.
    """
    if not hasattr(dispatcher, "compile") or not hasattr(dispatcher, "overloads"):
        return dispatcher
    return dispatcher.compile(signature_of(args))


__all__ = ["entry_point", "signature_of"]
