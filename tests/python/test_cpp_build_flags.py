"""What opforge_add_library compiles a library with, read from the compile
commands CMake writes when it configures (nothing is built): Release's flags
when nothing chose an optimisation level, the build type or flags given
otherwise, and opforge's headers as a system include in both ABI modes."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import opforge
from cpp_ext import BUILD, ROOT
from kernel_library import STABLE_BUILDS

TARGETS = ["opforge_test_vllm_unstable"] + (["opforge_test_vllm_stable"] if STABLE_BUILDS else [])
SAID = "opforge: no CMAKE_BUILD_TYPE given, so opforge_add_library compiles with Release's flags"


def configure(name: str, *args: str, generator: str = "Ninja") -> tuple[str, dict[str, list[list[str]]]]:
    """Configures tests/cpp_ext/vllm_style afresh; returns what CMake printed
    and each target's compile commands, as argument lists."""
    out = os.path.join(BUILD, "build_flags", name)
    shutil.rmtree(out, ignore_errors=True)
    result = subprocess.run(
        ["cmake", "-S", os.path.join(ROOT, "tests", "cpp_ext", "vllm_style"), "-B", out, "-G", generator,
         f"-DCMAKE_PREFIX_PATH={opforge.cmake_prefix_path}", f"-DPython_EXECUTABLE={sys.executable}",
         "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON", f"-DVLLM_STYLE_STABLE={'ON' if STABLE_BUILDS else 'OFF'}", *args],
        capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    with open(os.path.join(out, "compile_commands.json"), encoding="utf-8") as f:
        entries = json.load(f)
    commands: dict[str, list[list[str]]] = {}
    for entry in entries:
        target = re.search(r"CMakeFiles/(\w+)\.dir/", entry["command"]).group(1)
        commands.setdefault(target, []).append(entry["command"].split())
    assert sorted(commands) == sorted(TARGETS), commands
    return result.stdout, commands


def optimisation(command: list[str]) -> list[str]:
    return [flag for flag in command if flag.startswith("-O")]


@pytest.fixture(scope="module")
def unset():
    return configure("unset")


def test_with_no_build_type_a_library_compiles_with_releases_flags_and_says_so_once(unset):
    printed, commands = unset
    for target in TARGETS:
        [command] = commands[target]
        assert optimisation(command) == ["-O3"], (target, command)
        assert "-DNDEBUG" in command, (target, command)
    assert printed.count(SAID) == 1, printed


def test_a_build_type_given_is_kept():
    printed, commands = configure("debug", "-DCMAKE_BUILD_TYPE=Debug")
    for target in TARGETS:
        [command] = commands[target]
        assert optimisation(command) == [], (target, command)
        assert "-g" in command and "-DNDEBUG" not in command, (target, command)
    assert SAID not in printed
    _, commands = configure("relwithdebinfo", "-DCMAKE_BUILD_TYPE=RelWithDebInfo")
    for target in TARGETS:
        [command] = commands[target]
        assert optimisation(command) == ["-O2"], (target, command)


def test_an_optimisation_level_in_cmake_cxx_flags_is_kept():
    printed, commands = configure("cxx_flags", "-DCMAKE_CXX_FLAGS=-O1")
    for target in TARGETS:
        [command] = commands[target]
        assert optimisation(command) == ["-O1"], (target, command)
    assert SAID not in printed


def test_a_multi_config_generator_keeps_each_configurations_flags():
    printed, commands = configure("multi", generator="Ninja Multi-Config")
    expected = {"Debug": [], "Release": ["-O3"], "RelWithDebInfo": ["-O2"]}
    for target in TARGETS:
        by_config = {re.search(r'CMAKE_INTDIR=\\"(\w+)\\"', " ".join(command)).group(1): command
                     for command in commands[target]}
        assert {config: optimisation(command) for config, command in by_config.items()} == expected, target
    assert SAID not in printed


@pytest.mark.parametrize("target", TARGETS)
def test_opforges_headers_are_a_system_include_in_both_modes(unset, target):
    [command] = unset[1][target]
    include = os.path.join(opforge.cmake_prefix_path, "include")
    pairs = list(zip(command, command[1:]))
    assert ("-isystem", include) in pairs, command
    assert f"-I{include}" not in command and ("-I", include) not in pairs, command
