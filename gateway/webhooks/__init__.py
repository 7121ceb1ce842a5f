"""Batch webhooks, as OpenAI sends them: `events` (payload and Standard Webhooks signature) and
`sender` (at-least-once delivery from the store, with retries)."""
