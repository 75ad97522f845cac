"""Every C++ example in the docs compiles: the ```cpp blocks of each page
are put in one translation unit (each block in a namespace of its own, its
#includes first) and compiled against this opforge and torch."""

import os
import re
import subprocess

import pytest

import opforge
from cpp_ext import BUILD, ROOT

PAGES = {
    "docs/cpp_ops.md": [],
}


def snippets(page: str) -> list[str]:
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return re.findall(r"```cpp\n(.*?)```", f.read(), flags=re.S)


def translation_unit(blocks: list[str]) -> str:
    includes, bodies = [], []
    for i, block in enumerate(blocks):
        lines = block.splitlines()
        includes += [line for line in lines if line.startswith("#include")]
        body = "\n".join(line for line in lines if not line.startswith("#include"))
        bodies.append(f"namespace doc_snippet_{i} {{\n{body}\n}}  // namespace doc_snippet_{i}\n")
    return "\n".join(dict.fromkeys(includes)) + "\n\n" + "\n".join(bodies)


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_cpp_example_of_the_page_compiles(page):
    from opforge.gen._build import torch_flags

    blocks = snippets(page)
    assert len(blocks) >= 5, page
    source = os.path.join(BUILD, "doc_snippets", page.replace("/", "_") + ".cc")
    os.makedirs(os.path.dirname(source), exist_ok=True)
    with open(source, "w", encoding="utf-8") as f:
        f.write(translation_unit(blocks))
    cflags, _ = torch_flags()
    command = [os.environ.get("CXX", "c++"), "-fsyntax-only", *cflags, *PAGES[page],
               "-I", os.path.join(opforge.cmake_prefix_path, "include"), source]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-6000:]
