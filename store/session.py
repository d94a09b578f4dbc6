"""The pure session model: re-exported from its homes, for code that imports it here.

``Session`` and ``TreeNode`` live in :mod:`store.model.session`, the walks in
:mod:`store.model.context`, the entry rules in :mod:`store.model.rules` and the JavaScript
semantics in :mod:`store.model.js`. This module defines nothing.
"""

from __future__ import annotations

from store.model.context import branch_path, build_session_context
from store.model.js import JS_WHITESPACE, js_date_ms, js_to_string, js_trim, js_truthy
from store.model.rules import (
    REDACTION_TYPE,
    Entry,
    check_acyclic,
    is_tombstone,
    redaction_tombstone,
    validate_entry,
)
from store.model.session import Session, TreeNode

__all__ = [
    "JS_WHITESPACE",
    "REDACTION_TYPE",
    "Entry",
    "Session",
    "TreeNode",
    "branch_path",
    "build_session_context",
    "check_acyclic",
    "is_tombstone",
    "js_date_ms",
    "js_to_string",
    "js_trim",
    "js_truthy",
    "redaction_tombstone",
    "validate_entry",
]
