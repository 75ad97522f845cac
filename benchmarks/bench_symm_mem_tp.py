"""Symmetric-memory all-reduce on the GPUs of one host: opforge's C++ op
against torch's symm_mem ops called directly and against NCCL, alone over a
range of sizes and inside a tensor-parallel MLP step (docs/symm_mem.md).

    python benchmarks/bench_symm_mem_tp.py [--world-size N] [--stable] [--sweep] [--dtype fp32,bf16]
        [--tokens 64,512] [--hidden 4096] [--profile DIR] [--json PATH]

One rank per GPU (--world-size, default every GPU of the host, at least 2).

--sweep times the all-reduce alone at each of --sizes, for each --dtype:
  opforge        kernels::all_reduce (examples/kernel_library): one-shot or
                 two-shot by size and world size (its `path` column)
  one-shot       torch.ops.symm_mem.one_shot_all_reduce
  two-shot_      torch.ops.symm_mem.two_shot_all_reduce_ (in place)
  two-shot out   torch.ops.symm_mem.two_shot_all_reduce_out, which the op
                 calls (2, 4 and 8 ranks)
  nccl           torch.distributed.all_reduce (in place)
  funcol         torch.distributed._functional_collectives.all_reduce, waited
The symm_mem ops read a symmetric buffer, NCCL an ordinary one; timed calls
reduce zeros (an in-place reduction of anything else grows every call).

The TP MLP step, y = all_reduce(gelu(x @ w1_shard) @ w2_shard), each rank
holding a column shard of w1 and a row shard of w2, for each of --tokens:
  opforge            compiled (fullgraph) with kernels::all_reduce: Inductor
                     computes the partial sum straight into a symmetric buffer
  nccl               compiled with funcol.all_reduce
  matmuls            compiled gelu(x @ w1_shard) @ w2_shard, no all-reduce
  matmuls + direct   compiled gelu(x @ w1_shard), then torch.mm(..., out=) into
                     a symmetric buffer and torch's symm_mem op of the same
                     path as opforge's, called eagerly: the step by hand
  all-reduce alone   that direct op by itself
  torch's own        compiled funcol.all_reduce with Inductor's
                     _collective.auto_select (threshold raised to the
                     message): torch's own lowering to symm_mem's one-shot op
                     on a symmetric buffer it allocates, the codegen opforge's
                     lowering gets (left out where this torch has no option)
Every figure is timed twice: eager launches (the time per call of many calls,
torch.cuda.synchronize at both ends) and a CUDA graph (--graph-calls calls
captured in one graph, replayed, divided); tables show the slowest rank.
The steps' eager figures are the medians of --rounds rounds, each timing
every step once in a rotating order, and the opforge step's ratios to the
baselines are the medians of the rounds' ratios, with quartiles, per rank.
The steps (and --parts) also get a host figure, the CPU's time per call
alone: bursts of --host-calls calls timed without waiting for the GPU, few
enough that the launch queue never fills and the other rank's pace (which
an eager figure includes, through the all-reduce's wait for its peers)
never holds this rank back.
Every result is checked against NCCL's on every rank (float32 to within
torch.testing's float32 tolerances, bfloat16 to within its bfloat16 ones,
both scaled for a sum of N terms).

--parts times, eagerly, each call the compiled opforge step's wrapper makes
around the all-reduce (the symmetric buffer's allocation, the op as the
wrapper calls it, _C.FlatCall, and through torch.ops as it did before, its
output asserts), the op through opforge.ops, torch's op of the same path
called directly, and the op compiled alone.

--wrapper times the compiled opforge step against its own Inductor wrapper
(`call`, what runs below Dynamo and AOTAutograd) and variants of the
wrapper's source with one piece changed (no output asserts, the symmetric
buffer allocated once, torch's op called directly, the op through
torch.ops), each in place; and the matmuls step and its wrapper.

--profile DIR writes torch.profiler traces (CPU and CUDA) of --profile-steps
compiled opforge steps and as many matmuls-only steps on rank 0, and prints
the top 25 ops by self CPU time of each. --json PATH writes every figure.
NVLink multicast stays off in every rank: TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NCCL_NVLS_ENABLE=0, NVSHMEM_DISABLE_NVLS=1, set before torch starts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_MULTICAST = {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1"}
SIZES = "16K,64K,256K,512K,1M,4M,16M,64M"
DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16"}
# torch.testing.assert_close's defaults (rtol, atol).
TOLERANCES = {"float32": (1.3e-6, 1e-5), "bfloat16": (1.6e-2, 1e-5)}
SWEEP_METHODS = ("opforge", "one-shot", "two-shot_", "two-shot out", "nccl", "funcol")
STEPS = ("opforge", "nccl", "matmuls", "matmuls + direct", "all-reduce alone")
TORCH_OPS_STEP = "opforge, op called through torch.ops"  # --ab-torch-ops
TORCH_OWN_STEP = "torch's own: funcol compiled, lowered to one-shot symm-mem"
NEVER = 2**63 - 1  # kernels::all_reduce_two_shot_min_bytes where torch has no two-shot kernel


def parse_bytes(text: str) -> int:
    """'16K' -> 16384, '4M' -> 4194304, '512' -> 512."""
    text = text.strip().upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    value = int(text[:-1] if scale > 1 else text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a size must be positive")
    return value * scale


def parse_list(kind):
    def parse(text: str) -> list:
        try:
            return [kind(item) for item in text.split(",") if item.strip()]
        except (ValueError, KeyError) as e:
            raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None
    return parse


def dtype_name(text: str) -> str:
    if text.strip() not in DTYPES:
        raise KeyError(f"unknown dtype {text.strip()!r}; use fp32 or bf16")
    return DTYPES[text.strip()]


def size_label(nbytes: int) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def tolerances(dtype: str, world_size: int, amax: float) -> tuple[float, float]:
    """assert_close's (rtol, atol) for `dtype`, scaled for a sum of
    `world_size` terms of magnitude up to `amax`: each add may round by the
    dtype's rtol relative to a partial sum of up to world_size * amax."""
    rtol, atol = TOLERANCES[dtype]
    return rtol * world_size, atol * world_size + rtol * world_size * amax


def parser() -> argparse.ArgumentParser:
    first, rest = __doc__.split("\n\n", 1)
    p = argparse.ArgumentParser(description=" ".join(first.split()), epilog=rest,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-size", type=int, help="ranks, one per GPU (default: every GPU of the host)")
    p.add_argument("--stable", action="store_true", help="the stable-ABI build of the example library")
    p.add_argument("--sweep", action="store_true", help="time the all-reduce alone at each of --sizes")
    p.add_argument("--sizes", type=parse_list(parse_bytes), default=parse_list(parse_bytes)(SIZES),
                   help=f"all-reduce sizes in bytes for --sweep (default {SIZES})")
    p.add_argument("--dtype", type=parse_list(dtype_name), default=["float32", "bfloat16"],
                   help="dtypes for --sweep: fp32, bf16 or both, comma-separated (default fp32,bf16)")
    p.add_argument("--tokens", type=parse_list(int), default=[64, 512], help="TP step token counts (default 64,512)")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--step-dtype", type=dtype_name, default="bfloat16", help="the TP step's dtype (default bf16)")
    p.add_argument("--no-step", action="store_true", help="skip the TP step (with --sweep: the sweep alone)")
    p.add_argument("--two-shot-min-bytes", type=int, default=-1,
                   help="kernels::all_reduce's two-shot threshold (default -1: the library's table)")
    p.add_argument("--iters", type=int, default=200, help="eager calls per figure (fewer above 8 MB)")
    p.add_argument("--rounds", type=int, default=15,
                   help="rounds of the TP step's eager figures, each timing every step once (median)")
    p.add_argument("--host-calls", type=int, default=16,
                   help="calls per burst of the host (CPU) figure, launched without waiting for the GPU")
    p.add_argument("--graph-calls", type=int, default=50, help="calls captured per CUDA graph (fewer above 4 MB)")
    p.add_argument("--replays", type=int, default=20, help="replays of each CUDA graph")
    p.add_argument("--ab-torch-ops", action="store_true",
                   help=f"add the step '{TORCH_OPS_STEP}': compiled with the wrapper calling the op as "
                        "torch.ops.kernels.all_reduce.default, as before opforge's lowering emitted _C.FlatCall")
    p.add_argument("--parts", action="store_true",
                   help="also time, eagerly, each call the compiled opforge step makes around its all-reduce")
    p.add_argument("--wrapper", action="store_true",
                   help="time the compiled step's Inductor wrapper alone and variants of it with one piece changed")
    p.add_argument("--profile", metavar="DIR", help="write profiler traces of the TP step on rank 0 to DIR")
    p.add_argument("--profile-steps", type=int, default=20)
    p.add_argument("--json", metavar="PATH", help="write every figure to PATH")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--library", help=argparse.SUPPRESS)
    return p


# One rank

class Rank:
    """What every part of a rank's run needs."""

    def __init__(self, args):
        import torch
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        import opforge

        self.args = args
        self.rank, self.world = args.rank, args.world_size
        torch.cuda.set_device(self.rank)
        self.device = torch.device("cuda", self.rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{args.port}", rank=self.rank,
                                world_size=self.world, device_id=self.device)
        self.group = dist.group.WORLD.group_name
        enable = symm_mem.enable_symm_mem_for_group
        if not getattr(enable, "__deprecated__", None):  # torch that still needs it
            enable(self.group)
        opforge.load_library(args.library)
        self.kernels = opforge.ops.kernels
        self.cfg = opforge.structs.kernels.ReduceCfg("sum")
        self.table = self.kernels.all_reduce_two_shot_min_bytes(self.world)
        self.checks: list[dict] = []
        self.errors: list[dict] = []

    def path(self, nbytes: int) -> str:
        """The path kernels::all_reduce takes for a message of `nbytes` (its rule)."""
        if self.table == NEVER:
            return "one-shot"
        threshold = self.args.two_shot_min_bytes if self.args.two_shot_min_bytes >= 0 else self.table
        return "two-shot" if nbytes >= threshold else "one-shot"

    def symmetric(self, shape, dtype):
        import torch.distributed._symmetric_memory as symm_mem

        buf = symm_mem.empty(*shape, dtype=dtype, device=self.device)
        symm_mem.rendezvous(buf, self.group)
        return buf

    def reference(self, x):
        """NCCL's sum of x over the ranks, and the largest |x| of any rank."""
        import torch.distributed as dist

        want = x.clone()
        dist.all_reduce(want)
        amax = x.abs().max().float().reshape(1)
        dist.all_reduce(amax, op=dist.ReduceOp.MAX)
        return want, amax.item()

    def check(self, what: str, got, want, dtype: str, amax: float) -> None:
        import torch

        rtol, atol = tolerances(dtype, self.world, amax)
        mismatch = ""
        try:
            torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
        except AssertionError as e:
            mismatch = str(e)
        self.checks.append({"what": what, "rank": self.rank, "ok": not mismatch, "mismatch": mismatch,
                            "max_error": (got.float() - want.float()).abs().max().item(), "rtol": rtol, "atol": atol})

    def time(self, what: str, fn, nbytes: int, modes=("eager", "graph")) -> dict:
        """Microseconds per call of fn: eager launches and in a CUDA graph."""
        out = {}
        for mode, timer in (("eager", self.eager_us), ("graph", self.graph_us)):
            if mode not in modes:
                continue
            try:
                out[mode] = timer(fn, nbytes)
            except Exception as e:  # noqa: BLE001 - one failed figure must not lose the others
                out[mode] = None
                self.errors.append({"what": f"{what} ({mode})", "rank": self.rank,
                                    "error": f"{type(e).__name__}: {e}".splitlines()[0][:300]})
        return out

    def aligned(self) -> None:
        import torch
        import torch.distributed as dist

        torch.cuda.synchronize()
        dist.barrier()
        torch.cuda.synchronize()

    def eager_us(self, fn, nbytes: int) -> float:
        import torch

        iters = max(10, min(self.args.iters, (2 << 30) // max(nbytes, 1)))
        for _ in range(5):
            fn()
        self.aligned()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / iters * 1e6

    def host_us(self, fn, nbytes: int) -> float:
        """CPU µs per call: --host-calls calls launched back to back and timed
        without waiting for the GPU (few enough that the launch queue never
        fills and the other rank's pace never holds this one back), the
        median of 5 such bursts, each after both ranks' GPUs are idle."""
        samples = []
        for _ in range(5):
            self.aligned()
            start = time.perf_counter()
            for _ in range(self.args.host_calls):
                fn()
            samples.append((time.perf_counter() - start) / self.args.host_calls * 1e6)
        self.aligned()
        return statistics.median(samples)

    def graph_us(self, fn, nbytes: int) -> float:
        import torch

        calls = max(2, min(self.args.graph_calls, (256 << 20) // max(nbytes, 1)))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm up off the default stream, as capture wants
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        self.aligned()
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: NCCL's watchdog thread may query its events while this thread captures.
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                for _ in range(calls):
                    fn()
            graph.replay()
            self.aligned()
            start = time.perf_counter()
            for _ in range(self.args.replays):
                graph.replay()
            torch.cuda.synchronize()
            return (time.perf_counter() - start) / (self.args.replays * calls) * 1e6
        finally:
            del graph
            torch.cuda.empty_cache()


def sweep(r: Rank) -> list[dict]:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    rows = []
    # Bound once, torch's ops as their overloads: what each call costs is the op's own.
    all_reduce, cfg, group, world, threshold = r.kernels.all_reduce, r.cfg, r.group, r.world, r.args.two_shot_min_bytes
    one_shot = torch.ops.symm_mem.one_shot_all_reduce.default
    two_shot_ = torch.ops.symm_mem.two_shot_all_reduce_.default
    two_shot_out = torch.ops.symm_mem.two_shot_all_reduce_out.default
    for dtype_text in r.args.dtype:
        dtype = getattr(torch, dtype_text)
        whole = r.symmetric((max(r.args.sizes) // dtype.itemsize,), dtype)
        plain = torch.empty_like(whole, memory_format=torch.contiguous_format)
        for nbytes in r.args.sizes:
            numel = nbytes // dtype.itemsize
            sbuf, rbuf = whole[:numel], plain[:numel]

            def funcol_all_reduce():
                out = funcol.all_reduce(rbuf, "sum", group)
                return out.wait() if hasattr(out, "wait") else out

            def nccl_all_reduce():
                dist.all_reduce(rbuf)
                return rbuf

            methods = {
                "opforge": lambda: all_reduce(sbuf, cfg, group, world, threshold),
                "one-shot": lambda: one_shot(sbuf, "sum", group),
                "two-shot_": lambda: two_shot_(sbuf, "sum", group),
                "two-shot out": lambda: two_shot_out(sbuf, "sum", group, torch.empty_like(sbuf)),
                "nccl": nccl_all_reduce,
                "funcol": funcol_all_reduce,
            }
            if r.world not in (2, 4, 8):  # torch's two_shot_all_reduce_out has no kernel for it
                del methods["two-shot out"]

            g = torch.Generator(device=r.device).manual_seed(nbytes * r.world + r.rank)
            x = torch.randn(numel, device=r.device, generator=g).to(dtype)
            want, amax = r.reference(x)
            row = {"dtype": dtype_text, "bytes": nbytes, "path": r.path(nbytes), "times": {}}
            for name, fn in methods.items():
                sbuf.copy_(x)
                rbuf.copy_(x)
                try:
                    got = fn().clone()
                except Exception as e:  # noqa: BLE001
                    r.errors.append({"what": f"{name} {dtype_text} {size_label(nbytes)}", "rank": r.rank,
                                     "error": f"{type(e).__name__}: {e}".splitlines()[0][:300]})
                    continue
                r.check(f"all-reduce {name} {dtype_text} {size_label(nbytes)}", got, want, dtype_text, amax)
                dist.barrier()
                sbuf.zero_()
                rbuf.zero_()
                row["times"][name] = r.time(f"{name} {dtype_text} {size_label(nbytes)}", fn, nbytes)
            rows.append(row)
        del whole, plain
        torch.cuda.empty_cache()
    return rows


def mlp(r: Rank):
    """The TP MLP's shards on this rank: (first, partial, w1_shard, w2_shard,
    generator), first(x) = gelu(x @ w1_shard), partial(x) = first(x) @ w2_shard."""
    import torch

    hidden, dtype = r.args.hidden, getattr(torch, r.args.step_dtype)
    if (4 * hidden) % r.world:
        raise SystemExit(f"--hidden {hidden}: 4 * hidden must split evenly over {r.world} ranks")
    shard = 4 * hidden // r.world
    g = torch.Generator(device=r.device).manual_seed(0)  # the same weights on every rank
    w1 = torch.randn(hidden, 4 * hidden, device=r.device, dtype=dtype, generator=g) / hidden**0.5
    w2 = torch.randn(4 * hidden, hidden, device=r.device, dtype=dtype, generator=g) / (4 * hidden) ** 0.5
    w1_shard = w1[:, r.rank * shard:(r.rank + 1) * shard].contiguous()
    w2_shard = w2[r.rank * shard:(r.rank + 1) * shard].contiguous()
    del w1, w2

    def first(x):
        return torch.nn.functional.gelu(x @ w1_shard)

    def partial(x):
        return first(x) @ w2_shard

    return first, partial, w1_shard, w2_shard, g


def tp_steps(r: Rank) -> tuple[list[dict], list[dict]]:
    import torch
    import torch.distributed._functional_collectives as funcol

    rows, profiles = [], []
    all_reduce, cfg, group, world, threshold = r.kernels.all_reduce, r.cfg, r.group, r.world, r.args.two_shot_min_bytes
    one_shot = torch.ops.symm_mem.one_shot_all_reduce.default
    two_shot_out = torch.ops.symm_mem.two_shot_all_reduce_out.default
    hidden, dtype_text = r.args.hidden, r.args.step_dtype
    dtype = getattr(torch, dtype_text)
    first, partial, w1_shard, w2_shard, g = mlp(r)

    for tokens in r.args.tokens:
        x = torch.randn(tokens, hidden, device=r.device, dtype=dtype, generator=g)
        nbytes = tokens * hidden * dtype.itemsize
        path = r.path(nbytes)
        sbuf = r.symmetric((tokens, hidden), dtype)
        if path == "two-shot":
            def direct():
                return two_shot_out(sbuf, "sum", group, torch.empty_like(sbuf))
        else:
            def direct():
                return one_shot(sbuf, "sum", group)

        def step_opforge(x):
            return all_reduce(partial(x), cfg, group, world, threshold)

        def step_nccl(x):
            return funcol.all_reduce(partial(x), "sum", group)

        torch._dynamo.reset()
        first_compiled = torch.compile(first, fullgraph=True)

        def by_hand(x):
            torch.mm(first_compiled(x), w2_shard, out=sbuf)
            return direct()

        steps = {
            "opforge": torch.compile(step_opforge, fullgraph=True),
            "nccl": torch.compile(step_nccl, fullgraph=True),
            "matmuls": torch.compile(partial, fullgraph=True),
            "matmuls + direct": by_hand,
        }
        if r.args.ab_torch_ops:
            def step_torch_ops(x):  # its own code object: a compile of its own
                return all_reduce(partial(x), cfg, group, world, threshold)

            from unittest import mock

            from torch._inductor.utils import fresh_cache

            from opforge import _inductor

            steps[TORCH_OPS_STEP] = torch.compile(step_torch_ops, fullgraph=True)
            # Compiled without the FlatCall, in a cache of its own: the opforge step's graph is the same.
            with mock.patch.object(_inductor, "call_from_c", lambda *_: None), fresh_cache():
                steps[TORCH_OPS_STEP](x)
        own = torch_own_step(partial, group, nbytes)
        if own is not None:
            from torch._inductor.utils import run_and_get_code

            compiled_own, first_call = own
            _, codes = run_and_get_code(first_call, x)  # compiles under Inductor's option
            if any("symm_mem.one_shot_all_reduce" in code and "empty_strided_p2p(" in code for code in codes):
                steps[TORCH_OWN_STEP] = compiled_own
            else:
                r.errors.append({"what": f"TP step tokens {tokens}: {TORCH_OWN_STEP}", "rank": r.rank,
                                 "error": "Inductor did not lower funcol.all_reduce to symm-mem; step left out"})
        outs = {name: fn(x) for name, fn in steps.items()}  # compiles
        want, amax = r.reference(outs["matmuls"])
        label = f"TP step {dtype_text} tokens {tokens}"
        extra = [n for n in (TORCH_OPS_STEP, TORCH_OWN_STEP) if n in outs]
        for name in ("opforge", "nccl", "matmuls + direct", *extra):
            r.check(f"{label}: {name}", outs[name], want, dtype_text, amax)
        row = {"tokens": tokens, "hidden": hidden, "dtype": dtype_text, "bytes": nbytes, "path": path, "times": {}}
        for name, fn in steps.items():
            row["times"][name] = r.time(f"{label}: {name}", lambda fn=fn: fn(x), nbytes, modes=("graph",))
        sbuf.zero_()
        row["times"]["all-reduce alone"] = r.time(f"{label}: all-reduce alone", direct, nbytes, modes=("graph",))
        fns = {name: (lambda fn=fn: fn(x)) for name, fn in steps.items()}
        fns["all-reduce alone"] = direct
        eager, host, step_ratios = interleaved(r, label, fns, nbytes)
        for name, value in eager.items():
            row["times"][name]["eager"] = value
            row["times"][name]["host"] = host[name]
        row["eager_ratios"] = step_ratios
        rows.append(row)
        if r.args.profile:
            for name in ("opforge", "matmuls"):
                profiles.append(profile_steps(r, f"{name}_tokens{tokens}", lambda fn=steps[name]: fn(x)))
        del sbuf
    return rows, profiles


def torch_own_step(partial, group: str, nbytes: int):
    """torch's own compiled symm-mem step: funcol.all_reduce compiled with
    Inductor's `_collective.auto_select`, which lowers it to symm_mem's
    one-shot op on a symmetric buffer Inductor allocates (the same codegen
    opforge's lowering gets); its threshold raised to the message. Compiled
    here, under that config; None where this torch has no such option."""
    import torch
    import torch.distributed._functional_collectives as funcol
    from torch._inductor import config as inductor_config

    if not hasattr(getattr(inductor_config, "_collective", None), "auto_select"):
        return None
    import warnings

    import torch.distributed._symmetric_memory as symm_mem

    if not symm_mem.is_symm_mem_enabled_for_group(group):
        # Inductor's lowering still asks for the group's registration, which torch calls deprecated.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            symm_mem.enable_symm_mem_for_group(group)

    def step_torch_own(x):  # its own code object: a compile of its own
        return funcol.all_reduce(partial(x), "sum", group)

    compiled = torch.compile(step_torch_own, fullgraph=True)
    patch = {"_collective.auto_select": True, "_collective.one_shot_all_reduce_threshold_bytes": max(nbytes, 1 << 17)}

    def first_call(x):
        import random

        from torch._inductor.utils import fresh_cache

        # Inductor draws the symmetric buffer's alloc_id from Python's random state, which torch.compile
        # restores after each compile: two compiles in a row would draw the same id for buffers of two
        # sizes, and torch refuses the second ("a previous allocation with the same alloc_id").
        random.seed(nbytes)
        with inductor_config.patch(patch), fresh_cache():  # not the NCCL step's cache entry, nor it this one's
            return compiled(x)

    return compiled, first_call


def interleaved(r: Rank, label: str, fns: dict, nbytes: int) -> tuple[dict, dict, dict]:
    """Eager-launch µs and host (CPU) µs of each step, each the median of
    --rounds rounds that time every step once in an order that rotates, so
    that drift on the host (clocks, the other rank's process) falls on all
    steps alike; and the opforge step's ratios to the baselines, the median
    of the rounds' ratios with quartiles ('... (host)' for the CPU's)."""
    names = list(fns)
    per_round = {name: [] for name in names}
    per_round_host = {name: [] for name in names}
    for k in range(r.args.rounds):
        for name in names[k % len(names):] + names[:k % len(names)]:
            try:
                per_round[name].append(r.eager_us(fns[name], nbytes))
                per_round_host[name].append(r.host_us(fns[name], nbytes))
            except Exception as e:  # noqa: BLE001 - one failed figure must not lose the others
                r.errors.append({"what": f"{label}: {name} (eager)", "rank": r.rank,
                                 "error": f"{type(e).__name__}: {e}".splitlines()[0][:300]})
                per_round[name], per_round_host[name] = [], []
                names.remove(name)

    def medians(rounds):
        return {name: statistics.median(v) if v else None for name, v in rounds.items()}

    ratios = {}
    for suffix, rounds in (("", per_round), (" (host)", per_round_host)):
        o, m, d, a = (rounds.get(n, []) for n in ("opforge", "matmuls", "matmuls + direct", "all-reduce alone"))
        if o and d and len(o) == len(d):
            ratios["opforge / (matmuls + direct)" + suffix] = quartiles([x / y for x, y in zip(o, d)])
        if o and m and a and len(o) == len(m) == len(a):
            ratios["opforge / (matmuls + all-reduce alone)" + suffix] = quartiles(
                [x / (y + z) for x, y, z in zip(o, m, a)])
    return medians(per_round), medians(per_round_host), ratios


def parts(r: Rank) -> list[dict]:
    """µs per eager call of each piece the compiled opforge step's wrapper
    runs around the all-reduce (what Inductor's code for it calls, one by
    one), of torch's op called directly, and of the op alone compiled, for
    each of --tokens: where the step's eager time over the step by hand goes."""
    import torch
    from torch._C._dynamo.guards import assert_alignment, assert_size_stride
    from torch._C._distributed_c10d import _SymmetricMemory

    from opforge import _C

    hidden, dtype = r.args.hidden, getattr(torch, r.args.step_dtype)
    all_reduce, cfg, group, world = r.kernels.all_reduce, r.cfg, r.group, r.world
    flat = torch.ops.kernels.all_reduce.default
    flat_call = _C.FlatCall(flat)
    rows = []
    for tokens in r.args.tokens:
        shape, nbytes = (tokens, hidden), tokens * hidden * dtype.itemsize
        sbuf = r.symmetric(shape, dtype)
        direct = (torch.ops.symm_mem.two_shot_all_reduce_out.default if r.path(nbytes) == "two-shot"
                  else torch.ops.symm_mem.one_shot_all_reduce.default)
        direct_args = (sbuf, "sum", group) + ((torch.empty_like(sbuf),) if r.path(nbytes) == "two-shot" else ())
        out = torch.empty_like(sbuf)
        torch._dynamo.reset()
        compiled = torch.compile(lambda b: all_reduce(b, cfg, group, world, -1), fullgraph=True)
        fns = {
            "empty_strided_p2p (the step's buffer)": lambda: _SymmetricMemory.empty_strided_p2p(
                shape, (hidden, 1), dtype, torch.device("cuda", r.rank), group_name=group, alloc_id=12345 + tokens),
            "_C.FlatCall of the op, as the wrapper calls it": lambda: flat_call(
                sbuf, "sum", group, world, two_shot_min_bytes=-1),
            "torch.ops.kernels.all_reduce.default, as the wrapper called it before": lambda: flat(
                sbuf, "sum", group, world, two_shot_min_bytes=-1),
            "opforge.ops.kernels.all_reduce (struct)": lambda: all_reduce(sbuf, cfg, group, world, -1),
            "torch's op of the same path, direct": lambda: direct(*direct_args),
            "assert_size_stride + assert_alignment": lambda: (
                assert_size_stride(out, shape, (hidden, 1), "op"), assert_alignment(out, 16, "op")),
            "the op alone, compiled, its input a graph input (copied into a symmetric buffer)": lambda: compiled(sbuf),
        }
        for fn in fns.values():
            fn()  # compiles, allocates
        eager, host, _ = interleaved(r, f"parts tokens {tokens}", fns, nbytes)
        rows.append({"tokens": tokens, "bytes": nbytes, "path": r.path(nbytes), "times": eager, "host": host})
        del sbuf
    return rows


def wrapper_variants(r: Rank) -> list[dict]:
    """The compiled opforge step against its own Inductor wrapper (`call`,
    what the compiled graph runs below Dynamo and AOTAutograd) and variants
    of that wrapper's source with one piece changed, timed in place, for each
    of --tokens: each piece's cost where the step pays it."""
    import re

    import torch
    from torch._inductor.utils import run_and_get_code

    all_reduce, cfg, group, world = r.kernels.all_reduce, r.cfg, r.group, r.world
    hidden, dtype = r.args.hidden, getattr(torch, r.args.step_dtype)
    first, partial, w1_shard, w2_shard, g = mlp(r)
    rows = []
    for tokens in r.args.tokens:
        x = torch.randn(tokens, hidden, device=r.device, dtype=dtype, generator=g)
        nbytes = tokens * hidden * dtype.itemsize
        sbuf = r.symmetric((tokens, hidden), dtype)
        torch._dynamo.reset()
        steps = {"opforge": torch.compile(lambda x: all_reduce(partial(x), cfg, group, world, -1), fullgraph=True),
                 "matmuls": torch.compile(lambda x: partial(x), fullgraph=True)}
        sources = {}
        for name, step in steps.items():
            _, codes = run_and_get_code(step, x)
            sources[name] = codes[-1]
        src = sources["opforge"]
        alloc = re.search(r"^(\s*)(\w+) = empty_strided_p2p\(.*$", src, re.M)
        call = re.search(r"^(\s*)(\w+) = (.*kernels\.all_reduce\.default\)?)\((\w+), .*$", src, re.M)
        direct = ("torch.ops.symm_mem.two_shot_all_reduce_out.default({b}, 'sum', {g!r}, torch.empty_like({b}))"
                  if r.path(nbytes) == "two-shot"
                  else "torch.ops.symm_mem.one_shot_all_reduce.default({b}, 'sum', {g!r})")
        variants = {
            "the wrapper's call() as compiled": src,
            "call(), no output asserts": re.sub(r"^\s*assert_(size_stride|alignment)\(buf.*$\n", "", src, flags=re.M),
            "call(), the symmetric buffer allocated once": src.replace(
                alloc.group(0), f"{alloc.group(1)}{alloc.group(2)} = _bench_sbuf"),
            "call(), torch's op called directly instead of opforge's": src.replace(
                call.group(0), f"{call.group(1)}{call.group(2)} = " + direct.format(b=call.group(4), g=group)),
            "call(), the op called through torch.ops": src.replace(
                call.group(3), "torch.ops.kernels.all_reduce.default"),
        }
        fns = {"compiled opforge step (Dynamo, AOTAutograd, call())": lambda: steps["opforge"](x),
               "compiled matmuls step": lambda: steps["matmuls"](x)}
        order = {w1_shard.shape: w1_shard, w2_shard.shape: w2_shard, x.shape: x}
        for label, (name, text) in [*((k, ("opforge", v)) for k, v in variants.items()),
                                    ("the matmuls step's call()", ("matmuls", sources["matmuls"]))]:
            module = {"__name__": f"bench_wrapper_{len(fns)}", "_bench_sbuf": sbuf}
            exec(compile(text, f"<{label}>", "exec"), module)
            shapes = [tuple(int(v) for v in m.split(",") if v.strip()) for m in
                      re.findall(r"assert_size_stride\(arg\d+_1, \(([^)]*)\)", text)]
            args = [order[torch.Size(shape)] for shape in shapes]
            fns[label] = lambda c=module["call"], args=args: c(list(args))
        for fn in fns.values():
            fn()
        eager, host, _ = interleaved(r, f"wrapper tokens {tokens}", fns, nbytes)
        rows.append({"tokens": tokens, "bytes": nbytes, "path": r.path(nbytes), "times": eager, "host": host})
        del sbuf
    return rows


def quartiles(values: list[float]) -> list[float]:
    """[median, first quartile, third quartile]"""
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return [statistics.median(values), q[0], q[2]]


def profile_steps(r: Rank, name: str, fn) -> dict:
    """--profile-steps calls of fn, under torch.profiler on rank 0 (every
    rank makes the calls: the step's collectives need them all)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    r.aligned()
    if r.rank != 0:
        for _ in range(r.args.profile_steps):
            fn()
        torch.cuda.synchronize()
        return {}
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(r.args.profile_steps):
            fn()
        torch.cuda.synchronize()
    os.makedirs(r.args.profile, exist_ok=True)
    trace = os.path.join(r.args.profile, f"{name}.json")
    prof.export_chrome_trace(trace)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    return {"name": name, "trace": trace, "steps": r.args.profile_steps, "table": table}


def rank_main(args) -> int:
    for key, value in NO_MULTICAST.items():
        if os.environ.get(key) != value:
            raise SystemExit(f"rank {args.rank}: {key} must be {value} before torch starts")
    import torch
    import torch.distributed as dist
    from torch._inductor import config as inductor_config

    r = Rank(args)
    report = {"rank": r.rank, "sweep": [], "steps": [], "profiles": []}
    if args.sweep:
        report["sweep"] = sweep(r)
    if not args.no_step:
        report["steps"], report["profiles"] = tp_steps(r)
    if args.parts:
        report["parts"] = parts(r)
    if args.wrapper:
        report["wrapper"] = wrapper_variants(r)
    report["checks"], report["errors"] = r.checks, r.errors
    reports = [None] * r.world if r.rank == 0 else None
    dist.gather_object(report, reports, dst=0)
    failed = any(not c["ok"] for rep in (reports or [report]) for c in rep["checks"])
    if r.rank == 0:
        collective = getattr(inductor_config, "_collective", None)
        meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name(r.device), "world_size": r.world,
                "library": args.library, "stable": args.stable, "two_shot_min_bytes": r.table,
                "two_shot_min_bytes_override": args.two_shot_min_bytes,
                "inductor_collective_auto_select": getattr(collective, "auto_select", None),
                "env": {key: os.environ.get(key) for key in NO_MULTICAST},
                "iters": args.iters, "rounds": args.rounds, "graph_calls": args.graph_calls, "replays": args.replays}
        print(render(meta, reports))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "sweep": merged(reports, "sweep"), "steps": merged(reports, "steps"),
                           "per_rank": reports}, f, indent=1)
            print(f"\nwrote {args.json}")
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failed else 0


# Rank 0's report

def merged(reports: list[dict], part: str) -> list[dict]:
    """The rows of `part` with each time the slowest rank's (None if any rank failed it)."""
    rows = []
    for i, row in enumerate(reports[0][part]):
        times = {}
        for name, modes in row["times"].items():
            times[name] = {}
            for mode in modes:
                values = [rep[part][i]["times"].get(name, {}).get(mode) for rep in reports]
                times[name][mode] = None if any(v is None for v in values) else max(values)
        rows.append(dict(row, times=times))
    return rows


def us(value) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def ratio(a, b) -> str:
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def render_parts(reports: list[dict], part: str, title: str) -> list[str]:
    out = []
    for i, row in enumerate(reports[0].get(part, [])):
        out += ["", f"## {title}, eager, tokens {row['tokens']} ({size_label(row['bytes'])}B, {row['path']}), "
                    f"µs per call, per rank", "",
                "| piece | " + " | ".join(f"rank {rep['rank']} eager | host (CPU)" for rep in reports) + " |",
                "|---|" + "---:|---:|" * len(reports)]
        for name in row["times"]:
            out.append(f"| {name} | " + " | ".join(
                f"{us(rep[part][i]['times'][name])} | {us(rep[part][i].get('host', {}).get(name))}"
                for rep in reports) + " |")
    return out


def render(meta: dict, reports: list[dict]) -> str:
    if meta["two_shot_min_bytes"] == NEVER:
        rule = "stays one-shot at this world size (torch has no two-shot kernel for it)"
    elif meta["two_shot_min_bytes_override"] >= 0:
        rule = (f"goes two-shot from {meta['two_shot_min_bytes_override']} bytes (--two-shot-min-bytes; the "
                f"library's table says {meta['two_shot_min_bytes']})")
    else:
        rule = f"goes two-shot from {meta['two_shot_min_bytes']} bytes at this world size (the library's table)"
    out = [f"# symm-mem all-reduce, {meta['world_size']} x {meta['device']}, torch {meta['torch']}",
           "",
           f"kernels::all_reduce {rule}"
           + f"; multicast off ({', '.join(f'{k}={v}' for k, v in meta['env'].items())}); Inductor's "
           f"_collective.auto_select = {meta['inductor_collective_auto_select']} (False: the compiled nccl step "
           f"calls NCCL). Times in µs per call, the slowest rank's."]
    sweep_rows = merged(reports, "sweep")
    for dtype in dict.fromkeys(row["dtype"] for row in sweep_rows):
        rows = [row for row in sweep_rows if row["dtype"] == dtype]
        for mode, title in (("eager", "eager launches"), ("graph", "CUDA graph")):
            out += ["", f"## all-reduce alone, {dtype}, {title}", "",
                    "| size | path | " + " | ".join(SWEEP_METHODS) + " | opforge / direct same path "
                    "| opforge / nccl |",
                    "|---|---|" + "---:|" * (len(SWEEP_METHODS) + 2)]
            for row in rows:
                t = {name: row["times"].get(name, {}).get(mode) for name in SWEEP_METHODS}
                same = t["two-shot out"] if row["path"] == "two-shot" else t["one-shot"]
                out.append(f"| {size_label(row['bytes'])} | {row['path']} | "
                           + " | ".join(us(t[name]) for name in SWEEP_METHODS)
                           + f" | {ratio(t['opforge'], same)} | {ratio(t['opforge'], t['nccl'])} |")
    for i, row in enumerate(merged(reports, "steps")):
        t = row["times"]

        def get(name, mode):
            return t.get(name, {}).get(mode)

        out += ["", f"## TP MLP step, {row['dtype']}, tokens {row['tokens']}, hidden {row['hidden']} "
                    f"(all-reduce of {size_label(row['bytes'])}B, {row['path']})", "",
                "| step | eager | host (CPU) | CUDA graph |", "|---|---:|---:|---:|"]
        def summed(mode):
            a, b = get("matmuls", mode), get("all-reduce alone", mode)
            return None if a is None or b is None else a + b

        for name in STEPS + tuple(n for n in (TORCH_OWN_STEP, TORCH_OPS_STEP) if n in t):
            out.append(f"| {name} | {us(get(name, 'eager'))} | {us(get(name, 'host'))} | {us(get(name, 'graph'))} |")
        out.append(f"| matmuls, plus all-reduce alone (the sum) | {us(summed('eager'))} | {us(summed('host'))} "
                   f"| {us(summed('graph'))} |")
        out += [""]
        for what in ("opforge / (matmuls + direct)", "opforge / (matmuls + all-reduce alone)"):
            for suffix, mode in (("", "eager"), (" (host)", "host (CPU)")):
                per_rank = [rep["steps"][i].get("eager_ratios", {}).get(what + suffix) for rep in reports]
                if all(per_rank):
                    out.append(f"- {what}, {mode}, median of {meta['rounds']} rounds' ratios [quartiles], per "
                               f"rank: " + "; ".join(f"{q[0]:.3f}x [{q[1]:.3f}-{q[2]:.3f}]" for q in per_rank))
        out += [f"- opforge step / (matmuls + direct all-reduce), eager: "
                f"{ratio(get('opforge', 'eager'), get('matmuls + direct', 'eager'))}; "
                f"graph: {ratio(get('opforge', 'graph'), get('matmuls + direct', 'graph'))}",
                f"- opforge step / NCCL step, graph: {ratio(get('opforge', 'graph'), get('nccl', 'graph'))}; "
                f"eager: {ratio(get('opforge', 'eager'), get('nccl', 'eager'))}",
                f"- opforge step / symm_mem by hand (matmuls + direct), graph: "
                f"{ratio(get('opforge', 'graph'), get('matmuls + direct', 'graph'))}"]
    for part, title in (("parts", "pieces of the compiled step"), ("wrapper", "the compiled step's wrapper")):
        out += render_parts(reports, part, title)
    checks = [c for rep in reports for c in rep["checks"]]
    ranks = sorted({c["rank"] for c in checks})
    bad = [c for c in checks if not c["ok"]]
    out += ["", "## checks", "",
            f"{len(checks)} results checked against NCCL's on ranks {ranks}: "
            + ("all within tolerance." if not bad else f"{len(bad)} NOT within tolerance:")]
    for c in bad:
        out.append(f"- rank {c['rank']}: {c['what']}: max |diff| {c['max_error']:.3g} "
                   f"(rtol {c['rtol']:.3g}, atol {c['atol']:.3g})")
    errors = [e for rep in reports for e in rep["errors"]]
    if errors:
        out += ["", "## errors (figures shown as n/a)", ""]
        out += [f"- rank {e['rank']}: {e['what']}: {e['error']}" for e in errors]
    for prof in reports[0].get("profiles", []):
        out += ["", f"## profile: {prof['name']}, {prof['steps']} steps on rank 0 (trace {prof['trace']})",
                "", "```", prof["table"], "```"]
    return "\n".join(out)


# The launcher

def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.rank is not None:
        return rank_main(args)
    import torch

    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    world = args.world_size if args.world_size is not None else found
    if world < 2 or world > found:
        print(f"bench_symm_mem_tp: needs --world-size between 2 and the host's GPUs ({found} found; "
              f"asked {world}).")
        return 1
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    from cpp_ext import build

    folder = build("examples/kernel_library", "kernel_library_stable" if args.stable else "kernel_library",
                   *(["KERNELS_STABLE=ON"] if args.stable else []))
    library = os.path.join(folder, "libopforge_kernels.so")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    forwarded = list(argv if argv is not None else sys.argv[1:])
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), *forwarded, "--world-size", str(world),
                               "--rank", str(rank), "--port", str(port), "--library", library],
                              env=dict(os.environ, **NO_MULTICAST))
             for rank in range(world)]
    return max(p.wait() for p in procs)


if __name__ == "__main__":
    sys.exit(main())
