"""Names are data: the one check of a class name or a file name a user's files hold, and the one way to show one.

A dataset, a data YAML or a checkpoint can hold any text as a name. Printed as it is, an ESC, BEL or CR would clear
the screen or rewrite the lines before it, a bidirectional override would reorder what is read, and a lone surrogate
cannot be written as UTF-8 at all (a traceback far from the file that held it). Every reader checks its names with
:func:`name_problem` where it reads them (:mod:`ssd.data.rules` for a dataset's class names, :mod:`ssd.data.check`
for its image files, :func:`ssd.models.build.checked_class_names` for a checkpoint's or the caller's,
:class:`ssd.card.ModelCard` for an exported model's), and every
message shows a name through :func:`printable` (or ``repr``). An unknown name is answered with the closest known
ones (:func:`did_you_mean`).
"""

from __future__ import annotations

import difflib
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence

from ssd.limits import MAX_NAME_CHARS, value_text

__all__ = ["name_problem", "class_names_problem", "printable", "closest_names", "did_you_mean"]

_REFUSED = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})  # control, format, surrogate, line and paragraph separators
_JOINERS = frozenset({"\u200c", "\u200d"})  # zero-width (non-)joiners: part of writing some languages, and of emoji


def name_problem(name: str, max_chars: int | None = MAX_NAME_CHARS) -> str | None:
    """Why ``name`` cannot be used as it is, as a rule to append to the name in a message, or ``None`` when it can:
    a control or format character (Unicode categories Cc, Cf, Zl, Zp: ESC, BEL, CR, a bidirectional override; the
    zero-width joiners are allowed), a lone surrogate, or more than ``max_chars`` characters (``None``: no bound,
    for file names, which the file system bounds)."""
    if max_chars is not None and len(name) > max_chars:
        return f"is {len(name)} characters long: at most {max_chars} (ssd.limits.MAX_NAME_CHARS)"
    if name.isprintable():  # the common case, in C: no character of the refused categories
        return None
    for char in name:
        category = unicodedata.category(char)
        if category == "Cs":
            return f"holds a lone surrogate U+{ord(char):04X}, which is not text (it cannot be written as UTF-8)"
        if category in _REFUSED and char not in _JOINERS:
            what = unicodedata.name(char, "a control character")
            return (f"holds U+{ord(char):04X} ({what}), which would act on the terminal or the text around it instead "
                    "of being shown: rename it")
    return None


def class_names_problem(names: Sequence[object]) -> str | None:
    """Why ``names`` cannot name a model's classes (label ``k`` is ``names[k]``), as a message naming the entry, or
    ``None`` when they can: each a non-empty string without a :func:`name_problem`, all distinct."""
    for index, item in enumerate(names):
        if not isinstance(item, str) or not item.strip():
            return f"class_names[{index}] = {value_text(item)}: class names must be non-empty strings"
        if (problem := name_problem(item)) is not None:
            return f"class_names[{index}] = {value_text(item)} {problem}"
    duplicates = sorted(name for name, count in Counter(names).items() if count > 1)
    if duplicates:
        return f"class_names has duplicates {duplicates}: every class needs a distinct name"
    return None


def printable(text: str) -> str:
    """``text`` as it may be shown on a terminal or in a file: every character that is not printable (a control or
    format character, a lone surrogate, a line break) written as its escape (``\\x1b``, ``\\u202e``)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def closest_names(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    """Up to ``n`` names of ``known`` closest to ``name``: case-insensitive equals first, then difflib's."""
    known = [str(k) for k in known]
    name = str(name)
    same_case = [k for k in known if k.lower() == name.lower() and k != name]
    close = [k for k in difflib.get_close_matches(name, known, n=n, cutoff=0.5) if k not in same_case]
    return (same_case + close)[:n]


def did_you_mean(name: str, known: Iterable[str], n: int = 3) -> str:
    """``"; did you mean 'a', 'b'?"`` for the closest names, else ``"; valid: a, b, c"`` (every known name)."""
    known = [str(k) for k in known]
    close = closest_names(name, known, n)
    if close:
        return f"; did you mean {', '.join(map(repr, close))}?"
    return f"; valid: {', '.join(known)}"
