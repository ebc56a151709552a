"""An OpenAI-compatible HTTP API in front of an oven server (``oven serve --openai-port PORT``).

:mod:`.frontend` runs it as a process of its own, :mod:`.app` is the ASGI app, :mod:`.requests`
checks request bodies, :mod:`.session` runs one request as a chat-completion instance under the
request's API key (an oven token), and :mod:`.errors` shapes failures as OpenAI does.
"""
