"""The package's import graph: no cycles (module- or function-level imports), and at most three imports of
another module's ``_private`` name."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "fusecli"
MAX_PRIVATE = 3


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for p in ROOT.rglob("*.py"):
        name = ".".join(p.relative_to(ROOT.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = p
    return mods


def _graph() -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """Each module's imports of fusecli modules, and every (importer, module, _name) private import."""
    mods = _modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    private = []
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                for a in node.names:
                    target = f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                    if target in mods and target != m:
                        edges[m].add(target)
                    if a.name.startswith("_") and not a.name.startswith("__") and target != m:
                        private.append((m, base, a.name))
            elif isinstance(node, ast.Import):
                edges[m] |= {a.name for a in node.names if a.name in mods and a.name != m}
    return edges, private


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                scc = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    scc.append(w)
                    if w == v:
                        break
                if len(scc) > 1:
                    out.append(sorted(scc))
    return out


def test_no_import_cycles():
    edges, _ = _graph()
    assert _cycles(edges) == []


def test_few_private_imports():
    _, private = _graph()
    assert len(private) <= MAX_PRIVATE, private


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_pattern_language_and_spellings_sit_below_grad_and_fusion():
    """The data flow: trees and spellings import neither grad/ nor fusion/; grad/ does not import fusion/."""
    edges, _ = _graph()
    below = [m for m in edges
             if m == "fusecli.core.trees" or m.startswith(("fusecli.spellings", "fusecli.grad"))]
    upward = {m: sorted(t for t in edges[m] if t.startswith("fusecli.fusion")
                        or (not m.startswith("fusecli.grad") and t.startswith("fusecli.grad")))
              for m in below}
    assert below and {m: t for m, t in upward.items() if t} == {}


# package -> the packages it may import (docs/layout.md): the flow load -> grad -> memory -> fusion, the
# commands above it; the crossings named there (diff reads report's JSON pieces and rewrite's emitter table,
# core/output.py an ONNX file's external data); fusion names its kernels by key and imports no rewrite/
LAYERS = {
    "core": {"load"},
    "spellings": {"core"},
    "load": {"core", "memory"},
    "grad": {"core", "spellings"},
    "memory": {"core"},
    "precision": {"core", "spellings", "grad"},
    "fusion": {"core", "memory", "spellings"},
    "pipeline": {"core", "load", "spellings", "grad", "memory", "precision", "fusion"},
    "report": {"fusecli", "core", "load", "spellings", "grad", "memory", "precision", "fusion", "pipeline"},
    "render": {"core", "fusion", "pipeline"},
    "rewrite": {"fusecli", "core", "load", "spellings", "memory", "fusion", "pipeline"},
    "plan": {"core", "grad", "memory", "precision", "fusion"},
    "parallel": {"core", "spellings", "memory", "plan"},
    "diff": {"fusecli", "core", "load", "memory", "fusion", "pipeline", "report", "rewrite"},
}


def test_analysis_imports_no_rewrite_module_nor_onnxruntime():
    """`fusecli analyze`'s modules (the pipeline and what it imports) load no module of rewrite/, nor
    onnxruntime: analysis pays for no kernel emitter (fusion's families name theirs by key)."""
    code = ("import sys, fusecli.pipeline, fusecli.report.document, fusecli.report.text; "
            "print(sorted(m for m in sys.modules if m.startswith('fusecli.rewrite') or m == 'onnxruntime'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_packages_follow_the_layout():
    """No package imports one the layout puts beside or below it (a command's package never another's,
    but for the crossings LAYERS names)."""
    edges, _ = _graph()
    top = {m.split(".")[1] for m in edges if m.count(".") >= 1}
    assert set(LAYERS) <= top
    extra = {}
    for m, targets in edges.items():
        package = m.split(".")[1] if m.count(".") >= 1 else m
        if package not in LAYERS:
            continue
        for t in targets:
            other = t.split(".")[1] if t.count(".") >= 1 else t
            if other != package and other not in LAYERS[package]:
                extra.setdefault(m, []).append(t)
    assert extra == {}


def test_the_top_holds_packages_and_the_two_joining_modules():
    """docs/layout.md: shared modules live in core/, the top of fusecli/ holds packages, pipeline and cli."""
    loose = sorted(p.name for p in ROOT.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "cli.py", "pipeline.py"]


# rewrite/'s packages, lowest first: each imports only those before it (docs/layout.md), none the command's
# modules on top of rewrite/ (run, plan, source, report)
REWRITE_LAYERS = {
    "graph": set(),
    "kernels": {"graph"},
    "verify": {"graph", "kernels"},
}
MAX_REWRITE_TOP = 6


def _rewrite_upward(edges: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each module of a rewrite/ package -> its imports of a rewrite/ module REWRITE_LAYERS does not allow."""
    prefix = "fusecli.rewrite."
    upward: dict[str, list[str]] = {}
    for m, targets in edges.items():
        package = m.removeprefix(prefix).split(".")[0]
        if not m.startswith(prefix) or package not in REWRITE_LAYERS:
            continue
        for t in sorted(targets):
            other = t.removeprefix(prefix).split(".")[0] if t.startswith(prefix) else None
            if t == "fusecli.rewrite" or (other is not None and other != package
                                          and other not in REWRITE_LAYERS[package]):
                upward.setdefault(m, []).append(t)
    return upward


def test_rewrite_packages_point_down():
    """Inside rewrite/: graph/ imports neither kernels/ nor verify/, kernels/ does not import verify/, and no
    package imports a module on top of rewrite/ (run, plan, source, report)."""
    edges, _ = _graph()
    packages = {m.split(".")[2] for m in edges if m.startswith("fusecli.rewrite.") and m.count(".") >= 3}
    assert set(REWRITE_LAYERS) <= packages
    assert _rewrite_upward(edges) == {}


def test_the_rewrite_check_finds_an_upward_import():
    edges = {"fusecli.rewrite.graph.edit": {"fusecli.rewrite.kernels.kit", "fusecli.core.ir"},
             "fusecli.rewrite.kernels.conv": {"fusecli.rewrite.graph.fold", "fusecli.rewrite.verify.outputs"},
             "fusecli.rewrite.verify.outputs": {"fusecli.rewrite.run", "fusecli.rewrite.kernels.cuda"},
             "fusecli.rewrite.run": {"fusecli.rewrite.verify.outputs"}}
    assert _rewrite_upward(edges) == {"fusecli.rewrite.graph.edit": ["fusecli.rewrite.kernels.kit"],
                                      "fusecli.rewrite.kernels.conv": ["fusecli.rewrite.verify.outputs"],
                                      "fusecli.rewrite.verify.outputs": ["fusecli.rewrite.run"]}


def test_the_top_of_rewrite_holds_packages_and_few_modules():
    """rewrite/ holds its packages and at most six modules: the command's flow and what only it uses."""
    rewrite = ROOT / "rewrite"
    loose = sorted(p.name for p in rewrite.glob("*.py"))
    packages = sorted(p.parent.name for p in rewrite.glob("*/__init__.py"))
    assert len(loose) <= MAX_REWRITE_TOP, loose
    assert packages == sorted(REWRITE_LAYERS)


def test_every_module_imports_first():
    """Each module imported first, in a fresh set of fusecli modules: an import cycle through a package's
    ``__init__`` (a kernel module importing fusion, whose families import the kernels) fails only then."""
    names = sorted(_modules())
    code = ("import importlib, sys\n"
            "failed = []\n"
            "for name in sys.argv[1:]:\n"
            "    for m in [m for m in sys.modules if m == 'fusecli' or m.startswith('fusecli.')]:\n"
            "        del sys.modules[m]\n"
            "    try:\n"
            "        importlib.import_module(name)\n"
            "    except Exception as e:\n"
            "        failed.append(f'{name}: {e}')\n"
            "print('\\n'.join(failed))\n")
    done = subprocess.run([sys.executable, "-c", code, *(n for n in names if not n.endswith("__main__"))],
                          capture_output=True, text=True, cwd=ROOT.parent, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "", done.stdout
