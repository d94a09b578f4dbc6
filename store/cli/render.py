"""Terminal output: one-line entry summaries, the session tree, a live status line.

Nothing here touches the store; everything takes plain entries or a ``Session``.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

from store.model.session import Session, TreeNode


@dataclass(frozen=True, slots=True)
class Style:
    """Glyphs and colours; ASCII where the output encoding cannot carry box drawing."""

    on_path: str
    off_path: str
    tee: str
    elbow: str
    pipe: str
    space: str
    leaf: str
    arrow: str
    color: bool

    def paint(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color and text else text


def style_for(stream: IO[str]) -> Style:
    encoding = (getattr(stream, "encoding", None) or "ascii").lower()
    try:
        "●○├└│◀→".encode(encoding)
        unicode = True
    except (LookupError, UnicodeEncodeError):
        unicode = False
    color = _isatty(stream) and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
    if unicode:
        return Style("●", "○", "├─ ", "└─ ", "│  ", "   ", "◀ leaf", "→", color)
    return Style("*", "o", "|- ", "`- ", "|  ", "   ", "<- leaf", "->", color)


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def terminal_width(stream: IO[str], default: int = 120) -> int:
    if _isatty(stream):
        return max(40, shutil.get_terminal_size((default, 24)).columns)
    return default


# --- one entry, one line ---------------------------------------------------------------------


def _flat(text: str) -> str:
    return " ".join(text.split())


def content_text(content: Any) -> str:
    """The readable text of pi message content (a string or a list of blocks)."""
    if isinstance(content, str):
        return _flat(content)
    parts: list[str] = []
    if isinstance(content, list):
        for block in content:
            if not isinstance(block, Mapping):
                continue
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                parts.append(_flat(block["text"]))
            elif kind == "image":
                parts.append("[image]")
    return " ".join(p for p in parts if p)


def _tool_call(block: Mapping[str, Any], arrow: str) -> str:
    args = block.get("arguments")
    shown = ""
    if isinstance(args, Mapping) and args:
        first = next(iter(args.values()))
        shown = first if isinstance(first, str) else str(first)
        shown = _flat(shown)
        if len(shown) > 40:
            shown = shown[:39] + "…"
    return f"{arrow} {block.get('name', '?')}({shown})"


def summarize(entry: Mapping[str, Any], arrow: str = "→") -> str:
    """What an entry is, in one line (no id, no label)."""
    etype = entry.get("type")
    redacted = entry.get("redacted")
    if isinstance(redacted, Mapping):
        return f"[redacted {etype}: {redacted.get('reason', '')}]"
    if etype == "message":
        msg = entry.get("message") or {}
        role = msg.get("role", "?")
        if role == "assistant":
            content = msg.get("content")
            text = content_text(content)
            calls = [
                _tool_call(b, arrow)
                for b in (content if isinstance(content, list) else [])
                if isinstance(b, Mapping) and b.get("type") == "toolCall"
            ]
            return "assistant: " + " ".join(p for p in [text, *calls] if p)
        if role == "toolResult":
            mark = " (error)" if msg.get("isError") else ""
            return f"{msg.get('toolName', 'tool')} result{mark}: {content_text(msg.get('content'))}"
        if role == "bashExecution":
            return f"$ {_flat(str(msg.get('command', '')))}"
        return f"{role}: {content_text(msg.get('content'))}"
    if etype == "compaction":
        return f"compaction (tokens before {entry.get('tokensBefore', '?')}): {_flat(str(entry.get('summary', '')))}"
    if etype == "branch_summary":
        return f"branch summary: {_flat(str(entry.get('summary', '')))}"
    if etype == "model_change":
        return f"model {arrow} {entry.get('provider', '?')}/{entry.get('modelId', '?')}"
    if etype == "thinking_level_change":
        return f"thinking {arrow} {entry.get('thinkingLevel', '?')}"
    if etype == "label":
        label = entry.get("label")
        target = str(entry.get("targetId", ""))[:8]
        return f"label {label!r} {arrow} {target}" if label else f"label cleared on {target}"
    if etype == "session_info":
        return f"name: {entry.get('name', '')}"
    if etype == "custom":
        return f"custom {entry.get('customType', '')}"
    if etype == "custom_message":
        return f"{entry.get('customType', 'custom')}: {content_text(entry.get('content'))}"
    if etype == "redaction":
        return f"redaction of {str(entry.get('targetId', ''))[:8]}: {entry.get('reason', '')}"
    return str(etype)


def _clip(text: str, width: int) -> str:
    if width <= 1:
        return ""
    return text if len(text) <= width else text[: width - 1] + "…"


# --- the tree --------------------------------------------------------------------------------


def draw_tree(session: Session, *, stream: IO[str] | None = None, width: int | None = None) -> list[str]:
    """The session's tree, one line per entry.

    A chain of single children stays in one column (a 5,000-entry linear session is 5,000
    plain lines, not a staircase); only a branch point indents its children, with connectors.
    Entries on the path to the leaf are drawn ``●``, others ``○``; the leaf is marked, labels
    are shown in brackets, and each line ends with the entry's id.
    """
    stream = stream or sys.stdout
    style = style_for(stream)
    width = width or terminal_width(stream)
    leaf = session.leaf_id
    on_path = {e["id"] for e in session.get_branch()} if leaf else set()
    lines: list[str] = []
    # (node, head drawn before the marker, prefix for its children)
    stack: list[tuple[TreeNode, str, str]] = []

    def push(children: list[TreeNode], prefix: str) -> None:
        if len(children) == 1:
            stack.append((children[0], prefix, prefix))
            return
        items = []
        for i, child in enumerate(children):
            last = i == len(children) - 1
            head = prefix + (style.elbow if last else style.tee)
            items.append((child, head, prefix + (style.space if last else style.pipe)))
        stack.extend(reversed(items))

    push(session.get_tree(), "")
    while stack:
        node, head, child_prefix = stack.pop()
        entry = node.entry
        eid = str(entry["id"])
        marker = style.on_path if eid in on_path else style.off_path
        label = f" [{node.label}]" if node.label is not None else ""
        leaf_mark = f" {style.leaf}" if eid == leaf else ""
        id_col = f"  {eid[:16]}"
        plain_tail = len(label) + len(leaf_mark) + len(id_col)
        text = _clip(summarize(entry, style.arrow), width - len(head) - 2 - plain_tail)
        body = f"{marker} {text}"
        pad = " " * max(0, width - len(head) - len(body) - plain_tail)
        if eid not in on_path:
            body = style.paint(body, "2")
        elif entry.get("type") == "compaction":
            body = style.paint(body, "36")
        tail = style.paint(label, "33") + style.paint(leaf_mark, "1;32")
        lines.append(f"{head}{body}{tail}{pad}{style.paint(id_col, '2')}".rstrip())
        push(node.children, child_prefix)
    return lines


# --- live status -----------------------------------------------------------------------------


class StatusLine:
    """One updating line on a terminal; plain periodic lines anywhere else (logs, CI)."""

    def __init__(self, stream: IO[str] | None = None, *, interval: float = 2.0) -> None:
        self.stream = stream or sys.stderr
        self.tty = _isatty(self.stream)
        self.interval = interval
        self._last = 0.0
        self._shown = False

    def update(self, text: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if self.tty:
            if not force and now - self._last < 0.1:
                return
            self._last = now
            width = terminal_width(self.stream, 100)
            self.stream.write("\r\x1b[2K" + _clip(text, width - 1))
            self.stream.flush()
            self._shown = True
            return
        if force or now - self._last >= self.interval:
            self._last = now
            self.stream.write(text + "\n")
            self.stream.flush()

    def done(self, text: str | None = None) -> None:
        if self.tty:
            if text is not None:
                self.update(text, force=True)
            if self._shown:
                self.stream.write("\n")
                self.stream.flush()
        elif text is not None:
            self.stream.write(text + "\n")
            self.stream.flush()

    def clear(self) -> None:
        """Erase the line so that a regular line can be printed (terminal only)."""
        if self.tty and self._shown:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()


def bar(done: int, total: int, width: int = 24) -> str:
    filled = width if total <= 0 else min(width, done * width // total)
    return "[" + "#" * filled + "-" * (width - filled) + "]"
