#!/usr/bin/env bash
# Install everything the project needs, idempotently: the Python venv from the lock file, the JVM
# servers and connectors from Maven Central (stack/maven/*.xml), Debian's PostgreSQL server,
# generated gRPC code, test certs; with TRACING=1 also Jaeger, from the Go module proxy.
source "$(dirname "$0")/lib.sh"
cd "$REPO"
command -v java >/dev/null || fail "java (JDK 17) not found: apt-get install openjdk-17-jdk-headless"
command -v mvn >/dev/null || fail "mvn not found: apt-get install maven"

# Debian packages the stack runs: PostgreSQL (the producer database, stack/postgres.sh),
# Prometheus and its Pushgateway (stack/prometheus.sh); Chromium, headless, for the test that
# looks at the health page as a person would.
missing=()
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || missing+=(postgresql)
command -v prometheus >/dev/null || missing+=(prometheus)
command -v prometheus-pushgateway >/dev/null || missing+=(prometheus-pushgateway)
command -v chromium >/dev/null || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || fail "missing Debian packages: sudo apt-get install ${missing[*]}"
  say "installing from Debian: ${missing[*]}"
  # Only the binaries: the stack starts its own servers on 127.0.0.1. PostgreSQL's package would
  # otherwise create and start a system cluster on 5432.
  if [ ! -f /etc/postgresql-common/createcluster.conf ]; then
    mkdir -p /etc/postgresql-common && echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf
  fi
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null \
    || fail "apt-get install ${missing[*]} failed"
fi

stamp="$VENV/.lock-$(sha256sum requirements.lock pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  say "creating python venv (.venv) from requirements.lock"
  [ -x "$PY" ] || python3 -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q -r requirements.lock
  "$PY" -m pip install -q --no-deps -e .
  rm -f "$VENV"/.lock-*; touch "$stamp"
fi

for part in kafka cassandra flink-connectors connect s3proxy; do
  if [ ! -f "$JARS/$part/.complete" ] || [ "stack/maven/$part.xml" -nt "$JARS/$part/.complete" ]; then
    say "resolving $part from Maven Central"
    rm -rf "$JARS/$part"
    mvn -q -B -f "stack/maven/$part.xml" dependency:copy-dependencies \
      -DoutputDirectory="$JARS/$part" -DincludeScope=runtime || fail "maven could not resolve $part"
    touch "$JARS/$part/.complete"
  fi
done

# The official AsyncAPI JSON Schema, which the tests validate the catalog's AsyncAPI export against:
# the AsyncAPI project publishes it on the npm registry only (@asyncapi/specs), not on PyPI. One
# exact version, its tarball checked against the registry's integrity for it; only its schemas/ and
# LICENSE are kept, under stack/.specs/asyncapi (git-ignored). Tests never fetch it.
ASYNCAPI_SPECS_VERSION=6.11.1
ASYNCAPI_SPECS_INTEGRITY="sha512-A3WBLqAKGoJ2+6FWFtpjBlCQ1oFCcs4GxF7zsIGvNqp/klGUHjlA3aAcZ9XMMpLGE8zPeYDz2x9FmO6DSuKraQ=="
specs="$REPO/stack/.specs/asyncapi"
if [ ! -f "$specs/.version-$ASYNCAPI_SPECS_VERSION" ]; then
  command -v npm >/dev/null || fail "npm not found (it fetches the AsyncAPI JSON Schema): apt-get install npm"
  say "fetching @asyncapi/specs@$ASYNCAPI_SPECS_VERSION from the npm registry"
  rm -rf "$specs" && mkdir -p "$specs"
  tarball="$(cd "$specs" && npm pack --silent "@asyncapi/specs@$ASYNCAPI_SPECS_VERSION")" \
    || fail "npm could not fetch @asyncapi/specs@$ASYNCAPI_SPECS_VERSION"
  [ "sha512-$(openssl dgst -sha512 -binary "$specs/$tarball" | base64 -w0)" = "$ASYNCAPI_SPECS_INTEGRITY" ] \
    || fail "@asyncapi/specs@$ASYNCAPI_SPECS_VERSION does not match its pinned integrity"
  tar -xzf "$specs/$tarball" -C "$specs" --strip-components=1 package/schemas package/LICENSE
  rm "$specs/$tarball"
  touch "$specs/.version-$ASYNCAPI_SPECS_VERSION"
fi

# Jaeger, the trace backend, built from source only where tracing is wanted (TRACING=1, or a stack
# started with it); `make test` and `make up TRACING=1` build it when missing (stack/jaeger.sh).
if tracing_on; then bash "$REPO/stack/jaeger.sh" build; fi

"$PY" -m protogen
# The HTTP API's Python client, from its OpenAPI document (build/http-client, git-ignored).
"$PY" -m control_plane.httpapi.client_gen >/dev/null || fail "could not generate the HTTP API's client"
"$PY" -m stack.certs --out "$RUN/certs" >/dev/null
say "setup complete"
