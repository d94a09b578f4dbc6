// Opens pi session files with pi's own SessionManager and prints what pi makes of them.
// Usage: node open.mjs FILE... (run with this directory as cwd so node_modules resolves).
import { SessionManager } from "@mariozechner/pi-coding-agent";

const out = [];
for (const file of process.argv.slice(2)) {
  const sm = SessionManager.open(file);
  out.push({
    file,
    header: sm.getHeader(),
    entries: sm.getEntries(),
    leafId: sm.getLeafId() ?? null,
    branch: sm.getBranch().map((e) => e.id),
    context: sm.buildSessionContext(),
    name: sm.getSessionName() ?? null,
    labelMap: [...sm.labelsById], // every key, also targetIds that are not strings
  });
}
process.stdout.write(JSON.stringify(out));
