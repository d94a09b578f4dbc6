// The viewer: a hash router over three views (the tenant's sessions, one session, one plain
// stream), each reading this service's routes with the token kept for the browser session.
//
//   #/?title=...&cwd=...&after=...   the sessions, a page at a time (GET /v1/sessions)
//   #/session/<name>                 a session: tree, context of the chosen leaf, live
//   #/stream/<name>                  a stream that is not a session: its messages, live

import { ApiError, encodeName, follow, getJson, isJson, readAll, sessionPath, setToken, token } from "./api.js"
import { SessionModel, isTombstone, CLAUDE_ENTRY } from "./model.js"
import { claudeEntry, el, message, preview, problemText } from "./render.js"
import { WindowedList } from "./vlist.js"

const main = document.getElementById("main")
const banner = document.getElementById("banner")
const authBox = document.getElementById("auth")
const ROW_HEIGHT = 24
// Messages of a context drawn at first (the newest); "show earlier" draws more.
const CONTEXT_PAGE = 100

// What listing pages told us: a session's row by name, a session id's name (fork links).
const known = { rows: new Map(), names: new Map() }

let view = null

// --- routing, errors, the token ----------------------------------------------------------------

function decodeName(text) {
  return text.split("/").map(decodeURIComponent).join("/")
}

export const sessionHref = (name) => "#/session/" + encodeName(name)
export const streamHref = (name) => "#/stream/" + encodeName(name)

function route() {
  if (view) view.close()
  clearBanner()
  main.replaceChildren()
  const started = performance.now()
  const hash = location.hash.replace(/^#/, "") || "/"
  if (hash.startsWith("/session/")) view = sessionView(decodeName(hash.slice("/session/".length)), started)
  else if (hash.startsWith("/stream/")) view = streamView(decodeName(hash.slice("/stream/".length)), started)
  else view = listView(new URLSearchParams(hash.includes("?") ? hash.slice(hash.indexOf("?") + 1) : ""))
  showAuth()
}

function clearBanner() {
  banner.replaceChildren()
  banner.hidden = true
}

// A refusal, said plainly; a 401 asks for a token and then tries again.
function showError(err, retry) {
  if (err && err.name === "AbortError") return
  banner.hidden = false
  if (err instanceof ApiError && err.status === 401) {
    const hadToken = !!token()
    setToken(null)
    const input = el("input", { id: "token-input", type: "password", autocomplete: "off", placeholder: "bearer token", size: 40 })
    const form = el("form", { id: "token-form", class: "token-form", onsubmit: (ev) => {
      ev.preventDefault()
      if (!input.value.trim()) return
      setToken(input.value.trim())
      clearBanner()
      showAuth()
      retry()
    } },
    el("p", { class: "error", id: "error", text: hadToken
      ? "401: the token was refused. Enter another bearer token of this service."
      : "401: this service needs a bearer token (a read-only token is enough). It is kept for this browser tab only." }),
    input, " ", el("button", { type: "submit", text: "Use token" }))
    banner.replaceChildren(form)
    input.focus()
    return
  }
  banner.replaceChildren(el("p", { class: "error", id: "error", text: problemText(err) }))
}

function showAuth() {
  authBox.replaceChildren()
  if (token()) {
    authBox.append("token set · ", el("button", { type: "button", class: "link", text: "forget it", onclick: () => {
      setToken(null)
      route()
    } }))
  }
}

function remember(rows) {
  for (const row of rows) {
    known.rows.set(row.name, row)
    known.names.set(row.session_id, row.name)
  }
}

const fmtTime = (ms) => (ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 19) : "")
const fmtBytes = (n) => (n >= 1048576 ? `${(n / 1048576).toFixed(1)} MiB` : n >= 1024 ? `${(n / 1024).toFixed(1)} KiB` : `${n} B`)

function statusLine() {
  return el("span", { id: "live-status", class: "status", "data-state": "connecting", text: "connecting…" })
}

function setStatus(node, state, err) {
  node.dataset.state = state
  node.textContent = {
    connecting: "connecting…", live: "● live", reconnecting: "reconnecting…", closed: "closed (no more appends)",
    refused: `stopped: ${problemText(err)}`,
  }[state] || state
}

// --- the sessions ----------------------------------------------------------------------------

function listView(params) {
  const ac = new AbortController()
  const field = (name, label, attrs = {}) => el("label", {}, label, " ", el("input", { name, value: params.get(name) || "", ...attrs }))
  const since = params.get("updated_since")
  const limit = params.get("limit") || "50"
  const form = el("form", { id: "filters", class: "filters", onsubmit: (ev) => {
    ev.preventDefault()
    const q = new URLSearchParams()
    for (const [key, value] of new FormData(form)) {
      if (!value) continue
      q.set(key, key === "updated_since" ? String(Date.parse(value + "Z")) : value)
    }
    location.hash = "#/?" + q.toString()
  } },
  field("title", "title contains", { type: "search", id: "search" }),
  field("cwd", "cwd"),
  field("cwd_prefix", "cwd starts with"),
  el("label", {}, "updated since (UTC) ", el("input", { name: "updated_since", type: "datetime-local",
    value: since ? new Date(Number(since)).toISOString().slice(0, 16) : "" })),
  el("label", {}, "per page ", el("select", { name: "limit" }, ...["20", "50", "100", "500"].map((n) =>
    el("option", { value: n, selected: n === limit }, n)))),
  el("button", { type: "submit", text: "Filter" }))

  const byName = el("input", { id: "open-name", placeholder: "a session or stream name", size: 30 })
  const open = el("form", { class: "open", onsubmit: (ev) => ev.preventDefault() },
    "Open by name: ", byName, " ",
    el("button", { type: "button", text: "session", onclick: () => byName.value && (location.hash = sessionHref(byName.value.trim())) }),
    " ", el("button", { type: "button", text: "stream", onclick: () => byName.value && (location.hash = streamHref(byName.value.trim())) }))

  const body = el("tbody")
  const table = el("table", { id: "sessions", class: "sessions" },
    el("thead", {}, el("tr", {}, ...["name", "title", "first message", "cwd", "updated", "entries", "size", "fork of"].map((h) => el("th", { text: h })))),
    body)
  const paging = el("div", { class: "paging" })
  const info = el("p", { class: "dim", id: "list-info", text: "loading…" })
  main.append(el("section", { id: "list-view" }, form, open, info, table, paging))

  const query = new URLSearchParams({ limit })
  if (params.get("after")) query.set("after", params.get("after"))
  if (params.get("title")) query.set("title_contains", params.get("title"))
  for (const key of ["cwd", "cwd_prefix", "updated_since"]) if (params.get(key)) query.set(key, params.get(key))

  const load = async () => {
    try {
      const page = await getJson(`/v1/sessions?${query}`, { signal: ac.signal })
      remember(page.sessions)
      // The listing's order is the store's (by id); within a page, newest first.
      const rows = [...page.sessions].sort((a, b) => (b.updated_at_ms || 0) - (a.updated_at_ms || 0))
      body.replaceChildren(...rows.map((s) => el("tr", { class: "session-row", "data-name": s.name },
        el("td", {}, el("a", { href: sessionHref(s.name), text: s.name })),
        el("td", { text: s.title || "" }),
        el("td", { class: "first", text: s.first_message || "" }),
        el("td", { text: s.cwd || "" }),
        el("td", { text: fmtTime(s.updated_at_ms) }),
        el("td", { class: "num", text: s.entries }),
        el("td", { class: "num", text: fmtBytes(s.bytes || 0) }),
        el("td", {}, s.fork_of ? forkLink(s.fork_of) : ""))))
      info.textContent = rows.length
        ? `${rows.length} session${rows.length === 1 ? "" : "s"} on this page (newest first within the page)`
        : page.next ? "none of the sessions on this page match; the next page may hold more" : "no sessions"
      paging.replaceChildren(
        params.get("after") ? el("a", { href: "#/?" + without(params, "after"), text: "« first page" }) : "",
        " ",
        page.next ? el("a", { id: "next-page", href: "#/?" + withParam(params, "after", page.next), text: "next page »" }) : "")
      document.body.dataset.listLoaded = "1"
    } catch (err) {
      info.textContent = ""
      showError(err, load)
    }
  }
  load()
  return { close: () => ac.abort() }
}

function without(params, key) {
  const q = new URLSearchParams(params)
  q.delete(key)
  return q.toString()
}

function withParam(params, key, value) {
  const q = new URLSearchParams(params)
  q.set(key, value)
  return q.toString()
}

function forkLink(fork) {
  const name = known.names.get(fork.session_id) || fork.session_id
  return el("span", { class: "fork-of" }, el("a", { href: sessionHref(name), class: "fork-link", text: name }),
    fork.entry_id ? el("span", { class: "dim", text: ` at ${fork.entry_id}` }) : "")
}

// A session's listing row (for its fork source): from the pages seen, or by walking a few
// pages of the listing filtered by its title.
async function findRow(name, title, signal) {
  if (known.rows.has(name)) return known.rows.get(name)
  let after = null
  for (let pages = 0; pages < 20; pages++) {
    const q = new URLSearchParams({ limit: "500" })
    if (title) q.set("title_contains", title)
    if (after) q.set("after", after)
    const page = await getJson(`/v1/sessions?${q}`, { signal })
    remember(page.sessions)
    if (known.rows.has(name)) return known.rows.get(name)
    if (!page.next) return null
    after = page.next
  }
  return null
}

// --- a session ---------------------------------------------------------------------------------

function sessionView(name, started) {
  const ac = new AbortController()
  const model = new SessionModel()
  let selected = null
  let onPath = new Set()
  let summarised = new Set()
  let contextAbort = null
  let contextTimer = 0
  let firstDrawn = false

  const status = statusLine()
  const title = el("span", { id: "session-title", class: "title" })
  const meta = el("span", { id: "session-meta", class: "dim" })
  const forkInfo = el("span", { id: "fork-info" })
  const treeBox = el("div", { id: "tree", class: "tree", tabindex: "0" })
  const entryBox = el("div", { id: "entry", class: "entry" })
  const contextHead = el("div", { id: "context-head", class: "context-head" })
  const contextBox = el("div", { id: "context", class: "context" })
  main.append(el("section", { id: "session-view", class: "session-view", "data-name": name },
    el("header", { class: "session-head" },
      el("h2", {}, el("a", { href: "#/", text: "sessions" }), " / ", el("span", { id: "session-name", text: name })),
      title, " ", meta, " ", forkInfo, " ", status),
    el("div", { class: "panes" },
      el("div", { class: "pane left" }, el("div", { class: "pane-title", text: "tree (click an entry to see the context there)" }), treeBox),
      el("div", { class: "pane right" }, entryBox, el("div", { class: "pane-title", id: "context-title", text: "what the model saw" }), contextHead, contextBox))))

  const list = new WindowedList(treeBox, { rowHeight: ROW_HEIGHT, render: drawRow })

  function drawRow(node, index) {
    const row = model.rows[index]
    const entry = model.byId.get(row.id)
    const [kind, text] = preview(entry, model)
    const label = model.labels.get(row.id)
    const classes = ["vrow", "row", ...kind.split(" ")]
    if (onPath.has(row.id)) classes.push("on-path")
    if (row.id === selected) classes.push("selected")
    if (row.id === model.leafId) classes.push("current-leaf")
    if (summarised.has(row.id)) classes.push("summarised")
    node.className = classes.join(" ")
    node.dataset.id = row.id
    node.style.paddingLeft = `${6 + row.depth * 14}px`
    const mark = row.id === model.leafId ? "◆" : row.leaf ? "◇" : row.branch ? "┳" : "│"
    node.replaceChildren(
      el("span", { class: "mark", text: mark }),
      label ? el("span", { class: "label", text: label }) : "",
      el("span", { class: "text", text }),
      row.id === model.leafId ? el("span", { class: "tag", text: "current leaf" }) : "")
    node.title = `${entry.type} ${row.id}`
  }

  treeBox.addEventListener("click", (ev) => {
    const node = ev.target.closest(".vrow")
    if (node && node.dataset.id) select(node.dataset.id)
  })

  function select(id, { scroll = false } = {}) {
    selected = id
    onPath = new Set(model.path(id))
    summarised = new Set()
    for (const pid of onPath) {
      const e = model.byId.get(pid)
      if (e && e.type === "compaction" && !isTombstone(e)) for (const s of model.summarised(e)) summarised.add(s)
    }
    list.refresh()
    if (scroll && model.rowOf.has(id)) list.scrollTo(model.rowOf.get(id))
    drawEntry()
    scheduleContext(0)
  }

  function header() {
    title.textContent = model.name ? `“${model.name}”` : ""
    meta.textContent = `${model.entries.length} entries${model.isClaude ? " · Claude Code transcript" : ""}`
  }

  function drawEntry() {
    const entry = model.byId.get(selected)
    if (!entry) {
      entryBox.replaceChildren()
      return
    }
    const parts = [el("b", { text: entry.type }), " ", el("code", { text: entry.id }),
      el("span", { class: "dim", text: `  ${entry.timestamp || ""}` })]
    if (model.labels.get(entry.id)) parts.push(" ", el("span", { class: "label", text: model.labels.get(entry.id) }))
    const body = []
    if (isTombstone(entry)) {
      body.push(el("p", { class: "redacted-note", text: `Redacted: ${entry.redacted.reason || ""}. Its content is gone for every reader.` }))
    } else if (entry.type === "compaction") {
      const ids = model.summarised(entry)
      body.push(el("p", { text: `Summarises the ${ids.length} entries before ${entry.firstKeptEntryId} on this path (shown greyed in the tree)${entry.tokensBefore ? `, ${entry.tokensBefore} tokens` : ""}:` }),
        el("blockquote", { text: entry.summary || "" }))
    }
    body.push(el("details", { class: "fold raw" }, el("summary", { text: "entry as stored" }),
      el("pre", { class: "json" }, el("code", { text: JSON.stringify(entry, null, 2) }))))
    entryBox.replaceChildren(el("div", { class: "entry-head" }, ...parts), ...body)
  }

  function scheduleContext(delay = 100) {
    clearTimeout(contextTimer)
    contextTimer = setTimeout(loadContext, delay)
  }

  async function loadContext() {
    if (contextAbort) contextAbort.abort()
    const mine = new AbortController()
    contextAbort = mine
    ac.signal.addEventListener("abort", () => mine.abort(), { once: true })
    const leaf = selected
    if (leaf === null) return
    if (model.isClaude) {
      // A transcript's entries wrap the SDK's own: shown in commit order up to the chosen one.
      const upTo = model.position.get(leaf) ?? model.entries.length - 1
      const items = model.entries.slice(0, upTo + 1).filter((e) => isTombstone(e) || (e.type === "custom" && e.customType === CLAUDE_ENTRY))
      contextHead.replaceChildren(el("span", { class: "dim", text: `transcript up to ${leaf}: ${items.length} entries` }))
      drawMessages(items.map((e) => () => (isTombstone(e) ? redactedBox(e) : claudeEntry(e.data))), leaf)
      return
    }
    try {
      const ctx = await getJson(`${sessionPath(name, "context")}?leaf=${encodeURIComponent(leaf)}`, { signal: mine.signal })
      if (mine.signal.aborted || leaf !== selected) return
      const modelName = ctx.model ? `${ctx.model.provider || ""}/${ctx.model.modelId || ""}` : "none yet"
      contextHead.replaceChildren(el("span", { class: "dim", text:
        `at ${leaf}: ${ctx.messages.length} messages · model ${modelName}${ctx.thinkingLevel ? ` · thinking ${ctx.thinkingLevel}` : ""}` }))
      drawMessages(ctx.messages.map((m) => () => message(m)), leaf)
    } catch (err) {
      if (mine.signal.aborted) return
      if (err instanceof ApiError && err.status === 404 && /is a stream/.test(err.detail || "")) {
        location.replace(streamHref(name))
        return
      }
      contextBox.replaceChildren(el("p", { class: "error", text: problemText(err) }))
      if (err instanceof ApiError && err.status === 401) showError(err, () => route())
    }
  }

  function redactedBox(entry) {
    return el("div", { class: "msg redacted" }, el("div", { class: "msg-head" }, el("span", { class: "role", text: "redacted" })),
      el("p", { text: entry.redacted.reason || "" }))
  }

  // The newest CONTEXT_PAGE messages, and a button for each earlier page.
  function drawMessages(makers, leaf) {
    let shown = Math.min(CONTEXT_PAGE, makers.length)
    const list = el("div", { class: "messages", "data-leaf": leaf })
    const more = el("button", { type: "button", id: "show-earlier", class: "more" })
    const update = () => {
      const hidden = makers.length - shown
      more.hidden = hidden <= 0
      more.textContent = `show ${Math.min(hidden, 200)} earlier messages (${hidden} not shown)`
    }
    more.addEventListener("click", () => {
      const from = Math.max(0, makers.length - shown - 200)
      const nodes = makers.slice(from, makers.length - shown).map((make) => make())
      list.prepend(...nodes)
      shown = makers.length - from
      update()
    })
    list.append(...makers.slice(makers.length - shown).map((make) => make()))
    update()
    contextBox.replaceChildren(more, list)
    contextBox.dataset.leaf = leaf
  }

  function drawTree() {
    list.setCount(model.rows.length, { now: !firstDrawn })
    if (!firstDrawn && model.rows.length) {
      firstDrawn = true
      // When the first rows were on screen: since this view started, and since navigation.
      document.body.dataset.firstRowsMs = (performance.now() - started).toFixed(1)
      document.body.dataset.firstRowsAt = performance.now().toFixed(1)
    }
  }

  const start = async () => {
    try {
      const { offset, closed } = await readAll(name, (chunk) => {
        if (!chunk.messages || !isJson(chunk.contentType)) throw new ApiError(404, "stream-not-found", `${name} is a stream, not a session`)
        model.add(chunk.messages)
        header()
        drawTree()
      }, { signal: ac.signal })
      drawTree()
      header()
      if (model.leafId) select(model.leafId, { scroll: true })
      else contextBox.replaceChildren(el("p", { class: "dim", text: "no entries yet" }))
      const row = known.rows.get(name) || await findRow(name, model.name, ac.signal).catch(() => null)
      if (row && row.fork_of) forkInfo.replaceChildren("fork of ", forkLink(row.fork_of))
      if (closed) {
        setStatus(status, "closed")
        return
      }
      await follow(name, offset, {
        json: true, signal: ac.signal,
        onState: (state, err) => setStatus(status, state, err),
        onData: (items) => {
          const wasLeaf = selected === null || selected === model.leafId
          const { added, redacted } = model.add(items)
          if (!added.length) return
          header()
          drawTree()
          if (wasLeaf) select(model.leafId, { scroll: true })
          else if (redacted.length) {
            drawEntry()
            scheduleContext()
          }
        },
      })
    } catch (err) {
      if (ac.signal.aborted) return
      if (err instanceof ApiError && err.status === 404 && /is a stream/.test(err.detail || "")) {
        location.replace(streamHref(name))
        return
      }
      setStatus(status, "refused", err)
      showError(err, () => route())
    }
  }
  start()
  return {
    close: () => {
      ac.abort()
      clearTimeout(contextTimer)
      list.destroy()
    },
  }
}

// --- a stream that is not a session ------------------------------------------------------------

function streamView(name, started) {
  const ac = new AbortController()
  const status = statusLine()
  const meta = el("span", { id: "stream-meta", class: "dim" })
  const listBox = el("div", { id: "messages", class: "tree" })
  const detail = el("div", { id: "message", class: "entry" })
  const textBox = el("pre", { id: "stream-text", class: "stream-text", hidden: true })
  main.append(el("section", { id: "stream-view", class: "session-view", "data-name": name },
    el("header", { class: "session-head" },
      el("h2", {}, el("a", { href: "#/", text: "sessions" }), " / stream ", el("span", { id: "stream-name", text: name })),
      meta, " ", status),
    el("div", { class: "panes" },
      el("div", { class: "pane left" }, el("div", { class: "pane-title", text: "messages, in commit order" }), listBox, textBox),
      el("div", { class: "pane right" }, el("div", { class: "pane-title", text: "message" }), detail))))

  const items = []
  let contentType = ""
  let bytes = 0
  let chosen = -1
  const list = new WindowedList(listBox, { rowHeight: ROW_HEIGHT, render: (node, index) => {
    const value = items[index]
    node.className = `vrow row msgrow${index === chosen ? " selected" : ""}`
    node.dataset.index = String(index)
    const text = typeof value === "string" ? value : JSON.stringify(value)
    node.replaceChildren(el("span", { class: "mark", text: String(index + 1) }), el("span", { class: "text", text: text.length > 300 ? text.slice(0, 299) + "…" : text }))
  } })
  listBox.addEventListener("click", (ev) => {
    const node = ev.target.closest(".vrow")
    if (!node) return
    chosen = Number(node.dataset.index)
    detail.replaceChildren(el("pre", { class: "json" }, el("code", { text: JSON.stringify(items[chosen], null, 2) })))
    list.refresh()
  })
  const decoder = new TextDecoder()
  const take = (chunk) => {
    contentType = chunk.contentType || contentType
    if (chunk.messages) items.push(...chunk.messages)
    else if (chunk.bytes) addBytes(chunk.bytes)
  }
  const addBytes = (data) => {
    bytes += data.length
    if (/^text\//i.test(contentType)) {
      textBox.hidden = false
      listBox.hidden = true
      textBox.textContent = (textBox.textContent + decoder.decode(data, { stream: true })).slice(-1_000_000)
    }
  }
  const show = () => {
    if (isJson(contentType)) {
      list.setCount(items.length)
      meta.textContent = `${contentType} · ${items.length} messages`
    } else {
      listBox.hidden = true
      meta.textContent = `${contentType} · ${bytes} bytes`
    }
    if (!document.body.dataset.firstRowsMs) document.body.dataset.firstRowsMs = (performance.now() - started).toFixed(1)
  }
  const start = async () => {
    try {
      const { offset, closed } = await readAll(name, (chunk) => { take(chunk); show() }, { signal: ac.signal })
      show()
      if (closed) {
        setStatus(status, "closed")
        return
      }
      await follow(name, offset, {
        json: isJson(contentType), signal: ac.signal,
        onState: (state, err) => setStatus(status, state, err),
        onData: (data) => {
          for (const item of data) {
            if (item instanceof Uint8Array) addBytes(item)
            else if (typeof item === "string" && !isJson(contentType)) addBytes(new TextEncoder().encode(item))
            else items.push(item)
          }
          show()
          if (isJson(contentType)) list.scrollTo(items.length - 1)
        },
      })
    } catch (err) {
      if (ac.signal.aborted) return
      setStatus(status, "refused", err)
      showError(err, () => route())
    }
  }
  start()
  return { close: () => { ac.abort(); list.destroy() } }
}

window.addEventListener("hashchange", route)
route()
