// A session as the viewer holds it: its entries in commit order, the tree they form through
// parentId, labels and name (pi's rules: docs/pi-format.md), redactions applied as they
// arrive, and the tree flattened into rows for the windowed list.

export const CLAUDE_ENTRY = "claude-agent-sdk.entry"
const TOMBSTONE_KEYS = new Set(["type", "id", "parentId", "timestamp", "redacted"])

// An entry whose content was redacted: only type, id, parentId, timestamp and `redacted`.
export function isTombstone(entry) {
  const r = entry.redacted
  return r !== null && typeof r === "object" && Object.keys(entry).every((k) => TOMBSTONE_KEYS.has(k))
}

export class SessionModel {
  constructor() {
    this.entries = []
    this.byId = new Map()
    this.position = new Map() // id -> index in entries
    this.children = new Map() // parent id (null: roots) -> child ids, in commit order
    this.labels = new Map()
    this.name = null
    this.rows = []
    this.rowOf = new Map() // id -> row index
  }

  get leafId() {
    return this.entries.length ? this.entries[this.entries.length - 1].id : null
  }

  get isClaude() {
    const first = this.entries[0]
    return !!first && first.type === "custom" && first.customType === CLAUDE_ENTRY
  }

  // Adds a batch in commit order (an entry already held is skipped). Returns what changed:
  // {added, redacted} (redacted: ids whose content was removed now).
  add(batch) {
    const added = []
    const redacted = []
    for (const entry of batch) {
      if (entry === null || typeof entry !== "object" || typeof entry.id !== "string") continue
      if (this.byId.has(entry.id)) continue
      this.position.set(entry.id, this.entries.length)
      this.entries.push(entry)
      this.byId.set(entry.id, entry)
      const parent = typeof entry.parentId === "string" && this.byId.has(entry.parentId) ? entry.parentId : null
      if (!this.children.has(parent)) this.children.set(parent, [])
      this.children.get(parent).push(entry.id)
      added.push(entry)
      if (entry.type === "redaction" && this.redact(entry)) redacted.push(entry.targetId)
    }
    if (added.length) this.derive()
    return { added, redacted }
  }

  // A redaction read live: its target becomes the tombstone every reader sees (a catch-up
  // read already holds tombstones). Returns whether anything was hidden now.
  redact(redaction) {
    const target = this.byId.get(redaction.targetId)
    if (!target || target.type === "redaction" || isTombstone(target)) return false
    const tombstone = { type: target.type, id: target.id, parentId: target.parentId, timestamp: target.timestamp,
      redacted: { reason: redaction.reason, redactionId: redaction.id } }
    this.byId.set(target.id, tombstone)
    this.entries[this.position.get(target.id)] = tombstone
    return true
  }

  // Labels and name (file order; redacted ones count for nothing), and the rows.
  derive() {
    this.labels.clear()
    this.name = null
    for (const entry of this.entries) {
      if (isTombstone(entry)) continue
      if (entry.type === "label" && typeof entry.targetId === "string") {
        if (entry.label) this.labels.set(entry.targetId, String(entry.label))
        else this.labels.delete(entry.targetId)
      } else if (entry.type === "session_info" && typeof entry.name === "string") {
        this.name = entry.name.trim() || null
      }
    }
    this.flatten()
  }

  // The tree in depth-first order, children in commit order. A branch point indents its
  // children one level; an only child stays at its parent's level, so a long conversation
  // is one column however deep.
  flatten() {
    const rows = []
    const stack = []
    const roots = this.children.get(null) || []
    for (let i = roots.length - 1; i >= 0; i--) stack.push([roots[i], 0])
    while (stack.length) {
      const [id, depth] = stack.pop()
      const kids = this.children.get(id) || []
      rows.push({ id, depth, branch: kids.length > 1, leaf: kids.length === 0 })
      const next = kids.length > 1 ? depth + 1 : depth
      for (let i = kids.length - 1; i >= 0; i--) stack.push([kids[i], next])
    }
    this.rows = rows
    this.rowOf = new Map(rows.map((row, index) => [row.id, index]))
  }

  // Root-first ids of the path to `id`.
  path(id) {
    const out = []
    const seen = new Set()
    let entry = this.byId.get(id)
    while (entry && !seen.has(entry.id)) {
      seen.add(entry.id)
      out.push(entry.id)
      entry = typeof entry.parentId === "string" ? this.byId.get(entry.parentId) : undefined
    }
    return out.reverse()
  }

  // What a compaction summarises: the ids on its path before the first entry it keeps.
  summarised(compaction) {
    const path = this.path(compaction.id)
    path.pop()
    const kept = path.indexOf(compaction.firstKeptEntryId)
    return kept < 0 ? path : path.slice(0, kept)
  }
}
