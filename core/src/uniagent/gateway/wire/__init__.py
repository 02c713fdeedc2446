"""Wire formats: each converts its request to a :class:`~uniagent.gateway.session.ChatRequest`
and a :class:`~uniagent.gateway.session.Completion` back to its response and its SSE stream.

The internal form is OpenAI-chat-like: ``system``/``user``/``assistant``/``tool`` messages with
string ``content``, ``reasoning_content`` and ``tool_calls`` whose arguments are objects. A
reply converts, when a harness sends it back, to exactly the assistant message the
gateway recorded, in every format: that is how an append-only request is recognised.
"""
