"""`opforge gen`: schema codegen (docs/codegen.md).

    opforge gen aten --allowlist aten_allowlist.txt --namespace myaten --out gen/
    opforge gen stubs --namespace myaten --out stubs/ [--load lib.so] [--import pkg.ops]

Progress goes to stderr (`--quiet` silences it); the summary to stdout.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from ._aten import GenError
from ._io import Progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="gen_command", required=True)

    aten = sub.add_parser("aten", help="generate operators forwarding to ATen's out= overloads")
    aten.add_argument("--allowlist", required=True, help="file with one ATen base name per line")
    aten.add_argument("--namespace", required=True, help="namespace of the generated ops, e.g. myaten")
    aten.add_argument("--out", required=True, help="directory for the generated files")
    aten.add_argument("--source", choices=("registry", "yaml"), default="registry",
                      help="read schemas from torch's live registry (default) or its packaged "
                           "native_functions.yaml")
    aten.add_argument("--build-dir", help="where to compile (default: OUT/build)")
    aten.add_argument("--no-build", action="store_true", help="generate sources only")
    aten.add_argument("--no-tests", action="store_true", help="skip the generated test module")
    aten.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                      help="parallel compiles and input-search workers (default: 2)")
    aten.add_argument("--strict", action="store_true", help="fail if any allowlisted name cannot be generated")
    aten.add_argument("--quiet", action="store_true", help="no progress lines on stderr")

    stubs = sub.add_parser("stubs", help="write .pyi stubs for the ops of a registered namespace")
    stubs.add_argument("--namespace", required=True, help="namespace whose ops to describe")
    stubs.add_argument("--out", required=True, help="directory for NAME.pyi and NAME.py")
    stubs.add_argument("--module", help="module name for the stub (default: the namespace)")
    stubs.add_argument("--load", action="append", default=[], metavar="LIB",
                       help="shared library to load first (repeatable)")
    stubs.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                       help="Python module to import first, e.g. one defining @opforge.op ops (repeatable)")
    stubs.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def run(args: argparse.Namespace) -> int:
    try:
        if args.gen_command == "aten":
            return _run_aten(args)
        return _run_stubs(args)
    except GenError as e:
        print(f"opforge gen {args.gen_command}: error: {e}", file=sys.stderr)
        return 2


def _run_aten(args) -> int:
    from ._generate import generate_aten

    report = generate_aten(args.allowlist, args.namespace, args.out, source=args.source,
                           build_library=not args.no_build, tests=not args.no_tests,
                           build_dir=args.build_dir, jobs=args.jobs, strict=args.strict,
                           progress=Progress(quiet=args.quiet))
    generated, total = report.coverage
    sel = report.selection
    print(f"{args.namespace}: {len(sel.ops)} ops for {generated} of {total} allowlisted names "
          f"(torch {sel.torch_version}, {sel.source})")
    for missing in sel.not_generated:
        print(f"  not generated: {missing.name}: {missing.reason}")
    print(f"files in {args.out}: {len(report.files)}, changed: {', '.join(report.written) or 'none'}")
    if report.cases:
        print(f"tests: {report.cases} cases in test_{args.namespace}_ops.py, "
              f"{len(report.skipped_cases)} skip with a reason")
    if report.build:
        b = report.build
        state = f"compiled {', '.join(b.compiled)}" if b.compiled else "nothing to compile"
        print(f"library: {b.library} ({state}; {b.cpu_seconds:.1f} CPU-s)")
    return 0


def _run_stubs(args) -> int:
    import torch

    from ._generate import generate_stubs

    for path in args.load:
        if not os.path.exists(path):
            raise GenError(f"--load {path}: no such file; pass the path of a built operator library.")
        torch.ops.load_library(path)
    for module in args.imports:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise GenError(f"--import {module}: {e}; make the module importable (PYTHONPATH) or fix its name.")
    files = generate_stubs(args.namespace, args.out, args.module, progress=Progress(quiet=args.quiet))
    print("\n".join(files))
    return 0
