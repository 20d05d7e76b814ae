"""The local Kafka broker behaves like the real thing the sinks and signal channel rely on."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from mongocdc_core import maven
from mongocdc_core.sinks.kafka import create_topics
from mongocdc_devstack import kafka_broker as kb
from mongocdc_devstack.kafka_broker import KafkaBroker, KafkaBrokerError

REPO_ROOT = Path(__file__).resolve().parents[2]
END = b"__end__"

Record = tuple[bytes | None, bytes | None]


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _produce(producer: Producer, topic: str, records: Sequence[Record]) -> None:
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(err)

    for key, value in records:
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
    assert producer.flush(30) == 0, "messages still in flight after 30s"
    assert errors == []


def _consume_until_end(bootstrap: str, topic: str, **config: str) -> list[Record]:
    """Everything in ``topic`` up to the END sentinel (which the producer writes last)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **config,
        }
    )
    consumer.subscribe([topic])
    seen: list[Record] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            if msg.value() == END:
                return seen
            seen.append((msg.key(), msg.value()))
    finally:
        consumer.close()
    raise AssertionError(f"no end marker in {topic} after 60s; got {seen!r}")


def _idempotent_producer(bootstrap: str) -> Producer:
    return Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5}
    )


def test_produce_consume_round_trip(kafka_bootstrap: str) -> None:
    topic = _topic("roundtrip")
    records: list[Record] = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(200)]
    _produce(_idempotent_producer(kafka_bootstrap), topic, [*records, (b"end", END)])

    assert _consume_until_end(kafka_bootstrap, topic) == records


def test_transactions_hide_aborted_records_from_read_committed(kafka_bootstrap: str) -> None:
    topic = _topic("txn")
    producer = Producer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "transactional.id": f"tx-{uuid.uuid4().hex[:8]}",
            "acks": "all",
        }
    )
    producer.init_transactions(30)
    batches = [
        ([(b"a", b"1"), (b"b", b"2"), (b"c", b"3")], True),
        ([(b"x", b"aborted-1"), (b"y", b"aborted-2")], False),
        ([(b"d", b"4"), (b"e", END)], True),
    ]
    for batch, commit in batches:
        producer.begin_transaction()
        for key, value in batch:
            producer.produce(topic, key=key, value=value)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.flush(30)  # the aborted records really reach the log before the abort marker
            producer.abort_transaction(30)

    committed = _consume_until_end(kafka_bootstrap, topic, **{"isolation.level": "read_committed"})
    uncommitted = _consume_until_end(kafka_bootstrap, topic, **{"isolation.level": "read_uncommitted"})

    assert committed == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3"), (b"d", b"4")]
    assert uncommitted == [
        (b"a", b"1"),
        (b"b", b"2"),
        (b"c", b"3"),
        (b"x", b"aborted-1"),
        (b"y", b"aborted-2"),
        (b"d", b"4"),
    ]


def test_compacted_topic_can_be_created_and_keeps_tombstones(kafka_bootstrap: str) -> None:
    topic = _topic("compacted")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    # The connector's own helper: it returns once the broker's metadata lists the topic, so the
    # description below cannot meet "unknown topic" (KRaft applies a new topic a moment later).
    create_topics(admin, [topic], partitions=1, replication_factor=1, config={"cleanup.policy": "compact"})

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["cleanup.policy"].value == "compact"

    _produce(_idempotent_producer(kafka_bootstrap), topic, [(b"k", b"v"), (b"k", None), (b"end", END)])
    assert _consume_until_end(kafka_bootstrap, topic) == [(b"k", b"v"), (b"k", None)]


def test_restart_on_same_data_dir_keeps_data_mid_stream(kafka_broker: KafkaBroker) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = _topic("restart")
    producer = _idempotent_producer(bootstrap)
    before = [(f"b{i}".encode(), b"before") for i in range(50)]
    _produce(producer, topic, before)
    jvm_pid = kafka_broker.pid
    assert jvm_pid is not None

    kafka_broker.stop()
    assert not kafka_broker.is_running
    with pytest.raises(ProcessLookupError):
        os.kill(jvm_pid, 0)
    kafka_broker.start()

    assert kafka_broker.bootstrap_servers == bootstrap
    after = [(f"a{i}".encode(), b"after") for i in range(50)]
    _produce(producer, topic, [*after, (b"end", END)])  # the same producer reconnects by itself
    assert _consume_until_end(bootstrap, topic) == before + after


@pytest.fixture
def held_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_port_taken_is_a_clear_error(held_port: int, tmp_path: Path) -> None:
    broker = KafkaBroker(held_port, tmp_path / "data")
    with pytest.raises(KafkaBrokerError, match=rf"port {held_port} on 127\.0\.0\.1 is already in use"):
        broker.start()
    assert not broker.is_running


def test_a_chosen_port_taken_before_the_broker_binds_it_is_replaced(
    held_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process takes a port between its choice and the broker's bind: the first start picks
    other ports and comes up (a broker given its port, or restarted, keeps it: see above)."""
    real = kb._free_ports
    chosen: list[list[int]] = []

    def first_taken(count: int) -> list[int]:
        ports = [held_port, *real(count - 1)] if not chosen else real(count)
        chosen.append(ports)
        return ports

    monkeypatch.setattr(kb, "_free_ports", first_taken)
    with KafkaBroker(None, tmp_path / "data") as broker:
        assert len(chosen) == 2 and broker.port not in (held_port, chosen[0][1]) and broker.port == chosen[1][0]
        metadata = AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=30)
        assert kb.NODE_ID in metadata.brokers


def _jars_named_by_the_pom(folder: Path, leave_out: str = "") -> Path:
    """A directory with a (empty) file of every jar the pom names: where the jars are is decided by names."""
    folder.mkdir(parents=True)
    for artifact in kb.KAFKA_JARS.artifacts():
        if artifact.file_name != leave_out:
            (folder / artifact.file_name).write_bytes(b"")
    return folder


@pytest.fixture()
def no_jars_anywhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A pip user's machine: no MONGOCDC_KAFKA_JARS, no checkout's .jars, an empty user cache (returned)."""
    monkeypatch.delenv(kb.JARS_ENV, raising=False)
    monkeypatch.setattr(maven, "CHECKOUT_JARS", tmp_path / "no-checkout" / ".jars")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "mongocdc" / "kafka-jars"


def test_no_jars_anywhere_names_the_ways_to_get_them(no_jars_anywhere: Path, tmp_path: Path) -> None:
    with pytest.raises(KafkaBrokerError) as excinfo:
        KafkaBroker(None, tmp_path / "data").start()
    message = str(excinfo.value)
    assert message.startswith("cannot start the Kafka broker: the Kafka broker's jars are missing: "
                              f"{kb.JARS_ENV} is not set and {no_jars_anywhere} does not hold them; ")
    assert message.endswith(f"run `mongocdc kafka jars` (downloads them from https://repo1.maven.org/maven2 into "
                            f"{no_jars_anywhere}; `--dir DIR` for a copy to carry to a machine without network), "
                            f"or set {kb.JARS_ENV} to a directory holding them")  # a pip user has no `make setup`
    (maven.CHECKOUT_JARS.parent).mkdir(parents=True)
    (maven.CHECKOUT_JARS.parent / "Makefile").write_text("")
    with pytest.raises(KafkaBrokerError) as excinfo:
        KafkaBroker(None, tmp_path / "data").start()
    assert f"neither {maven.CHECKOUT_JARS / 'kafka'} nor {no_jars_anywhere} holds them" in str(excinfo.value)
    assert str(excinfo.value).endswith(f", or run `make setup` (Maven, into {maven.CHECKOUT_JARS / 'kafka'})")


def test_jars_are_found_in_the_named_directory_then_the_checkout_then_the_user_cache(
        no_jars_anywhere: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cache = _jars_named_by_the_pom(no_jars_anywhere)
    assert kb.find_jars() == cache
    checkout = _jars_named_by_the_pom(maven.CHECKOUT_JARS / "kafka")
    assert kb.find_jars() == checkout  # `make setup`'s jars come before the cache
    named = _jars_named_by_the_pom(tmp_path / "named")
    monkeypatch.setenv(kb.JARS_ENV, str(named))
    assert kb.find_jars() == named
    argument = _jars_named_by_the_pom(tmp_path / "argument")
    assert kb.find_jars(argument) == argument


def test_the_checkouts_jars_are_the_poms(no_jars_anywhere: Path) -> None:
    """What Maven copies for `make setup` is the pom's list, so the user cache and .jars/kafka agree."""
    checkout = REPO_ROOT / ".jars" / "kafka"
    if not checkout.is_dir():
        pytest.skip("no .jars/kafka: `make setup` has not run")
    assert {p.name for p in checkout.glob("*.jar")} == {a.file_name for a in kb.KAFKA_JARS.artifacts()}
    assert len(kb.KAFKA_JARS.artifacts()) == 45 and kb.KAFKA_JARS.artifacts()[0].file_name == "kafka_2.13-4.4.0.jar"


def test_a_named_directory_that_does_not_exist_says_what_to_do(no_jars_anywhere: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no-jars-here"
    with pytest.raises(KafkaBrokerError, match=r"is not a directory; run `mongocdc kafka jars`") as excinfo:
        KafkaBroker(None, tmp_path / "data", missing).start()
    assert str(missing) in str(excinfo.value)


def test_a_named_directory_lacking_a_jar_names_it(no_jars_anywhere: Path, monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    """A directory that lacks one jar is not used, even though the cache would have them all."""
    _jars_named_by_the_pom(no_jars_anywhere)
    lacking = _jars_named_by_the_pom(tmp_path / "jars", leave_out="kafka-raft-4.4.0.jar")
    monkeypatch.setenv(kb.JARS_ENV, str(lacking))
    with pytest.raises(KafkaBrokerError) as excinfo:
        KafkaBroker(None, tmp_path / "data").start()
    assert f"{kb.JARS_ENV}={lacking} lacks kafka-raft-4.4.0.jar (the Kafka broker's jars); run `mongocdc kafka jars`" \
        in str(excinfo.value)


def test_no_java_on_path_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(KafkaBrokerError, match=r"no `java` executable on PATH"):
        KafkaBroker(None, tmp_path / "data").start()


def test_invalid_setting_fails_formatting_with_the_tool_output(tmp_path: Path) -> None:
    broker = KafkaBroker(None, tmp_path / "data", properties={"log.segment.bytes": "lots"})
    with pytest.raises(KafkaBrokerError, match=r"formatting Kafka storage .* failed") as excinfo:
        broker.start()
    assert "log.segment.bytes" in str(excinfo.value)


def test_second_broker_on_a_data_dir_in_use_is_refused(kafka_broker: KafkaBroker) -> None:
    """Kafka itself notices too late (after writing to the metadata log), so the wrapper must refuse."""
    second = KafkaBroker(None, kafka_broker.data_dir, kafka_broker.jars_dir)
    with pytest.raises(
        KafkaBrokerError, match=rf"is in use by another Kafka broker \(JVM pid {kafka_broker.pid},"
    ):
        second.start()
    assert kafka_broker.is_running
    assert AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers}).list_topics(timeout=30).brokers


def test_broker_exiting_early_reports_its_log_tail(
    held_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The port is taken after the wrapper checked it (a race): the JVM dies and its log explains why."""
    monkeypatch.setattr(kb, "_check_port_free", lambda port, role: None)
    broker = KafkaBroker(held_port, tmp_path / "data")
    with pytest.raises(KafkaBrokerError, match=r"exited during start-up with code \d+") as excinfo:
        broker.start()
    assert "Address already in use" in str(excinfo.value)
    assert str(broker.log_path) in str(excinfo.value)
    assert not broker.is_running


def _read_line_containing(proc: subprocess.Popen[str], needle: str, timeout: float) -> str:
    assert proc.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if selector.select(timeout=0.5):
            line = proc.stdout.readline()
            if needle in line:
                return line
            if line == "" and proc.poll() is not None:
                break
    raise AssertionError(f"{needle!r} not printed within {timeout}s (exit code {proc.poll()})")


def test_cli_runs_in_foreground_until_sigterm(tmp_path: Path, kafka_broker: KafkaBroker) -> None:
    port = kb._free_ports(1)[0]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mongocdc_devstack.kafka_broker",
            "--port",
            str(port),
            "--data-dir",
            str(tmp_path / "cli"),
            "--jars-dir",
            str(kafka_broker.jars_dir),
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = _read_line_containing(proc, f"Kafka broker ready at 127.0.0.1:{port}", timeout=120)
        jvm_pid = int(line.rsplit("pid ", 1)[1].rstrip(")\n"))
        metadata = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=30)
        assert kb.NODE_ID in metadata.brokers

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with pytest.raises(ProcessLookupError):
        os.kill(jvm_pid, 0)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))  # the JVM released the port


def test_cli_reports_a_taken_port(held_port: int, tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mongocdc_devstack.kafka_broker",
            "--port",
            str(held_port),
            "--data-dir",
            str(tmp_path / "cli"),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert f"port {held_port}" in result.stderr and "already in use" in result.stderr
    assert len(result.stderr.splitlines()) == 1 and " ERROR mongocdc.kafka: mongocdc kafka: " in result.stderr
