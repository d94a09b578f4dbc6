"""Removing an incarnation that has no header, without ever removing one that is being born.

An encrypted session's first data key is written before its header (``store/protocol/keys.py``: a
header that says "encrypted" always has a key), so for a moment an incarnation has objects
and no header. Whoever removes incarnations without a header (GC, a grace period after it
first saw them; an erasure's leftovers) decides from a header read, then deletes; a creator
writes its header, checks that its key is still there, then acknowledges. Any of them may
pause for any length of time between two steps. Without more, a remover that read "no
header", paused, and deleted after the creator's check would delete the key of a session
that was acknowledged: every object of it ciphertext nobody can open.

So removal is fenced. The remover

1. creates the incarnation's fence, ``<session>/<inc>/withdrawn.json`` (If-None-Match; one
   that exists already is as good),
2. reads the header again, and leaves alone an incarnation the header now names,
3. deletes the incarnation's other objects, and the fence last.

The creator, after its header is created, (a) HEADs the fence, then (b) HEADs its data key,
in that order, and acknowledges only if the fence is absent and the key present; otherwise
it withdraws its incarnation (deletes its own header) and creates the session again.

Why no interleaving loses an acknowledged session. Say the creator acknowledged: (a) found
no fence at time a, and (b) found the key at a later time b; its header was created at h < a.
- If a remover's fence was created after a, its header read (2) came after that, so after
  h: it saw the header (nothing since removes it but its own creator) and deleted nothing.
- If a fence was created before a, it was gone at a, so it had been deleted (3), and the
  key before it: the key was gone before a < b, and (b) would have failed.
Checking the key first and the fence second would not do: the remover could delete the key
between the two checks and the fence before the second.

The remover's pauses are covered by the same argument: nothing it read before the fence
matters, only what it reads after (2). The fence of an incarnation whose header appeared is
left where it is (its creator withdraws when it sees it; if the creator had already checked,
the fence is a stray empty object that nothing reads); it goes with the incarnation when the
session is deleted. Removing a fence of an incarnation the header names would not be safe:
a remover paused between (2) and (3) might still delete under the creator's check.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from store.errors import ObjectExistsError, SessionNotFoundError

if TYPE_CHECKING:
    from store.protocol.context import StoreContext

log = logging.getLogger("sessionstore")


def fence(ctx: StoreContext, sid: str, incs: Iterable[str]) -> list[str]:
    """Steps 1 and 2: fence ``incs`` (incarnations of ``sid`` the caller found without a
    header, or with another incarnation's header) and return those that may be removed: every
    one the header, read after the fences, does not name."""
    incs = list(dict.fromkeys(incs))
    if not incs:
        return []
    retry = ctx.options.retry
    for inc in incs:
        key = ctx.layout.withdrawn(sid, inc)
        try:
            retry.call(lambda key=key: ctx.objects.put_if_absent(key, b"", {}))
        except ObjectExistsError:
            pass
    try:
        current = ctx.headers.read(sid).incarnation
    except SessionNotFoundError:
        current = None
    if current in incs:
        log.info("incarnation %s of %s got its header while being removed: left to its "
                 "creator, which withdraws it", current, sid)
    return [inc for inc in incs if inc != current]


def remove(ctx: StoreContext, sid: str, keys_by_inc: Mapping[str, list[str]]) -> None:
    """Step 3: delete the listed objects of fenced incarnations, then their fences."""
    fences = {ctx.layout.withdrawn(sid, inc) for inc in keys_by_inc}
    rest = [k for keys in keys_by_inc.values() for k in keys if k not in fences]
    if rest:
        ctx.options.retry.call(lambda: ctx.objects.delete_many(rest))
    unfence(ctx, sid, keys_by_inc)


def unfence(ctx: StoreContext, sid: str, incs: Iterable[str]) -> None:
    """The end of step 3: the fences of incarnations whose other objects are deleted."""
    fences = [ctx.layout.withdrawn(sid, inc) for inc in incs]
    if fences:
        ctx.options.retry.call(lambda: ctx.objects.delete_many(fences))


def withdrawn(ctx: StoreContext, sid: str, inc: str) -> bool:
    """The creator's check (a): is ``inc`` fenced (one HEAD)?"""
    key = ctx.layout.withdrawn(sid, inc)
    return ctx.options.retry.call(lambda: ctx.objects.head(key)) is not None


__all__ = ["fence", "remove", "unfence", "withdrawn"]
