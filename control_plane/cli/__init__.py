"""`webhookctl`: the control-plane API from a terminal. `main` builds the command line and sends each
command to its group's module (`endpoints`, `deliveries`, `tenants` with `keys`, `reconcile`,
`master_key`, `events`, `stats`, `event_types`, `account_cli`, `operations_cli`, `listen`; `portal`
and `history` live with their packages); `common` holds what the groups share (channel,
credentials, times, tables, output)."""
