"""Drop-in session backends for agent frameworks, each on the store's asyncio API.

Each adapter is its own module with its framework as an optional extra:

- ``store.adapters.openai_agents``: the OpenAI Agents SDK's ``Session`` protocol
  (``pip install 'sessionstore[openai-agents]'``);
- ``store.adapters.adk``: Google ADK's ``BaseSessionService`` (``sessionstore[adk]``);
- ``store.adapters.strands``: Strands Agents' ``SessionRepository`` (``sessionstore[strands]``);
- ``store.adapters.claude_agent_sdk``: the Claude Agent SDK's ``SessionStore``
  (``sessionstore[claude-agent-sdk]``).

Importing this package imports no framework.
"""
