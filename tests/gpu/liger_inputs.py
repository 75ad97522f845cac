"""Inputs for Liger-Kernel's ops and their ports (tests/gpu/liger_ports.py),
and one forward + backward over them: shared by tests/gpu/test_liger.py,
benchmarks/bench_liger.py and benchmarks/bench_liger_compiled.py.

Sizes: "test" (what the tests compare and compile), "small" (the benchmark's
size at which the host's per-call work decides the time: [4, 512] rows) and
"large" (the benchmarks' size: [4096, 4096] rows, Llama's attention shapes
for RoPE). Every input that takes a gradient is a leaf.
"""

import torch

DEV = "cuda"

NORM = {"test": (512, 1024), "small": (4, 512), "large": (4096, 4096)}
GLU = {"test": (512, 2048), "small": (4, 512), "large": (4096, 8192)}
# (batch, seq, q heads, kv heads, head dim)
ROPE = {"test": (2, 128, 8, 2, 64), "small": (1, 16, 8, 2, 64), "large": (4, 1024, 32, 8, 128)}
CROSS_ENTROPY = {"test": (512, 4096), "large": (4096, 32000)}


def leaf(*shape, dtype):
    return torch.randn(*shape, device=DEV, dtype=torch.float32).to(dtype).requires_grad_()


def norm_inputs(dtype, size, bias):
    rows, cols = NORM[size]
    X = leaf(rows, cols, dtype=dtype)
    W = (torch.rand(cols, device=DEV) + 0.5).to(dtype).requires_grad_()
    return (X, W, leaf(cols, dtype=dtype)) if bias else (X, W)


def glu_inputs(dtype, size):
    rows, cols = GLU[size]
    return leaf(rows, cols, dtype=dtype), leaf(rows, cols, dtype=dtype)


def rope_inputs(dtype, size):
    b, s, hq, hk, d = ROPE[size]
    # Llama's layout: (batch, seq, heads, dim) in memory, seen as (batch, heads, seq, dim).
    q = torch.randn(b, s, hq, d, device=DEV).to(dtype).transpose(1, 2).requires_grad_()
    k = torch.randn(b, s, hk, d, device=DEV).to(dtype).transpose(1, 2).requires_grad_()
    angles = torch.arange(s, device=DEV)[:, None] * torch.rand(d // 2, device=DEV)[None, :]
    angles = torch.cat([angles, angles], dim=-1)[None]
    return q, k, angles.cos().to(dtype), angles.sin().to(dtype)


def softmax_inputs(dtype, size):
    return (leaf(*NORM[size], dtype=dtype),)


def ce_inputs(dtype, size):
    rows, vocab = CROSS_ENTROPY[size]
    logits = leaf(rows, vocab, dtype=dtype)
    target = torch.randint(0, vocab, (rows,), device=DEV)
    target[::2] = -100  # half the targets ignored: the mean divides by a power of two
    return logits, target


def fresh(inputs):
    """Copies of the inputs (Liger's Functions write some of theirs), same strides, leaves again."""
    out = []
    for t in inputs:
        c = t.detach().clone()
        out.append(c.requires_grad_() if t.requires_grad else c)
    return out


def as_tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def output_grads(outs):
    torch.manual_seed(1)
    return [torch.randn_like(o) for o in outs]


def forward_backward(fn, inputs):
    """(outputs, input gradients) of fn on fresh copies of the inputs, the
    outputs given fixed random gradients."""
    args = fresh(inputs)
    outs = as_tuple(fn(*args))
    torch.autograd.backward(outs, output_grads(outs))
    return [o.detach() for o in outs], [a.grad for a in args if a.requires_grad]
