#!/usr/bin/env bash
# Starts the test suite's real Apache Kafka: a single-node KRaft broker (broker and controller in one
# JVM) on 127.0.0.1, from jars that Maven fetches from Maven Central (pom.xml beside this file).
#
#   start.sh [RUN_DIR]     RUN_DIR: config, data, log and pid file (default: a new temporary folder)
#   stop.sh RUN_DIR        stops it by the PID in RUN_DIR/kafka.pid and removes RUN_DIR
#
# Progress goes to stderr; the last line on stdout is `KAFKA_BOOTSTRAP=127.0.0.1:<port>` (before it,
# `KAFKA_RUN_DIR=<dir>`). On failure: the broker log's tail on stderr, exit status non-zero.
#
# Environment:
#   FAULTSTREAM_KAFKA_HOME   jar cache (default ~/.cache/faultstream/kafka-<version>): Maven runs
#                            only while <home>/libs is missing, so later runs start offline
#   FAULTSTREAM_KAFKA_PORT   client port (default: a free one); FAULTSTREAM_KAFKA_CONTROLLER_PORT alike
#   FAULTSTREAM_MAVEN_ARGS   extra Maven arguments, e.g. -Dmaven.repo.local=/tmp/m2
#   FAULTSTREAM_KAFKA_TIMEOUT seconds to wait for the broker to answer (default 90)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
say() { echo "kafka: $*" >&2; }
die() { say "$*"; exit 1; }

version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/pom.xml")"
[[ -n "$version" ]] || die "no <kafka.version> in $here/pom.xml"
home="${FAULTSTREAM_KAFKA_HOME:-$HOME/.cache/faultstream/kafka-$version}"
libs="$home/libs"
py="$(command -v python || command -v python3)" || die "no python on PATH (the readiness check needs it)"
command -v java >/dev/null || die "no java on PATH: Kafka $version needs a Java 11+ runtime"

# --- jars: fetched once per version, into a temporary folder moved into place when complete
if [[ ! -f "$libs/.complete" ]]; then
    command -v mvn >/dev/null || die "no mvn on PATH: Maven fetches Kafka $version's jars from Maven Central"
    say "fetching Kafka $version jars with Maven into $libs"
    mkdir -p "$home"
    fetch="$(mktemp -d "$home/libs.fetch.XXXXXX")"
    t0=$SECONDS
    # The goal by group:artifact (version from pom.xml), so Maven needs no plugin-prefix lookup.
    # shellcheck disable=SC2086  # FAULTSTREAM_MAVEN_ARGS is a list of arguments
    if ! mvn -B -Dstyle.color=never -f "$here/pom.xml" ${FAULTSTREAM_MAVEN_ARGS:-} \
        org.apache.maven.plugins:maven-dependency-plugin:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$fetch" >"$fetch.log" 2>&1; then
        say "Maven could not fetch Kafka $version from Maven Central; the end of its output:"
        grep -v '^\[INFO\] Download' "$fetch.log" | tail -n 40 >&2
        rm -rf "$fetch" "$fetch.log"
        exit 1
    fi
    rm -f "$fetch.log"
    ls "$fetch"/kafka_2.13-*.jar >/dev/null 2>&1 || { rm -rf "$fetch"; die "Maven fetched no kafka_2.13 jar"; }
    touch "$fetch/.complete"
    # Another run may have finished the same fetch meanwhile: keep theirs.
    mv -T "$fetch" "$libs" 2>/dev/null || rm -rf "$fetch"
    say "fetched $(find "$libs" -name '*.jar' | wc -l) jars in $((SECONDS - t0)) s"
fi

# --- run folder, ports, configuration
if [[ $# -ge 1 ]]; then
    run_dir="$1"
    mkdir -p "$run_dir"
else
    run_dir="$(mktemp -d "${TMPDIR:-/tmp}/faultstream-kafka.XXXXXX")"
fi
run_dir="$(cd "$run_dir" && pwd)"
if [[ -f "$run_dir/kafka.pid" ]] && kill -0 "$(cat "$run_dir/kafka.pid")" 2>/dev/null; then
    die "a broker already runs from $run_dir (PID $(cat "$run_dir/kafka.pid")): stop it with $here/stop.sh $run_dir"
fi
rm -rf "$run_dir/data" "$run_dir/kafka.pid"
touch "$run_dir/.faultstream-kafka"  # stop.sh removes only folders that carry this mark

free_port() {
    "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
port="${FAULTSTREAM_KAFKA_PORT:-$(free_port)}"
cport="${FAULTSTREAM_KAFKA_CONTROLLER_PORT:-$(free_port)}"
while [[ "$cport" == "$port" ]]; do cport="$(free_port)"; done
bootstrap="127.0.0.1:$port"

cat >"$run_dir/server.properties" <<EOF
# Written by tests/services/kafka/start.sh: single-node KRaft broker for the tests.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=$run_dir/data
num.partitions=1
default.replication.factor=1
auto.create.topics.enable=true
delete.topic.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=4
log.retention.hours=1
EOF

cat >"$run_dir/log4j.properties" <<'EOF'
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
log4j.logger.org.apache.kafka.clients=WARN
EOF

log="$run_dir/kafka.log"
fail() {
    say "$*"
    if [[ -s "$log" ]]; then
        say "first errors in $log:"
        grep -m 5 -E '^\[.*\] (ERROR|FATAL)|^Caused by:' "$log" >&2 || true
        say "last 50 lines of $log:"
        tail -n 50 "$log" >&2
    fi
    if [[ -f "$run_dir/kafka.pid" ]]; then "$here/stop.sh" "$run_dir" >&2 || true; fi
    exit 1
}

java_opts=(-Xmx512m -Xms256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true
    "-Dlog4j.configuration=file:$run_dir/log4j.properties")
cluster_id="$("$py" -c '
import base64, uuid
while True:  # Kafka cluster ids: 16 random bytes, base64url without padding, not starting with "-"
    text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    if not text.startswith("-"):
        print(text)
        break
')"

# --- format the KRaft metadata log, then start the broker in the background
t0=$SECONDS
java "${java_opts[@]}" -cp "$libs/*" kafka.tools.StorageTool format -t "$cluster_id" \
    -c "$run_dir/server.properties" >"$log" 2>&1 || fail "kafka-storage format failed"

java "${java_opts[@]}" -cp "$libs/*" kafka.Kafka "$run_dir/server.properties" </dev/null >>"$log" 2>&1 &
pid=$!
echo "$pid" >"$run_dir/kafka.pid"
say "Kafka $version starting on $bootstrap (PID $pid, log $log)"

"$py" "$here/../kafka.py" wait "$bootstrap" --pid "$pid" --log "$log" --timeout "${FAULTSTREAM_KAFKA_TIMEOUT:-90}" ||
    fail "Kafka $version did not start on $bootstrap"
say "ready in $((SECONDS - t0)) s"
echo "KAFKA_RUN_DIR=$run_dir"
echo "KAFKA_BOOTSTRAP=$bootstrap"
