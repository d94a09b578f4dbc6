// The TypeScript SDK's store-backed functions on HttpSessionStore and, for comparison, on the
// SDK's own InMemorySessionStore; then the SessionStore contract under concurrent writers
// re-sending batches. Prints one JSON object; tests/test_claude_ts.py judges it.
// env: BASE (the service), TOKEN, CLAUDE_CONFIG_DIR (holding projects/<P>/<SID>.jsonl), DIR, SID
import {
  InMemorySessionStore, deleteSession, forkSession, getSessionMessages, getSubagentMessages,
  importSessionToStore, listSessions, listSubagents, renameSession, tagSession,
} from "@anthropic-ai/claude-agent-sdk"
import { HttpSessionStore } from "../../store/http/js/claude-session-store.mjs"

const { BASE, TOKEN, DIR, SID } = process.env

function brief(info) {
  return { sessionId: info.sessionId, summary: info.summary, customTitle: info.customTitle ?? null,
           firstPrompt: info.firstPrompt ?? null, tag: info.tag ?? null, cwd: info.cwd ?? null }
}

async function scenario(store) {
  const opts = { dir: DIR, sessionStore: store }
  const out = {}
  await importSessionToStore(SID, store, { dir: DIR, includeSubagents: true })
  out.listed = (await listSessions(opts)).map(brief)
  out.messages = (await getSessionMessages(SID, opts)).map((m) => m.uuid)
  out.subagents = await listSubagents(SID, opts)
  out.subagentMessages = out.subagents.length
    ? (await getSubagentMessages(SID, out.subagents[0], opts)).map((m) => m.uuid) : []
  await renameSession(SID, "A renamed session", opts)
  await tagSession(SID, "urgent", opts)
  out.afterRenameAndTag = (await listSessions(opts)).map(brief)
  const fork = await forkSession(SID, opts)
  out.forkMessages = (await getSessionMessages(fork.sessionId, opts)).length
  out.sessionsWithFork = (await listSessions(opts)).length
  await deleteSession(fork.sessionId, opts)
  out.afterDelete = (await listSessions(opts)).map((s) => s.sessionId)
  return out
}

async function contract(store) {
  // Four writers on one transcript, every batch sent twice (a lost answer), in parallel.
  const key = { projectKey: "contract", sessionId: "s-" + Date.now() }
  const writers = [0, 1, 2, 3].map(async (w) => {
    for (let b = 0; b < 10; b++) {
      const batch = [0, 1].map((i) => ({
        type: "user", uuid: `w${w}-b${b}-${i}`, timestamp: new Date().toISOString(),
        message: { role: "user", content: `writer ${w} batch ${b} entry ${i}` },
      }))
      await Promise.all([store.append(key, batch), store.append(key, batch)])
    }
  })
  await Promise.all(writers)
  const loaded = (await store.load(key)).map((e) => e.uuid)
  const never = await store.load({ projectKey: "contract", sessionId: "never-written" })
  await store.append({ ...key, subpath: "subagents/agent-x" }, [{ type: "user", uuid: "sub-1" }])
  const subkeys = await store.listSubkeys(key)
  const listed = (await store.listSessions("contract")).map((s) => s.sessionId)
  let badKey = null
  try {
    await store.append({ projectKey: "", sessionId: "x" }, [])
  } catch (e) {
    badKey = e.status
  }
  return { key, loaded, never, subkeys, listed, badKey }
}

const http = new HttpSessionStore(BASE, { token: TOKEN })
const result = {
  memory: await scenario(new InMemorySessionStore()),
  http: await scenario(http),
  contract: await contract(http),
  load: await http.load({ projectKey: process.env.PROJECT_KEY, sessionId: SID }),
}
console.log(JSON.stringify(result))
