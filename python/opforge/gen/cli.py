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
import traceback

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
    except OSError as e:  # a path the checks above did not foresee
        print(f"opforge gen {args.gen_command}: error: cannot use {e.filename or 'a file'} ({e.strerror or e}); "
              "check the paths passed and their permissions.", file=sys.stderr)
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
    from ._generate import generate_stubs
    from ._stubs import registered_schemas

    for path in args.load:
        _load(path)
    for module in args.imports:
        _import(module)
    given = [f"--load {p}" for p in args.load] + [f"--import {m}" for m in args.imports]
    if given and not registered_schemas(args.namespace):
        raise GenError(f"{', '.join(given)} registered no operators under namespace {args.namespace!r}; "
                       "check --namespace, or pass the library or module that defines them.")
    files = generate_stubs(args.namespace, args.out, args.module, progress=Progress(quiet=args.quiet))
    print("\n".join(files))
    return 0


def _load(path: str) -> None:
    """Loads an operator library as opforge.load_library does; GenError naming it if it cannot."""
    from .._libraries import load_errors, load_library

    if not os.path.exists(path):
        raise GenError(f"--load {path}: no such file; pass the path of a built operator library.")
    if os.path.isdir(path):
        raise GenError(f"--load {path}: is a directory; pass the path of a built operator library (a .so file).")
    before = len(load_errors())
    try:
        load_library(path)
    except OSError as e:
        # torch says only "Could not load this library"; the loader's reason is its cause.
        reason = str(e.__cause__ or e).strip().splitlines()[0]
        raise GenError(f"--load {path}: not a loadable shared library ({reason}); pass an operator library "
                       "built for this torch and platform (a .so).") from None
    except RuntimeError as e:
        errors = load_errors()[before:] or [str(e)]
        first = errors[0].strip().splitlines()[0]
        raise GenError(f"--load {path}: {len(errors)} of its OPFORGE_LIBRARY blocks could not be registered, the "
                       f"first: {first} Fix them and rebuild the library.") from None


def _import(module: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise GenError(f"--import {module}: {e}; make the module importable (PYTHONPATH) or fix its name.") from None
    except Exception as e:  # noqa: BLE001 - the user's module: its error, where it was raised, one line
        where = _where(e)
        text = e.msg if isinstance(e, SyntaxError) else str(e)
        first = text.strip().splitlines()[0].rstrip(".") if text.strip() else ""
        raise GenError(f"--import {module}: importing it raised {type(e).__name__}{where}"
                       f"{': ' + first if first else ''}; fix the module, or import it in Python to see the "
                       "whole traceback.") from None


def _where(e: BaseException) -> str:
    """' at pkg/ops.py:12': the line of the importing code that raised (a syntax error's own line),
    the innermost frame outside opforge, torch and the import machinery."""
    if isinstance(e, SyntaxError) and e.filename:
        return f" at {e.filename}:{e.lineno}"
    import torch

    opforge_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    skip = tuple(os.path.dirname(os.path.abspath(path)) + os.sep for path in
                 (torch.__file__, importlib.__file__, opforge_dir + os.sep + "__init__.py"))
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if not f.filename.startswith("<") and not os.path.abspath(f.filename).startswith(skip)]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
