# The two commands a newcomer needs: `make run` and `make test`. Everything else supports them.
SHELL := /bin/bash
PY := .venv/bin/python

.PHONY: run test setup up down job bench lint proto clean status

run: setup up job ## install, start the local stack, submit the delivery job, say where things are (LOCAL_RECEIVERS=1: deliveries to 127.0.0.1 allowed, for `webhookctl listen`; stack/local_receivers.sh; TOPOLOGY=cluster: 3 Kafka, 3 Cassandra, 2 TaskManagers, 2 control planes, stack/topologies/cluster.env; TRACING=1: one trace per delivery, Jaeger's UI on http://127.0.0.1:16686, remembered until TRACING=0)
	@bash stack/archive.sh start && bash stack/archive.sh ready  # the archive writer and its hourly audit (not in make up: make test runs without them)
	@bash stack/status.sh

test: setup ## bring up what is missing, run the whole suite, stop what this target started
	@bash stack/test.sh

setup: ## venv from requirements.lock, JVM servers from Maven Central, gRPC code, test certs (TRACING=1: Jaeger too, built from its Go module)
	@bash stack/setup.sh

up: setup ## start Kafka, Cassandra, Flink and the control plane (idempotent; TOPOLOGY=cluster once: recorded in .run/topology for status, job, down; TRACING=1 once: Jaeger too, recorded in .run/tracing)
	@bash stack/up.sh

job: ## submit the delivery job to the local Flink cluster unless it already runs
	@bash stack/job.sh submit

down: ## stop everything the stack scripts started (data stays in .run/)
	@bash stack/down.sh

status:
	@bash stack/status.sh

bench: setup up ## end-to-end benchmark; last line is the comparable summary (BENCH_ARGS="--catalog": fan-out validates every event; BENCH_ARGS="--tracing-ratio 0.01": the run's job traces 1 % of deliveries, needs TRACING=1's Jaeger)
	@$(PY) -m bench.run $(BENCH_ARGS)

.PHONY: chaos
chaos: setup ## the brief's fault matrix on the real stack; report and charts in .run/chaos/
	@bash stack/test.sh --chaos

.PHONY: chaos-cluster
chaos-cluster: setup ## rescale under load and TaskManager loss on the stack that is up, then Kafka broker, Cassandra node (kill, pause) and control-plane replica loss on a cluster topology it brings up beside it (tests/faults/test_chaos_cluster_nodes.py); report in .run/chaos-cluster/ (WEBHOOKS_CHAOS_STACK names the stack, default: default)
	@bash stack/test.sh --chaos-cluster

.PHONY: cluster-check
cluster-check: setup ## the cluster topology from the scripts, beside a running stack (ports +10000, run dir .run/cluster-check): deliveries through both control planes, RF 3, both TaskManagers; stopped after
	@$(PY) -m pytest -q -s -p no:cacheprovider -m cluster tests/e2e/test_cluster_topology.py

.PHONY: bench-history
bench-history: setup up ## Cassandra CPU per delivery of the history writes alone (HISTORY_ARGS="--rate 300")
	@$(PY) -m bench.history_writes $(HISTORY_ARGS)

.PHONY: bench-backlog
bench-backlog: setup up ## N pending deliveries behind a failing endpoint, TaskManager kill, drain (BACKLOG_ARGS="--pending 50000")
	@$(PY) -m bench.backlog $(BACKLOG_ARGS)

.PHONY: bench-archive archive-audit
bench-archive: setup up ## archive tier: CPU per archived delivery of every process taking part (the job's share attributed from its profiles, writer, S3), bytes per delivery (ARCHIVE_ARGS="--events 3000 --no-attribute")
	@$(PY) -m bench.archive_sizing $(ARCHIVE_ARGS)

.PHONY: bench-archive-writer
bench-archive-writer: ## the archive writer's CPU per archived delivery, offline: no stack, no servers (WRITER_ARGS="--tenants 16 --profile")
	@$(PY) -m bench.archive_writer_cpu $(WRITER_ARGS)

archive-audit: setup up ## audit every closed hour due once: committed files present, every delivery and event Cassandra lists archived (make run keeps one doing it each hour: stack/archive.sh)
	@$(PY) -m control_plane.archive.audit

lint: ## ruff, mypy, the import contracts (pyproject.toml, [tool.importlinter]) and every relative link and anchor in README.md and docs/ (make test runs it first)
	@$(PY) -m ruff check .
	@$(PY) -m mypy
	@.venv/bin/lint-imports --no-cache
	@$(PY) -m stack.doc_links

.PHONY: http-client api-fuzz
http-client: ## the HTTP API's Python client, generated from its OpenAPI document into build/http-client/ (make setup runs it)
	@$(PY) -m control_plane.httpapi.client_gen

api-fuzz: setup up ## Schemathesis over the HTTP API's document, long (make test runs a bounded one; API_FUZZ_EXAMPLES=500)
	@WEBHOOKS_API_FUZZ_EXAMPLES=$${API_FUZZ_EXAMPLES:-500} $(PY) -m pytest -q -s -p no:cacheprovider tests/integration/test_http_api_schema.py

proto: ## regenerate the gRPC and protobuf code of proto/ into protogen/ (only what is stale; make setup runs it)
	@$(PY) -m protogen

clean: down ## remove all local data, logs and checkpoints
	@bash stack/postgres.sh destroy  # its cluster may live outside .run (stack/postgres.sh: home)
	rm -rf .run
