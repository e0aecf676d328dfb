"""The job ``maxtp bench`` times: ``FILE.py:FUNCTION`` or ``package.module:FUNCTION``.

Parsing a target is pure and cheap (the parent process checks it before starting anything);
loading it imports the user's code and calls the function, which happens only in the child
process that trains.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["BenchJob", "BenchTargetError", "Target", "check_function", "load_job", "parse_target"]

_JOB_KEYS = ("model", "datamodule", "train_dataloaders", "trainer_kwargs")
_EXAMPLE = "e.g. maxtp bench train.py:job or maxtp bench mypkg.jobs:job"


class BenchTargetError(ValueError):
    """A target that cannot be found, imported, called, or that returns no job (one line)."""


@dataclass(frozen=True)
class BenchJob:
    """The training job a target function returns (a dict with these keys works too).

    Attributes:
        model: The LightningModule to train.
        datamodule: A LightningDataModule, or ``None`` when ``train_dataloaders`` is given.
        train_dataloaders: What ``Trainer.fit`` takes as ``train_dataloaders``.
        trainer_kwargs: Further ``Trainer`` arguments (``callbacks``, ``precision``, ...). The
            bench sets the length of the fit, turns validation, logging and checkpoints off, and
            uses one device unless these say otherwise.
    """

    model: Any
    datamodule: Any = None
    train_dataloaders: Any = None
    trainer_kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    """A parsed target: where the function lives and its name."""

    text: str
    function: str
    path: Path | None = None
    """The file, for a ``FILE.py:FUNCTION`` target."""
    module: str | None = None
    """The module, for a ``package.module:FUNCTION`` target."""


def parse_target(text: str) -> Target:
    """Check a target's form and that its file exists; imports nothing.

    Args:
        text: ``FILE.py:FUNCTION`` (relative to the working directory) or
            ``package.module:FUNCTION``.

    Returns:
        The parsed target (a file's path made absolute).

    Raises:
        BenchTargetError: No colon, an empty side, a missing or non-``.py`` file, or a
            malformed module or function name.
    """
    where, sep, function = text.rpartition(":")
    if not sep or not where or not function:
        raise BenchTargetError(
            f"TARGET {text!r} must be FILE.py:FUNCTION or package.module:FUNCTION ({_EXAMPLE})"
        )
    if not function.isidentifier():
        raise BenchTargetError(f"TARGET {text!r}: {function!r} is not a Python function name")
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where)
        if path.suffix != ".py":
            raise BenchTargetError(
                f"TARGET {text!r}: {where!r} is not a .py file; give FILE.py:FUNCTION"
            )
        if not path.is_file():
            raise BenchTargetError(
                f"TARGET {text!r}: no file {where!r} (from {Path.cwd()}); give a path to a "
                ".py file, relative to where maxtp runs"
            )
        return Target(text, function, path=path.resolve())
    if not all(part.isidentifier() for part in where.split(".")):
        raise BenchTargetError(
            f"TARGET {text!r}: {where!r} is neither a .py file nor a module name ({_EXAMPLE})"
        )
    return Target(text, function, module=where)


def _import(target: Target) -> Any:
    if target.module is not None:
        try:
            return importlib.import_module(target.module)
        except ImportError as err:
            raise BenchTargetError(f"TARGET {target.text!r}: cannot import: {err}") from err
    assert target.path is not None
    # Its folder goes first on sys.path, as `python FILE.py` would put it, so the job file can
    # import the modules next to it; and it is imported under its own name, so classes defined
    # in it pickle into DataLoader workers that spawn (they import it by that name).
    sys.path.insert(0, str(target.path.parent))
    name = target.path.stem
    if not name.isidentifier() or name in sys.modules:
        name = f"_maxtp_bench_{name}"
    spec = importlib.util.spec_from_file_location(name, target.path)
    assert spec is not None and spec.loader is not None  # a .py file that exists always loads
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _call(target: Target, function: Callable[..., Any], config: str) -> Any:
    params = inspect.signature(function).parameters
    if "config" in params:
        return function(config=config)
    if config not in ("defaults", "maxtp"):
        raise BenchTargetError(_own_config_message(target, config))
    return function()


def check_function(target: Target, configs: tuple[str, ...]) -> None:
    """Before anything runs: a FILE target defines its function, taking ``config`` if needed.

    Reads the file's syntax tree only (nothing is imported); a function the tree does not show
    (made at import time, or imported with ``*``) is left to the child process to find.

    Args:
        target: A parsed target.
        configs: The configurations the run asks for.

    Raises:
        BenchTargetError: The file defines no such name, or the run names a configuration of
            its own and the function has no ``config`` parameter.
    """
    if target.path is None:
        return
    try:
        tree = ast.parse(target.path.read_bytes(), filename=str(target.path))
    except (SyntaxError, ValueError, OSError):
        return  # the child imports it and reports the error as Python words it
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            if any(a.name == "*" for a in node.names):
                return
            names.update({(a.asname or a.name).split(".")[0]: node for a in node.names})
        else:
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    names[sub.id] = node
    found = names.get(target.function)
    if found is None:
        raise BenchTargetError(
            f"TARGET {target.text!r}: {target.function} does not exist in {target.path}"
        )
    own = [c for c in configs if c not in ("defaults", "maxtp")]
    if own and isinstance(found, ast.FunctionDef):
        args = found.args
        params = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
        if "config" not in params and args.kwarg is None:
            raise BenchTargetError(_own_config_message(target, own[0]))


def _own_config_message(target: Target, config: str) -> str:
    return (
        f"TARGET {target.text!r}: --configs names {config!r}, which only a job function "
        f"with a `config` parameter can build; add `config: str` to {target.function}() or "
        "use the built-in configs defaults,maxtp"
    )


def load_job(target: Target, config: str = "defaults") -> BenchJob:
    """Import the target, call its function and check what it returns.

    The function gets ``config=<name>`` when it has a ``config`` parameter (so one job file can
    build several variants); errors raised while importing or calling it propagate.

    Args:
        target: A parsed target.
        config: The configuration this run times.

    Returns:
        The checked job.

    Raises:
        BenchTargetError: No such function, or it returned something that is not a job.
    """
    module = _import(target)
    function = getattr(module, target.function, None)
    if not callable(function):
        found = "is not callable" if function is not None else "does not exist"
        where = target.path or target.module
        raise BenchTargetError(f"TARGET {target.text!r}: {target.function} {found} in {where}")
    return as_job(_call(target, function, config), target.text)


def as_job(value: Any, where: str) -> BenchJob:
    """``value`` (a ``BenchJob`` or a dict of its fields) as a checked ``BenchJob``.

    Args:
        value: What the job function returned.
        where: The target, for messages.

    Returns:
        The job.

    Raises:
        BenchTargetError: A wrong type, unknown keys, no model, or neither or both data sources.
    """
    import lightning.pytorch as pl

    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(_JOB_KEYS))
        if unknown:
            raise BenchTargetError(
                f"TARGET {where!r} returned a dict with unknown key(s) {unknown}; the keys are "
                f"{', '.join(_JOB_KEYS)}"
            )
        if "model" not in value:
            raise BenchTargetError(f"TARGET {where!r} returned a dict without 'model'")
        value = BenchJob(**value)
    if not isinstance(value, BenchJob):
        raise BenchTargetError(
            f"TARGET {where!r} returned {type(value).__name__}; return a dict (or "
            "lightning_maxtp.bench.BenchJob) with 'model' and 'datamodule' or 'train_dataloaders'"
        )
    if not isinstance(value.model, pl.LightningModule):
        raise BenchTargetError(
            f"TARGET {where!r}: 'model' is a {type(value.model).__name__}, not a LightningModule"
        )
    if (value.datamodule is None) == (value.train_dataloaders is None):
        raise BenchTargetError(
            f"TARGET {where!r}: give exactly one of 'datamodule' and 'train_dataloaders'"
        )
    if not isinstance(value.trainer_kwargs, Mapping):
        raise BenchTargetError(
            f"TARGET {where!r}: 'trainer_kwargs' is a {type(value.trainer_kwargs).__name__}, "
            "not a dict"
        )
    return value
