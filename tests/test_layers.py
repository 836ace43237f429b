"""The package's layers, checked: which side of the socket may import what,
and that the wheel carries every module.

The agent side runs inside someone's training job, which may have nothing
but jax installed: it must never import Textual or rich. The rule is checked
twice: statically over every import statement, and by starting a fresh
interpreter that runs the agent for real.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Source folder -> where setuptools installs it (pyproject's package-dir).
INSTALLED_AS = {"jaxtop": "jaxtop", "probes": "jaxtop/probes", "widgets": "jaxtop/widgets", "demo": "jaxtop/demo"}

# What each layer may import besides the standard library. Keys are source
# paths relative to the repository root (a folder covers its modules).
THIRD_PARTY_AGENT = {"jax", "jaxlib", "numpy", "psutil", "pynvml", "prometheus_client"}
# libtpu's own monitoring (libtpu.sdk.tpumonitoring): read in-process on a
# TPU backend only, once jax has imported libtpu.
TPU_RUNTIME = {"libtpu", "libtpu.sdk"}
WIRE = {"jaxtop", "jaxtop.wire.protocol", "jaxtop.wire.paths", "jaxtop.wire.client", "jaxtop.wire.timeline"}
# The wire's record types and their decoder: msgspec, on the dashboard's side only.
RECORDS = {"msgspec", "jaxtop.wire.records"}
MODEL = {"numpy", "jaxtop", "jaxtop.wire.protocol", "jaxtop.wire.timeline", "jaxtop.wire", "jaxtop.dashboard.history",
         "jaxtop.dashboard.holders", "jaxtop.dashboard.ledger", "jaxtop.advice"} | RECORDS | {f"jaxtop.dashboard.{m}" for m in (
    "model", "views", "readings", "oom_views", "ledger_views", "snapshot", "backlog", "batch", "events", "state", "advising",
    "accelerator", "transfer_sites", "counter_window", "rows")}
ALLOWED = {
    # `forksafe`: probes/forksafe.py under the top-level name the stderr relay
    # (python -S, probes/ first on sys.path) imports it by.
    "probes": THIRD_PARTY_AGENT | TPU_RUNTIME | {"jaxtop", "jaxtop.wire.protocol", "jaxtop.probes", "jaxtop.wire",
                                                 "forksafe"},
    "jaxtop/agent": THIRD_PARTY_AGENT | WIRE | {"jaxtop.wire"} | {"jaxtop.agent", "jaxtop.probes", "jaxtop.wire.prometheus", "jaxtop.agent.labels"},
    "jaxtop/agent/labels.py": {"jax", "jaxlib", "jaxtop.probes.forksafe"},  # forksafe: stdlib only
    "jaxtop/wire/protocol.py": set(),
    "jaxtop/wire/timeline.py": {"jaxtop", "jaxtop.wire.protocol"},
    "jaxtop/wire/prometheus.py": {"jaxtop", "jaxtop.wire", "prometheus_client"},
    "jaxtop/wire/schema.py": set(),
    "jaxtop/wire/records": RECORDS | {"jaxtop", "jaxtop.wire", "jaxtop.wire.protocol", "jaxtop.wire.safe_text"},
    "jaxtop/wire/paths.py": set(),
    "jaxtop/wire/client.py": {"jaxtop", "jaxtop.wire", "jaxtop.wire.protocol", "jaxtop.wire.paths"},
    # The profile merge reads protobuf with the probes' stdlib-only wire reader (jaxtop.probes.pprof).
    "jaxtop/export": {"orjson", "msgspec", "jaxtop", "jaxtop.wire", "jaxtop.wire.protocol", "jaxtop.export",
                      "jaxtop.probes.pprof"},
    # Widgets draw typed views: never a wire record, a probe or the agent.
    "widgets": {"numpy", "rich", "textual", "jaxtop", "jaxtop.widgets", "jaxtop.wire.units", "jaxtop.advice"}
    | {f"jaxtop.dashboard.{m}" for m in ("model", "views", "readings", "oom_views", "ledger_views", "oom_report",
                                          "history", "holders", "ledger", "accelerator", "transfer_sites")},
    "jaxtop/dashboard/model.py": MODEL,
    "jaxtop/dashboard/views.py": MODEL,
    "jaxtop/dashboard/readings.py": MODEL,
    "jaxtop/dashboard/oom_views.py": MODEL,
    "jaxtop/dashboard/ledger_views.py": MODEL,
    "jaxtop/dashboard/snapshot.py": MODEL,
    "jaxtop/dashboard/backlog.py": MODEL,
    "jaxtop/dashboard/batch.py": MODEL,
    "jaxtop/dashboard/events.py": MODEL,
    "jaxtop/dashboard/state.py": MODEL,
    "jaxtop/dashboard/advising.py": MODEL,
    "jaxtop/dashboard/accelerator.py": MODEL,
    "jaxtop/dashboard/holders.py": RECORDS,
    "jaxtop/dashboard/rows.py": RECORDS | {"jaxtop", "jaxtop.wire", "jaxtop.wire.protocol", "jaxtop.wire.timeline"},
    "jaxtop/dashboard/transfer_sites.py": {"jaxtop.dashboard.counter_window"} | RECORDS,
    "jaxtop/dashboard/counter_window.py": set(),
    # The wire's number rules (protocol: stdlib only, as this module stays).
    "jaxtop/dashboard/ledger.py": {"jaxtop", "jaxtop.wire", "jaxtop.wire.protocol"} | RECORDS,
    "jaxtop/dashboard/history.py": {"numpy"},
    # The advisor: records in, advice out; the ledger's fold is the one the
    # dashboard keeps (it imports only the record types).
    "jaxtop/advice": RECORDS | {"jaxtop", "jaxtop.advice", "jaxtop.dashboard.ledger", "jaxtop.wire.units",
                                "jaxtop.wire.protocol"},
}


def _modules(rel: str) -> list[Path]:
    path = ROOT / rel
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


def _imports(path: Path) -> set[str]:
    """Every module an ``import`` or ``from … import`` in the file names,
    including imports inside functions (a lazy import is still an import)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            # `from jaxtop.wire import protocol` imports the submodule
            # jaxtop.wire.protocol: a name that is a module of ours counts as one.
            if node.module.split(".")[0] == "jaxtop":
                names.update(f"{node.module}.{alias.name}" for alias in node.names
                             if _is_our_module(f"{node.module}.{alias.name}"))
    return names


def _is_our_module(dotted: str) -> bool:
    """A module or package of this repository, by its installed dotted name."""
    parts = dotted.split(".")
    if parts[0] != "jaxtop":
        return False
    source = {"probes": "probes", "widgets": "widgets", "demo": "demo"}.get(parts[1] if len(parts) > 1 else "")
    path = ROOT.joinpath(source, *parts[2:]) if source else ROOT.joinpath("jaxtop", *parts[1:])
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _allowed(name: str, allowed: set[str]) -> bool:
    top = name.split(".")[0]
    if top in sys.stdlib_module_names and top != "jaxtop":
        return True
    return any(name == a or name.startswith(a + ".") for a in allowed if a != "jaxtop") or name == "jaxtop"


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_layer_imports_only_what_it_may(layer):
    bad = []
    for path in _modules(layer):
        # The relay runs as a standalone script: stdlib and its siblings oom and _relay_lines.
        allowed = ({"oom", "probes.oom", "_relay_lines", "probes._relay_lines"} if path.name == "_relay.py"
                   else ALLOWED[layer])
        for name in sorted(_imports(path)):
            if not _allowed(name, allowed):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not bad, "\n".join(bad)


AGENT_SIDE = ("probes", "jaxtop/agent", "jaxtop/wire/protocol.py", "jaxtop/wire/timeline.py", "jaxtop/wire/schema.py",
              "jaxtop/wire/paths.py", "jaxtop/wire/client.py", "jaxtop/wire/prometheus.py", "jaxtop/wire/safe_text.py",
              "jaxtop/wire/units.py")


@pytest.mark.parametrize("layer", AGENT_SIDE)
def test_the_agent_side_never_imports_the_record_types(layer):
    # The record types need msgspec, which a training job may not have:
    # the agent writes the same names from plain dicts. "jaxtop.wire" is
    # allowed to the agent as a package, so its records subpackage is
    # checked by name here.
    bad = [f"{path.relative_to(ROOT)} imports {name}" for path in _modules(layer) for name in sorted(_imports(path))
           if name == "msgspec" or name.startswith("jaxtop.wire.records")]
    assert not bad, "\n".join(bad)


def test_the_layer_check_catches_a_forbidden_import(tmp_path):
    # The check above must be able to fail: a module importing textual is caught.
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from textual.app import App\n")
    assert not all(_allowed(n, ALLOWED["jaxtop/agent"]) for n in _imports(bad))


@pytest.mark.slow
def test_agent_side_runs_without_importing_textual_or_rich(tmp_path):
    """A fresh interpreter imports every agent-side module and runs the agent
    with a real jax computation; neither textual nor rich may be imported."""
    script = tmp_path / "agent_only.py"
    script.write_text(textwrap.dedent("""
        import importlib, pkgutil, sys
        import jaxtop
        handle = jaxtop.instrument(interval_s=0.05)
        import jax, jax.numpy as jnp
        import jaxtop.agent, jaxtop.probes, jaxtop.wire.protocol, jaxtop.wire.client
        for pkg in (jaxtop.agent, jaxtop.probes):
            for info in pkgutil.iter_modules(pkg.__path__):
                if info.name != "_relay":
                    importlib.import_module(f"{pkg.__name__}.{info.name}")
        jnp.arange(1000.0).sum().block_until_ready()
        from jaxtop.probes.memory_profile import take_profile  # the agent's profile command
        handle.stop()
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("textual", "rich"))
        print("LEAKED", leaked)
        sys.exit(1 if leaked else 0)
    """))
    env = dict(os.environ, JAXTOP_SOCKET_DIR=str(tmp_path / "sock"), JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "LEAKED []" in proc.stdout


def _source_modules() -> set[str]:
    """Where each source file lands once installed (``probes/x.py`` ->
    ``jaxtop/probes/x.py``)."""
    out = set()
    for folder, target in INSTALLED_AS.items():
        for path in (ROOT / folder).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            out.add(f"{target}/{path.relative_to(ROOT / folder).as_posix()}")
    return out


@pytest.mark.slow
def test_wheel_contains_every_module(tmp_path):
    """An editable install finds modules through the source tree and hides a
    package missing from pyproject's list; a built wheel does not."""
    # Build from a clean copy: an in-tree build reuses build/lib, whose stale
    # copies would hide a package missing from the list.
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", "build", "dist", "*.egg-info", "__pycache__", ".git", ".pytest_cache", "*.prof"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(src)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    wheel = next(tmp_path.glob("jaxtop-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_source_modules() - names)
    assert not missing, f"modules missing from the wheel: {missing}"
    # Nothing lands outside the jaxtop namespace (no top-level `widgets`).
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"jaxtop"}, tops


#: The most lines a source module may have: past it, a module does two jobs.
MAX_MODULE_LINES = 600


def test_no_source_module_is_over_the_limit():
    too_long = []
    for folder in INSTALLED_AS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            n = len(path.read_text().splitlines())
            if n > MAX_MODULE_LINES:
                too_long.append(f"{path.relative_to(ROOT)}: {n} lines")
    assert not too_long, "\n".join(too_long)


def test_the_package_root_holds_only_the_entry_points():
    """Everything else lives in a folder of its concern (wire, agent, CLI,
    budgets, dashboard, export, inject, testing)."""
    assert sorted(p.name for p in (ROOT / "jaxtop").glob("*.py")) == ["__init__.py", "__main__.py"]
