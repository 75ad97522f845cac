"""Inputs and checks for the tests that `opforge gen aten` generates.

A case names a generated op, the ATen overload it forwards to, a reference
(the functional ATen overload, or the target itself) and its arguments as
descriptors that build the same tensors on every run:

    >>> case = Case("sub_scalar", "aten::sub.Scalar_out", "aten::sub.Scalar", "out",
    ...             {"self": T((4, 4), seed=1), "other": 2, "alpha": 3}, outs=("out",))
    >>> run_case(case, generated_op("myaten", "sub_scalar"))   # AssertionError on a mismatch

`run_case` calls the reference, allocates the `out=` tensors from its
results (shaped like them and filled with NaN or -1), calls the op and
checks that it wrote the reference's values into those tensors and returned
them. The generator runs every case (twice) with the ATen target standing in
for the generated op, so a case only exists if ATen accepts its inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

_DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "complex64": torch.complex64, "complex128": torch.complex128,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
    "uint8": torch.uint8, "bool": torch.bool,
}
if hasattr(torch, "float8_e4m3fn"):
    _DTYPES["float8_e4m3fn"] = torch.float8_e4m3fn


class T:
    """A tensor built from a seeded generator.

    T((2, 3), seed=1)                     standard normal, float32
    T((4,), "int64", init="index:4")      integers in [0, 4)
    T((4, 4), "float64", init="spd")      symmetric positive definite
    init: randn | rand (in (0.05, 0.95)) | pos (in (0.5, 1.5)) | index:N | sorted_index:N | sorted
          | spd | ones | zeros | arange | probs | sparse_coo | sparse_csr | mkldnn
    """

    __slots__ = ("shape", "dtype", "init", "seed")

    def __init__(self, shape, dtype: str = "float32", init: str = "randn", seed: int = 0):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.init = init
        self.seed = seed

    def __repr__(self) -> str:
        parts = [repr(self.shape)]
        if self.dtype != "float32":
            parts.append(repr(self.dtype))
        if self.init != "randn":
            parts.append(f"init={self.init!r}")
        if self.seed:
            parts.append(f"seed={self.seed}")
        return f"T({', '.join(parts)})"

    def __eq__(self, other):
        return isinstance(other, T) and repr(self) == repr(other)

    def __hash__(self):
        return hash(repr(self))

    def with_(self, **changes) -> "T":
        values = {"shape": self.shape, "dtype": self.dtype, "init": self.init, "seed": self.seed}
        values.update(changes)
        return T(**values)

    def build(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(1000 + self.seed)
        dtype = _DTYPES[self.dtype]
        shape, init = self.shape, self.init
        base_init = init.split(":", 1)[0]
        if base_init in ("index", "sorted_index"):
            high = int(init.split(":", 1)[1])
            values = torch.randint(0, high, shape, generator=g)
            if base_init == "sorted_index":
                values = values.sort(dim=-1).values
            return values.to(dtype)
        if base_init in ("sparse_coo", "sparse_csr", "mkldnn"):
            dense = T(shape, self.dtype, "randn", self.seed).build()
            dense = dense * (torch.rand(shape, generator=g) > 0.5)
            if base_init == "sparse_coo":
                return dense.to_sparse()
            if base_init == "sparse_csr":
                return dense.to_sparse_csr()
            return dense.to_mkldnn()
        if dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=g).bool()
        if not (dtype.is_floating_point or dtype.is_complex):
            if base_init in ("pos", "probs"):
                return torch.randint(1, 6, shape, generator=g).to(dtype)
            if base_init == "arange":
                return torch.arange(_numel(shape)).reshape(shape).to(dtype)
            if base_init in ("ones", "zeros"):
                return (torch.ones if base_init == "ones" else torch.zeros)(shape, dtype=dtype)
            if base_init == "sorted":
                return torch.randint(-5, 6, shape, generator=g).sort(dim=-1).values.to(dtype)
            low = 0 if dtype == torch.uint8 else -5
            return torch.randint(low, 6, shape, generator=g).to(dtype)
        real = torch.float64 if dtype in (torch.float64, torch.complex128) else torch.float32
        if base_init == "randn":
            x = torch.randn(shape, generator=g, dtype=real)
        elif base_init == "rand":
            x = torch.rand(shape, generator=g, dtype=real) * 0.9 + 0.05
        elif base_init == "pos":
            x = torch.rand(shape, generator=g, dtype=real) + 0.5
        elif base_init == "probs":
            x = torch.rand(shape, generator=g, dtype=real) + 0.1
            x = x / x.sum(-1, keepdim=True)
        elif base_init == "sorted":
            x = torch.randn(shape, generator=g, dtype=real).sort(dim=-1).values
        elif base_init == "spd":
            a = torch.randn(shape, generator=g, dtype=real)
            x = a @ a.transpose(-2, -1) + shape[-1] * torch.eye(shape[-1], dtype=real)
        elif base_init == "ones":
            x = torch.ones(shape, dtype=real)
        elif base_init == "zeros":
            x = torch.zeros(shape, dtype=real)
        elif base_init == "arange":
            x = torch.arange(_numel(shape), dtype=real).reshape(shape)
        else:
            raise ValueError(f"T: unknown init {init!r}; use one listed in T's docstring.")
        if dtype.is_complex:
            y = torch.randn(shape, generator=g, dtype=real)
            return torch.complex(x, y).to(dtype)
        return x.to(dtype)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


class Call:
    """The result of an ATen call on built arguments: a forward pass whose
    output shapes a backward op's `grad_output`, or an index tensor.

    Call("aten::max_pool2d_with_indices", {"self": T((2, 4, 4)), "kernel_size": [2, 2]}, pick=1)
    like=True returns a seeded normal tensor shaped like the result instead.
    """

    __slots__ = ("target", "args", "pick", "like")

    def __init__(self, target: str, args: dict, pick: int | None = None, like: bool = False):
        self.target = target
        self.args = dict(args)
        self.pick = pick
        self.like = like

    def __repr__(self) -> str:
        extra = ""
        if self.pick is not None:
            extra += f", pick={self.pick}"
        if self.like:
            extra += ", like=True"
        return f"Call({self.target!r}, {self.args!r}{extra})"

    def build(self):
        result = resolve(self.target)(**build(self.args))
        if self.pick is not None:
            result = result[self.pick]
        if self.like:
            g = torch.Generator().manual_seed(7)
            real = torch.float64 if result.dtype == torch.float64 else torch.float32
            return torch.randn(result.shape, generator=g, dtype=real).to(result.dtype)
        return result


class Gen:
    """A torch.Generator seeded with `seed`, fresh for every call."""

    __slots__ = ("seed",)

    def __init__(self, seed: int = 0):
        self.seed = seed

    def __repr__(self) -> str:
        return f"Gen({self.seed})"

    def build(self):
        return torch.Generator().manual_seed(self.seed)


class Storage:
    """The untyped storage of a built tensor."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: T):
        self.tensor = tensor

    def __repr__(self) -> str:
        return f"Storage({self.tensor!r})"

    def build(self):
        return self.tensor.build().untyped_storage()


def build(value):
    """Builds descriptors inside lists, tuples and dicts; other values pass."""
    if isinstance(value, (T, Call, Gen, Storage)):
        return value.build()
    if isinstance(value, list):
        return [build(v) for v in value]
    if isinstance(value, tuple):
        return tuple(build(v) for v in value)
    if isinstance(value, dict):
        return {k: build(v) for k, v in value.items()}
    return value


def resolve(qualified: str):
    """'aten::add.Scalar' -> torch.ops.aten.add.Scalar; 'aten::abs' -> torch.ops.aten.abs.default"""
    name, _, overload = qualified.partition(".")
    ns, _, op = name.partition("::")
    return getattr(getattr(getattr(torch.ops, ns), op), overload or "default")


def generated_op(namespace: str, name: str):
    return getattr(getattr(torch.ops, namespace), name).default


@dataclass
class Case:
    op: str  # generated op name: "add_scalar"
    target: str  # "aten::add.Scalar_out"
    reference: str | None  # functional ATen overload, or None to call the target
    kind: str  # "out" or "inplace"
    args: dict  # every argument but the outs, by name, in schema order
    outs: tuple = ()  # names of the out= arguments
    ref_kwargs: dict = field(default_factory=dict)  # e.g. dtype for factory functions
    out_dtypes: dict = field(default_factory=dict)  # without a reference: dtype per out= name
    check: str = "close"  # "close", or "meta" (shape and dtype) for uninitialized results
    label: str = ""
    skip: str | None = None
    seed: int = 0

    @property
    def id(self) -> str:
        return f"{self.op}-{self.label}" if self.label else self.op


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        out = []
        for v in value:
            out += _tensors(v)
        return out
    return []


def _out_like(value):
    """An out= tensor shaped like a reference result and filled with a value
    the op must overwrite (NaN, or -1 for integers)."""
    if isinstance(value, torch.Tensor):
        if value.layout == torch.sparse_coo:
            return torch.empty((0,), dtype=value.dtype).to_sparse()
        if value.layout == torch._mkldnn:
            return torch.empty(value.shape, dtype=value.dtype).to_mkldnn()
        out = torch.empty_like(value, memory_format=torch.contiguous_format)
        if value.dtype.is_floating_point or value.dtype.is_complex:
            return out.fill_(float("nan"))
        return out.fill_(True if value.dtype == torch.bool else -1)
    if isinstance(value, (list, tuple)):
        return [_out_like(v) for v in value]
    raise TypeError(f"cannot allocate an out= argument for a {type(value).__name__} result")


def _compare(actual, expected, check: str, what: str) -> None:
    actual_t, expected_t = _tensors(actual), _tensors(expected)
    assert len(actual_t) == len(expected_t), f"{what}: {len(actual_t)} tensors, expected {len(expected_t)}"
    for i, (a, e) in enumerate(zip(actual_t, expected_t)):
        if a.layout != torch.strided:
            a = a.to_dense()
        if e.layout != torch.strided:
            e = e.to_dense()
        if check == "meta":
            assert (a.shape, a.dtype) == (e.shape, e.dtype), (
                f"{what}[{i}]: {tuple(a.shape)} {a.dtype}, expected {tuple(e.shape)} {e.dtype}")
            continue
        torch.testing.assert_close(a, e, equal_nan=True, msg=lambda m: f"{what}[{i}]: {m}")


def _call(fn, args: dict, seed: int):
    torch.manual_seed(seed)
    return fn(**build(args))


def run_case(case: Case, op) -> None:
    """Runs `op` (the generated op, or the ATen target while generating) on
    the case and checks it against the reference."""
    target = resolve(case.target)
    if case.kind == "inplace":
        args = build(case.args)
        first = next(iter(args))
        if case.reference:
            torch.manual_seed(case.seed)
            expected = resolve(case.reference)(**{k: _clone(v) for k, v in args.items()})
            expected = expected.to(args[first].dtype)
        else:
            copy = {k: _clone(v) for k, v in args.items()}
            torch.manual_seed(case.seed)
            expected = target(**copy)
        mutated = {k: _clone(v) for k, v in args.items()}
        torch.manual_seed(case.seed)
        result = op(**mutated)
        assert result is mutated[first], f"{case.op} did not return its mutated `{first}`"
        _compare(mutated[first], expected, case.check, f"{case.op}({first}=...)")
        return

    if case.reference:
        expected = _call(resolve(case.reference), {**case.args, **case.ref_kwargs}, case.seed)
        if len(case.outs) == 1:
            # A single Tensor[] out= argument receives the whole list.
            results = [list(expected) if isinstance(expected, (list, tuple)) else expected]
        else:
            results = list(expected)
    else:
        args = build(case.args)
        fresh = _default_outs(case, args)
        torch.manual_seed(case.seed)
        target(**args, **fresh)
        results = [fresh[name] for name in case.outs]
    outs = {name: _out_like(r) for name, r in zip(case.outs, results)}
    torch.manual_seed(case.seed)
    result = op(**build(case.args), **outs)
    written = [outs[name] for name in case.outs]
    for r, w in zip(_tensors(result), _tensors(written)):
        assert r is w, f"{case.op} returned a tensor that is not its out= argument"
    _compare(written, results, case.check, f"{case.op}(out=...)")


def _default_outs(case: Case, args: dict) -> dict:
    """out= tensors for an op with no functional reference: `case.out_dtypes`,
    else the dtype of the first tensor argument; the op resizes them."""
    dtype = "float32"
    for value in args.values():
        if isinstance(value, torch.Tensor):
            dtype = str(value.dtype).replace("torch.", "")
            break
    return {name: torch.empty((0,), dtype=_DTYPES[case.out_dtypes.get(name, dtype)]) for name in case.outs}


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, list):
        return [_clone(v) for v in value]
    return value
