"""How flaxheads is built, checked: imports flow one way between the floors docs/architecture.md
describes, no module imports itself back through others, and every registry is one dict."""

from __future__ import annotations

import ast
import importlib
import pathlib


import flaxheads

PACKAGE = pathlib.Path(flaxheads.__file__).parent

FLOORS: dict[str, int] = {
    "problem": 0, "thresholds": 0, "atomic": 0, "version": 0, "shipped_model": 0, "compile_cache": 0,
    "host_memory": 0, "quiet_imports": 0, "names": 0, "notes": 0,
    "backbones": 1, "plotting": 1,
    "heads": 2, "lora": 2,
    "conversion": 3,
    "tokenizer": 4,
    "data": 5,
    "model": 6,
    "training": 7, "functional": 7,
    "inference": 8,
    "tasks": 9,
    "convert": 10, "study": 10, "benchmarks": 10, "serving": 10,
    "cli": 11,
    "__init__": 12, "launcher": 12,
}
"""The floor of each top-level module or package of flaxheads (docs/architecture.md). A module may
import its own package and strictly lower floors, never a floor above or another part of its own."""


def _module_name(file: pathlib.Path) -> str:
    parts = file.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_nodes(tree: ast.AST):
    """Every node of `tree` except those under `if TYPE_CHECKING:`, which never run."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def _imports(file: pathlib.Path, modules: set[str], this: str | None = None) -> set[str]:
    """The flaxheads modules `file` imports anywhere it runs: at module level, in functions, in
    methods (imports under `if TYPE_CHECKING:` only serve annotations)."""
    this = this or _module_name(file)
    package = this if file.name == "__init__.py" else this.rsplit(".", 1)[0]
    found = set()
    for node in _runtime_nodes(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                # `from flaxheads import conversion` imports the module flaxheads.conversion.
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {name for name in found if name in modules and name != this}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        stack.append(module)
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                return stack[stack.index(imported):] + [imported]
            if imported not in state and (cycle := visit(imported)):
                return cycle
        state[module] = "done"
        stack.pop()
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_flaxheads_modules_import_each_other_without_a_cycle():
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(f) for f in files}
    graph = {_module_name(f): _imports(f, modules) for f in files}
    assert "flaxheads.conversion.loading" in graph["flaxheads.model"]  # the parser sees imports

    cycle = _find_cycle(graph)

    assert cycle is None, " -> ".join(cycle)


def _part(module: str) -> str:
    """The floor-table entry a module belongs to: "flaxheads.training.step" -> "training"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_top_level_module_and_package_has_a_floor():
    parts = {path.stem if path.is_file() else path.name for path in PACKAGE.iterdir()
             if (path.suffix == ".py" or (path / "__init__.py").is_file())}

    assert parts == set(FLOORS), f"give each a floor in FLOORS and docs/architecture.md: {parts ^ set(FLOORS)}"


def test_no_module_imports_a_floor_above_its_own_or_beside_it():
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(f) for f in files}
    upward = []
    for file in files:
        this = _module_name(file)
        for imported in _imports(file, modules) | _package_imports(file):
            if _part(imported) != _part(this) and FLOORS[_part(imported)] >= FLOORS[_part(this)]:
                upward.append(f"{this} (floor {FLOORS[_part(this)]}) imports {imported} (floor {FLOORS[_part(imported)]})")

    assert not upward, "\n".join(upward)


def _package_imports(file: pathlib.Path) -> set[str]:
    """`import flaxheads` and `from flaxheads import X` where X is a name, not a module: both
    import the package's __init__, the top floor."""
    found = set()
    for node in _runtime_nodes(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(alias.name == "flaxheads" for alias in node.names):
            found.add("flaxheads")
        elif isinstance(node, ast.ImportFrom) and node.module == "flaxheads" and not node.level:
            for alias in node.names:
                if not (PACKAGE / f"{alias.name}.py").is_file() and not (PACKAGE / alias.name).is_dir():
                    found.add("flaxheads")
    return found


def test_the_floor_check_sees_an_upward_import(tmp_path):
    """The check above cannot pass vacuously: an import from training into the backbones is found."""
    file = PACKAGE / "backbones" / "encoder.py"
    modules = {_module_name(f) for f in PACKAGE.rglob("*.py")}
    probe = tmp_path / "probe.py"
    probe.write_text(file.read_text(encoding="utf-8") + "\nfrom flaxheads.training import step\n")

    found = {m for m in _imports(probe, modules, "flaxheads.backbones.encoder") if FLOORS[_part(m)] > FLOORS["backbones"]}

    assert found == {"flaxheads.training.step"}


def test_the_loader_imports_no_model_module():
    modules = {_module_name(f) for f in PACKAGE.rglob("*.py")}

    imported = _imports(PACKAGE / "conversion" / "loading.py", modules)

    assert not imported & {"flaxheads", "flaxheads.model", "flaxheads.convert", "flaxheads.inference"}, imported


def test_every_registry_is_one_dict_by_name():
    from flaxheads import conversion, heads
    from flaxheads.backbones import BACKBONES

    assert heads.HEAD_NAMES == tuple(heads.HEADS) and all(callable(b) for b in heads.HEADS.values())
    assert set(conversion.TABLES) == set(BACKBONES)
    assert list(conversion.WEIGHT_FORMATS) == ["pytorch", "flaxheads", "hf_flax"]




def test_the_package_imports_its_names_lazily_and_every_one_resolves():
    """`import flaxheads` loads no jax, flax, datasets, torch or transformers; each public name comes
    from the module `_EXPORTS` says, which the TYPE_CHECKING block (what editors read) lists too."""
    import subprocess
    import sys

    heavy = ("jax", "flax", "datasets", "torch", "transformers")
    code = f"import sys, flaxheads; print([m for m in {heavy!r} if m in sys.modules])"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"

    tree = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test))
    listed = {node.module: tuple(alias.name for alias in node.names) for node in block.body}
    assert listed == flaxheads._EXPORTS
    for name in flaxheads.__all__:
        assert getattr(flaxheads, name) is getattr(sys.modules[flaxheads._MODULE_OF.get(name, "flaxheads.version")], name)
    assert callable(flaxheads.pipeline) and flaxheads.pipeline.__module__ == "flaxheads.tasks.registry"


TASK_NAMES = {"text-classification", "token-classification", "multiple-choice", "question-answering",
              "sequence-classification", "token_classification", "multiple_choice", "question_answering"}
"""Every spelling a task's name has had, and transformers' pipeline names of the next ones."""
TASK_CONSTANTS = {"SEQUENCE_CLASSIFICATION", "TEXT_CLASSIFICATION", "TOKEN_CLASSIFICATION", "MULTIPLE_CHOICE",
                  "QUESTION_ANSWERING"}
TASK_CLASSES = {"SequenceClassifier", "TokenClassifier", "MultipleChoice", "ClassifierConfig",
                "TokenClassifierConfig", "MultipleChoiceConfig"}
TASK_ATTRIBUTES = {"is_choices", "words"}
"""Ways code once told one task's data from another's."""


def _names_in(node: ast.AST) -> set[str]:
    """The names, attribute names and string constants an expression holds (a tuple's too)."""
    found = set()
    for part in ast.walk(node):
        if isinstance(part, ast.Name):
            found.add(part.id)
        elif isinstance(part, ast.Attribute):
            found.add(part.attr)
        elif isinstance(part, ast.Constant) and isinstance(part.value, str):
            found.add(part.value)
    return found


def task_branches(source: str) -> list[str]:
    """Each place `source` tells tasks apart by name or type: a comparison with a task's name (a
    constant or a string), isinstance / issubclass with a task's model class, a test of
    `.is_choices` or `.words`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            named = set().union(*(_names_in(operand) for operand in (node.left, *node.comparators)))
            if named & (TASK_NAMES | TASK_CONSTANTS):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("isinstance", "issubclass") and len(node.args) == 2:
            if _names_in(node.args[1]) & TASK_CLASSES:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Attribute) and node.attr in TASK_ATTRIBUTES:
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_no_code_outside_the_tasks_branches_on_a_task():
    """Outside flaxheads/tasks/, nothing compares a task's name, tests a task's model class or asks
    which task's data it holds: what differs between tasks is asked of the task's `Task`."""
    outside = [f for f in sorted(PACKAGE.rglob("*.py")) if "tasks" not in f.relative_to(PACKAGE).parts]
    branches = {str(f.relative_to(PACKAGE)): found for f in outside
                if (found := task_branches(f.read_text(encoding="utf-8")))}

    assert not branches, branches


def test_the_task_branch_check_sees_each_kind_of_branch():
    probe = ("if task == TOKEN_CLASSIFICATION: pass\nif name in ('multiple-choice', 'x'): pass\n"
             "if isinstance(model, flaxheads.TokenClassifier): pass\nif data.is_choices: pass\n"
             "problem = problem_type == 'token_classification'\n")

    assert [line.split(":")[0] for line in task_branches(probe)] == ["line 1", "line 2", "line 3", "line 4", "line 5"]
    assert task_branches("if head == 'pooler': pass\nkind = TASKS[data.task]\n") == []


def test_the_library_imports_the_names_that_moved_to_a_task_from_its_task():
    """`flaxheads.data.MOVED` keeps documented names reachable as `flaxheads.data.<name>`; the
    library itself imports them from their task's module, so the data pipeline depends on no task."""
    from flaxheads import data

    used = []
    for file in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(file.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in data.MOVED and ast.unparse(node.value) in ("data", "flaxheads.data"):
                used.append(f"{file.relative_to(PACKAGE)}:{node.lineno} {ast.unparse(node)}")
            if isinstance(node, ast.ImportFrom) and node.module == "flaxheads.data":
                used += [f"{file.relative_to(PACKAGE)}:{node.lineno} {alias.name}" for alias in node.names
                         if alias.name in data.MOVED]

    assert not used, used
    for name, module in data.MOVED.items():
        assert getattr(data, name) is getattr(importlib.import_module(module), name)


def test_subpackages_are_attributes_of_the_package_imported_on_first_use():
    """`import flaxheads; flaxheads.data.load_builtin(...)` works (the README's quickstart, run by
    test_doc_examples.py), and `import flaxheads` alone imports none of them. Shown on modules that
    import no jax, so that the test stays quick."""
    import subprocess
    import sys

    code = ("import sys, flaxheads\n"
            "before = [m for m in ('flaxheads.names', 'flaxheads.training', 'jax') if m in sys.modules]\n"
            "print(before, flaxheads.names.TASKS[0], flaxheads.training.__name__, 'data' in dir(flaxheads), "
            "hasattr(flaxheads, 'no_such_module'), 'jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["[]", "text-classification", "flaxheads.training", "True", "False", "False"]
