"""What is asked of a batch after its end (our extensions): `results` (its results so far, a page at a time,
while it runs and from its files once it is finished), `retry_failed` (a new batch of its lines without a
2xx reply), `retry_merge` (a retry's results merged back into the first run's files, in input order) and
`message_results` (a Message Batch's results, as Anthropic's JSONL)."""
