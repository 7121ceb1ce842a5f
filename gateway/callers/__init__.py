"""What the gateway keeps about its callers between their requests, for the API to ask (it writes none of it
itself): `logins` (the dashboard's login sessions: opened, looked up, closed) and `idempotent_creates` (a
create's claim on its `Idempotency-Key`: reserved, waited for, completed or released). Each is a small service
over one part of the `Store`, composed by the runtime (`Runtime.logins`, `Runtime.idempotent_creates`)."""
