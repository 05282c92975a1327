"""Text for ``optimus-train --version`` and ``--help``: every config key with its value and doc.

The docs are the ``#`` comments the schemas already carry (schema.py), so a field is
documented once, next to its default, and the help can never drift from the code.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import io
import platform
import sys
import textwrap
import tokenize
import typing
import weakref
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

TARGET_DOC = "import path of the class or function to build"
MAX_VALUE_CHARS = 40
# A very long key must not push every doc off the screen: past this, its doc just follows.
MAX_ALIGN = 56
_PRAGMAS = ("type:", "noqa", "pragma:", "pylint:", "fmt:", "isort:")

_docs_cache: weakref.WeakKeyDictionary[type, dict[str, str]] = weakref.WeakKeyDictionary()
_comments_cache: weakref.WeakKeyDictionary[type, dict[str, str]] = weakref.WeakKeyDictionary()


def _dist_version(name: str, module: str | None = None) -> str:
    # Package metadata first: it needs no import (torch takes a second to import).
    try:
        return version(name)
    except PackageNotFoundError:
        loaded = sys.modules.get(module or name)
        return str(getattr(loaded, "__version__", "unknown"))


def version_text() -> str:
    """``optimus-train 0.1.0 (torch 2.13.0+cpu, hydra-core 1.3.2, python 3.11.7)``."""
    # A source checkout that was never pip-installed has no metadata: use the package's own
    # __version__ (looked up, not imported, so this module never creates an import cycle).
    ours = _dist_version("optimus-preflight", "optimus_preflight")
    torch_version = _dist_version("torch")
    if torch_version == "unknown":
        import torch

        torch_version = torch.__version__
    return (
        f"optimus-train {ours} (torch {torch_version}, hydra-core {_dist_version('hydra-core', 'hydra')}, "
        f"python {platform.python_version()})"
    )


def _class_comments(cls: type) -> dict[str, str]:
    """Field name -> its comment, from the source of ``cls`` alone (no inheritance)."""
    if cls in _comments_cache:
        return _comments_cache[cls]
    comments: dict[str, str] = {}
    try:
        source = textwrap.dedent(inspect.getsource(cls))
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, tokenize.TokenError, IndentationError):
        # Built in a REPL, by make_dataclass, or from a .pyc only: no docs, not an error.
        _comments_cache[cls] = comments
        return comments
    by_line: dict[int, str] = {}
    code_lines: set[int] = set()
    for token in tokens:
        if token.type == tokenize.COMMENT:
            text = token.string.lstrip("#").strip()
            # Tool pragmas (type: ignore, noqa, ...) are not docs, but still mark the line as a comment.
            by_line[token.start[0]] = "" if text.startswith(_PRAGMAS) else text
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.update(range(token.start[0], token.end[0] + 1))
    class_def = next((node for node in tree.body if isinstance(node, ast.ClassDef)), None)
    for statement in class_def.body if class_def else ():
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        above: list[str] = []
        line = statement.lineno - 1
        # Only an unbroken run of comment-only lines belongs to the field: a blank line or
        # code in between means the comment is about something else.
        while line in by_line and line not in code_lines:
            above.append(by_line[line])
            line -= 1
        end = statement.end_lineno or statement.lineno
        trailing = [by_line[n] for n in range(statement.lineno, end + 1) if n in by_line]
        text = " ".join(part for part in [*reversed(above), *trailing] if part)
        if text:
            comments[statement.target.id] = text
    _comments_cache[cls] = comments
    return comments


def field_docs(dataclass_type: type) -> dict[str, str]:
    """One-line doc per field: ``metadata["help"]``, else the ``#`` comments above (or after)
    the field in the class that documents it (walking the MRO), else ""."""
    cls = dataclass_type if isinstance(dataclass_type, type) else type(dataclass_type)
    if not dataclasses.is_dataclass(cls):
        return {}
    if cls not in _docs_cache:
        docs: dict[str, str] = {}
        for item in dataclasses.fields(cls):
            doc = str(item.metadata.get("help", "") or "")
            # A subclass that redeclares a field (a new default) without a comment keeps the
            # base class's doc: the first class in the MRO with a comment wins.
            for klass in () if doc else cls.__mro__:
                if item.name in vars(klass).get("__annotations__", {}):
                    doc = _class_comments(klass).get(item.name, "")
                    if doc:
                        break
            docs[item.name] = " ".join(doc.split())
        _docs_cache[cls] = docs
    return dict(_docs_cache[cls])


def _field_type(cls: type | None, name: str) -> type | None:
    """The dataclass type of field ``name`` of ``cls`` (Optional[X] -> X), if it is one."""
    if cls is None or not dataclasses.is_dataclass(cls):
        return None
    try:
        hint = typing.get_type_hints(cls).get(name)
    except Exception:  # an annotation naming something the module does not import at runtime
        return None
    candidates = typing.get_args(hint) if typing.get_origin(hint) is typing.Union else (hint,)
    for candidate in candidates:
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
            return candidate
    return None


def _node_type(node: Any, fallback: type | None) -> type | None:
    try:
        typed = OmegaConf.get_type(node)
    except Exception:
        typed = None
    if isinstance(typed, type) and dataclasses.is_dataclass(typed):
        return typed
    return fallback


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, enum.Enum):  # overrides name enum members, as OmegaConf prints them
        return value.name
    text = str(value)
    # Plain when YAML (and so a command-line override) reads it back as the same string.
    try:
        plain = text.strip() == text and "\n" not in text and yaml.safe_load(text) == text
    except yaml.YAMLError:
        plain = False
    return text if plain else "'" + text.replace("'", "''") + "'"


def _compact(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_compact(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_compact(item) for item in value) + "]"
    return _scalar(value)


def _value_text(node: Any) -> str:
    """The node's value as the user would write it, interpolations left unresolved."""
    if node._is_missing():
        text = "???"
    elif node._is_interpolation():
        text = str(node._value())
    elif isinstance(node, (DictConfig, ListConfig)):
        text = "null" if node._is_none() else _compact(OmegaConf.to_container(node, resolve=False))
    else:
        text = _scalar(node._value())
    if len(text) <= MAX_VALUE_CHARS:
        return text
    # Cut the middle: an import path's package and its class name are the informative ends.
    head = (MAX_VALUE_CHARS - 3) // 2
    return text[:head] + "..." + text[-(MAX_VALUE_CHARS - 3 - head) :]


def _is_branch(node: Any) -> bool:
    return (
        isinstance(node, DictConfig)
        and not node._is_none()
        and not node._is_missing()
        and not node._is_interpolation()
        and len(node) > 0
    )


def _leaf_lines(node: DictConfig, prefix: str, cls: type | None) -> list[tuple[str, str]]:
    docs = field_docs(cls) if cls else {}
    lines: list[tuple[str, str]] = []
    for key in node.keys():
        child = node._get_node(key)
        path = f"{prefix}.{key}"
        if _is_branch(child):
            lines.extend(_leaf_lines(child, path, _node_type(child, _field_type(cls, str(key)))))
            continue
        doc = docs.get(str(key), "") or (TARGET_DOC if key == "_target_" else "")
        lines.append((f"{path} = {_value_text(child)}", doc))
    return lines


def config_help(cfg: DictConfig, schemas: dict[str, type]) -> str:
    """Every key of the composed ``cfg``, grouped by top-level node, with value and doc."""
    sections: list[tuple[str, list[tuple[str, str]]]] = []
    for group in cfg.keys():
        node = cfg._get_node(group)
        cls = _node_type(node, schemas.get(str(group)))
        heading = f"{group} ({cls.__name__}):" if cls else f"{group}:"
        if _is_branch(node):
            lines = _leaf_lines(node, str(group), cls)
        else:  # e.g. scheduler=none: the whole group is one value
            lines = [(f"{group} = {_value_text(node)}", "")]
        sections.append((heading, lines))
    width = min(MAX_ALIGN, max((len(left) for _, lines in sections for left, _ in lines), default=0))
    out: list[str] = []
    for heading, lines in sections:
        if out:
            out.append("")
        out.append(heading)
        out.extend(f"  {left:<{width}}   {doc}".rstrip() if doc else f"  {left}" for left, doc in lines)
    return "\n".join(out) + "\n"
