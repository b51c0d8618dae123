"""The libraries install alone: ``pip install cka-atlas`` (no extras) brings no service stack.

A fresh virtual environment gets the project's wheel through ``pip install --no-index``, so the
check runs offline (``make test`` inside ``unshare -n`` included) and downloads nothing. What pip
may find there is exactly the dependency closure of ``[project] dependencies``, taken from the
environment running the tests: each distribution of the closure is linked into the new
environment's site-packages (symlinks, so torch costs no disk), nothing else is. pip then has to
resolve the wheel's requirements against that closure alone, so a service package that crept
back into ``[project] dependencies`` fails the install, one that the libraries import fails the
notebook script, and ``cka-atlas serve`` must say which extra to install.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from importlib import metadata
from pathlib import Path, PurePosixPath

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from app.cli import SERVICE_MODULES

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "models", "analysis", "app", "migrations")
SERVICE_ONLY = ("fastapi", "sqlalchemy", "celery", "alembic", "uvicorn", "pydantic_settings")


def _wanted(requirement: Requirement, extras: set[str]) -> bool:
    marker = requirement.marker
    return marker is None or any(marker.evaluate({"extra": e}) for e in extras or {""})


def dependency_closure(requirements: list[str]) -> dict[str, metadata.Distribution]:
    """Every installed distribution that ``requirements`` pull in, with their extras' needs."""
    closure: dict[str, metadata.Distribution] = {}
    visited: set[tuple[str, frozenset[str]]] = set()
    pending = [(Requirement(r), set[str]()) for r in requirements]
    while pending:
        requirement, asked = pending.pop()  # asked: the extras of the requiring distribution
        if not _wanted(requirement, asked):
            continue
        name, extras = canonicalize_name(requirement.name), set(requirement.extras)
        dist = metadata.distribution(name)  # PackageNotFoundError: the closure is not installed
        assert requirement.specifier.contains(dist.version, prereleases=True), (
            f"{name} {dist.version} does not satisfy {requirement}"
        )
        closure[name] = dist
        if (name, frozenset(extras)) not in visited:
            visited.add((name, frozenset(extras)))
            pending += [(Requirement(r), extras) for r in dist.requires or ()]
    return closure


def _top_entries(dist: metadata.Distribution) -> set[str]:
    """First path components of a distribution's files inside site-packages."""
    return {
        PurePosixPath(str(f)).parts[0]
        for f in dist.files or ()
        if not str(f).startswith("..") and PurePosixPath(str(f)).parts[0] != "__pycache__"
    }


def link_closure(closure: dict[str, metadata.Distribution], site: Path) -> None:
    """Expose the closure's files in ``site``: a whole top-level entry when every distribution
    that owns it is in the closure, else file by file."""
    owners: dict[str, set[str]] = {}
    for dist in metadata.distributions():
        for entry in _top_entries(dist):
            owners.setdefault(entry, set()).add(canonicalize_name(dist.metadata["Name"]))
    for dist in closure.values():
        base = Path(str(dist.locate_file("")))
        for entry in sorted(_top_entries(dist)):
            target = site / entry
            if owners[entry] <= set(closure):
                if not target.exists():
                    target.symlink_to(base / entry)
                continue
            for f in dist.files or ():
                if PurePosixPath(str(f)).parts[0] == entry and (base / str(f)).is_file():
                    link = site / str(f)
                    link.parent.mkdir(parents=True, exist_ok=True)
                    if not link.exists():
                        link.symlink_to(base / str(f))


NOTEBOOK = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import analysis, models
    from analysis import studies

    digits = analysis.training_data("digits")
    paths = [
        models.train("mlp_digits", digits, seed=s, epochs=1, out_dir="zoo", name=f"mlp{s}")
        for s in (0, 1)
    ]
    nets = {f"s{s}": models.load(p)[0] for s, p in enumerate(paths)}
    atlas = analysis.compare(nets, analysis.load_dataset("digits"), batch_size=150)
    matrix = atlas.matrix("s0", "s1")
    plan = studies.plan("sparsity", seeds=1, quick=True)
    print(json.dumps({
        "shape": list(matrix.shape),
        "layers": len(atlas.layers["s0"]),
        "diagonal": [float(v) for v in np.diag(matrix)],
        "trainings": len(plan.trainings),
        "models_file": models.__file__,
        "service_loaded": sorted(m for m in %r if m in sys.modules),
    }))
    """
)


@pytest.mark.slow
def test_the_library_installs_and_runs_without_the_service_extra(tmp_path: Path) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    closure = dependency_closure(project["dependencies"])
    for module in SERVICE_ONLY:
        assert canonicalize_name(module) not in closure, f"{module} is a library dependency"

    # The wheel, built offline from a copy of the sources (the checkout stays clean).
    src = tmp_path / "src"
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    env = {
        "PATH": f"{tmp_path / 'venv' / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(tmp_path),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
        "PIP_CONFIG_FILE": os.devnull,
        "MPLBACKEND": "Agg",
        "OMP_NUM_THREADS": "1",  # tiny models: threads would only contend with other tests
    }
    pip = [sys.executable, "-m", "pip"]

    def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240, **kw
        )

    built = run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", "dist",
                 str(src)])  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("cka_atlas-*.whl")

    # A fresh environment whose site-packages holds the closure and nothing else.
    made = run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")])
    assert made.returncode == 0, made.stderr
    python = tmp_path / "venv" / "bin" / "python"
    (site,) = (tmp_path / "venv" / "lib").glob("python3*/site-packages")
    link_closure(closure, site)
    installed = run([*pip, "--python", str(python), "install", "--no-index", str(wheel)])
    assert installed.returncode == 0, installed.stdout + installed.stderr

    absent = run([str(python), "-c", "import importlib.util as u, sys; "
                  f"print([m for m in {SERVICE_ONLY!r} if u.find_spec(m)])"])  # fmt: skip
    assert absent.returncode == 0, absent.stderr
    assert absent.stdout.strip() == "[]"

    (tmp_path / "notebook.py").write_text(NOTEBOOK % (SERVICE_ONLY,))
    notebook = run([str(python), "notebook.py"])
    assert notebook.returncode == 0, notebook.stderr
    result = json.loads(notebook.stdout.strip().splitlines()[-1])
    n = result["layers"]
    assert n >= 2 and result["shape"] == [n, n]
    # two seeds of one architecture: CKA of each layer with its twin is defined, in (0, 1]
    assert all(0.0 < v <= 1.0 + 1e-9 for v in result["diagonal"])
    assert result["trainings"] >= 2 and result["service_loaded"] == []
    assert Path(result["models_file"]).is_relative_to(tmp_path / "venv")

    serve = run([str(tmp_path / "venv" / "bin" / "cka-atlas"), "serve"])
    assert serve.returncode == 2 and "Traceback" not in serve.stderr
    assert serve.stderr.strip().count("\n") == 0
    assert 'pip install "cka-atlas[service]"' in serve.stderr


def test_the_cli_knows_every_module_of_the_service_extra() -> None:
    """app.cli's SERVICE_MODULES are the import names of pyproject's `service` extra."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {
        canonicalize_name(Requirement(r).name) for r in extra["optional-dependencies"]["service"]
    }
    provided: dict[str, set[str]] = {}
    for module, dists in metadata.packages_distributions().items():
        for dist in dists:
            provided.setdefault(canonicalize_name(dist), set()).add(module)
    missing = {n: provided[n] - SERVICE_MODULES for n in names if provided[n] - SERVICE_MODULES}
    assert not missing, f"import names of the service extra that app.cli does not know: {missing}"


BLOCKED = textwrap.dedent(
    """
    import sys
    from app.cli import SERVICE_MODULES, main

    class Absent:  # the service extra is not installed
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in SERVICE_MODULES:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, Absent())
    sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.parametrize("argv", [["gc", "--dry-run"], ["db", "upgrade"], ["worker"]])
def test_a_service_command_without_the_extra_names_it(argv: list[str], tmp_path: Path) -> None:
    """Also a command whose parser itself needs the service (gc) still says which extra."""
    (tmp_path / "blocked.py").write_text(BLOCKED)
    done = subprocess.run(
        [sys.executable, str(tmp_path / "blocked.py"), *argv],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"error: `cka-atlas {argv[0]}` needs the service extra")
    assert done.stderr.strip().endswith('pip install "cka-atlas[service]"')
