"""Forks' registrations with their sources: one registry for pi forks and stream forks.

A fork copies nothing: it reads its source's data (pi: the path root..fork point; a stream:
every message before the fork offset). So each fork registers with the incarnation of the
source it reads, one empty object ``forks/<source dir>/<inc>/<fork sid>=<token>``
(``Layout.fork_ref``), the token random per fork create and kept in the fork's header
(``Header.fork.ref`` for pi, ``config.fork.ref`` for a stream: ``fork_point_of``). Whoever
removes a source (a purge, a stream's collector) lists the registrations first and keeps the
source while any is *live*: a header exists that names this source, this incarnation and this
token (a registration without a token, written before tokens were kept, counts for any fork
of that id).

**One protocol for both kinds.** A forker registers, then creates its header, then checks
its source (pi: not in the trash, ``RetentionStore.check_fork_source``; a stream: not
deleted), and undoes its fork if the check fails. A remover first commits the record that
refuses new forks (pi: the trash marker; a stream: its tombstone), then lists. Whatever
pauses where:

- a fork that lives on passed its check before that record, so its registration and its
  header came before the listing: the remover finds it live;
- a fork whose header comes after the listing checks after the record, finds the source
  refusing (or gone) and undoes itself, so a registration without a header may be dropped
  (a forker that died or paused before its header; no grace period is needed);
- a fork whose header exists but whose check has not run yet counts as live: the source
  waits, never the other way round.

Each life of a fork id has its own token, so a remover that paused before dropping one life's
registration never drops the next life's (``drop_own``).

**Two names, one written.** Stores written before this registry hold stream forks'
registrations under ``streams/refs/<source dir>/<inc>/`` (``Layout.stream_ref``). Both names
are listed and dropped; new registrations are written under ``forks/`` only.
"""

from __future__ import annotations

from dataclasses import dataclass

from store.errors import ObjectExistsError, SessionNotFoundError
from store.protocol.headers import HeaderStore
from store.formats.layout import Layout, parse_ref_name
from store.backends.object_store import ObjectStore
from store.formats.records import Header
from store.retry import RetryPolicy


def fork_point_of(header: Header) -> tuple[str, str, str] | None:
    """(source id, source incarnation, registration token) of a fork's header, or None for
    a session or stream that is no fork."""
    if header.fork is not None:
        return header.fork.session_id, header.fork.incarnation, header.fork.ref
    fork = header.config.get("fork") if isinstance(header.config, dict) else None
    if isinstance(fork, dict) and fork.get("sid") and fork.get("inc"):
        return str(fork["sid"]), str(fork["inc"]), str(fork.get("ref") or "")
    return None


@dataclass(frozen=True, slots=True)
class Registration:
    """One fork's registration with a source: its object's key, the fork's id and token."""

    key: str
    fork_sid: str
    token: str

    def names(self, header: Header, sid: str, inc: str) -> bool:
        """Is ``header`` (of ``fork_sid``) the fork this registration keeps ``(sid, inc)`` for?"""
        point = fork_point_of(header)
        return point is not None and point[:2] == (sid, inc) and (not self.token or point[2] == self.token)


class ForkRegistry:
    """Registrations of the forks of every source in one store. Stateless; thread-safe."""

    def __init__(self, layout: Layout, objects: ObjectStore, retry: RetryPolicy, headers: HeaderStore) -> None:
        self.layout = layout
        self.objects = objects
        self.retry = retry
        self.headers = headers

    def register(self, sid: str, inc: str, fork_sid: str, token: str) -> tuple[str, bool]:
        """Register ``fork_sid`` (this life: ``token``) with ``(sid, inc)``, before the fork's
        header exists: ``(key, made)``, ``made`` False when the object existed already (a
        re-send, or a bare name registered by an earlier fork of that id)."""
        key = self.layout.fork_ref(sid, inc, fork_sid, token)
        try:
            self.retry.call(lambda: self.objects.put_if_absent(key, b""))
            return key, True
        except ObjectExistsError:
            return key, False

    def registrations(self, sid: str, inc: str) -> list[Registration]:
        """Every registration with ``(sid, inc)``, under both names (one LIST each)."""
        out = []
        for prefix in (self.layout.fork_refs_prefix(sid, inc), self.layout.stream_refs_prefix(sid, inc)):
            for key in self.retry.call(lambda: [i.key for i in self.objects.list(prefix)]):
                fork_sid, token = parse_ref_name(key)
                out.append(Registration(key, fork_sid, token))
        return out

    def fork_header(self, reg: Registration, sid: str, inc: str) -> Header | None:
        """The header of the fork ``reg`` keeps ``(sid, inc)`` for; None when no header names
        it (the registration is dead: see the module docstring)."""
        try:
            header = self.headers.read(reg.fork_sid)
        except SessionNotFoundError:
            return None
        return header if reg.names(header, sid, inc) else None

    def live(self, sid: str, inc: str) -> list[str]:
        """Ids of the forks that read ``(sid, inc)``: asked by a remover after the record that
        refuses new forks is committed."""
        out: list[str] = []
        for reg in self.registrations(sid, inc):
            if reg.fork_sid not in out and self.fork_header(reg, sid, inc) is not None:
                out.append(reg.fork_sid)
        return out

    def drop(self, keys: list[str]) -> None:
        if keys:
            self.retry.call(lambda: self.objects.delete_many(keys))

    def own_keys(self, sid: str, inc: str, fork_sid: str, token: str) -> list[str]:
        """The keys a fork's own registration may have (both names): whoever removes the
        fork drops these after its header, never the source's whole list (the id may have
        been forked again since, with a registration of its own)."""
        return [self.layout.fork_ref(sid, inc, fork_sid, token), self.layout.stream_ref(sid, inc, fork_sid, token)]

    def drop_own(self, sid: str, inc: str, fork_sid: str, token: str) -> None:
        self.drop(self.own_keys(sid, inc, fork_sid, token))


__all__ = ["ForkRegistry", "Registration", "fork_point_of"]
