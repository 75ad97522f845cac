"""Symmetric-memory arguments on the GPUs of one host (docs/symm_mem.md).

The ranks (one per GPU, at least two) compile
`f(x) = all_reduce(x * 2 + 1, "sum", group_name)`, where `all_reduce` is an op
whose `input` is a symm_mem argument and whose body is torch's one-shot
all-reduce (it reads the peers' buffers directly, so its input must be
symmetric): a Python op, and the C++ op of the example kernel library
(examples/kernel_library, `kernels::one_shot_all_reduce`) in its C++ API build
and its stable-ABI build. Each rank checks the sum, and that Inductor's
generated code allocates the producer of `input` with `empty_strided_p2p` and
hands that buffer to the op with no copy in between. On torch 2.13+ this goes
through torch's native registry, on 2.11 through opforge's lowering.

The library's `kernels::all_reduce` picks one-shot or two-shot by message size
and world size: each rank checks it against NCCL at a small and a large size,
in float32 and bfloat16, eagerly and compiled, with the threshold of the
library's table and with each path forced, and reads from the profiler which
of torch's ops it called.

    python -m pytest tests/gpu/test_symm_mem_gpu.py -v -s

Each rank is its own process (this file, run as a script), with NVLink
multicast off: TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NCCL_NVLS_ENABLE=0,
NVSHMEM_DISABLE_NVLS=1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys

import pytest
import torch

NO_MULTICAST = {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1"}
OP = "opforge_gpu_test::all_reduce"
TIMEOUT_S = 420
# The chooser's sizes: below and above every threshold of the library's table.
SMALL, LARGE = 16 << 10, 4 << 20


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# Every GPU of the host, one rank each.
WORLD_SIZE = _gpus()
needs_two_gpus = pytest.mark.skipif(WORLD_SIZE < 2, reason=f"needs 2 CUDA GPUs (found {WORLD_SIZE})")


def _library(kind: str) -> str:
    """The example kernel library's path for `kind`, built here (with CUDA)."""
    if kind == "python":
        return ""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python"))
    from cpp_ext import build

    stable = kind == "cpp-stable"
    folder = build("examples/kernel_library", "kernel_library_stable" if stable else "kernel_library",
                   *(["KERNELS_STABLE=ON"] if stable else []))
    return os.path.join(folder, "libopforge_kernels.so")


@needs_two_gpus
@pytest.mark.parametrize("kind", ["python", "cpp", "cpp-stable"])
def test_compiled_producer_of_a_symm_mem_argument_is_a_symmetric_buffer(tmp_path, kind):
    results = _launch(tmp_path, "compile", kind, _library(kind))
    for r in results:
        print(f"{kind} rank {r['rank']}: torch {r['torch']}, path {r['path']}, max error {r['max_error']}, "
              f"eager max error {r['eager_max_error']}")
        print(f"  allocation: {r['p2p_line']}")
        print(f"  producer:   {r['producer_line']}")
        print(f"  op call:    {r['op_line']}")
    for r in results:
        assert r["path"] == ("native" if r["has_native_registry"] else "lowering")
        assert r["eager_max_error"] == 0.0
        assert r["max_error"] == 0.0
        assert r["p2p_count"] == 1, r["code"]
        assert f'group_name="{r["group_name"]}"' in r["p2p_line"]
        assert r["op_arg"] == r["p2p_buffer"], r["code"]
        assert r["flat_call"] == (r["path"] == "lowering"), r["op_line"]
        assert r["producer_buffers"] == [r["p2p_buffer"]], r["code"]
        assert not r["copies"], r["code"]


@needs_two_gpus
@pytest.mark.parametrize("kind", ["cpp", "cpp-stable"])
def test_the_cpp_all_reduce_equals_nccl_on_both_paths(tmp_path, kind):
    results = _launch(tmp_path, "chooser", kind, _library(kind))
    failures = []
    for r in results:
        for c in r["cases"]:
            line = (f"{kind} rank {r['rank']}/{r['world_size']}: {c['how']:8} {c['dtype']:8} {c['bytes']:>8} B "
                    f"threshold {c['threshold']:>20}: path {c['path']:8} (expected {c['expected']}), "
                    f"max |diff| vs nccl {c['max_error']:.3g} (atol {c['atol']:.3g}, rtol {c['rtol']:.3g})")
            if r["rank"] == 0:
                print(line)
            if c["path"] != c["expected"] or not c["close"]:
                failures.append(line + ("\n" + c["mismatch"] if c["mismatch"] else ""))
            if c["how"] == "compiled":
                if c["p2p_count"] != 1 or c["op_arg"] != c["p2p_buffer"] or c["copies"]:
                    failures.append(f"{line}\n  compiled code without one symmetric buffer handed to the op "
                                    f"uncopied:\n{c['code']}")
    print(f"{kind}: checked against NCCL on ranks {sorted(r['rank'] for r in results)} of {WORLD_SIZE}")
    paths = {c["path"] for r in results for c in r["cases"]}
    two_shot_table = results[0]["two_shot_min_bytes"] != 2**63 - 1
    assert paths == ({"one_shot", "two_shot"} if two_shot_table else {"one_shot"}), paths
    assert not failures, "\n".join(failures)


def _launch(tmp_path, test: str, kind: str, library: str) -> list[dict]:
    port = _free_port()
    procs = []
    for rank in range(WORLD_SIZE):
        env = dict(os.environ, **NO_MULTICAST,
                   TORCHINDUCTOR_CACHE_DIR=str(tmp_path / f"inductor{rank}"),
                   TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0")
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--test", test, "--rank", str(rank),
             "--world-size", str(WORLD_SIZE), "--port", str(port), "--out", str(tmp_path), "--kind", kind,
             "--library", library],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=TIMEOUT_S)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for rank, (proc, log) in enumerate(zip(procs, logs)):
        assert proc.returncode == 0, f"rank {rank} exited with {proc.returncode}:\n{log}"
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(WORLD_SIZE)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# One rank (this file run as a script)

def _init(rank: int, world_size: int, port: int) -> tuple[torch.device, str]:
    for key, value in NO_MULTICAST.items():
        assert os.environ.get(key) == value, f"{key} must be {value} before CUDA starts"
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            device_id=device)
    group_name = dist.group.WORLD.group_name
    enable = symm_mem.enable_symm_mem_for_group
    if not getattr(enable, "__deprecated__", None):  # torch that still needs it
        enable(group_name)
    return device, group_name


def _rank_main(rank: int, world_size: int, port: int, out_dir: str, kind: str, library: str) -> None:
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem
    from torch._C._distributed_c10d import _SymmetricMemory
    from torch._inductor.utils import run_and_get_code

    import opforge

    Tensor = torch.Tensor
    device, group_name = _init(rank, world_size, port)

    if kind == "python":
        op = OP

        def fake(input: Tensor, reduce_op: str, group_name: str) -> Tensor:
            return torch.empty_like(input)

        @opforge.op(OP, fake=fake, symm_mem_args=("input",))
        def all_reduce(input: Tensor, reduce_op: str, group_name: str) -> Tensor:
            return torch.ops.symm_mem.one_shot_all_reduce(input, reduce_op, group_name)
    else:
        # The C++ op: its tags reach torch's registry (or opforge's lowering)
        # when the library loads, whatever was imported before.
        op = "kernels::one_shot_all_reduce"
        opforge.load_library(library)
        cfg = opforge.structs.kernels.ReduceCfg

        def all_reduce(input: Tensor, reduce_op: str, group_name: str) -> Tensor:
            return opforge.ops.kernels.one_shot_all_reduce(input, cfg(reduce_op), group_name)

    assert opforge.symm_mem.symm_mem_args(op) == ["input"], "symm_mem_args did not reach the registry"

    # Compiled: Inductor must allocate x * 2 + 1 symmetrically.
    def f(x: Tensor) -> Tensor:
        return all_reduce(x * 2 + 1, "sum", group_name)

    base = torch.arange(8 * 128, dtype=torch.float32, device=device).reshape(8, 128)
    torch._dynamo.reset()
    out, codes = run_and_get_code(torch.compile(f, fullgraph=True), base + rank)
    want = sum((base + r) * 2 + 1 for r in range(world_size))
    code = "\n".join(codes)

    # Eager, with a symmetric buffer from the allocator the output code uses.
    buf = _SymmetricMemory.empty_strided_p2p((8, 128), (128, 1), torch.float32, device, group_name)
    symm_mem.rendezvous(buf, group_name)
    buf.fill_(rank + 1.0)
    eager = all_reduce(buf, "sum", group_name)
    eager_error = (eager - sum(r + 1.0 for r in range(world_size))).abs().max().item()
    dist.barrier()
    dist.destroy_process_group()

    report = {
        "rank": rank,
        "world_size": world_size,
        "torch": torch.__version__,
        "has_native_registry": opforge.symm_mem.has_native_registry(),
        "kind": kind,
        "path": opforge.symm_mem.handled_by(op),
        "group_name": group_name,
        "eager_max_error": eager_error,
        "max_error": (out - want).abs().max().item(),
        **_inspect(code, op),
        "code": code,
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f_out:
        json.dump(report, f_out)


def _tolerances(dtype: torch.dtype, world_size: int, amax: float) -> tuple[float, float]:
    """torch.testing's default (rtol, atol) for `dtype`, scaled for a sum of
    `world_size` terms of magnitude up to `amax`: each add may round by the
    dtype's rtol relative to a partial sum of up to world_size * amax."""
    rtol, atol = {torch.float32: (1.3e-6, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}[dtype]
    return rtol * world_size, atol * world_size + rtol * world_size * amax


def _symm_mem_ops_called(fn) -> tuple[object, set[str]]:
    """fn()'s result and the names of torch's symm_mem ops it called (the
    dispatcher records every op under the profiler, nested ones too)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = fn()
        torch.cuda.synchronize()
    return result, {e.name for e in prof.events() if e.name.startswith("symm_mem::")}


def _path(names: set[str]) -> str:
    if "symm_mem::two_shot_all_reduce_out" in names:
        return "two_shot"
    return "one_shot" if "symm_mem::one_shot_all_reduce" in names else "none"


def _chooser_main(rank: int, world_size: int, port: int, out_dir: str, library: str) -> None:
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem
    from torch._inductor.utils import run_and_get_code

    import opforge

    device, group_name = _init(rank, world_size, port)
    opforge.load_library(library)
    kernels = opforge.ops.kernels
    cfg = opforge.structs.kernels.ReduceCfg("sum")
    table = kernels.all_reduce_two_shot_min_bytes(world_size)
    two_shot_kernel = table != 2**63 - 1

    def expected(nbytes: int, threshold: int) -> str:
        if not two_shot_kernel:
            return "one_shot"
        return "two_shot" if nbytes >= (threshold if threshold >= 0 else table) else "one_shot"

    def check(got, want, dtype, amax) -> dict:
        rtol, atol = _tolerances(dtype, world_size, amax)
        mismatch = ""
        try:
            torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
        except AssertionError as e:
            mismatch = str(e)
        return {"close": not mismatch, "mismatch": mismatch, "rtol": rtol, "atol": atol,
                "max_error": (got.float() - want.float()).abs().max().item()}

    def inputs(numel: int, dtype: torch.dtype, seed: int):
        g = torch.Generator(device=device).manual_seed(seed * world_size + rank)
        x = torch.randn(numel, device=device, dtype=torch.float32, generator=g).to(dtype)
        want = x.clone()
        dist.all_reduce(want)  # NCCL
        amax = x.abs().max().float().reshape(1)
        dist.all_reduce(amax, op=dist.ReduceOp.MAX)
        return x, want, amax.item()

    cases = []
    forced = {"table": -1, "one-shot": 2**62, "two-shot": 0}
    for dtype in (torch.float32, torch.bfloat16):
        # One symmetric buffer per dtype; each size uses its head.
        whole = symm_mem.empty(LARGE // dtype.itemsize, dtype=dtype, device=device)
        symm_mem.rendezvous(whole, group_name)
        for seed, nbytes in enumerate((SMALL, LARGE)):
            numel = nbytes // dtype.itemsize
            x, want, amax = inputs(numel, dtype, seed)
            for force, threshold in forced.items():
                buf = whole[:numel]
                buf.copy_(x)
                out, names = _symm_mem_ops_called(lambda: kernels.all_reduce(buf, cfg, group_name, world_size,
                                                                              threshold))
                cases.append({"how": "eager", "force": force, "dtype": str(dtype).split(".")[-1], "bytes": nbytes,
                              "threshold": threshold, "expected": expected(nbytes, threshold), "path": _path(names),
                              "ops": sorted(names), **check(out, want, dtype, amax)})
            dist.barrier()

            # Compiled: Inductor computes x * 2 + 1 into a symmetric buffer.
            def f(t):
                return kernels.all_reduce(t * 2 + 1, cfg, group_name, world_size)

            torch._dynamo.reset()
            compiled = torch.compile(f, fullgraph=True)
            x2 = x.reshape(-1, 1024)
            want2 = (x2.float() * 2 + 1).to(dtype)
            dist.all_reduce(want2)
            out, codes = run_and_get_code(compiled, x2)
            code = "\n".join(codes)
            _, names = _symm_mem_ops_called(lambda: compiled(x2))
            cases.append({"how": "compiled", "force": "table", "dtype": str(dtype).split(".")[-1], "bytes": nbytes,
                          "threshold": -1, "expected": expected(nbytes, -1), "path": _path(names),
                          "ops": sorted(names), **check(out, want2, dtype, 2 * amax + 1),
                          **_inspect(code, "kernels::all_reduce"), "code": code})
            dist.barrier()
        del whole
    dist.barrier()
    dist.destroy_process_group()
    report = {"rank": rank, "world_size": world_size, "torch": torch.__version__, "two_shot_min_bytes": table,
              "cases": cases}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f_out:
        json.dump(report, f_out)


def _inspect(code: str, op: str) -> dict:
    """What the output code does with the symmetric buffer:

        buf0 = empty_strided_p2p((8, 128), (128, 1), torch.float32, ..., group_name="0", alloc_id=...)
        triton_poi_fused_add_mul_0.run(arg0_1, buf0, 1024, stream=stream0)   # x * 2 + 1 written into it
        buf1 = torch.ops.opforge_gpu_test.all_reduce.default(buf0, 'sum', '0')

    (opforge's lowering emits the op's _C.FlatCall, with torch's op as its fallback:
    `buf1 = (getattr(extern_kernels, 'opforge_...', None) or torch.ops....default)(buf0, 'sum', '0')`.)
    """
    allocs = re.findall(r"^\s*((\w+) = empty_strided_p2p\(.*\))\s*$", code, re.M)
    p2p_line, p2p = allocs[0] if allocs else ("", "")
    op_call = re.search(r"^\s*(.*torch\.ops\." + op.replace("::", r"\.") + r"\.default\)?\((\w+).*)$", code, re.M)
    producer = re.search(r"^\s*(\w+\.run\(.*\b" + re.escape(p2p) + r"\b.*)$", code, re.M) if p2p else None
    producer_line = producer.group(1) if producer else ""
    call_args = producer_line[producer_line.find("(") + 1:]
    return {
        "p2p_count": len(allocs),
        "p2p_line": p2p_line,
        "p2p_buffer": p2p,
        "op_line": op_call.group(1) if op_call else "",
        "op_arg": op_call.group(2) if op_call else "",
        "flat_call": bool(op_call) and "getattr(extern_kernels, 'opforge_" in op_call.group(1),
        "producer_line": producer_line,
        # Buffers the producing kernel writes besides the inputs: only the symmetric one.
        "producer_buffers": sorted(set(re.findall(r"\bbuf\d+\b", call_args))),
        "copies": [line.strip() for line in code.splitlines()
                   if re.search(r"\.copy_\(|aten\.copy", line) and not line.lstrip().startswith("#")],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--test", choices=["compile", "chooser"], default="compile")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--kind", default="python")
    parser.add_argument("--library", default="")
    args = parser.parse_args()
    if args.test == "chooser":
        _chooser_main(args.rank, args.world_size, args.port, args.out, args.library)
    else:
        _rank_main(args.rank, args.world_size, args.port, args.out, args.kind, args.library)
