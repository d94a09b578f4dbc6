"""Test harness: real servers over real connections.

* :class:`RedisServer` runs a real ``redis-server`` process on a free loopback port.
* :class:`S3Server` runs moto's S3 server over real HTTP on a free loopback port, with a
  process-wide lock that makes moto's conditional writes atomic.
* :class:`TcpProxy` sits in front of either and injects network faults.

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

__all__ = [
    "RedisServer",
    "RedisServerError",
    "S3Server",
    "TcpProxy",
    "find_redis_server",
    "redis_server_version",
    "install_moto_write_lock",
    "moto_write_lock",
    "moto_write_lock_bypassed",
    "new_bucket_name",
    "s3_client",
]
