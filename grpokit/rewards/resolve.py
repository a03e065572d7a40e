"""Built-in rewards by name, and turning a reward spec (Python or YAML) into a function.

A spec is one of:

- a callable following the contract in :mod:`grpokit.rewards.contract`;
- ``"accuracy"``: the name of a built-in (:data:`BUILTINS`);
- ``"package.module:function"``: a function imported from an installed module;
- ``"path/to/file.py:function"``: a function from a Python file, loaded by path;
- ``"path/to/folder"`` or ``"owner/model"``: a reward model, as TRL reads a string in ``reward_funcs``: an
  ``AutoModelForSequenceClassification`` with one output, loaded from the folder or the Hub id and scored as TRL
  scores it (:class:`~grpokit.rewards.judge.ClassifierReward`);
- a dict ``{"name": <any of the above>, "weight": 1.0, **params}``: params go to the built-in's
  constructor, or are bound to a user function with functools.partial;
- a dict ``{"url": ..., "format": ..., ...}``: a reward served over HTTP (:mod:`grpokit.rewards.remote`).

How a string is told apart (:func:`reward_kind`): a built-in's name first (a bare name is never a Hub id), then an
existing folder, then ``:`` (a function), then a slash (a Hub id); anything else is an unknown built-in.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# the built-in rewards: their modules register them in BUILTINS (rewards/registry.py)
import grpokit.rewards.code_reward
import grpokit.rewards.format
import grpokit.rewards.judge
import grpokit.rewards.length
import grpokit.rewards.math
import grpokit.rewards.molecule
import grpokit.rewards.remote  # noqa: F401
from grpokit.rewards.registry import BUILTINS
from grpokit.system.extensions import import_failure, module_file
from grpokit.system.paths import expand_path


def _unknown(kind: str, name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {kind} {name!r}{hint} Known: {', '.join(sorted(known))}"


def reward_kind(name: str) -> str:
    """How a reward string is read: ``"builtin"`` (a name in :data:`BUILTINS`, or an unknown bare name, which
    :func:`get_reward` refuses with a suggestion), ``"model"`` (an existing folder, or a Hub id ``owner/name``: TRL's
    reward model) or ``"function"`` (``module:function``, ``file.py:function``; a ``.py`` path without a function
    too, which :func:`resolve_reward` refuses naming the form)."""
    if name in BUILTINS:
        return "builtin"
    if Path(expand_path(name)).is_dir():
        return "model"
    if ":" in name or name.endswith(".py"):
        return "function"
    if "/" in name or "\\" in name:
        return "model"
    return "builtin"


def get_reward(name: str, **params: Any) -> Callable[..., list[float | None]]:
    """The built-in reward ``name`` configured with ``params``; ValueError for an unknown name."""
    if name not in BUILTINS:
        raise ValueError(_unknown("reward", name, list(BUILTINS)))
    try:
        return BUILTINS[name](**params)
    except TypeError as exc:
        raise ValueError(f"reward {name!r}: {exc}") from exc


class FileFunction:
    """A function from a Python file, loaded by path.

    It pickles as (path, function name), so worker processes load the file themselves: a
    function from a file loaded by path cannot be pickled by reference like a module's.
    """

    def __init__(self, path: str | Path, function: str):
        self.path = str(Path(expand_path(str(path))).resolve())
        self.function = function
        self.name = function
        self._fn: Callable | None = None
        self._load()

    def _load(self) -> Callable:
        if self._fn is None:
            self._fn = _function_from(_load_file(self.path), self.function, self.path)
        return self._fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._load()(*args, **kwargs)

    @property
    def __wrapped__(self) -> Callable:
        # inspect.signature follows this, so the loaded function's required columns can be checked
        return self._load()

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "function": self.function, "name": self.name, "_fn": None}

    def __repr__(self) -> str:
        return f"FileFunction({self.path!r}, {self.function!r})"


def _load_file(path: str):
    if not Path(path).is_file():
        raise FileNotFoundError(f"reward file not found: {path}")
    # One module per file path, registered so that dataclasses and pickling inside it work.
    module_name = "_grpokit_reward_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        del sys.modules[module_name]
        raise UserImportError(import_failure(exc, path)) from exc
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


class UserImportError(ValueError):
    """A user's file or module (a reward, a tool, an environment, a tool parser) raised while it was imported; the
    message is one line: where (file and line), the exception and its message."""


def _function_from(module: Any, function: str, where: str) -> Callable:
    fn = getattr(module, function, None)
    if fn is None:
        functions = [k for k, v in vars(module).items() if callable(v) and not k.startswith("_")]
        raise ValueError(_unknown(f"function in {where}:", function, functions))
    if not callable(fn):
        raise TypeError(f"{where}:{function} is a {type(fn).__name__}, not a function")
    return fn


def _load_target(target: str) -> Callable:
    """Resolve ``"module:function"`` or ``"file.py:function"``."""
    location, _, function = target.rpartition(":")
    if not location or not function:
        raise ValueError(f"reward {target!r}: expected 'module:function' or 'file.py:function'")
    if location.endswith(".py") or "/" in location or "\\" in location:
        return FileFunction(location, function)
    return _function_from(_import_module(location, f"reward {target!r}"), function, location)


def load_callable(target: str, what: str) -> Callable:
    """The object named by ``"module:name"`` or ``"path/to/file.py:name"`` (loaded now), for specs other than
    rewards (tools, environments); ``what`` names the setting in error messages."""
    location, _, name = target.rpartition(":")
    if not location or not name:
        raise ValueError(f"{what} {target!r}: expected 'module:name' or 'path/to/file.py:name'")
    if location.endswith(".py") or "/" in location or "\\" in location:
        path = str(Path(expand_path(location)).resolve())
        return _function_from(_load_file(path), name, path)
    return _function_from(_import_module(location, f"{what} {target!r}"), name, location)


def _import_module(location: str, what: str):
    """The installed module ``location``; a ValueError naming ``what`` when it is missing, or a
    :class:`UserImportError` when importing it raised (:func:`import_failure`)."""
    try:
        return importlib.import_module(location)
    except ImportError as exc:
        if exc.name is not None and (location + ".").startswith(exc.name + "."):  # it (or its package) is missing
            raise ValueError(f"{what}: cannot import module {location!r}: {exc}") from exc
        raise UserImportError(f"{what}: {import_failure(exc, module_file(location))}") from exc
    except (Exception, SystemExit) as exc:
        raise UserImportError(f"{what}: {import_failure(exc, module_file(location))}") from exc


def reward_name(fn: Callable) -> str:
    """A readable name for a reward function (metric keys use it)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__name__", None) or getattr(fn, "name", None)
    return name if isinstance(name, str) else type(fn).__name__


def resolve_reward(spec: Any, model_kwargs: Mapping[str, Any] | None = None) -> tuple[str, Callable, float]:
    """Turn a spec (see the module docstring) into ``(name, fn, weight)``. A reward model named by a string is
    returned as the loaded ``nn.Module`` (the runner wraps it to score as TRL does); ``model_kwargs`` go to its
    loading (:func:`~grpokit.rewards.judge.load_sequence_classifier`: ``device``, ``dtype``, ``trust_remote_code``)."""
    params: dict[str, Any] = {}
    weight = 1.0
    target = spec
    if isinstance(spec, Mapping):
        params = dict(spec)
        if "url" in params and params.get("name", "remote") == "remote":  # {url: ..., format: ...}: a remote reward
            params.pop("name", None)
            weight = float(params.pop("weight", 1.0))
            reward = get_reward("remote", **params)
            return reward.label, reward, weight
        if "name" not in params:
            raise ValueError(f"reward spec {dict(spec)!r} needs a 'name' key")
        target = params.pop("name")
        weight = float(params.pop("weight", 1.0))
    kind = reward_kind(target) if isinstance(target, str) else None
    if kind == "builtin":
        return target, get_reward(target, **params), weight
    if kind == "model":
        if params:
            raise ValueError(
                f"reward {target!r} is a reward model, scored as TRL scores it, and takes no parameters (got "
                f"{', '.join(sorted(params))}); for scoring options use {{name: reward_model, model: {target}, ...}}."
            )
        from grpokit.rewards.judge import load_sequence_classifier

        model = load_sequence_classifier(expand_path(target), **dict(model_kwargs or {}))
        return reward_name(model), model, weight
    if kind == "function":
        fn = _load_target(target)
    elif callable(target):
        fn = target
    else:
        raise TypeError(f"a reward spec is a callable, a string or a dict, got {type(target).__name__}")
    name = reward_name(fn)
    return name, functools.partial(fn, **params) if params else fn, weight
