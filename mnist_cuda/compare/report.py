"""A comparison's result: its JSON schema, the check of a saved one, its terminal tables, and the machine it
ran on."""

from __future__ import annotations

import platform
import subprocess

from ..cli import precision_of
from ..step import PHASES
from .candidates import NAMES
from .parity import PARITY_TOL
from .timing import OUR_MODES

SCHEMA = "mnist_cuda.compare/2"
OUR_PRECISION_WORDS = {"fp32": "", "tf32": " (conv2 in TF32)", "bf16": " (conv2 and fc1 in bf16)"}


class Unavailable(Exception):
    """torch, a CUDA build of it, CuPy or a GPU is missing."""


def _us(v):
    return "-" if v is None else f"{v:,.1f}"


def _ratio(a, b):
    return "-" if a is None or b is None or b <= 0 else f"{a / b:,.1f}x"


def parity_words(par: dict) -> str:
    return {
        "fp32": "TF32 off",
        "tf32": "TF32 convolutions on both sides",
        "bf16": "bf16 products on both sides (PyTorch under autocast)",
    }[precision_of(par)]


def _mode_row(side: str, mode: str, m: dict) -> str:
    if "error" in m:
        return f"| {side} | {mode} | failed: {m['error'][:60]} | | |"
    extra = f" (compile {m['compile_s']:.1f} s)" if m.get("compile_s") is not None else ""
    epoch = f"{m['epoch_s']:.3f}" if m.get("epoch_s") is not None else "-"
    return f"| {side} | {mode}{extra} | {_us(m['median_us'])} | {_us(m['mean_us'])} | {epoch} |"


def _headline_lines(bs: str, r: dict) -> list[str]:
    h, lines = r.get("headline"), []
    if h:
        lines.append(
            f"\nbatch {bs}: ours ({h['ours_mode']}) {_us(h['ours_median_us'])} us vs PyTorch's fastest "
            f"({h['torch_mode']}) {_us(h['torch_median_us'])} us: {h['speedup']:.2f}x faster"
        )
        check = h.get("outside_check")
        if check:
            lines.append(
                f"batch {bs}: PyTorch's fastest against the outside figure ({check['ceiling_us']:,.0f} us): "
                + ("at or below it" if check["pass"] else "SLOWER: PyTorch is not at its best in this run")
            )
    again = [r[side]["again"] for side in ("ours", "torch") if "again" in r[side]]
    if len(again) == 2:
        words = [_us(a.get("median_us")) + " us" if "error" not in a else "failed" for a in again]
        lines.append(
            f"batch {bs}: the fastest modes again, after each side's other runs: ours {words[0]}, PyTorch {words[1]}"
        )
    return lines


def format_tables(result: dict) -> str:
    """The terminal tables of a result: per phase and whole step, per batch size."""
    env = result["env"]
    lines = [
        f"{env.get('device', '?')} | driver {env.get('driver', '?')} | CUDA {env.get('cuda_runtime', '?')} | "
        f"CuPy {env.get('cupy', '?')} | torch {env.get('torch', '?')} | kernels {result['config'].get('kernels')}"
        + OUR_PRECISION_WORDS[precision_of(result["config"])]
    ]
    for bs, r in result["batch_sizes"].items():
        lines += [
            "",
            f"batch {bs}: per phase, median us (events between phases, one sync per step)",
            "| phase | torch eager | ours eager | speed-up | ours graphs per phase |",
            "|---|---:|---:|---:|---:|",
        ]
        tp, op, og = r["torch"]["phases"], r["ours"]["phases"], r["ours"].get("phase_graphs", {})
        for ph in PHASES + ("step",):
            t, o = tp.get(ph, {}).get("median_us"), op.get(ph, {}).get("median_us")
            g = og.get(ph, {}).get("median_us")
            lines.append(f"| {ph} | {_us(t)} | {_us(o)} | {_ratio(t, o)} | {_us(g)} |")
        window = next((m.get("window_steps", 1) for m in r["ours"]["modes"].values() if "median_us" in m), 1)
        how = "a timing event per step" if window == 1 else f"median of {window}-step windows' mean step"
        lines += [
            "",
            f"batch {bs}: whole step (no sync inside the loop; {how})",
            "| side | mode | median us | mean us | epoch s |",
            "|---|---|---:|---:|---:|",
        ]
        lines += [_mode_row(side, mode, m) for side in ("torch", "ours") for mode, m in r[side]["modes"].items()]
        lines += _headline_lines(bs, r)
    par = result.get("parity")
    if par:
        tol = par.get("tolerances", PARITY_TOL)
        lines += [
            "",
            f"parity ({par['steps']} steps, batch {par['batch_size']}, lr {par.get('lr')}, {parity_words(par)}): "
            f"max |loss diff| first 50 {par['max_loss_diff_first_50']:.2e} (tol {tol['first_50']:.3g}), "
            f"all {par['max_loss_diff']:.2e} (tol {tol['all']:.3g}); "
            f"max relative param/stat diff {par['max_state_rel_diff']:.2e} -> {'PASS' if par['pass'] else 'FAIL'}",
        ]
    return "\n".join(lines)


def validate_result(result) -> None:
    """The JSON's schema; raises ValueError naming the first problem in words."""

    def need(obj, key, kind, where):
        if key not in obj or not isinstance(obj[key], kind):
            raise ValueError(f"{where}: '{key}' is missing or is not {KIND_WORDS.get(kind, 'of the right kind')}")
        return obj[key]

    if not isinstance(result, dict):
        raise ValueError(f"not a comparison result (the file holds a JSON {type(result).__name__}, not an object)")
    if need(result, "schema", str, "result") != SCHEMA:
        raise ValueError(f"not a comparison result of this version (schema {result['schema']!r}, want {SCHEMA!r})")
    for k in ("device", "driver", "cuda_runtime", "cupy", "torch"):
        need(need(result, "env", dict, "result"), k, str, "env")
    need(result, "config", dict, "result")
    for bs, r in need(result, "batch_sizes", dict, "result").items():
        for side, modes in (("torch", NAMES), ("ours", OUR_MODES)):
            s = need(r, side, dict, f"batch {bs}")
            for ph in PHASES + ("step",):
                for k in ("median_us", "mean_us"):
                    need(
                        need(need(s, "phases", dict, f"{bs}/{side}"), ph, dict, f"{bs}/{side}/phases"),
                        k,
                        (int, float),
                        f"{bs}/{side}/phases/{ph}",
                    )
            for mode, m in need(s, "modes", dict, f"{bs}/{side}").items():
                if mode not in modes:
                    raise ValueError(f"{bs}/{side}: unknown mode {mode!r}")
                if "error" not in m:
                    need(m, "median_us", (int, float), f"{bs}/{side}/{mode}")
                    need(m, "mean_us", (int, float), f"{bs}/{side}/{mode}")
        need(r, "headline", dict, f"batch {bs}")
    if result.get("parity") is not None:
        need(result["parity"], "pass", bool, "parity")


KIND_WORDS = {str: "text", dict: "an object", bool: "true or false", (int, float): "a number"}


def require_torch_and_gpu():
    from .. import cuda

    try:
        import torch
    except ImportError:
        raise Unavailable(
            "PyTorch is not installed; install a CUDA build of torch, e.g. pip install 'mnist-cuda[torch]'"
        ) from None
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
        driver = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            .stdout.strip()
            .splitlines()[0]
        )
    except (OSError, IndexError, subprocess.SubprocessError):
        driver = f"CUDA {ver(rt.driverGetVersion())}"
    return {
        "device": name,
        "driver": driver,
        "cuda_driver_api": ver(rt.driverGetVersion()),
        "cuda_runtime": ver(rt.runtimeGetVersion()),
        "cupy": cupy.__version__,
        "torch": torch.__version__,
        "torch_cuda": str(torch.version.cuda),
        "cudnn": str(torch.backends.cudnn.version()),
        "python": platform.python_version(),
        "sm_count": int(props["multiProcessorCount"]),
    }
