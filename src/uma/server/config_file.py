"""The config file's two syntaxes, chosen by its extension: TOML (.toml), the first format
and in the standard library, and YAML (.yaml, .yml), the one the design brief writes. `load`
reads either into plain tables (config_shape reads their keys); `dump` writes settings back in
either, for `uma config --format`.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import yaml

from uma.errors import InvalidRequestError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

FORMATS = {".toml": "toml", ".yaml": "yaml", ".yml": "yaml"}
# Read as TOML: any other name, as config files were before YAML was read (a unit file may
# name one without an extension). Refused: formats a user may think are read.
REFUSED = (".json", ".ini", ".cfg")


class _Loader(yaml.SafeLoader):
    """safe_load's loader (plain data only) with two changes. Booleans are YAML 1.2's, true
    and false: YAML 1.1 also reads on/off/yes/no as booleans, which would turn the documented
    `flash_attn: off` and the brief's `http: off` into false, where TOML and the environment
    read them as the text they are. And a key given twice is an error, as in TOML, instead of
    the last one silently winning."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):  # other keys are refused by the parent
                key = self.construct_object(key_node)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)


_BOOL = "tag:yaml.org,2002:bool"
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))


def load(path: str | os.PathLike) -> dict[object, object]:
    """The file's top-level table, parsed as its extension says. Errors name the file (and the
    line, for a file that does not parse)."""
    ext = os.path.splitext(os.fspath(path))[1].lower()
    if ext in REFUSED:
        raise InvalidRequestError(
            f"config file {path}: {ext} is not a config format; give a .toml, .yaml or .yml "
            f"file (TOML or YAML)")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise InvalidRequestError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise InvalidRequestError(f"config file {path} is a directory") from None
    if FORMATS.get(ext, "toml") == "toml":
        try:
            return tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise InvalidRequestError(f"{path} is not valid TOML: {exc}") from None
    try:
        data = yaml.load(raw, Loader=_Loader)  # a SafeLoader: plain data, no objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f", line {mark.line + 1}" if mark is not None else ""
        begun = (f" ({exc.context} on line {exc.context_mark.line + 1})"
                 if exc.problem and exc.context and exc.context_mark else "")
        raise InvalidRequestError(f"{path}{line}: not valid YAML: "
                                  f"{exc.problem or exc.context}{begun}") from None
    except yaml.YAMLError as exc:  # bad encoding: no line to name
        raise InvalidRequestError(f"{path} is not valid YAML: {exc}") from None
    if data is None:
        return {}  # an empty file, or comments only: no settings
    if not isinstance(data, dict):
        raise InvalidRequestError(f"{path}: must be a mapping of settings, not "
                                  f"{type(data).__name__}")
    return data


@dataclass(frozen=True)
class Unwritten:
    """A value a file cannot hold (none; a secret), written as a comment: `# key = text`."""

    text: str


def as_written(value: object) -> object:
    """An effective setting as a file gives it: lists as their text ('editor=2,batch=0.5',
    '1,1,2'), as the setting is read; none as a comment."""
    if value is None or value == ():
        return Unwritten("none")
    if isinstance(value, tuple):
        return ",".join(f"{item[0]}={item[1]:g}" if isinstance(item, tuple) else f"{item:g}"
                        if isinstance(item, float) else str(item) for item in value)
    return value


def dump(tree: Mapping[str, object], fmt: str, notes: Mapping[str, str] | None = None) -> str:
    """Settings (tables of scalars, Unwritten) as a TOML or YAML file; notes[dotted path] is
    written as a comment after its value (where `uma config` found it)."""
    lines: list[str] = []
    (_toml if fmt == "toml" else _yaml)(tree, "", lines, notes or {})
    return "\n".join(lines) + "\n"


def _toml(tree: Mapping[str, object], prefix: str, lines: list[str],
          notes: Mapping[str, str]) -> None:
    scalars = [(k, v) for k, v in tree.items() if not isinstance(v, Mapping)]
    if prefix and scalars:
        lines.extend(([""] if lines else []) + [f"[{prefix[:-1]}]"])
    for key, value in scalars:
        lines.append(_line(f"{key} = ", value, "toml", notes.get(prefix + key)))
    for key, value in tree.items():
        if isinstance(value, Mapping):
            _toml(value, f"{prefix}{key}.", lines, notes)


def _yaml(tree: Mapping[str, object], prefix: str, lines: list[str],
          notes: Mapping[str, str]) -> None:
    pad = "  " * prefix.count(".")
    for key, value in tree.items():
        if isinstance(value, Mapping):
            lines.append(f"{pad}{key}:")
            _yaml(value, f"{prefix}{key}.", lines, notes)
        else:
            lines.append(pad + _line(f"{key}: ", value, "yaml", notes.get(prefix + key)))


def _line(head: str, value: object, fmt: str, note: str | None) -> str:
    if isinstance(value, Unwritten):
        return f"# {head}{value.text}" + (f"  ({note})" if note else "")
    return head + _scalar(value, fmt) + (f"  # {note}" if note else "")


def _scalar(value: object, fmt: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        text = "nan" if math.isnan(value) else ("-" if value < 0 else "") + "inf"
        return text if fmt == "toml" else text.replace("inf", ".inf").replace("nan", ".nan")
    if isinstance(value, (int, float)):
        return repr(value)
    # a JSON string is a TOML basic string and a YAML double-quoted one; always quoted, so
    # that "off" or "1,1,2" stays text whatever reads it
    return json.dumps(str(value), ensure_ascii=False)
