// Talking to the service: the bearer token, requests and their problem documents, catch-up
// reads of a stream, and following one over the protocol's SSE (read with fetch(), since an
// EventSource cannot send an Authorization header). Only this origin's routes are called.

const TOKEN_KEY = "sessionstore.viewer.token"

export function token() {
  return sessionStorage.getItem(TOKEN_KEY)
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value)
  else sessionStorage.removeItem(TOKEN_KEY)
}

// A refused request: its status and the problem document's code and detail.
export class ApiError extends Error {
  constructor(status, code, detail) {
    super(detail || code || `HTTP ${status}`)
    this.status = status
    this.code = code
    this.detail = detail
  }
}

// A stream's or session's name in a path: each segment encoded, the slashes kept.
export function encodeName(name) {
  return name.split("/").map(encodeURIComponent).join("/")
}

export const streamPath = (name) => "/v1/stream/" + encodeName(name)
export const sessionPath = (name, verb) => "/v1/sessions/" + encodeName(name) + ":" + verb

export async function request(path, { signal, headers } = {}) {
  const h = new Headers(headers || {})
  const t = token()
  if (t) h.set("Authorization", "Bearer " + t)
  let res
  try {
    res = await fetch(path, { headers: h, signal, cache: "no-store", credentials: "omit" })
  } catch (err) {
    if (signal && signal.aborted) throw err
    throw new ApiError(0, "unreachable", "the service did not answer (" + err.message + ")")
  }
  if (!res.ok) {
    let code, detail
    try {
      const problem = await res.json()
      code = problem.code
      detail = problem.detail
    } catch {
      // not a problem document
    }
    throw new ApiError(res.status, code, detail)
  }
  return res
}

export async function getJson(path, options) {
  return (await request(path, options)).json()
}

// One catch-up read from `offset`: {messages (JSON) or text/bytes, next, upToDate, contentType}.
export async function readOnce(name, offset, { signal } = {}) {
  const res = await request(`${streamPath(name)}?offset=${encodeURIComponent(offset)}`, { signal })
  const contentType = res.headers.get("content-type") || ""
  const next = res.headers.get("stream-next-offset")
  const upToDate = res.headers.get("stream-up-to-date") === "true"
  const closed = res.headers.get("stream-closed") === "true"
  if (isJson(contentType)) {
    return { contentType, next, upToDate, closed, messages: await res.json() }
  }
  const bytes = new Uint8Array(await res.arrayBuffer())
  return { contentType, next, upToDate, closed, bytes }
}

// The whole stream so far, a read at a time (each read is at most 4 MiB of the stream):
// onChunk(chunk) after each read; resolves with the offset to follow from.
export async function readAll(name, onChunk, { signal } = {}) {
  let offset = "-1"
  for (;;) {
    const chunk = await readOnce(name, offset, { signal })
    onChunk(chunk)
    if (!chunk.next || chunk.next === offset) return { offset, closed: chunk.closed }
    offset = chunk.next
    if (chunk.upToDate || chunk.closed) return { offset, closed: chunk.closed }
  }
}

export function isJson(contentType) {
  return /^application\/json\b/i.test(contentType.trim())
}

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const timer = setTimeout(resolve, ms)
    signal?.addEventListener("abort", () => { clearTimeout(timer); resolve() }, { once: true })
  })

// Follows `name` from `offset` over SSE until `signal` aborts or the stream is closed.
// onData(items, nextOffset): the appends between two control events, in commit order (JSON:
// the messages; otherwise one Uint8Array or string per append). A batch is handed over only
// with the control event that follows it, so a connection dropped between the two resumes
// from the last offset handed over: nothing is missed and nothing repeated.
// onState(state, detail): "connecting", "live", "reconnecting", "closed", "refused".
// `json`: the stream is JSON (from its catch-up read's content type).
export async function follow(name, offset, { json, onData, onState, signal }) {
  let failures = 0
  while (!signal.aborted) {
    onState(failures ? "reconnecting" : "connecting")
    try {
      const res = await request(`${streamPath(name)}?offset=${encodeURIComponent(offset)}&live=sse`, {
        signal, headers: { accept: "text/event-stream" },
      })
      const base64 = res.headers.get("stream-sse-data-encoding") === "base64"
      onState("live")
      failures = 0
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader()
      let buffer = ""
      let pending = []
      for (;;) {
        const { value, done } = await reader.read()
        if (done) break
        buffer += value.replace(/\r\n?/g, "\n")
        let end
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end)
          buffer = buffer.slice(end + 2)
          const event = parseEvent(block)
          if (event === null) continue
          if (event.type === "data") {
            pending.push(event.data)
          } else if (event.type === "control") {
            const control = JSON.parse(event.data)
            const items = []
            for (const data of pending) items.push(...decodeData(data, json, base64))
            pending = []
            offset = control.streamNextOffset || offset
            if (items.length) onData(items, offset)
            if (control.streamClosed) {
              onState("closed")
              return offset
            }
          }
        }
      }
      // The response ended (the service closes one after --sse-max): go on from the offset.
    } catch (err) {
      if (signal.aborted) return offset
      if (err instanceof ApiError && [400, 401, 403, 404, 410].includes(err.status)) {
        onState("refused", err)
        return offset
      }
      failures += 1
      onState("reconnecting", err)
      await sleep(Math.min(250 * 2 ** failures, 5000), signal)
    }
  }
  return offset
}

// One SSE event block -> {type, data}; null for a comment (keep-alive) or an empty block.
export function parseEvent(block) {
  let type = "message"
  const data = []
  let any = false
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue
    const colon = line.indexOf(":")
    const field = colon < 0 ? line : line.slice(0, colon)
    let value = colon < 0 ? "" : line.slice(colon + 1)
    if (value.startsWith(" ")) value = value.slice(1)
    if (field === "event") type = value
    else if (field === "data") data.push(value)
    any = true
  }
  return any ? { type, data: data.join("\n") } : null
}

function decodeData(data, json, base64) {
  if (base64) {
    const raw = atob(data)
    const bytes = new Uint8Array(raw.length)
    for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i)
    return [bytes]
  }
  if (json) {
    // One append: the array of its messages.
    const value = JSON.parse(data)
    return Array.isArray(value) ? value : [value]
  }
  return [data]
}
