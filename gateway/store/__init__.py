"""Storage, by backend: `protocols` (every protocol the runtime's parts see), `objects` (the records they
hold), `sqlite` (the embedded store, queue and coordination), `redis` (the shared ones), `blobs` (file bytes:
a directory or S3). The rules both backends apply sit beside their records: `quota`, `rates`, `storage`,
`webhook_deliveries`; `leases` and `lines` serve both."""
