// Types of claude-session-store.mjs: the TypeScript Claude Agent SDK's SessionStore over
// sessionstore's HTTP service (checked by tests/test_claude_ts.py with tsc against the SDK's
// own declarations).
import type { SessionKey, SessionStore, SessionStoreEntry, SessionSummaryEntry } from "@anthropic-ai/claude-agent-sdk"

export declare class SessionStoreHttpError extends Error {
  readonly status: number
  readonly problem: { status?: number; code?: string; detail?: string } | undefined
}

export declare class HttpSessionStore implements SessionStore {
  constructor(baseUrl: string, options?: { token?: string; fetch?: typeof fetch; timeoutMs?: number })
  append(key: SessionKey, entries: SessionStoreEntry[]): Promise<void>
  load(key: SessionKey): Promise<SessionStoreEntry[] | null>
  listSessions(projectKey: string): Promise<Array<{ sessionId: string; mtime: number }>>
  listSessionSummaries(projectKey: string): Promise<SessionSummaryEntry[]>
  delete(key: SessionKey): Promise<void>
  listSubkeys(key: { projectKey: string; sessionId: string }): Promise<string[]>
}
