"""The event-type catalog: the service and its model, its Cassandra store and its export as
OpenAPI/AsyncAPI (its records on webhooks.endpoints: control_plane.publishing)."""
