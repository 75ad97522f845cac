"""GPU tests share the helper packages of the CPU tests, and the fresh_compile fixture."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python"))


@pytest.fixture
def fresh_compile(monkeypatch):
    """No cache may skip the compile whose graphs a test inspects."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    for config, name, value in ((inductor_config, "force_disable_caches", True),
                                (inductor_config, "fx_graph_cache", False),
                                (functorch_config, "enable_autograd_cache", False)):
        if hasattr(config, name):
            monkeypatch.setattr(config, name, value)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()
