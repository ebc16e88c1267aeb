"""Every test in tests/ asserts something that can fail.

A scan of the tests' syntax trees: a test function asserts when its body holds an `assert`, a `raise
AssertionError`, `pytest.raises`/`warns`/`fail`/`approx`, or calls a function of tests/ that does so
itself or through functions it calls in turn. A call counts only when its name resolves to such a
function: one defined in the test's own module, or imported by name from a module of tests/ (`from
support import wait_for`), or called on such a module (`support.wait_for(...)`). A method call on an
object (`stack.inject(...)`) never counts: its target cannot be known from the syntax, so such a test
needs an assertion of its own or a resolvable helper.
"""
from __future__ import annotations

import ast
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parents[1]
PYTEST_CHECKS = {"raises", "warns", "fail", "approx"}


def _asserts_directly(function: ast.AST) -> bool:
    for node in ast.walk(function):
        if isinstance(node, ast.Assert):
            return True
        if isinstance(node, ast.Raise) and node.exc is not None:
            raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(raised, ast.Name) and raised.id == "AssertionError":
                return True
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "pytest"
                and node.attr in PYTEST_CHECKS):
            return True
    return False


class _Module:
    """One module of tests/: its functions (by name; methods and nested functions too, by their own name)
    and what its names resolve to in other modules of tests/."""

    def __init__(self, path: Path, local_modules: set[str]) -> None:
        self.name = path.stem
        self.path = path
        self.tree = ast.parse(path.read_text(), str(path))
        self.functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.setdefault(node.name, []).append(node)
        self.imported: dict[str, tuple[str, str]] = {}  # local name -> (module, name there)
        self.modules: dict[str, str] = {}  # local name -> module of tests/
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and node.module in local_modules and node.level == 0:
                for alias in node.names:
                    self.imported[alias.asname or alias.name] = (node.module, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in local_modules:
                        self.modules[alias.asname or alias.name] = alias.name

    def callees(self, function: ast.AST) -> set[tuple[str, str]]:
        """(module, function) of each call in `function` that resolves to a function of tests/."""
        found = set()
        for node in ast.walk(function):
            if not isinstance(node, ast.Call):
                continue
            called = node.func
            if isinstance(called, ast.Name):
                if called.id in self.imported:
                    found.add(self.imported[called.id])
                elif called.id in self.functions:
                    found.add((self.name, called.id))
            elif (isinstance(called, ast.Attribute) and isinstance(called.value, ast.Name)
                  and called.value.id in self.modules):
                found.add((self.modules[called.value.id], called.attr))
        return found


def _modules() -> dict[str, _Module]:
    paths = sorted(TESTS_DIR.rglob("*.py"))
    # Support modules are imported by their bare names (tests/ is on sys.path); test modules are never imported.
    local = {path.stem for path in paths if path.parent == TESTS_DIR}
    return {str(path.relative_to(TESTS_DIR)): _Module(path, local) for path in paths}


def find_unasserting_tests() -> list[str]:
    modules = _modules()
    by_name = {module.name: module for key, module in modules.items() if "/" not in key}
    asserting: set[tuple[str, str]] = set()
    for module in modules.values():
        for name, functions in module.functions.items():
            if any(_asserts_directly(function) for function in functions):
                asserting.add((module.name, name))
    changed = True
    while changed:
        changed = False
        for module in modules.values():
            for name, functions in module.functions.items():
                if (module.name, name) not in asserting and any(
                        module.callees(function) & asserting for function in functions):
                    asserting.add((module.name, name))
                    changed = True
    missing = []
    for key, module in modules.items():
        if not module.name.startswith("test_"):
            continue
        for node in module.tree.body:
            candidates = [node] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else (
                [item for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]
                if isinstance(node, ast.ClassDef) and node.name.startswith("Test") else [])
            for function in candidates:
                if function.name.startswith("test") and (module.name, function.name) not in asserting:
                    missing.append(f"{key}:{function.lineno} {function.name}")
    assert by_name, "no support module found: the scan looks in the wrong place"
    return missing


def test_every_test_asserts_something() -> None:
    assert find_unasserting_tests() == []


def test_the_scan_finds_a_test_without_an_assertion(tmp_path, monkeypatch) -> None:
    """The scan itself can fail: a test that only calls code, or calls a helper that asserts nothing, is named."""
    import test_every_test_asserts as scan

    (tmp_path / "helpers.py").write_text("def check(x):\n    assert x\n\ndef run(x):\n    return x\n")
    (tmp_path / "unit").mkdir()
    (tmp_path / "unit" / "test_sample.py").write_text(
        "from helpers import check, run\n\n"
        "def test_checked():\n    check(1)\n\n"
        "def test_unchecked():\n    run(1)\n\n"
        "def test_method_call(stack):\n    stack.check(1)\n\n"
        "def test_direct():\n    assert run(1) == 1\n")
    monkeypatch.setattr(scan, "TESTS_DIR", tmp_path)
    assert scan.find_unasserting_tests() == ["unit/test_sample.py:6 test_unchecked",
                                               "unit/test_sample.py:9 test_method_call"]
