"""Pass 1's checks: the model's rules for each entry and across the entries of a pi file.

:class:`Checker` applies :func:`store.model.rules.validate_entry` to every entry and, across
entries, unique ids (a byte-identical repeat, pi's re-append quirk, is kept once), no parentId
cycle (:func:`store.model.rules.check_acyclic`) and the leaf rule, while keeping only a few
dozen bytes per entry when the entries themselves are not kept.
"""

from __future__ import annotations

import hashlib
import marshal
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, overload

from store.errors import InvalidEntryError, InvalidInputError
from store.model.rules import check_acyclic, validate_entry

__all__ = ["Checker", "EntryCheck"]

#: ``entry_check(entry, line)`` of :func:`~store.pi.scan.scan_pi_file`.
EntryCheck = Callable[[dict[str, Any], int], None]

_DIGEST_SIZE: Final = 16


def _digest(value: dict[str, Any]) -> bytes:
    """16 bytes that differ exactly when two parsed entries' ``JSON.stringify`` differ.

    marshal's version 0 is, like JSON.stringify, a one-to-one image of a parsed (normalised)
    value, key order and int/float/bool types included; unlike later versions it never
    shares equal objects, so equal values give equal bytes whatever their identity. Unlike
    orjson, it does not leave a cached UTF-8 copy inside every non-ASCII string it writes
    (which would add the size of the text to every entry
    :func:`~store.pi.scan.read_pi_file` keeps), and it takes any depth the parser does.
    """
    return hashlib.blake2b(marshal.dumps(value, 0), digest_size=_DIGEST_SIZE).digest()


class Checker:
    """The model's rules for each entry and across entries, applied in file order while
    keeping only small bookkeeping per entry: its id, parent id, line and content digest.

    The first refusal is kept and raised by :meth:`finish`, once the whole file has been
    parsed: an unparseable value anywhere in the file is reported first, as
    :func:`~store.pi.scan.read_pi_file` always did.
    """

    def __init__(self, entry_check: EntryCheck | None, *, minted: bool, keep: bool) -> None:
        # Ids minted by the v1 migration are unique and chained in file order: neither
        # duplicates nor cycles nor forward parents can occur, so they are not looked for.
        self.minted = minted
        self.entry_check = entry_check
        #: The entries, when the caller keeps them (read_pi_file).
        self.entries: list[dict[str, Any]] | None = [] if keep else None
        self.index_by_id: dict[str, int] = {}
        self.parents: list[Any] = []
        self.lines = array("Q")
        # A repeated id is settled by comparing digests: kept for every entry when the
        # entries themselves are not kept, computed on demand from the two entries otherwise
        # (repeats are rare; digesting every entry would slow read_pi_file down by half).
        self.digests: bytearray | None = None if keep or minted else bytearray()
        self.collapsed: list[int] = []
        self.error: InvalidEntryError | None = None
        self.check_error: InvalidInputError | None = None
        self.last_id: str | None = None
        self.last_line = 0
        self.last_was_collapsed = False
        self.previous_id: str | None = None

    def add(self, lineno: int, value: dict[str, Any]) -> bool:
        """Check the next entry; True if it is one of the file's entries (not a repeat)."""
        if self.error is not None:
            return False  # the first refusal is the one reported; the rest is moot
        index = len(self.lines)
        try:
            validate_entry(value, index)
        except InvalidEntryError as exc:
            self.error = _at_line(lineno, exc)
            return False
        entry_id = value["id"]
        self.last_id, self.last_line = entry_id, lineno
        index_by_id = self.index_by_id
        earlier = index_by_id.get(entry_id)
        self.last_was_collapsed = earlier is not None
        digests = self.digests
        digest = _digest(value) if digests is not None else b""
        if earlier is not None:
            if self._earlier_digest(earlier) == (digest or _digest(value)):
                # pi's re-append quirk writes the same entries again: keep one copy.
                self.collapsed.append(lineno)
                return False
            self.error = InvalidEntryError(
                f"line {lineno}: duplicate entry id {entry_id!r} with different content "
                f"(first on line {self.lines[earlier]}; pi would let the later one shadow it)",
                index=index,
                entry_id=entry_id,
            )
            return False
        index_by_id[entry_id] = index
        if digests is not None:
            digests += digest
        if self.entries is not None:
            self.entries.append(value)  # the entries' own parentIds serve the checks below
        else:
            parent = value.get("parentId")
            if parent == self.previous_id:
                parent = self.previous_id  # nearly always: one string object instead of two
            self.parents.append(parent)
        self.lines.append(lineno)
        self.previous_id = entry_id
        if self.entry_check is not None and self.check_error is None:
            try:
                self.entry_check(value, lineno)
            except InvalidInputError as exc:
                self.check_error = exc
        return True

    def _earlier_digest(self, index: int) -> bytes | None:
        if self.digests is not None:
            return bytes(self.digests[index * _DIGEST_SIZE : (index + 1) * _DIGEST_SIZE])
        if self.entries is not None:
            return _digest(self.entries[index])
        return None  # minted ids never repeat

    def finish(self) -> tuple[int, str, str] | None:
        """Raise the first refusal; else return the first forward parent (see PiScan)."""
        if self.error is not None:
            raise self.error
        if self.last_was_collapsed and self.last_id != self.previous_id:
            # pi's leaf is the id of the last line; if that line repeats an earlier entry, our
            # leaf (the last distinct entry) would not be pi's.
            raise InvalidEntryError(
                f"line {self.last_line}: the file ends with a repeat of entry {self.last_id!r}, "
                "which would make an earlier entry pi's leaf",
                entry_id=self.last_id,
            )
        forward = None
        if not self.minted:
            ids = list(self.index_by_id)
            entries = self.entries
            if entries is not None:
                parents: list[Any] = [entry.get("parentId") for entry in entries]
                by_id: Mapping[str, Mapping[str, Any]] = dict(zip(ids, entries))
                order: Sequence[Mapping[str, Any]] = entries
            else:
                parents = self.parents
                by_id, order = _LinkMap(self.index_by_id, parents), _Links(ids, parents)
            try:
                check_acyclic(by_id, order)
            except InvalidEntryError as exc:
                line = self.lines[exc.index] if exc.index is not None else 0
                raise _at_line(line, exc) from None
            forward = self._first_forward_parent(ids, parents)
        if self.check_error is not None:
            raise self.check_error
        return forward

    def _first_forward_parent(
        self, ids: list[str], parents: list[Any]
    ) -> tuple[int, str, str] | None:
        index_by_id = self.index_by_id
        for index, parent in enumerate(parents):
            if parent:
                where = index_by_id.get(parent)
                if where is not None and where > index:
                    return self.lines[index], ids[index], parent
        return None


def _at_line(lineno: int, exc: InvalidEntryError) -> InvalidEntryError:
    return InvalidEntryError(
        f"line {lineno}: {_strip_where(exc)}", index=exc.index, entry_id=exc.entry_id
    )


def _strip_where(exc: InvalidEntryError) -> str:
    # InvalidEntryError prefixes "entry N (id X): "; keep only the reason when re-wrapping.
    text = str(exc)
    head, sep, tail = text.partition(": ")
    return tail if sep and head.startswith("entry ") else text


def _link(entry_id: str, parent: Any) -> dict[str, Any]:
    return {"id": entry_id, "parentId": parent}


class _LinkMap(Mapping[str, Mapping[str, Any]]):
    """id -> ``{"id", "parentId"}`` built on demand: what check_acyclic reads of an entry."""

    __slots__ = ("_index", "_parents")

    def __init__(self, index_by_id: dict[str, int], parents: list[Any]) -> None:
        self._index = index_by_id
        self._parents = parents

    def __getitem__(self, key: str) -> Mapping[str, Any]:
        return _link(key, self._parents[self._index[key]])

    def get(self, key: str, default: Any = None) -> Any:  # check_acyclic's hot path
        where = self._index.get(key)
        return default if where is None else _link(key, self._parents[where])

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


class _Links(Sequence[Mapping[str, Any]]):
    """The entries in file order as ``{"id", "parentId"}``, built on demand."""

    __slots__ = ("_ids", "_parents")

    def __init__(self, ids: list[str], parents: list[Any]) -> None:
        self._ids = ids
        self._parents = parents

    @overload
    def __getitem__(self, index: int) -> Mapping[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Mapping[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return _Links(self._ids[index], self._parents[index])
        return _link(self._ids[index], self._parents[index])

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        return map(_link, self._ids, self._parents)

    def __len__(self) -> int:
        return len(self._ids)
