"""Arrays seen through their addresses in compiled code: a table of pointers instead of a list of arrays.

A numba typed list of array tuples is convenient, but every read of an item
copies the tuple and counts a reference for each of its arrays (an atomic
update of a meminfo that is, more often than not, out of cache: about 0.2 us
per item of some thirty arrays, measured). A scan that visits each segment for
each query term, as :func:`gpuir.backends.cpu_segments.union_row` does, would
spend more on reference counts than on postings. Here each segment's arrays are
given by their addresses and lengths in a row of an int64 table, and compiled
code rebuilds an array from an address with :func:`numba.carray` (no meminfo,
no reference count: a view the caller keeps alive).

The caller owns the lifetime: whatever holds the arrays (for the memory's
search, the snapshot's typed list of segments, from which
:func:`gpuir.backends.cpu_segments.pointer_rows` reads the addresses) must
outlive every compiled call that reads them; :func:`check_dtypes` checks that
they have the dtypes they will be read as.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .cpu_kernels import JIT


def _pointer_to(dtype):
    @intrinsic
    def ptr(typingctx, addr):
        sig = types.CPointer(dtype)(types.int64)

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

        return sig, codegen

    return ptr


_p_i64 = _pointer_to(types.int64)
_p_i32 = _pointer_to(types.int32)
_p_f32 = _pointer_to(types.float32)
_p_f64 = _pointer_to(types.float64)
_p_u8 = _pointer_to(types.uint8)


@njit(**JIT)
def i64(addr, n):
    """(n,) int64 at ``addr``."""
    return carray(_p_i64(addr), n)


@njit(**JIT)
def i32(addr, n):
    """(n,) int32 at ``addr``."""
    return carray(_p_i32(addr), n)


@njit(**JIT)
def f32(addr, n):
    """(n,) float32 at ``addr``."""
    return carray(_p_f32(addr), n)


@njit(**JIT)
def f64(addr, n):
    """(n,) float64 at ``addr``."""
    return carray(_p_f64(addr), n)


@njit(**JIT)
def u8(addr, n):
    """(n,) uint8 at ``addr`` (a bool array's bytes)."""
    return carray(_p_u8(addr), n)


_KIND = {np.dtype(np.int64): "i8", np.dtype(np.int32): "i4", np.dtype(np.float32): "f4", np.dtype(np.float64): "f8",
         np.dtype(np.bool_): "b1", np.dtype(np.uint8): "b1"}


def check_dtypes(arrays: dict, columns) -> None:
    """Raise TypeError unless each ``arrays[name]`` is a C-contiguous array of its column's dtype (bool
    and uint8 alike: both are read as bytes), for ``(name, dtype)`` in ``columns``."""
    for name, dt in columns:
        a = arrays[name]
        if _KIND.get(a.dtype) != _KIND[np.dtype(dt)] or not a.flags.c_contiguous:
            raise TypeError(f"{name}: need a C-contiguous {np.dtype(dt)} array, got {a.dtype} "
                            f"(contiguous: {a.flags.c_contiguous})")


@intrinsic
def prefetch(typingctx, addr):
    """Ask the CPU to bring the cache line at ``addr`` (int64) in, for reading (``llvm.prefetch``)."""
    sig = types.void(types.int64)

    def codegen(context, builder, signature, args):
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        # (read, keep in every cache level, data): a hint, never a fault
        builder.call(fn, [builder.inttoptr(args[0], i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen
