// Writes the pi fixture scenarios defined below into tests/fixtures/pi/: each scenario's
// session.jsonl exactly as pi's own SessionManager wrote it, its expected.json (what pi makes
// of the file once it opens it again, in the corpus's shape: see tests/fixtures/pi/README.md)
// and its row in index.json. Deterministic: pi's ids (crypto.randomUUID) and clock (Date) are
// seeded, so running it again rewrites the same bytes.
//
// Usage, with this directory as cwd (after `npm install --no-save --prefix tests/pi-node
// @mariozechner/pi-coding-agent@0.73.1`):  node make_fixtures.mjs [OUTPUT_DIR]
import crypto from "node:crypto";
import fs from "node:fs";
import { syncBuiltinESMExports } from "node:module";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const outputDir = path.resolve(process.argv[2] ?? path.join(here, "..", "fixtures", "pi"));

// --- determinism: seeded ids and a clock that ticks on every read ------------------------------

let state = 0x5eed1e55;
function random32() {
  // mulberry32
  state = (state + 0x6d2b79f5) >>> 0;
  let t = state;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return (t ^ (t >>> 14)) >>> 0;
}
function hex(n) {
  let out = "";
  while (out.length < n) out += random32().toString(16).padStart(8, "0");
  return out.slice(0, n);
}
crypto.randomUUID = () => {
  const h = hex(32);
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-4${h.slice(13, 16)}-a${h.slice(17, 20)}-${h.slice(20)}`;
};
syncBuiltinESMExports(); // pi's `import { randomUUID } from "crypto"` now sees the seeded one

const RealDate = Date;
let clock = 0;
function tick() {
  clock += 700 + (random32() % 1500);
  return clock;
}
globalThis.Date = class extends RealDate {
  constructor(...args) {
    super(...(args.length ? args : [tick()]));
  }
  static now() {
    return tick();
  }
};

const { SessionManager, truncateLine } = await import("@mariozechner/pi-coding-agent");
const piVersion = JSON.parse(
  fs.readFileSync(path.join(here, "node_modules/@mariozechner/pi-coding-agent/package.json"), "utf8"),
).version;

// --- message shapes, as pi's agent writes them -------------------------------------------------

const MODEL = { api: "anthropic-messages", provider: "anthropic", model: "claude-sonnet-4-5" };
function usage(input, output) {
  return {
    input,
    output,
    cacheRead: 0,
    cacheWrite: 0,
    totalTokens: input + output,
    cost: { input: input * 3e-6, output: output * 1.5e-5, cacheRead: 0, cacheWrite: 0, total: input * 3e-6 + output * 1.5e-5 },
  };
}
const user = (content) => ({ role: "user", content, timestamp: Date.now() });
function assistant(content, stopReason = "stop") {
  const blocks = typeof content === "string" ? [{ type: "text", text: content }] : content;
  return { role: "assistant", content: blocks, ...MODEL, usage: usage(120, 40), stopReason, timestamp: Date.now() };
}
const toolResult = (toolCallId, toolName, text, details, isError = false) => ({
  role: "toolResult",
  toolCallId,
  toolName,
  content: [{ type: "text", text }],
  details,
  isError,
  timestamp: Date.now(),
});

/** A label entry as appendLabelChange writes it, but with any targetId: appendLabelChange
 * itself refuses ids it does not know, so this goes through the writer it calls. */
function rawLabel(sm, targetId, label) {
  const entry = {
    type: "label",
    id: crypto.randomUUID().slice(0, 8),
    parentId: sm.getLeafId(),
    timestamp: new Date().toISOString(),
    targetId,
    label,
  };
  sm._appendEntry(entry);
  return entry.id;
}

// --- the scenarios -------------------------------------------------------------------------------

const SCENARIOS = [
  {
    name: "labels_without_string_target",
    category: "generated",
    description:
      "label entries whose targetId is missing, null, a number, a boolean, an object or an array (keys of pi's label Map, never an entry's label): set, clear, re-set; ordinary labels around them",
    start: RealDate.UTC(2025, 3, 2, 9, 0, 0),
    build(sm) {
      sm.appendModelChange("anthropic", "claude-sonnet-4-5");
      sm.appendThinkingLevelChange("off");
      const q1 = sm.appendMessage(user("Where is the config loaded?"));
      const a1 = sm.appendMessage(assistant("In src/config.ts, by loadConfig()."));
      sm.appendLabelChange(q1, "question");
      const noTarget = rawLabel(sm, undefined, "no target");
      rawLabel(sm, null, "null target");
      rawLabel(sm, 42, "number target");
      rawLabel(sm, "42", "string 42 target");
      rawLabel(sm, true, "boolean target");
      rawLabel(sm, 1, "number 1 target");
      const objectLabel = rawLabel(sm, { id: q1 }, "object target");
      rawLabel(sm, [q1], "array target");
      sm.appendMessage(user("And the defaults?"));
      const a2 = sm.appendMessage(assistant("In src/defaults.ts."));
      rawLabel(sm, undefined, undefined); // clears the missing-target key
      rawLabel(sm, null, ""); // clears the null key
      rawLabel(sm, { id: q1 }, ""); // another object: clears nothing
      rawLabel(sm, undefined, "no target again"); // set again: now last in the Map
      rawLabel(sm, 42, "number target, renamed"); // keeps its place
      sm.appendLabelChange(a1, "answer");
      sm.appendMessage(user("Thanks."));
      sm.appendMessage(assistant("You're welcome."));
      return { alternates: [0, noTarget, objectLabel, a2] };
    },
  },
  {
    name: "lone_surrogates",
    category: "generated",
    description:
      "strings holding lone UTF-16 surrogates (a grep line cut by pi's truncateLine inside an emoji, tool output cut at its start, keys, a label, the session name): JSON.stringify writes them as \\ud83d escapes",
    start: RealDate.UTC(2025, 3, 3, 14, 0, 0),
    build(sm) {
      sm.appendModelChange("anthropic", "claude-sonnet-4-5");
      sm.appendThinkingLevelChange("low");
      const q1 = sm.appendMessage(user("Find the release notes line with the emoji 🚀"));
      sm.appendMessage(
        assistant(
          [
            { type: "thinking", thinking: "grep for the rocket", thinkingSignature: "sig-1" },
            { type: "toolCall", id: "toolu_01", name: "grep", arguments: { pattern: "🚀", path: "NOTES.md" } },
          ],
          "toolUse",
        ),
      );
      // "NOTES.md:3: " is 12 code units, each emoji 2: cutting at 201 keeps half of the last one.
      const line = `NOTES.md:3: ${"🚀".repeat(150)}`;
      const cut = truncateLine(line, 201);
      sm.appendMessage(
        toolResult("toolu_01", "grep", cut.text, { linesTruncated: cut.wasTruncated, lastLine: cut.text.slice(-20) }),
      );
      const a1 = sm.appendMessage(assistant(`Line 3 is cut: it ends in ${"🚀".slice(0, 1)} (half a rocket).`));
      sm.appendMessage(user("Show the end of the build log."));
      sm.appendMessage({
        role: "bashExecution",
        command: "tail -c 21 build.log",
        output: "🎉🎉🎉 build ok 🎉".slice(1), // the tail cut the first emoji in half
        exitCode: 0,
        cancelled: false,
        truncated: true,
        timestamp: Date.now(),
      });
      sm.appendCustomEntry("emoji-index", {
        cut: "ab\ud83d",
        "\ud83d": "a key that is a lone high surrogate",
        "\udc00key": ["\ud800\ud800", "\udbff", "\ude00\ud83d"],
        mixed: "😀\ud83d😀\ude00",
      });
      sm.appendCustomMessageEntry("note", "partial: \udfff", true, { raw: "\ud83d" });
      sm.appendLabelChange(q1, "rocket \ud83d");
      sm.appendSessionInfo("Emoji hunt \ud83d");
      sm.appendMessage(user("Thanks \ude80"));
      sm.appendMessage(assistant("Done."));
      return { alternates: [0, a1] };
    },
  },
];

// --- what pi makes of a file (the corpus's expected.json) ----------------------------------------

function flattenTree(roots) {
  const nodes = [];
  const stack = [...roots].reverse();
  while (stack.length) {
    const node = stack.pop();
    nodes.push({
      id: node.entry.id,
      children: node.children.map((c) => c.entry.id),
      label: node.label,
      labelTimestamp: node.labelTimestamp,
    });
    stack.push(...[...node.children].reverse());
  }
  return { roots: roots.map((r) => r.entry.id), nodes };
}

async function sessionInfo(file) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "pi-info-"));
  fs.copyFileSync(file, path.join(dir, "session.jsonl"));
  const [info] = await SessionManager.list("/", dir);
  fs.rmSync(dir, { recursive: true });
  const text = info.allMessagesText;
  return {
    id: info.id,
    cwd: info.cwd,
    name: info.name,
    parentSessionPath: info.parentSessionPath,
    created: info.created.toISOString(),
    modified: info.modified.toISOString(),
    modifiedFellBackToMtime: false, // every scenario has timestamped messages
    messageCount: info.messageCount,
    firstMessage: info.firstMessage,
    allMessagesTextLength: text.length,
    allMessagesTextSha256: crypto.createHash("sha256").update(text).digest("hex"),
    allMessagesText: text,
  };
}

function view(sm) {
  const leaf = sm.getLeafEntry();
  return {
    leafId: sm.getLeafId() ?? null,
    leafEntryType: leaf?.type ?? null,
    branch: sm.getBranch().map((e) => e.id),
    context: sm.buildSessionContext(),
  };
}

async function expectedFor(scenario, file, alternateTargets) {
  const bytes = fs.readFileSync(file);
  const copy = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "pi-open-")), "session.jsonl");
  fs.writeFileSync(copy, bytes);
  const sm = SessionManager.open(copy);
  const rewritten = !fs.readFileSync(copy).equals(bytes);
  if (rewritten) throw new Error(`${scenario.name}: pi rewrote the file on open`);
  const header = sm.getHeader();
  const entries = sm.getEntries();
  const leafView = view(sm);
  const labels = {};
  for (const entry of entries) labels[entry.id] = sm.getLabel(entry.id) ?? null;
  const alternates = [];
  for (const target of alternateTargets) {
    const entryIndex = typeof target === "number" ? target : entries.findIndex((e) => e.id === target);
    const id = entries[entryIndex].id;
    sm.branch(id);
    alternates.push({ target: id, entryIndex, ...view(sm) });
  }
  sm.resetLeaf();
  const afterResetLeaf = view(sm);
  delete afterResetLeaf.leafEntryType;
  const reopened = SessionManager.open(copy);
  const expected = {
    schema: 1,
    scenario: scenario.name,
    piVersion,
    inputSha256: crypto.createHash("sha256").update(bytes).digest("hex"),
    inputBytes: bytes.length,
    rewrittenOnOpen: false,
    headerVersionInFile: JSON.parse(bytes.toString("utf8").split("\n")[0]).version ?? null,
    migration: null,
    idsGeneratedOnOpen: false,
    sessionInfo: await sessionInfo(file),
    sessionId: reopened.getSessionId(),
    cwd: header.cwd,
    leafId: leafView.leafId,
    leafIdType: typeof leafView.leafId,
    leafEntryType: leafView.leafEntryType,
    header,
    entryCount: entries.length,
    entries,
    branch: leafView.branch,
    tree: flattenTree(reopened.getTree()),
    context: leafView.context,
    sessionName: reopened.getSessionName() ?? null,
    labels,
    labelMap: [...reopened.labelsById],
    alternates,
    afterResetLeaf,
    category: scenario.category,
    description: scenario.description,
    generatorNotes: ["tests/pi-node/make_fixtures.mjs"],
    probesRequested: null,
  };
  fs.rmSync(path.dirname(copy), { recursive: true });
  return expected;
}

// --- writing ---------------------------------------------------------------------------------------

/** Python's json.dumps(value, indent=1), which wrote index.json: non-ASCII as \u escapes. */
function pythonJson(value) {
  return JSON.stringify(value, null, 1).replace(
    /[\u007f-\uffff]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );
}

const indexPath = path.join(outputDir, "index.json");
const index = JSON.parse(fs.readFileSync(indexPath, "utf8"));
for (const scenario of SCENARIOS) {
  clock = scenario.start;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "pi-make-"));
  const sm = SessionManager.create("/home/user/project", dir);
  sm.newSession({ id: `0196${hex(4)}-${hex(4)}-7${hex(3)}-8${hex(3)}-${hex(12)}` });
  const { alternates } = scenario.build(sm);
  const file = sm.getSessionFile();
  const target = path.join(outputDir, scenario.name);
  fs.mkdirSync(target, { recursive: true });
  fs.copyFileSync(file, path.join(target, "session.jsonl"));
  const expected = await expectedFor(scenario, file, alternates);
  const expectedText = `${JSON.stringify(expected, null, 1)}\n`;
  fs.writeFileSync(path.join(target, "expected.json"), expectedText);
  fs.rmSync(dir, { recursive: true });
  const lines = fs.readFileSync(path.join(target, "session.jsonl"), "utf8").split("\n").length - 1;
  const row = {
    name: scenario.name,
    category: scenario.category,
    description: scenario.description,
    entryCount: expected.entryCount,
    lines,
    alternates: expected.alternates.length,
    openError: null,
    contextError: null,
    rewrittenOnOpen: false,
    migration: null,
    sizes: {
      "session.jsonl": fs.statSync(path.join(target, "session.jsonl")).size,
      "expected.json": Buffer.byteLength(expectedText),
    },
  };
  const at = index.scenarios.findIndex((s) => s.name === scenario.name);
  if (at >= 0) index.scenarios[at] = row;
  else index.scenarios.push(row);
  console.log(`${scenario.name}: ${expected.entryCount} entries`);
}
fs.writeFileSync(indexPath, pythonJson(index));
