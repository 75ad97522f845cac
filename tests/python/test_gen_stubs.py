"""Type stubs for torch.ops namespaces: `opforge gen stubs` and the stubs of
`opforge gen aten`."""

import ast
import importlib.util
import inspect
import os
import sys

import pytest
import torch

from opforge import _C
from opforge.gen import _aten, _stubs
from opforge.gen._generate import generate_stubs

NAMESPACE = "opforge_stub_test"


@pytest.fixture(scope="module")
def library():
    lib = torch.library.Library(NAMESPACE, "DEF")
    lib.define("scale(Tensor x, float factor=2., *, Tensor? bias=None) -> Tensor")
    lib.define("scale.many(Tensor[] xs, int[2] dims=[0, 1], ScalarType? dtype=None) -> Tensor[]")
    lib.define("pick(Tensor x, int from, Scalar s=1, str mode=\"mean\", bool flag=False) -> (Tensor, Tensor)")
    lib.define("fill_(Tensor(a!) self, Scalar value) -> Tensor(a!)")
    lib.define("nothing(Tensor x) -> ()")
    yield lib
    lib._destroy()


def load_stub(path):
    """The .pyi executed as a module, to inspect its signatures."""
    spec = importlib.util.spec_from_loader("stub_under_test", loader=None)
    module = importlib.util.module_from_spec(spec)
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), module.__dict__)
    return module


def signature(cls):
    return str(inspect.signature(cls.__call__))


def test_schema_types_map_to_python_annotations():
    def t(text):
        return _C.parse_type(text)

    assert _stubs.python_type(t("int[]")) == "Sequence[int]"
    assert _stubs.python_type(t("int[]"), sized=True) == "Union[int, Sequence[int]]"
    assert _stubs.python_type(t("Tensor?")) == "Optional[Tensor]"
    assert _stubs.python_type(t("Tensor?[]")) == "Sequence[Optional[Tensor]]"
    assert _stubs.python_type(t("Tensor[]"), returning=True) == "list[Tensor]"
    assert _stubs.python_type(t("Scalar")) == "_Number"
    assert _stubs.python_type(t("ScalarType?")) == "Optional[torch.dtype]"
    assert _stubs.python_type(t("SymInt")) == "_SymInt"
    assert _stubs.python_type(t("Dict(str, t)")) == "dict[str, Any]"


def test_stubs_of_a_library_namespace_give_each_overload_its_signature(library, tmp_path):
    files = generate_stubs(NAMESPACE, str(tmp_path))
    assert [os.path.basename(f) for f in files] == [f"{NAMESPACE}.pyi", f"{NAMESPACE}.py"]
    stub = load_stub(files[0])
    assert signature(stub._Op_scale__default) == (
        "(_op, /, x: 'Tensor', factor: 'float' = 2.0, *, bias: 'Optional[Tensor]' = None) -> 'Tensor'"
    )
    assert signature(stub._Op_scale__many) == (
        "(_op, /, xs: 'Sequence[Tensor]', dims: 'Union[int, Sequence[int]]' = [0, 1], "
        "dtype: 'Optional[torch.dtype]' = None) -> 'list[Tensor]'"
    )
    assert signature(stub._Op_nothing__default) == "(_op, /, x: 'Tensor') -> 'None'"
    assert stub._Op_scale.__annotations__ == {"default": "_Op_scale__default", "many": "_Op_scale__many"}
    assert stub.__annotations__["scale"] == "_Op_scale"


def test_a_python_keyword_argument_becomes_positional_only_with_an_underscore(library, tmp_path):
    stub = load_stub(generate_stubs(NAMESPACE, str(tmp_path))[0])
    assert signature(stub._Op_pick__default) == (
        "(_op, x: 'Tensor', from_: 'int', /, s: '_Number' = 1, mode: 'str' = 'mean', flag: 'bool' = False)"
        " -> 'tuple[Tensor, Tensor]'"
    )


def test_the_stub_parses_and_documents_each_schema(library, tmp_path):
    path = generate_stubs(NAMESPACE, str(tmp_path))[0]
    with open(path) as f:
        source = f.read()
    ast.parse(source)
    assert f'"""{NAMESPACE}::fill_(Tensor(a!) self, Scalar value) -> Tensor(a!)"""' in source


def test_the_runtime_module_hands_out_the_torch_ops_packets(library, tmp_path):
    generate_stubs(NAMESPACE, str(tmp_path), module="stubbed_ops")
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("stubbed_ops")
        assert module.scale is getattr(torch.ops, NAMESPACE).scale
        assert sorted(dir(module)) == ["fill_", "nothing", "pick", "scale"]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("stubbed_ops", None)


def test_an_unknown_namespace_is_an_error_that_says_how_to_register_it(tmp_path):
    with pytest.raises(_aten.GenError) as info:
        generate_stubs("no_such_namespace_here", str(tmp_path))
    assert str(info.value) == (
        "no operators are registered under namespace 'no_such_namespace_here'; load the library or "
        "import the module that defines them first (--load PATH or --import MODULE)."
    )


def test_the_cli_imports_a_module_before_writing_stubs(tmp_path, capsys):
    from opforge import cli

    (tmp_path / "defines_ops.py").write_text(
        "import torch\n"
        "lib = torch.library.Library('opforge_stub_cli', 'DEF')\n"
        "lib.define('twice(Tensor x) -> Tensor')\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        code = cli.main(["gen", "stubs", "--namespace", "opforge_stub_cli", "--out", str(tmp_path / "out"),
                         "--import", "defines_ops", "--quiet"])
    finally:
        sys.path.remove(str(tmp_path))
    assert code == 0
    stub = load_stub(str(tmp_path / "out" / "opforge_stub_cli.pyi"))
    assert signature(stub._Op_twice__default) == "(_op, /, x: 'Tensor') -> 'Tensor'"
    assert capsys.readouterr().err == ""


def test_the_cli_reports_a_missing_import_as_an_error(capsys):
    from opforge import cli

    code = cli.main(["gen", "stubs", "--namespace", "x", "--out", "unused", "--import", "no_such_module_abc"])
    assert code == 2
    assert "--import no_such_module_abc: No module named 'no_such_module_abc'" in capsys.readouterr().err


def test_aten_stubs_describe_the_generated_signature_and_its_target():
    sel = _aten.select(["max"], "myaten")
    entries = [_stubs.entry(op.schema_text, doc=f"{op.schema_text}\n\nForwards to {op.target_qualified}.")
               for op in sel.ops]
    source = _stubs.stub_source("myaten", entries)
    assert (
        "    def __call__(_op, /, self: Tensor, dim: int, keepdim: bool = False, *, max: Tensor, "
        "max_values: Tensor) -> tuple[Tensor, Tensor]: ..."
    ) in source
    assert "    Forwards to aten::max.dim_max." in source


def test_stubs_describe_an_opforge_op_by_its_registered_flat_schema(tmp_path):
    import dataclasses

    import opforge

    if not hasattr(opforge, "op"):
        pytest.skip("this build of opforge has no @opforge.op front end")

    @dataclasses.dataclass(frozen=True)
    class ShiftCfg:
        factor: float = 2.0
        bias: float = 0.0

    @opforge.op("opforge_stub_opdef::shift")
    def shift(x: torch.Tensor, cfg: ShiftCfg, mode: str = "fast") -> torch.Tensor:
        return x * cfg.factor + cfg.bias

    stub = load_stub(generate_stubs("opforge_stub_opdef", str(tmp_path))[0])
    assert signature(stub._Op_shift__default) == (
        "(_op, /, x: 'Tensor', cfg__factor: 'float' = 2.0, cfg__bias: 'float' = 0.0, mode: 'str' = 'fast') -> 'Tensor'"
    )
