#!/usr/bin/env python3
"""Our CUDA kernels against PyTorch: same model, weights, batches, learning rate and batch size.

    python scripts/compare_pytorch.py                  # timing at batch 64, 512 and 4096, then the parity run
    python scripts/compare_pytorch.py --show FILE.json # print the tables of a saved result
    python scripts/compare_pytorch.py --show FILE.json --png FILE.png  # and draw its plot again (no GPU)
    python scripts/compare_pytorch.py --recipe fast    # train's recipe on both sides, seeds 0-4 (also: best)

(From a checkout without installing the package: PYTHONPATH=. python scripts/compare_pytorch.py ...)

Parity: both sides train --parity-steps steps from identical weights on identical batches at the same
learning rate (--parity-lr), PyTorch with TF32 off (so both compute in fp32); PASS needs every loss
within 1e-4 over the first 50 steps and 1e-3 over all of them. Exit status 1 on FAIL.
Why a parity learning rate of its own: at the training rate (0.05) this network's trajectory is chaotic
in fp32. A near-tie in a pooling window or a ReLU input near zero rounds differently, the gradient takes
another path, and the difference compounds: PyTorch in fp32 and in fp64 part ways within tens of steps
at the training rate, and stay together at the parity rate (docs/performance.md, section 5). Identical
computation is what parity tests, so it runs where rounding cannot snowball.

Timing, per batch size, after --warmup steps (the whole-step loops: and --warmup-seconds), over --steps
steps (median and mean):
  per phase   load (host-to-device copy), forward (+ loss), backward, update, zero-grad, with CUDA
              events between the phases and one synchronisation per step; ours also with each phase
              as a CUDA graph of its own ("graphs per phase");
  whole step  a training loop with no synchronisation inside (gather the batch on the host, copy,
              step), a timing event after every --timing-window steps: each window's mean step is
              one sample (a timing event between two steps holds the next one back until the GPU has
              drained); for every mode of each side:
                torch:  eager; whole step in one torch.cuda.graph (static input buffers);
                        torch.compile'd model inside that graph (default when torch.compile works);
                        torch.compile alone (--compile);
                ours:   eager launches; whole step as one CUDA graph (mnist_cuda.step.Step's modes).
  epoch       wall clock of one shuffled epoch (permutation, gather, load, every step) per mode.
Order: per batch size, ours (whole-step loops, then per phase), then PyTorch (the same); each side's
fastest mode once more at the end ("again"); the parity run last. Earlier work in the process (eager
steps on another net of ours, per-phase runs) can make our step graph slower for the rest of the
process, cause unknown: "again" shows by how much in each run. PyTorch runs with its defaults for speed
(cudnn.benchmark on, cuDNN's TF32 convolutions allowed) and SGD's fused implementation where it has
one. The headline speed-up is against the fastest PyTorch mode. docs/performance.md (section 5) has the
lessons behind this method.

--precision tf32 (or --tf32): our conv2 products in plain TF32 too, the precision PyTorch's timed modes
allow their convolutions. The parity run then allows TF32 convolutions on both sides, and its tolerances
are PARITY_TOL_TF32's. --precision bf16: our conv2 and fc1 products on bf16 operands, and PyTorch's every
mode under torch.autocast(dtype=torch.bfloat16), the parity run included (tolerances PARITY_TOL_BF16).
"""
from __future__ import annotations

import datetime
from argparse import ArgumentTypeError
import json
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from mnist_cuda import cuda, data, optim, reference
from mnist_cuda.nets import KERNEL_VERSIONS, Parameters, make_net
from mnist_cuda.step import PHASES, Step
from mnist_cuda.cli import (Parser, add_precision_arguments, batch_sizes, int_at_least, learning_rate, non_negative,
                            output_path, precision_of, require_matplotlib, save_figure, seed, write_json)
from mnist_cuda.train import DEFAULTS, RECIPES

REPO = Path(__file__).resolve().parent.parent  # the default --out lies under its benchmarks/results/

SCHEMA = "mnist_cuda.compare/1"
PARITY_TOL = {"first_50": 1e-4, "all": 1e-3}
# With TF32 convolutions the losses move from step to step at TF32's rounding (2^-11 per operand), for
# PyTorch's own TF32 against its fp32 as much as for ours against either: noise, not a trend. PASS allows
# about four times the largest such difference seen (docs/performance.md, section 5).
PARITY_TOL_TF32 = {"first_50": 3e-3, "all": 3e-3}
# With bf16 products (8-bit mantissas) the same rule from PyTorch's own autocast(bfloat16) run against its
# fp32 run on the same batches (dev/bf16_distance.py): up to 2.2e-3 over the first 50 steps and 3.1e-3
# over 200, so PASS allows about four times those (docs/performance.md, section 5).
PARITY_TOL_BF16 = {"first_50": 1e-2, "all": 1.25e-2}
PARITY_TOLERANCES = {"fp32": PARITY_TOL, "tf32": PARITY_TOL_TF32, "bf16": PARITY_TOL_BF16}
TORCH_MODES = ("eager", "graph", "compiled+graph", "compiled")
OUR_MODES = ("eager", "graph")  # Step's modes timed as whole-step loops; its "phases" mode is timed per phase
RECIPE_TORCH_MODES = ("eager", "compiled")  # the modes that take a host-side learning-rate scheduler


class Unavailable(Exception):
    """torch, a CUDA build of it, CuPy or a GPU is missing."""


# ---- arguments -------------------------------------------------------------------------------------


def recipe_modes(text: str) -> tuple:
    modes = tuple(m.strip() for m in text.split(","))
    bad = [m for m in modes if m not in RECIPE_TORCH_MODES]
    if bad or not modes or len(set(modes)) != len(modes):
        raise ArgumentTypeError(f"want distinct modes of {', '.join(RECIPE_TORCH_MODES)}, got {text!r}")
    return modes


def build_parser():
    p = Parser(prog="compare_pytorch.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-sizes", type=batch_sizes, default="64,512,4096",
                   help="comma-separated batch sizes to time; the first is also the parity run's")
    p.add_argument("--steps", type=int_at_least(1), default=500, help="timed steps per measurement (method: >= 100)")
    p.add_argument("--timing-window", type=int_at_least(1), default=10,
                   help="whole-step loops: steps between timing events (1: an event per step)")
    p.add_argument("--warmup", type=int_at_least(0), default=20, help="untimed steps first (method: >= 20)")
    p.add_argument("--warmup-seconds", type=non_negative, default=1.0,
                   help="the whole-step loops' warm-up lasts at least this long as well (the GPU's clocks settle)")
    p.add_argument("--parity-steps", type=int_at_least(0), default=200, help="0 skips the parity run")
    p.add_argument("--lr", type=learning_rate, default=DEFAULTS["lr"], help="learning rate of the timed runs")
    p.add_argument("--parity-lr", type=learning_rate, default=0.002, help="learning rate of the parity run (see above); with --momentum M the run uses this x (1 - M), "
                        "steps of the same size")
    p.add_argument("--seed", type=seed, default=0, help="seeds the initial weights and the batches' order")
    p.add_argument("--dataset", choices=sorted(data.DATASETS), default="mnist", help="training set of both sides")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="directory holding the IDX files (else $MNIST_DATA_DIR, then ./data, then download)")
    p.add_argument("--kernels", choices=KERNEL_VERSIONS, default="fast", help="our kernel version")
    add_precision_arguments(p, "default: fp32; tf32 as PyTorch's convolutions by default, bf16 against PyTorch "
                               "under autocast(bfloat16); see above")
    p.set_defaults(precision="fp32")
    p.add_argument("--compile", action="store_true", help="also time torch.compile without a CUDA graph")
    p.add_argument("--no-compiled-graph", action="store_true",
                   help="skip the torch.compile + whole-step CUDA graph mode")
    p.add_argument("--no-epoch", action="store_true", help="skip the whole-epoch wall-clock runs")
    p.add_argument("--parity-only", action="store_true", help="only the parity run (no timing, no files)")
    p.add_argument("--recipe", choices=sorted(RECIPES), default=None,
                   help="instead of the step timings: train's --recipe on both sides, seeds 0-4: fast, the "
                        "training time to its target accuracy; best, the accuracy after its epochs and their "
                        "training time (written to --out)")
    p.add_argument("--recipe-torch-modes", type=recipe_modes, default=RECIPE_TORCH_MODES, metavar="MODES",
                   help="with --recipe: PyTorch's modes to run, comma-separated, of "
                        f"{','.join(RECIPE_TORCH_MODES)} (default: both)")
    p.add_argument("--out", type=Path, default=None,
                   help="result JSON (default benchmarks/results/compare-<gpu>-<time>.json)")
    p.add_argument("--png", type=output_path, default=None,
                   help="plot (default: the JSON's path with .png; with --show: draw the saved result's plot here)")
    p.add_argument("--no-png", action="store_true", help="write no plot")
    p.add_argument("--show", type=Path, default=None, metavar="JSON",
                   help="print a saved result and exit (no GPU or torch needed)")
    optim.add_arguments(p)
    return p


# ---- statistics and formatting ---------------------------------------------------------------------


def summarize_ms(samples_ms) -> dict:
    """{median_us, mean_us, n} of a list of milliseconds."""
    a = np.asarray(samples_ms, dtype=np.float64) * 1000.0
    return {"median_us": float(np.median(a)), "mean_us": float(a.mean()), "n": int(a.size)}


def _us(v):
    return "-" if v is None else f"{v:,.1f}"


def _ratio(a, b):
    return "-" if a is None or b is None or b <= 0 else f"{a / b:,.1f}x"


def format_tables(result: dict) -> str:
    """The terminal / README tables of a result: per phase and whole step, per batch size."""
    env = result["env"]
    lines = [f"{env.get('device', '?')} | driver {env.get('driver', '?')} | CUDA {env.get('cuda_runtime', '?')} | "
             f"CuPy {env.get('cupy', '?')} | torch {env.get('torch', '?')} | kernels {result['config'].get('kernels')}"
             + OUR_PRECISION_WORDS[precision_of(result["config"])]]
    for bs, r in result["batch_sizes"].items():
        lines += ["", f"batch {bs}: per phase, median us (events between phases, one sync per step)",
                  "| phase | torch eager | ours eager | speed-up | ours graphs per phase |",
                  "|---|---:|---:|---:|---:|"]
        tp, op, og = r["torch"]["phases"], r["ours"]["phases"], r["ours"].get("phase_graphs", {})
        for ph in PHASES + ("step",):
            t, o = tp.get(ph, {}).get("median_us"), op.get(ph, {}).get("median_us")
            g = og.get(ph, {}).get("median_us")
            lines.append(f"| {ph} | {_us(t)} | {_us(o)} | {_ratio(t, o)} | {_us(g)} |")
        window = next((m.get("window_steps", 1) for m in r["ours"]["modes"].values() if "median_us" in m), 1)
        how = "a timing event per step" if window == 1 else f"median of {window}-step windows' mean step"
        lines += ["", f"batch {bs}: whole step (no sync inside the loop; {how})",
                  "| side | mode | median us | mean us | epoch s |", "|---|---|---:|---:|---:|"]
        for side in ("torch", "ours"):
            for mode, m in r[side]["modes"].items():
                if "error" in m:
                    lines.append(f"| {side} | {mode} | failed: {m['error'][:60]} | | |")
                    continue
                extra = f" (compile {m['compile_s']:.1f} s)" if "compile_s" in m else ""
                lines.append(f"| {side} | {mode}{extra} | {_us(m['median_us'])} | {_us(m['mean_us'])} | "
                             f"{m['epoch_s']:.3f} |" if m.get("epoch_s") is not None else
                             f"| {side} | {mode}{extra} | {_us(m['median_us'])} | {_us(m['mean_us'])} | - |")
        h = r.get("headline")
        if h:
            lines.append(f"\nbatch {bs}: ours ({h['ours_mode']}) {_us(h['ours_median_us'])} us vs PyTorch's "
                         f"fastest ({h['torch_mode']}) {_us(h['torch_median_us'])} us: {h['speedup']:.2f}x faster")
        if "again" in r["ours"] and "again" in r["torch"]:
            lines.append(f"batch {bs}: the fastest modes again, after each side's other runs: ours "
                         f"{_us(r['ours']['again']['median_us'])} us, PyTorch {_us(r['torch']['again']['median_us'])} us")
    par = result.get("parity")
    if par:
        tol = par.get("tolerances", PARITY_TOL)
        lines += ["", f"parity ({par['steps']} steps, batch {par['batch_size']}, lr {par.get('lr')}, {_parity_words(par)}): "
                  f"max |loss diff| first 50 {par['max_loss_diff_first_50']:.2e} (tol {tol['first_50']:.3g}), "
                  f"all {par['max_loss_diff']:.2e} (tol {tol['all']:.3g}); "
                  f"max relative param/stat diff {par['max_state_rel_diff']:.2e} -> {'PASS' if par['pass'] else 'FAIL'}"]
    return "\n".join(lines)


OUR_PRECISION_WORDS = {"fp32": "", "tf32": " (conv2 in TF32)", "bf16": " (conv2 and fc1 in bf16)"}


def _parity_words(par: dict) -> str:
    return {"fp32": "TF32 off", "tf32": "TF32 convolutions on both sides",
            "bf16": "bf16 products on both sides (PyTorch under autocast)"}[precision_of(par)]


def validate_result(result: dict):
    """The JSON's schema; raises ValueError naming the first problem."""
    def need(obj, key, kind, where):
        if key not in obj or not isinstance(obj[key], kind):
            raise ValueError(f"{where}: '{key}' missing or not {kind}")
        return obj[key]
    if need(result, "schema", str, "result") != SCHEMA:
        raise ValueError(f"result: schema is not {SCHEMA}")
    for k in ("device", "driver", "cuda_runtime", "cupy", "torch"):
        need(need(result, "env", dict, "result"), k, str, "env")
    need(result, "config", dict, "result")
    for bs, r in need(result, "batch_sizes", dict, "result").items():
        for side, modes in (("torch", TORCH_MODES), ("ours", OUR_MODES)):
            s = need(r, side, dict, f"batch {bs}")
            for ph in PHASES + ("step",):
                for k in ("median_us", "mean_us"):
                    need(need(need(s, "phases", dict, f"{bs}/{side}"), ph, dict, f"{bs}/{side}/phases"), k,
                         (int, float), f"{bs}/{side}/phases/{ph}")
            for mode, m in need(s, "modes", dict, f"{bs}/{side}").items():
                if mode not in modes:
                    raise ValueError(f"{bs}/{side}: unknown mode {mode}")
                if "error" not in m:
                    need(m, "median_us", (int, float), f"{bs}/{side}/{mode}")
                    need(m, "mean_us", (int, float), f"{bs}/{side}/{mode}")
        need(r, "headline", dict, f"batch {bs}")
    if result.get("parity") is not None:
        need(result["parity"], "pass", bool, "parity")


# ---- environment -------------------------------------------------------------------------------------


def require_torch_and_gpu():
    try:
        import torch
    except ImportError:
        raise Unavailable("PyTorch is not installed; install a CUDA build of torch, e.g. "
                          "pip install 'mnist-cuda[torch]'") from None
    if not torch.cuda.is_available():
        raise Unavailable(f"torch {torch.__version__} sees no CUDA GPU (a CPU-only build, or no GPU/driver)")
    try:
        cuda.require_gpu()
    except cuda.GPUUnavailable as e:
        raise Unavailable(str(e)) from None
    return torch


def environment(torch) -> dict:
    import cupy
    rt = cupy.cuda.runtime
    props = rt.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])

    def ver(v):
        return f"{v // 1000}.{v % 1000 // 10}"
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        driver = f"CUDA {ver(rt.driverGetVersion())}"
    return {"device": name, "driver": driver, "cuda_driver_api": ver(rt.driverGetVersion()),
            "cuda_runtime": ver(rt.runtimeGetVersion()), "cupy": cupy.__version__, "torch": torch.__version__,
            "torch_cuda": str(torch.version.cuda), "cudnn": str(torch.backends.cudnn.version()),
            "python": platform.python_version(), "sm_count": int(props["multiProcessorCount"])}


# ---- the two sides -------------------------------------------------------------------------------------


class OurSide:
    """Our net at one batch size, driven by mnist_cuda.step.Step (the trainer's step runner, with its own
    stream). Modes are Step's: "eager", "graph", and "phases" (a CUDA graph per phase)."""

    name = "ours"

    def __init__(self, state, batch, optimizer, version, channels, hidden, precision="fp32"):
        """optimizer: a learning rate (plain SGD) or optim.SGDOptions."""
        self.params = Parameters(channels, hidden)
        self.params.load_state_dict(state)
        self.cp = self.params.cp
        self.runner = Step(make_net(self.params, batch, version, precision), optimizer)
        self.batch = batch

    def new_event(self):
        return self.cp.cuda.Event()

    def event(self):
        ev = self.new_event()
        ev.record(self.runner.stream)
        return ev

    def elapsed_ms(self, a, b):
        return self.cp.cuda.get_elapsed_time(a, b)

    def synchronize(self):
        self.runner.synchronize()

    def step(self, x, y, idx, mode, phase_events=None, next_idx=None):
        """One step on the samples idx. In graph mode the step graph also loads the next step's samples,
        next_idx, where given; the other modes load each batch in their step."""
        self.runner.run(x, y, idx, next_idx, mode=mode, events=phase_events)

    def losses(self):
        return self.runner.losses(reset=True)

    def state_dict(self):
        return self.params.state_dict()


class TorchSide:
    """docs/design.md's network in torch.nn with torch.optim.SGD, one mode per instance."""

    name = "torch"

    def __init__(self, torch, state, batch, lr, mode, channels, hidden, fused=True, log_losses=False, options=None,
                 augment=0, seed=0, bf16=False):
        from mnist_cuda.torch_model import make_torch_model
        import torch.nn.functional as F
        self.torch, self.F, self.mode, self.batch = torch, F, mode, batch
        self.bf16 = bf16  # the forward and the loss under torch.autocast(dtype=torch.bfloat16)
        dev = torch.device("cuda")
        self.net = make_torch_model(channels, hidden).to(dev)
        self.net.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state.items()})
        self.net.train()
        self.fused = False
        self.scheduler = None
        if options is not None and not options.plain:  # torch.optim.SGD's options and the matching scheduler
            if mode not in ("eager", "compiled"):  # a scheduler's host-side rate cannot change inside a graph
                raise ValueError("the optimizer's options run in the modes without a CUDA graph")
            self.opt, self.scheduler = options.torch_optimizer(torch, self.net.parameters())
        elif fused:
            try:
                self.opt = torch.optim.SGD(self.net.parameters(), lr=lr, fused=True)
                self.fused = True
            except (TypeError, RuntimeError, ValueError):
                self.opt = torch.optim.SGD(self.net.parameters(), lr=lr)
        else:
            self.opt = torch.optim.SGD(self.net.parameters(), lr=lr)
        self.forward_fn = self.net
        self.compile_s = None
        if mode in ("compiled", "compiled+graph"):
            self.forward_fn = torch.compile(self.net)
        # static input buffers: the images arrive as bytes, as ours do, and are normalised in the step
        self.x_bytes = torch.zeros((batch, 1, 28, 28), dtype=torch.uint8, device=dev)
        # the input's 256 possible values, normalised with divisions by (0-dim) tensors on the GPU (a
        # division by a Python number would be a multiplication by its reciprocal: other bits)
        scale, mean, std = (torch.tensor(v, dtype=torch.float32, device=dev) for v in (255.0, data.MEAN, data.STD))
        self.table = (torch.arange(256, dtype=torch.uint8, device=dev) / scale - mean) / std
        if not self._normalizes_exactly(dev):
            raise RuntimeError("torch's normalisation of the input bytes differs from data.normalize")
        self.y = torch.zeros(batch, dtype=torch.int64, device=dev)
        self.stage_x = [torch.empty((batch, 1, 28, 28), dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        self.stage_y = [torch.empty(batch, dtype=torch.int64, pin_memory=True) for _ in range(2)]
        self.stage_free = [torch.cuda.Event() for _ in range(2)]
        self.loss_log = torch.zeros(1 << 16, device=dev) if log_losses else None  # parity only
        self.n_logged = 0
        self.graph = None
        self.i = 0
        # train's --augment: the offsets drawn as mnist_cuda.step.Step draws them (from seed and step), each
        # image moved on the GPU by a gather from the zero-padded batch
        self.augment, self.seed = augment, seed
        if augment:
            self.stage_offsets = [torch.empty((batch, 2), dtype=torch.int64, pin_memory=True) for _ in range(2)]
            self.offsets = torch.zeros((batch, 2), dtype=torch.int64, device=dev)
            self.grid = torch.arange(data.IMAGE_SIZE, device=dev)
            if not self._shifts_exactly(dev):
                raise RuntimeError("torch's shift of the images differs from shift_images_naive's")

    def _normalize(self, images):
        """(images/255 - MEAN)/STD in float32: the table of the 256 values, indexed (outside
        torch.compile in every mode: compiled, the arithmetic gives other bits (Triton's division), and
        the compiled lookup makes the compiled+graph step at batch 64 markedly slower)."""
        return self.table[images.long()]

    def _normalizes_exactly(self, dev):
        """The same bits as data.normalize (and our kernels) for all 256 byte values."""
        values = np.zeros((1, 1, 28, 28), dtype=np.uint8)
        values.flat[:256] = np.arange(256)
        got = self._normalize(self.torch.from_numpy(values).to(dev))
        return bool(np.array_equal(got.cpu().numpy(), data.normalize(values)))

    def _shift(self, images, offsets):
        """Each image moved by its (dx, dy): out[r, c] = images[r - dy, c - dx], 0 where that is outside."""
        a, size = self.augment, data.IMAGE_SIZE
        padded = self.F.pad(images, (a, a, a, a))
        rows = (self.grid[None, :] + a - offsets[:, 1:2])[:, :, None]
        cols = (self.grid[None, :] + a - offsets[:, 0:1])[:, None, :]
        batch = self.torch.arange(len(images), device=images.device)[:, None, None]
        return padded[batch, 0, rows, cols].view(len(images), 1, size, size)

    def _shifts_exactly(self, dev):
        """The same pixels as the numpy shift that checks our kernel, for every offset in range."""
        a, size, torch = self.augment, data.IMAGE_SIZE, self.torch
        offsets = np.array([(dx, dy) for dx in range(-a, a + 1) for dy in range(-a, a + 1)], np.int64)
        images = np.random.default_rng(0).integers(0, 256, (len(offsets), 1, size, size), dtype=np.uint8)
        got = self._shift(torch.from_numpy(images).to(dev), torch.from_numpy(offsets).to(dev)).cpu().numpy()
        return bool(np.array_equal(got, reference.shift_images(images, offsets)))

    def _inputs(self):
        return self._shift(self.x_bytes, self.offsets) if self.augment else self.x_bytes

    def _loss(self):
        """normalise, forward + loss; with bf16 under autocast, its cache off (cast weights kept between
        steps would be stale inside a CUDA graph: PyTorch's advice for graphs)."""
        with self.torch.autocast("cuda", dtype=self.torch.bfloat16, enabled=self.bf16, cache_enabled=False):
            return self.F.nll_loss(self.forward_fn(self._normalize(self._inputs())), self.y)

    def _body(self):
        """normalise, forward + loss, backward, update, zero-grad (grads stay allocated, as in a graph)."""
        loss = self._loss()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=False)
        return loss

    def prepare(self, x, y, order):
        """Compile / capture before anything is timed (compile time reported apart)."""
        torch = self.torch
        if self.mode not in ("graph", "compiled+graph", "compiled"):
            return
        idx = order[:self.batch]
        self.x_bytes.copy_(torch.from_numpy(x[idx]))
        self.y.copy_(torch.from_numpy(y[idx]))
        t0 = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph requires
            for _ in range(3):
                self._body()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        if self.mode.startswith("compiled"):
            self.compile_s = time.perf_counter() - t0
        if self.mode.endswith("graph"):
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.static_loss = self._body()
        torch.cuda.synchronize()

    def new_event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def event(self):
        ev = self.new_event()
        ev.record()
        return ev

    def elapsed_ms(self, a, b):
        return a.elapsed_time(b)

    def synchronize(self):
        self.torch.cuda.synchronize()

    def step(self, x, y, idx, mode=None, phase_events=None, next_idx=None):
        slot = self.i % 2
        self.stage_free[slot].synchronize()
        n = data.gather(x, y, idx, self.stage_x[slot].numpy(), self.stage_y[slot].numpy())
        assert n == self.batch
        if self.augment:
            rng = np.random.default_rng([self.seed, self.i])
            self.stage_offsets[slot].numpy()[...] = rng.integers(-self.augment, self.augment + 1, (self.batch, 2))
        rec = (lambda k: phase_events[k].record()) if phase_events else (lambda k: None)
        rec(0)
        self.x_bytes.copy_(self.stage_x[slot], non_blocking=True)
        self.y.copy_(self.stage_y[slot], non_blocking=True)
        if self.augment:
            self.offsets.copy_(self.stage_offsets[slot], non_blocking=True)
        self.stage_free[slot].record()
        rec(1)
        if self.graph is not None:
            self.graph.replay()
            loss = self.static_loss
        else:
            loss = self._loss()
            rec(2)
            loss.backward()
            rec(3)
            self.opt.step()
            if self.scheduler is not None:
                self.scheduler.step()
            rec(4)
            self.opt.zero_grad()  # PyTorch's default (set_to_none=True): its cheapest zero-grad
            rec(5)
        if self.loss_log is not None and self.n_logged < self.loss_log.numel():
            self.loss_log[self.n_logged].copy_(loss.detach(), non_blocking=True)
            self.n_logged += 1
        self.i += 1

    def restart(self, state, options, seed=0):
        """The weights of state and a fresh optimizer and scheduler, keeping the compiled model (a recipe's
        seeds, timed without recompiling); seed draws the augmentation's offsets."""
        torch = self.torch
        self.seed = seed
        self.net.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state.items()})
        self.opt, self.scheduler = options.torch_optimizer(torch, self.net.parameters())
        self.i = 0

    def accuracy(self, x, y) -> float:
        """Test accuracy in evaluation mode, with the uncompiled model (a compiled one would recompile)."""
        torch, correct = self.torch, 0
        self.net.eval()
        with torch.no_grad():
            for start in range(0, len(x), 1000):
                images = torch.from_numpy(np.ascontiguousarray(x[start:start + 1000])).cuda()
                predicted = self.net(self._normalize(images)).argmax(dim=1).cpu().numpy()
                correct += int((predicted == y[start:start + 1000]).sum())
        self.net.train()
        return correct / len(x)

    def losses(self):
        out = self.loss_log[:self.n_logged].cpu().numpy()
        self.n_logged = 0
        return out

    def state_dict(self):
        return {k: v.detach().cpu().numpy() for k, v in self.net.state_dict().items()}


# ---- measurements -------------------------------------------------------------------------------------


def batches(order, batch, count):
    """count batches of indices, cycling through epochs of `order` (seeded reshuffles)."""
    out, n, epoch = [], len(order), 0
    while len(out) < count:
        perm = order if epoch == 0 else np.random.default_rng([epoch, 7]).permutation(n)
        out += list(data.batch_indices(perm, batch, drop_last=True))
        epoch += 1
    return out[:count]


def measure_phases(side, x, y, order, warmup, steps, mode="eager"):
    """Per-phase times: six events per step, one synchronisation per step."""
    idxs = batches(order, side.batch, warmup + steps)
    samples = []
    for i, idx in enumerate(idxs):
        events = [side.new_event() for _ in range(len(PHASES) + 1)]
        side.step(x, y, idx, mode, phase_events=events)
        side.synchronize()
        if i >= warmup:
            samples.append([side.elapsed_ms(events[k], events[k + 1]) for k in range(len(PHASES))])
    a = np.asarray(samples)
    out = {ph: summarize_ms(a[:, k]) for k, ph in enumerate(PHASES)}
    out["step"] = summarize_ms(a.sum(axis=1))
    return out


def measure_loop(side, x, y, order, warmup, steps, mode, window=1, warmup_s=0.0, clock=time.perf_counter):
    """Whole-step times of a loop with no synchronisation inside: a timing event every `window` steps
    (steps // window windows); each window's mean step is one sample of the median. Untimed first: at
    least `warmup` steps and `warmup_s` seconds of them (on the first `warmup` batches, cycled): under a
    light load the GPU's clocks settle over about a second (docs/performance.md, section 5). Each step is
    handed the batch the one before prefetched (next_idx)."""
    windows = max(1, steps // window)
    steps = windows * window
    idxs = batches(order, side.batch, warmup + steps + 1)
    warm = idxs[:max(warmup, 1)]
    side.synchronize()
    t0, j = clock(), 0
    while j < warmup or clock() - t0 < warmup_s:
        side.step(x, y, warm[j % len(warm)], mode, next_idx=warm[(j + 1) % len(warm)])
        j += 1
    timed = [warm[j % len(warm)]] + idxs[warmup + 1:] if j else idxs  # (starting with the batch prefetched last)
    side.synchronize()
    marks = [side.event()]
    for i in range(steps):
        side.step(x, y, timed[i], mode, next_idx=timed[i + 1])
        if (i + 1) % window == 0:
            marks.append(side.event())
    side.synchronize()
    per_step = [side.elapsed_ms(a, b) / window for a, b in zip(marks, marks[1:])]
    out = summarize_ms(per_step)
    out["mean_us"] = side.elapsed_ms(marks[0], marks[-1]) * 1000.0 / steps
    out["window_steps"] = window
    return out


def measure_epoch(side, x, y, seed, mode):
    """Wall clock of one epoch: shuffle, gather, load and every step, until the GPU is done."""
    side.synchronize()
    t0 = time.perf_counter()
    order = data.epoch_order(len(x), seed, 1)
    idxs = list(data.batch_indices(order, side.batch, drop_last=True))
    for idx, next_idx in data.with_next(idxs):
        side.step(x, y, idx, mode, next_idx=next_idx)
    side.synchronize()
    return time.perf_counter() - t0


RECIPE_SEEDS = (0, 1, 2, 3, 4)


def run_recipe(torch, ds, args, channels, hidden, log) -> dict:
    """train's --recipe on both sides for seeds 0-4: the same initial weights, the same batches (train.plan),
    the same optimizer and schedule; PyTorch in each mode that takes a scheduler (eager, compiled; a CUDA
    graph would freeze its host-side rate), compiled once before anything is timed; the images shifted by
    the same offsets where the recipe augments. Training time to the end of the first epoch that reaches
    the recipe's target accuracy, or of every epoch for a recipe without a target (best); the test accuracy
    of each epoch; evaluation is not counted."""
    from mnist_cuda import train
    flags = train.RECIPES[args.recipe]
    target = flags["target_accuracy"] / 100 if "target_accuracy" in flags else None
    batch, augment = flags["batch_size"], flags.get("augment", 0)
    steps = flags["epochs"] * (len(ds.train_x) // batch)
    options = optim.options_from(flags, flags["lr"], steps)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True  # PyTorch's defaults for speed, as in the timed runs
    torch.backends.cuda.matmul.allow_tf32 = False
    sides = {}
    for mode in args.recipe_torch_modes:
        side = TorchSide(torch, reference.init_state_dict(0, channels, hidden), batch, flags["lr"], mode, channels,
                         hidden, options=options, augment=augment)
        warm = list(data.batch_indices(np.arange(len(ds.train_x)), batch, drop_last=True))[:30]
        for idx in warm:  # compile (and let cuDNN choose) before anything is timed
            side.step(ds.train_x, ds.train_y64, idx)
        side.synchronize()
        sides[mode] = side
    out = {"recipe": args.recipe, "flags": flags, "target": target, "seeds": {}}
    for run_seed in RECIPE_SEEDS:
        state = reference.init_state_dict(run_seed, channels, hidden)
        chunks = train.plan(len(ds.train_x), batch, run_seed, True, train.Position(), steps)
        params = Parameters(channels, hidden)
        params.load_state_dict(state)
        ours = Step(make_net(params, batch, "fast"), options, augment=augment, seed=run_seed)
        row = {"ours": _time_to_target(chunks, target, lambda c: train.run_chunk(ours, ds, c, c.end.step - len(c.batches)),
                                       ours.synchronize, lambda: ours.evaluate(ds.test_x, ds.test_y))}
        for mode, side in sides.items():
            side.restart(state, options, run_seed)
            run = lambda c, side=side: [side.step(ds.train_x, ds.train_y64, idx) for idx in c.batches]
            row[f"torch {mode}"] = _time_to_target(chunks, target, run, side.synchronize,
                                                   lambda side=side: side.accuracy(ds.test_x, ds.test_y))
        out["seeds"][str(run_seed)] = row
        log(f"recipe {args.recipe}, seed {run_seed}: {recipe_seed_line(row, target)}")
    return out


def recipe_seed_line(row: dict, target) -> str:
    """One seed's sides in a line: the final accuracy and the training seconds, to the target where there
    is one (saying so where a side missed it)."""
    def side(name, v):
        if target is None:
            seconds = f"in {v['seconds']:.3f} s"
        elif v["seconds_to_target"] is None:
            seconds = f"did not reach {100 * target:.1f}% in {v['seconds']:.3f} s"
        else:
            seconds = f"reached {100 * target:.1f}% in {v['seconds_to_target']:.3f} s"
        return f"{name} {100 * v['accuracy'][-1]:.2f}% {seconds}"
    return ", ".join(side(name, v) for name, v in row.items())


def _time_to_target(chunks, target, run, synchronize, accuracy) -> dict:
    seconds, accuracies, reached = 0.0, [], None
    for chunk in chunks:
        synchronize()
        t0 = time.perf_counter()
        run(chunk)
        synchronize()
        seconds += time.perf_counter() - t0
        accuracies.append(accuracy())
        if target is not None and accuracies[-1] >= target:
            reached = seconds
            break
    return {"accuracy": accuracies, "seconds_to_target": reached, "seconds": seconds}


def format_recipe(result: dict) -> str:
    """Per side, each seed's training seconds and final test accuracy: to the target where the recipe has
    one, else over all its epochs with the mean accuracy."""
    sides = list(next(iter(result["seeds"].values())))
    seeds = ", ".join(result["seeds"])
    if result["target"] is not None:
        lines = [f"--recipe {result['recipe']}: training seconds to {100 * result['target']:.1f}% test accuracy "
                 f"(evaluation not counted), seeds {seeds}"]
    else:
        lines = [f"--recipe {result['recipe']}: test accuracy after {result['flags']['epochs']} epochs and the "
                 f"training seconds (evaluation not counted), seeds {seeds}"]
    for side in sides:
        runs = [r[side] for r in result["seeds"].values()]
        accuracy = "accuracy " + " ".join(f"{100 * r['accuracy'][-1]:.2f}" for r in runs)
        if result["target"] is None:
            seconds = [r["seconds"] for r in runs]
            lines.append(f"  {side:16s} {accuracy} (mean {100 * np.mean([r['accuracy'][-1] for r in runs]):.2f}%); "
                         "seconds " + " ".join(f"{t:.2f}" for t in seconds) + f" (mean {np.mean(seconds):.2f} s)")
            continue
        times = [r["seconds_to_target"] for r in runs]
        mean = f"mean {np.mean(times):.3f} s" if all(t is not None for t in times) else "not every seed reached it"
        lines.append(f"  {side:16s} " + " ".join(f"{t:.3f}" if t is not None else "-" for t in times) + f"  ({mean}); "
                     + accuracy)
    return "\n".join(lines)


def parity_options(args) -> optim.SGDOptions:
    """The optimizer of the parity run: plain SGD at --parity-lr, or the options given, the schedule over
    the parity run's steps. With momentum m the rate is --parity-lr * (1 - m): the steps then have the size
    lr / (1 - m) of plain SGD's at --parity-lr, the size at which the tolerances were set (how fast two
    float32 runs of this network part grows with the size of its steps)."""
    momentum = args.momentum or 0.0
    return optim.options_from(vars(args), args.parity_lr * (1 - momentum), args.parity_steps)


def run_parity(torch, ds, state, args, channels, hidden) -> dict:
    """Train both sides from identical weights on identical batches: fp32 on both, with --precision tf32 TF32
    convolutions on both, with bf16 our bf16 products against PyTorch under autocast (the precision each
    side's timed runs use)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    batch = args.batch_sizes[0]
    options = parity_options(args)
    ours = OurSide(state, batch, options, args.kernels, channels, hidden, args.precision)
    theirs = TorchSide(torch, state, batch, args.parity_lr, "eager", channels, hidden, log_losses=True,
                       options=options, bf16=args.precision == "bf16")
    order = data.epoch_order(len(ds.train_x), args.seed, 0)
    idxs = batches(order, batch, args.parity_steps)
    ours.losses()
    for idx in idxs:
        ours.step(ds.train_x, ds.train_y, idx, "eager")
        theirs.step(ds.train_x, ds.train_y64, idx)
    ours.synchronize()
    lo, lt = ours.losses().astype(np.float64), theirs.losses().astype(np.float64)
    diff = np.abs(lo - lt)
    so, st = ours.state_dict(), theirs.state_dict()
    rel = {k: float(np.linalg.norm(so[k].astype(np.float64) - st[k]) / max(np.linalg.norm(st[k].astype(np.float64)), 1e-30))
           for k in so if not k.endswith("num_batches_tracked")}
    first = float(diff[:50].max())
    tol = PARITY_TOLERANCES[args.precision]
    result = {"steps": args.parity_steps, "batch_size": batch, "lr": options.lr, "precision": args.precision,
              "optimizer": optim.describe(options),
              "max_loss_diff_first_50": first, "max_loss_diff": float(diff.max()),
              "max_state_rel_diff": max(rel.values()), "state_rel_diff": rel,
              "tolerances": tol, "losses_ours": lo.tolist(), "losses_torch": lt.tolist(),
              "num_batches_tracked": [int(so["bn1.num_batches_tracked"]), int(st["bn1.num_batches_tracked"])]}
    result["pass"] = bool(first <= tol["first_50"] and result["max_loss_diff"] <= tol["all"]
                          and np.all(np.isfinite(diff)))
    return result


def run_timing(torch, ds, state, args, channels, hidden, batch, log) -> dict:
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.deterministic = False
    torch.backends.cudnn.allow_tf32 = True  # PyTorch's default for convolutions
    torch.backends.cuda.matmul.allow_tf32 = False  # and for matmul
    order = data.epoch_order(len(ds.train_x), args.seed, 0)
    out = {}

    # Each side's whole-step loops come first (graph modes before eager), its per-phase runs after: other
    # work earlier in the process (eager steps on another net of ours, per-phase runs) can make our step
    # graph slower for the rest of the process (docs/performance.md, section 5). Each side's fastest mode
    # is measured once more at the end ("again"), after all of its runs.
    ours = OurSide(state, batch, args.lr, args.kernels, channels, hidden, args.precision)
    o = {"modes": {}}
    for mode in ("graph", "eager"):
        log(f"batch {batch}: ours, whole step, {mode}")
        m = measure_loop(ours, ds.train_x, ds.train_y, order, args.warmup, args.steps, mode, args.timing_window,
                         args.warmup_seconds)
        if not args.no_epoch:
            m["epoch_s"] = measure_epoch(ours, ds.train_x, ds.train_y, args.seed, mode)
        o["modes"][mode] = m
    o["modes"] = {mode: o["modes"][mode] for mode in OUR_MODES}
    log(f"batch {batch}: ours, per phase")
    o["phases"] = measure_phases(ours, ds.train_x, ds.train_y, order, args.warmup, args.steps)
    # (Step's "phases" mode: a CUDA graph per phase; the result keeps its key, "phase_graphs")
    o["phase_graphs"] = measure_phases(ours, ds.train_x, ds.train_y, order, args.warmup, args.steps, "phases")
    out["ours"] = o

    bf16 = args.precision == "bf16"
    eager = TorchSide(torch, state, batch, args.lr, "eager", channels, hidden, bf16=bf16)
    t = {"modes": {}, "optimizer": "SGD(fused=True)" if eager.fused else "SGD(foreach)",
         "tf32": {"cudnn": True, "matmul": False}, "cudnn_benchmark": True, "autocast": "bfloat16" if bf16 else None}
    modes = ["graph"] + ([] if args.no_compiled_graph else ["compiled+graph"]) + (
        ["compiled"] if args.compile else []) + ["eager"]
    torch_sides = {}
    for mode in modes:
        log(f"batch {batch}: torch, whole step, {mode}")
        try:
            side = eager if mode == "eager" else TorchSide(torch, state, batch, args.lr, mode, channels, hidden,
                                                           bf16=bf16)
            side.prepare(ds.train_x, ds.train_y64, order)
            m = measure_loop(side, ds.train_x, ds.train_y64, order, args.warmup, args.steps, mode, args.timing_window,
                             args.warmup_seconds)
            if not args.no_epoch:
                m["epoch_s"] = measure_epoch(side, ds.train_x, ds.train_y64, args.seed, mode)
            if side.compile_s is not None:
                m["compile_s"] = side.compile_s
            torch_sides[mode] = side
        except Exception as e:  # a mode that does not work on this machine is reported, not fatal
            m = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
        t["modes"][mode] = m
    t["modes"] = {mode: t["modes"][mode] for mode in TORCH_MODES if mode in t["modes"]}
    log(f"batch {batch}: torch eager, per phase")
    t["phases"] = measure_phases(eager, ds.train_x, ds.train_y64, order, args.warmup, args.steps)
    out["torch"] = t

    fastest_t = min(((k, v) for k, v in t["modes"].items() if "error" not in v), key=lambda kv: kv[1]["median_us"])
    fastest_o = min(o["modes"].items(), key=lambda kv: kv[1]["median_us"])
    for d, side, mode, labels in ((o, ours, fastest_o[0], ds.train_y), (t, torch_sides[fastest_t[0]], fastest_t[0],
                                                                        ds.train_y64)):
        log(f"batch {batch}: {side.name}, whole step, {mode}, again")
        d["again"] = {"mode": mode, **measure_loop(side, ds.train_x, labels, order, args.warmup, args.steps, mode,
                                                   args.timing_window, args.warmup_seconds)}
    out["headline"] = {"torch_mode": fastest_t[0], "torch_median_us": fastest_t[1]["median_us"],
                       "ours_mode": fastest_o[0], "ours_median_us": fastest_o[1]["median_us"],
                       "speedup": fastest_t[1]["median_us"] / fastest_o[1]["median_us"]}
    return out


# Each side and mode has one colour in every panel: ours saturated and outlined, PyTorch's modes shades of
# one blue-grey, darker for the modes that do more to be fast. The order is the bars' order in a group.
MODE_COLOURS = {("ours", "eager"): "#f39c12", ("ours", "graph"): "#c0392b",
                ("torch", "eager"): "#c9d6e3", ("torch", "graph"): "#93acc6",
                ("torch", "compiled+graph"): "#2c4a6e", ("torch", "compiled"): "#5d7fa3"}
SIDE_NAMES = {"ours": "ours", "torch": "PyTorch"}


def _precision_words(result: dict) -> str:
    return {"fp32": "ours in fp32", "tf32": "ours with TF32 convolutions",
            "bf16": "ours with bf16 products"}[precision_of(result["config"])]


def _plain_log_axis(ax, label_of):
    """A log y axis ticked at 1, 2 and 5 of each decade, labelled as plain numbers (10^3 makes the
    reader convert)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: label_of(v)))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.grid(axis="y", color="#e3e3e3", linewidth=0.6)
    ax.set_axisbelow(True)


def _us_label(v):
    return f"{v:,.0f}" if v >= 1 else f"{v:g}"


def _s_label(v):
    return f"{v:g}"


def _grouped_bars(ax, result, value_of, label_of):
    """One group of bars per batch size: ours' modes, then PyTorch's, each that value_of gives a number
    for (a mode that failed leaves no gap), its value written above it. Returns the tallest bar of each
    group."""
    bss = list(result["batch_sizes"])
    width = 0.13
    tallest = []
    for group, bs in enumerate(bss):
        r = result["batch_sizes"][bs]
        bars = []
        for side, modes in (("ours", OUR_MODES), ("torch", TORCH_MODES)):
            for mode in modes:
                m = r[side]["modes"].get(mode)
                if m is not None and "error" not in m and value_of(m) is not None:
                    bars.append((side, mode, value_of(m)))
        left = group - width * (len(bars) - 1) / 2
        for k, (side, mode, value) in enumerate(bars):
            ours = side == "ours"
            x = left + k * width
            ax.bar(x, value, width * 0.9, color=MODE_COLOURS[side, mode], edgecolor="black",
                   linewidth=1.0 if ours else 0.0)
            ax.text(x, value * 1.06, label_of(value), ha="center", va="bottom", rotation=90, fontsize=7.5,
                    fontweight="bold" if ours else "normal")
        tallest.append(max((value for *_, value in bars), default=1.0))
    ax.set_xticks(range(len(bss)), [f"batch {bs}" for bs in bss])
    ax.tick_params(axis="x", length=0, labelsize=10)
    ax.set_xlim(-0.5, len(bss) - 0.5)
    return tallest


def plot(result, path: Path):
    """The comparison on one page, written atomically to path as a PNG: the whole step and the epoch of
    every mode on top (the headline), the per-phase eager times and the parity run below."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    bss = list(result["batch_sizes"])
    fig = plt.figure(figsize=(14, 8.5), layout="constrained")
    # a row of its own for the legend of both top panels: inside either it would cover bars, and a figure
    # legend "outside" the axes lands on the suptitle
    rows = fig.add_gridspec(3, 1, height_ratios=(0.05, 1.3, 1))
    legend_ax = fig.add_subplot(rows[0])
    legend_ax.set_axis_off()
    step_ax, epoch_ax = (fig.add_subplot(g) for g in rows[1].subgridspec(1, 2, width_ratios=(3, 2)))
    bottom = rows[2].subgridspec(1, len(bss) + 1)
    phase_axes = [fig.add_subplot(bottom[0, k]) for k in range(len(bss))]
    parity_ax = fig.add_subplot(bottom[0, len(bss)])

    # whole step: above each batch size's group, the speed-up of ours over PyTorch's fastest mode, placed
    # clear of the bars' rotated value labels
    tallest = _grouped_bars(step_ax, result, lambda m: m.get("median_us"), _us_label)
    _plain_log_axis(step_ax, _us_label)
    for group, bs in enumerate(bss):
        h = result["batch_sizes"][bs].get("headline")
        if h:
            above_labels = (group, tallest[group] * 2.2)
            step_ax.annotate(f"ours {h['ours_mode']}\nvs PyTorch {h['torch_mode']}", above_labels, ha="center",
                             va="bottom", fontsize=8, linespacing=1.1)
            step_ax.annotate(f"{h['speedup']:.2f}x faster", above_labels, xytext=(0, 20), textcoords="offset points",
                             ha="center", va="bottom", fontsize=12, fontweight="bold",
                             color=MODE_COLOURS["ours", "graph"])
    step_ax.set_ylim(top=max(tallest) * 6)
    step_ax.set_ylabel("median us per step (log)")
    torch_tf32 = any(r["torch"].get("tf32", {}).get("cudnn") for r in result["batch_sizes"].values())
    torch_bf16 = any(r["torch"].get("autocast") for r in result["batch_sizes"].values())
    step_ax.set_title("whole training step, every mode" +
                      (" (PyTorch under autocast(bfloat16))" if torch_bf16 else
                       " (PyTorch's convolutions in TF32, its default)" if torch_tf32 else ""))

    # one epoch's wall clock: permutation, gather, load and every step
    dataset = result["config"].get("dataset")
    epoch_ax.set_title(f"one epoch of the training set{f' ({dataset})' if dataset else ''}, wall clock")
    if any(m.get("epoch_s") is not None for r in result["batch_sizes"].values() for side in ("ours", "torch")
           for m in r[side]["modes"].values()):
        tallest = _grouped_bars(epoch_ax, result, lambda m: m.get("epoch_s"), lambda v: f"{v:.3f}")
        _plain_log_axis(epoch_ax, _s_label)
        epoch_ax.set_ylim(top=max(tallest) * 3)
        epoch_ax.set_ylabel("seconds per epoch (log)")
    else:
        epoch_ax.set_axis_off()
        epoch_ax.text(0.5, 0.5, "no epoch runs (--no-epoch)", ha="center", va="center", transform=epoch_ax.transAxes)

    shown = {(side, mode) for r in result["batch_sizes"].values() for side in ("ours", "torch")
             for mode, m in r[side]["modes"].items() if "error" not in m}
    handles = [Patch(facecolor=MODE_COLOURS[key], edgecolor="black", linewidth=1.0 if key[0] == "ours" else 0.0,
                     label=f"{SIDE_NAMES[key[0]]} {key[1]}")
               for key in MODE_COLOURS if key in shown]
    legend_ax.legend(handles=handles, loc="center", ncol=len(handles), fontsize=10, frameon=False)

    for ax, bs in zip(phase_axes, bss):
        r = result["batch_sizes"][bs]
        xs = np.arange(len(PHASES))
        ax.bar(xs - 0.2, [r["torch"]["phases"][p]["median_us"] for p in PHASES], 0.4,
               color=MODE_COLOURS["torch", "eager"], label="PyTorch eager")
        ax.bar(xs + 0.2, [r["ours"]["phases"][p]["median_us"] for p in PHASES], 0.4,
               color=MODE_COLOURS["ours", "eager"], edgecolor="black", linewidth=1.0, label="ours eager")
        ax.set_xticks(xs, [p.replace("_", "\n") for p in PHASES], fontsize=8)
        _plain_log_axis(ax, _us_label)
        # headroom above the tallest bar for the legend
        ax.set_ylim(top=max(r[side]["phases"][p]["median_us"] for side in ("torch", "ours") for p in PHASES) * 3)
        ax.tick_params(axis="y", labelsize=8)
        ax.set_title(f"batch {bs}: per phase, eager", fontsize=10)
    phase_axes[0].set_ylabel("median us (log)")
    phase_axes[0].legend(fontsize=8, loc="upper right")

    par = result.get("parity")
    if par:
        tol = par.get("tolerances", PARITY_TOL)
        ax = parity_ax
        ax.plot(par.get("losses_torch", []), color=MODE_COLOURS["torch", "compiled+graph"], linewidth=1.2,
                label="PyTorch")
        ax.plot(par.get("losses_ours", []), "--", color=MODE_COLOURS["ours", "graph"], linewidth=1.2, label="ours")
        verdict = "PASS" if par["pass"] else "FAIL"
        ax.set_title(f"parity: loss per step, {verdict}", fontsize=10,
                     color="black" if par["pass"] else MODE_COLOURS["ours", "graph"], fontweight="bold")
        lr = f", lr {par['lr']}" if par.get("lr") is not None else ""
        ax.text(0.97, 0.97, f"batch {par['batch_size']}{lr}, {_parity_words(par)}\n"
                f"max |diff| {par['max_loss_diff']:.1e} (tol {tol['all']:.3g})",
                transform=ax.transAxes, ha="right", va="top", fontsize=7.5)
        ax.set_xlabel("step", fontsize=9)
        ax.tick_params(labelsize=8)
        ax.legend(fontsize=8, loc="lower left")
    else:
        parity_ax.set_axis_off()
        parity_ax.text(0.5, 0.5, "no parity run", ha="center", va="center", transform=parity_ax.transAxes)

    fig.suptitle(f"{result['env'].get('device', '?')}, {_precision_words(result)}: "
                 f"our CUDA training step against PyTorch's", fontsize=14, fontweight="bold")
    try:
        save_figure(fig, path)
    finally:
        plt.close(fig)


def _slug(text):
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def check_batch_sizes(parser, args, train_samples, channels, hidden):
    """A usage error now, not after the other sizes' runs, for a batch size larger than the training set
    or too large for our nets (make_net says why)."""
    params = Parameters(channels, hidden)
    for batch in args.batch_sizes:
        if batch > train_samples:
            parser.error(f"argument --batch-sizes: {batch} is larger than the training set ({train_samples} samples)")
        try:
            make_net(params, batch, args.kernels, args.precision)
        except ValueError as e:
            parser.error(f"argument --batch-sizes: {e}")


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    prog = "compare_pytorch.py"
    if args.precision != "fp32" and args.kernels != "fast":
        parser.error(f"argument --precision: {args.precision} needs --kernels fast (the naive kernels compute in "
                     f"plain fp32)")
    if args.parity_only and not args.parity_steps:
        parser.error("argument --parity-only: needs --parity-steps > 0")
    if args.recipe and args.precision != "fp32":
        parser.error("argument --precision: the recipes run in fp32 on both sides (train's --recipe); leave it out")
    if args.recipe_torch_modes != RECIPE_TORCH_MODES and not args.recipe:
        parser.error("argument --recipe-torch-modes: needs --recipe (the timed runs take every mode)")
    try:
        options = parity_options(args)
    except ValueError as e:
        parser.error(str(e))
    if not options.plain and not args.parity_only:
        parser.error("the optimizer's options are compared in the parity run: give --parity-only (the timed "
                     "runs train with plain SGD, the design's step)")
    if args.show is not None:
        if args.png is not None:
            require_matplotlib(parser, "--png")  # before reading: a missing matplotlib is a usage error
        try:
            result = json.loads(args.show.read_text())
            validate_result(result)
        except (OSError, ValueError) as e:
            print(f"{prog}: cannot show {args.show}: {e}", file=sys.stderr)
            return 2
        print(format_tables(result))
        if args.png is not None:
            try:
                plot(result, args.png)
            except OSError as e:
                print(f"{prog}: cannot write {args.png}: {e}", file=sys.stderr)
                return 2
            print(f"\nplot: {args.png}")
        return 0
    try:
        torch = require_torch_and_gpu()
    except Unavailable as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    if args.steps < 100 or args.warmup < 20:
        print(f"{prog}: note: fewer than 100 timed or 20 warm-up steps: a smoke run, not a benchmark",
              file=sys.stderr)

    def log(msg):
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    try:
        ds = data.load(args.dataset, args.data_dir, empty=cuda.pinned_empty)
    except data.DataError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    ds.train_y64 = ds.train_y.astype(np.int64)  # torch's nll_loss wants int64 labels
    channels, hidden = (32, 64), 128
    state = reference.init_state_dict(args.seed, channels, hidden)
    env = environment(torch)
    result = {"schema": SCHEMA, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": "python scripts/compare_pytorch.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "env": env,
              "config": {"lr": args.lr, "seed": args.seed, "dataset": args.dataset, "steps": args.steps,
                         "timing_window": args.timing_window, "warmup": args.warmup,
                         "warmup_seconds": args.warmup_seconds, "kernels": args.kernels, "precision": args.precision,
                         "channels": list(channels),
                         "hidden": hidden, "batch_sizes": args.batch_sizes},
              "batch_sizes": {}, "parity": None}
    check_batch_sizes(parser, args, len(ds.train_x), channels, hidden)
    if args.recipe:
        result["recipe"] = run_recipe(torch, ds, args, channels, hidden, log)
        print(format_recipe(result["recipe"]))
        out = args.out or REPO / "benchmarks" / "results" / f"recipe-{args.recipe}-{_slug(env['device'])}.json"
        write_json(out, result)
        return 0
    if args.parity_only:
        par = run_parity(torch, ds, state, args, channels, hidden)
        o = par["optimizer"]
        extra = "".join(f", {k} {o[k]}" for k in ("momentum", "dampening", "weight_decay") if o[k]) + (
            ", nesterov" if o["nesterov"] else "") + (f", {o['schedule']} schedule" if o["schedule"] != "constant" else "")
        print(f"parity ({par['steps']} steps, batch {par['batch_size']}, lr {par['lr']}{extra}, kernels {args.kernels}, "
              f"{_parity_words(par)}): max |loss diff| first 50 {par['max_loss_diff_first_50']:.2e}, all {par['max_loss_diff']:.2e}"
              f" -> {'PASS' if par['pass'] else 'FAIL'}")
        return 0 if par["pass"] else 1
    for batch in args.batch_sizes:
        result["batch_sizes"][str(batch)] = run_timing(torch, ds, state, args, channels, hidden, batch, log)
    if args.parity_steps:  # after the timed runs: its eager steps on a net of their own would slow ours
        log(f"parity: {args.parity_steps} steps at batch {args.batch_sizes[0]}")
        result["parity"] = run_parity(torch, ds, state, args, channels, hidden)

    out = args.out or REPO / "benchmarks" / "results" / (
        f"compare-{_slug(env['device'])}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    print(format_tables(result))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json(out, result, announce=False)
    except OSError as e:
        print(f"{prog}: cannot write {out}: {e}", file=sys.stderr)
        return 2
    print(f"\nresult: {out}")
    if not args.no_png:
        png = args.png or out.with_suffix(".png")
        try:
            plot(result, png)
            print(f"plot:   {png}")
        except ImportError:
            print("plot:   skipped (matplotlib not installed: pip install 'mnist-cuda[plot]')")
        except OSError as e:
            print(f"plot:   not written ({png}: {e})")
    if result["parity"] is not None and not result["parity"]["pass"]:
        print(f"{prog}: parity FAILED", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
