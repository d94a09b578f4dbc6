"""Test harness: real servers over real connections.

* :class:`RedisServer` runs a real ``redis-server`` process on a free loopback port.
* :class:`S3Server` runs moto's S3 server over real HTTP on a free loopback port, with a
  process-wide lock that makes moto's conditional writes atomic.
* :class:`SeaweedServer` runs SeaweedFS (``weed mini``: a real object store whose conditional
  writes are atomic on their own) on free loopback ports.
* :class:`TcpProxy` sits in front of any of them and injects network faults.

Nothing here mocks boto3 or redis-py.
"""

from .proxy import TcpProxy
from .redis_server import RedisServer, RedisServerError, find_redis_server, redis_server_version
from .s3_server import (
    S3Server,
    install_moto_write_lock,
    moto_write_lock,
    moto_write_lock_bypassed,
    new_bucket_name,
    s3_client,
)
from .seaweedfs import SeaweedServer, SeaweedServerError, find_weed, weed_version

__all__ = [
    "RedisServer",
    "RedisServerError",
    "S3Server",
    "SeaweedServer",
    "SeaweedServerError",
    "TcpProxy",
    "find_redis_server",
    "find_weed",
    "redis_server_version",
    "install_moto_write_lock",
    "moto_write_lock",
    "moto_write_lock_bypassed",
    "new_bucket_name",
    "s3_client",
    "weed_version",
]
