"""tests/python/child_batch.py, the runner the process-per-case tests share:
a case that kills its child is reported dead and the cases after it still
run; one that raises is reported with its traceback; each case starts from
the prologue's state."""

import signal

import pytest
from child_batch import printed, run_batch


def test_a_case_that_kills_the_child_is_named_and_the_rest_run_in_a_new_child():
    results = run_batch("import os\nstarted = os.getpid()\nstate = []", {
        "first": "print(os.getpid() == started); state.append(1); print(len(state))",
        "dies": "os.abort()",
        "after": "print(os.getpid() == started, state)",
        "raises": "raise ValueError('mine')",
        "last": "print('last', state)",
    }, between="state = []")
    assert printed(results["first"]) == "True\n1\n"
    assert results["dies"]["died"] == -signal.SIGABRT
    assert printed(results["after"]) == "True []\n"  # a new child ran its own prologue
    assert "ValueError: mine" in results["raises"]["raised"]
    assert printed(results["last"]) == "last []\n"
    with pytest.raises(AssertionError, match=r"dies: the process died \(-6\)"):
        printed(results["dies"], "dies")
    with pytest.raises(AssertionError, match=r"(?s)raises: the case raised:\n.*ValueError: mine"):
        printed(results["raises"], "raises")


def test_a_prologue_that_fails_is_an_error_with_its_output():
    with pytest.raises(AssertionError, match=r"(?s)the child did not start \(1\).*NameError"):
        run_batch("print('before')\nundefined_name", {"a": "print(1)"})
