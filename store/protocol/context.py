"""What the protocol modules share: the backends, the options and the format stores.

``SessionStore`` builds one ``StoreContext`` and hands it to the read path
(``store/protocol/read.py``), the tail keeper (``store/protocol/tail.py``) and the append path
(``store/protocol/append.py``); none of them holds a reference back to the facade.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from coordination.redis import Coordinator
from store.protocol.headers import HeaderStore
from store.protocol.keys import DataKeys
from store.formats.layout import Layout
from store.protocol.manifest import ManifestStore
from store.backends.objects import ObjectStore
from store.formats.records import StoreOptions


@dataclass(frozen=True)
class StoreContext:
    objects: ObjectStore
    coord: Coordinator
    layout: Layout
    options: StoreOptions
    headers: HeaderStore
    manifests: ManifestStore
    #: Parallel GETs of the read path.
    pool: ThreadPoolExecutor
    #: Sessions' data keys: sealing what is written, opening what is read (store/protocol/keys.py).
    keys: DataKeys

    def fault(self, point: str, **ctx: Any) -> None:
        """Named points of the protocols where tests inject crashes, faults and pauses."""
        hook = self.options.fault_hook
        if hook is not None:
            hook(point, ctx)
