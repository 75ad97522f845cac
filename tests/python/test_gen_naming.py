"""Which ATen overloads `opforge gen aten` generates and what it calls them."""

import os

import pytest

from opforge.gen import _aten, _cpp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ALLOWLIST = os.path.join(ROOT, "examples", "codegen", "aten_allowlist.txt")


@pytest.fixture(scope="module")
def standard():
    return _aten.select(_aten.read_allowlist(ALLOWLIST), "myaten")


def names_by_target(selection):
    return {op.target_qualified: op.name for op in selection.ops}


def test_the_plain_out_overload_takes_the_base_name_and_others_a_suffix():
    sel = _aten.select(["sub", "sum"], "myaten")
    names = names_by_target(sel)
    assert names["aten::sub.out"] == "sub"
    assert names["aten::sub.Scalar_out"] == "sub_scalar"
    assert names["aten::sum.out"] == "sum"
    assert names["aten::sum.IntList_out"] == "sum_intlist"


def test_out_tokens_are_dropped_wherever_they_appear():
    assert _aten._suffix("Scalar_out") == "scalar"
    assert _aten._suffix("out_mode") == "mode"
    assert _aten._suffix("OutScalar_Self") == "scalar_self"
    assert _aten._suffix("out") == ""


def test_the_only_out_overload_of_a_base_takes_the_base_name():
    # kthvalue also has a Dimname out overload on torch <= 2.12, so it is
    # not the only one there.
    names = names_by_target(_aten.select(["geqrf", "tanh_backward"], "myaten"))
    assert names == {
        "aten::geqrf.a": "geqrf",
        "aten::tanh_backward.grad_input": "tanh_backward",
    }
    kthvalue = names_by_target(_aten.select(["kthvalue"], "myaten"))
    if len(kthvalue) == 1:
        assert kthvalue == {"aten::kthvalue.values": "kthvalue"}


def test_the_tensor_overload_is_primary_when_no_plain_out_exists():
    names = names_by_target(_aten.select(["eq", "pow"], "myaten"))
    assert names["aten::eq.Tensor_out"] == "eq"
    assert names["aten::eq.Scalar_out"] == "eq_scalar"
    assert names["aten::pow.Tensor_Tensor_out"] == "pow"
    assert names["aten::pow.Scalar_out"] == "pow_scalar"


def test_in_place_bases_keep_their_trailing_underscore_after_the_suffix():
    names = names_by_target(_aten.select(["add_", "clamp_max_"], "myaten"))
    assert names["aten::add_.Tensor"] == "add_"
    assert names["aten::add_.Scalar"] == "add_scalar_"
    assert names["aten::clamp_max_"] == "clamp_max_"
    assert names["aten::clamp_max_.Tensor"] == "clamp_max_tensor_"


def test_a_colliding_name_goes_to_the_op_whose_base_it_is():
    names = names_by_target(_aten.select(["range", "scatter", "scatter_reduce"], "myaten"))
    assert names["aten::range.out"] == "range"
    assert names["aten::range.out_"] == "range_out"
    assert names["aten::scatter_reduce.two_out"] == "scatter_reduce"
    assert names["aten::scatter.reduce_out"] == "scatter_reduce_out"


def test_the_generated_schema_is_the_target_schema_renamed():
    op = next(op for op in _aten.select(["sub"], "myaten").ops if op.name == "sub_scalar")
    assert op.schema_text == (
        "myaten::sub_scalar(Tensor self, Scalar other, Scalar alpha=1, *, Tensor(a!) out) -> Tensor(a!)"
    )
    assert op.reference == "aten::sub.Scalar"
    assert op.out_arguments == ["out"]


def test_factory_references_take_the_dtype_the_out_form_lacks():
    op = next(op for op in _aten.select(["arange"], "myaten").ops if op.name == "arange")
    assert op.reference == "aten::arange"
    assert "dtype" in op.reference_extra


def test_in_place_ops_pair_with_the_functional_overload_of_the_same_signature():
    names = {op.name: op.reference for op in _aten.select(["add_", "pow_"], "myaten").ops}
    assert names["add_"] == "aten::add.Tensor"
    assert names["pow_"] == "aten::pow.Tensor_Tensor"


def test_every_name_of_the_standard_allowlist_is_generated(standard):
    generated = set(standard.generated_bases)
    assert len(_aten.read_allowlist(ALLOWLIST)) == 525
    assert len(generated) >= 520
    assert standard.not_generated == [] or all(n.reason for n in standard.not_generated)
    assert len(standard.ops) > 700


def test_generated_names_are_unique_identifiers_and_stable_across_runs(standard):
    names = [op.name for op in standard.ops]
    assert len(names) == len(set(names))
    assert all(n.isidentifier() for n in names)
    again = _aten.select(_aten.read_allowlist(ALLOWLIST), "myaten")
    assert [(op.name, op.target_qualified) for op in again.ops] == [
        (op.name, op.target_qualified) for op in standard.ops
    ]


def test_torchscript_list_overloads_are_excluded_with_a_reason(standard):
    excluded = dict(standard.excluded_overloads)
    assert "aten::add_.t" in excluded
    assert "TorchScript-only type" in excluded["aten::add_.t"]


def test_the_yaml_source_agrees_with_the_registry_where_both_have_the_op():
    pytest.importorskip("yaml", reason="--source yaml needs PyYAML")
    registry = {op.name: op.schema_text for op in _aten.select(["sub", "topk", "linalg_qr"], "myaten").ops}
    yaml_ops = _aten.select(["sub", "topk", "linalg_qr"], "myaten", source="yaml").ops
    assert yaml_ops
    for op in yaml_ops:
        assert registry[op.name] == op.schema_text


def test_unknown_names_are_reported_not_generated_with_the_reason():
    sel = _aten.select(["abs", "no_such_op"], "myaten")
    assert [op.name for op in sel.ops] == ["abs"]
    assert [(n.name, "no ATen operator named 'no_such_op'" in n.reason) for n in sel.not_generated] == [
        ("no_such_op", True)
    ]


def test_an_overload_in_the_allowlist_is_an_error_naming_the_line_and_the_fix():
    with pytest.raises(_aten.GenError) as info:
        _aten.parse_allowlist(["abs", "# comment", "add.out"], origin="list.txt")
    assert str(info.value) == (
        "list.txt:3: 'add.out' names an overload; the allowlist takes base names, "
        "every overload is generated: write 'add'."
    )


def test_a_malformed_allowlist_entry_is_an_error():
    with pytest.raises(_aten.GenError, match=r"list.txt:1: 'two words' is not an operator base name"):
        _aten.parse_allowlist(["two words"], origin="list.txt")


def test_comments_blank_lines_duplicates_and_the_aten_prefix_are_accepted():
    assert _aten.parse_allowlist(["abs  # unary", "", "aten::acos", "abs"]) == ["abs", "acos"]


def test_an_allowlist_saved_with_a_byte_order_mark_reads_as_its_names(tmp_path):
    path = tmp_path / "list.txt"
    path.write_bytes("abs\r\nacos\r\n".encode("utf-8-sig"))  # as some Windows editors save UTF-8
    assert _aten.read_allowlist(str(path)) == ["abs", "acos"]


@pytest.mark.parametrize(
    "namespace, message",
    [
        ("aten", "namespace 'aten' belongs to torch; choose your own, e.g. --namespace myaten."),
        ("my-ops", "namespace 'my-ops' is not a valid identifier"),
        ("", "namespace '' is not a valid identifier"),
    ],
)
def test_bad_namespaces_are_rejected_with_the_fix(namespace, message):
    with pytest.raises(_aten.GenError) as info:
        _aten.check_namespace(namespace)
    assert str(info.value).startswith(message)


def test_an_allowlist_with_nothing_to_generate_is_an_error(tmp_path):
    from opforge.gen import generate_aten

    with pytest.raises(_aten.GenError) as info:
        generate_aten(["not_an_op"], "myaten", str(tmp_path), build_library=False, tests=False)
    assert str(info.value).startswith(
        "no allowlisted name can be generated (not_an_op: torch ")
    assert os.listdir(tmp_path) == []


def test_allowlist_entries_may_name_op_tags_in_brackets():
    lines = ["nonzero [cudagraph_unsafe]  # syncs", "abs", "bernoulli [nondeterministic_seeded, pt2_compliant_tag]"]
    assert _aten.parse_allowlist(lines) == ["nonzero", "abs", "bernoulli"]
    assert _aten.allowlist_tags(lines) == {"nonzero": ("cudagraph_unsafe",),
                                           "bernoulli": ("nondeterministic_seeded", "pt2_compliant_tag")}
    sel = _aten.select(["nonzero", "abs"], "myaten", tags=_aten.allowlist_tags(lines))
    assert {op.name: op.tags for op in sel.ops} == {"nonzero": ("cudagraph_unsafe",), "abs": ()}


def test_the_table_row_of_a_tagged_op_carries_its_tags_and_an_untagged_row_is_unchanged():
    sel = _aten.select(["nonzero", "abs"], "myaten", tags={"nonzero": ("cudagraph_unsafe",)})
    text = _cpp.table_source(sel)
    assert '"aten::nonzero.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)", "cudagraph_unsafe"},' in text
    assert '"aten::abs.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)"},' in text


@pytest.mark.parametrize("line, message", [
    ("nonzero [cuda_graph_unsafe]", "list.txt:1: 'cuda_graph_unsafe' is not an op tag a generated op can carry; "
                                    "use one of: cudagraph_unsafe, "),
    ("nonzero [cudagraph_unsafe", "list.txt:1: 'nonzero [cudagraph_unsafe': write the tags after the name in one "
                                  "pair of brackets"),
    ("nonzero ] [cudagraph_unsafe]", "list.txt:1: .* one pair of brackets"),
])
def test_a_bad_tag_entry_is_an_error_naming_the_line_and_the_fix(line, message):
    with pytest.raises(_aten.GenError, match=message.replace("[", r"\[")):
        _aten.parse_allowlist([line], origin="list.txt")


def test_tags_given_to_generate_aten_must_name_allowlisted_bases_and_known_tags(tmp_path):
    from opforge.gen import _generate

    with pytest.raises(_aten.GenError, match="tags names 'neg', which is not in the allowlist"):
        _generate.generate_aten(["abs"], "myaten", str(tmp_path), tags={"neg": ["cudagraph_unsafe"]},
                                build_library=False, tests=False)
    with pytest.raises(_aten.GenError, match=r"tags\['abs'\]: 'unsafe' is not an op tag"):
        _generate.generate_aten(["abs"], "myaten", str(tmp_path), tags={"abs": "unsafe"},
                                build_library=False, tests=False)
    assert os.listdir(tmp_path) == []

