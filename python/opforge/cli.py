"""The `opforge` command line.

    opforge demo                 one op of each kind, eager + compiled + backward
    opforge bench                the per-call overhead table (SPEC §9)
    opforge inspect NS::op       original signature, flat schema, mapping tree
    opforge gen aten|stubs ...   schema codegen (SPEC §7)

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
    ("bench", "opforge._bench", "print the per-call overhead table"),
    ("inspect", "opforge._inspect", "show an op's original signature, flat schema and mapping tree"),
    ("gen", "opforge.gen.cli", "generate operators and type stubs from schemas"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opforge", description=__doc__.splitlines()[0])
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
