"""An all-reduce that reads its input straight from the peers' memory, as an
opforge op, compiled so that Inductor allocates that input symmetrically.

    python examples/symm_mem_allreduce.py       # spawns one process per GPU (2)

    rank 0: eager    sum of 2 symmetric buffers = 3.0 (expected 3.0)
    rank 0: compiled (x * 2 + 1) summed over 2 ranks: max error 0.0
    rank 0: Inductor allocated x * 2 + 1 with: buf0 = empty_strided_p2p((8, 128), (128, 1), torch.float32, ...

`symm_mem_args=("input",)` tells Inductor that `input` must live in symmetric
memory: under torch.compile its producer (`x * 2 + 1`) is computed straight
into a buffer from `empty_strided_p2p`, so no copy is needed. In eager mode
the caller passes a tensor from `torch.distributed._symmetric_memory.empty()`.
NVLink multicast is not needed and is kept off.
"""

from __future__ import annotations

import os
import re
import socket
import sys

import torch
import torch.distributed as dist

import opforge

Tensor = torch.Tensor
WORLD_SIZE = 2


def _fake(input: Tensor, reduce_op: str, group_name: str) -> Tensor:
    return torch.empty_like(input)


@opforge.op("opforge_examples::symm_all_reduce", fake=_fake, symm_mem_args=("input",))
def symm_all_reduce(input: Tensor, reduce_op: str, group_name: str) -> Tensor:
    """The reduction of `input` over the group; `input` must be symmetric."""
    return torch.ops.symm_mem.one_shot_all_reduce(input, reduce_op, group_name)


def _rank_main(rank: int, port: int) -> None:
    import torch.distributed._symmetric_memory as symm_mem
    from torch._inductor.utils import run_and_get_code

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE,
                            device_id=device)
    group_name = dist.group.WORLD.group_name
    try:
        # Eager: the caller provides the symmetric buffer.
        buf = symm_mem.empty(8, 128, dtype=torch.float32, device=device)
        symm_mem.rendezvous(buf, group_name)
        buf.fill_(rank + 1.0)
        eager = symm_all_reduce(buf, "sum", group_name)
        expected = float(sum(r + 1 for r in range(WORLD_SIZE)))
        torch.cuda.synchronize()
        _say(rank, f"eager    sum of {WORLD_SIZE} symmetric buffers = {eager[0, 0].item()} (expected {expected})")

        # Compiled: Inductor allocates the producer of `input` symmetrically.
        def f(x: Tensor) -> Tensor:
            return symm_all_reduce(x * 2 + 1, "sum", group_name)

        base = torch.arange(8 * 128, dtype=torch.float32, device=device).reshape(8, 128)
        out, code = run_and_get_code(torch.compile(f, fullgraph=True), base + rank)
        want = sum((base + r) * 2 + 1 for r in range(WORLD_SIZE))
        _say(rank, f"compiled (x * 2 + 1) summed over {WORLD_SIZE} ranks: "
                   f"max error {(out - want).abs().max().item()}")
        alloc = re.search(r"^\s*(\w+ = empty_strided_p2p\(.*)$", "\n".join(code), re.M)
        _say(rank, "Inductor allocated x * 2 + 1 with: " + (alloc.group(1)[:80] + " ..." if alloc else "(nothing)"))
    finally:
        dist.destroy_process_group()


def _say(rank: int, text: str) -> None:
    if rank == 0:
        print(f"rank {rank}: {text}", flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if found < WORLD_SIZE:
        print(f"symm_mem_allreduce: needs {WORLD_SIZE} CUDA GPUs (found {found}); nothing to run.")
        return 0
    # Symmetric memory without NVLink multicast (one-shot all-reduce does not use it).
    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    os.environ["NVSHMEM_DISABLE_NVLS"] = "1"
    torch.multiprocessing.spawn(_rank_main, args=(_free_port(),), nprocs=WORLD_SIZE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
