"""docs/architecture.md is a map that is true to the code: at most 250 lines, and every path, class and dotted name
it names exists.

Read from the source by AST (no module of grpokit is imported, so no torch): a path (``grpokit/...``, ``tests/...``,
``docs/...``, ``scripts/...``, a glob allowed) must exist; a CamelCase name must be a class of grpokit (``My...``
names a reader's own class in an example); ``module.name`` (``rollout.engines.ENGINES``, ``grpokit.`` optional)
must be a module of grpokit and a name defined at its top level; ``Class.name`` a class and a name in its body, its
grpokit bases' or one its methods set on ``self``; ``REGISTRY.name`` a module-level object and a name of its class;
``section.key`` a config key of that section; ``name()`` a function or class of grpokit.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "architecture.md"
MAX_LINES = 250
PATH = re.compile(r"(?<![\w./-])(?:grpokit|tests|docs|scripts|examples|bench)/[\w./*-]*")
SPAN = re.compile(r"`([^`\n]+)`")
CAMEL = re.compile(r"(?<![\w.])(?:[A-Z][a-z0-9]+[A-Z]|[A-Z]{2,}[a-z])\w*")
DOTTED = re.compile(r"(?<![\w./])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?![\w/])")
CALLED = re.compile(r"(?<![\w.])([a-z_]\w*)\(")
# the config's sections (grpokit/config/sections.py SECTIONS), for ``section.key``
SECTIONS = ("model", "data", "algo", "generation", "optim", "run", "eval", "lora", "distributed", "reward", "agent")


class Source:
    """What grpokit's source defines, read by AST: modules, classes (with their body's names and bases), top-level
    names of each module, and every function and class name."""

    def __init__(self, package: Path):
        self.modules: dict[str, ast.Module] = {}
        for path in sorted(package.rglob("*.py")):
            parts = path.relative_to(package.parent).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            self.modules[name] = ast.parse(path.read_text(), str(path))
        self.classes: dict[str, list[ast.ClassDef]] = {}
        self.callables: set[str] = set()
        for tree in self.modules.values():
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    self.classes.setdefault(node.name, []).append(node)
                if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.callables.add(node.name)
            for node in tree.body:  # a module-level alias of a function (register_loss = LOSSES.register)
                if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Attribute, ast.Name)):
                    self.callables.update(_bound(node))
        self.package = package.name

    def top_names(self, module: str) -> dict[str, ast.AST]:
        """The names bound at the top level of ``module`` (defined, assigned or imported), with their nodes."""
        names: dict[str, ast.AST] = {}
        for node in self.modules[module].body:
            for target in _bound(node):
                names[target] = node
        return names

    def class_names(self, cls: str, seen: frozenset = frozenset()) -> set[str]:
        """The names in the body of every grpokit class called ``cls`` and of its grpokit bases."""
        names: set[str] = set()
        for node in self.classes.get(cls, []):
            for item in node.body:
                names.update(_bound(item))
            for item in ast.walk(node):  # attributes its methods set: self.name = ...
                if isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store) and _is_self(item.value):
                    names.add(item.attr)
            for base in node.bases:
                base_name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
                if base_name in self.classes and base_name not in seen:
                    names |= self.class_names(base_name, seen | {cls})
        return names

    def exported(self, module: str) -> list[str]:
        """The names a package gives lazily (its ``__getattr__``): the literal keys of its ``_WHERE`` table or the
        strings of its ``__all__`` list."""
        names = []
        for node in self.modules[module].body:
            targets = _bound(node)
            if "_WHERE" in targets and isinstance(node.value, ast.Dict):
                names += [key.value for key in node.value.keys if isinstance(key, ast.Constant)]
            if "__all__" in targets and isinstance(node.value, (ast.List, ast.Tuple)):
                names += [item.value for item in node.value.elts if isinstance(item, ast.Constant)]
        return names

    def module_of(self, dotted: str) -> tuple[str, list[str]] | None:
        """The longest grpokit module ``dotted`` starts with, and the names after it."""
        parts = dotted.split(".")
        if parts[0] == self.package:
            parts = parts[1:]
        for end in range(len(parts), 0, -1):
            module = ".".join([self.package, *parts[:end]])
            if module in self.modules:
                return module, parts[end:]
        return None

    def resolves(self, dotted: str) -> bool:
        """Whether ``dotted`` names something grpokit defines, read any of the ways the module's docstring lists."""
        head, *rest = dotted.split(".")
        found = self.module_of(dotted)
        if found is not None and (head == self.package or head not in self.classes):
            module, names = found
            top = self.top_names(module) | dict.fromkeys(self.exported(module))
            if not names or (names[0] in top and (len(names) == 1 or self._attribute(top[names[0]], names))):
                return True
        if len(rest) != 1:
            return False
        if head in SECTIONS and rest[0] in self.class_names(_section_class(head)):
            return True
        if head in self.classes:
            return rest[0] in self.class_names(head)
        return any(  # REGISTRY.name: an object made at a module's top level, and a name of its class
            head in self.top_names(module) and self._attribute(self.top_names(module)[head], [head, *rest])
            for module in self.modules
        )

    def _attribute(self, node: ast.AST, names: list[str]) -> bool:
        """Whether ``names[1]`` is a name of ``names[0]``, bound at a module's top level by ``node``."""
        if len(names) != 2:
            return False
        imported_class = isinstance(node, (ast.Import, ast.ImportFrom)) and names[0] in self.classes
        if isinstance(node, ast.ClassDef) or imported_class:  # defined here, or a class imported here
            return names[1] in self.class_names(names[0])
        value = getattr(node, "value", None)
        if isinstance(node, ast.Assign) and isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            cls = value.func.id  # NAME = Registry(...): the names of its class
            return names[1] in self.class_names(cls) or names[1] in _builtin_names(cls)
        return False


def _bound(node: ast.AST) -> list[str]:
    if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(alias.asname or alias.name).split(".")[0] for alias in node.names]
    return []


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _builtin_names(cls: str) -> set[str]:
    """A registry is a dict: its dict methods count as its names."""
    return set(dir(dict)) if cls == "Registry" else set()


def _section_class(section: str) -> str:
    """The class of a config section, read from grpokit/config/sections.py's SECTIONS."""
    tree = ast.parse((REPO / "grpokit" / "config" / "sections.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "SECTIONS":
            for key, value in zip(node.value.keys, node.value.values, strict=True):
                if key.value == section:
                    return value.id
    raise AssertionError(f"no section {section!r} in grpokit/config/sections.py")


@cache
def grpokit_source() -> Source:
    return Source(REPO / "grpokit")


def missing(text: str, source: Source, root: Path = REPO) -> list[str]:
    """Every path, class and dotted name of ``text`` that does not exist, one line each."""
    found = []
    for path in sorted(set(PATH.findall(text))):
        path = path.rstrip(".")
        if not (list(root.glob(path.rstrip("/"))) if "*" in path else (root / path).exists()):
            found.append(f"path {path}")
    for span in SPAN.findall(text):
        code = PATH.sub("", span)  # its paths are checked above
        for name in CAMEL.findall(code):
            if not name.startswith("My") and name not in source.classes:
                found.append(f"class {name} (in `{span}`)")
        for dotted in DOTTED.findall(code):
            if not source.resolves(dotted):
                found.append(f"name {dotted} (in `{span}`)")
        for name in CALLED.findall(code):
            if not name.startswith("my_") and name not in source.callables:
                found.append(f"function {name} (in `{span}`)")
    return found


def test_the_map_is_short():
    lines = PAGE.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"docs/architecture.md has {len(lines)} lines; a map has at most {MAX_LINES}"


def test_everything_the_map_names_exists():
    found = missing(PAGE.read_text(), grpokit_source())
    assert not found, "docs/architecture.md names what the code does not have:\n" + "\n".join(found)


def test_the_check_catches_what_does_not_exist():
    """Planted stale names of each kind fail; their true forms pass (else the test above could not fail)."""
    source = grpokit_source()
    stale = (
        "grpokit/build/specs.py, `grpokit/rollout/vllm_settings.py`, `OptimSpec`, `compose.specs.optim_spec`, "
        "`rollout.engines.NO_SUCH`, `EngineEntry.no_field`, `ENGINES.no_method`, `generation.no_key`, "
        "`optim.engine`, `section_checks()`"
    )
    assert missing(stale, source) == [
        "path grpokit/build/specs.py",
        "path grpokit/rollout/vllm_settings.py",
        "class OptimSpec (in `OptimSpec`)",
        "name compose.specs.optim_spec (in `compose.specs.optim_spec`)",
        "name rollout.engines.NO_SUCH (in `rollout.engines.NO_SUCH`)",
        "name EngineEntry.no_field (in `EngineEntry.no_field`)",
        "name ENGINES.no_method (in `ENGINES.no_method`)",
        "name generation.no_key (in `generation.no_key`)",
        "name optim.engine (in `optim.engine`)",
        "function section_checks (in `section_checks()`)",
    ]
    true = (
        "grpokit/rollout/vllm/settings.py, grpokit/train/*settings*.py, `grpokit/commands/`, `VLLMSettings`, "
        "`grpokit.compose.specs.part_settings`, `rollout.engines.ENGINES`, `EngineEntry.own_sampler`, "
        "`ENGINES.register`, `generation.engine`, `optim.learning_rate`, `part_checks()`, `VisionPrompt.image_hashes`, "
        '`@ENGINES.register("mine", settings=MySettings)`, `my_check(settings)`, `data.prompt_column`'
    )
    assert missing(true, source) == []
