"""Exports a model that calls the example kernel library's rms_norm and
packages it with AOTInductor for a C++ program (run_model.cc, docs/deploy.md).

    python export_model.py path/to/libopforge_kernels.so model.pt2
"""

import sys

import torch

import opforge


class Model(torch.nn.Module):
    def forward(self, x, w):
        out = torch.empty_like(x)
        opforge.ops.kernels.rms_norm(out, x, w, opforge.structs.kernels.NormCfg(eps=1e-5, gemma=True))
        return out * 2


def main(library: str, package: str) -> None:
    opforge.load_library(library)
    x = torch.sin(torch.arange(4 * 64, dtype=torch.float32)).reshape(4, 64)
    w = torch.cos(torch.arange(64, dtype=torch.float32))
    ep = torch.export.export(Model(), (x, w))
    print(opforge.deploy.requirements(ep))
    path = opforge.deploy.aoti_compile_and_package(ep, package_path=package, python_free=True)
    # The same package from Python, in this process.
    print("python", torch.equal(torch._inductor.aoti_load_package(path)(x, w), Model()(x, w)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
