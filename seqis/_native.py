"""The CPU's fused passes (seqis/_native.c): compiled once per machine with the system's C compiler and loaded
with ctypes; a call shares its rows among torch's own intra-op threads (the OpenMP runtime torch loaded).

Why: on the CPU a chain of torch operations over (B, T) tensors makes a pass per operation, and Ratios.of's chain
(clean, mask, subtract, expm1, subtract, three sums) cost three times a one-pass floor, expm1 alone (through
numpy: torch's takes a slow VML path on many CPUs) on one thread. The C file does the chain per element, in one
pass, on every thread, with the same bits on any x86-64 CPU and any thread count (its header says how).

Where there is no C compiler, the library cannot be built, the tensors are not CPU float32 / float64 alike, inside
`disabled()`, or with SEQIS_NATIVE=0, the callers take their torch forms (the tests run both; `status()` says
which and why). The library lives in the user's cache (`cache_dir()`), named by a digest of the sources, the
flags and the compiler, so a changed source is compiled anew; the first call on a machine pays the compile (a few
seconds; `make venv` does it beforehand). Nothing from a batch reaches the compiler.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("_native.c")
SOURCES = (SOURCE, SOURCE.with_name("_native_width.h"), SOURCE.with_name("_native_body.h"))  # it includes them
FLAGS = ["-O3", "-std=gnu11", "-fPIC", "-shared", "-ffp-contract=off", "-fno-trapping-math",
         "-fno-math-errno", "-Wno-psabi"]
MIN_PARALLEL = 1 << 15  # elements per thread below which one thread does the rows (as torch's grain)
SUFFIX = {torch.float32: "float", torch.float64: "double"}

_I64, _P, _D, _N = ctypes.c_int64, ctypes.c_void_p, ctypes.c_double, ctypes.c_int
SIGNATURES = {  # function -> argument types (every function returns void; the last is the thread count)
    "ratios": [_I64, _I64, _P, _I64, _P, _I64, _P, _I64, _P, _I64, _P, _I64, _P, _P, _P, _P, _P, _P, _P, _D, _N],
    "k3": [_I64, _I64, _P, _I64, _P, _I64, _P, _N],
    "kept": [_I64, _I64, _P, _I64, _P, _I64, _P, _I64, _P, _P, _N],
    "dot": [_I64, _I64, _P, _I64, _P, _I64, _P, _N],
}


def cache_dir() -> Path:
    """Where the compiled library is kept: SEQIS_CACHE_DIR, else $XDG_CACHE_HOME/seqis or ~/.cache/seqis."""
    if os.environ.get("SEQIS_CACHE_DIR"):
        return Path(os.environ["SEQIS_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "seqis"


def _compiler() -> tuple[str, str] | None:
    """(the C compiler's path, its version line), or None."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        return None
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return cc, (version.splitlines() or [""])[0]


def _build(cc: str, target: Path) -> None:
    """Compiles SOURCE into target, atomically (a process that loses the race loads the winner's file)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        subprocess.run([cc, *FLAGS, "-o", tmp, str(SOURCE), "-lm"], check=True, capture_output=True, timeout=300)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


_why_off = ""  # why lib() is None, for status()
_widest = 0  # the widest register width (in floats) this CPU runs the passes at
_parallel = False  # whether rows run on torch's OpenMP threads (else on the calling thread)


@cache
def lib() -> ctypes.CDLL | None:
    """The compiled library (built on first use), or None where it cannot be had (see the module docstring)."""
    global _why_off
    if os.environ.get("SEQIS_NATIVE", "1") == "0":
        _why_off = "SEQIS_NATIVE=0"
        return None
    found = _compiler()
    if found is None:
        _why_off = "no C compiler"
        return None
    cc, version = found
    digest = hashlib.sha256("\0".join([*(f.read_text() for f in SOURCES), *FLAGS, version, platform.machine()])
                            .encode()).hexdigest()[:16]
    target = cache_dir() / f"native-{digest}.so"
    try:
        if not target.exists():
            _build(cc, target)
        native = ctypes.CDLL(str(target))
    except subprocess.CalledProcessError as e:
        _why_off = f"{cc} failed: {e.stderr.decode(errors='replace').strip()[-300:]}"
        return None
    except (OSError, subprocess.SubprocessError) as e:
        _why_off = f"{type(e).__name__}: {e}"
        return None
    for name, args in SIGNATURES.items():
        for suffix in SUFFIX.values():
            fn = getattr(native, f"seqis_{name}_{suffix}")
            fn.argtypes, fn.restype = args, None
    native.seqis_set_width.argtypes, native.seqis_set_width.restype = [ctypes.c_int], ctypes.c_int
    global _widest, _parallel
    _widest = native.seqis_set_width(0)
    native.seqis_set_parallel.argtypes, native.seqis_set_parallel.restype = [_P, _P, _P], None
    entries = _openmp()
    native.seqis_set_parallel(*(entries or (None, None, None)))
    _parallel = entries is not None
    return native


OPENMP_ENTRIES = ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads")


def _openmp() -> tuple[int, int, int] | None:
    """The addresses of OPENMP_ENTRIES in the OpenMP runtime torch runs its own operations on (GNU's libgomp, or
    Intel's and LLVM's, which answer to GNU's entry points too), found among the libraries this process has loaded:
    the C side's rows then run on torch's intra-op threads. None where there is none (the calling thread does all)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    names = ("libgomp", "libiomp", "libomp")
    paths = sorted({line.split()[-1] for line in maps.splitlines()
                    if "/" in line and any(n in line.rsplit("/", 1)[-1] for n in names)})
    for path in paths:
        try:
            runtime = ctypes.CDLL(path)
            return tuple(ctypes.cast(getattr(runtime, e), ctypes.c_void_p).value for e in OPENMP_ENTRIES)
        except (OSError, AttributeError):
            continue
    return None


def set_width(w: int) -> int:
    """Runs the passes at register width w (floats: 16 AVX-512, 8 AVX2, 4 SSE2; 0: the widest this CPU runs) and
    returns it, or 0 (nothing changed) where the CPU does not run it: tests hold the widths to each other's bits."""
    return lib().seqis_set_width(w)


def status() -> str:
    """One line for a benchmark's header: whether the fused passes run, and with what."""
    if lib() is None:
        return f"native passes: off, torch forms ({_why_off})"
    names = {16: "AVX-512", 8: "AVX2", 4: "SSE2"}
    w = _widest
    if not worth_it():
        return f"native passes: off, torch forms (the CPU runs {names.get(w, w)} only: the torch forms are faster)"
    threads = "torch's OpenMP threads" if _parallel else "one thread"
    return f"native passes: on, {names.get(w, w)}, {threads} ({_compiler()[1]})"


_enabled = True


@contextmanager
def disabled() -> Iterator[None]:
    """Within it the callers take their torch forms (tests run both; a benchmark compares them)."""
    global _enabled
    was, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = was


def worth_it() -> bool:
    """Whether the passes beat the torch forms here: the library is there and runs at least AVX2's width (at SSE2's,
    the only one of a CPU without AVX2 and of every other architecture, they take ~1.2x the torch forms' time)."""
    return lib() is not None and _widest >= 8


def usable(*xs: torch.Tensor, mask: torch.Tensor | None = None) -> bool:
    """Whether the fused passes take these (B, T) tensors: they are worth it here, and the tensors are CPU tensors
    of one dtype, float32 or float64, with a contiguous last dimension (and the mask, when given, a bool one alike)."""
    rows = (*xs, mask) if mask is not None else xs
    return (_enabled and xs[0].dtype in SUFFIX and all(x.dtype == xs[0].dtype for x in xs)
            and (mask is None or mask.dtype == torch.bool)
            and all(x.device.type == "cpu" and x.dim() == 2 and x.stride(-1) == 1 for x in rows)
            and worth_it())


def _threads(B: int, T: int) -> int:
    """torch's intra-op thread count, fewer for a small batch (the C side shares rows among them)."""
    return max(1, min(torch.get_num_threads(), B, B * T // MIN_PARALLEL))


def _at(x: torch.Tensor | None) -> int | None:
    """A tensor's address (None for None: an output not asked for)."""
    return None if x is None else x.data_ptr()


def _stride(x: torch.Tensor | None) -> int:
    return 0 if x is None else x.stride(0)


def ratios(tl: torch.Tensor, il: torch.Tensor, mask: torch.Tensor, l: torch.Tensor, k3: torch.Tensor | None,
           sums: tuple[torch.Tensor, ...], rho2: torch.Tensor | None, cap: float) -> None:
    """Ratios.of's pass (seqis/_native.c, RATIOS, states the formula): writes l (B, T), k3 (B, T) when given, and
    the (B,) sums = (length, seq, logp_sum, k3_sum, row_max, row_min) and rho2 when given. Outputs contiguous."""
    B, T = mask.shape
    fn = getattr(lib(), f"seqis_ratios_{SUFFIX[l.dtype]}")
    m = mask.view(torch.uint8)
    fn(B, T, tl.data_ptr(), tl.stride(0), il.data_ptr(), il.stride(0), m.data_ptr(), m.stride(0), l.data_ptr(),
       l.stride(0), _at(k3), _stride(k3), *(s.data_ptr() for s in sums), _at(rho2), cap, _threads(B, T))


def k3_tokens(l: torch.Tensor, tokens: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
    """k3 = expm1(l) - l per token (a new (B, T) tensor; None with tokens=False: the sums alone) and its (B,) row
    sums, for finite log-ratios l."""
    B, T = l.shape
    k3, sums = torch.empty_like(l, memory_format=torch.contiguous_format) if tokens else None, l.new_empty(B)
    fn = getattr(lib(), f"seqis_k3_{SUFFIX[l.dtype]}")
    fn(B, T, l.data_ptr(), l.stride(0), _at(k3), _stride(k3), sums.data_ptr(), _threads(B, T))
    return k3, sums


def kept_sums(l: torch.Tensor, tl: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) sums over each row of k3(l) * keep and of log pi * keep (log pi 0 where it is not finite)."""
    B, T = l.shape
    k3, logp = l.new_empty(B), l.new_empty(B)
    fn = getattr(lib(), f"seqis_kept_{SUFFIX[l.dtype]}")
    fn(B, T, l.data_ptr(), l.stride(0), tl.data_ptr(), tl.stride(0), keep.data_ptr(), keep.stride(0), k3.data_ptr(),
       logp.data_ptr(), _threads(B, T))
    return k3, logp


def dot_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(B,) sum over T of a * b (each product rounded to the dtype, the sum in double)."""
    B, T = a.shape
    sums = a.new_empty(B)
    fn = getattr(lib(), f"seqis_dot_{SUFFIX[a.dtype]}")
    fn(B, T, a.data_ptr(), a.stride(0), b.data_ptr(), b.stride(0), sums.data_ptr(), _threads(B, T))
    return sums
