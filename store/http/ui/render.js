// How entries and messages look: one-line previews for the tree's rows, and whole messages
// (text with code blocks, tool calls and results collapsible, images as images) for "what the
// model saw". Everything is written as text nodes: no content of a session is ever parsed
// as HTML.

import { CLAUDE_ENTRY, isTombstone } from "./model.js"

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag)
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue
    if (key === "class") node.className = value
    else if (key === "text") node.textContent = value
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value)
    else node.setAttribute(key, value === true ? "" : String(value))
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue
    node.append(child instanceof Node ? child : document.createTextNode(String(child)))
  }
  return node
}

const oneLine = (text, max = 160) => {
  const line = String(text).replace(/\s+/g, " ").trim()
  return line.length > max ? line.slice(0, max - 1) + "…" : line
}

// The text of pi content (a string or blocks), for previews.
export function contentText(content) {
  if (typeof content === "string") return content
  if (!Array.isArray(content)) return ""
  return content.map((block) => {
    if (!block || typeof block !== "object") return ""
    if (block.type === "text") return block.text || ""
    if (block.type === "toolCall") return `[${block.name}]`
    if (block.type === "image") return "[image]"
    if (block.type === "thinking") return ""
    if (block.type === "tool_use") return `[${block.name}]`
    if (block.type === "tool_result") return "[result] " + contentText(block.content)
    return ""
  }).filter(Boolean).join(" ")
}

// A tree row's kind (a CSS class) and one-line text.
export function preview(entry, model) {
  if (isTombstone(entry)) {
    return ["redacted", `redacted ${entry.type || "entry"}: ${entry.redacted.reason || ""}`]
  }
  switch (entry.type) {
    case "message": {
      const m = entry.message || {}
      if (m.role === "toolResult") {
        return [m.isError ? "tool failed" : "tool", `${m.toolName || "tool"} → ${oneLine(contentText(m.content))}`]
      }
      if (m.role === "bashExecution") return ["tool", `$ ${oneLine(m.command || "")}`]
      return [m.role || "message", `${m.role}: ${oneLine(contentText(m.content))}`]
    }
    case "compaction": {
      const n = model ? model.summarised(entry).length : 0
      return ["compaction", `compaction: summarises ${n} earlier ${n === 1 ? "entry" : "entries"} — ${oneLine(entry.summary || "")}`]
    }
    case "branch_summary":
      return ["summary", `branch summary: ${oneLine(entry.summary || "")}`]
    case "label":
      return ["meta", entry.label ? `label “${entry.label}” on ${entry.targetId}` : `label removed from ${entry.targetId}`]
    case "session_info":
      return ["meta", `name: ${entry.name ?? ""}`]
    case "model_change":
      return ["meta", `model: ${entry.provider || ""}/${entry.modelId || ""}`]
    case "thinking_level_change":
      return ["meta", `thinking: ${entry.thinkingLevel}`]
    case "redaction":
      return ["meta", `redaction of ${entry.targetId}: ${entry.reason || ""}`]
    case "custom":
      if (entry.customType === CLAUDE_ENTRY) return claudePreview(entry.data)
      return ["meta", `custom ${entry.customType || ""}`]
    case "custom_message":
      return ["custom", `${entry.customType || "custom"}: ${oneLine(contentText(entry.content))}`]
    default:
      return ["meta", String(entry.type)]
  }
}

function claudePreview(data) {
  if (!data || typeof data !== "object") return ["meta", "claude entry"]
  const m = data.message
  if (m && typeof m === "object") {
    const role = m.role || data.type
    const blocks = Array.isArray(m.content) ? m.content : []
    const kind = blocks.some((b) => b && b.type === "tool_result") ? "tool" : role
    return [kind, `${role}: ${oneLine(contentText(m.content))}`]
  }
  if (data.type === "summary") return ["summary", `summary: ${oneLine(data.summary || "")}`]
  return ["meta", String(data.type || "claude entry")]
}

// --- whole messages --------------------------------------------------------------------------

// Text with ``` fences as code blocks, blank lines as paragraphs, and `inline code`.
export function richText(text) {
  const out = el("div", { class: "text" })
  const flushText = (lines) => {
    for (const para of lines.join("\n").split(/\n{2,}/)) {
      if (!para.trim()) continue
      const p = el("p")
      para.split(/`([^`\n]+)`/).forEach((bit, i) => p.append(i % 2 ? el("code", { text: bit }) : document.createTextNode(bit)))
      out.append(p)
    }
  }
  const code = (lines, lang) => el("pre", { class: "code", "data-lang": lang || null }, el("code", { text: lines.join("\n") }))
  let buffer = []
  let lang = null
  for (const line of String(text).split("\n")) {
    const fence = line.match(/^\s*```(.*)$/)
    if (!fence) {
      buffer.push(line)
    } else if (lang !== null) {
      out.append(code(buffer, lang))
      buffer = []
      lang = null
    } else {
      flushText(buffer)
      buffer = []
      lang = fence[1].trim()
    }
  }
  if (lang !== null) out.append(code(buffer, lang))
  else flushText(buffer)
  return out
}

const IMAGE_TYPES = /^image\/(png|jpeg|gif|webp)$/

function image(data, mimeType) {
  if (typeof data !== "string" || !IMAGE_TYPES.test(mimeType || "")) return el("div", { class: "note", text: "[image]" })
  return el("img", { class: "image", src: `data:${mimeType};base64,${data}`, alt: "image" })
}

function collapsible(summary, body, { open = false, cls = "" } = {}) {
  return el("details", { class: `fold ${cls}`, open }, el("summary", {}, summary), body)
}

function json(value) {
  return el("pre", { class: "json" }, el("code", { text: JSON.stringify(value, null, 2) }))
}

// pi content: a string, or blocks of text, images, thinking and tool calls.
function piContent(content) {
  if (typeof content === "string") return [richText(content)]
  if (!Array.isArray(content)) return content === undefined ? [] : [json(content)]
  return content.map((block) => {
    if (!block || typeof block !== "object") return json(block)
    switch (block.type) {
      case "text": return richText(block.text || "")
      case "image": return image(block.data, block.mimeType)
      case "thinking": return collapsible("thinking", richText(block.thinking || ""), { cls: "thinking" })
      case "toolCall":
        return collapsible(el("span", {}, "tool call ", el("b", { text: block.name || "" }), " ",
          el("span", { class: "dim", text: oneLine(JSON.stringify(block.arguments ?? {}), 100) })),
        json(block.arguments ?? {}), { cls: "toolcall" })
      default: return json(block)
    }
  })
}

// One message of a context (pi's roles, and the summaries build_context adds).
export function message(m) {
  if (!m || typeof m !== "object") return el("div", { class: "msg" }, json(m))
  const role = m.role
  const head = (label, extra) => el("div", { class: "msg-head" }, el("span", { class: "role", text: label }), extra || null)
  switch (role) {
    case "user":
      return el("div", { class: "msg user" }, head("user"), ...piContent(m.content))
    case "assistant":
      return el("div", { class: "msg assistant" },
        head("assistant", m.model ? el("span", { class: "dim", text: ` ${m.model}` }) : null),
        ...piContent(m.content),
        m.errorMessage ? el("div", { class: "error-text", text: m.errorMessage }) : null)
    case "toolResult":
      return el("div", { class: `msg toolresult${m.isError ? " is-error" : ""}` },
        collapsible(el("span", {}, m.isError ? "tool error " : "tool result ", el("b", { text: m.toolName || "" }),
          " ", el("span", { class: "dim", text: oneLine(contentText(m.content), 100) })),
        el("div", {}, ...piContent(m.content))))
    case "compactionSummary":
      return el("div", { class: "msg compaction" },
        head("compaction", el("span", { class: "dim", text: m.tokensBefore ? ` summary of ${m.tokensBefore} tokens of earlier conversation` : " summary of the earlier conversation" })),
        richText(m.summary || ""))
    case "branchSummary":
      return el("div", { class: "msg summary" }, head("branch summary", el("span", { class: "dim", text: " of an abandoned branch" })),
        richText(m.summary || ""))
    case "bashExecution":
      return el("div", { class: "msg toolresult" },
        collapsible(el("span", {}, "$ ", el("b", { text: m.command || "" })), el("pre", { class: "code" }, el("code", { text: m.output || "" }))))
    case "custom":
      return el("div", { class: "msg custom" }, head(m.customType || "custom"), ...piContent(m.content))
    default:
      return el("div", { class: "msg" }, head(String(role ?? "message")), json(m))
  }
}

// One entry of a Claude Code transcript (the SDK's entry, as the adapter stores it).
export function claudeEntry(data) {
  if (!data || typeof data !== "object") return el("div", { class: "msg" }, json(data))
  const m = data.message
  if (!m || typeof m !== "object") {
    if (data.type === "summary") return el("div", { class: "msg summary" }, el("div", { class: "msg-head" }, el("span", { class: "role", text: "summary" })), richText(data.summary || ""))
    return el("div", { class: "msg meta" }, collapsible(String(data.type || "entry"), json(data)))
  }
  const role = m.role || data.type
  const blocks = typeof m.content === "string" ? [{ type: "text", text: m.content }] : Array.isArray(m.content) ? m.content : []
  const body = blocks.map((b) => {
    if (!b || typeof b !== "object") return json(b)
    switch (b.type) {
      case "text": return richText(b.text || "")
      case "thinking": return collapsible("thinking", richText(b.thinking || ""), { cls: "thinking" })
      case "tool_use":
        return collapsible(el("span", {}, "tool call ", el("b", { text: b.name || "" })), json(b.input ?? {}), { cls: "toolcall" })
      case "tool_result": {
        const inner = typeof b.content === "string" ? [richText(b.content)] : (Array.isArray(b.content) ? b.content : []).map((c) =>
          c && c.type === "text" ? richText(c.text || "") : c && c.type === "image" && c.source ? image(c.source.data, c.source.media_type) : json(c))
        return collapsible(el("span", {}, b.is_error ? "tool error" : "tool result"), el("div", {}, ...inner), { cls: "toolresult" })
      }
      case "image": return b.source ? image(b.source.data, b.source.media_type) : json(b)
      default: return json(b)
    }
  })
  return el("div", { class: `msg ${role}` },
    el("div", { class: "msg-head" }, el("span", { class: "role", text: role }), m.model ? el("span", { class: "dim", text: ` ${m.model}` }) : null),
    ...body)
}

export function problemText(err) {
  if (!err) return ""
  if (err.status === 401) return "401: this service needs a bearer token (a read-only one is enough), or the token was refused."
  if (err.status === 403) return `403: ${err.detail || "this token may not read that"}`
  if (err.status === 404) return `404: ${err.detail || "not found"}`
  return err.status ? `${err.status}: ${err.detail || err.code || "refused"}` : String(err.message || err)
}
