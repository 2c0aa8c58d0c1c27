"""docker/compose.yaml and the files it mounts, checked without Docker.

Nothing here starts a container: the checks read the compose file, docker/.env.example, the
Prometheus config and the Grafana provisioning, and hold them against each other and against
``stream.settings.Settings``. Compose's own variable interpolation is reproduced (``_interpolate``)
so the file is also checked as Compose sees it with the example env file.

The compose-spec JSON Schema (draft-07) comes from the ``check-jsonschema`` dev dependency, which
vendors compose-spec/compose-spec's ``schema/compose-spec.json`` (Apache-2.0; the license ships
beside it in the package). Where a ``docker compose`` (v2 plugin) or ``docker-compose`` binary is on
PATH, ``config -q`` must accept the file too; without one that part is not run, the rest always is.
"""

from __future__ import annotations

import base64
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import jsonschema
import pytest
import yaml

from stream.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[3]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
ENV_EXAMPLE = DOCKER / ".env.example"
PROMETHEUS = DOCKER / "prometheus" / "prometheus.yml"
GRAFANA_PROVISIONING = DOCKER / "grafana" / "provisioning"

#: The stack's long-running services that others wait for; each must say when it is healthy.
INFRASTRUCTURE = ("kafka", "clickhouse", "prometheus", "alertmanager", "grafana")
#: Variables that hold secrets: compose.yaml must give them no default.
SECRETS = (
    "CLICKHOUSE_ADMIN_PASSWORD",
    "CLICKHOUSE_WRITER_PASSWORD",
    "CLICKHOUSE_READER_PASSWORD",
    "GRAFANA_ADMIN_PASSWORD",
)
CLICKHOUSE_USERS = DOCKER / "clickhouse" / "users.d" / "faultstream-users.xml"
SETTING_NAMES = frozenset(ENV_PREFIX + spec.name.upper() for spec in fields(Settings))
CONDITIONS = ("service_started", "service_healthy", "service_completed_successfully")


# --- Compose's variable interpolation ---------------------------------------------------------

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


class MissingVariable(LookupError):
    """A ``${VAR:?message}`` (or ``${VAR?message}``) whose variable is unset."""


def _interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's interpolation of one string: ``$$``, ``$VAR``, ``${VAR}``, ``:-``, ``-``, ``:?``, ``?``, ``:+``, ``+``."""

    def substitute(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["braced"] or match["bare"]
        op, arg = match["op"], match["arg"] or ""
        value = env.get(name)
        is_set, is_nonempty = value is not None, bool(value)
        if op in (":-", "-"):
            use_default = not is_nonempty if op == ":-" else not is_set
            return arg if use_default else str(value)
        if op in (":?", "?"):
            if not (is_nonempty if op == ":?" else is_set):
                raise MissingVariable(f"{name}: {arg}")
            return str(value)
        if op in (":+", "+"):
            return arg if (is_nonempty if op == ":+" else is_set) else ""
        return value or ""

    return _VARIABLE.sub(substitute, text)


def _interpolate_tree(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return _interpolate(node, env)
    if isinstance(node, dict):
        return {key: _interpolate_tree(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [_interpolate_tree(item, env) for item in node]
    return node


def _variables(text: str) -> set[str]:
    """Names of the variables a text interpolates (``$$`` escapes are container-side, not Compose's)."""
    return {m["braced"] or m["bare"] for m in _VARIABLE.finditer(text) if not m["escaped"]}


def _strings(node: Any) -> Iterator[str]:
    """Every string value of a YAML tree (what Compose interpolates; comments are not in it)."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item)


def test_interpolation_follows_compose() -> None:
    env = {"SET": "x", "EMPTY": ""}
    assert _interpolate("${SET:-d} ${EMPTY:-d} ${UNSET:-d} ${EMPTY-d} ${UNSET-d}", env) == "x d d  d"
    assert _interpolate("$SET ${SET} $${SET} $$SET ${SET:+alt} ${EMPTY:+alt}", env) == "x x ${SET} $SET alt "
    with pytest.raises(MissingVariable, match="UNSET: say so"):
        _interpolate("${UNSET:?say so}", env)
    with pytest.raises(MissingVariable):
        _interpolate("${EMPTY:?}", env)
    assert _variables("${A:-1} $B $${C} ${D:?x}") == {"A", "B", "D"}


# --- fixtures -----------------------------------------------------------------------------------


def _env_file(path: Path) -> dict[str, str]:
    """A dotenv file as Compose reads it: ``KEY=VALUE`` lines, ``#`` comments, no quoting used."""
    env: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", key), (
            f"{path.name}:{number}: not KEY=VALUE: {line!r}"
        )
        assert key not in env, f"{path.name}:{number}: {key} twice"
        env[key] = value
    return env


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    """compose.yaml as written (YAML merge keys applied, variables not interpolated)."""
    doc = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    return _env_file(ENV_EXAMPLE)


@pytest.fixture(scope="module")
def stack(raw: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """compose.yaml as Compose sees it with docker/.env.example."""
    resolved = _interpolate_tree(raw, env)
    assert isinstance(resolved, dict)
    return resolved


@pytest.fixture(scope="module")
def services(stack: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return stack["services"]


def _environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's ``environment`` as a dict of strings (list or mapping form)."""
    value = service.get("environment") or {}
    if isinstance(value, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in value)
    return {key: "" if v is None else str(v) for key, v in value.items()}


def _dependencies(service: dict[str, Any]) -> dict[str, str]:
    """``depends_on`` as ``{service: condition}`` (the short list form means ``service_started``)."""
    value = service.get("depends_on") or {}
    if isinstance(value, list):
        return dict.fromkeys(value, "service_started")
    return {name: spec.get("condition", "") for name, spec in value.items()}


def _volumes(service: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """``(source, target, mode)`` of a service's short-syntax volumes."""
    for volume in service.get("volumes", []):
        assert isinstance(volume, str), f"use the short volume syntax: {volume!r}"
        parts = volume.split(":")
        assert len(parts) in (2, 3), volume
        yield parts[0], parts[1], parts[2] if len(parts) == 3 else "rw"


def _host_ports(service: dict[str, Any]) -> list[tuple[str, int, int]]:
    """``(host ip, host port, container port)`` of a service's published ports."""
    published = []
    for port in service.get("ports", []):
        match = re.fullmatch(r"(?:(?P<ip>[\d.]+):)?(?P<host>\d+):(?P<target>\d+)(?:/tcp)?", str(port))
        assert match, f"ports must be HOST_IP:HOST:CONTAINER: {port!r}"
        published.append((match["ip"] or "", int(match["host"]), int(match["target"])))
    return published


# --- the file as a whole ----------------------------------------------------------------------


def _compose_spec() -> dict[str, Any]:
    dist = importlib.metadata.distribution("check-jsonschema")
    path = Path(str(dist.locate_file("check_jsonschema/builtin_schemas/vendor/compose-spec.json")))
    schema: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return schema


def _compose_cli() -> list[str] | None:
    """``docker compose`` or ``docker-compose`` when one is installed, else None."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    standalone = shutil.which("docker-compose")
    return [standalone] if standalone else None


def test_compose_file_follows_the_compose_spec(raw: dict[str, Any], stack: dict[str, Any]) -> None:
    schema = _compose_spec()
    validator = jsonschema.Draft7Validator(schema)
    for name, doc in (("as written", raw), ("interpolated with .env.example", stack)):
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
        assert not errors, f"compose.yaml ({name}) breaks the compose spec:\n" + "\n".join(
            f"  {'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors
        )
    cli = _compose_cli()
    if cli is not None:  # an extra check where Compose itself is installed (no engine needed)
        command = [*cli, "-f", str(COMPOSE), "--env-file", str(ENV_EXAMPLE), "--profile", "replay"]
        result = subprocess.run([*command, "config", "-q"], capture_output=True, text=True)
        assert result.returncode == 0, f"{' '.join(command)} config -q:\n{result.stderr}"


def test_environment_values_are_strings_or_numbers(raw: dict[str, Any]) -> None:
    # YAML 1.1 reads true/no/on as booleans, which `docker compose` refuses in `environment`.
    for name, service in raw["services"].items():
        for key, value in (service.get("environment") or {}).items():
            assert isinstance(value, str | int | float) and not isinstance(value, bool), f"{name}.{key}"


def test_every_variable_is_documented_in_the_env_example(raw: dict[str, Any], env: dict[str, str]) -> None:
    used = set().union(*map(_variables, _strings(raw)))
    assert used - env.keys() == set(), "used in compose.yaml, missing from .env.example"
    assert env.keys() - used == set(), "documented in .env.example, used nowhere in compose.yaml"
    lines = ENV_EXAMPLE.read_text(encoding="utf-8").splitlines()
    for index, line in enumerate(lines):
        if "=" in line and not line.startswith("#"):
            assert index > 0 and lines[index - 1].startswith("#"), f"{line!r}: say above it what it is"


def test_secrets_have_no_default_in_the_compose_file(raw: dict[str, Any], env: dict[str, str]) -> None:
    text = "\n".join(_strings(raw))
    for secret in SECRETS:
        uses = re.findall(r"\$\{" + secret + r"(:?[-?+][^}]*)?\}", text)
        assert uses, f"{secret} unused"
        assert all(op.startswith(":?") for op in uses), f"{secret} must be ${{{secret}:?...}}: {uses}"
        without = {key: value for key, value in env.items() if key != secret}
        with pytest.raises(MissingVariable, match=secret):
            _interpolate_tree(raw, without)
    # Nothing secret-looking is written in clear in any service's environment.
    for name, service in raw["services"].items():
        for key, value in _environment(service).items():
            if re.search(r"PASSWORD|SECRET|TOKEN", key):
                assert value.startswith(("${", "$$")), f"{name}.{key} is written in clear"


def test_images_are_pinned(services: dict[str, dict[str, Any]]) -> None:
    exact = re.compile(r"[a-z0-9][a-z0-9./_-]*:v?\d+\.\d+\.\d+(\.\d+)?(-[a-z0-9.-]+)?")
    for name, service in services.items():
        image = service.get("image")
        assert image, f"{name}: no image (pinned tags everywhere, also for built images)"
        assert "latest" not in image, f"{name}: {image}"
        assert exact.fullmatch(image), f"{name}: {image} is not pinned to an exact version tag"


def test_kafka_image_is_the_version_the_tests_run(services: dict[str, dict[str, Any]]) -> None:
    pom = (ROOT / "tests" / "services" / "kafka" / "pom.xml").read_text(encoding="utf-8")
    version = re.search(r"<kafka.version>(.+)</kafka.version>", pom)
    assert version
    assert services["kafka"]["image"] == f"apache/kafka:{version[1]}"


def test_dependencies_exist_and_can_be_met(services: dict[str, dict[str, Any]]) -> None:
    waited_healthy = set()
    for name, service in services.items():
        for dependency, condition in _dependencies(service).items():
            assert dependency in services, f"{name} depends on undefined {dependency}"
            assert dependency != name
            assert condition in CONDITIONS, f"{name} -> {dependency}: condition {condition!r}"
            target = services[dependency]
            if condition == "service_healthy":
                waited_healthy.add(dependency)
                assert target.get("healthcheck", {}).get("test"), f"{dependency} has no healthcheck"
            if condition == "service_completed_successfully":
                assert target.get("restart", "no") == "no", f"{dependency} is a job: it must not restart"
            # A service outside a profile cannot wait for one inside it: `up` would not start it.
            if target.get("profiles"):
                assert set(target["profiles"]) & set(service.get("profiles", [])), f"{name} -> {dependency}"
    assert set(INFRASTRUCTURE) <= waited_healthy | {"grafana"}
    for name in INFRASTRUCTURE:
        test = services[name].get("healthcheck", {}).get("test")
        assert isinstance(test, list) and test[0] in ("CMD", "CMD-SHELL"), f"{name}: healthcheck {test!r}"


def test_the_dependency_graph_has_no_cycle(services: dict[str, dict[str, Any]]) -> None:
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, " -> ".join((*path, name))
        if name not in done:
            for dependency in _dependencies(services[name]):
                visit(dependency, (*path, name))
            done.add(name)

    for name in services:
        visit(name, ())


def test_the_worker_scales(services: dict[str, dict[str, Any]], env: dict[str, str]) -> None:
    worker = services["worker"]
    for key in ("container_name", "hostname", "ports"):
        assert key not in worker, f"worker.{key} would make `--scale worker=N` fail"
    assert str(worker["deploy"]["replicas"]) == env["WORKERS"]
    assert _dependencies(worker)["init"] == "service_completed_successfully"
    assert worker.get("restart") == "unless-stopped"
    assert not worker.get("profiles")


def test_each_worker_replica_has_a_static_instance_id_of_its_own(
    services: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    """Compose has no per-replica environment: the worker's entrypoint makes its container's
    hostname its group instance id (docs/kafka.md#failover), unless one is set. Run as the
    container would run it, with a stand-in ``faultstream`` that prints what it was given."""
    worker = services["worker"]
    assert "FAULTSTREAM_WORKER_INSTANCE_ID" not in _environment(worker), (
        "one instance id for every replica: the broker would fence all but one of them"
    )
    entrypoint, command = worker["entrypoint"], worker["command"]
    assert entrypoint[0] == "/bin/sh" and command == ["worker"]
    stand_in = tmp_path / "faultstream"
    stand_in.write_text('#!/bin/sh\necho "id=$FAULTSTREAM_WORKER_INSTANCE_ID args=$*"\n')
    stand_in.chmod(0o755)
    base = {"PATH": f"{tmp_path}:/usr/bin:/bin"}

    def run(**env: str) -> str:
        done = subprocess.run([*entrypoint, *command], env={**base, **env}, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run(HOSTNAME="3f2a9c0d1e7b") == "id=3f2a9c0d1e7b args=worker"
    assert run(HOSTNAME="5b1c", FAULTSTREAM_WORKER_INSTANCE_ID="worker-1") == "id=worker-1 args=worker"
    # Without HOSTNAME in the environment (docker always sets it), the hostname file's content.
    assert run() == f"id={Path('/etc/hostname').read_text().strip()} args=worker"


def test_host_ports_are_loopback_only_and_distinct(services: dict[str, dict[str, Any]]) -> None:
    seen: dict[int, str] = {}
    for name, service in services.items():
        for ip, host, _target in _host_ports(service):
            assert ip == "127.0.0.1", f"{name} publishes on {ip or 'every interface'}"
            assert host not in seen, f"{name} and {seen.get(host)} both publish {host}"
            seen[host] = name
    assert set(seen.values()) == {"kafka", "clickhouse", "prometheus", "alertmanager", "grafana"}


def test_bind_mounts_exist_and_named_volumes_are_declared(stack: dict[str, Any]) -> None:
    declared = set(stack.get("volumes") or {})
    used = set()
    for name, service in stack["services"].items():
        for source, target, mode in _volumes(service):
            assert target.startswith("/"), f"{name}: {target}"
            assert mode in ("ro", "rw"), f"{name}: {mode}"
            if source.startswith((".", "/")):
                assert (DOCKER / source).exists(), f"{name}: bind mount source {source} does not exist"
            else:
                assert source in declared, f"{name}: volume {source} not declared"
                used.add(source)
    assert declared == used, "declared volumes nobody mounts"


# --- the faultstream services -------------------------------------------------------------------


def _faultstream_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in services.items() if "build" in s}


def test_faultstream_services_share_the_image_built_from_this_checkout(
    services: dict[str, dict[str, Any]],
) -> None:
    built = _faultstream_services(services)
    assert set(built) == {"init", "worker", "replay", "notify"}
    images = {s["image"] for s in built.values()}
    assert len(images) == 1
    for name, service in built.items():
        build = service["build"]
        assert (DOCKER / build["context"]).resolve() == ROOT, name
        assert (ROOT / build["dockerfile"]).is_file(), name
        assert service.get("pull_policy") == "build", f"{name}: the image is local, never pulled"


def test_faultstream_variables_are_real_settings(
    services: dict[str, dict[str, Any]], env: dict[str, str]
) -> None:
    named = {key for key in env if key.startswith(ENV_PREFIX)}
    for service in services.values():
        named |= {key for key in _environment(service) if key.startswith(ENV_PREFIX)}
    assert named - SETTING_NAMES == set(), "not settings of stream/settings.py"
    for name, service in _faultstream_services(services).items():
        settings = Settings.from_env(_environment(service))  # types and derived values validate
        assert not settings.is_embedded, f"{name} would use an embedded store"
        assert settings.metrics_host == "0.0.0.0", name
        for key, value in env.items():
            if key.startswith(ENV_PREFIX):
                assert _environment(service).get(key) == value, f"{name} does not pass {key} through"


def test_faultstream_reaches_kafka_and_clickhouse(services: dict[str, dict[str, Any]]) -> None:
    kafka = _environment(services["kafka"])
    clickhouse = _environment(services["clickhouse"])
    for name, service in _faultstream_services(services).items():
        settings = Settings.from_env(_environment(service))
        assert f"INTERNAL://{settings.kafka_bootstrap}" in kafka["KAFKA_ADVERTISED_LISTENERS"].split(","), (
            name
        )
        dsn = urlparse(settings.clickhouse_dsn)
        assert (dsn.scheme, dsn.hostname, dsn.port) == ("http", "clickhouse", 8123), name
        # Only the init job (init-db creates the tables) uses the admin; the rest write as the writer.
        expected = (
            (clickhouse["CLICKHOUSE_USER"], clickhouse["CLICKHOUSE_PASSWORD"])
            if name == "init"
            else ("faultstream_writer", clickhouse["CLICKHOUSE_WRITER_PASSWORD"])
        )
        assert (dsn.username, dsn.password) == expected, name
        assert dsn.password, "the DSN carries the password"
        deps = _dependencies(service)
        assert deps["kafka"] == "service_healthy", name
        if name not in ("replay", "notify"):  # these two never touch ClickHouse
            assert deps["clickhouse"] == "service_healthy", name


def test_init_creates_topics_and_tables(services: dict[str, dict[str, Any]]) -> None:
    init = services["init"]
    script = " ".join(init.get("entrypoint", [])) + " " + " ".join(init.get("command", []) or [])
    assert "faultstream init-kafka" in script
    assert "faultstream init-db" in script
    assert "-e" in init["entrypoint"][1], "a failing step must fail the job"
    assert not init.get("profiles")


def test_replay_job_publishes_the_mounted_folder(
    raw: dict[str, Any], services: dict[str, dict[str, Any]], env: dict[str, str]
) -> None:
    replay = services["replay"]
    assert replay["profiles"] == ["replay"]
    (source, target, mode), *_ = _volumes(replay)
    assert "${REPLAY_DIR" in raw["services"]["replay"]["volumes"][0]
    assert source == env["REPLAY_DIR"]
    assert (DOCKER / source).is_dir(), f"the default replay folder {source} does not exist"
    assert mode == "ro"
    command = replay["command"].split()
    assert command[:2] == ["replay", target]
    settings = Settings.from_env(_environment(replay))
    assert command[command.index("--to") + 1] == f"kafka://{settings.kafka_bootstrap}"


def test_worker_healthcheck_and_metrics_port_agree(services: dict[str, dict[str, Any]]) -> None:
    worker = services["worker"]
    port = Settings.from_env(_environment(worker)).metrics_port
    assert port
    assert str(port) in [str(p) for p in worker["expose"]]
    assert f"127.0.0.1:{port}/metrics" in " ".join(worker["healthcheck"]["test"])


# --- Kafka and ClickHouse -----------------------------------------------------------------------


def _listeners(value: str) -> dict[str, str]:
    """``NAME://host:port,...`` -> ``{NAME: host:port}``."""
    return dict(item.split("://", 1) for item in value.split(","))


def test_kafka_runs_kraft_single_node(services: dict[str, dict[str, Any]], env: dict[str, str]) -> None:
    kafka = _environment(services["kafka"])
    assert set(kafka["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    listeners = _listeners(kafka["KAFKA_LISTENERS"])
    advertised = _listeners(kafka["KAFKA_ADVERTISED_LISTENERS"])
    protocols = dict(item.split(":") for item in kafka["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(listeners) == set(protocols)
    assert set(advertised) <= set(listeners)
    controller = kafka["KAFKA_CONTROLLER_LISTENER_NAMES"]
    assert controller in listeners and controller not in advertised
    assert kafka["KAFKA_INTER_BROKER_LISTENER_NAME"] in advertised
    node_id, _, voter = kafka["KAFKA_CONTROLLER_QUORUM_VOTERS"].partition("@")
    assert node_id == kafka["KAFKA_NODE_ID"]
    assert voter.split(":")[1] == listeners[controller].rsplit(":", 1)[1]
    for key in ("OFFSETS_TOPIC_REPLICATION_FACTOR", "TRANSACTION_STATE_LOG_REPLICATION_FACTOR"):
        assert kafka[f"KAFKA_{key}"] == "1", key
    # The host listener is advertised at the port published on the host.
    [(_ip, host_port, container_port)] = _host_ports(services["kafka"])
    host_listener = next(n for n, a in advertised.items() if a.startswith("127.0.0.1:"))
    assert advertised[host_listener] == f"127.0.0.1:{host_port}"
    assert listeners[host_listener].endswith(f":{container_port}")
    # A KRaft cluster id is 16 bytes, base64url without padding.
    assert len(base64.urlsafe_b64decode(kafka["CLUSTER_ID"] + "==")) == 16
    assert "/var/lib/kafka/data" in [t for _s, t, _m in _volumes(services["kafka"])]
    assert kafka["KAFKA_LOG_DIRS"] == "/var/lib/kafka/data"


def test_clickhouse_user_is_created_by_the_image(services: dict[str, dict[str, Any]]) -> None:
    clickhouse = _environment(services["clickhouse"])
    assert clickhouse["CLICKHOUSE_USER"] and clickhouse["CLICKHOUSE_PASSWORD"]
    assert clickhouse["CLICKHOUSE_DEFAULT_ACCESS_MANAGEMENT"] == "1"
    assert "CLICKHOUSE_DB" not in clickhouse, "`faultstream init-db` creates the database"
    test = " ".join(services["clickhouse"]["healthcheck"]["test"])
    assert "$CLICKHOUSE_USER" in test and "$CLICKHOUSE_PASSWORD" in test  # the container's own env


def _clickhouse_users() -> tuple[dict[str, ET.Element], dict[str, ET.Element], ET.Element]:
    """Users and profiles of clickhouse/users.d/faultstream-users.xml, and its ``<users>``."""
    root = ET.parse(CLICKHOUSE_USERS).getroot()
    assert root.tag == "clickhouse"
    users = root.find("users")
    assert users is not None
    profiles = root.find("profiles")
    return (
        {user.tag: user for user in users if user.get("remove") is None},
        {profile.tag: profile for profile in (profiles if profiles is not None else [])},
        users,
    )


def _grants(user: ET.Element) -> list[str]:
    return [" ".join((query.text or "").split()) for query in user.findall("grants/query")]


def test_clickhouse_users_are_least_privilege(
    services: dict[str, dict[str, Any]], env: dict[str, str]
) -> None:
    users, profiles, declared = _clickhouse_users()
    database = Settings.from_env(_environment(services["worker"])).database
    assert set(users) == {"faultstream_writer", "faultstream_reader"}
    assert _grants(users["faultstream_writer"]) == [f"GRANT INSERT, SELECT ON {database}.*"]
    assert _grants(users["faultstream_reader"]) == [f"GRANT SELECT ON {database}.*"]
    # The reader's profile refuses writes and DDL even if a grant were widened by mistake.
    reader_profile = profiles[users["faultstream_reader"].findtext("profile", "")]
    assert reader_profile.findtext("readonly") == "2"
    for name, user in users.items():
        assert user.find("access_management") is None, f"{name} must not manage users"
        assert user.findtext("networks/ip"), f"{name}: no networks"
    # No passwordless user: `default` is removed, and every password comes from the container's
    # environment, which compose fills from a variable without a default.
    assert [u.tag for u in declared if u.get("remove") == "remove"] == ["default"]
    clickhouse = _environment(services["clickhouse"])
    raw_env = {k: v for k, v in (services["clickhouse"].get("environment") or {}).items()}
    for name, user in users.items():
        [password] = [e for e in user if e.tag.startswith("password")]
        assert password.tag == "password" and not (password.text or "").strip(), f"{name}: password in clear"
        variable = password.get("from_env")
        assert clickhouse.get(variable), f"{name}: {variable} not set in the container"
        assert variable in SECRETS, f"{name}: {variable} must be a secret without a default"
        assert raw_env[variable] == clickhouse[variable]
    passwords = [clickhouse["CLICKHOUSE_PASSWORD"]] + [
        clickhouse[u.find("password").get("from_env")]
        for u in users.values()  # type: ignore[union-attr]
    ]
    assert len(set(passwords)) == len(passwords), "the example gives each user its own password"
    # The admin is the image's user (CLICKHOUSE_USER replaces `default`), used by init and healthcheck only.
    assert clickhouse["CLICKHOUSE_USER"] == env["CLICKHOUSE_ADMIN_USER"] != "default"
    assert clickhouse["CLICKHOUSE_PASSWORD"] == env["CLICKHOUSE_ADMIN_PASSWORD"]
    mounts = _mounts(services["clickhouse"])
    assert mounts["/etc/clickhouse-server/users.d/faultstream-users.xml"] == CLICKHOUSE_USERS.resolve()
    assert ":ro" in " ".join(services["clickhouse"]["volumes"])


def test_clickhouse_grants_parse_as_clickhouse_sql() -> None:
    """The grant queries, parsed by the ClickHouse engine itself (chdb's EXPLAIN AST, in a
    process of its own: chdb allows one store per process and the session has one)."""
    users, _profiles, _ = _clickhouse_users()
    queries = [f"{grant} TO {name}" for name, user in users.items() for grant in _grants(user)]
    script = (
        "import sys, chdb\n"
        "for q in sys.argv[1:]:\n"
        "    assert 'GrantQuery' in str(chdb.query('EXPLAIN AST ' + q, 'CSV')), q\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, *queries], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]


# --- Prometheus ---------------------------------------------------------------------------------


def test_prometheus_scrapes_every_worker(services: dict[str, dict[str, Any]]) -> None:
    config = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    port = Settings.from_env(_environment(services["worker"])).metrics_port
    discovered = [
        (job, sd)
        for job in config["scrape_configs"]
        for sd in job.get("dns_sd_configs", [])
        if "worker" in sd["names"]
    ]
    assert len(discovered) == 1, "one DNS-discovered job on the `worker` service name"
    job, sd = discovered[0]
    assert sd["type"] == "A" and sd["port"] == port
    assert job.get("metrics_path", "/metrics") == "/metrics"
    prometheus = services["prometheus"]
    mounts = {target: source for source, target, _mode in _volumes(prometheus)}
    config_flag = next(arg for arg in prometheus["command"] if arg.startswith("--config.file="))
    target = config_flag.split("=", 1)[1]
    assert (DOCKER / mounts[target]).resolve() == PROMETHEUS


def test_prometheus_alerts_and_notify_reach_the_stacks_alertmanager(
    services: dict[str, dict[str, Any]],
) -> None:
    config = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    [target] = [
        t for am in config["alerting"]["alertmanagers"] for sc in am["static_configs"] for t in sc["targets"]
    ]
    assert target == "alertmanager:9093"
    notify = services["notify"]
    assert notify["command"] == ["notify", "--alertmanager", f"http://{target}"]
    assert _dependencies(notify)["alertmanager"] == "service_healthy"
    mounts = {target: source for source, target, _mode in _volumes(services["alertmanager"])}
    assert (
        DOCKER / mounts["/etc/alertmanager/alertmanager.yml"]
    ).resolve() == DOCKER / "alertmanager" / "alertmanager.yml"


def test_prometheus_loads_the_mounted_alert_rules(services: dict[str, dict[str, Any]]) -> None:
    config = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    mounts = {target: source for source, target, _mode in _volumes(services["prometheus"])}
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    assert (DOCKER / mounts["/etc/prometheus/alerts.yml"]).resolve() == PROMETHEUS.with_name("alerts.yml")


# --- Grafana ------------------------------------------------------------------------------------


def _provisioning(kind: str) -> list[dict[str, Any]]:
    files = sorted((GRAFANA_PROVISIONING / kind).glob("*.y*ml"))
    assert files, f"no {kind} provisioning file"
    docs = [yaml.safe_load(path.read_text(encoding="utf-8")) for path in files]
    assert all(doc["apiVersion"] == 1 for doc in docs)
    return docs


def _mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path of a service's bind mounts."""
    return {
        target: (DOCKER / source).resolve()
        for source, target, _mode in _volumes(service)
        if source.startswith((".", "/"))
    }


def test_grafana_mounts_provisioning_and_dashboards(services: dict[str, dict[str, Any]]) -> None:
    grafana = services["grafana"]
    mounts = _mounts(grafana)
    assert mounts["/etc/grafana/provisioning"] == GRAFANA_PROVISIONING.resolve()
    [provider] = [p for doc in _provisioning("dashboards") for p in doc["providers"]]
    assert provider["type"] == "file"
    assert mounts[provider["options"]["path"]] == (DOCKER / "grafana" / "dashboards").resolve()
    assert provider["allowUiUpdates"] is False, "the JSON files are the source of the dashboards"


def test_grafana_datasources(services: dict[str, dict[str, Any]], raw: dict[str, Any]) -> None:
    datasources = {ds["uid"]: ds for doc in _provisioning("datasources") for ds in doc["datasources"]}
    assert set(datasources) == {"clickhouse", "prometheus"}
    assert [uid for uid, ds in datasources.items() if ds.get("isDefault")] == ["clickhouse"]

    clickhouse = datasources["clickhouse"]
    assert clickhouse["type"] == "grafana-clickhouse-datasource"
    data = clickhouse["jsonData"]
    assert data["host"] in services and data["host"] == "clickhouse"
    assert (data["protocol"], data["port"]) == ("http", 8123)

    prometheus = datasources["prometheus"]
    assert prometheus["type"] == "prometheus"
    url = urlparse(prometheus["url"])
    assert url.hostname in services and url.port == 9090

    # Every ${VAR} the provisioning expands is in Grafana's environment, with the right value.
    grafana = _environment(services["grafana"])
    text = "".join(p.read_text(encoding="utf-8") for p in GRAFANA_PROVISIONING.rglob("*.y*ml"))
    assert _variables(text) <= grafana.keys()
    ch_server = _environment(services["clickhouse"])
    # Grafana reads as the read-only user of clickhouse/users.d, never as the admin or the writer.
    assert grafana["CLICKHOUSE_READER_USER"] == "faultstream_reader"
    assert grafana["CLICKHOUSE_READER_PASSWORD"] == ch_server["CLICKHOUSE_READER_PASSWORD"]
    assert "CLICKHOUSE_USER" not in grafana and "CLICKHOUSE_PASSWORD" not in grafana
    assert grafana["CLICKHOUSE_DATABASE"] == Settings.from_env(_environment(services["worker"])).database
    assert "secureJsonData" in clickhouse and "password" not in data, "the password is secure JSON"


def test_grafana_installs_a_pinned_clickhouse_plugin(services: dict[str, dict[str, Any]]) -> None:
    grafana = _environment(services["grafana"])
    plugins = grafana["GF_PLUGINS_PREINSTALL_SYNC"].split(",")
    pinned = [p for p in plugins if p.startswith("grafana-clickhouse-datasource@")]
    assert len(pinned) == 1
    assert re.fullmatch(r"\d+\.\d+\.\d+", pinned[0].split("@", 1)[1]), pinned
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"]
