"""Each part takes only its own settings: only the config package and the composition root read GRPOConfig.

The flat GRPOConfig facade is for users, YAML and TRL scripts. Inside grpokit the composition root
(the grpokit/compose/ package) reads it and hands each part a typed, frozen spec (or the one
config section it needs); every other module must not read a facade field. This test walks the AST of every module
of grpokit/ and reports each read outside the exempt modules below.

What counts as a read (see ``facade_reads``): an attribute access (load or store) or a ``getattr`` on

- a name bound to a GRPOConfig: a parameter annotated with a type that names GRPOConfig, a name assigned from
  ``GRPOConfig(...)``, ``load_config(...)``, a ``.replace(...)`` of a bound name or a bound name, and ``self.x`` /
  ``obj.x`` attributes assigned from one in the same class: any attribute;
- a conventionally named config (``args``, ``cfg``, ``config``, and ``self.args`` / ``self.cfg`` / ``self.config``)
  that is not known to be something else (a parameter annotated with another type, ``self.x`` assigned from one,
  or a name assigned from either): an attribute (or ``getattr`` constant) that is one of the facade's fields,
  aliases, sections, methods or TRL keys.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from shared_helpers import tiny_args

import grpokit
import grpokit.config.trl_keys as trl_keys
from grpokit.config import ALIASES, FIELD_SECTION, SECTIONS, GRPOConfig

ROOT = Path(grpokit.__file__).parent

# Modules that may read the facade, and why. Everything else gets its settings from a spec.
EXEMPT = {
    "config/": "the facade itself: its sections, loading, validation, rules and reference",
    "compose/": "the composition root: each part's typed, frozen spec and every part, built from the user's config",
    "commands/": "the command line is a user of the facade, as a script is: it loads the YAML and the overrides, sets "
    "what its command says (eval: the final model, the eval folder) and hands the object to GRPOTrainer; `grpokit "
    "explain` prints the resolved config and the sizes it implies: the whole config is its subject",
    "doctor/": "`grpokit doctor` checks a whole setup before a run (prompt lengths, the model's files): the config is "
    "its subject, as explain's",
    "compose/memory.py": "the memory estimate of a config and of its what-if variants (cfg.replace(...): a smaller "
    "micro-batch, LoRA, ...) for `grpokit explain` and the root's fit warning",
}

CONVENTIONAL = {"args", "cfg", "config", "settings"}
# Everything a GRPOConfig answers: fields, aliases, sections, methods and TRL's keys.
FACADE_ATTRS = (
    set(FIELD_SECTION)
    | set(ALIASES)
    | set(SECTIONS)
    | {name for name in dir(GRPOConfig) if not name.startswith("_")}
    | {"rewards", "trl_settings", "unused_trl_settings"}
    | set(trl_keys.TRL_DEFAULTS)
)
CONSTRUCTORS = {"GRPOConfig", "load_config"}


def _names_facade(annotation: ast.expr | None) -> bool | None:
    """True: the annotation names GRPOConfig; False: another type; None: no annotation (or Any / object)."""
    if annotation is None:
        return None
    text = ast.unparse(annotation)
    if "GRPOConfig" in text:
        return True
    return None if text.strip("'\"") in ("Any", "object") else False


def _key(node: ast.expr) -> str | None:
    """``name`` or ``base.attr`` (one level, e.g. ``self.args``) as a key, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return None


class _Scope:
    def __init__(self, parent: _Scope | None = None):
        self.bound = set(parent.bound) if parent else set()  # keys bound to a GRPOConfig
        self.safe = set(parent.safe) if parent else set()  # conventional keys known to be something else

    def is_facade(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in CONSTRUCTORS:
                return True
            if isinstance(func, ast.Attribute) and func.attr in CONSTRUCTORS:
                return True
            return isinstance(func, ast.Attribute) and func.attr == "replace" and self.is_facade(func.value)
        if isinstance(node, ast.BoolOp):  # args or GRPOConfig()
            return any(self.is_facade(v) for v in node.values)
        key = _key(node)
        return key is not None and key in self.bound

    def suspect(self, node: ast.expr) -> bool:
        key = _key(node)
        if key is None or key in self.safe:
            return False
        return key in CONVENTIONAL or (key.startswith("self.") and key[5:] in CONVENTIONAL)


def _pairs(target: ast.expr, value: ast.expr):
    """The (target, value) pairs an assignment of ``value`` to ``target`` binds: a tuple unpacked pairwise."""
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
        return zip(target.elts, value.elts)
    return [(target, value)]


def _class_attrs(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(``self.x`` keys assigned a GRPOConfig somewhere in a class, ``self.x`` keys assigned from a parameter
    annotated with another type)."""
    bound, safe = set(), set()
    for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        scope = _Scope()
        for arg in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]:
            kind = _names_facade(arg.annotation)
            (scope.bound if kind else scope.safe if kind is False else set()).add(arg.arg)
        for node in ast.walk(fn):
            if not isinstance(node, ast.Assign):
                continue
            for t, v in (pair for target in node.targets for pair in _pairs(target, node.value)):
                key = _key(t)
                if key is None or not key.startswith("self."):
                    continue
                if scope.is_facade(v):
                    bound.add(key)
                elif isinstance(v, ast.Name) and v.id in scope.safe:
                    safe.add(key)
    return bound, safe - bound


def facade_reads(source: str) -> list[str]:
    """``line: expression`` of every facade read in a module's ``source`` (see the module docstring)."""
    tree = ast.parse(source)
    class_bound, class_safe = _class_attrs(tree)
    found: list[str] = []

    def visit(node: ast.AST, scope: _Scope) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inner = _Scope(scope)
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if arg is None:
                    continue
                kind = _names_facade(arg.annotation)
                inner.bound.discard(arg.arg)
                inner.safe.discard(arg.arg)
                if kind:
                    inner.bound.add(arg.arg)
                elif kind is False:
                    inner.safe.add(arg.arg)
            for child in ast.iter_child_nodes(node):
                visit(child, inner)
            return
        if isinstance(node, ast.Assign):
            visit(node.value, scope)
            for target in node.targets:
                for t, v in _pairs(target, node.value):
                    key = _key(t)
                    if key is not None and not key.startswith("self."):
                        if scope.is_facade(v):
                            scope.bound.add(key)
                        else:
                            scope.bound.discard(key)
                            if _key(v) in scope.safe:  # cfg = self.cfg, a spec
                                scope.safe.add(key)
                visit(target, scope)
            return
        if isinstance(node, ast.Attribute):
            base = node.value
            if scope.is_facade(base) or (scope.suspect(base) and node.attr in FACADE_ATTRS):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr"):
            named = node.args[1:2] and isinstance(node.args[1], ast.Constant) and node.args[1].value in FACADE_ATTRS
            if node.args and (scope.is_facade(node.args[0]) or (scope.suspect(node.args[0]) and named)):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    top = _Scope()
    top.bound |= class_bound
    top.safe |= class_safe
    visit(tree, top)
    return found


def _exempt(path: Path) -> bool:
    rel = path.relative_to(ROOT).as_posix()
    return any(rel == key or (key.endswith("/") and rel.startswith(key)) for key in EXEMPT)


def test_only_the_config_package_and_the_composition_root_read_the_facade():
    reads = {}
    for path in sorted(ROOT.rglob("*.py")):
        if not _exempt(path):
            found = facade_reads(path.read_text())
            if found:
                reads[path.relative_to(ROOT).as_posix()] = found
    assert not reads, (
        "these modules read the GRPOConfig facade; give the part a spec built in grpokit/compose/specs.py instead:\n"
        + "\n".join(f"  {module}: {'; '.join(lines)}" for module, lines in reads.items())
    )


def test_every_exemption_names_a_module_that_exists():
    for key in EXEMPT:
        assert (ROOT / key).exists(), key


def test_the_check_finds_planted_reads():
    planted = textwrap.dedent(
        """
        from grpokit.config import GRPOConfig, load_config

        def typed(args: GRPOConfig):
            return args.beta                      # 5: a parameter annotated GRPOConfig

        def optional(cfg: "GRPOConfig | None" = None):
            cfg = cfg or GRPOConfig()
            return cfg.to_dict()                  # 9: any attribute of a bound name

        def untyped(config):
            return config.num_generations         # 12: a conventional name, a field

        def loaded(path):
            settings = load_config(path)
            other = settings.replace(beta=0.1)    # 16: a method is an attribute too
            return getattr(other, "seed")         # 17: getattr on a copy

        class Part:
            def __init__(self, args: GRPOConfig):
                self.args = args

            def run(self):
                return self.args.max_steps        # 24: self.x assigned a GRPOConfig

        def wider(args):
            args.resume_from = "latest"           # 27: a store counts too
        """
    )
    lines = [int(read.split(":")[0]) for read in facade_reads(planted)]
    assert lines == [5, 9, 12, 16, 17, 24, 27]


def test_the_check_leaves_specs_and_other_objects_alone():
    clean = textwrap.dedent(
        """
        import argparse
        from grpokit.config import GRPOConfig

        def spec_read(cfg: LearnerSpec):
            return cfg.beta, cfg.temperature

        class Part:
            def __init__(self, spec: StopSpec, args: Any = None):
                self.cfg = spec
                self.args = args              # the user's object, forwarded unread

            def check(self):
                return self.cfg.max_kl, self.args

        def model_config(model):
            config = model.config
            return config.hidden_size        # not a facade attribute

        def command(args: argparse.Namespace):
            return args.output_dir           # typed as something else

        def forward(args: GRPOConfig, build):
            return build(args)               # passing the object on is not reading it
        """
    )
    assert facade_reads(clean) == []


# Where a real run may read the facade: the config package, the composition root, and the memory estimate the root
# asks for (exempt above). The TRL wrapper only holds the config (trainer.args); it never reads it.
RUN_READERS = ("config/", "compose/")


def test_a_two_step_run_reads_the_facade_only_from_the_config_and_the_build(tmp_path, monkeypatch):
    """Every attribute read of a GRPOConfig during a 2-step run through the Python API (building the trainer,
    training, evaluating), recorded with the grpokit module that read it: only the config package and the build
    package (and the memory estimate they call) read it."""
    import sys

    from grpokit import GRPOTrainer
    from grpokit.testing import build_tiny_causal_lm, build_word_tokenizer

    words = [f"w{i}" for i in range(12)]
    tokenizer = build_word_tokenizer(words)
    build_tiny_causal_lm(tmp_path / "model", tokenizer, arch="llama", hidden_size=16, num_layers=1, num_heads=2)
    rows = [{"prompt": " ".join(words[i : i + 3])} for i in range(8)]
    readers: dict[str, set[str]] = {}
    plain = object.__getattribute__

    def recording(self, name):
        caller = sys._getframe(1).f_code.co_filename
        if caller.startswith(str(ROOT)):
            readers.setdefault(Path(caller).relative_to(ROOT).as_posix(), set()).add(name)
        return plain(self, name)

    args = tiny_args(tmp_path / "run", num_generations=2, max_completion_length=3, save_strategy="no")
    monkeypatch.setattr(GRPOConfig, "__getattribute__", recording)
    reward = lambda completions, **kw: [float(len(c)) for c in completions]
    trainer = GRPOTrainer(str(tmp_path / "model"), reward, args=args, train_dataset=rows)
    trainer.train_dataset  # noqa: B018  (TRL's attribute: a read of the Run, not of the config)
    trainer.train()
    trainer.evaluate(eval_dataset=rows[:2])
    monkeypatch.undo()
    outside = {module: sorted(names) for module, names in readers.items() if not module.startswith(RUN_READERS)}
    assert any(m.startswith("compose/") for m in readers), f"the recording missed the builders: {sorted(readers)}"
    assert not outside, f"read the GRPOConfig facade outside config/ and compose/: {outside}"
