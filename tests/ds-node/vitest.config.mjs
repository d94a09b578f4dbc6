// vitest for tests/ds-node: only the conformance suite's entry file, from this directory
// (vitest never looks under node_modules, where the suite itself lives).
import { fileURLToPath } from "node:url"
import { defineConfig } from "vitest/config"

export default defineConfig({
  root: fileURLToPath(new URL(".", import.meta.url)),
  test: {
    include: ["conformance.test.mjs"],
  },
})
