"""TLS on ksi's listeners (server certificate, optional client certificates) and to the cluster, with
confluent-kafka (librdkafka's OpenSSL) as the client.  No broker installable here speaks TLS, so the
upstream side is tested through a second ksi whose listeners are TLS: client -> ksi B -(TLS)-> ksi A -> broker."""

from __future__ import annotations

import datetime
import ipaddress
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ksi.brokers import BrokerProcess


def _write(path: Path, key: Any, cert: x509.Certificate) -> tuple[str, str]:
    key_path, cert_path = path.with_suffix(".key"), path.with_suffix(".pem")
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(cert_path), str(key_path)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, all signed by the CA."""
    root = tmp_path_factory.mktemp("pki")
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ksi test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    out = {"ca": _write(root / "ca", ca_key, ca)}
    for name, usage in (("server", x509.oid.ExtendedKeyUsageOID.SERVER_AUTH),
                        ("client", x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH)):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"ksi test {name}")]))
                .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                            x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                               critical=False)
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        out[name] = _write(root / name, key, cert)
    return out


def roundtrip(bootstrap: str, topic: str, **tls: Any) -> list[bytes]:
    producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 15000, **tls})
    for i in range(20):
        producer.produce(topic, value=f"tls {i}".encode(), partition=0)
    assert producer.flush(20) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "fetch.queue.backoff.ms": 10, **tls})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values = []
    try:
        for _ in range(60):
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                values.append(message.value())
            if len(values) == 20:
                break
    finally:
        consumer.close()
    return values


def test_tls_listener_with_and_without_client_certificates(tansu: BrokerProcess, ksi_proxy: Any,
                                                           pki: dict[str, tuple[str, str]]) -> None:
    ca = pki["ca"][0]
    server_cert, server_key = pki["server"]
    client_cert, client_key = pki["client"]
    topic = f"tls-{uuid.uuid4().hex[:8]}"
    tansu.create_topic(topic, 1)
    proxy = ksi_proxy(tansu, proxy={"tls": {"cert_file": server_cert, "key_file": server_key}})
    tls = {"security.protocol": "SSL", "ssl.ca.location": ca}
    assert roundtrip(proxy.bootstrap, topic, **tls) == [f"tls {i}".encode() for i in range(20)]

    # A plaintext client against the TLS listener fails, is logged, and ksi keeps serving TLS clients.
    with pytest.raises(KafkaException):
        Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": "x"}).list_topics(timeout=3)
    assert "TLS failed" in proxy.log_text()

    mutual = ksi_proxy(tansu, proxy={"tls": {"cert_file": server_cert, "key_file": server_key, "ca_file": ca,
                                             "require_client_cert": True}})
    with pytest.raises(KafkaException):
        Consumer({"bootstrap.servers": mutual.bootstrap, "group.id": "x", **tls}).list_topics(timeout=3)
    with_cert = {**tls, "ssl.certificate.location": client_cert, "ssl.key.location": client_key}
    assert len(roundtrip(mutual.bootstrap, topic, **with_cert)) == 20


def test_tls_to_the_cluster(tansu: BrokerProcess, ksi_proxy: Any, pki: dict[str, tuple[str, str]]) -> None:
    ca = pki["ca"][0]
    server_cert, server_key = pki["server"]
    topic = f"tls-up-{uuid.uuid4().hex[:8]}"
    tansu.create_topic(topic, 1)
    inner = ksi_proxy(tansu, proxy={"tls": {"cert_file": server_cert, "key_file": server_key}})

    class Upstream:  # ksi A, seen by ksi B as its Kafka cluster
        bootstrap = inner.bootstrap

    outer = ksi_proxy(Upstream, upstream={"tls": {"ca_file": ca}})
    assert roundtrip(outer.bootstrap, topic) == [f"tls {i}".encode() for i in range(20)]


def test_bad_tls_settings_are_named_before_anything_listens(tmp_path: Path) -> None:
    import subprocess
    import sys

    config = tmp_path / "bad.toml"
    config.write_text('[upstream]\nbootstrap_servers = "127.0.0.1:9"\n[proxy.tls]\ncert_file = "/nope.pem"\n')
    done = subprocess.run([sys.executable, "-m", "ksi", "serve", "--config", str(config)], capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.returncode == 2 and "proxy.tls.cert_file: no such file: /nope.pem" in done.stderr
