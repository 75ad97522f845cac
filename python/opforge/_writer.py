"""Indented Python source, written line by line (the generated code of
opforge._codegen and opforge._traced_call).

    w = Writer()
    w.line("def f(x):")
    with w.block():
        w.line("return x")
    w.text()   # 'def f(x):\n    return x\n'
"""

from __future__ import annotations


class Writer:
    def __init__(self):
        self.lines: list[str] = []
        self.indent = 0

    def line(self, text: str = ""):
        self.lines.append("    " * self.indent + text if text else "")

    def block(self):
        return Block(self)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


class Block:
    __slots__ = ("writer",)

    def __init__(self, writer: Writer):
        self.writer = writer

    def __enter__(self):
        self.writer.indent += 1

    def __exit__(self, *exc):
        self.writer.indent -= 1
