"""What the command modules share: ``Ctx`` (the parsed configuration and the store, opened on
first use), the clock and a counted noun. Each subcommand takes the parsed arguments and a
``Ctx`` and returns an exit code; errors are raised and turned into one line and an exit code by
``store.cli.main``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from store.cli.common import Config, open_store
from store.clock import now_ms  # noqa: F401  (the command modules import it from here)

if TYPE_CHECKING:
    from store.core import SessionStore


@dataclass
class Ctx:
    config: Config
    json: bool = False
    _store: SessionStore | None = field(default=None, repr=False)

    @property
    def store(self) -> SessionStore:
        if self._store is None:
            self._store = open_store(self.config)
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None




def counted(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"

