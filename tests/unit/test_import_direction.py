"""Imports between grpokit's modules follow the layers of docs/architecture.md ("Import direction").

An AST check over every grpokit/**.py: each import of another grpokit module (at module level or
inside a function, which is still a dependency) must go to a layer below the importing module's own.
No import is allow-listed: none against the layers is needed.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARCHITECTURE = REPO / "docs" / "architecture.md"
# algos is pure tensor math: torch and the standard library's math and typing helpers only.
ALGOS_MAY_IMPORT = {
    "__future__",
    "collections",
    "dataclasses",
    "functools",
    "importlib",
    "itertools",
    "math",
    "torch",
    "typing",
}
ALGOS_MAY_NOT_IMPORT = ("torch.distributed",)
# grpokit modules algos/ may import: the Registry every extension point shares (a dict with a look-up, no I/O)
ALGOS_MAY_IMPORT_OWN = ("grpokit.system.registry",)


def read_layers(markdown: str) -> list[list[str]]:
    """The layers of the fenced block after the ``import-layers`` marker, bottom first."""
    block = re.search(r"<!-- import-layers[^>]*-->\s*```text\n(.*?)```", markdown, re.DOTALL)
    assert block, "docs/architecture.md lost its import-layers block"
    lines = [line.split("--")[0] for line in block.group(1).splitlines() if line.strip()]
    return [[name.strip() for name in line.split(",") if name.strip()] for line in reversed(lines)]


def _unit(module: str, named: frozenset = frozenset()) -> str:
    """The layered name of a dotted module: ``pkg.train.learner`` -> ``train``; the root -> ``""``; a module the
    layers name on its own (``named``: ``trl.keys``) -> that name."""
    parts = module.split(".")
    if len(parts) > 2 and ".".join(parts[1:3]) in named:
        return ".".join(parts[1:3])
    return parts[1] if len(parts) > 1 else ""


def _imported(node: ast.AST, package: str, package_dir: Path) -> list[str]:
    """The modules of ``package`` an import statement imports (dotted names)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.split(".")[0] == package]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        if node.module == package:  # from pkg import x: a submodule, or a name of the root
            return [
                f"{package}.{alias.name}"
                if (package_dir / alias.name).is_dir() or (package_dir / f"{alias.name}.py").is_file()
                else package
                for alias in node.names
            ]
        if node.module.split(".")[0] == package:
            return [node.module]
    return []


def import_violations(package_dir: Path, layers: list[list[str]]) -> list[str]:
    """Every import in ``package_dir`` against ``layers`` (bottom first), as "file:line: a -> b (why)"."""
    package = package_dir.name
    level = {name: i for i, names in enumerate(layers) for name in names}
    named = frozenset(name for name in level if "." in name)
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        relative = path.relative_to(package_dir.parent)
        parts = relative.with_suffix("").parts
        source = _unit(".".join(parts[:-1] if parts[-1] == "__init__" else parts), named)
        where = relative.as_posix()
        if source == "":
            continue  # the root package: version and lazy accessors, above everything
        if source not in level:
            found.append(f"{where}: {source!r} is not in the import layers; place it in docs/architecture.md")
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for module in _imported(node, package, package_dir):
                target = _unit(module, named)
                if target in ("", source) or (source.startswith(target + ".") and module.count(".") == 1):
                    # the root, one's own unit, or the package of a separately layered module (its __init__)
                    continue
                if target not in level:
                    found.append(
                        f"{where}:{node.lineno}: {source} -> {target} ({target!r} is not in the import layers)"
                    )
                elif level[target] >= level[source]:
                    how = "sideways" if level[target] == level[source] else "up"
                    found.append(f"{where}:{node.lineno}: {source} -> {target} ({how}: {module})")
    return found


def algos_impurities(algos_dir: Path) -> list[str]:
    """Imports of algos/ beyond torch and the standard library's math and typing helpers."""
    found = []
    for path in sorted(algos_dir.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                own = module.startswith(f"{algos_dir.parent.name}.{algos_dir.name}") or module in ALGOS_MAY_IMPORT_OWN
                if not own and (top not in ALGOS_MAY_IMPORT or module.startswith(ALGOS_MAY_NOT_IMPORT)):
                    found.append(
                        f"{path.relative_to(algos_dir.parent.parent).as_posix()}:{node.lineno}: imports {module}"
                    )
    return found


def test_grpokit_imports_follow_the_layers():
    violations = import_violations(REPO / "grpokit", read_layers(ARCHITECTURE.read_text()))
    assert not violations, "imports against docs/architecture.md's layers:\n" + "\n".join(violations)


# The loop and everything in train/ run a built Run: they never import the builders, the config or the wrapper.
TRAIN_MAY_NOT_IMPORT = ("compose", "config", "trl")


def train_imports_above(package_dir: Path) -> list[str]:
    """Imports in ``package_dir``/train of the composition root, the config package or the TRL wrapper."""
    package = package_dir.name
    found = []
    for path in sorted((package_dir / "train").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for module in _imported(node, package, package_dir):
                if module.split(".")[1:2] and module.split(".")[1] in TRAIN_MAY_NOT_IMPORT:
                    found.append(f"{path.relative_to(package_dir.parent).as_posix()}:{node.lineno}: imports {module}")
    return found


def test_train_never_imports_the_builders_the_config_or_the_wrapper():
    found = train_imports_above(REPO / "grpokit")
    assert not found, "train/ runs a built Run; give it a spec from grpokit/compose/ instead:\n" + "\n".join(found)


def test_the_train_check_catches_a_lazy_config_import(tmp_path):
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "train/__init__.py": "",
            "train/loop.py": "def f():\n    from pkg.config import GRPOConfig\n    return GRPOConfig\n",
            "train/ok.py": "from pkg.algos import x\n",
        },
    )
    assert train_imports_above(package) == ["pkg/train/loop.py:2: imports pkg.config"]


def test_algos_stays_pure():
    impurities = algos_impurities(REPO / "grpokit" / "algos")
    assert not impurities, "algos/ is pure tensor math:\n" + "\n".join(impurities)


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root / "pkg"


LAYERS_MD = """
<!-- import-layers -->
```text
top                -- may import low
low, side          -- the bottom
```
"""


def test_the_check_reads_the_layers_bottom_first():
    assert read_layers(LAYERS_MD) == [["low", "side"], ["top"]]


def test_the_check_catches_planted_bad_imports(tmp_path):
    package = _package(
        tmp_path,
        {
            "__init__.py": "from pkg import top\n",  # the root may import anything
            "top.py": "import pkg.low\nfrom pkg import side\n",  # down: fine
            "low/__init__.py": "",
            "low/a.py": "import os\n\n\ndef lazy():\n    from pkg.top import thing\n    return thing\n",
            "side.py": "from pkg.low.a import lazy\nimport pkg\n",
            "extra.py": "x = 1\n",
        },
    )
    violations = import_violations(package, read_layers(LAYERS_MD))
    assert violations == [
        "pkg/extra.py: 'extra' is not in the import layers; place it in docs/architecture.md",
        "pkg/low/a.py:5: low -> top (up: pkg.top)",  # inside a function: still an edge
        "pkg/side.py:1: side -> low (sideways: pkg.low.a)",
    ]


def test_the_purity_check_catches_io_and_distributed(tmp_path):
    algos = _package(
        tmp_path,
        {
            "algos/__init__.py": "",
            "algos/ok.py": "import math\nimport torch\nfrom pkg.algos.ok import x\n",
            "algos/bad.py": "import torch.distributed as dist\nimport json\n",
        },
    )
    assert algos_impurities(algos / "algos") == [
        "pkg/algos/bad.py:1: imports torch.distributed",
        "pkg/algos/bad.py:2: imports json",
    ]


def distributed_imports_at_module_level(package_dir: Path) -> list[str]:
    """Module-level imports of ``package``.distributed outside that package: a single process never imports it
    (system/processes.py stands in), so the rest of the package imports it inside the functions that scale out.
    ``if TYPE_CHECKING:`` blocks are not run, so they are not counted."""
    package = package_dir.name
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        if path.relative_to(package_dir).parts[0] == "distributed":
            continue
        for node in _run_on_import(ast.parse(path.read_text(), str(path))):
            for module in _imported(node, package, package_dir):
                if module == f"{package}.distributed" or module.startswith(f"{package}.distributed."):
                    found.append(f"{path.relative_to(package_dir.parent).as_posix()}:{node.lineno}: {module}")
    return found


def _run_on_import(node: ast.AST):
    """The nodes under ``node`` that run when the module is imported: not function bodies, not ``if
    TYPE_CHECKING:`` blocks."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            yield from _run_on_import(ast.Module(body=child.orelse, type_ignores=[]))
            continue
        yield child
        yield from _run_on_import(child)


def test_only_the_scale_out_code_imports_distributed_and_only_when_it_runs():
    """The fast form of tests/integration/test_single_process.py's check (a refactor that imported
    grpokit.distributed at module level in train/experience/ once failed only there)."""
    found = distributed_imports_at_module_level(REPO / "grpokit")
    assert not found, "import grpokit.distributed inside the function that scales out:\n" + "\n".join(found)


def test_the_distributed_check_catches_a_module_level_import(tmp_path):
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "distributed/__init__.py": "import pkg.distributed.dist\n",  # its own package: fine
            "train/__init__.py": "",
            "train/bad.py": "from pkg.distributed.partial import wait\n",
            "train/lazy.py": "def f():\n    from pkg.distributed import dist\n    return dist\n",
            "train/typed.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    import pkg.distributed\n",
            "train/classy.py": "class A:\n    def f(self):\n        import pkg.distributed\n\n"
            "    import pkg.distributed.x\n",
        },
    )
    assert distributed_imports_at_module_level(package) == [
        "pkg/train/bad.py:1: pkg.distributed.partial",
        "pkg/train/classy.py:5: pkg.distributed.x",  # a class body runs on import
    ]
