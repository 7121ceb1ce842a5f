"""The loopback OpenAI/Azure stand-in: `server` (the process and the handle tests hold; `python -m
tests.fakes.upstream.server`), `app` (the ASGI app: real-time and control endpoints), `batches` (Files and
Batches API), `state` (state and shared helpers), `replies` (the replies themselves)."""
