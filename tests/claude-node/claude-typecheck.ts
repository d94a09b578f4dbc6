// tsc --noEmit -p tests/claude-node: HttpSessionStore is the SDK's SessionStore, optional methods
// included, by the SDK's own declarations.
import type { SessionStore } from "@anthropic-ai/claude-agent-sdk"
import { HttpSessionStore } from "../../store/http/js/claude-session-store.mjs"

const store: SessionStore = new HttpSessionStore("http://127.0.0.1:4437", { token: "t" })
const everyOptional: Required<SessionStore> = new HttpSessionStore("http://127.0.0.1:4437")
export { store, everyOptional }
