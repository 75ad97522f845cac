"""vLLM's csrc as written, at TORCH_LIBRARY's cost: vLLM-style ops registered
six ways, timed against each other from Python and from C++.

    python benchmarks/bench_vllm_style.py [--quick] [--device cpu|cuda|all] [--build-dir DIR]
                                          [--samples 101] [--target-ms 0.5] [--inference-mode]
                                          [--ops rms_norm,...] [--sizes small,large]

The library (benchmarks/vllm_style/) is written the way vLLM's csrc/ is:
in-place ops taking `Tensor!` outputs and flat scalars, kernels that take the
tensors they write as `Tensor&`, one impl per device:

    rms_norm(Tensor! out, Tensor input, Tensor weight, float epsilon) -> ()
    fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor weight, float epsilon) -> ()
    silu_and_mul(Tensor! out, Tensor input) -> ()
    rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, int head_size,
                     Tensor cos_sin_cache, bool is_neox) -> ()

One set of kernels per torch ABI (csrc/cpu, and csrc/cuda when torch and the
build have CUDA), registered by six libraries, each with its own op namespace,
all loaded in this process:

    torch           TORCH_LIBRARY, a plain torch extension (no opforge)
    box             STABLE_TORCH_LIBRARY with TORCH_BOX, torch's stable ABI (no opforge)
    dropin          torch_bindings.cpp's def/impl lines under OPFORGE_LIBRARY, C++ API mode
    dropin_stable   the same source built with opforge_add_library(... STABLE ...)
    structs         OPFORGE_LIBRARY with NormCfg / RopeCfg struct parameters, C++ API mode
    structs_stable  the same on the stable ABI

Before timing, every library is called through torch.ops (and opforge's
through opforge.ops) on the same inputs: the outputs must be bitwise equal to
the TORCH_LIBRARY build's (float32 and bfloat16, both rotary styles, key or
none), and close to a torch reference.

Sizes: small is 4 tokens x 128 (head_size 64), large 32 tokens x 4096 (head
size 128); silu_and_mul's input is twice as wide. Each row compares two ways
of calling one op on the same tensors. A sample times N calls (N chosen for
about --target-ms; with CUDA tensors the device is synchronized before and
after, so the kernels count); samples come in pairs whose order alternates;
a ratio is the median of the pairs' ratios, with the first and third
quartiles in brackets; µs are the median per call of each side. From C++, the
calls are made by libvllm_style_timing.so: torch's typed handle with the
kernel's own signature (as C++ calls a TORCH_LIBRARY op), or opforge::OpRef
(opforge::Call) with flat or struct arguments. The control rows time the
TORCH_LIBRARY op against itself: the noise floor; the context rows show what
torch's stable ABI costs by itself (torch calls a TORCH_BOX kernel boxed).

An opforge op does two things a TORCH_LIBRARY op registered this way does
not: it bumps the version of every tensor it writes (an ADInplaceOrView
kernel; torch's fallback leaves a custom op's outputs at their old version),
and a gradient requested through it is an error naming the op (an Autograd
kernel; torch's fallback gives a silent None). Both are skipped under
torch.inference_mode(), as vLLM runs its model: --inference-mode times there.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

import opforge

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "vllm_style")
EPSILON = 1e-6
OPS = ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "rotary_embedding")
# tokens, hidden size, head size
SIZES = {"small": (4, 128, 64), "large": (32, 4096, 128)}
MAX_POSITION = 64
# Library key -> op namespace (and library file, lib<namespace>.so).
NAMESPACES = {
    "torch": "vllm_style_torch",
    "box": "vllm_style_box",
    "dropin": "vllm_style_dropin",
    "dropin_stable": "vllm_style_dropin_stable",
    "structs": "vllm_style_structs",
    "structs_stable": "vllm_style_structs_stable",
}
TIMING = "vllm_style_timing"
# The tensors each op writes, by position in its tensor list.
WRITTEN = {"rms_norm": (0,), "fused_add_rms_norm": (0, 1), "silu_and_mul": (0,), "rotary_embedding": (1, 2)}


def build(build_dir: str, quiet: bool = False) -> str:
    """Configures (once) and builds benchmarks/vllm_style into build_dir
    against this Python's opforge and torch; returns build_dir."""
    os.makedirs(build_dir, exist_ok=True)

    def run(command):
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")

    if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        if not quiet:
            print(f"configuring {SOURCE} in {build_dir} ...", file=sys.stderr, flush=True)
        run(["cmake", "-S", SOURCE, "-B", build_dir, "-G", "Ninja", f"-DCMAKE_PREFIX_PATH={opforge.cmake_prefix_path}",
             f"-DPython_EXECUTABLE={sys.executable}"])
    if not quiet:
        print(f"building {build_dir} ...", file=sys.stderr, flush=True)
    run(["cmake", "--build", build_dir, "--parallel", str(os.cpu_count() or 2)])
    return build_dir


def load(build_dir: str) -> None:
    for ns in [*NAMESPACES.values(), TIMING]:
        opforge.load_library(os.path.join(build_dir, f"lib{ns}.so"))


def has_cuda_kernels() -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"{NAMESPACES['torch']}::rms_norm", "CUDA")


# --- inputs -------------------------------------------------------------------


def cos_sin_cache(head_size: int, dtype, device) -> torch.Tensor:
    """[MAX_POSITION, head_size]: head_size / 2 cosines then as many sines, as vLLM's RotaryEmbedding builds it."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size))
    freqs = torch.outer(torch.arange(MAX_POSITION, dtype=torch.float32), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dtype=dtype, device=device)


def make_inputs(op: str, size: str, device: str, dtype=torch.float32, seed: int = 0) -> list[torch.Tensor]:
    """The op's tensors in schema order (written ones included)."""
    tokens, hidden, head_size = SIZES[size]
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(dtype=dtype, device=device)

    if op == "rms_norm":
        return [torch.empty(tokens, hidden, dtype=dtype, device=device), randn(tokens, hidden), randn(hidden)]
    if op == "fused_add_rms_norm":
        return [randn(tokens, hidden), randn(tokens, hidden), randn(hidden)]
    if op == "silu_and_mul":
        return [torch.empty(tokens, hidden, dtype=dtype, device=device), randn(tokens, 2 * hidden)]
    positions = torch.randint(0, MAX_POSITION, (tokens,), generator=g).to(device)
    return [positions, randn(tokens, hidden), randn(tokens, hidden), cos_sin_cache(head_size, dtype, device)]


def reference(op: str, t: list[torch.Tensor], head_size: int, is_neox: bool) -> list[torch.Tensor]:
    """The written tensors after the op, computed with torch in float32."""
    f = [x.float() if x is not None and x.is_floating_point() else x for x in t]

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPSILON) * w

    if op == "rms_norm":
        return [norm(f[1], f[2])]
    if op == "fused_add_rms_norm":
        residual = (f[0] + f[1]).to(t[0].dtype).float()
        return [norm(residual, f[2]), residual]
    if op == "silu_and_mul":
        d = f[1].shape[-1] // 2
        return [torch.nn.functional.silu(f[1][..., :d]) * f[1][..., d:]]
    positions, cache = f[0], f[3]
    cos, sin = cache[positions].chunk(2, dim=-1)  # [tokens, rot_dim / 2]
    out = []
    for x in (f[1], f[2]) if f[2] is not None else (f[1],):
        x = x.view(x.shape[0], -1, head_size)
        if is_neox:
            a, b = x[..., : head_size // 2], x[..., head_size // 2:]
        else:
            a, b = x[..., 0::2], x[..., 1::2]
        c, s = cos[:, None, :], sin[:, None, :]
        ra, rb = a * c - b * s, b * c + a * s
        y = torch.cat([ra, rb], -1) if is_neox else torch.stack([ra, rb], -1).flatten(-2)
        out.append(y.reshape(x.shape[0], -1))
    return out


# --- the ways of calling an op ----------------------------------------------------


def caller(lib: str, api: str, op: str, t: list, head_size: int, is_neox: bool = True) -> Callable[[], None]:
    """A no-argument function making one call of `op` of library `lib`
    through torch.ops or opforge.ops, on the tensors `t`."""
    ns = NAMESPACES[lib]
    fn = getattr(getattr(torch.ops if api == "torch.ops" else opforge.ops, ns), op)
    structs = lib.startswith("structs")
    if structs and api == "opforge.ops":
        types = getattr(opforge.structs, ns)
        if op in ("rms_norm", "fused_add_rms_norm"):
            cfg = types.NormCfg(EPSILON)
            return lambda: fn(t[0], t[1], t[2], cfg)
        if op == "rotary_embedding":
            rope = types.RopeCfg(head_size, is_neox)
            return lambda: fn(t[0], t[1], t[2], t[3], rope)
    if op in ("rms_norm", "fused_add_rms_norm"):
        return lambda: fn(t[0], t[1], t[2], EPSILON)
    if op == "silu_and_mul":
        return lambda: fn(t[0], t[1])
    if structs:  # the struct op's flat schema: cos_sin_cache, then the struct's leaves
        return lambda: fn(t[0], t[1], t[2], t[3], head_size, is_neox)
    return lambda: fn(t[0], t[1], t[2], head_size, t[3], is_neox)


PY_APIS = [("torch", "torch.ops"), ("box", "torch.ops"), ("dropin", "torch.ops"), ("dropin", "opforge.ops"),
           ("dropin_stable", "torch.ops"), ("dropin_stable", "opforge.ops"), ("structs", "torch.ops"),
           ("structs", "opforge.ops"), ("structs_stable", "torch.ops"), ("structs_stable", "opforge.ops")]


def check_equal(device: str) -> str:
    """Calls every library every way on the same inputs; raises unless all
    outputs are bitwise equal to the TORCH_LIBRARY build's and close to torch's."""
    cases = 0
    for op in OPS:
        for size in SIZES:
            for dtype in (torch.float32, torch.bfloat16):
                for is_neox, with_key in ((True, True), (False, True), (True, False)):
                    if op != "rotary_embedding" and (not is_neox or not with_key):
                        continue
                    head_size = SIZES[size][2]
                    inputs = make_inputs(op, size, device, dtype, seed=cases)
                    if not with_key:
                        inputs[2] = None
                    first = None
                    for lib, api in PY_APIS:
                        t = [x.clone() if x is not None else None for x in inputs]
                        caller(lib, api, op, t, head_size, is_neox)()
                        written = [t[i] for i in WRITTEN[op] if t[i] is not None]
                        if first is None:
                            first = written
                            tol = {} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
                            for got, want in zip(written, reference(op, inputs, head_size, is_neox)):
                                torch.testing.assert_close(got.float(), want, **tol)
                        elif not all(torch.equal(a, b) for a, b in zip(written, first)):
                            raise AssertionError(f"{op} ({size}, {dtype}, is_neox={is_neox}, key={with_key}, "
                                                 f"{device}): {lib} through {api} differs from TORCH_LIBRARY's")
                    cases += 1
    return (f"Equality check ({device}): passed: {len(NAMESPACES)} libraries, {len(PY_APIS)} ways of calling, "
            f"{cases} cases, outputs bitwise equal to TORCH_LIBRARY's and close to torch's")


# --- timing ---------------------------------------------------------------------------


@dataclass
class Row:
    label: str
    where: str  # "python" or "cpp"
    first: tuple[str, str]  # python: (library, api); cpp: ("how", library)
    second: tuple[str, str]


ROWS = [
    Row("torch.ops: drop-in / TORCH_LIBRARY", "python", ("dropin", "torch.ops"), ("torch", "torch.ops")),
    Row("torch.ops: stable drop-in / TORCH_BOX", "python", ("dropin_stable", "torch.ops"), ("box", "torch.ops")),
    Row("opforge.ops drop-in / torch.ops TORCH_LIBRARY", "python", ("dropin", "opforge.ops"),
        ("torch", "torch.ops")),
    Row("opforge.ops stable drop-in / torch.ops TORCH_BOX", "python", ("dropin_stable", "opforge.ops"),
        ("box", "torch.ops")),
    Row("opforge.ops struct op / torch.ops TORCH_LIBRARY", "python", ("structs", "opforge.ops"),
        ("torch", "torch.ops")),
    Row("opforge.ops stable struct op / torch.ops TORCH_BOX", "python", ("structs_stable", "opforge.ops"),
        ("box", "torch.ops")),
    Row("torch.ops: TORCH_BOX / TORCH_LIBRARY (context)", "python", ("box", "torch.ops"), ("torch", "torch.ops")),
    Row("control: torch.ops TORCH_LIBRARY / itself", "python", ("torch", "torch.ops"), ("torch", "torch.ops")),
    Row("C++ typed call: drop-in / TORCH_LIBRARY", "cpp", ("typed", "dropin"), ("typed", "torch")),
    Row("C++ typed call: stable drop-in / TORCH_BOX", "cpp", ("typed", "dropin_stable"), ("typed", "box")),
    Row("C++ opforge::Call: struct op / flat drop-in", "cpp", ("call_struct", "structs"), ("call", "dropin")),
    Row("C++ opforge::Call: stable struct op / stable flat drop-in", "cpp", ("call_struct", "structs_stable"),
        ("call", "dropin_stable")),
    Row("C++ opforge::Call drop-in / typed call TORCH_LIBRARY", "cpp", ("call", "dropin"), ("typed", "torch")),
    Row("C++ typed call: TORCH_BOX / TORCH_LIBRARY (context)", "cpp", ("typed", "box"), ("typed", "torch")),
    Row("control: C++ typed call TORCH_LIBRARY / itself", "cpp", ("typed", "torch"), ("typed", "torch")),
]


@dataclass
class Cell:
    first_us: float
    second_us: float
    ratio: float
    q1: float
    q3: float


def summarize(first_ns: list[float], second_ns: list[float]) -> Cell:
    ratios = [a / b for a, b in zip(first_ns, second_ns)]
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    return Cell(statistics.median(first_ns) / 1e3, statistics.median(second_ns) / 1e3, statistics.median(ratios),
                q1, q3)


def time_python(a: Callable[[], None], b: Callable[[], None], cuda: bool, target_s: float, samples: int):
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def ns_per_call(fn, calls):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        return (time.perf_counter() - start) / calls * 1e9

    per_call = max(ns_per_call(a, 20), ns_per_call(b, 20))  # warms up too
    calls = max(1, int(target_s * 1e9 / per_call))
    out_a, out_b = [], []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for s in range(samples):
            if s % 2 == 0:
                out_a.append(ns_per_call(a, calls))
                out_b.append(ns_per_call(b, calls))
            else:
                out_b.append(ns_per_call(b, calls))
                out_a.append(ns_per_call(a, calls))
    finally:
        if gc_was_enabled:
            gc.enable()
    return out_a, out_b


def time_cpp(row: Row, op: str, t: list, head_size: int, target_s: float, samples: int):
    time_pair = torch.ops.vllm_style_timing.time_pair

    def side(how, lib):
        return f"{how}:{NAMESPACES[lib]}"

    out = time_pair(op, side(*row.first), side(*row.second), t, head_size, target_s * 1e6, samples)
    return out[:samples], out[samples:]


def measure(device: str, ops, sizes, target_s: float, samples: int):
    """{(row label, op, size): Cell}"""
    cells = {}
    cuda = device == "cuda"
    for op in ops:
        for size in sizes:
            head_size = SIZES[size][2]
            # Repeated calls change the written tensors, within range: rotary
            # rotates (cos_sin_cache holds true cosines and sines), the
            # fused norm adds a normalized input into residual.
            t = make_inputs(op, size, device)
            for row in ROWS:
                if row.where == "python":
                    a = caller(*row.first, op, t, head_size)
                    b = caller(*row.second, op, t, head_size)
                    first_ns, second_ns = time_python(a, b, cuda, target_s, samples)
                else:
                    first_ns, second_ns = time_cpp(row, op, t, head_size, target_s, samples)
                cells[(row.label, op, size)] = summarize(first_ns, second_ns)
    return cells


def render(device: str, cells, ops, sizes, samples: int, target_s: float) -> str:
    header = ["comparison (first / second)", "op"]
    for size in sizes:
        header += [f"{size}: first µs", f"{size}: second µs", f"{size}: ratio [25%-75%]"]
    threads = f", {torch.get_num_threads()} threads" if device == "cpu" else f", {torch.cuda.get_device_name()}"
    mode = ", inference mode" if torch.is_inference_mode_enabled() else ""
    lines = [f"### {device.upper()}: torch {torch.__version__}{threads}{mode}, {samples} pairs of "
             f"~{target_s * 1e3:g} ms samples", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in ROWS:
        for op in ops:
            cols = [row.label, op]
            for size in sizes:
                c = cells[(row.label, op, size)]
                cols += [f"{c.first_us:.3f}", f"{c.second_us:.3f}", f"{c.ratio:.3f}x [{c.q1:.3f}-{c.q3:.3f}]"]
            lines.append("| " + " | ".join(cols) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", default=os.path.join("build", f"bench_vllm_style-{torch.__version__}"),
                        help="kept, so a second run only rebuilds what changed; one per torch")
    parser.add_argument("--device", choices=("cpu", "cuda", "all"), default="all",
                        help="all: the CPU, and CUDA when torch and the build have it")
    parser.add_argument("--samples", type=int, default=101, help="pairs of samples per row")
    parser.add_argument("--target-ms", type=float, default=0.5, help="about how long one sample runs")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--inference-mode", action="store_true",
                        help="time under torch.inference_mode(), as vLLM's model runner calls its ops")
    parser.add_argument("--quick", action="store_true", help="few short samples: checks that everything runs")
    args = parser.parse_args(argv)
    samples, target_s = (args.samples, args.target_ms / 1e3) if not args.quick else (7, 2e-4)
    ops = [op for op in args.ops.split(",") if op]
    sizes = [size for size in args.sizes.split(",") if size]
    for name, known in (("op", OPS), ("size", SIZES)):
        unknown = set(ops if name == "op" else sizes) - set(known)
        if unknown:
            parser.error(f"unknown {name}s {sorted(unknown)}; known: {', '.join(known)}")

    load(build(args.build_dir))
    devices = ["cpu"] if args.device in ("cpu", "all") else []
    cuda_ok = torch.cuda.is_available() and has_cuda_kernels()
    if args.device == "cuda" and not cuda_ok:
        parser.error("--device cuda needs torch with CUDA, a GPU and a build with the CUDA kernels")
    if args.device in ("cuda", "all") and cuda_ok:
        devices.append("cuda")
    print(f"vLLM-style ops, torch {torch.__version__}, opforge {opforge.__version__}, libraries in {args.build_dir}")
    if args.device == "all" and not cuda_ok:
        print("CUDA rows: not measured (no GPU, or torch or this build without CUDA)")
    for device in devices:
        print(check_equal(device))
    for device in devices:
        print()
        with torch.inference_mode(args.inference_mode):
            cells = measure(device, ops, sizes, target_s, samples)
            print(render(device, cells, ops, sizes, samples, target_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
