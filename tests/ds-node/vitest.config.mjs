// vitest for tests/ds-node: only the conformance suite's entry file, from this directory
// (vitest never looks under node_modules, where the suite itself lives).
import { fileURLToPath } from "node:url"
import { defineConfig } from "vitest/config"

export default defineConfig({
  root: fileURLToPath(new URL(".", import.meta.url)),
  test: {
    include: ["conformance.test.mjs"],
    // vitest's default budget of 5 s per test is a timing assertion, and the project puts
    // none in its test suite: the suite's property tests make 100-250 sequential requests,
    // which the in-memory reference server answers in well under a second and two
    // `sessionstore serve` processes on S3 behind a balancer on 2 shared cores in 3-5 s,
    // more while other work loads the machine. What each test asserts is unchanged.
    testTimeout: 60_000,
  },
})
