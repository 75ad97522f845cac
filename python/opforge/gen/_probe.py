"""Finds test cases for generated ops in worker processes.

Finding inputs means calling ATen with candidates it may reject, and a few
internal ATen ops corrupt memory instead of raising. Workers therefore run
apart from the generator: a worker that dies costs one op, which gets a
skipped case naming the crash, and a new worker takes the rest.

    >>> probe(selection, jobs=2)["abs"]
    {'cases': ["Case('abs', 'aten::abs.out', 'aten::abs', 'out', {'self': T((4, 4), seed=1)}, ...)", ...],
     'skips': []}

Each case comes back as Python source, the form the generated test module
holds it in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from ._aten import GenError
from ._io import Progress


def case_source(case) -> str:
    """Case(...) -> its constructor call as text."""
    parts = [repr(case.op), repr(case.target), repr(case.reference), repr(case.kind), _source(case.args)]
    if case.outs:
        parts.append(f"outs={tuple(case.outs)!r}")
    if case.ref_kwargs:
        parts.append(f"ref_kwargs={_source(case.ref_kwargs)}")
    if case.out_dtypes:
        parts.append(f"out_dtypes={case.out_dtypes!r}")
    if case.check != "close":
        parts.append(f"check={case.check!r}")
    if case.label:
        parts.append(f"label={case.label!r}")
    if case.skip:
        parts.append(f"skip={case.skip!r}")
    return f"Case({', '.join(parts)})"


def _source(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_source(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_source(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(_source(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def _worker(namespace: str, source: str, bases: list[str]) -> int:
    """Reads op names on stdin, writes one JSON line of cases per op."""
    import warnings

    from . import _aten, _samples
    from .casekit import Case

    warnings.filterwarnings("ignore")
    ops = {op.name: op for op in _aten.select(bases, namespace, source).ops}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        name = line.strip()
        if not name:
            continue
        op = ops[name]
        try:
            cases = _samples.find_cases(op)
        except Exception as e:  # a bug in a hint must not cost the other ops
            cases = [Case(op.name, op.target_qualified, op.reference, op.kind, {}, outs=tuple(op.out_arguments),
                          skip=f"opforge could not build inputs for {op.target_qualified}: "
                               f"{type(e).__name__}: {e}")]
        print(json.dumps({"op": name, "cases": [case_source(c) for c in cases],
                          "skips": [c.skip for c in cases if c.skip]}), flush=True)
    return 0


class _Worker:
    def __init__(self, namespace: str, source: str, bases: list[str]):
        env = dict(os.environ)
        # One thread per worker: the inputs are tiny, and jobs set the parallelism.
        env.setdefault("OMP_NUM_THREADS", "1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "opforge.gen._probe", namespace, source],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        )
        self.proc.stdin.write(json.dumps(bases) + "\n")
        self.proc.stdin.flush()
        ready = self.proc.stdout.readline()
        if not ready:
            raise GenError(f"a worker searching for test inputs failed to start ({sys.executable} -m "
                           "opforge.gen._probe); rerun with --no-tests to skip the generated tests.")
        self.current: str | None = None
        self.started = 0.0

    def send(self, name: str) -> None:
        self.current = name
        self.started = time.monotonic()
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()

    def receive(self) -> dict | None:
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()


def probe(selection, jobs: int = 2, progress: Progress | None = None,
          timeout: float = 120.0) -> dict[str, dict]:
    """{op name: {"cases": [case source, ...], "skips": [reason, ...]}} for
    every op of `selection`."""
    import selectors

    progress = progress or Progress(quiet=True)
    bases = selection.generated_bases
    names = [op.name for op in selection.ops]
    targets = {op.name: op.target_qualified for op in selection.ops}
    pending = list(names)
    results: dict[str, dict] = {}
    workers: list[_Worker] = []
    selector = selectors.DefaultSelector()

    def start():
        worker = _Worker(selection.namespace, selection.source, bases)
        workers.append(worker)
        selector.register(worker.proc.stdout, selectors.EVENT_READ, worker)
        return worker

    def feed(worker):
        if pending:
            worker.send(pending.pop(0))
        else:
            worker.current = None

    for _ in range(max(1, min(jobs, len(names)))):
        feed(start())
    done = 0
    while any(w.current for w in workers):
        ready = [key.data for key, _ in selector.select(timeout=5.0)]
        now = time.monotonic()
        for worker in workers:
            if worker.current and worker not in ready and now - worker.started > timeout:
                worker.proc.kill()
                ready.append(worker)
        for worker in ready:
            if worker.current is None:
                continue
            message = worker.receive()
            name = worker.current
            if message is None:
                # The worker died inside ATen; the op gets a case that says so.
                code = worker.proc.wait()
                from .casekit import Case

                op = next(op for op in selection.ops if op.name == name)
                how = (f"took over {timeout:.0f} s" if code == -9 else f"crashed the process (exit code {code})")
                skip = f"{targets[name]} {how} on a generated input; it is not exercised"
                results[name] = {"cases": [case_source(Case(op.name, op.target_qualified, op.reference,
                                                            op.kind, {}, outs=tuple(op.out_arguments),
                                                            skip=skip))],
                                 "skips": [skip]}
                selector.unregister(worker.proc.stdout)
                workers.remove(worker)
                worker = start()
            else:
                results[name] = {"cases": message["cases"], "skips": message["skips"]}
            done += 1
            progress.step(done, len(names), f"test inputs for {selection.namespace}::{name}")
            feed(worker)
    for worker in workers:
        worker.close()
    return {name: results[name] for name in names}


if __name__ == "__main__":
    _bases = json.loads(sys.stdin.readline())
    sys.exit(_worker(sys.argv[1], sys.argv[2], _bases))
