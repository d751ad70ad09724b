"""Kafka client settings shared by every command: transport security (TLS, SASL) and the start-up retry.

One settings object, `KafkaClientSettings` (env `KAFKA_*`, or each Kafka command's flags), becomes the
keyword arguments of every aiokafka client through `client_kwargs`: the worker's consumer (and, as faust
credentials built from the same settings, its producer), the publisher, the audit sink and the topic admin of
`ensure_topics`. TLS uses an `ssl.SSLContext` from `aiokafka.helpers.create_ssl_context` (broker certificate
and host name always verified). The SASL password is a `SecretStr`: repr, str, logs and error messages show
`**********`; it is in clear only inside the dict handed to aiokafka, which nothing logs.

`start_client` starts a client with a bounded retry (`startup_timeout_s`) and raises `KafkaUnavailable`,
whose text is the one line the command line prints before exiting with `EXIT_UNAVAILABLE`.

Examples
--------
>>> s = KafkaClientSettings(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
...                         sasl_username="aurelius", sasl_password="hunter2")
>>> "hunter2" in repr(s) or "hunter2" in str(s)
False
>>> kw = client_kwargs(s, "broker:9092")
>>> kw["sasl_mechanism"], kw["sasl_plain_username"], kw["sasl_plain_password"]
('SCRAM-SHA-512', 'aurelius', 'hunter2')
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
SECURITY_PROTOCOLS: tuple[str, ...] = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

#: Exit status of a command that could not reach Kafka (sysexits EX_UNAVAILABLE).
EXIT_UNAVAILABLE = 69
#: Exit status of a command whose Kafka settings are invalid (as argparse's usage errors).
EXIT_CONFIG = 2


class KafkaSettingsError(ValueError):
    """Invalid Kafka client settings; the text is one line and never holds a secret."""


class KafkaUnavailable(RuntimeError):
    """No broker answered within the start-up retry (or one refused the client); the text is one line."""


class KafkaClientSettings(BaseSettings):
    """How every Kafka client of a command connects; each field from env `KAFKA_<NAME>` or the command's flag.

    Parameters
    ----------
    security_protocol : PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL (SASL over TLS).
    sasl_mechanism : PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (SASL protocols only, required there).
    sasl_username : SASL user (SASL protocols only, required there).
    sasl_password : SASL password, a SecretStr (env `KAFKA_SASL_PASSWORD`; never a flag, so never in `ps`).
    sasl_password_file : file holding the password (one line), read when `sasl_password` is not set.
    ssl_cafile : PEM file of the CA(s) that signed the broker's certificate; None: the system's CAs.
    ssl_certfile, ssl_keyfile : client certificate and key (PEM) for mutual TLS; the key may be in the cert file.
    ssl_key_password : password of an encrypted client key, a SecretStr.
    startup_timeout_s : how long a command retries (with backoff) to reach the broker at start (s).
    """

    model_config = SettingsConfigDict(env_prefix="KAFKA_", extra="ignore")

    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    sasl_password_file: Path | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_key_password: SecretStr | None = None
    startup_timeout_s: float = Field(default=15.0, gt=0)

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @model_validator(mode="after")
    def _consistent(self) -> KafkaClientSettings:
        """Reject settings that would silently not apply (mode "after": errors never echo raw input)."""
        proto = self.security_protocol
        if self.uses_sasl:
            if self.sasl_password is None and self.sasl_password_file is not None:
                self.sasl_password = SecretStr(_read_secret(self.sasl_password_file, "KAFKA_SASL_PASSWORD_FILE"))
            missing = [name for name, value in (("KAFKA_SASL_MECHANISM", self.sasl_mechanism),
                                                ("KAFKA_SASL_USERNAME", self.sasl_username),
                                                ("KAFKA_SASL_PASSWORD", self.sasl_password)) if not value]
            if missing:
                raise ValueError(f"security_protocol {proto} needs {', '.join(missing)}")
        elif self.sasl_mechanism or self.sasl_username or self.sasl_password or self.sasl_password_file:
            raise ValueError(f"SASL settings given but security_protocol is {proto} (use SASL_PLAINTEXT or SASL_SSL)")
        files = {"KAFKA_SSL_CAFILE": self.ssl_cafile, "KAFKA_SSL_CERTFILE": self.ssl_certfile,
                 "KAFKA_SSL_KEYFILE": self.ssl_keyfile}
        if not self.uses_tls and (any(files.values()) or self.ssl_key_password):
            raise ValueError(f"TLS files given but security_protocol is {proto} (use SSL or SASL_SSL)")
        if self.ssl_keyfile and not self.ssl_certfile:
            raise ValueError("KAFKA_SSL_KEYFILE needs KAFKA_SSL_CERTFILE")
        for name, path in files.items():
            if path is not None and not path.is_file():
                raise ValueError(f"{name}: no file {path}")
        return self

    def describe(self) -> str:
        """Protocol, mechanism and user for messages (no secret): e.g. `SASL_SSL SCRAM-SHA-512 as 'svc'`."""
        if self.uses_sasl:
            return f"{self.security_protocol} {self.sasl_mechanism} as {self.sasl_username!r}"
        return self.security_protocol


def _read_secret(path: Path, name: str) -> str:
    try:
        return path.read_text().strip("\r\n")
    except OSError as exc:
        raise ValueError(f"{name}: cannot read {path} ({exc.strerror})") from None


def load_settings(**given: Any) -> KafkaClientSettings:
    """`KafkaClientSettings` from the given values (None ones ignored) over env `KAFKA_*`.

    Raises
    ------
    KafkaSettingsError : the settings are inconsistent; one line naming the fields, never their values.
    """
    try:
        return KafkaClientSettings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        why = "; ".join(
            (f"{'.'.join(str(p) for p in e['loc'])}: " if e["loc"] else "") + e["msg"].removeprefix("Value error, ")
            for e in exc.errors(include_input=False, include_url=False)
        )
        raise KafkaSettingsError(f"invalid Kafka settings: {why}") from None


def settings_from_args(args: argparse.Namespace) -> KafkaClientSettings:
    """The Kafka settings of a command: its flags (`streams.cli._kafka_flags`) over env `KAFKA_*`."""
    names = ("security_protocol", "sasl_mechanism", "sasl_username", "sasl_password_file", "ssl_cafile",
             "ssl_certfile", "ssl_keyfile", "startup_timeout_s")
    return load_settings(**{n: getattr(args, n, None) for n in names})


def ssl_context(settings: KafkaClientSettings) -> ssl.SSLContext:
    """The TLS context of `settings` (aiokafka.helpers.create_ssl_context: CA, client cert and key).

    Raises
    ------
    KafkaSettingsError : a file is not a usable PEM, or an encrypted key's password is missing or wrong (never
        an interactive pass-phrase prompt).
    """
    from aiokafka.helpers import (
        create_ssl_context,  # lazy: the Kafka client loads only where a command talks to a broker
    )

    secret = settings.ssl_key_password
    password: Callable[[], str] | str = secret.get_secret_value() if secret else (lambda: "")
    try:
        return create_ssl_context(cafile=settings.ssl_cafile, certfile=settings.ssl_certfile,
                                  keyfile=settings.ssl_keyfile, password=password)
    except (ssl.SSLError, OSError) as exc:
        raise KafkaSettingsError(
            f"invalid Kafka settings: TLS files cannot be loaded ({exc}); check KAFKA_SSL_CAFILE, "
            "KAFKA_SSL_CERTFILE, KAFKA_SSL_KEYFILE, KAFKA_SSL_KEY_PASSWORD") from None


def client_kwargs(settings: KafkaClientSettings | None, bootstrap_servers: str) -> dict[str, Any]:
    """Keyword arguments for any aiokafka client (consumer, producer, admin): bootstrap, security, SASL, TLS.

    The result holds the SASL password in clear (aiokafka needs it): pass it to the client, never log it.

    Parameters
    ----------
    settings : the command's Kafka settings; None: from env `KAFKA_*`.
    bootstrap_servers : "host:port[,host:port]".
    """
    s = settings if settings is not None else load_settings()
    kw: dict[str, Any] = {"bootstrap_servers": bootstrap_servers, "security_protocol": s.security_protocol}
    if s.uses_tls:
        kw["ssl_context"] = ssl_context(s)
    if s.uses_sasl:
        assert s.sasl_password is not None  # the validator requires it
        kw.update(sasl_mechanism=s.sasl_mechanism, sasl_plain_username=s.sasl_username,
                  sasl_plain_password=s.sasl_password.get_secret_value())
    return kw


class _Client(Protocol):
    async def start(self) -> None: ...


C = TypeVar("C", bound=_Client)


_quiet = {"depth": 0, "level": logging.NOTSET}


@contextlib.contextmanager
def quiet_aiokafka() -> Iterator[None]:
    """Silence aiokafka's loggers while any such block runs (its per-attempt connection errors: the caller
    reports one line). Blocks may overlap across tasks: the level is restored when the last one ends."""
    lg = logging.getLogger("aiokafka")
    if _quiet["depth"] == 0:
        _quiet["level"] = lg.level
        lg.setLevel(logging.CRITICAL + 1)
    _quiet["depth"] += 1
    try:
        yield
    finally:
        _quiet["depth"] -= 1
        if _quiet["depth"] == 0:
            lg.setLevel(_quiet["level"])


async def close_client(client: Any, timeout_s: float = 5.0) -> None:
    """Stop a consumer or producer, or close an admin client, ignoring errors; returns after `timeout_s` at
    most even if the close does not (a consumer's stop waits for its group coordinator to leave the group:
    forever while the broker is down), leaving it to finish, or be cancelled, in the background."""
    closer = getattr(client, "stop", None) or getattr(client, "close", None)
    if closer is None:
        return
    task = asyncio.ensure_future(closer())
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: no "never retrieved" noise
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        task.cancel()


def _reason(exc: BaseException) -> str:
    from aiokafka.errors import (
        KafkaConnectionError,  # lazy: the Kafka client loads only where a command talks to a broker
    )

    if isinstance(exc, KafkaConnectionError):
        return "no bootstrap server answered (connection refused, closed or timed out)"
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    if isinstance(exc, KeyError):  # aiokafka's SCRAM client when the broker ends the exchange with an error
        return f"SASL exchange failed (unknown user or wrong password?): {type(exc).__name__} {exc}"
    return f"{type(exc).__name__}: {exc}".strip()


def _transient(exc: BaseException) -> bool:
    from aiokafka.errors import (
        KafkaConnectionError,  # lazy: the Kafka client loads only where a command talks to a broker
    )

    if isinstance(exc, ssl.SSLError):  # certificate or handshake failure: retrying will not help
        return False
    return isinstance(exc, KafkaConnectionError | OSError | asyncio.TimeoutError)


async def start_client(factory: Callable[[], C], settings: KafkaClientSettings | None, bootstrap_servers: str,
                       what: str, attempt_timeout_s: float = 10.0) -> C:
    """Build and start a client, retrying with backoff (0.25 s doubling to 4 s) until `startup_timeout_s`.

    A fresh client is built for every attempt (aiokafka clients are not restartable after a failed start).
    aiokafka's own error lines are silenced during the attempts; the outcome is one exception.

    Parameters
    ----------
    factory : builds the client (e.g. `lambda: AIOKafkaProducer(**client_kwargs(settings, bootstrap))`).
    settings : the Kafka settings (start-up timeout, protocol for the message); None: from env.
    bootstrap_servers : for the message.
    what : the client's role, for the message ("producer", "topic admin", ...).
    attempt_timeout_s : longest single attempt (s).

    Raises
    ------
    KafkaUnavailable : no success within the timeout, or a failure retrying cannot mend (TLS, SASL).
    """
    s = settings if settings is not None else load_settings()
    t0 = time.monotonic()
    deadline = t0 + s.startup_timeout_s
    delay, attempt = 0.25, 0
    with quiet_aiokafka():
        while True:
            attempt += 1
            client = factory()
            try:
                await asyncio.wait_for(client.start(), max(0.5, min(attempt_timeout_s, deadline - time.monotonic())))
                return client
            except Exception as exc:
                await close_client(client)
                if not _transient(exc) or time.monotonic() >= deadline:
                    raise KafkaUnavailable(
                        f"cannot connect the {what} to Kafka at {bootstrap_servers} ({s.describe()}) after "
                        f"{attempt} attempt{'s' if attempt > 1 else ''} in {time.monotonic() - t0:.1f} s: "
                        f"{_reason(exc)}") from None
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 4.0)

