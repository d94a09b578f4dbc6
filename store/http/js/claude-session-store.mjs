// The TypeScript Claude Agent SDK's SessionStore over sessionstore's HTTP service.
//
//   import { query } from "@anthropic-ai/claude-agent-sdk"
//   import { HttpSessionStore } from "./claude-session-store.mjs"
//
//   const sessionStore = new HttpSessionStore("http://sessions.internal:4437", { token: process.env.SESSIONSTORE_TOKEN })
//   for await (const message of query({ prompt: "hi", options: { sessionStore } })) { ... }
//
// Every method of the interface, optional ones included, is one POST to /v1/claude/<method>
// (store/http/claude.py), answered by the store's Python adapter: a transcript written from
// here and one written from Python are the same transcript, with the same guarantees (an
// entry's uuid stores it once however often it is sent, each writer's order is kept,
// summaries are folded under compare-and-set). No dependencies: the platform's fetch.

export class SessionStoreHttpError extends Error {
  constructor(status, problem) {
    super(`sessionstore: ${status} ${problem?.code ?? ""} ${problem?.detail ?? ""}`.trim())
    this.name = "SessionStoreHttpError"
    this.status = status
    this.problem = problem
  }
}

export class HttpSessionStore {
  #base
  #headers
  #fetch
  #timeoutMs

  /**
   * @param {string} baseUrl the service, e.g. "http://127.0.0.1:4437"
   * @param {{token?: string, fetch?: typeof fetch, timeoutMs?: number}} [options]
   *   token: a bearer token (its tenant is the transcripts' namespace); timeoutMs: per
   *   call (default 55 s, under the SDK's own 60 s, so that a slow call fails here first).
   */
  constructor(baseUrl, options = {}) {
    this.#base = String(baseUrl).replace(/\/+$/, "") + "/v1/claude/"
    this.#headers = { "content-type": "application/json" }
    if (options.token) this.#headers.authorization = `Bearer ${options.token}`
    this.#fetch = options.fetch ?? globalThis.fetch
    this.#timeoutMs = options.timeoutMs ?? 55_000
  }

  async #call(method, body) {
    const res = await this.#fetch(this.#base + method, {
      method: "POST",
      headers: this.#headers,
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(this.#timeoutMs),
    })
    if (res.status === 204) return undefined
    const text = await res.text()
    const value = text ? JSON.parse(text) : undefined
    if (!res.ok) throw new SessionStoreHttpError(res.status, value)
    return value
  }

  async append(key, entries) {
    // A rejection (a 503 whose outcome is unknown included) is retried by the SDK, which is
    // safe: entries carry their uuid, and the store keeps one copy of each.
    await this.#call("append", { key, entries })
  }

  async load(key) {
    return (await this.#call("load", { key })).entries
  }

  async listSessions(projectKey) {
    return this.#call("list-sessions", { projectKey })
  }

  async listSessionSummaries(projectKey) {
    return this.#call("list-session-summaries", { projectKey, dialect: "ts" })
  }

  async delete(key) {
    await this.#call("delete", { key })
  }

  async listSubkeys(key) {
    return this.#call("list-subkeys", { key: { projectKey: key.projectKey, sessionId: key.sessionId } })
  }
}
