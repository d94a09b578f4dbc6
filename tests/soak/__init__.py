"""The nemesis soak: ``python -m tests.soak --help``.

Real servers (a redis-server process, an S3 server over HTTP behind a fault-injecting TCP
proxy), writer, reader and compactor processes, a seeded nemesis that kills, pauses and cuts
them off, and at the end the history checker (``tests/history.py``) over every operation and
every read. See docs/reliability.md, section "Nemesis soak".

Modules:

* ``config``   the run's settings, shared with every child process as one JSON file;
* ``servers``  Redis, the S3 backends (moto in a child process, SeaweedFS) and the proxy;
* ``roles``    the child processes: writer, reader, final reader (``python -m tests.soak.roles``);
* ``nemesis``  the fault scheduler and the process table;
* ``run``      the orchestration, the verdict and the summary.
"""
