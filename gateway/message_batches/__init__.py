"""Anthropic's Message Batches API as words: the create envelope, the `message_batch` object, the error
shape (`wire`), and each merged output line as a Message Batch result (`outcomes`). No HTTP here: the
routes are `gateway.api.message_batches`; the batch itself runs through the same pipeline as OpenAI's."""
