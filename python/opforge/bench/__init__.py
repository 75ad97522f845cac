"""`opforge bench`: the tables of docs/performance.md, measured side by side in
one process. Not imported by `import opforge`; `opforge bench` (cli.py) and
the scripts in benchmarks/ load it.

    opforge bench                      # per-call rows (eager.py) and the C++ section (cpp.py)
    opforge bench --device cuda        # CUDA tensors
    opforge bench --runners            # runners under torch.compile (runners.py)
    opforge bench --compiled           # a compiled model of struct ops (compiled.py)
    opforge bench --compile            # registration, Dynamo, Inductor cold/warm (compile.py)
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from . import compile, compiled, cpp, eager, runners  # noqa: A004 - `compile` is the --compile section


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", help="device of the tensors: cpu (default) or cuda")
    parser.add_argument("--args", default="1,5,30", help="argument counts to measure (default 1,5,30)")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per row; the median is reported")
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds per timed repeat (default 0.05)")
    parser.add_argument("--registrations", type=int, default=50, help="ops registered per repeat (default 50)")
    parser.add_argument("--json", metavar="FILE", help="also write the raw numbers to FILE")
    parser.add_argument("--runners", action="store_true",
                        help="instead: compile time and step time of a model whose every layer holds a runner, "
                             "against the same model without runners")
    parser.add_argument("--compiled", action="store_true",
                        help="instead: step time of a compiled model of struct ops, against the same model with "
                             "define+impl and custom_op ops")
    parser.add_argument("--compile", action="store_true",
                        help="instead: what a model of struct ops costs before its first step (registration, "
                             "Dynamo, Inductor cold and warm, recompiles) and its compiled step, against the same "
                             "model with define+impl and custom_op ops")
    runners.add_arguments(parser)
    compiled.add_arguments(parser)
    compile.add_arguments(parser)
    parser.add_argument("--no-cpp", dest="cpp", action="store_false",
                        help="skip the C++ section (it compiles a small op library on first use)")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "runners", False):
        return runners.run(args)
    if getattr(args, "compiled", False):
        return compiled.run(args)
    if getattr(args, "compile", False):
        return compile.run(args)
    device = torch.device(args.device).type
    if device == "cuda" and not torch.cuda.is_available():
        print("opforge bench: --device cuda needs a CUDA GPU, and none is available.", file=sys.stderr)
        return 2
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    counts = [int(a) for a in str(args.args).split(",") if a.strip()]
    calls: dict[int, dict[str, float]] = {}
    for n in counts:
        print(f"  measuring calls with {n} argument(s) ...", file=sys.stderr, flush=True)
        case = eager.make_case(n, device, f"{next(eager._run_ids)}n{n}")
        calls[n] = eager.measure_calls(case, repeats=args.repeats, min_time=args.min_time, sync=sync)
    registration = {}
    for n in counts:
        print(f"  measuring registration with {n} argument(s) ...", file=sys.stderr, flush=True)
        registration[f"{n} args, same signature shape"] = eager.measure_registration(
            n, count=args.registrations, repeats=max(3, args.repeats // 2), distinct=False)
        registration[f"{n} args, distinct signatures"] = eager.measure_registration(
            n, count=args.registrations, repeats=max(3, args.repeats // 2), distinct=True)
    print(eager.render(device, calls, registration, args.repeats))
    if args.cpp:
        print()
        print(cpp.section(repeats=max(args.repeats, 5) * 4))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "torch": torch.__version__, "calls": calls, "registration": registration},
                      f, indent=2)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="opforge bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
