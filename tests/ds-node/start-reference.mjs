// The reference Durable Streams server (@durable-streams/server), in memory, for comparisons
// (benchmarks). Environment: PORT (default 4437), LONG_POLL_TIMEOUT in ms (default 500, the
// setting the conformance suite's own repo uses), HOST (default 127.0.0.1).
// Prints "ref server on URL ..." once it listens; stops on SIGINT/SIGTERM.
import { DurableStreamTestServer } from "@durable-streams/server"

const port = Number(process.env.PORT || 4437)
const host = process.env.HOST || "127.0.0.1"
const longPollTimeout = Number(process.env.LONG_POLL_TIMEOUT || 500)

const server = new DurableStreamTestServer({ port, host, longPollTimeout })
await server.start()
console.log(`ref server on ${server.url} longPollTimeout=${longPollTimeout}`)

for (const signal of ["SIGINT", "SIGTERM"]) {
  process.on(signal, async () => {
    await server.stop()
    process.exit(0)
  })
}
