"""PyTorch's candidates for its fastest training step, and the checks that keep the comparison honest.

A claim against a peer is worth only as much as the peer's configuration, so PyTorch runs this network's
step every way its expert users would, each timed the same way, and the headline takes the fastest:

    eager                               modules launched op by op (the per-phase baseline)
    graph[, channels_last]              the whole step (normalise, forward, loss, backward, fused SGD,
                                        zero-grad) captured as one CUDA graph and replayed
    compiled+graph[, channels_last]     torch.compile's default mode inside that graph
    max-autotune+graph[, channels_last] torch.compile(mode="max-autotune-no-cudagraphs"): inductor times
                                        its Triton templates against cuBLAS / cuDNN per op, inside the graph
    compiled                            torch.compile without a graph (with --compile)

Every compiled candidate is compiled for its batch size alone: TorchDynamo's caches are reset first and
the model is compiled with dynamic=False, since a model compiled at one batch size and called at another
is recompiled with a symbolic batch dimension, whose kernels are slower. CompileWatch then checks that
nothing compiles again after the first step, through the capture and the timed steps.
"""

from __future__ import annotations

import dataclasses

AUTOTUNE = "max-autotune-no-cudagraphs"  # the step is graphed whole by us; inductor's own graphs would nest


@dataclasses.dataclass(frozen=True)
class Candidate:
    name: str
    compile_mode: str | None = None  # None: not compiled; "default" or AUTOTUNE: torch.compile's mode
    channels_last: bool = False  # the model's weights and the input in torch.channels_last
    graph: bool = True  # the whole step captured as one CUDA graph, replayed per batch

    @property
    def compiled(self) -> bool:
        return self.compile_mode is not None

    @property
    def autotuned(self) -> bool:
        return self.compile_mode == AUTOTUNE


CL = ", channels_last"
EAGER = Candidate("eager", graph=False)
COMPILED_ALONE = Candidate("compiled", "default", graph=False)
# In the order they run at each batch size: the uncompiled graphs, the compiled ones, "compiled" alone (the
# last to compile, so that nothing resets TorchDynamo before its "again" run), eager last.
CANDIDATES = (
    Candidate("graph"),
    Candidate("graph" + CL, channels_last=True),
    Candidate("compiled+graph", "default"),
    Candidate("compiled+graph" + CL, "default", True),
    Candidate("max-autotune+graph", AUTOTUNE),
    Candidate("max-autotune+graph" + CL, AUTOTUNE, True),
    COMPILED_ALONE,
    EAGER,
)
BY_NAME = {c.name: c for c in CANDIDATES}
NAMES = tuple(BY_NAME)


def chosen(no_compile: bool = False, no_autotune: bool = False, compile_alone: bool = False) -> list[Candidate]:
    """The candidates a run times: all of them but "compiled" alone (with compile_alone), less the
    autotuned ones (no_autotune: quick runs, never a committed result) or every compiled one (no_compile)."""
    out = []
    for c in CANDIDATES:
        if c is COMPILED_ALONE and not compile_alone:
            continue
        if (c.compiled and no_compile) or (c.autotuned and no_autotune):
            continue
        out.append(c)
    return out


def fastest(modes: dict) -> tuple[str, dict]:
    """(name, measurement) of the fastest mode by median that did not fail."""
    timed = [(name, m) for name, m in modes.items() if "error" not in m and m.get("median_us") is not None]
    if not timed:
        raise ValueError("no mode was timed")
    return min(timed, key=lambda kv: kv[1]["median_us"])


# ---- no recompilation ----------------------------------------------------------------------------------


class Recompiled(RuntimeError):
    """torch.compile compiled again after a candidate's first step."""


def frames_compiled(torch) -> int:
    """The frames TorchDynamo has compiled in this process (its counters outlive torch._dynamo.reset())."""
    return int(torch._dynamo.utils.counters["frames"]["ok"])


class CompileWatch:
    """The frames compiled since it was made: a compiled candidate compiles in its first step only."""

    def __init__(self, torch):
        self.torch = torch
        self.mark = frames_compiled(torch)

    def since(self) -> int:
        return frames_compiled(self.torch) - self.mark

    def expect_none(self, during: str):
        n = self.since()
        if n:
            raise Recompiled(
                f"torch.compile compiled {n} frame(s) again during {during} (a recompilation; "
                f"TORCH_LOGS=recompiles says why)"
            )


# ---- the outside figure ---------------------------------------------------------------------------------

# PyTorch's fastest whole step as measured by an independent script on an H200 (torch 2.11, cu130: each batch
# size compiled alone, channels_last, max-autotune, one whole-step graph; fp32 290 / 1,024 / 5,560 us, bf16
# under autocast 255.5 / 716.6 / 4,322 us), plus 5% for run-to-run noise. PyTorch's convolutions run in
# TF32 by default, so fp32 and tf32 runs time the same PyTorch. A run that finds PyTorch slower than this
# has not yet given it its best.
_FP32_CEILINGS = {64: 305.0, 512: 1075.0, 4096: 5840.0}
OUTSIDE_CEILINGS_US = {
    "NVIDIA H200": {"fp32": _FP32_CEILINGS, "tf32": _FP32_CEILINGS, "bf16": {64: 270.0, 512: 755.0, 4096: 4540.0}}
}


def outside_check(device: str, precision: str, batch: int, torch_us: float) -> dict | None:
    """{ceiling_us, pass} where an outside figure exists for this device, precision and batch size."""
    ceiling = OUTSIDE_CEILINGS_US.get(device, {}).get(precision, {}).get(int(batch))
    if ceiling is None:
        return None
    return {"ceiling_us": ceiling, "pass": bool(torch_us <= ceiling)}
