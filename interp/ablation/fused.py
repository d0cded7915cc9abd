"""The per-row sums of ``logits.patched_stack``'s vocabulary tiles in one pass over each tile (CPU, float32
logits): a small C kernel, compiled with the system's gcc on first use and cached, called through ctypes.

For every row r of a tile of ``w`` vocabulary entries and each of ``n`` stacked variants k, in float64 from the
exactly widened float32 logits (the same roundings as ``logits.log_p64``):

    s_v = z_{k,r,v} - lse_r,     p_v = exp(z_p,r,v - lse_r),
    sum_exp[k, r] += sum_v exp(s_v),     sum_ps[k, r] += sum_v p_v s_v.

torch forms the same sums in eight passes over the tile (widen, subtract and exponentiate p; widen and subtract z;
multiply; two sums; exponentiate), each a trip through memory; here each entry is read once and its two
exponentials are vectorised (glibc's libmvec): about half the time of torch's path at one thread
(``benchmarks/tile_sums.py`` -> ``docs/results/scale/tile_sums_cpu.csv``).

The intact run's own sums (``IntactLogits.total_p`` and ``p_dot_log_p``) come from the same kernel over the same
tiles (``n = 1``, z = z_p): where a variant's logits equal the intact ones bit for bit, its S equals P and its B
is 0 exactly, so its KL is 0 (a stacked matmul may round a row's logits otherwise than the intact run's: then 0 to
rounding, ~1e-16). Each row is widened into an aligned scratch array before its exponentials, so which entries
take libmvec's vector path and which the scalar one depends on ``w`` alone, never on where a tile starts in memory.

Without gcc, off x86-64 Linux, for float64 or CUDA logits, or with ``INTERP_FUSED=0``, ``available`` says no and
``patched_stack`` keeps its torch arithmetic (the tests compare the two: 1e-13 relative).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable, Optional

import torch
from jaxtyping import Float
from torch import Tensor

from interp.errors import InputError, InternalError
from interp.models.zoo import cache_dir

MAX_TILE = 1024  # the kernel's scratch arrays (entries of one row of a tile)
ROWS_PER_THREAD = 64  # below this many rows a thread, the call runs on one (a thread's start costs more)

SOURCE = r"""
#include <stdint.h>
/* glibc's vector exp (libmvec): declared here with the simd attribute that math.h gives it only under -ffast-math,
   which would also license reassociating the subtraction these sums must share with the intact run's */
double exp(double) __attribute__((simd("notinbranch"), const, nothrow));
#define MAX_TILE 1024

void tile_sums(const float *z, int64_t ldz, const float *zp, int64_t ldp, const double *lse, int64_t n,
               int64_t rows, int64_t row_lo, int64_t row_hi, int64_t w, double *sum_exp, double *sum_ps)
{
    double p[MAX_TILE] __attribute__((aligned(64)));
    double s[MAX_TILE] __attribute__((aligned(64)));
    for (int64_t r = row_lo; r < row_hi; r++) {
        const double l = lse[r];
        const float *pr = zp + r * ldp;
        for (int64_t v = 0; v < w; v++) p[v] = (double)pr[v] - l;
        #pragma omp simd aligned(p: 64)
        for (int64_t v = 0; v < w; v++) p[v] = exp(p[v]);
        for (int64_t k = 0; k < n; k++) {
            const float *zr = z + (k * rows + r) * ldz;
            double e = 0.0, b = 0.0;
            for (int64_t v = 0; v < w; v++) s[v] = (double)zr[v] - l;
            #pragma omp simd aligned(p, s: 64) reduction(+:e, b)
            for (int64_t v = 0; v < w; v++) {
                e += exp(s[v]);
                b += p[v] * s[v];
            }
            sum_exp[k * rows + r] += e;
            sum_ps[k * rows + r] += b;
        }
    }
}
"""
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", "-fopenmp-simd",
         "-shared", "-fPIC"]
LIBS = ["-lmvec", "-lm"]


def _cpu_flags() -> str:
    """This CPU's feature flags (``-march=native`` compiles for them: the cache key keeps machines apart)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def _compile(compiler: str) -> Optional[Path]:
    """The kernel's shared library in the cache, ``tile_sums-<key>-<digest>.so``: ``key`` hashes what it is built
    from, ``digest`` its own bytes, checked before it is used (a library cut short, by a crash before the file
    system wrote it out or an interrupted copy, would kill the process with SIGBUS in dlopen: it is compiled
    again instead). Compiled into a temporary file and renamed: never half-written. None where the compiler
    fails."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join([SOURCE, *FLAGS, *LIBS, version, _cpu_flags()]).encode()).hexdigest()[:16]
    folder = cache_dir() / "kernels"
    for cached in sorted(folder.glob(f"tile_sums-{key}-*.so")):
        if _digest(cached) == cached.stem.rsplit("-", 1)[-1]:
            return cached
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as work:
        source, library = Path(work) / "tile_sums.c", Path(work) / "tile_sums.so"
        source.write_text(SOURCE)
        done = subprocess.run([compiler, *FLAGS, str(source), "-o", str(library), *LIBS], capture_output=True)
        if done.returncode != 0:
            return None
        target = folder / f"tile_sums-{key}-{_digest(library)}.so"
        os.replace(library, target)
    return target


def _digest(path: Path) -> str:
    """The first 16 hex digits of the SHA-256 of a file's bytes ("" where it cannot be read)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        return ""


@functools.cache
def kernel() -> Optional[Callable]:
    """The compiled ``tile_sums`` (ctypes, releases the GIL while it runs), or None where it cannot be had here or
    ``INTERP_FUSED`` is 0, false, no or off (read once, at the first call)."""
    compiler = shutil.which(os.environ.get("CC", "gcc"))
    off = os.environ.get("INTERP_FUSED", "1").strip().lower() in ("0", "false", "no", "off")
    if off or compiler is None or platform.system() != "Linux" or platform.machine() != "x86_64":
        return None
    try:
        library = _compile(compiler)
        function = ctypes.CDLL(str(library)).tile_sums if library is not None else None
    except (OSError, subprocess.SubprocessError):
        return None
    if function is not None:
        function.restype = None
        i64, pointer = ctypes.c_int64, ctypes.c_void_p
        function.argtypes = [pointer, i64, pointer, i64, pointer, i64, i64, i64, i64, i64, pointer, pointer]
    return function


def available(intact_logits: Tensor) -> bool:
    """Whether ``patched_stack``'s sums over these intact logits run in the kernel: float32 on the CPU, rows
    contiguous, and the kernel compiled here."""
    return (intact_logits.device.type == "cpu" and intact_logits.dtype == torch.float32
            and intact_logits.ndim == 2 and intact_logits.stride(1) == 1 and kernel() is not None)


@functools.cache
def _pool(pid: int) -> ThreadPoolExecutor:
    """Worker threads for ``tile_sums``, one pool per process (``pid``: a forked child inherits the parent's pool
    object but none of its threads, and would wait on them forever). A thread starts only when a call finds none
    idle, so the pool holds as many as the most that one call used (a pool per thread count would keep
    n (n - 1) / 2 on n cores); at most the CPU count: shares beyond it wait for a worker."""
    return ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="interp-tile-sums")


def tile_sums(z: Float[Tensor, "stack_rows tile"], intact: Float[Tensor, "rows vocab"], lo: int,
              lse: Float[Tensor, " rows"], sum_exp: Float[Tensor, "stack rows"], sum_ps: Float[Tensor, "stack rows"]
              ) -> None:
    """Add one tile's sums (module doc) into ``sum_exp`` and ``sum_ps`` (float64, contiguous, [n, rows]): ``z`` the
    n stacked variants' logits of the tile (variant-major rows, float32, rows contiguous), ``intact`` the intact
    logits (their columns ``lo`` onwards are the tile's), ``lse`` their logsumexp in float64 (contiguous). Rows
    are split across torch's CPU threads."""
    _check(z, intact, lo, lse, sum_exp, sum_ps)
    n, rows = sum_exp.shape
    w = z.shape[1]
    function = kernel()
    if function is None:
        raise InternalError("tile_sums: the compiled kernel is not available here (``available`` says so: no gcc, "
                           "not x86-64 Linux, or INTERP_FUSED=0)")
    arguments = (z.data_ptr(), z.stride(0), intact.data_ptr() + 4 * lo, intact.stride(0), lse.data_ptr(), n, rows)
    outputs = (w, sum_exp.data_ptr(), sum_ps.data_ptr())
    threads = min(torch.get_num_threads(), rows // ROWS_PER_THREAD)
    if threads <= 1:
        function(*arguments, 0, rows, *outputs)
        return
    bounds = [rows * t // threads for t in range(threads + 1)]
    pool = _pool(os.getpid())
    jobs = [pool.submit(function, *arguments, a, b, *outputs) for a, b in zip(bounds[:-2], bounds[1:-1])]
    try:
        function(*arguments, bounds[-2], bounds[-1], *outputs)  # the last share on this thread
    finally:  # even on an interrupt: the workers write into the caller's tensors, which must outlive them
        _join(jobs)


def _join(jobs: list[Future]) -> None:
    """Wait for every job, a KeyboardInterrupt (or other exception) meanwhile raised only once all are done."""
    interrupted: Optional[BaseException] = None
    pending = set(jobs)
    while pending:
        try:
            pending = wait(pending).not_done
        except BaseException as error:  # noqa: BLE001 (re-raised below, after the workers)
            interrupted = error
    if interrupted is not None:
        raise interrupted
    for job in jobs:
        job.result()


def _check(z: Tensor, intact: Tensor, lo: int, lse: Tensor, sum_exp: Tensor, sum_ps: Tensor) -> None:
    """Every buffer the kernel reads or writes is what it assumes (dtype, shape, layout, device, memory of its
    own): it indexes raw pointers, so a wrong one would read or write outside a tensor instead of failing."""
    tensors = {"z": z, "intact": intact, "lse": lse, "sum_exp": sum_exp, "sum_ps": sum_ps}
    said = [f"{name} must be a plain strided tensor (no negated or conjugated view), got {t.layout}"
            f"{' negated' if t.is_neg() else ''}{' conjugated' if t.is_conj() else ''}"
            for name, t in tensors.items() if t.layout != torch.strided or t.is_neg() or t.is_conj()]
    if said:  # strides and pointers mean nothing else
        raise InputError("tile_sums: " + "; ".join(said))
    n, rows = sum_exp.shape if sum_exp.ndim == 2 else (0, -1)
    w = z.shape[-1] if z.ndim else 0
    problems = [
        f"z must be float32 [{n} x {rows}, <= {MAX_TILE}] with contiguous rows, got {z.dtype} {tuple(z.shape)} "
        f"strides {z.stride()}" if z.dtype != torch.float32 or z.ndim != 2 or z.shape[0] != n * rows
        or w > MAX_TILE or z.stride(1) != 1 else "",
        f"intact must be float32 [{rows}, >= {lo + w}] with contiguous rows, got {intact.dtype} "
        f"{tuple(intact.shape)}" if intact.dtype != torch.float32 or intact.ndim != 2 or intact.shape[0] != rows
        or intact.shape[1] < lo + w or lo < 0 or intact.stride(1) != 1 else "",
        f"lse must be float64 [{rows}] contiguous, got {lse.dtype} {tuple(lse.shape)}"
        if lse.dtype != torch.float64 or lse.shape != (rows,) or not lse.is_contiguous() else "",
        "sum_exp and sum_ps must be contiguous float64 [n, rows] of one shape"
        if any(t.dtype != torch.float64 or not t.is_contiguous() or t.shape != sum_exp.shape or t.ndim != 2
               for t in (sum_exp, sum_ps)) else "",
        "every tensor must be on the CPU" if not all(t.is_cpu for t in (z, intact, lse, sum_exp, sum_ps))
        else "",
    ]
    said = [p for p in problems if p]
    if not said:  # shapes and strides as assumed: now what the pointers hold
        said = _memory_problems(tensors)
    if said:
        raise InputError("tile_sums: " + "; ".join(said))


def _address(t: Tensor) -> int:
    """``t.data_ptr()``; 0 where ``t`` has no storage of its own (a fake or wrapper-subclass tensor, whose
    data_ptr warns, raises or says 0)."""
    if type(t) in (torch.Tensor, torch.nn.Parameter):
        return t.data_ptr()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return t.data_ptr()
    except RuntimeError:
        return 0


def _span(t: Tensor) -> tuple[int, int]:
    """The bytes [first, last + 1) that a contiguous tensor, or a matrix of contiguous rows, spans (empty: 0, 0)."""
    count = t.numel()
    if count == 0:
        return 0, 0
    start = _address(t)
    if t.is_contiguous():
        return start, start + count * t.element_size()
    rows, width = t.shape
    return start, start + ((rows - 1) * t.stride(0) + width) * t.element_size()


def _memory_problems(tensors: dict[str, Tensor]) -> list[str]:
    """Whether each (strided) tensor has storage of its own behind its pointer and no output shares memory with
    another buffer (its sums would be added into another's, or into what a thread still reads)."""
    spans = {name: _span(t) for name, t in tensors.items()}
    said = [f"{name} has no storage (a fake or meta tensor)" for name, (start, _) in spans.items()
            if start == 0 and tensors[name].numel()]
    if said:
        return said
    for out in ("sum_exp", "sum_ps"):
        a, b = spans[out]
        said += [f"{out} and {name} share memory" for name, (c, d) in spans.items()
                 if name != out and a < d and c < b and not (name == "sum_exp" and out == "sum_ps")]
    return said
