"""Wheel build hook: compile the planner core with mypyc where this machine can, else ship it
as pure Python (docs/install.md, The compiled build).

A wheel (``pip install .``) gets the modules listed under ``include`` in ``pyproject.toml``
compiled when a C compiler and the Python headers are present; if they are not, if
``OFFLOADLAB_PURE=1`` is set, or if the compile fails for any reason, the wheel is the pure
Python one and the build log (``pip install -v``) says why in one line.  Editable installs
stay pure Python: compiled modules beside the sources would shadow every edit.

Everything is compiled in a temporary copy of the package, so that no ``*.so`` file, mypy
cache or ``build/`` directory is ever left in the source tree.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PURE_ENV = "OFFLOADLAB_PURE"
BUILD_REQUIRES = ["mypy>=1.10", "setuptools>=61"]
GROUP = "offloadlab"     # the shared library of the compiled modules: offloadlab__mypyc.*.so
# One library for every module (calls between them stay native), its C split into a file per
# module (``multi_file``), and the files compiled on every core: setuptools compiles an
# extension's files one by one, and one 7 MB file took a minute of one core.
SETUP = """\
import os
from concurrent.futures import ThreadPoolExecutor

from mypyc.build import mypycify
from setuptools import setup
from setuptools.command.build_ext import build_ext


class ParallelBuildExt(build_ext):
    def build_extension(self, ext):
        one_by_one = self.compiler.compile

        def compile_all(sources, *args, **kwargs):
            with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                parts = pool.map(lambda source: one_by_one([source], *args, **kwargs), sources)
                return [obj for objs in parts for obj in objs]

        self.compiler.compile = compile_all
        try:
            super().build_extension(ext)
        finally:
            self.compiler.compile = one_by_one


setup(name="offloadlab-mypyc", cmdclass={{"build_ext": ParallelBuildExt}},
      ext_modules=mypycify({args!r}, group_name={group!r}, multi_file=True))
"""


def _pure_forced() -> bool:
    return os.environ.get(PURE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _cannot_compile() -> str | None:
    """Why this interpreter cannot build C extensions, or None if it looks like it can."""
    if _pure_forced():
        return f"{PURE_ENV} is set"
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()
    if sys.platform != "win32" and (not cc or shutil.which(cc[0]) is None):
        return f"no C compiler ({' '.join(cc) or 'CC unset'} not found)"
    headers = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    if not os.path.isfile(headers):
        return f"no Python headers ({headers} not found)"
    return None


class MypycIfPossible(BuildHookInterface):
    """Compile with mypyc into a temporary directory and add the extension modules to the
    wheel; on any failure leave the wheel pure Python."""

    def dependencies(self) -> list[str]:
        return [] if _cannot_compile() else list(BUILD_REQUIRES)

    def _say(self, message: str) -> None:
        print(f"offloadlab build: {message}", file=sys.stderr, flush=True)

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        self._tmp: str | None = None
        if self.target_name != "wheel":
            return
        if version == "editable":
            self._say("editable install: planner core left as pure Python")
            return
        reason = _cannot_compile()
        if reason:
            self._say(f"planner core left as pure Python ({reason})")
            return
        try:
            compiled = self._compile()
        except Exception as e:     # any failure at all: ship the pure-Python wheel
            self._cleanup()
            lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [repr(e)]
            detail = next((line for line in lines if "error:" in line.lower()), lines[-1])
            self._say(f"planner core left as pure Python (mypyc compile failed: {detail[:300]})")
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        build_data["force_include"].update(compiled)
        self._say(f"planner core compiled with mypyc ({', '.join(self._modules())})")

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        self._cleanup()

    def _modules(self) -> list[str]:
        modules = self.config.get("include", [])
        if not modules or not all(isinstance(m, str) and m.endswith(".py") for m in modules):
            raise ValueError("build hook 'custom': 'include' must list .py files")
        return modules

    def _compile(self) -> dict[str, str]:
        """Run mypyc on a copy of the package; return {built file: path in the wheel}."""
        import importlib.util
        if importlib.util.find_spec("mypyc") is None:
            raise RuntimeError("mypy is not installed in the build environment")
        modules = self._modules()
        packages = sorted({m.split("/", 1)[0] for m in modules})
        self._tmp = tempfile.mkdtemp(prefix="offloadlab-mypyc-")
        src = os.path.join(self._tmp, "src")
        for package in packages:
            shutil.copytree(os.path.join(self.root, package), os.path.join(src, package),
                            ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd",
                                                          "*.pyc", "*.c", "build"))
        args = [*self.config.get("mypy-args", []), *modules]
        with open(os.path.join(src, "setup_mypyc.py"), "w", encoding="utf-8") as f:
            f.write(SETUP.format(args=args, group=GROUP))
        with open(os.path.join(src, "mypy.ini"), "w", encoding="utf-8") as f:
            f.write("[mypy]\n")      # found first: no user or parent-directory mypy config
        env = {k: v for k, v in os.environ.items() if k not in ("MYPY_CACHE_DIR", "MYPYPATH")}
        proc = subprocess.run([sys.executable, "setup_mypyc.py", "build_ext", "--inplace"],
                              cwd=src, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        if proc.returncode:
            raise RuntimeError(proc.stdout.strip() or f"exit status {proc.returncode}")
        ext = ".pyd" if sys.platform == "win32" else ".so"
        built: dict[str, str] = {}
        for module in modules:
            found = glob.glob(os.path.join(src, module[:-3] + ".*" + ext))
            if len(found) != 1:
                raise RuntimeError(f"expected one compiled file for {module}, found {found}")
            built[found[0]] = os.path.relpath(found[0], src).replace(os.sep, "/")
        libs = glob.glob(os.path.join(src, f"{GROUP}__mypyc.*{ext}"))
        if len(modules) > 1 and len(libs) != 1:     # the modules' shared library
            raise RuntimeError(f"expected one {GROUP}__mypyc.*{ext}, found {libs}")
        built.update((lib, os.path.basename(lib)) for lib in libs)
        return built

    def _cleanup(self) -> None:
        tmp, self._tmp = getattr(self, "_tmp", None), None
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
