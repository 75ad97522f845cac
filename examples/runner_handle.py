"""A stateful runner passed into an op as a handle.

Kernel libraries keep compiled plans (CuTeDSL/CUTLASS runners, autotuned
configs) in Python objects that cannot be op arguments. The usual workaround
is a global dict of integer IDs that are never checked and may be reused.
With `opforge.Handle[T]` the caller passes the runner itself, the body gets
it back, the dispatcher sees an int, and the fake kernel never touches it.

    python examples/runner_handle.py
"""

import torch

import opforge


class GemmRunner:
    """Stands in for a compiled kernel: the 'plan' is prepared once."""

    def __init__(self, weight: torch.Tensor):
        self.out_features = weight.shape[0]
        self.plan = weight.t().contiguous()  # the expensive, reusable part
        self.calls = 0

    def run(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x @ self.plan


@opforge.op("examples::runner_linear")
def runner_linear(x: torch.Tensor, runner: opforge.Handle[GemmRunner], out_features: int) -> torch.Tensor:
    return runner.run(x)


@runner_linear.register_fake
def _(x, runner, out_features):
    # `runner` is the int handle here: shape inference needs no runner.
    return x.new_empty(x.shape[0], out_features)


def main():
    torch.manual_seed(0)
    weight = torch.randn(8, 4)
    runner = GemmRunner(weight)
    x = torch.randn(3, 4)

    eager = runner_linear(x, runner, 8)
    torch.testing.assert_close(eager, x @ weight.t())
    print("schema:", runner_linear.schema)

    @torch.compile(fullgraph=True)
    def model(x, runner):
        return torch.relu(runner_linear(x, runner, runner.out_features))

    out = model(x, runner)
    torch.testing.assert_close(out, torch.relu(x @ weight.t()))
    print(f"compiled: ok ({runner.calls} runner calls so far)")

    # A second runner is another object: a new handle, never a reused one.
    other = GemmRunner(torch.randn(8, 4))
    assert opforge.handles.register(other) != opforge.handles.register(runner)
    torch.testing.assert_close(model(x, other), torch.relu(x @ other.plan))

    released = opforge.handles.register(other)
    opforge.handles.release(other)
    try:
        torch.ops.examples.runner_linear(x, released, 8)
    except LookupError as e:
        print("released handle:", e)
    print("ok")


if __name__ == "__main__":
    main()
