"""Import hygiene: a fast start, every module importable on its own, dependencies pointing one way.

- ``import hookscope`` (and ``hookscope.callbacks``, ``hs.Learner``) loads none of the heavy or optional
  libraries: matplotlib, scikit-learn, rich, torchvision, PIL... load when a feature that needs them runs.
- ``hookscope --help`` (and each command's ``--help``) does not import torch.
- Every module imports in a fresh interpreter as the first hookscope module (catches import cycles).
- Layering (module-level imports, read with ``ast``): ``hooks`` ← ``doctor`` ← ``train`` ← ``callbacks``
  ← ``viz``/``cli``; ``watch`` and ``integrations`` at the edge, imported by none of them.
  Imports inside functions and under ``if TYPE_CHECKING:`` are allowed there; ``hooks``, ``doctor`` and
  ``viz`` (which names nothing of ``callbacks``) hold to their layer at every level, type hints included.
- No two modules import each other at any level (function bodies included). A pair closed by an import
  under ``if TYPE_CHECKING:`` is allowed only when that import names a module of ``train/`` (a callback
  or a loop helper annotating with the ``Learner`` it serves).

Each check that depends on what is already imported runs in a fresh interpreter (``subprocess``).
"""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hookscope

PACKAGE_DIR = Path(hookscope.__file__).parent
SRC_DIR = PACKAGE_DIR.parent

# Loaded only by the feature that needs them, never by ``import hookscope``.
HEAVY = (
    "matplotlib",
    "sklearn",
    "scipy",
    "rich",
    "torchvision",
    "PIL",
    "pandas",
    "safetensors",
    "tensorboard",
    "wandb",
    "mlflow",
    "torch_pruning",
    "torchmetrics",
    "lightning",
    "pytorch_lightning",
    "fastai",
    "transformers",
    "triton",
)

# importing hookscope.__main__ runs the command
NOT_IMPORTABLE_ALONE = {"hookscope.__main__"}

# hs.watch and the framework integrations sit at the edge: they may use every layer, none uses them.
EDGE = ("hookscope.watching", "hookscope.integrations")
LAYERS = {
    "hookscope.hooks": (
        *EDGE,
        "hookscope.train",
        "hookscope.callbacks",
        "hookscope.viz",
        "hookscope.cli",
        "hookscope.doctor",
        "hookscope.pruning",
    ),
    # pruning acts through hooks; the Pruning callback adapts it to the loop
    "hookscope.pruning": (
        "hookscope.doctor",
        "hookscope.train",
        "hookscope.callbacks",
        "hookscope.viz",
        "hookscope.cli",
        *EDGE,
    ),
    "hookscope.doctor": ("hookscope.train", "hookscope.callbacks", "hookscope.viz", "hookscope.cli", *EDGE),
    "hookscope.train": ("hookscope.callbacks", "hookscope.viz", "hookscope.cli", *EDGE),
    "hookscope.callbacks": ("hookscope.viz", "hookscope.cli", *EDGE),
}


def run_python(code: str, *args: str, timeout: float = 240) -> str:
    """Run ``code`` (with ``args`` in ``sys.argv[1:]``) in a fresh interpreter; return its stdout.

    Fails the test, showing stderr, when the interpreter exits with an error.
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done.stdout


# Sees every import first; records the hookscope line that asked for a heavy module, then lets it load.
SPY = """
import json, sys, traceback

heavy, root, blame = json.loads(sys.argv[1]), sys.argv[2], {}

class Spy:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        stack = traceback.extract_stack()
        probe = any(f.name == "find_spec" and "importlib" in f.filename for f in stack[:-1])
        if top in heavy and top not in blame and not probe:  # importlib.util.find_spec only looks
            ours = [f for f in stack if f.filename.startswith(root)]
            blame[top] = f"{ours[-1].filename}:{ours[-1].lineno}" if ours else "outside hookscope"
        return None

sys.meta_path.insert(0, Spy())
"""


def heavy_loaded_after(statements: str) -> dict[str, str]:
    """Which of :data:`HEAVY` a fresh interpreter imports while running ``statements``, each with the
    hookscope line that first imported it (``file:line``, from the stack at that import)."""
    report = "print(json.dumps({name: blame.get(name, '?') for name in heavy if name in sys.modules}))"
    out = run_python(f"{SPY}\n{statements}\n{report}\n", json.dumps(HEAVY), str(PACKAGE_DIR))
    return json.loads(out.strip().splitlines()[-1])


def describe(loaded: dict[str, str]) -> str:
    return "\n".join(f"  {name}, first imported at {where}" for name, where in sorted(loaded.items()))


def is_under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_import_hookscope_loads_nothing_heavy() -> None:
    loaded = heavy_loaded_after("import hookscope")
    assert not loaded, "import hookscope loaded:\n" + describe(loaded)


def test_callbacks_and_learner_load_nothing_heavy() -> None:
    loaded = heavy_loaded_after(
        "import hookscope as hs; import hookscope.callbacks; hs.Learner; hs.callbacks"
    )
    assert not loaded, "hookscope.callbacks and hs.Learner loaded:\n" + describe(loaded)


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["train", "--help"],
        ["inspect", "--help"],
        ["summary", "--help"],
        ["report", "--help"],
        ["compare", "--help"],
    ],
    ids=lambda argv: " ".join(argv),
)
def test_help_does_not_import_torch(argv: list[str]) -> None:
    out = run_python(
        f"""
        import io, json, runpy, sys
        from contextlib import redirect_stdout
        sys.argv = ["hookscope", *{argv!r}]
        text = io.StringIO()
        try:
            with redirect_stdout(text):
                runpy.run_module("hookscope", run_name="__main__", alter_sys=True)
        except SystemExit as exit:
            code = exit.code
        print(json.dumps({{"code": code, "help": text.getvalue(), "torch": "torch" in sys.modules}}))
        """
    )
    result = json.loads(out.strip().splitlines()[-1])
    assert result["code"] == 0
    assert result["help"].startswith("usage: hookscope")
    assert result["torch"] is False, f"hookscope {' '.join(argv)} imported torch"


def test_bad_option_is_a_usage_error_without_torch() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, runpy; sys.argv = ['hookscope', 'train', '--bogus']\n"
            "try:\n    runpy.run_module('hookscope', run_name='__main__')\n"
            "finally:\n    print('torch' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "unrecognized arguments: --bogus" in done.stderr
    assert done.stdout.strip() == "False"


def all_modules() -> list[str]:
    """Every module of the package, as ``pkgutil.walk_packages`` finds it under ``src/hookscope``."""
    found = pkgutil.walk_packages([str(PACKAGE_DIR)], prefix="hookscope.")
    return sorted({"hookscope", *(info.name for info in found)} - NOT_IMPORTABLE_ALONE)


def test_all_modules_found() -> None:
    modules = all_modules()
    assert {"hookscope.cli", "hookscope.cli.train", "hookscope.train.learner", "hookscope.viz.plots"} <= set(
        modules
    )


@pytest.mark.parametrize("order", ["alphabetical", "reverse"])
def test_every_module_imports_first(order: str) -> None:
    """Each module, imported as the first hookscope module of the interpreter, imports without error."""
    modules = all_modules()
    if order == "reverse":
        modules.reverse()
    out = run_python(
        f"""
        import importlib, json, sys, traceback
        failures = {{}}
        for name in {modules!r}:
            for loaded in [m for m in sys.modules if m == "hookscope" or m.startswith("hookscope.")]:
                del sys.modules[loaded]
            try:
                importlib.import_module(name)
            except ImportError as err:
                # an integration module without its framework must say how to install it, nothing else
                if not name.startswith("hookscope.integrations.") or "[integrations]" not in str(err):
                    failures[name] = traceback.format_exception_only(type(err), err)[-1].strip()
            except Exception as err:
                failures[name] = traceback.format_exception_only(type(err), err)[-1].strip()
        print(json.dumps(failures))
        """,
        timeout=600,
    )
    failures = json.loads(out.strip().splitlines()[-1])
    assert not failures, "modules that fail to import on their own:\n" + "\n".join(
        f"  {name}: {error}" for name, error in failures.items()
    )


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC_DIR).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_statements(
    tree: ast.Module, name: str, is_package: bool, *, in_functions: bool, type_checking: bool = False
) -> list[tuple[int, str, tuple[str, ...]]]:
    """``(line, module, names)`` for each import of module ``name``: ``from a import b, c`` gives
    ``(line, "a", ("b", "c"))``, ``import a.b`` gives ``(line, "a.b", ())``; relative imports are made
    absolute. ``if TYPE_CHECKING:`` blocks are skipped unless ``type_checking``, function bodies unless
    ``in_functions``.
    """
    package = name if is_package else name.rpartition(".")[0]
    found: list[tuple[int, str, tuple[str, ...]]] = []

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                found.extend((node.lineno, alias.name, ()) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                found.append((node.lineno, base, tuple(alias.name for alias in node.names)))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not in_functions:
                continue
            elif isinstance(node, ast.If) and is_type_checking(node.test) and not type_checking:
                visit(node.orelse)
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    visit(
                        [s for s in getattr(node, field, []) if isinstance(s, ast.stmt | ast.excepthandler)]
                    )

    visit(tree.body)
    return found


def module_level_imports(tree: ast.Module, name: str, is_package: bool) -> list[tuple[int, str]]:
    """``(line, imported module)`` for the imports that run when the module is imported.

    Function bodies and ``if TYPE_CHECKING:`` blocks are skipped; ``from a import b`` yields ``a.b`` (``b``
    may be a submodule) as well as ``a``; relative imports are made absolute.
    """
    return [
        (line, imported)
        for line, base, names in import_statements(tree, name, is_package, in_functions=False)
        for imported in (base, *(f"{base}.{n}" for n in names))
    ]


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def layering_violations() -> list[str]:
    """``file:line: what`` for each module-level import against :data:`LAYERS` (one per line of code)."""
    violations = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        name = module_name(path)
        forbidden = next((deny for layer, deny in LAYERS.items() if is_under(name, layer)), ())
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        reported: set[int] = set()
        for line, imported in module_level_imports(tree, name, path.name == "__init__.py"):
            bad = next((f for f in forbidden if is_under(imported, f)), None)
            if bad and line not in reported:
                reported.add(line)
                where = path.relative_to(SRC_DIR.parent)
                violations.append(f"{where}:{line}: {name} imports {imported} ({bad} at module level)")
    return violations


def test_module_level_imports_respect_the_layers() -> None:
    violations = layering_violations()
    assert not violations, "module-level imports against the layering:\n" + "\n".join(violations)


def test_layering_check_sees_module_level_imports_only() -> None:
    source = textwrap.dedent(
        """
        from typing import TYPE_CHECKING
        import hookscope.callbacks.doctor
        from ..viz import plots
        from . import events
        try:
            from hookscope.cli import main
        except ImportError:
            pass
        if TYPE_CHECKING:
            from hookscope.viz.report import write_report
        def f():
            from hookscope.callbacks import Doctor
        class C:
            from hookscope.viz import curves
        """
    )
    imports = {m for _, m in module_level_imports(ast.parse(source), "hookscope.train.learner", False)}
    assert {
        "hookscope.callbacks.doctor",
        "hookscope.viz.plots",
        "hookscope.train.events",
        "hookscope.cli.main",
        "hookscope.viz.curves",
    } <= imports
    assert "hookscope.viz.report" not in imports and "hookscope.viz.report.write_report" not in imports
    assert not any(m.startswith("hookscope.callbacks.Doctor") for m in imports)


# Where the layering holds for every import, those inside functions and under ``if TYPE_CHECKING:`` too
# (train/ still reaches the callback catalogue from its convenience methods, so it is checked at module
# level only, by LAYERS).
ANY_LEVEL_LAYERS = {
    "hookscope.hooks": (
        "hookscope.doctor",
        "hookscope.train",
        "hookscope.callbacks",
        "hookscope.viz",
        "hookscope.cli",
    ),
    "hookscope.doctor": ("hookscope.train", "hookscope.callbacks", "hookscope.viz", "hookscope.cli"),
    "hookscope.viz": ("hookscope.callbacks", "hookscope.cli"),
}


def imported_modules(
    tree: ast.Module, name: str, is_package: bool, modules: set[str], *, type_checking: bool = False
) -> set[str]:
    """The modules of ``modules`` that module ``name`` imports anywhere (functions included; ``if
    TYPE_CHECKING:`` blocks only with ``type_checking``). ``from a import b`` imports the submodule ``a.b``
    when there is one, else a name of ``a`` (for a package: its ``__init__``)."""
    found = set()
    statements = import_statements(tree, name, is_package, in_functions=True, type_checking=type_checking)
    for _, base, names in statements:
        targets = [f"{base}.{n}" if f"{base}.{n}" in modules else base for n in names] or [base]
        found.update(t for t in targets if t in modules and t != name)
    return found


def import_graph(*, type_checking: bool = False) -> dict[str, set[str]]:
    """Each module of src/hookscope -> the modules of src/hookscope it imports, at any level (and under
    ``if TYPE_CHECKING:`` with ``type_checking``)."""
    paths = {module_name(path): path for path in PACKAGE_DIR.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        graph[name] = imported_modules(tree, name, is_package, set(paths), type_checking=type_checking)
    return graph


def mutual_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Every pair ``(a, b)``, ``a < b``, of modules that import each other."""
    return {(a, b) for a, imported in graph.items() for b in imported if a < b and a in graph.get(b, ())}


def test_no_two_modules_import_each_other() -> None:
    pairs = mutual_imports(import_graph())
    assert not pairs, "modules that import each other (at any level):\n" + "\n".join(
        f"  {a} <-> {b}" for a, b in sorted(pairs)
    )


def test_a_type_only_import_closes_a_pair_only_toward_the_loop() -> None:
    """``render`` naming ``Summary`` in its hints while ``result`` imports ``render`` is a cycle all the
    same; only hints naming train/ (the ``Learner``, its data) may point back."""
    runtime, typed = import_graph(), import_graph(type_checking=True)

    def type_only(a: str, b: str) -> bool:
        return b in typed[a] - runtime[a]

    back = [
        f"  {a} <-> {b}"
        for a, b in sorted(mutual_imports(typed))
        if not any(type_only(x, y) and is_under(y, "hookscope.train") for x, y in ((a, b), (b, a)))
    ]
    assert not back, "modules that import each other, one of them only under TYPE_CHECKING:\n" + "\n".join(
        back
    )


def test_hooks_doctor_and_viz_import_no_higher_layer_at_any_level() -> None:
    """Also under ``if TYPE_CHECKING:``: ``viz`` reads results and names nothing of ``callbacks``."""
    graph = import_graph(type_checking=True)
    violations = [
        f"  {name} imports {imported}"
        for name, imports in sorted(graph.items())
        for layer, deny in ANY_LEVEL_LAYERS.items()
        if is_under(name, layer)
        for imported in sorted(imports)
        if any(is_under(imported, d) for d in deny)
    ]
    assert not violations, "imports against the layering (any level):\n" + "\n".join(violations)


def test_the_loop_names_the_callback_catalogue_in_one_place() -> None:
    """train/ reaches callbacks/ through one import, in ``Learner``'s ``_catalogue()`` (its convenience
    methods: see the docstring of train/learner.py)."""
    found = []
    for path in sorted((PACKAGE_DIR / "train").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        statements = import_statements(tree, module_name(path), path.name == "__init__.py", in_functions=True)
        for line, base, names in statements:
            if any(is_under(m, "hookscope.callbacks") for m in (base, *(f"{base}.{n}" for n in names))):
                found.append(f"{path.relative_to(SRC_DIR.parent)}:{line}")
    assert len(found) == 1, f"train/ imports callbacks/ at: {found}"
    assert found[0].startswith("src/hookscope/train/learner.py:")


def test_the_import_graph_counts_imports_in_functions_and_resolves_submodules() -> None:
    source = textwrap.dedent(
        """
        from typing import TYPE_CHECKING
        from hookscope.callbacks import Doctor, lr_finder
        from ..viz import plots
        if TYPE_CHECKING:
            from hookscope.cli import main
        def f():
            from hookscope.callbacks.loggers.metrics import read_metrics
            import hookscope.doctor.engine
        """
    )
    modules = {
        "hookscope.callbacks",
        "hookscope.callbacks.lr_finder",
        "hookscope.callbacks.loggers.metrics",
        "hookscope.viz.plots",
        "hookscope.cli",
        "hookscope.cli.main",
        "hookscope.doctor.engine",
        "hookscope.train.learner",
    }
    imported = imported_modules(ast.parse(source), "hookscope.train.learner", False, modules)
    assert imported == {
        "hookscope.callbacks",  # Doctor: a name of the package's __init__
        "hookscope.callbacks.lr_finder",
        "hookscope.callbacks.loggers.metrics",
        "hookscope.viz.plots",
        "hookscope.doctor.engine",
    }
    typed = imported_modules(ast.parse(source), "hookscope.train.learner", False, modules, type_checking=True)
    assert typed == imported | {"hookscope.cli.main"}
    graph = {"a": {"b", "c"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}
    assert mutual_imports(graph) == {("a", "b"), ("c", "d")}


@pytest.mark.parametrize(
    "package", ["hookscope", "hookscope.callbacks", "hookscope.viz", "hookscope.callbacks.loggers"]
)
def test_lazy_exports_resolve(package: str) -> None:
    """Every name of ``__all__`` is listed by ``dir()``, resolves, and is the defining module's object."""
    module = __import__(package, fromlist=["__all__"])
    assert set(module.__all__) <= set(dir(module))
    for name in module.__all__:
        value = getattr(module, name)
        owner = getattr(value, "__module__", None)
        if owner and owner.startswith("hookscope.") and not isinstance(value, type(hookscope)):
            assert getattr(sys.modules[owner], name, value) is value
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        module.no_such_name  # noqa: B018


def test_from_imports_and_attribute_access_agree() -> None:
    from hookscope.callbacks import Doctor, MetricsLogger, ProgressBar
    from hookscope.callbacks.loggers.metrics import MetricsLogger as DefinedLogger

    assert hookscope.callbacks.Doctor is Doctor
    assert hookscope.callbacks.ProgressBar is ProgressBar
    assert MetricsLogger is DefinedLogger is hookscope.callbacks.loggers.MetricsLogger
    assert hookscope.viz is sys.modules["hookscope.viz"]
    assert hookscope.metrics is sys.modules["hookscope.metrics"]


def test_a_name_shadowed_by_its_submodule_stays_the_function() -> None:
    """``hs.viz.feature_maps`` is the function even after its module ``hookscope.viz.feature_maps`` loads."""
    out = run_python(
        """
        import hookscope.viz.feature_maps
        import hookscope as hs
        from hookscope.viz import feature_maps
        print(hs.viz.feature_maps is feature_maps, type(feature_maps).__name__)
        from hookscope.viz.save import save_figure
        print(hs.viz.save_figure is save_figure)
        """
    )
    assert out.split() == ["True", "function", "True"]


def test_the_readme_spellings_work_in_a_fresh_interpreter() -> None:
    """``hs.callbacks.X``, ``hs.viz.X`` and ``hs.metrics.X`` with nothing imported but ``hookscope``: the
    eager ``__init__`` used to load these subpackages as a side effect, and code relies on it."""
    out = run_python(
        """
        import hookscope as hs
        print(hs.callbacks.RunFolder.__name__, hs.callbacks.Doctor.__name__, hs.viz.feature_maps.__name__,
              hs.metrics.accuracy.__name__, hs.Learner.__name__)
        """
    )
    assert out.split() == ["RunFolder", "Doctor", "feature_maps", "accuracy", "Learner"]
