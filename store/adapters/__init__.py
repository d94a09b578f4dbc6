"""Drop-in session backends for agent frameworks, each on the store's asyncio API.

Each adapter is its own module with its framework as an optional extra:

- ``store.adapters.openai_agents``: the OpenAI Agents SDK's ``Session`` protocol
  (``pip install 'sessionstore[openai-agents]'``);
- ``store.adapters.adk``: Google ADK's ``BaseSessionService`` (``sessionstore[adk]``);
- ``store.adapters.strands``: Strands Agents' ``SessionRepository`` (``sessionstore[strands]``).

Importing this package imports no framework.
"""
