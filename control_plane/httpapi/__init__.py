"""The control-plane API over HTTP+JSON: one adapter serving the routes the protos declare
(google.api.http) through the gRPC servicers, its problem+json errors and idempotency keys, the
OpenAPI document and the generated client."""
