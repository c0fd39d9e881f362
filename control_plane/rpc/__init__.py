"""The gRPC surface: the generated stubs imported from one place (api, catalog_api) and the servicers
that convert proto <-> domain and map domain errors to codes."""
