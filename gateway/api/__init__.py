"""The HTTP front door: OpenAI's Files and Batches API (and Azure's forms of it) over the runtime.

`service` is what the API and the CLI ask of the runtime (domain errors, no HTTP); the other modules
are the FastAPI app (`app.create_app`), its routers, auth, the error shape, `/metrics` and the dashboard.
"""
