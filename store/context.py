"""What the protocol modules share: the backends, the options and the format stores.

``SessionStore`` builds one ``StoreContext`` and hands it to the read path
(``store/read.py``), the tail keeper (``store/tail.py``) and the append path
(``store/append.py``); none of them holds a reference back to the facade.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from coordination.redis import Coordinator
from store.headers import HeaderStore
from store.keys import DataKeys
from store.layout import Layout
from store.manifest import ManifestStore
from store.objects import ObjectStore
from store.records import StoreOptions


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
    #: Sessions' data keys: sealing what is written, opening what is read (store/keys.py).
    keys: DataKeys

    def fault(self, point: str, **ctx: Any) -> None:
        """Named points of the protocols where tests inject crashes, faults and pauses."""
        hook = self.options.fault_hook
        if hook is not None:
            hook(point, ctx)
