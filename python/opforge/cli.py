"""The `opforge` command line.

    opforge demo                 one op of each kind, eager + compiled + backward
    opforge bench                the per-call overhead table (docs/performance.md)
    opforge inspect NS::op       original signature, flat schema, mapping tree
    opforge gen aten|stubs ...   schema codegen (docs/codegen.md)
    opforge --version            opforge's version and the torch it was built against

`python -m opforge ...` is the same command line.

Each subcommand lives in its own module and registers itself through
`COMMANDS`: (name, module, help). A module provides `add_arguments(parser)`
and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = [
    ("demo", "opforge._demo", "run a showcase of every op form on CPU"),
    ("bench", "opforge.bench", "print the per-call overhead table"),
    ("inspect", "opforge._inspect", "show an op's original signature, flat schema and mapping tree"),
    ("gen", "opforge.gen.cli", "generate operators and type stubs from schemas"),
]


def version_text() -> str:
    """'opforge 0.1.0 (built against torch 2.13.0+cpu)', naming the running
    torch too where it differs (a patch release or another device's build;
    another minor release cannot get here, `import opforge` refuses it)."""
    import torch

    import opforge
    from opforge import _torch_version

    built = _torch_version.built_against() or "an unrecorded torch"
    running = str(torch.__version__)
    text = f"opforge {opforge.__version__} (built against torch {built}"
    return text + (")" if running == built else f", running torch {running})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opforge", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module, help_text in COMMANDS:
        p = sub.add_parser(name, help=help_text)
        p.set_defaults(_module=module)
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        mod.add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module = importlib.import_module(args._module)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
