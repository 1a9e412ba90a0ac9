"""The package list, computed from the source tree (the metadata is in pyproject.toml).

The source folders ``opprof/``, ``collectors/`` and ``normalizers/`` install as ``opprof``,
``opprof.collectors`` and ``opprof.normalizers``. Every folder under them is a package (with or
without an ``__init__.py``), and every file in them that is not Python source is package data
(``normalizers/maps/*.csv`` …), so a new module, folder or data file is never left out of the
wheel (``tests/test_packaging.py`` builds one and checks)."""

from __future__ import annotations

from pathlib import Path

from setuptools import find_namespace_packages, setup

HERE = Path(__file__).resolve().parent
#: Installed package → its source folder.
ROOTS = {"opprof": "opprof", "opprof.collectors": "collectors",
         "opprof.normalizers": "normalizers"}
#: Folders that are no package (find_namespace_packages already skips names with a dot).
SKIP = ["__pycache__", "*.__pycache__", "__pycache__.*", "*.__pycache__.*"]
CODE = {".py", ".pyc", ".pyo"}


def packages() -> list[str]:
    """Every installed package name: the roots and every folder below them."""
    out = []
    for name, folder in ROOTS.items():
        out.append(name)
        subs = find_namespace_packages(str(HERE / folder), exclude=SKIP)
        out += [f"{name}.{sub}" for sub in subs]
    return sorted(out)


def package_data() -> dict[str, list[str]]:
    """Per package, the files of its folder that are not Python source."""
    data: dict[str, list[str]] = {}
    for name in packages():
        root = next(r for r in sorted(ROOTS, key=len, reverse=True)
                    if name == r or name.startswith(r + "."))
        folder = HERE / ROOTS[root] / Path(*name[len(root):].split(".")[1:])
        files = sorted(p.name for p in folder.iterdir() if p.is_file()
                       and p.suffix not in CODE and not p.name.startswith("."))
        if files:
            data[name] = files
    return data


setup(packages=packages(), package_dir=ROOTS, package_data=package_data())
