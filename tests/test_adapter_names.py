"""One naming function for every adapter (``store.adapters.names``): each adapter's store
session ids are pinned byte for byte (values computed by the adapters' own digests before
they were brought into one place), so data already stored stays where its adapter looks."""

from __future__ import annotations

import pytest

from store.adapters.names import ADAPTERS, session_id_for
from store.errors import InvalidInputError

PINNED = [
    (("openai-agents", "user:42"), "", "oai-ea3fd43be1e57d62e163dae19fc740bd6d660eec"),
    (("openai-agents", "plain-1"), "", "plain-1"),
    (("openai-agents", "é/ü\ud800"), "", "oai-2bb918cabf54cb6cf2f69a165b6b2e9bb061a292"),
    (("strands", "agent-session-1"), "", "agent-session-1"),
    (("google-adk", "s", "app", "u:1", "s 1"), "adk", "adk-s-86613349873179173f738ac6f1b25780fabcaa0f"),
    (("google-adk", "u", "app", "u:1"), "adk", "adk-u-315123ccaadf5e909c12b7fb2d9ce0be75fcda53"),
    (("google-adk", "i", "app", "u:1"), "adk", "adk-i-83a63419147994d3e28e492c45bfb9e99e1f4b65"),
    (("google-adk", "a", "app"), "adk", "adk-a-3158a702fdba8c959f8aa1bf9335c467634c38ba"),
    (("google-adk", "r", "app"), "adk", "adk-r-4f55ab2bb988a0acf83fa3086cdd182377f78aab"),
    (("google-adk", "s", "é", '"', "x"), "t2", "t2-s-b6d14718cc60ee64b2cdea50479f99a3a8f3b05a"),
    (("claude-agent-sdk", "-work-x"), "", "cc.45b77158f42d7947ddff"),
    (("claude-agent-sdk", "-work-x", "0b9e7d2a-5c4f-4e1a-9d3b-7a6c5e4f3d2b"), "",
     "cc.45b77158f42d7947ddff.0b9e7d2a-5c4f-4e1a-9d3b-7a6c5e4f3d2b"),
    (("claude-agent-sdk", "-work-x", "a b/c", "subagents/agent-1"), "",
     "cc.45b77158f42d7947ddff._26ab5047a996701ad736e7d6.f0451e2556d17846870f"),
    (("claude-agent-sdk", "-work-x"), "tenant:t1", "cc.a6779d2eb988b99ac802"),
    (("claude-agent-sdk", "p", "s", "x"), "tenant:t1", "cc.ca96d38511a54b50f192.s.82eb5f36d44e01d4c0a8"),
    (("langgraph", "thread", "t-1"), "", "lg.thread.6f355b8af54020282ff92e87ebccef43"),
    (("langgraph", "thread", "t-1"), "prod", "lg.thread.67d2eaaa79c6abe8b796b37ccfe05aa4"),
    (("langgraph", "thread", "é/ü"), "", "lg.thread.59c903c74ac61498daf325c966bb2031"),
    (("langgraph", "runs"), "", "lg.runs.8d0baa3e2b974c4855d3b73215b0993b"),
]


@pytest.mark.parametrize(("call", "namespace", "expected"), PINNED)
def test_every_adapter_keeps_its_ids(call: tuple[str, ...], namespace: str, expected: str) -> None:
    assert session_id_for(*call, namespace=namespace) == expected


def test_every_adapter_is_pinned() -> None:
    assert {call[0] for call, _, _ in PINNED} == set(ADAPTERS)


def test_the_adapters_name_through_it() -> None:
    """Each adapter's own naming gives the pinned ids (nobody kept a digest of their own)."""
    from store.adapters.adk import StoreIds
    from store.adapters.claude_agent_sdk import ClaudeSessionStore
    from store.adapters.openai_agents import store_session_id

    assert store_session_id("user:42") == "oai-ea3fd43be1e57d62e163dae19fc740bd6d660eec"
    assert StoreIds("adk").session("app", "u:1", "s 1") == "adk-s-86613349873179173f738ac6f1b25780fabcaa0f"
    cc = object.__new__(ClaudeSessionStore)
    cc.namespace = "tenant:t1"
    assert cc.session_id_for({"project_key": "p", "session_id": "s", "subpath": "x"}) == \
        "cc.ca96d38511a54b50f192.s.82eb5f36d44e01d4c0a8"


@pytest.mark.parametrize(("call", "namespace"), [
    (("nobody", "x"), ""),
    (("openai-agents", ""), ""),
    (("strands", "not a store id"), ""),
    (("claude-agent-sdk", ""), ""),
    (("claude-agent-sdk", "p", ""), ""),
    (("claude-agent-sdk", "p", "s", ""), ""),
    (("openai-agents", "a", "b"), ""),
    (("google-adk", "s", "app", 3), "adk"),
    (("langgraph", "thread", ""), ""),
    (("langgraph", "thread"), ""),
    (("langgraph", "runs", "x"), ""),
    (("langgraph", "checkpoint", "x"), ""),
])
def test_names_an_adapter_cannot_map_are_refused(call: tuple[object, ...], namespace: str) -> None:
    with pytest.raises(InvalidInputError):
        session_id_for(*call, namespace=namespace)  # type: ignore[arg-type]
