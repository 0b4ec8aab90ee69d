"""C++ names as Kineto writes them (libstdc++'s demangler), without polars: the profile
workers use it, and they are forked from a server that must not have started polars'
threads (a process forked while other threads run inherits their locks, held)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _cxa_demangle():
    path = ctypes.util.find_library("stdc++")
    if path is None:
        return None
    fn = ctypes.CDLL(path).__cxa_demangle
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    return fn


@functools.cache
def demangled(name: str) -> str:
    """`name` as Kineto writes it: libstdc++'s `__cxa_demangle` of a mangled C++ name (`_Z…`,
    as HIP and Triton traces keep them); any other name, or one it cannot demangle (no
    libstdc++ here), unchanged."""
    fn = _cxa_demangle()
    if fn is None or not name.startswith("_Z"):
        return name
    bf16 = "DF16b" in name and "Dn" not in name  # std::bfloat16_t, which libstdc++ before GCC 13 lacks:
    status = ctypes.c_int(0)                     # read as another unsubstituted builtin, named back
    out = fn((name.replace("DF16b", "Dn") if bf16 else name).encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not out:
        return name
    try:
        text = ctypes.string_at(out).decode(errors="replace")
    finally:
        ctypes.CDLL(None).free(ctypes.c_void_p(out))
    return text.replace("decltype(nullptr)", "std::bfloat16_t") if bf16 else text
