#!/usr/bin/env bash
# Starts the test suite's real Apache Kafka: a single-node KRaft broker (broker and controller in one
# JVM) on 127.0.0.1, from jars that Maven fetches from Maven Central (pom.xml beside this file).
#
#   start.sh [--secure] [RUN_DIR]  RUN_DIR: config, data, log and pid file (default: a new temporary folder)
#   stop.sh RUN_DIR                stops it by the PID in RUN_DIR/kafka.pid and removes RUN_DIR
#   stop.sh --keep RUN_DIR         stops it and keeps RUN_DIR (config, data, logs)
#   start.sh --restart RUN_DIR     starts the stopped broker of RUN_DIR again: same ports, same data
#                                  (topics, offsets, consumer groups), same listeners; the chaos soak
#                                  restarts the broker under running workers this way
#
# Progress goes to stderr; the last line on stdout is `KAFKA_BOOTSTRAP=127.0.0.1:<port>` (before it,
# `KAFKA_RUN_DIR=<dir>`). On failure: the broker log's tail on stderr, exit status non-zero.
#
# --secure adds two secured listeners beside the PLAINTEXT one (which stays for the readiness check
# and the broker's own traffic), with a CA and certificates made here with openssl and keytool:
#   SASL_SSL  TLS + SASL/SCRAM-SHA-512; the user is created when the metadata log is formatted
#             (kafka-storage format --add-scram, the KRaft way)
#   SSL       TLS that requires a client certificate signed by the CA
#   SASL_PLAINTEXT  the same SCRAM login without TLS
# and prints, before KAFKA_BOOTSTRAP: KAFKA_SASL_SSL_BOOTSTRAP=, KAFKA_SSL_BOOTSTRAP=,
# KAFKA_SASL_PLAINTEXT_BOOTSTRAP=, KAFKA_TLS_DIR=.
# KAFKA_TLS_DIR holds ca.pem, client.pem, client.key (PEM, for the clients), other-ca.pem (a CA that
# signed nothing the broker has: an untrusted CA), scram-user and scram-password.
#
# Environment:
#   FAULTSTREAM_KAFKA_HOME   jar cache (default ~/.cache/faultstream/kafka-<version>): Maven runs
#                            only while <home>/libs is missing, so later runs start offline
#   FAULTSTREAM_KAFKA_PORT   client port (default: a free one); FAULTSTREAM_KAFKA_CONTROLLER_PORT alike
#   FAULTSTREAM_MAVEN_ARGS   extra Maven arguments, e.g. -Dmaven.repo.local=/tmp/m2
#   FAULTSTREAM_KAFKA_TIMEOUT seconds to wait for the broker to answer (default 90)
set -euo pipefail

secure=0
restart=0
if [[ "${1:-}" == "--secure" ]]; then
    secure=1
    shift
elif [[ "${1:-}" == "--restart" ]]; then
    restart=1
    shift
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
say() { echo "kafka: $*" >&2; }
die() { say "$*"; exit 1; }

version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/pom.xml")"
[[ -n "$version" ]] || die "no <kafka.version> in $here/pom.xml"
home="${FAULTSTREAM_KAFKA_HOME:-$HOME/.cache/faultstream/kafka-$version}"
libs="$home/libs"
py="$(command -v python || command -v python3)" || die "no python on PATH (the readiness check needs it)"
command -v java >/dev/null || die "no java on PATH: Kafka $version needs a Java 11+ runtime"
# The readiness check talks to the broker with aiokafka: without it every check would fail, and the
# broker would seem never to start.
missing="$("$py" -c 'import aiokafka' 2>&1 | tail -n 1)" ||
    die "$py cannot run the readiness check ($missing): activate the virtualenv with the test dependencies (. .venv/bin/activate)"
if ((secure)); then
    for tool in openssl keytool; do
        command -v "$tool" >/dev/null || die "no $tool on PATH: --secure makes its CA and certificates with openssl and keytool"
    done
fi

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

# --- --restart: the same broker again, from the configuration and data a stop.sh --keep left
if ((restart)); then
    run_dir="${1:?usage: start.sh --restart RUN_DIR}"
    [[ -f "$run_dir/.faultstream-kafka" && -f "$run_dir/server.properties" && -f "$run_dir/data/meta.properties" ]] ||
        die "$run_dir holds no stopped broker of start.sh (server.properties, data/meta.properties)"
    run_dir="$(cd "$run_dir" && pwd)"
    if [[ -f "$run_dir/kafka.pid" ]] && kill -0 "$(cat "$run_dir/kafka.pid")" 2>/dev/null; then
        die "a broker already runs from $run_dir (PID $(cat "$run_dir/kafka.pid"))"
    fi
    listeners="$(sed -n 's/^listeners=//p' "$run_dir/server.properties")"
    bootstrap="$(tr ',' '\n' <<<"$listeners" | sed -n 's|^PLAINTEXT://||p')"
    [[ -n "$bootstrap" ]] || die "no PLAINTEXT listener in $run_dir/server.properties"
    log="$run_dir/kafka.log"
    # The readiness check fails on an 'Exiting Kafka' anywhere in the log: each run gets its own.
    n=1
    while [[ -e "$log.$n" ]]; do n=$((n + 1)); done
    [[ -f "$log" ]] && mv "$log" "$log.$n"
    rm -f "$run_dir/kafka.pid"
    t0=$SECONDS
    java -Xmx512m -Xms256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true \
        "-Dlog4j.configuration=file:$run_dir/log4j.properties" -cp "$libs/*" kafka.Kafka \
        "$run_dir/server.properties" </dev/null >"$log" 2>&1 &
    pid=$!
    echo "$pid" >"$run_dir/kafka.pid"
    say "Kafka $version restarting on $bootstrap (PID $pid, log $log)"
    if ! "$py" "$here/../kafka.py" wait "$bootstrap" --pid "$pid" --log "$log" --timeout "${FAULTSTREAM_KAFKA_TIMEOUT:-90}"; then
        say "Kafka $version did not restart on $bootstrap; last 50 lines of $log:"
        tail -n 50 "$log" >&2
        "$here/stop.sh" --keep "$run_dir" >&2 || true
        exit 1
    fi
    say "ready in $((SECONDS - t0)) s"
    echo "KAFKA_RUN_DIR=$run_dir"
    for name in SASL_SSL SSL SASL_PLAINTEXT; do
        address="$(tr ',' '\n' <<<"$listeners" | sed -n "s|^$name://||p")"
        [[ -z "$address" ]] || echo "KAFKA_${name}_BOOTSTRAP=$address"
    done
    [[ ! -d "$run_dir/tls" ]] || echo "KAFKA_TLS_DIR=$run_dir/tls"
    echo "KAFKA_BOOTSTRAP=$bootstrap"
    exit 0
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
if ((secure)); then
    sasl_port="$(free_port)"
    while [[ "$sasl_port" == "$port" || "$sasl_port" == "$cport" ]]; do sasl_port="$(free_port)"; done
    ssl_port="$(free_port)"
    while [[ "$ssl_port" == "$port" || "$ssl_port" == "$cport" || "$ssl_port" == "$sasl_port" ]]; do
        ssl_port="$(free_port)"
    done
    sp_port="$(free_port)"
    while [[ " $port $cport $sasl_port $ssl_port " == *" $sp_port "* ]]; do sp_port="$(free_port)"; done
fi

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

# --- --secure: a CA, the broker's keystore and truststore (keytool), the clients' PEM files
if ((secure)); then
    tls="$run_dir/tls"
    mkdir -p "$tls"
    store_pass="$("$py" -c 'import secrets; print(secrets.token_hex(16))')"
    scram_user="faultstream"
    scram_pass="$("$py" -c 'import secrets; print(secrets.token_urlsafe(18))')"
    make_tls() {
        set -e
        cd "$tls"
        openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 2 -subj "/CN=faultstream test CA" \
            -keyout ca.key -out ca.pem
        openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 2 -subj "/CN=some other CA" \
            -keyout other-ca.key -out other-ca.pem
        # The broker's certificate names 127.0.0.1 and localhost: clients check the host name.
        printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' >broker.ext
        openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout broker.key -out broker.csr
        openssl x509 -req -sha256 -days 2 -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
            -extfile broker.ext -out broker.pem
        printf 'extendedKeyUsage=clientAuth\n' >client.ext
        openssl req -newkey rsa:2048 -nodes -subj "/CN=faultstream-client" -keyout client.key -out client.csr
        openssl x509 -req -sha256 -days 2 -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
            -extfile client.ext -out client.pem
        openssl pkcs12 -export -name broker -in broker.pem -inkey broker.key -certfile ca.pem \
            -passout "pass:$store_pass" -out broker.p12
        keytool -importcert -noprompt -alias ca -file ca.pem -keystore truststore.p12 -storetype PKCS12 \
            -storepass "$store_pass"
        rm -f ./*.csr ./*.ext ca.key other-ca.key ca.srl
        printf '%s\n' "$scram_user" >scram-user
        printf '%s\n' "$scram_pass" >scram-password
        chmod 600 broker.key client.key scram-password broker.p12
    }
    (make_tls) >"$run_dir/tls.log" 2>&1 || { cat "$run_dir/tls.log" >&2; die "making the test CA and certificates failed"; }
    secured="SASL_SSL://127.0.0.1:$sasl_port,SSL://127.0.0.1:$ssl_port,SASL_PLAINTEXT://127.0.0.1:$sp_port"
    sed -i "s|^listeners=.*|listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport,$secured|
s|^advertised.listeners=.*|advertised.listeners=PLAINTEXT://127.0.0.1:$port,$secured|
s|^listener.security.protocol.map=.*|listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT|" \
        "$run_dir/server.properties"
    cat >>"$run_dir/server.properties" <<EOF
# --secure: SASL_SSL (SCRAM-SHA-512) and SSL with client certificates
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
ssl.keystore.type=PKCS12
ssl.keystore.location=$tls/broker.p12
ssl.keystore.password=$store_pass
ssl.key.password=$store_pass
ssl.truststore.type=PKCS12
ssl.truststore.location=$tls/truststore.p12
ssl.truststore.password=$store_pass
listener.name.ssl.ssl.client.auth=required
EOF
fi

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
scram=()
if ((secure)); then
    scram=(--add-scram "SCRAM-SHA-512=[name=$scram_user,password=$scram_pass]")
fi
java "${java_opts[@]}" -cp "$libs/*" kafka.tools.StorageTool format -t "$cluster_id" \
    -c "$run_dir/server.properties" "${scram[@]}" >"$log" 2>&1 || fail "kafka-storage format failed"

java "${java_opts[@]}" -cp "$libs/*" kafka.Kafka "$run_dir/server.properties" </dev/null >>"$log" 2>&1 &
pid=$!
echo "$pid" >"$run_dir/kafka.pid"
say "Kafka $version starting on $bootstrap (PID $pid, log $log)"

"$py" "$here/../kafka.py" wait "$bootstrap" --pid "$pid" --log "$log" --timeout "${FAULTSTREAM_KAFKA_TIMEOUT:-90}" ||
    fail "Kafka $version did not start on $bootstrap"
say "ready in $((SECONDS - t0)) s"
echo "KAFKA_RUN_DIR=$run_dir"
if ((secure)); then
    echo "KAFKA_SASL_SSL_BOOTSTRAP=127.0.0.1:$sasl_port"
    echo "KAFKA_SSL_BOOTSTRAP=127.0.0.1:$ssl_port"
    echo "KAFKA_SASL_PLAINTEXT_BOOTSTRAP=127.0.0.1:$sp_port"
    echo "KAFKA_TLS_DIR=$tls"
fi
echo "KAFKA_BOOTSTRAP=$bootstrap"
