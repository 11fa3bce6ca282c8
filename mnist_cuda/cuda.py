"""The CUDA layer: compile kernels/ sources with NVRTC (through CuPy), load them, launch with checked
argument types. It knows no op: which kernels exist, their grids and their compile-time constants are
mnist_cuda/ops' business.

    Source(path, defines)     one .cu file under kernels/, compiled as one module with -D options;
                              local #include "..." headers (kernels/include/) are inlined first, so
                              CuPy's on-disk cache key covers them too
    Source.from_file(file)    a .cu file outside kernels/ (a dev tool's, such as dev/ladder/'s rungs),
                              compiled the same way but not declared among the product's sources
    Source.kernel(name)       a Kernel: name is an extern "C" entry point, or a template instantiation
                              such as "conv2_forward_fast<Precision::Tf32>" (an NVRTC name expression)
    Kernel.launch(...)        on the current stream, scalars as explicit NumPy types
    transform_sources(fn)     from now on, every source compiles from fn(path, text) (instrumenting tools)
    launch_hook(fn)           while active, every launch goes through fn (profilers, timelines)
    SideStream                fork/join of a second stream; inside a graph capture, a branch
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

COMPILE_OPTIONS = ("--std=c++17",)
INSTALL_HINT = (
    "install the CUDA extra from the checkout: pip install '.[cuda12]' "
    "(or '.[cuda13]' for a CUDA 13 driver); only an NVIDIA driver is needed besides"
)
ARG_TYPES = (np.int32, np.uint32, np.int64, np.float32, np.float64)


class GPUUnavailable(RuntimeError):
    """CuPy or a CUDA device is missing; the message says what and how to install."""


def kernel_dir() -> Path:
    """kernels/ of a source checkout, or the copy a wheel carries inside the package."""
    packaged = Path(__file__).resolve().parent / "kernels_src"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parent.parent / "kernels"


def require_gpu():
    """Import CuPy and check that a CUDA device answers; raise GPUUnavailable with advice if not."""
    try:
        import cupy
    except ImportError:
        raise GPUUnavailable(f"CuPy is not installed; {INSTALL_HINT}") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError: no driver, insufficient driver, ...
        hint = " (no NVIDIA driver here, or one older than this CuPy's CUDA)" if "InsufficientDriver" in str(e) else ""
        raise GPUUnavailable(f"no usable CUDA GPU: {e}{hint}; this trainer needs an NVIDIA GPU and driver") from None
    if count == 0:
        raise GPUUnavailable("no CUDA GPU found; this trainer needs an NVIDIA GPU and driver")
    return cupy


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@functools.cache
def sm_count() -> int:
    return int(require_gpu().cuda.Device().attributes["MultiProcessorCount"])


@functools.cache
def shared_memory_per_sm() -> int:
    """Bytes of shared memory an SM holds for its resident blocks."""
    return int(require_gpu().cuda.Device().attributes["MaxSharedMemoryPerMultiprocessor"])


@functools.cache
def shared_memory_per_block() -> int:
    """Bytes of dynamic shared memory a block may ask for (the device's opt-in limit)."""
    return int(require_gpu().cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"])


def pinned_empty(shape, dtype) -> np.ndarray:
    """A NumPy array in page-locked host memory (fast, truly asynchronous host-to-device copies)."""
    cupy = require_gpu()
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    mem = cupy.cuda.alloc_pinned_memory(max(count * dtype.itemsize, 1))
    return np.frombuffer(mem, dtype, count).reshape(shape)


# ---- sources ------------------------------------------------------------------------------------

# a local include line, with or without a comment after it (one NVRTC would otherwise look for and not find)
_INCLUDE = re.compile(r'^\s*#include\s+"([^"]+)"(?:[ \t]*(?://[^\n]*|/\*[^\n]*?\*/))?\s*$', re.MULTILINE)
_ENTRY = re.compile(
    r'(?:extern\s+"C"\s+|template\s*<[^>]*>\s*)__global__\s+void\s+'
    r"(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\("
)


def read_source(path: str) -> str:
    """The text of kernels/<path> (of the file itself where path is absolute) with its local #include "..."
    headers inlined (each once), looked up beside the file and in kernels/include/."""
    root, seen = kernel_dir(), set()
    here = (root / path).parent

    def expand(text: str) -> str:
        def repl(m):
            header = m.group(1)
            if header in seen:
                return ""
            seen.add(header)
            found = here / header if (here / header).is_file() else root / "include" / header
            body = found.read_text().replace("#pragma once", "")  # inlined once already
            return f"// ---- {header} ----\n" + expand(body) + f"\n// ---- end {header} ----"

        return _INCLUDE.sub(repl, text)

    return expand((root / path).read_text())


def entry_points(source_text: str) -> list[str]:
    """The names of the __global__ functions of a source (extern "C" ones and kernel templates)."""
    return _ENTRY.findall(source_text)


def _define(name: str, value) -> str:
    if isinstance(value, float):
        return f"-D{name}={value!r}f"
    return f"-D{name}={value}"


_arch_specific = True  # on Hopper, compile for sm_90a (wgmma: conv2's products, fc1's forward and input gradient)
_sources: dict[str, Source] = {}
_transform: Callable[[str, str], str] | None = None  # transform_sources' fn


class Source:
    """One .cu file under kernels/ (outside it: from_file) with the -D options its kernels need; compiled on first
    use."""

    def __init__(self, path: str, defines: dict, *, declare: bool = True):
        if declare and path in _sources:
            raise ValueError(f"{path} is declared twice; declare each source once, in its ops module")
        self.path, self.defines = path, dict(defines)
        self.name_expressions: list[str] = []
        self.kernels: dict[str, Kernel] = {}
        self._module = None
        self._variant = None
        if declare:
            _sources[path] = self

    @classmethod
    def from_file(cls, file, defines: dict | None = None) -> Source:
        """A .cu file outside kernels/ (a dev tool's, such as a rung of dev/ladder/), by its own path. It compiles
        as the product's sources do (its #include "..." headers looked up beside it, then in kernels/include/),
        but is not declared among them: sources(), and so preload() and capture() by default, leave it out (name
        it in their sources), and use_arch_specific and transform_sources do not drop a module it has loaded."""
        return cls(str(Path(file).resolve()), defines or {}, declare=False)

    def text(self) -> str:
        """The text that compiles: read_source's, passed through transform_sources' fn where one is set."""
        text = read_source(self.path)
        return text if _transform is None else _transform(self.path, text)

    def options(self, arch_options=()) -> tuple[str, ...]:
        return COMPILE_OPTIONS + tuple(_define(k, v) for k, v in self.defines.items()) + tuple(arch_options)

    def models_variant(self) -> Source:
        """This source compiled with MODEL_INDEX (kernels/include/common.cuh), the form its kernels take in a
        launch of several models; without it a kernel is compiled for one model. Not declared: a step that launches
        it names it in its sources (variants)."""
        if self._variant is None:
            self._variant = Source(self.path, {**self.defines, "MODEL_INDEX": 1}, declare=False)
        for name in self.kernels:  # (every kernel of the source, declared by now: preload compiles them all)
            self._variant.kernel(name)
        return self._variant

    def kernel(self, name: str) -> Kernel:
        """The kernel `name` of this source (an entry point, or a template instantiation)."""
        if name not in self.kernels:
            if "<" in name:
                self.name_expressions.append(name)
                self._module = None  # compiled without this instantiation
            self.kernels[name] = Kernel(self, name)
        return self.kernels[name]

    def loaded(self) -> bool:
        """Whether this source's module and every kernel of it are loaded."""
        return self._module is not None and all(k._fn is not None for k in self.kernels.values())

    def module(self):
        if self._module is None:
            cupy = require_gpu()
            self._module = cupy.RawModule(
                code=self.text(),
                options=self.options(_arch_options(cupy)),
                name_expressions=self.name_expressions or None,
            )
            for k in self.kernels.values():
                k._fn = None
        return self._module

    def compile_check(self, arch: str) -> str | None:
        """Compile with NVRTC for `arch` (no GPU needed); the error log, or None if it compiles."""
        try:
            from cupy_backends.cuda.libs import nvrtc
        except ImportError as e:
            raise GPUUnavailable(f"NVRTC is not available ({e}); {INSTALL_HINT}") from None
        prog = nvrtc.createProgram(self.text(), self.path, (), ())
        try:
            for expression in self.name_expressions:
                nvrtc.addNameExpression(prog, expression)
            nvrtc.compileProgram(prog, self.options((f"-arch={arch}",)))
            return None
        except nvrtc.NVRTCError:
            return nvrtc.getProgramLog(prog)
        finally:
            nvrtc.destroyProgram(prog)


def sources() -> list[Source]:
    """Every declared source (import mnist_cuda.ops first: its modules declare them)."""
    return list(_sources.values())


def _arch_options(cupy) -> tuple[str, ...]:
    # CuPy adds -arch=sm_XY for the device; NVRTC given both -arch=sm_90a and -arch=sm_90 compiles for sm_90a.
    return ("-arch=sm_90a",) if _arch_specific and cupy.cuda.Device().compute_capability == "90" else ()


def arch_specific() -> bool:
    """Whether kernels are compiled for sm_90a now (a Hopper GPU, and use_arch_specific not turned off):
    the kernels that exist only in a wgmma form may be launched."""
    return bool(_arch_options(require_gpu()))


def use_arch_specific(on: bool):
    """Whether the kernels are compiled for sm_90a on a Hopper GPU (conv2's products and fc1's forward and
    input gradient then use its warpgroup MMA, wgmma) or for plain sm_XY as on any other GPU (their
    mma.sync form). The tests run both forms on a Hopper GPU; kernels are compiled anew on their next use."""
    global _arch_specific
    _arch_specific = bool(on)
    _drop_modules()


def transform_sources(fn: Callable[[str, str], str] | None):
    """From now on in this process, every source compiles from fn(path, text), text being read_source's (in
    Source.module and Source.compile_check): a tool that instruments the kernels sets it, as
    dev/step_timeline.py stamps each kernel with timers; None compiles the sources as they are again. Modules
    loaded already are dropped, so every source compiles through fn on its next use. Without fn a source
    compiles from read_source's text itself: the product's modules keep their CuPy cache keys, and a
    transformed text is cached as a module of its own."""
    global _transform
    _transform = fn
    _drop_modules()


def _drop_modules():
    for s in _sources.values():
        for form in (s, s._variant):  # (the form for several models too)
            if form is not None:
                form._module = None  # compiled anew on the next use


# Loading a cubin from CuPy's kernel cache takes milliseconds; compiling takes seconds. Where loading takes
# longer than this, the kernels are being compiled (a first run, or a new CuPy or CUDA), and one line says so.
COMPILE_NOTICE_SECONDS = 0.5


def preload(sources=None):
    """Compile and load the kernels of `sources` (default: every declared source) now: before timing, and
    before a graph capture, during which loading a module is not allowed. The sources not loaded yet compile
    side by side in threads, up to one per CPU (NVRTC's compile releases the GIL); where that takes a while,
    one line on stderr says what is happening."""
    todo = [s for s in (_sources.values() if sources is None else sources) if not s.loaded()]
    if not todo:
        return
    cupy = require_gpu()
    device = cupy.cuda.Device()
    arch = device.compute_capability + ("a" if _arch_options(cupy) else "")

    def load(source):
        with cupy.cuda.Device(device.id):
            cupy.cuda.runtime.free(0)  # makes the device's context current in this thread: modules load into it
            for k in source.kernels.values():
                k.function()

    kernels = sum(len(s.kernels) for s in todo)
    notice = threading.Timer(
        COMPILE_NOTICE_SECONDS,
        print,
        (f"compiling {kernels} CUDA kernels ({len(todo)} sources) for sm_{arch} (first run only; cached after)",),
        {"file": sys.stderr, "flush": True},
    )
    notice.daemon = True
    notice.start()
    try:
        workers = max(1, min(len(todo), os.cpu_count() or 1))  # a thread per source, at most one per CPU
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(load, todo))
    finally:
        notice.cancel()


# ---- launches -----------------------------------------------------------------------------------

LaunchHook = Callable[["Kernel", tuple, tuple, tuple, int, Callable[[], None]], None]
_hooks: list[LaunchHook] = []


@contextlib.contextmanager
def launch_hook(fn: LaunchHook):
    """While active, every launch calls fn(kernel, grid, block, args, shared_mem, launch) instead of
    launching; fn calls launch() to launch (any number of times), and may record what it sees."""
    _hooks.append(fn)
    try:
        yield
    finally:
        _hooks.remove(fn)


class Kernel:
    """One compiled kernel; its launch checks the argument types."""

    def __init__(self, source: Source, name: str):
        self.source, self.name = source, name
        self._fn = None
        self._shared_limit = 0  # the dynamic shared memory a launch may take (set by function())

    def function(self):
        module = self.source.module()
        if self._fn is None:
            self._fn = module.get_function(self.name)
            # Every kernel asks for the same split of the SM's memory between shared memory and L1, the
            # largest shared memory: kernels that ask for different splits make the SM drain and
            # reconfigure between them (docs/performance.md).
            self._fn.preferred_shared_memory_carveout = 100
            # without asking, a block's static and dynamic shared memory together may take 48 KB
            self._shared_limit = 48 * 1024 - self._fn.shared_size_bytes
        return self._fn

    def launch(self, grid, block, *args, shared_mem: int = 0, models: int = 1):
        """Launch on the current stream. Scalars must be explicit NumPy types (np.int32, np.float32):
        a bare Python int would be passed as 64 bits and silently corrupt the following arguments. models > 1:
        a launch of several models (the grid holds them), by the kernel's models_variant form."""
        if models > 1:
            self.source.models_variant().kernel(self.name).launch(grid, block, *args, shared_mem=shared_mem)
            return
        for i, a in enumerate(args):
            if not (
                isinstance(a, ARG_TYPES)
                or hasattr(a, "data")
                and hasattr(a, "dtype")
                and type(a).__module__.startswith("cupy")
            ):
                raise TypeError(
                    f"{self.name}: argument {i} is {type(a).__name__}; pass a cupy array, np.int32 or np.float32"
                )
        grid = tuple(int(g) for g in grid) if isinstance(grid, tuple) else (int(grid),)
        block = tuple(int(b) for b in block) if isinstance(block, tuple) else (int(block),)
        fn = self.function()
        if shared_mem > self._shared_limit:  # more must be asked for
            fn.max_dynamic_shared_size_bytes = self._shared_limit = shared_mem

        def launch():
            fn(grid, block, args, shared_mem=shared_mem)

        if _hooks:
            _hooks[-1](self, grid, block, args, shared_mem, launch)
        else:
            launch()

    def launch_1d(self, n: int, *args, block: int = 256, models: int = 1):
        """One thread per element for n elements (of each of `models` models, the grid's z: common.cuh)."""
        self.launch(ceil_div(n, block) if models == 1 else (ceil_div(n, block), 1, models), block, *args, models=models)


# ---- streams ------------------------------------------------------------------------------------


class SideStream:
    """A second stream for work that may overlap the current stream's.

    run(fn) launches fn's kernels on the side stream after everything launched so far on the current
    stream; join() makes the current stream wait for them. Captured in a graph, the two streams become two
    branches of it. Outside a capture fn runs on the current stream instead: launched one by one, a step is
    bound by the host's launches and a second stream gains nothing, while eager work queued on a side
    stream beside the current one made every later replay of the step graph slower, for the rest of the
    process (docs/performance.md)."""

    def __init__(self, cp):
        self.cp = cp
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.forked = cp.cuda.Event(disable_timing=True)
        self.done = cp.cuda.Event(disable_timing=True)
        self.pending = False

    def run(self, fn):
        current = self.cp.cuda.get_current_stream()
        if not current.is_capturing():
            fn()
            return
        self.forked.record(current)
        self.stream.wait_event(self.forked)
        with self.stream:
            fn()
        self.pending = True

    def join(self):
        if self.pending:  # (a capture may only wait for events recorded inside it)
            self.done.record(self.stream)
            self.cp.cuda.get_current_stream().wait_event(self.done)
            self.pending = False


def capture(*work, sources=None):
    """Capture the launches of the callables `work` as one CUDA graph (replay: graph.launch(stream)). sources:
    the kernel sources they launch from (default: every declared source)."""
    cp = require_gpu()
    preload(sources)  # module loading is not allowed while a stream is capturing
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            for fn in work:
                fn()
        finally:
            graph = stream.end_capture()
    return graph
