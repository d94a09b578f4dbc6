// The Durable Streams server conformance suite (@durable-streams/server-conformance-tests),
// run against the server at CONFORMANCE_TEST_URL (scheme://host:port, no trailing slash).
// tests/test_http_conformance.py runs it with `npx vitest run` against `sessionstore serve`.
// A local test file because the package's own CLI hands vitest a runner under node_modules,
// which vitest excludes ("No test files found").
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

const baseUrl = process.env.CONFORMANCE_TEST_URL
if (!baseUrl) throw new Error("CONFORMANCE_TEST_URL is required, e.g. http://127.0.0.1:4437")

runConformanceTests({ baseUrl })
