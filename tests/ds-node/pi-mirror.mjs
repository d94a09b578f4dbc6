// Mirror a live pi session file into sessionstore as pi writes it, with the stock
// Durable Streams client: every entry pi appends to the file becomes an entry of the
// session <name>, readable and followable by any worker, in any language.
//
//   node pi-mirror.mjs ~/.pi/agent/sessions/<dir>/<file>.jsonl http://127.0.0.1:4437/v1/stream/<name>
//
// SESSIONSTORE_TOKEN: a bearer token when the service has tokens. --idle SECONDS: stop after
// the file has not grown for that long (default: follow until interrupted). Restarting it
// is safe: entries already in the session are skipped, and a re-sent entry (same id, same
// content) is stored once whatever happens.
import { DurableStream, stream } from "@durable-streams/client"
import { open } from "node:fs/promises"
import { setTimeout as sleep } from "node:timers/promises"

const [file, url, ...rest] = process.argv.slice(2)
const idleIndex = rest.indexOf("--idle")
const idleMs = idleIndex >= 0 ? Number(rest[idleIndex + 1]) * 1000 : Infinity
const auth = process.env.SESSIONSTORE_TOKEN
  ? { Authorization: `Bearer ${process.env.SESSIONSTORE_TOKEN}` }
  : {}

// The file's first line is pi's session header: the session is created with its cwd.
let pos = 0
let partial = ""
let created = false
let have = new Set()
const handle = new DurableStream({ url, headers: auth, contentType: "application/json" })

async function readNewLines() {
  const fh = await open(file)
  try {
    const { size } = await fh.stat()
    if (size <= pos) return []
    const buf = Buffer.alloc(size - pos)
    await fh.read(buf, 0, buf.length, pos)
    pos = size
    partial += buf.toString("utf8")
  } finally {
    await fh.close()
  }
  const lines = partial.split("\n")
  partial = lines.pop() // a line pi is still writing
  return lines.filter((line) => line.trim()).map((line) => JSON.parse(line))
}

async function ensureSession(header) {
  const res = await fetch(url, {
    method: "PUT",
    headers: {
      ...auth,
      "content-type": "application/json",
      "stream-kind": "session",
      "session-cwd": header.cwd ?? "",
    },
  })
  if (res.status !== 201 && res.status !== 200) {
    throw new Error(`creating the session: ${res.status} ${await res.text()}`)
  }
  // What a previous run mirrored already.
  const existing = await stream({ url, headers: auth, live: false })
  have = new Set((await existing.json()).map((entry) => entry.id))
  created = true
}

let quietSince = Date.now()
for (;;) {
  const lines = await readNewLines()
  const entries = []
  for (const line of lines) {
    if (line.type === "session") {
      if (!created) await ensureSession(line)
    } else if (!have.has(line.id)) {
      entries.push(line)
    }
  }
  for (const entry of entries) {
    await handle.append(JSON.stringify(entry))
    have.add(entry.id)
  }
  if (lines.length) quietSince = Date.now()
  else if (Date.now() - quietSince > idleMs) break
  await sleep(100)
}
console.log(`mirrored ${have.size} entries of ${file} to ${url}`)
