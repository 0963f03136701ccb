"""The one YAML reader for the files a user hands the library (data.yaml, ``--config``, ``--priors``).

:func:`safe_load` is ``yaml.safe_load`` (no ``!!python`` tags) with a bounded size: an alias bomb (a dozen lines of
anchors that expand to billions of items) is refused while it is composed, before anything is built or formatted.
Each alias counts, and so does the number of nodes the document would have with every alias expanded; a recursive
alias is refused too. Checkpoints are never YAML (they are torch files).
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.events import AliasEvent

from ssd.limits import MAX_YAML_ALIASES, MAX_YAML_NODES

__all__ = ["YAMLLimitError", "YAMLDuplicateKeyError", "safe_load"]


class YAMLLimitError(yaml.YAMLError):
    """A YAML document over :data:`ssd.limits.MAX_YAML_ALIASES` aliases or :data:`ssd.limits.MAX_YAML_NODES` nodes;
    ``problem_mark`` is where, as on PyYAML's own errors."""

    def __init__(self, message: str, mark: Any) -> None:
        super().__init__(message)
        self.problem_mark = mark


class YAMLDuplicateKeyError(yaml.YAMLError):
    """A mapping that holds one key twice (``{1: a, 1: b}``, or ``1`` and ``1.0``): PyYAML would keep the last value
    silently; ``problem_mark`` is the second key's place."""

    def __init__(self, message: str, mark: Any) -> None:
        super().__init__(message)
        self.problem_mark = mark


class _BoundedLoader(yaml.SafeLoader):
    """A ``SafeLoader`` that counts aliases and the expanded node count while composing."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._nodes = 0  # nodes of the document so far, every alias counted as the size of the node it names
        self._sizes: dict[int, int] = {}  # id(node) -> its expanded size, once the node is complete

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(AliasEvent):
            mark = self.peek_event().start_mark
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise YAMLLimitError(f"more than {MAX_YAML_ALIASES} aliases (*name) at line {mark.line + 1}: "
                                     "refused as a possible alias bomb (ssd.limits.MAX_YAML_ALIASES)", mark)
            node = super().compose_node(parent, index)
            if id(node) not in self._sizes:
                raise YAMLLimitError(f"recursive alias at line {mark.line + 1}: an anchor used inside itself", mark)
            self._count(self._sizes[id(node)], mark)
            return node
        start = self._nodes
        node = super().compose_node(parent, index)
        self._count(1, node.start_mark)
        self._sizes[id(node)] = self._nodes - start
        return node

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` overrides on purpose
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key: PyYAML's own error follows
                continue
            if first is not key_node:
                mark, spelled = key_node.start_mark, "" if first.value == key_node.value else f" as {first.value!r}"
                raise YAMLDuplicateKeyError(f"key {key_node.value!r} at line {mark.line + 1} is given twice (first at "
                                            f"line {first.start_mark.line + 1}{spelled}): only one value can be meant",
                                            mark)
        return super().construct_mapping(node, deep)

    def _count(self, nodes: int, mark: Any) -> None:
        self._nodes += nodes
        if self._nodes > MAX_YAML_NODES:
            raise YAMLLimitError(f"more than {MAX_YAML_NODES:,} values once its aliases are expanded (at line "
                                 f"{mark.line + 1}): refused as a possible alias bomb (ssd.limits.MAX_YAML_NODES)",
                                 mark)


def safe_load(stream: str | bytes | Any) -> Any:
    """Parse one YAML document like ``yaml.safe_load``, within the size bounds of :mod:`ssd.limits`.

    Raises:
        YAMLLimitError: (a ``yaml.YAMLError``) for too many aliases, too many expanded nodes or a recursive alias.
        YAMLDuplicateKeyError: (a ``yaml.YAMLError``) for a mapping that holds one key twice.
        yaml.YAMLError: for text that does not parse.
    """
    loader = _BoundedLoader(stream)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
