"""pi session files in and out: re-exported from their homes, for code that imports them here.

The reader, the migration and the writer live in :mod:`store.pi` (``scan``, ``migrate``,
``export``); the JavaScript semantics they share in :mod:`store.model` (``js``, ``js_json``).
This module defines nothing.
"""

from __future__ import annotations

from store.model.js import js_number_to_string, js_to_number
from store.model.js_json import dumps_js, normalize_js_value
from store.pi.checks import EntryCheck
from store.pi.export import export_pi_bytes, export_pi_lines
from store.pi.lines import PiSource
from store.pi.migrate import CURRENT_VERSION, PiMigration, mint_id
from store.pi.scan import (
    PiFile,
    PiScan,
    iter_pi_entries,
    parse_pi_lines,
    read_pi_file,
    scan_pi_file,
)

__all__ = [
    "CURRENT_VERSION",
    "EntryCheck",
    "PiFile",
    "PiMigration",
    "PiScan",
    "PiSource",
    "dumps_js",
    "export_pi_bytes",
    "export_pi_lines",
    "iter_pi_entries",
    "js_number_to_string",
    "js_to_number",
    "mint_id",
    "normalize_js_value",
    "parse_pi_lines",
    "read_pi_file",
    "scan_pi_file",
]
