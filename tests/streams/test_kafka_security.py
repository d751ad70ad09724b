"""Transport security of every Kafka client (schemas/kafka_client.py): settings, aiokafka kwargs, secrets.

Unit tests build the settings from flags and env `KAFKA_*`, turn them into aiokafka keyword arguments (and
faust credentials for the worker's producer) and check that no repr, str, error or log line shows the password.

End to end (marked kafka): Tansu 0.6 (the test broker) has no working TLS listener (`--cert`/`--key` are
accepted but the listener still speaks plaintext) and with `--authentication` it requires SASL but cannot be
given a user (creating one needs an authenticated connection), so a SASL login can only fail. What it can
show: the SCRAM client configured by `client_kwargs` runs its exchange against the broker (the failure is
the SASL exchange, not the connection), a plaintext client is refused, each command exits with one line, and
the password appears in none of its output.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import SecretStr

from schemas.kafka_client import (
    EXIT_CONFIG,
    EXIT_UNAVAILABLE,
    KafkaClientSettings,
    KafkaSettingsError,
    KafkaUnavailable,
    client_kwargs,
    load_settings,
    settings_from_args,
    start_client,
)
from streams.cli import build_parser
from streams.kafka_link import faust_credentials

SECRET = "pw-Zq9!never-print-me"
REPO = Path(__file__).resolve().parents[2]

# A throwaway self-signed test CA (EC P-256, valid to 2126) and its key, plain and encrypted with KEY_PW.
CA_PEM = """-----BEGIN CERTIFICATE-----
MIIBjjCCATOgAwIBAgIUCdD9HZBj+u9NySZxhYYiPczAYS0wCgYIKoZIzj0EAwIw
GzEZMBcGA1UEAwwQYXVyZWxpdXMtdGVzdC1jYTAgFw0yNjEyMDExNTIzMzdaGA8y
MTI2MTEwNzE1MjMzN1owGzEZMBcGA1UEAwwQYXVyZWxpdXMtdGVzdC1jYTBZMBMG
ByqGSM49AgEGCCqGSM49AwEHA0IABLiXuv3STr4mSitMwr7lQQNpRFOJPof2Fjta
Jv/gi7zVVYSsSkl6G54bTECviODNP2APu7ctYxmzE2o35ClOwZOjUzBRMB0GA1Ud
DgQWBBQz9YAnoNKMF4Tp8c9YKcUQilVh5TAfBgNVHSMEGDAWgBQz9YAnoNKMF4Tp
8c9YKcUQilVh5TAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0kAMEYCIQC6
nfpeEIM6L+xs2s2DPgGZCXd3BUL9Dty5ONH3k1AcpQIhAMkHxZgAQKCgmVM29O27
yA3WaP8Ctm1X2xDBYSGOy5jC
-----END CERTIFICATE-----
"""
KEY_PEM = """-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgbfzOqKi/MxPisDFY
Q1XQkeYiWyjJ6I5vYfMXIB4O/nKhRANCAAS4l7r90k6+JkorTMK+5UEDaURTiT6H
9hY7Wib/4Iu81VWErEpJehueG0xAr4jgzT9gD7u3LWMZsxNqN+QpTsGT
-----END PRIVATE KEY-----
"""
KEY_PW = "key-pw-123"
ENC_KEY_PEM = """-----BEGIN EC PRIVATE KEY-----
Proc-Type: 4,ENCRYPTED
DEK-Info: AES-128-CBC,4C6CC2ABBE1F8AD5B812809B131563EF

cJ1d7EzSU07Q2gf8JXSuYvq2m3gEIOS59xVKzmqITWqKa7kz1YbR8mHH2irIYA0J
+wBVhmInSE5JpN8Q+6JOOCRx2BwIoRnet0Ic6CU3JRg1l37ivVe6j5qrx+t3SCgg
ivuHtHIPCE/59u8iFdoiesndKR1j/OZ6OgYxH6e9OdM=
-----END EC PRIVATE KEY-----
"""

ENV_NAMES = ("KAFKA_SECURITY_PROTOCOL", "KAFKA_SASL_MECHANISM", "KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD",
             "KAFKA_SASL_PASSWORD_FILE", "KAFKA_SSL_CAFILE", "KAFKA_SSL_CERTFILE", "KAFKA_SSL_KEYFILE",
             "KAFKA_SSL_KEY_PASSWORD", "KAFKA_STARTUP_TIMEOUT_S")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    files = {"ca": CA_PEM, "key": KEY_PEM, "enc_key": ENC_KEY_PEM}
    out = {}
    for name, text in files.items():
        out[name] = tmp_path / f"{name}.pem"
        out[name].write_text(text)
    return out


def _sasl(**kw: object) -> KafkaClientSettings:
    base: dict[str, object] = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
                               "sasl_username": "svc", "sasl_password": SECRET}
    return load_settings(**{**base, **kw})


# --- kwargs construction -------------------------------------------------------------------------------------


def test_plaintext_kwargs_are_just_the_address() -> None:
    assert client_kwargs(KafkaClientSettings(), "b1:9092,b2:9092") == {
        "bootstrap_servers": "b1:9092,b2:9092", "security_protocol": "PLAINTEXT"}


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_plaintext_kwargs(mechanism: str) -> None:
    kw = client_kwargs(_sasl(sasl_mechanism=mechanism), "b:9092")
    assert kw == {"bootstrap_servers": "b:9092", "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
                  "sasl_plain_username": "svc", "sasl_plain_password": SECRET}


def test_ssl_kwargs_carry_a_verifying_context_with_the_ca(pki: dict[str, Path]) -> None:
    kw = client_kwargs(load_settings(security_protocol="SSL", ssl_cafile=str(pki["ca"])), "b:9093")
    ctx = kw.pop("ssl_context")
    assert kw == {"bootstrap_servers": "b:9093", "security_protocol": "SSL"}
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert [dict(x[0] for x in c["subject"])["commonName"] for c in ctx.get_ca_certs()] == ["aurelius-test-ca"]


def test_sasl_ssl_with_client_cert_and_encrypted_key(pki: dict[str, Path]) -> None:
    s = _sasl(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", ssl_cafile=str(pki["ca"]),
              ssl_certfile=str(pki["ca"]), ssl_keyfile=str(pki["enc_key"]), ssl_key_password=KEY_PW)
    kw = client_kwargs(s, "b:9094")
    assert isinstance(kw.pop("ssl_context"), ssl.SSLContext)  # the key was decrypted with its password
    assert kw == {"bootstrap_servers": "b:9094", "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                  "sasl_plain_username": "svc", "sasl_plain_password": SECRET}
    for wrong in (None, "not-the-key-password"):  # an error naming the settings, never a pass-phrase prompt
        with pytest.raises(KafkaSettingsError, match="TLS files cannot be loaded") as err:
            client_kwargs(s.model_copy(update={"ssl_key_password": wrong and SecretStr(wrong)}), "b:9094")
        assert "not-the-key-password" not in str(err.value)
    assert "ssl_context" in client_kwargs(load_settings(security_protocol="SSL", ssl_certfile=str(pki["ca"]),
                                                        ssl_keyfile=str(pki["key"])), "b:9093")


def test_encrypted_key_without_its_password_is_refused_not_prompted_for(pki: dict[str, Path]) -> None:
    """On a terminal, OpenSSL asks for a missing key pass phrase and waits: a worker would hang at start."""
    import pty
    import select

    code = ("from schemas.kafka_client import KafkaSettingsError, client_kwargs, load_settings\n"
            f"s = load_settings(security_protocol='SSL', ssl_certfile={str(pki['ca'])!r}, "
            f"ssl_keyfile={str(pki['enc_key'])!r})\n"
            "try:\n    client_kwargs(s, 'b:1')\nexcept KafkaSettingsError:\n    print('refused', flush=True)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    pid, fd = pty.fork()
    if pid == 0:  # the child, on a pseudo-terminal
        os.execve(sys.executable, [sys.executable, "-c", code], env)
    out, deadline = b"", time.monotonic() + 30
    try:
        while b"refused" not in out and b"pass phrase" not in out and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.5)[0]:
                try:
                    out += os.read(fd, 1024)
                except OSError:
                    break
    finally:
        if b"refused" not in out:
            os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(fd)
    assert b"pass phrase" not in out and b"refused" in out, out


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch, pki: dict[str, Path]) -> None:
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("KAFKA_SASL_USERNAME", "svc")
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", SECRET)
    monkeypatch.setenv("KAFKA_SSL_CAFILE", str(pki["ca"]))
    monkeypatch.setenv("KAFKA_STARTUP_TIMEOUT_S", "4.5")
    s = load_settings()
    assert (s.security_protocol, s.sasl_mechanism, s.sasl_username, s.ssl_cafile, s.startup_timeout_s) == (
        "SASL_SSL", "SCRAM-SHA-512", "svc", pki["ca"], 4.5)
    assert s.sasl_password is not None and s.sasl_password.get_secret_value() == SECRET
    # and the worker's settings carry them (env KAFKA_*, not AURELIUS_*)
    from streams.settings import WorkerSettings

    assert WorkerSettings().kafka == s


def test_flags_override_env_and_password_comes_from_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "SSL")
    monkeypatch.setenv("KAFKA_SASL_MECHANISM", "PLAIN")
    pw = tmp_path / "pw"
    pw.write_text(SECRET + "\n")
    for command in ("worker", "publish", "audit-sink"):
        args = build_parser().parse_args([command, "--security-protocol", "SASL_PLAINTEXT", "--sasl-username", "svc",
                                          "--sasl-password-file", str(pw), "--kafka-startup-timeout-s", "3"])
        s = settings_from_args(args)
        assert (s.security_protocol, s.sasl_mechanism, s.sasl_username, s.startup_timeout_s) == (
            "SASL_PLAINTEXT", "PLAIN", "svc", 3.0)
        assert s.sasl_password is not None and s.sasl_password.get_secret_value() == SECRET
    # no flag takes the password itself (it would show in the process list), nor does an abbreviation of
    # --sasl-password-file swallow it as a path; the refusal does not echo it
    with pytest.raises(SystemExit):
        build_parser().parse_args(["publish", "--sasl-password", SECRET])
    assert SECRET not in capsys.readouterr().err


def test_worker_flags_reach_worker_settings(tmp_path: Path) -> None:
    from streams.worker_cli import settings_from_args as worker_settings

    args = build_parser().parse_args(["worker", "--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism",
                                      "SCRAM-SHA-256", "--sasl-username", "svc", "--sasl-password-file",
                                      str(_write(tmp_path / "pw", SECRET))])
    assert client_kwargs(worker_settings(args).kafka, "b:1")["sasl_plain_password"] == SECRET


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(("given", "says"), [
    ({"security_protocol": "SASL_SSL", "sasl_username": "svc", "sasl_password": SECRET}, "KAFKA_SASL_MECHANISM"),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_username": "svc"},
     "KAFKA_SASL_PASSWORD"),
    ({"security_protocol": "PLAINTEXT", "sasl_username": "svc", "sasl_password": SECRET},
     "SASL settings given but security_protocol is PLAINTEXT"),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "GSSAPI", "sasl_username": "svc",
      "sasl_password": SECRET}, "sasl_mechanism"),
    ({"security_protocol": "PLAINTEXT", "ssl_cafile": "/nonexistent/ca.pem"}, "TLS files given"),
    ({"security_protocol": "SSL", "ssl_cafile": "/nonexistent/ca.pem"}, "KAFKA_SSL_CAFILE: no file"),
    ({"security_protocol": "TLS"}, "security_protocol"),
])
def test_inconsistent_settings_are_one_line_without_the_secret(given: dict[str, object], says: str) -> None:
    with pytest.raises(KafkaSettingsError) as err:
        load_settings(**given)
    text = str(err.value)
    assert says in text and SECRET not in text and "\n" not in text


# --- no secret in repr, str, logs --------------------------------------------------------------------------


def test_password_never_in_repr_str_or_dumps(pki: dict[str, Path]) -> None:
    from streams.settings import WorkerSettings

    s = _sasl(security_protocol="SASL_SSL", ssl_cafile=str(pki["ca"]), ssl_key_password=KEY_PW)
    w = WorkerSettings(kafka=s)
    shown = [repr(s), str(s), repr(w), str(w), s.model_dump_json(), w.model_dump_json(), str(s.model_dump()),
             s.describe(), repr(faust_credentials(s))]
    for text in shown:
        assert SECRET not in text and KEY_PW not in text
    assert "**********" in repr(s)


def test_faust_credentials_match_client_kwargs(pki: dict[str, Path]) -> None:
    """The worker's faust producer gets what every other client gets (faust's own translation to aiokafka)."""
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    cases = [KafkaClientSettings(), load_settings(security_protocol="SSL", ssl_cafile=str(pki["ca"])), _sasl(),
             _sasl(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", ssl_cafile=str(pki["ca"]))]
    for s in cases:
        ours = client_kwargs(s, "b:1")
        del ours["bootstrap_servers"]
        theirs = dict(credentials_to_aiokafka_auth(faust_credentials(s)))
        assert set(theirs) - {"ssl_context"} == set(ours) - {"ssl_context"}
        for key in set(ours) - {"ssl_context"}:
            assert theirs[key] == ours[key]
        assert isinstance(theirs.get("ssl_context"), ssl.SSLContext) == s.uses_tls


def test_start_failure_message_and_logs_hold_no_secret(caplog: pytest.LogCaptureFixture) -> None:
    import asyncio

    from aiokafka import AIOKafkaProducer

    s = _sasl(startup_timeout_s=1.0)
    port = _closed_port()
    caplog.set_level(logging.DEBUG)
    with pytest.raises(KafkaUnavailable) as err:
        asyncio.run(start_client(lambda: AIOKafkaProducer(**client_kwargs(s, f"127.0.0.1:{port}")), s,
                                 f"127.0.0.1:{port}", "producer"))
    text = str(err.value)
    assert f"127.0.0.1:{port}" in text and "SASL_PLAINTEXT SCRAM-SHA-256 as 'svc'" in text and "\n" not in text
    assert SECRET not in text and SECRET not in caplog.text


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again when the block ends: nothing listens there


# --- end to end through Tansu with --authentication -----------------------------------------------------------


def _tansu_with_authentication() -> tuple[subprocess.Popen[bytes], str]:
    from streams import broker

    try:
        binary = broker.tansu_binary()
    except broker.BrokerUnavailable as exc:
        pytest.skip(str(exc))
    port = broker.free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen([str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
                             "--storage-engine", "memory://tansu/", "--authentication", "--silent"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"127.0.0.1:{port}"
        time.sleep(0.05)
    broker.stop(proc)
    pytest.skip("Tansu with --authentication did not listen")


def _run_cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    full.update(env, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "streams.cli", *args], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.kafka
@pytest.mark.slow
def test_sasl_against_an_authenticating_broker(tmp_path: Path) -> None:
    """Each command, configured for SCRAM through env, runs the SCRAM exchange with the broker (Tansu knows
    no user, so it fails), exits 69 with one line on stderr, and prints the password nowhere; without SASL
    the same broker refuses the connection itself."""
    from streams import broker

    obs = tmp_path / "obs"
    obs.mkdir()
    (obs / "price.jsonl").write_text("{}\n")
    proc, bootstrap = _tansu_with_authentication()
    sasl_env = {"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                "KAFKA_SASL_USERNAME": "aurelius", "KAFKA_SASL_PASSWORD": SECRET, "KAFKA_STARTUP_TIMEOUT_S": "3"}
    commands = {"worker": ["--db", str(tmp_path / "s.duckdb"), "--audit-dir", str(tmp_path / "audit")],
                "publish": ["--from-dir", str(obs)], "audit-sink": ["--audit-dir", str(tmp_path / "audit")]}
    try:
        for command, extra in commands.items():
            r = _run_cli([command, "--bootstrap-servers", bootstrap, *extra], sasl_env, tmp_path)
            lines = r.stderr.strip().splitlines()
            assert r.returncode == EXIT_UNAVAILABLE, r.stderr
            assert len(lines) == 1 and lines[0].startswith(f"aurelius {command}: cannot connect"), r.stderr
            assert "SASL_PLAINTEXT SCRAM-SHA-512 as 'aurelius'" in lines[0] and "SASL exchange failed" in lines[0]
            assert SECRET not in r.stdout + r.stderr
        r = _run_cli(["publish", "--bootstrap-servers", bootstrap, "--from-dir", str(obs)],
                     {"KAFKA_STARTUP_TIMEOUT_S": "2"}, tmp_path)
        assert r.returncode == EXIT_UNAVAILABLE and "(PLAINTEXT)" in r.stderr and "SASL" not in r.stderr
    finally:
        broker.stop(proc)


def test_invalid_settings_exit_2_with_one_line(tmp_path: Path) -> None:
    r = _run_cli(["audit-sink", "--security-protocol", "SASL_SSL", "--sasl-username", "svc"],
                 {"KAFKA_SASL_PASSWORD": SECRET}, tmp_path)
    assert r.returncode == EXIT_CONFIG
    assert r.stderr.strip() == ("aurelius audit-sink: invalid Kafka settings: security_protocol SASL_SSL needs "
                                "KAFKA_SASL_MECHANISM")
