"""The HTTP service: the Durable Streams protocol on the store (``sessionstore serve``).

Needs the ``http`` extra (Starlette and uvicorn): ``pip install 'sessionstore[http]'``.
"""

from store.http.app import StreamService, create_app

__all__ = ["StreamService", "create_app"]
