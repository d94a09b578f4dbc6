"""Listing N sessions: the first page and every page, against the object store's LIST alone.

The store's page is one LIST of the session directories and one Redis pipeline reading each
listed session's tail and summary (``store/protocol/listing.py``). The floor is the same LIST pages
of the same keys through the same client (``ObjectStore.list_dirs_page``), without Redis:
what any listing of the object store pays. Store and floor alternate, rep by rep.

The N sessions live under a prefix of their own (object keys and Redis keys), so that the
sessions the other scenarios create are not listed. They are created through the store's
own API (``create_session``: the header PUT, then the Redis state and summary), 32 at a
time; one in a hundred gets a first user message and a name (one append), so their
summaries have the fields a picker shows.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks.backends import _add_url_prefix
from benchmarks.context import Context
from benchmarks.results import fmt_ms, fmt_ratio
from benchmarks.stats import median

FIRST_PAGE = 100
ALL_PAGE = 1000


def _sessions(ctx: Context) -> Any:
    from store.core import SessionStore

    b = ctx.backend
    url = _add_url_prefix(b.objects_url, "listing")
    redis_url = b.redis_url if b.redis_url is not None else b.redis_rtt_url
    return SessionStore.from_url(url, redis_url, redis_prefix=f"{b.redis_prefix}:listing")


def _populate(st: Any, n: int) -> None:
    def make(i: int) -> None:
        sid = f"l{i:07d}"
        st.create_session(sid, cwd=f"/bench/{i % 50}")
        if i % 100 == 0:
            st.append_session_entries(sid, [
                {"type": "message", "id": f"{sid}-u", "parentId": None, "timestamp": "2026-01-01T00:00:00.000Z",
                 "message": {"role": "user", "content": f"question {i}"}},
                {"type": "session_info", "id": f"{sid}-n", "parentId": f"{sid}-u",
                 "timestamp": "2026-01-01T00:00:00.000Z", "name": f"session {i}"},
            ])

    with ThreadPoolExecutor(max_workers=32) as pool:
        list(pool.map(make, range(n)))


def _store_pages(st: Any, limit: int, first_only: bool) -> tuple[int, int]:
    cursor, pages, rows = None, 0, 0
    while True:
        page = st.list_sessions(cursor=cursor, limit=limit)
        pages += 1
        rows += len(page.items)
        if first_only or page.next_cursor is None:
            return pages, rows
        cursor = page.next_cursor


def _floor_pages(st: Any, limit: int, first_only: bool) -> tuple[int, int]:
    prefix = st.layout.sessions_prefix
    cursor, pages, rows = None, 0, 0
    while True:
        names, more = st.objects.list_dirs_page(prefix, cursor, limit)
        pages += 1
        rows += len(names)
        if first_only or not more:
            return pages, rows
        cursor = names[-1]


def run(ctx: Context) -> None:
    p, R = ctx.params, ctx.results
    n = p.listing_sessions
    st = _sessions(ctx)
    try:
        t0 = time.perf_counter()
        _populate(st, n)
        create_s = time.perf_counter() - t0
        ctx.log(f"listing: {n:,} sessions created in {create_s:.1f} s")
        details: dict[str, Any] = {"sessions": n, "create_s": create_s}
        for case, limit, first_only, reps in (
            ("first_page", FIRST_PAGE, True, p.listing_first_reps),
            ("all", ALL_PAGE, False, p.listing_all_reps),
        ):
            _store_pages(st, limit, True)  # warm connections and scripts
            _floor_pages(st, limit, True)
            store_s: list[float] = []
            floor_s: list[float] = []
            requests: dict[str, int] = {}
            pages = 0
            for _ in range(reps):
                st.objects.requests.clear()
                t0 = time.perf_counter()
                pages, rows = _store_pages(st, limit, first_only)
                store_s.append(time.perf_counter() - t0)
                requests = dict(st.objects.requests)
                if rows != (min(limit, n) if first_only else n):
                    raise RuntimeError(f"listing {case}: {rows} sessions listed, not {n}")
                t0 = time.perf_counter()
                _floor_pages(st, limit, first_only)
                floor_s.append(time.perf_counter() - t0)
            s_ms, f_ms = median(store_s) * 1000, median(floor_s) * 1000
            pre = f"listing.{case}"
            R.fig(f"{pre}.store_ms", s_ms, "ms")
            R.fig(f"{pre}.floor_ms", f_ms, "ms")
            R.fig(f"{pre}.ratio", s_ms / f_ms, "x")
            R.fig(f"{pre}.object_requests_per_page", sum(requests.values()) / pages, "")
            details[case] = {"store_s": store_s, "floor_s": floor_s, "pages": pages, "requests": requests,
                             "page_size": limit}
            what = f"first page of {FIRST_PAGE}" if first_only else f"all {pages} pages of {ALL_PAGE}"
            R.row(
                "listing",
                f"{n:,} sessions, {what}",
                f"{fmt_ms(s_ms)} ({sum(requests.values()) / pages:g} object requests a page)",
                f"{fmt_ms(f_ms)} (the same LIST pages)",
                fmt_ratio(s_ms / f_ms),
            )
        R.fig("listing.sessions", n, "")
        R.details["listing"] = details
    finally:
        st.close()  # its objects and keys are the run's: the backend removes them (or --keep)


FIGURES = [
    "listing.sessions",
    *[f"listing.{case}.{k}" for case in ("first_page", "all")
      for k in ("store_ms", "floor_ms", "ratio", "object_requests_per_page")],
]
