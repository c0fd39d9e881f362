"""What the control plane puts on Kafka: the publisher (endpoint configs, the config clock, replays,
test events), the stored configs and the leased config clock onto webhooks.endpoints (configs), and
the catalog's records beside them (catalog, catalog_records). Every package that publishes uses it;
it uses only the kernel."""
