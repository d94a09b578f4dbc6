"""The command table: every subcommand's function, from the module of its group. Each takes
the parsed arguments and a ``Ctx`` and returns an exit code; errors are raised and turned into
one line and an exit code by ``store.cli.main``.

| module | commands |
| --- | --- |
| ``store.cli.sessions`` | create, append, ls, info, show, context, fork, redact, delete |
| ``store.cli.transfer`` | import, export |
| ``store.cli.live`` | follow |
| ``store.cli.serve`` | serve |
| ``store.cli.operate`` | compact, gc, verify, doctor, embedded |
"""

from __future__ import annotations

from store.cli.ctx import Ctx
from store.cli.live import cmd_follow
from store.cli.operate import cmd_compact, cmd_doctor, cmd_embedded, cmd_erase, cmd_gc, cmd_verify
from store.cli.serve import cmd_serve
from store.cli.sessions import (
    cmd_append,
    cmd_context,
    cmd_create,
    cmd_delete,
    cmd_fork,
    cmd_info,
    cmd_ls,
    cmd_redact,
    cmd_show,
    describe_session,
    fill_entries,
)
from store.cli.transfer import cmd_export, cmd_import

__all__ = [
    "Ctx",
    "cmd_append",
    "cmd_compact",
    "cmd_context",
    "cmd_create",
    "cmd_delete",
    "cmd_doctor",
    "cmd_embedded",
    "cmd_erase",
    "cmd_export",
    "cmd_follow",
    "cmd_fork",
    "cmd_gc",
    "cmd_import",
    "cmd_info",
    "cmd_ls",
    "cmd_redact",
    "cmd_serve",
    "cmd_show",
    "cmd_verify",
    "describe_session",
    "fill_entries",
]
