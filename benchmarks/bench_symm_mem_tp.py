"""A tensor-parallel MLP step over two GPUs, its reduction through an opforge
C++ op with a symmetric input (docs/symm_mem.md), against the same step
reduced with torch.distributed and with torch's own one-shot all-reduce.

    python benchmarks/bench_symm_mem_tp.py [--stable] [--tokens 64] [--hidden 4096]

Each rank holds a column shard of w1 and a row shard of w2:
    y = all_reduce(gelu(x @ w1_shard) @ w2_shard)
compiled with fullgraph=True:
  opforge   kernels::one_shot_all_reduce (examples/kernel_library), whose
            `input` is a symm_mem argument: Inductor computes the partial sum
            straight into a symmetric buffer
  nccl      torch.distributed's functional all_reduce (NCCL)
and, eagerly,
  symm_mem  torch.ops.symm_mem.one_shot_all_reduce on a symmetric buffer the
            step copies its partial sum into (what calling it directly costs)
Prints the step times and their ratios on rank 0; checks every result equals
the nccl step. NVLink multicast stays off (TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NCCL_NVLS_ENABLE=0). Needs two CUDA GPUs.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_MULTICAST = {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0"}


def rank_main(rank: int, port: int, library: str, tokens: int, hidden: int, steps: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    import torch.distributed._symmetric_memory as symm_mem
    from torch._C._distributed_c10d import _SymmetricMemory

    import opforge

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            device_id=device)
    group = dist.group.WORLD.group_name
    enable = symm_mem.enable_symm_mem_for_group
    if not getattr(enable, "__deprecated__", None):
        enable(group)
    opforge.load_library(library)
    cfg = opforge.structs.kernels.ReduceCfg("sum")

    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16, generator=g)
    w1 = torch.randn(hidden, 4 * hidden, device=device, dtype=torch.bfloat16, generator=g) / hidden**0.5
    w2 = torch.randn(4 * hidden, hidden, device=device, dtype=torch.bfloat16, generator=g) / (4 * hidden) ** 0.5
    shard = 4 * hidden // 2
    w1_shard = w1[:, rank * shard:(rank + 1) * shard].contiguous()
    w2_shard = w2[rank * shard:(rank + 1) * shard].contiguous()

    def partial(x):
        return torch.nn.functional.gelu(x @ w1_shard) @ w2_shard

    def step_opforge(x):
        return opforge.ops.kernels.one_shot_all_reduce(partial(x), cfg, group)

    def step_nccl(x):
        return funcol.all_reduce(partial(x), "sum", group)

    buf = _SymmetricMemory.empty_strided_p2p((tokens, hidden), (hidden, 1), torch.bfloat16, device, group)
    symm_mem.rendezvous(buf, group)

    def step_symm_mem(x):
        buf.copy_(partial(x))
        return torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group)

    steps_by_name = {
        "opforge": torch.compile(step_opforge, fullgraph=True),
        "nccl": torch.compile(step_nccl, fullgraph=True),
        "symm_mem": step_symm_mem,
    }
    want = steps_by_name["nccl"](x)
    errors = {name: (fn(x) - want).abs().max().item() for name, fn in steps_by_name.items()}
    times = {}
    for name, fn in steps_by_name.items():
        for _ in range(10):
            fn(x)
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            fn(x)
        end.record()
        torch.cuda.synchronize()
        times[name] = start.elapsed_time(end) / steps * 1000
    if rank == 0:
        print(f"TP MLP step, 2 ranks, bf16 [{tokens}, {hidden}] x [{hidden}, {4 * hidden}] (torch {torch.__version__})")
        for name, us in times.items():
            print(f"  {name:10} {us:9.1f} µs/step   {us / times['nccl']:.3f}x nccl   "
                  f"{us / times['symm_mem']:.3f}x symm_mem   max |diff| vs nccl {errors[name]:.3g}")
    dist.barrier()
    dist.destroy_process_group()
    assert all(e < 2e-2 for e in errors.values()), errors


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stable", action="store_true", help="the stable-ABI build of the example library")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rank", type=int)
    parser.add_argument("--port", type=int)
    parser.add_argument("--library")
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.port, args.library, args.tokens, args.hidden, args.steps)
        return 0
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    from cpp_ext import build

    folder = build("examples/kernel_library", "kernel_library_stable" if args.stable else "kernel_library",
                   *(["KERNELS_STABLE=ON"] if args.stable else []))
    library = os.path.join(folder, "libopforge_kernels.so")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", str(r), "--port", str(port),
                               "--library", library, "--tokens", str(args.tokens), "--hidden", str(args.hidden),
                               "--steps", str(args.steps)], env=dict(os.environ, **NO_MULTICAST))
             for r in range(2)]
    return max(p.wait() for p in procs)


if __name__ == "__main__":
    sys.exit(main())
