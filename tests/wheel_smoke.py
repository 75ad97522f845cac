"""`make wheel-smoke`: the wheel `pip wheel --no-build-isolation --no-deps .`
built installs and works in a fresh virtualenv with the same torch.

    $ python tests/wheel_smoke.py build/wheel
    wheel      opforge-0.1.0-cp311-cp311-linux_x86_64.whl
    ...
    wheel smoke: 8 passed, 0 failed

The fresh venv sees this Python's torch through a .pth file (no download, so
it works offline and never pulls another torch), installs the wheel with
--no-deps --no-index, then, from the installed package: imports opforge,
runs an op eagerly and compiled, prints the version both ways, fails with
the rebuild sentence under a faked torch version, builds a C++ kernel library with find_package(opforge) against the installed package,
and checks that every shared library in the wheel finds torch's libraries
through $ORIGIN rather than this machine's paths.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import textwrap
import venv
import zipfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH_SITE = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))

OP_SCRIPT = textwrap.dedent("""
    import sys
    from dataclasses import dataclass
    import torch, opforge
    from opforge import _build_info

    @dataclass(frozen=True)
    class Cfg:
        scale: float
        shift: float = 0.0

    @opforge.op("wheel_smoke::affine", fake=lambda x, cfg: torch.empty_like(x))
    def affine(x: torch.Tensor, cfg: Cfg) -> torch.Tensor:
        return x * cfg.scale + cfg.shift

    x = torch.arange(3.0)
    eager = affine(x, Cfg(2.0, 1.0))
    compiled = torch.compile(lambda x: affine(x, Cfg(2.0, 1.0)), fullgraph=True, backend="eager")(x)
    assert eager.tolist() == compiled.tolist() == [1.0, 3.0, 5.0], (eager, compiled)
    assert affine.schema == "wheel_smoke::affine(Tensor x, float cfg__scale, float cfg__shift=0.) -> Tensor"
    print(opforge.__file__)
    print(_build_info.INSTALL_KIND, _build_info.TORCH_VERSION, repr(_build_info.SOURCE_DIR))
    print(opforge.cmake_prefix_path)
""")

CPP_SCRIPT = textwrap.dedent("""
    import sys
    import torch, opforge
    torch.ops.load_library(sys.argv[1])
    structs = opforge.structs.opforge_ext
    out = opforge.ops.opforge_ext.scale(torch.ones(2), structs.Cfg(3.0, structs.Mode.kMul, None))
    print(out.tolist())
""")


class Smoke:
    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.passed += ok
        self.failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f"\n     {detail}" if detail and not ok else ""))


def run(cmd: list[str], cwd: str, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, **kw)


def main(out_dir: str) -> int:
    out_dir = os.path.abspath(out_dir)
    wheels = glob.glob(os.path.join(out_dir, "dist", "opforge-*.whl"))
    if len(wheels) != 1:
        print(f"wheel smoke: expected one opforge wheel in {out_dir}/dist, found {wheels}")
        return 1
    wheel = wheels[0]
    print(f"wheel      {os.path.basename(wheel)}")
    print(f"torch      {torch.__version__} (shared with the fresh venv through a .pth file)")
    smoke = Smoke()

    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        libs = {n: z.read(n) for n in names if n.endswith(".so")}
    expected = {"opforge/__init__.py", "opforge/__main__.py", "opforge/_build_info.py",
                "opforge/lib/libopforge_core.so", "opforge/lib/libopforge_torch.so",
                "opforge/include/opforge/opforge.h", "opforge/share/cmake/opforge/opforgeConfig.cmake"}
    missing = expected - set(names)
    smoke.check("the wheel holds the package, _C, the libraries, headers and CMake package",
                not missing and any(n.startswith("opforge/_C.") for n in names), f"missing {sorted(missing)}")
    search_paths = {n: runpath(data) for n, data in libs.items()}
    absolute = {n: p for n, p in search_paths.items() if not p or any(not d.startswith("$ORIGIN") for d in p)}
    smoke.check("every library finds torch's and opforge's through $ORIGIN, not this machine's paths",
                len(libs) == 3 and not absolute, str(search_paths))

    env_dir = os.path.join(out_dir, "venv")
    venv.EnvBuilder(clear=True, with_pip=True).create(env_dir)
    py = os.path.join(env_dir, "bin", "python")
    site = run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], out_dir).stdout.strip()
    with open(os.path.join(site, "same_torch.pth"), "w") as f:
        f.write(TORCH_SITE + "\n")
    install = run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], out_dir)
    smoke.check("pip installs the wheel into a fresh venv", install.returncode == 0, install.stderr[-2000:])

    op = run([py, "-c", OP_SCRIPT], out_dir)
    lines = op.stdout.splitlines()
    ok = op.returncode == 0 and len(lines) == 3 and lines[0].startswith(site + os.sep)
    smoke.check("an op runs eagerly and compiled, from the installed package", ok, op.stdout + op.stderr[-3000:])
    smoke.check("the package records a wheel install for this torch",
                ok and lines[1] == f"wheel {torch.__version__} ''", "\n".join(lines[1:2]))

    want = f"opforge {read_version()} (built against torch {torch.__version__})\n"
    by_module = run([py, "-m", "opforge", "--version"], out_dir)
    by_script = run([os.path.join(env_dir, "bin", "opforge"), "--version"], out_dir)
    smoke.check("python -m opforge --version and opforge --version print the build",
                by_module.stdout == want == by_script.stdout,
                f"want {want!r}, got {by_module.stdout!r} / {by_script.stdout!r} {by_module.stderr[-500:]}")

    fake = "9.99.0"
    mismatch = run([py, "-c", f"import torch; torch.__version__ = {fake!r}; import opforge"], out_dir)
    want_error = (f"ImportError: opforge was built against torch {torch.__version__} but torch {fake} is installed; "
                  "rebuild it for this torch with `pip install --no-build-isolation --no-deps --force-reinstall .` "
                  "in the opforge source tree.")
    last = (mismatch.stderr.strip().splitlines() or [""])[-1]
    smoke.check("under another torch the installed wheel fails with the rebuild sentence for a wheel",
                mismatch.returncode == 1 and last == want_error, f"want {want_error!r}, got {last!r}")

    ext_build = os.path.join(out_dir, "cpp_ext")
    configure = run(["cmake", "-S", os.path.join(ROOT, "tests", "cpp_ext"), "-B", ext_build, "-G", "Ninja",
                     f"-DCMAKE_PREFIX_PATH={lines[2] if ok else ''}", f"-DPython_EXECUTABLE={py}"], out_dir)
    build = run(["cmake", "--build", ext_build], out_dir) if configure.returncode == 0 else configure
    cpp = run([py, "-c", CPP_SCRIPT, os.path.join(ext_build, "libopforge_test_ext.so")], out_dir) \
        if build.returncode == 0 else build
    smoke.check("a C++ kernel library builds with find_package(opforge) against the wheel and runs",
                cpp.returncode == 0 and cpp.stdout.strip() == "[3.0, 3.0]", (cpp.stdout + cpp.stderr)[-3000:])

    kernel_library(smoke, py, site, out_dir)

    print(f"wheel smoke: {smoke.passed} passed, {smoke.failed} failed")
    return 1 if smoke.failed else 0


KERNELS_SCRIPT = textwrap.dedent("""
    import torch, opforge_kernels
    x, w = torch.ones(2, 4), torch.full((4,), 2.0)
    out = torch.empty_like(x)
    opforge_kernels.ops.rms_norm(out, x, w, opforge_kernels.NormCfg(eps=0.0))
    print(opforge_kernels.__file__)
    print(out.tolist())
""")


def kernel_library(smoke: Smoke, py: str, site: str, out_dir: str) -> None:
    """examples/kernel_library's wheel, built against the installed opforge
    wheel, installs beside it and works; an opforge other than the one it
    was built against is one sentence."""
    tools = run([py, "-m", "pip", "install", "-q", "scikit-build-core>=0.10", "ninja", "cmake"], out_dir)
    dist = os.path.join(out_dir, "kernels_dist")
    built = run([py, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", dist,
                 os.path.join(ROOT, "examples", "kernel_library")], out_dir) if tools.returncode == 0 else tools
    wheels = glob.glob(os.path.join(dist, "opforge_example_kernels-*.whl"))
    smoke.check("the example kernel library's wheel builds against the installed opforge",
                built.returncode == 0 and len(wheels) == 1, (built.stdout + built.stderr)[-3000:])
    if not wheels:
        return
    install = run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheels[0]], out_dir)
    use = run([py, "-c", KERNELS_SCRIPT], out_dir) if install.returncode == 0 else install
    lines = use.stdout.splitlines()
    smoke.check("it installs beside opforge and torch, imports and runs its ops",
                use.returncode == 0 and lines[0].startswith(site + os.sep) and lines[1] == str([[2.0] * 4] * 2),
                (use.stdout + use.stderr)[-3000:])
    info = os.path.join(site, "opforge_kernels", "_build_info.py")
    with open(info, encoding="utf-8") as f:
        original = f.read()
    try:
        with open(info, "w", encoding="utf-8") as f:
            f.write(original.replace(f'OPFORGE_VERSION = "{read_version()}"', 'OPFORGE_VERSION = "9.9.0"'))
        other = run([py, "-c", "import opforge_kernels"], out_dir)
    finally:
        with open(info, "w", encoding="utf-8") as f:
            f.write(original)
    last = (other.stderr.strip().splitlines() or [""])[-1]
    smoke.check("built against another opforge, importing it is a one-sentence error, not an undefined symbol",
                other.returncode == 1 and last.startswith("ImportError: opforge_kernels was built against opforge "
                                                          f"9.9.0 but opforge {read_version()} is installed;")
                and last.count(". ") == 0, last)


def runpath(elf: bytes) -> list[str]:
    """The RUNPATH (or RPATH) entries of a shared library: ['$ORIGIN/lib', '$ORIGIN/../torch/lib']."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".so") as f:
        f.write(elf)
        f.flush()
        dynamic = subprocess.run(["readelf", "-d", f.name], capture_output=True, text=True, check=True).stdout
    for line in dynamic.splitlines():
        if "(RUNPATH)" in line or "(RPATH)" in line:
            return line.split("[", 1)[1].rstrip("]").split(":")
    return []


def read_version() -> str:
    import re

    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        return re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "wheel")))
