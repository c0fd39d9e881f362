"""`webhookctl`: the control-plane API from a terminal. `main` holds the command line, `common` what
the command groups share (channel, credentials, times, tables); `event_types` and `listen` beside
them."""
