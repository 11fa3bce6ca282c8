#!/usr/bin/env python3
"""Is a persistent step worth building at batch 64? The training forward as one persistent kernel
(dev/persistent_forward.cu: conv1 computed where conv2 stages it, three grid-wide waits), checked, then timed
against the step's own forward phase.

The go/no-go was written down before the prototype was built (docs/performance.md, section 6): the
persistent forward must take at most GO_US, against the forward phase's 43.2 us as a graph of its own (H200),
or the backward is not worth building.

Checked on one batch of real MNIST at the initial weights of --seed:
  - against FastNet.forward on the same batch: conv1's pooled output and its argmax, conv2's output (the same
    bits: the same arithmetic), BN2's statistics, fc1's input, the logits and the gradient at fc1's
    pre-activation (relative error: the sums run in another order);
  - against the float64 reference (mnist_cuda.reference): the logits, the loss, that gradient.
Timed as compare_pytorch.py times a step: graphs replayed back to back, a CUDA event every 10, the median of
the windows, after at least a second of untimed replays. Graphs: FastNet's forward phase (with conv2's
weight staging on its side branch, as in the step); the persistent kernel after the weight staging; the
persistent kernel alone (where the update would leave the weights staged).

    PYTHONPATH=. python dev/persistent_forward.py --data-dir data/mnist [--out persistent.json]
"""
from __future__ import annotations

import sys
import time

import numpy as np

from mnist_cuda.cli import (Parser, data_inputs, existing_dir, gpu_or_exit, int_in_range, load_data_or_exit,
                            non_negative_at_most, output_path, refuse_clashes, seed, write_json)
from mnist_cuda.sizes import MAX_SECONDS, MAX_TIMED

PROG = "persistent_forward.py"
BATCH = 64
GO_US = 27.0
WINDOW = 10
SLICES = 49  # fc1's k slices (PF_SLICES)
# the two forms of conv1's part (PF_CONV1_FIRST): computed where conv2's product stages it, chunk by chunk while
# the tensor cores work on the chunk before; or for every channel into shared memory before the product
FORMS = {"conv1 as staged": 0, "conv1 first": 1}
STAGES = ("setup: BN1 statistics, the image", "conv1 (first form only)", "conv2 (with conv1 as staged)", "BN2 parts", "grid wait 1",
          "BN2 statistics, BN2 + ReLU + pool", "grid wait 2", "fc1 items", "grid wait 3", "head")


def build_parser():
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=existing_dir, default=None,
                   help="the MNIST files (else $MNIST_DATA_DIR, then the cache, then a download)")
    p.add_argument("--seed", type=seed, default=0, help="the initial weights (reference.init_state_dict)")
    p.add_argument("--windows", type=int_in_range(5, MAX_TIMED), default=50,
                   help="timed windows of 10 replays per graph")
    p.add_argument("--warmup-seconds", type=non_negative_at_most(MAX_SECONDS), default=1.0,
                   help="untimed replays for at least this long first")
    p.add_argument("--out", type=output_path, default=None, metavar="PATH", help="write the figures as JSON here")
    return p


def compile_options(conv1_first: int, arch_options=()) -> tuple[str, ...]:
    """NVRTC options of the prototype: the -D options of the two kernel sources it includes, its own, the arch."""
    from mnist_cuda import cuda
    from mnist_cuda.ops import conv1_bn_relu_pool, conv2_implicit_gemm
    defines = {**conv1_bn_relu_pool._src.defines, **conv2_implicit_gemm._src.defines, "PF_BATCH": BATCH,
               "PF_CONV1_FIRST": conv1_first}
    return cuda.COMPILE_OPTIONS + tuple(cuda._define(k, v) for k, v in defines.items()) + tuple(arch_options)


CONV2 = "../kernels/fast/conv2_implicit_gemm.cu"
# conv2's image tile as the prototype calls it, conv3x3_image_tile_loaded: a copy of the step's
# conv3x3_image_tile made when the source is read, given its block's place and a loader of its input
# (Conv1Pooled, PooledInShared) instead of an input tensor. The step's own kernels keep their form: the same
# change made in kernels/ measured 1.1% slower at batch 512 and 0.5-0.7% at 4096 (docs/performance.md).
TILE_EDITS = (
    ("template <Precision PR, TileForm FORM>\n__device__ __forceinline__ void conv3x3_image_tile(const float* in, "
     "const float4* quads, float* out, int Cin,\n                                                   int Cout) {",
     "template <Precision PR, TileForm FORM, class Load>\n__device__ __forceinline__ void conv3x3_image_tile_loaded("
     "const Load& load, const float4* quads, float* out, int Cin, int Cout, int img, int tile, int half) {"),
    ("const int img = blockIdx.x, n0 = blockIdx.y * TILE, r0 = blockIdx.z * ROWS;",
     "const int n0 = tile * TILE, r0 = half * ROWS;"),
    ("    const float* x = in + (size_t)img * Cin * SS;\n", ""),
    ("quads + (size_t)blockIdx.y * chunks", "quads + (size_t)tile * chunks"),
    ("""#pragma unroll
            for (int i = 0; i < VALUES; i++) {
                const int c = chunk * CHUNK + VALUES * (e / IN_PIXELS) + i;
                in_next[r][i] = inside && c < Cin ? x[c * SS + row * S + p % S] : 0.0f;
            }""", "load(chunk * CHUNK + VALUES * (e / IN_PIXELS), row, p % S, inside, in_next[r]);"),
)


class SourceChanged(RuntimeError):
    """kernels/fast/conv2_implicit_gemm.cu no longer has what TILE_EDITS change."""


def source() -> str:
    """dev/persistent_forward.cu with its includes (kernels/ is their root) and, after conv2's source,
    conv3x3_image_tile_loaded."""
    from mnist_cuda import cuda
    text = cuda.read_source("../dev/persistent_forward.cu")
    start = text.index("template <Precision PR, TileForm FORM>\n__device__ __forceinline__ void conv3x3_image_tile(")
    tile = text[start:text.index("// ---- weight gradient", start)]
    for old, new in TILE_EDITS:
        if tile.count(old) != 1:
            raise SourceChanged(f"{CONV2[3:]}'s conv3x3_image_tile no longer holds {old.splitlines()[0]!r} once; "
                                "update TILE_EDITS in dev/persistent_forward.py")
        tile = tile.replace(old, new)
    end = text.index(f"// ---- end {CONV2} ----") + len(f"// ---- end {CONV2} ----")
    return text[:end] + "\n" + tile + text[end:]


def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    refuse_clashes(parser, inputs=data_inputs("mnist", args.data_dir), outputs=[("--out", args.out)])
    gpu_or_exit(PROG)
    train_x, train_y, _, _ = load_data_or_exit(PROG, "mnist", args.data_dir, quiet=True)
    images_u8 = np.ascontiguousarray(train_x[:BATCH]).reshape(BATCH, 1, 28, 28)
    labels_np = train_y[:BATCH].astype(np.int64)
    import cupy as cp
    from mnist_cuda import cuda, data, reference
    from mnist_cuda.nets import Parameters, FastNet, EPS, MOMENTUM
    from mnist_cuda.ops import conv2_implicit_gemm

    state = reference.init_state_dict(args.seed)
    params = Parameters()
    params.load_state_dict(state)
    net = FastNet(params, BATCH)
    xb = cp.asarray(images_u8)
    labels = cp.asarray(labels_np.astype(np.int32))
    net.prepare_batch(xb, BATCH, 0)
    running0 = params.stats.copy()

    # ---- the prototype, in its two forms ----
    threads, blocks = conv2_implicit_gemm.CONV_THREADS, 4 * BATCH
    # the prototype's tiles are FastNet's forward at this batch: 32 output channels, the weights' parts stacked
    assert net.conv2_forward == "forward_stacked", net.conv2_forward
    shared = conv2_implicit_gemm.image_tile_shared_bytes(net.conv2_forward, "fp32")
    kernels = {}
    from cupy_backends.cuda.api import driver
    for form, first in FORMS.items():
        arch = ("-arch=sm_90a",) if cp.cuda.Device().compute_capability == "90" else ()
        module = cp.RawModule(code=source(), options=compile_options(first, arch))
        kernel = kernels[form] = module.get_function("persistent_forward")
        kernel.preferred_shared_memory_carveout = 100
        kernel.max_dynamic_shared_size_bytes = shared
        per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, threads, shared)
        print(f"{form}: {blocks} blocks, {per_sm} per SM fit on {cuda.sm_count()} SMs ({kernel.num_regs} registers, "
              f"{kernel.local_size_bytes} bytes local, {kernel.shared_size_bytes} + {shared} bytes of shared memory)")
        if per_sm * cuda.sm_count() < blocks:
            print(f"{PROG}: the grid does not fit on the GPU at once; the grid-wide waits need it to", file=sys.stderr)
            return 1
    sync = cp.zeros(2, cp.uint32)  # the grid-wide waits' counter, and the count of waits that gave up
    f32, c1, c2, H = cp.float32, net.c1, net.c2, net.hidden
    out = {name: cp.zeros(shape, dtype) for name, shape, dtype in (
        ("mean1", c1, f32), ("invstd1", c1, f32), ("mean2", c2, f32), ("invstd2", c2, f32),
        ("out1", net.out1.shape, f32), ("argmax1", net.out1.shape, cp.uint8), ("a2", net.a2.shape, f32),
        ("bn2_partial", (c2, 2 * BATCH, 2), f32), ("out2", net.out2.shape, f32), ("argmax2", net.out2.shape, cp.uint8),
        ("fc1_partial", (SLICES, BATCH, H), f32), ("fc1_out", (BATCH, H), f32), ("logits", (BATCH, 10), f32),
        ("d_pre", (BATCH, H), f32), ("sample_loss", BATCH, f32))}
    p, r = params.p, params.running
    stamps = cp.zeros((blocks, len(STAGES) + 1), cp.uint64)

    def persistent(form, stamped=False):
        kernels[form]((blocks,), (threads,), (
            xb, labels, net.moments[0], p["conv1.weight"], p["bn1.weight"], p["bn1.bias"], net.forward_quads,
            p["bn2.weight"], p["bn2.bias"], p["fc1.weight"], p["fc1.bias"], p["fc2.weight"], p["fc2.bias"],
            np.float32(EPS), np.float32(MOMENTUM), out["mean1"], out["invstd1"], r["bn1.running_mean"],
            r["bn1.running_var"], out["mean2"], out["invstd2"], r["bn2.running_mean"], r["bn2.running_var"],
            out["out1"], out["argmax1"], out["a2"], out["bn2_partial"], out["out2"], out["argmax2"],
            out["fc1_partial"], out["fc1_out"], out["logits"], out["d_pre"], out["sample_loss"], sync,
            stamps if stamped else np.uint64(0)), shared_mem=shared)

    def stage_weights():
        net._stage_conv2_weights()

    # ---- checks: FastNet's forward, then each form, from the same running statistics ----
    cuda.preload()
    net.forward(xb, labels, BATCH, True, 0)
    cp.cuda.Device().synchronize()
    fast = {"out1": net.out1.get(), "argmax1": net.argmax1.get(), "a2": net.a2.get(), "mean2": net.mean2.get(),
            "invstd2": net.invstd2.get(), "out2": net.out2.get(), "argmax2": net.argmax2.get(),
            "logits": net.logits.get(), "d_pre": net.d_pre.get(), "fc1_out": net.fc1_out.get(),
            "running": params.stats.get()}
    model = reference.ReferenceModel(state)
    images = data.normalize(images_u8).astype(np.float64)
    logits64, cache = model.forward(images, train=True)
    loss64, dlogits64 = reference.nll_loss(logits64, labels_np)
    d_pre64 = (dlogits64 @ model.state["fc2.weight"]) * (cache["fc1"] > 0)
    running_after = params.stats.copy()
    checks, passed = {}, True
    for form in FORMS:
        for v in out.values():
            v.fill(0)
        params.stats[...] = running0
        persistent(form)
        cp.cuda.Device().synchronize()
        got = {k: v.get() for k, v in out.items()}
        c = checks[form] = {
            "out1 (same bits)": float(np.max(np.abs(got["out1"] - fast["out1"]))),
            "argmax1 differing": int(np.sum(got["argmax1"] != fast["argmax1"])),
            "a2 (same bits)": float(np.max(np.abs(got["a2"] - fast["a2"]))),
            "mean2": rel_err(got["mean2"], fast["mean2"]), "invstd2": rel_err(got["invstd2"], fast["invstd2"]),
            "out2": rel_err(got["out2"], fast["out2"]),
            "argmax2 differing": int(np.sum(got["argmax2"] != fast["argmax2"])),
            "fc1_out": rel_err(got["fc1_out"], fast["fc1_out"]), "logits": rel_err(got["logits"], fast["logits"]),
            "d_pre": rel_err(got["d_pre"], fast["d_pre"]),
            "running statistics": rel_err(params.stats.get(), fast["running"]),
            "logits vs float64": rel_err(got["logits"], logits64),
            "loss vs float64": abs(float(np.mean(got["sample_loss"])) - float(loss64)) / abs(float(loss64)),
            "d_pre vs float64": rel_err(got["d_pre"], d_pre64),
            "grid waits given up": int(sync.get()[1]),
        }
        for name, value in c.items():
            print(f"check {form}: {name:24s} {value:.3g}")
        exact = c["out1 (same bits)"] == 0 and c["a2 (same bits)"] == 0 and c["argmax1 differing"] == 0
        close = all(c[k] < 1e-4 for k in ("logits vs float64", "loss vs float64", "d_pre vs float64", "mean2",
                                          "invstd2", "out2", "logits", "d_pre", "running statistics"))
        passed = passed and exact and close and c["argmax2 differing"] == 0 and c["grid waits given up"] == 0
    params.stats[...] = running_after

    # ---- timing ----
    graphs = {"forward phase (FastNet)": cuda.capture(lambda: net.forward(xb, labels, BATCH, True, 0))}
    for form in FORMS:
        graphs[f"{form}, after the weight staging"] = cuda.capture(stage_weights, lambda f=form: persistent(f))
        graphs[f"{form}, alone"] = cuda.capture(lambda f=form: persistent(f))
    stream = cp.cuda.Stream(non_blocking=True)
    times = {}
    for name in list(graphs) * 2:  # each twice, alternated; the second round counts
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < args.warmup_seconds:
            for _ in range(WINDOW):
                graphs[name].launch(stream)
            stream.synchronize()
        marks = [cp.cuda.Event()]
        marks[0].record(stream)
        for _ in range(args.windows):
            for _ in range(WINDOW):
                graphs[name].launch(stream)
            marks.append(cp.cuda.Event())
            marks[-1].record(stream)
        stream.synchronize()
        times[name] = float(np.median([cp.cuda.get_elapsed_time(a, b) * 1e3 / WINDOW for a, b in zip(marks, marks[1:])]))
    if int(sync.get()[1]):
        print(f"{PROG}: a grid-wide wait gave up while timing", file=sys.stderr)
        return 1
    for name, us in times.items():
        print(f"{name:50s} {us:7.2f} us")

    # ---- where each form's time goes: each stage's end, from the first block's start (ns stamps) ----
    breakdown = {}
    for form in FORMS:
        stamped = cuda.capture(lambda f=form: persistent(f, True))
        ends = []
        for _ in range(30):
            stamped.launch(stream)
            stream.synchronize()
            t = stamps.get().astype(np.int64)
            ends.append((t[:, 1:] - t[:, 0].min()) / 1e3)  # [blocks, stages] us
        ends = np.stack(ends)  # [launches, blocks, stages]
        last = np.median(ends.max(axis=1), axis=0)  # the last block's end of each stage
        median_block = np.median(np.median(ends, axis=1), axis=0)
        rows = breakdown[form] = []
        print(f"{form} (stamped): stage, the median block's end, the last block's end, the stage by the last ends")
        for k, name in enumerate(STAGES):
            took = last[k] - (last[k - 1] if k else 0.0)
            rows.append({"stage": name, "median_block_end_us": float(median_block[k]),
                         "last_block_end_us": float(last[k]), "last_block_stage_us": float(took)})
            print(f"  {name:40s} {median_block[k]:8.2f} us {last[k]:8.2f} us {took:8.2f} us")
    best = min(times[f"{form}, after the weight staging"] for form in FORMS)
    verdict = "go" if best <= GO_US else "no-go"
    print(f"go/no-go at <= {GO_US} us (with the weight staging): {verdict} ({best:.2f} us); "
          f"checks {'PASS' if passed else 'FAIL'}")
    if args.out:
        write_json(args.out, {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "batch": BATCH,
                              "median_us": times, "stages": breakdown, "go_us": GO_US, "verdict": verdict,
                              "checks": checks, "checks_pass": passed})
    return 0 if passed else 1

if __name__ == "__main__":
    sys.exit(main())
