"""Helpers shared by the `@opforge.op` tests.

Operators live for the whole process, so every test defines its ops in a
namespace of its own (`ns` fixture): `f"{ns}::scale"`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re

import pytest
import torch

import opforge

_counter = itertools.count()


@pytest.fixture
def ns(request) -> str:
    """A fresh op namespace for one test; its ops are removed afterwards, so
    the dispatcher does not accumulate test ops."""
    name = re.sub(r"\W", "_", request.node.name)[:40]
    namespace = f"t{next(_counter)}_{name}"
    yield namespace
    unregister_namespace(namespace)


def unregister_namespace(namespace: str) -> None:
    from opforge import _registry

    for name in [n for n in _registry.names() if n.startswith(namespace + "::")]:
        opdef = _registry.remove(name)
        opdef._registrations.clear()
        opdef._lib._destroy()


@contextlib.contextmanager
def fast_path(enabled: bool):
    previous = opforge.set_fast_path_enabled(enabled)
    try:
        yield
    finally:
        opforge.set_fast_path_enabled(previous)


@pytest.fixture(params=["fast", "dispatcher"])
def path(request):
    """Runs a test twice: with the eager fast path, and through the dispatcher."""
    with fast_path(request.param == "fast"):
        yield request.param


def both_paths(fn, *args, **kwargs):
    """fn(*args) with the fast path on and off: (fast result, dispatcher result)."""
    with fast_path(True):
        fast = fn(*args, **kwargs)
    with fast_path(False):
        slow = fn(*args, **kwargs)
    return fast, slow


def needs_torch(version: str, what: str, available: bool):
    """Skips a test of something torch offers from `version` on, saying so:
    needs_torch("2.13", "the native symm-mem registry", False) skips with
    'needs torch 2.13 (this is 2.12.1+cu130): the native symm-mem registry'."""
    return pytest.mark.skipif(not available, reason=f"needs torch {version} (this is {torch.__version__}): {what}")


# AOTInductor's generated wrapper on torch 2.11 stores through a null pointer
# when it calls a custom op that returns nothing (an out-variant op): the
# process dies inside *.wrapper.so (docs/deploy.md#torch-versions).
# Seen on 2.11; 2.13 runs such packages; 2.12 is not checked.
AOTI_RUNS_OUT_VARIANT_OPS = pytest.mark.skipif(
    torch.torch_version.TorchVersion(torch.__version__) < "2.13",
    reason=f"AOTInductor of torch {torch.__version__} crashes calling an out-variant custom op (seen on 2.11)")


def graph_breaks() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def compiled_frames() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


@contextlib.contextmanager
def fresh_dynamo():
    """Counters and caches as if torch.compile had not run yet."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def in_torch_ops(qualname: str) -> bool:
    """Whether torch knows an op of that name in any form."""
    ns, name = qualname.split("::")
    if torch._C._jit_get_schemas_for_operator(qualname):
        return True
    namespace = getattr(torch.ops, ns)
    return name in vars(namespace)


def torch_build_dir(name: str) -> str:
    """build/torch-<release>/<name>: what a test compiles against the running
    torch, kept apart per release so suites on two torch versions
    (`make test`, `make test-torch-latest`) never reuse each other's objects."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(root, "build", f"torch-{torch.__version__.split('+')[0]}", name)


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_test_extension():
    """tests/cpp_ext built with find_package(opforge), as users build their
    kernel libraries, loaded once: `opforge.ops.opforge_ext`."""
    from cpp_ext import load

    return load()
