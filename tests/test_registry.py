"""One registry type for every family of named things (issue 44): a refusal naming the valid
names, entries registered where they are defined, each family complete."""

import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from offloadlab.core.backends import backend_names
from offloadlab.core.dispatch import POLICIES, PolicyError
from offloadlab.core.errors import SpecError
from offloadlab.core.machine import PRESETS
from offloadlab.core.ops import GENERIC, OPS, OpError
from offloadlab.core.registry import Entry, Registry, summary
from offloadlab.core.workloads import WORKLOADS
from offloadlab.executor import BACKENDS, kernels, make_backend
from offloadlab.planner import PLANNERS, get_planner

REPO = Path(__file__).resolve().parents[1]


def test_an_unknown_name_is_refused_in_one_line_listing_the_valid_ones():
    colours: Registry[int] = Registry("colour", listed="valid colours")
    colours["red"], colours["blue"] = 1, 2
    with pytest.raises(SpecError) as err:
        colours["green"]
    assert str(err.value) == "unknown colour 'green'; valid colours: red, blue"
    assert colours.get("green") is None and "green" not in colours
    sorted_colours: Registry[int] = Registry("colour", error=ValueError, sort=True)
    sorted_colours.update({"red": 1, "blue": 2})
    with pytest.raises(ValueError, match="^unknown colour 'green'; known: blue, red$"):
        sorted_colours.check("green")
    with pytest.raises(ValueError, match=r"unknown colour \['red'\]"):
        sorted_colours.check(["red"])                    # not a name, and not a crash


def test_entries_describe_each_name_with_its_options():
    def paint(colour: str = "red", coats: int = 2) -> None:
        """Paint ``it``.

        Not shown."""
    tools: Registry = Registry("tool", options=lambda fn: {"coats": 2})
    tools.register("paint")(paint)
    assert tools.entries() == [Entry("paint", "Paint it", {"coats": 2})]
    assert summary("Two\n   lines;\n\nmore") == "Two lines"


def test_a_registry_within_another_takes_only_its_names():
    ops: Registry[int] = Registry("op", error=OpError, listed="known ops")
    ops["add"] = 1
    kernels_of: Registry[str] = Registry("kernel", within=ops)
    kernels_of["add"] = "np.add"
    with pytest.raises(OpError, match="unknown op 'conv'; known ops: add"):
        kernels_of["conv"] = "?"
    assert "conv" not in kernels_of


@pytest.mark.parametrize("lookup, message", [
    (lambda: get_planner("magic"), "unknown planner 'magic'; known: buildmemgraph, cotrain"),
    (lambda: WORKLOADS["resnet"], "unknown workload 'resnet'; known: matmul-chain, tp-matmul"),
    (lambda: PRESETS["nope"], "unknown machine preset 'nope'; known: disco-example, v100"),
    (lambda: make_backend("tpu", PRESETS["v100"]), "unknown backend 'tpu'; valid backends: "
                                                   "numpy, cupy"),
    (lambda: POLICIES["eager"], "unknown policy 'eager'; valid policies: dynamic, fixed"),
    (lambda: OPS["conv9"], "unknown op 'conv9'; known ops: matmul, linear"),
])
def test_every_family_refuses_an_unknown_name_listing_the_valid_ones(lookup, message):
    with pytest.raises((SpecError, OpError)) as err:
        lookup()
    head, _, names = message.rpartition(": ")     # the refusal, then some of the valid names
    assert str(err.value).startswith(head + ": ")
    listed = str(err.value)[len(head) + 2:].split(", ")
    assert set(names.split(", ")) <= set(listed)
    assert "\n" not in str(err.value)
    assert isinstance(err.value, PolicyError if "policy" in message else type(err.value))


def test_every_op_but_generic_has_a_kernel_and_every_kernel_an_op():
    """Found here, not by an assertion when the executor is imported."""
    assert set(OPS) - {GENERIC} - set(kernels.KERNELS) == set()
    assert set(kernels.KERNELS) <= set(OPS)
    with pytest.raises(OpError, match="unknown op 'conv9'"):
        kernels.KERNELS["conv9"] = kernels.KERNELS["add"]


def test_each_backend_module_declares_its_backend_numpy_first():
    """``executor/NAME_backend.py`` declares backend NAME, which the command line offers from
    the module's name alone."""
    assert backend_names()[0] == "numpy" and "cupy" in backend_names()
    assert tuple(BACKENDS) == backend_names()


def test_ops_and_backend_names_are_known_without_numpy_or_the_executor():
    code = ("import sys\n"
            "from offloadlab.core.ops import KERNELS, OPS\n"
            "from offloadlab.core.backends import backend_names\n"
            "assert len(KERNELS) == len(OPS) - 1 and backend_names()[0] == 'numpy'\n"
            "print([m for m in ('numpy', 'offloadlab.executor') if m in sys.modules])\n")
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("package", ["offloadlab.planner", "offloadlab.core.workloads",
                                     "offloadlab.core.ops"])
def test_each_module_of_a_registering_package_is_imported(package):
    """A new planner or workload is a new module: importing the package imports it, so that it
    registers itself; nothing lists it."""
    pkg = importlib.import_module(package)
    for module in pkgutil.iter_modules(pkg.__path__):
        assert f"{package}.{module.name}" in sys.modules, module.name


def test_each_entry_has_a_one_line_description():
    for registry in (PLANNERS, WORKLOADS, PRESETS, BACKENDS, POLICIES, OPS):
        for entry in registry.entries():
            assert entry.doc and "\n" not in entry.doc, (registry.kind, entry.name)


def test_an_op_declared_folding_takes_inputs_of_any_length():
    """``folds=True`` (calibrate times such an op on flat inputs of other lengths than its
    output's): its kernel folds longer inputs and tiles shorter ones."""
    import numpy as np
    folding = [name for name, spec in OPS.items() if spec.folds]
    assert {"add", "mix"} <= set(folding)
    out = np.empty(8, np.float32)
    args = [np.ones(20, np.float32), np.ones(3, np.float32)]
    for name in folding:
        k = kernels.KERNELS[name]
        k.fn(np, out, args, np.empty(k.scratch(out, args), np.uint8))
        assert np.isfinite(out).all(), name
    with pytest.raises(kernels.KernelError):
        kernels.KERNELS["mul"].fn(np, out, args, np.empty(0, np.uint8))
