"""The YAML layer of suites: a bounded read, a YAML 1.2-float safe loader that composes nodes, and
`Doc`, the plain values of a suite with the line of every field path (kdtr.bundle.spec validates them)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ..errors import SpecError

MAX_SPEC_BYTES = 8 << 20          # a suite larger than this is refused unread
MAX_DEPTH = 64                    # nesting of YAML collections (also stops recursive aliases)
MAX_NODES = 1_000_000             # nodes visited, aliases expanded ("billion laughs" guard)

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_NULL_TAG = "tag:yaml.org,2002:null"

# YAML 1.2's float syntax: PyYAML's YAML 1.1 pattern needs a dot, so `1e-5` would be a string.
_FLOAT_RE = re.compile(r"""^(?:
      [-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    | [-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    | [-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    | [-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    | [-+]?\.(?:inf|Inf|INF)
    | \.(?:nan|NaN|NAN)
    )$""", re.X)


class _Loader(yaml.SafeLoader):
    """SafeLoader with the YAML 1.2 float pattern; used only to compose nodes and build scalars."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, _FLOAT_RE if tag == _FLOAT_TAG else regexp) for tag, regexp in resolvers]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}

def read_suite_bytes(path: Path) -> bytes:
    if path.exists() and not path.is_file():     # a FIFO or a device would block or never end
        raise SpecError("cannot read suite: not a regular file", file=path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SPEC_BYTES + 1)
    except OSError as e:
        raise SpecError(f"cannot read suite: {e.strerror or e}", file=path) from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(f"suite is larger than {MAX_SPEC_BYTES} bytes", file=path)
    return data


def decode_suite(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise SpecError(f"not UTF-8: byte 0x{data[e.start]:02x} at offset {e.start}",
                        file=path, line=line) from None


class Doc:
    """Plain Python values built from the node tree, plus the line of every field path."""

    def __init__(self, path: Path, text: str):
        self.path = path
        self.lines: dict[str, int] = {}       # field path -> line of its value node
        self.key_lines: dict[str, int] = {}   # field path -> line of its key
        self._nodes = 0
        try:
            loader = _Loader(text)
        except yaml.reader.ReaderError as e:     # a character YAML does not allow
            raise SpecError(f"YAML error: character #x{e.character:04x} is not allowed",
                            file=path, line=text[:e.position].count("\n") + 1) from None
        try:
            node = loader.get_single_node()
            if node is None or (isinstance(node, ScalarNode) and node.value == ""
                                and node.tag == _NULL_TAG):       # nothing, or a bare `---`
                raise SpecError("empty suite (expected a mapping with `op` and `cases` or `sweep`)",
                                file=path, line=1)
            self.root = self._walk(loader, node, "", 0)
        except yaml.MarkedYAMLError as e:
            raise self._yaml_error(e) from None
        finally:
            loader.dispose()

    # errors ---------------------------------------------------------------------------------
    def line(self, field: str) -> int:
        """The line that names `field`: its key's line, else (a list item) its value's."""
        while True:
            found = self.key_lines.get(field) or self.lines.get(field)
            if found or not field:
                return found or 1
            field = re.sub(r"(\.[^.\[\]]*|\[\d+\])$", "", field)

    def error(self, field: str, message: str) -> SpecError:
        return SpecError(message, file=self.path, line=self.line(field), field=field or None)

    def _yaml_error(self, e: yaml.MarkedYAMLError) -> SpecError:
        mark = e.problem_mark or e.context_mark
        parts = [p for p in (e.context, e.problem) if p]
        message = "YAML error: " + ", ".join(parts)
        if "'\\t'" in (e.problem or ""):      # PyYAML writes the character with %r
            message += " (YAML forbids tabs for indentation; use spaces)"
        return SpecError(message, file=self.path, line=mark.line + 1 if mark else None)

    # walking --------------------------------------------------------------------------------
    def _guard(self, node: Node, field: str, depth: int) -> None:
        self._nodes += 1
        if depth > MAX_DEPTH or self._nodes > MAX_NODES:
            limit = f"deeper than {MAX_DEPTH} levels" if depth > MAX_DEPTH else \
                f"more than {MAX_NODES} nodes"
            raise SpecError(f"suite is {limit} (recursive or exploding aliases?)",
                            file=self.path, line=node.start_mark.line + 1, field=field or None)

    def _scalar(self, loader: _Loader, node: ScalarNode, field: str) -> Any:
        try:
            return loader.construct_object(node, deep=True)
        except (yaml.constructor.ConstructorError, ValueError) as e:   # unknown tag, month 13...
            reason = e.problem if isinstance(e, yaml.MarkedYAMLError) else e
            raise SpecError(f"bad scalar {node.value!r}: {reason}", file=self.path,
                            line=node.start_mark.line + 1, field=field or None) from None

    def _walk(self, loader: _Loader, node: Node, field: str, depth: int) -> Any:
        self._guard(node, field, depth)
        self.lines[field] = node.start_mark.line + 1
        if isinstance(node, ScalarNode):
            return self._scalar(loader, node, field)
        if node.tag not in (_MAP_TAG, _SEQ_TAG):
            raise self.error(field, f"unsupported YAML tag {node.tag!r}")
        if isinstance(node, SequenceNode):
            return [self._walk(loader, item, f"{field}[{i}]", depth + 1)
                    for i, item in enumerate(node.value)]
        return self._mapping(loader, node, field, depth)

    def _mapping(self, loader: _Loader, node: MappingNode, field: str, depth: int) -> dict:
        self._guard(node, field, depth)
        out: dict[Any, Any] = {}
        for source in reversed(self._merge_sources(node, field)):   # earlier sources win
            out.update(self._mapping(loader, source, field, depth + 1))
        explicit: dict[Any, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            if not isinstance(key_node, ScalarNode):
                raise SpecError("mapping keys must be plain scalars", file=self.path,
                                line=key_node.start_mark.line + 1, field=field or None)
            sub_hint = f"{field}.{key_node.value}" if field else key_node.value
            key = self._scalar(loader, key_node, sub_hint)
            sub = f"{field}.{key}" if field else str(key)
            line = key_node.start_mark.line + 1
            if key in explicit:
                raise SpecError(f"duplicate key {key!r} (first at line {explicit[key]})",
                                file=self.path, line=line, field=sub)
            explicit[key] = line
            self.key_lines[sub] = line
            out[key] = self._walk(loader, value_node, sub, depth + 1)
        return out

    def _merge_sources(self, node: MappingNode, field: str) -> list[MappingNode]:
        sources: list[MappingNode] = []
        for key_node, value_node in node.value:
            if key_node.tag != _MERGE_TAG:
                continue
            items = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
            for item in items:
                if not isinstance(item, MappingNode):
                    raise SpecError("a merge key `<<` takes a mapping or a list of mappings",
                                    file=self.path, line=item.start_mark.line + 1, field=field or None)
                sources.append(item)
        return sources
