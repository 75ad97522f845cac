"""Snippets that each need a process of their own only so that one which
kills its process shows as a dead child, not as a lost test run: run in as
few fresh interpreters as that allows.

    results = run_batch(prologue, {"case id": body, ...}, cwd=HERE, between="opforge.set_fast_path_enabled(True)")
    results["case id"]   # {"out": what the body printed}, or {"died": exit status, "stderr": ...},
                         # or {"raised": the traceback of an exception the body let out}

One child runs `prologue` once (importing torch and loading libraries cost
seconds per process), then each body in order, each in a copy of the
prologue's globals after `between` (which undoes what a body may set for the
process), its prints captured. A body that kills the child is reported
dead, and the bodies after it run in a new child, so every case still runs
and a dying one is named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

CHILD = r"""
import contextlib, io, json, sys, traceback
spec = json.loads(sys.stdin.read())
real = sys.stdout
base = {"__name__": "__main__"}
exec(compile(spec["prologue"], "<prologue>", "exec"), base)
real.write("READY\n")
real.flush()
for case_id, body in spec["cases"]:
    real.write("START " + json.dumps(case_id) + "\n")
    real.flush()
    scope = dict(base)
    result = {"id": case_id}
    captured = io.StringIO()
    try:
        exec(compile(spec["between"], "<between>", "exec"), scope)
        with contextlib.redirect_stdout(captured):
            exec(compile(body, "<" + case_id + ">", "exec"), scope)
    except BaseException:
        result["raised"] = traceback.format_exc()
    result["out"] = captured.getvalue()
    real.write("CASE " + json.dumps(result) + "\n")
    real.flush()
"""


def run_batch(prologue: str, cases: dict[str, str], *, cwd: str | None = None, between: str = "",
              env: dict | None = None, timeout: float = 600) -> dict[str, dict]:
    """Each case's result by id (see the module's docstring)."""
    remaining = [(case_id, textwrap.dedent(body)) for case_id, body in cases.items()]
    spec = {"prologue": textwrap.dedent(prologue), "between": textwrap.dedent(between)}
    results: dict[str, dict] = {}
    while remaining:
        child = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps({**spec, "cases": remaining}),
                               capture_output=True, text=True, cwd=cwd, env=env or dict(os.environ),
                               timeout=timeout)
        lines = child.stdout.splitlines()
        assert "READY" in lines, f"the child did not start ({child.returncode}):\n{child.stdout}\n{child.stderr}"
        for line in lines:
            if line.startswith("CASE "):
                result = json.loads(line[len("CASE "):])
                results[result.pop("id")] = result
        remaining = [case for case in remaining if case[0] not in results]
        if remaining:
            # The first case without a result is the one the child died in.
            assert child.returncode != 0, f"the child stopped early:\n{child.stdout}\n{child.stderr}"
            case_id, _ = remaining.pop(0)
            results[case_id] = {"died": child.returncode, "stderr": child.stderr[-4000:]}
    return results


def printed(result: dict, case_id: str = "") -> str:
    """What a case printed; an AssertionError saying how it ended otherwise."""
    assert "died" not in result, f"{case_id}: the process died ({result['died']}):\n{result['stderr']}"
    assert "raised" not in result, f"{case_id}: the case raised:\n{result['raised']}\nIt printed:\n{result['out']}"
    return result["out"]
