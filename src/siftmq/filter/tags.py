"""TAG subscriptions, parsed exactly as RocketMQ's ``FilterAPI.buildSubscriptionData``.

``None``, ``""`` and exactly ``"*"`` subscribe to every message. Anything else is split on ``||``
(Java ``String.split`` drops trailing empty pieces), each piece is trimmed of characters up to
U+0020 and empty pieces are dropped. A text that splits into zero pieces (``"||"``) is an error.

The store compares the Java ``String.hashCode`` of a message's tag (kept in the ConsumeQueue entry)
with :attr:`TagFilter.codes` — a cheap check that can give false positives — and the broker then
compares the tag string itself (:meth:`TagFilter.matches_tag`), so no collision reaches a consumer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from siftmq.errors import FilterSyntaxError
from siftmq.filter.javalang import JAVA_TRIM
from siftmq.hashing import java_string_hash, to_int32

__all__ = ["SUB_ALL", "TagFilter", "java_string_hash", "to_int32"]

SUB_ALL: Final = "*"
_SPLIT: Final = re.compile(r"\|\|")


@dataclass(frozen=True, slots=True)
class TagFilter:
    """A parsed TAG subscription: the tag set and the set of their hash codes."""

    text: str
    sub_all: bool
    tags: frozenset[str]
    codes: frozenset[int]

    @classmethod
    def parse(cls, text: str | None) -> TagFilter:
        if text is None or text == "" or text == SUB_ALL:
            return cls(SUB_ALL, True, frozenset(), frozenset())
        if not isinstance(text, str):
            raise TypeError(f"tag expression must be str, got {type(text).__name__}")
        pieces = _SPLIT.split(text)
        while pieces and pieces[-1] == "":
            pieces.pop()
        if not pieces:
            raise FilterSyntaxError(
                "tag expression splits into no tags (RocketMQ: subString split error)",
                expression=text,
                start=0,
                end=len(text),
            )
        tags = []
        for piece in pieces:
            tag = piece.strip(JAVA_TRIM)
            if tag:
                tags.append(tag)
        tag_set = frozenset(tags)
        return cls(text, False, tag_set, frozenset(java_string_hash(t) for t in tag_set))

    @classmethod
    def of_tags(cls, tags: Iterable[str]) -> TagFilter:
        """The filter that keeps exactly the messages tagged with one of ``tags`` (none: no message)."""
        tag_set = frozenset(tags)
        filt = cls("", False, tag_set, frozenset(java_string_hash(t) for t in tag_set))
        return cls(filt.normalized(), False, tag_set, filt.codes)

    def matches_code(self, tags_code: int | None) -> bool:
        """The index check: may a message whose ConsumeQueue entry holds ``tags_code`` match?"""
        if self.sub_all or tags_code is None:
            return True
        return to_int32(tags_code) in self.codes

    def matches_tag(self, tag: str | None) -> bool:
        """The exact check on the message's tag string."""
        if self.sub_all:
            return True
        return tag is not None and tag in self.tags

    def normalized(self) -> str:
        """One text per tag set, which :meth:`parse` reads back as this set (the group keeps it, and
        reads filter with what it parses to): the tags joined by ``||`` in sorted order, ``*`` for
        subscribe-all. Where that would read back as another set — no tag (``" "``), the tag ``*``
        alone, a tag starting or ending with ``|`` — it is written so that it reads back right."""
        if self.sub_all:
            return SUB_ALL
        tags = sorted(self.tags)
        if not tags:
            return " "  # "" would subscribe to every message
        if tags == [SUB_ALL]:
            return SUB_ALL + "||"  # "*" would too; the trailing empty piece is dropped
        if any(t.startswith("|") or t.endswith("|") for t in tags):
            return " || ".join(tags)  # "a|" + "||" + "b" splits as "a", "|b"; the spaces are trimmed
        return "||".join(tags)
