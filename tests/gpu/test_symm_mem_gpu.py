"""Symmetric-memory arguments on two GPUs of one host (docs/symm_mem.md).

Two ranks compile `f(x) = all_reduce(x * 2 + 1, "sum", group_name)`, where
`all_reduce` is an op whose `input` is a symm_mem argument and whose body is
torch's one-shot all-reduce (it reads the peers' buffers directly, so its
input must be symmetric): a Python op, and the C++ op of the example kernel
library (examples/kernel_library, `kernels::one_shot_all_reduce`) in its C++
API build and its stable-ABI build. Each rank checks the sum, and that
Inductor's generated code allocates the producer of `input` with
`empty_strided_p2p` and hands that buffer to the op with no copy in between.
On torch 2.13+ this goes through torch's native registry, on 2.11 through
opforge's lowering.

    python -m pytest tests/gpu/test_symm_mem_gpu.py -v -s

Each rank is its own process (this file, run as a script), with NVLink
multicast off: TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NCCL_NVLS_ENABLE=0.
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

WORLD_SIZE = 2
NO_MULTICAST = {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0"}
OP = "opforge_gpu_test::all_reduce"
TIMEOUT_S = 420


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


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


@pytest.mark.skipif(_gpus() < WORLD_SIZE, reason=f"needs {WORLD_SIZE} CUDA GPUs")
@pytest.mark.parametrize("kind", ["python", "cpp", "cpp-stable"])
def test_compiled_producer_of_a_symm_mem_argument_is_a_symmetric_buffer(tmp_path, kind):
    results = _launch(tmp_path, kind, _library(kind))
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
        assert r["producer_buffers"] == [r["p2p_buffer"]], r["code"]
        assert not r["copies"], r["code"]


def _launch(tmp_path, kind: str, library: str) -> list[dict]:
    port = _free_port()
    procs = []
    for rank in range(WORLD_SIZE):
        env = dict(os.environ, **NO_MULTICAST,
                   TORCHINDUCTOR_CACHE_DIR=str(tmp_path / f"inductor{rank}"),
                   TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0")
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--rank", str(rank), "--port", str(port),
             "--out", str(tmp_path), "--kind", kind, "--library", library],
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

def _rank_main(rank: int, port: int, out_dir: str, kind: str, library: str) -> None:
    for key, value in NO_MULTICAST.items():
        assert os.environ.get(key) == value, f"{key} must be {value} before CUDA starts"
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem
    from torch._C._distributed_c10d import _SymmetricMemory
    from torch._inductor.utils import run_and_get_code

    import opforge

    Tensor = torch.Tensor
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE,
                            device_id=device)
    group_name = dist.group.WORLD.group_name
    enable = symm_mem.enable_symm_mem_for_group
    if not getattr(enable, "__deprecated__", None):  # torch that still needs it
        enable(group_name)

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
    want = sum((base + r) * 2 + 1 for r in range(WORLD_SIZE))
    code = "\n".join(codes)

    # Eager, with a symmetric buffer from the allocator the output code uses.
    buf = _SymmetricMemory.empty_strided_p2p((8, 128), (128, 1), torch.float32, device, group_name)
    symm_mem.rendezvous(buf, group_name)
    buf.fill_(rank + 1.0)
    eager = all_reduce(buf, "sum", group_name)
    eager_error = (eager - sum(r + 1.0 for r in range(WORLD_SIZE))).abs().max().item()
    dist.barrier()
    dist.destroy_process_group()

    report = {
        "rank": rank,
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


def _inspect(code: str, op: str) -> dict:
    """What the output code does with the symmetric buffer:

        buf0 = empty_strided_p2p((8, 128), (128, 1), torch.float32, ..., group_name="0", alloc_id=...)
        triton_poi_fused_add_mul_0.run(arg0_1, buf0, 1024, stream=stream0)   # x * 2 + 1 written into it
        buf1 = torch.ops.opforge_gpu_test.all_reduce.default(buf0, 'sum', '0')
    """
    allocs = re.findall(r"^\s*((\w+) = empty_strided_p2p\(.*\))\s*$", code, re.M)
    p2p_line, p2p = allocs[0] if allocs else ("", "")
    op_call = re.search(r"^\s*(.*torch\.ops\." + op.replace("::", r"\.") + r"\.default\((\w+).*)$", code, re.M)
    producer = re.search(r"^\s*(\w+\.run\(.*\b" + re.escape(p2p) + r"\b.*)$", code, re.M) if p2p else None
    producer_line = producer.group(1) if producer else ""
    call_args = producer_line[producer_line.find("(") + 1:]
    return {
        "p2p_count": len(allocs),
        "p2p_line": p2p_line,
        "p2p_buffer": p2p,
        "op_line": op_call.group(1) if op_call else "",
        "op_arg": op_call.group(2) if op_call else "",
        "producer_line": producer_line,
        # Buffers the producing kernel writes besides the inputs: only the symmetric one.
        "producer_buffers": sorted(set(re.findall(r"\bbuf\d+\b", call_args))),
        "copies": [line.strip() for line in code.splitlines()
                   if re.search(r"\.copy_\(|aten\.copy", line) and not line.lstrip().startswith("#")],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--kind", default="python")
    parser.add_argument("--library", default="")
    args = parser.parse_args()
    _rank_main(args.rank, args.port, args.out, args.kind, args.library)
