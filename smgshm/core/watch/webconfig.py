"""``--web-config FILE``: TLS and basic auth for the exporter, in the web config format Prometheus
exporters share (the exporter toolkit's ``--web.config.file``).

The subset served here: ``tls_server_config`` with ``cert_file``, ``key_file``, ``client_ca_file``,
``client_auth_type`` (``NoClientCert``, ``VerifyClientCertIfGiven``, ``RequireAndVerifyClientCert``),
``min_version`` and ``max_version``; and ``basic_auth_users`` (user: bcrypt hash). Every other key,
the toolkit's own included (inline ``cert``/``key``, ``client_allowed_sans``, ``cipher_suites``,
``http_server_config``, ``rate_limit``), is refused rather than ignored: a setting that looks applied
but is not would be a silent hole. The file is read once, at start (the toolkit reads it per request).

No message built here quotes the file's content: a YAML error says its line and column only, a bad
hash says whose it is, never the hash. ``WebConfigError`` is a usage error (the CLI's exit 2); a file
that cannot be read is a ``HostError`` (exit 5).
"""

from __future__ import annotations

import base64
import binascii
import importlib
import ssl
import threading
from dataclasses import dataclass, field
from typing import Any

from smgshm.core.errors import HostError

TLS_KEYS = frozenset({"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version"})
# The toolkit's keys served nowhere here: named so that the refusal says "not supported", not "unknown".
TOOLKIT_ONLY = frozenset(
    {
        "cert",
        "key",
        "client_ca",
        "client_allowed_sans",
        "cipher_suites",
        "prefer_server_cipher_suites",
        "curve_preferences",
        "http_server_config",
        "rate_limit",
    }
)
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
# Go's RequestClientCert and RequireAnyClientCert take a certificate without verifying it: the
# toolkit's own docs call them insecure, and Python's ssl cannot ask without verifying.
TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
REALM = "smgshm"
# bcrypt runs at the hash's cost (about 70 ms at 10) for every request with credentials: at most
# this many at once, so a flood of wrong passwords cannot take every core from the scans.
MAX_VERIFYING = 2


class WebConfigError(ValueError):
    """The web config file says something this exporter does not serve, or says it wrongly (one line)."""


@dataclass(frozen=True)
class TlsConfig:
    cert_file: str
    key_file: str
    client_ca_file: str | None = None
    client_auth: ssl.VerifyMode = ssl.CERT_NONE
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion | None = None

    def context(self) -> ssl.SSLContext:
        """The server's SSL context; a HostError when a file cannot be read, a WebConfigError when it is
        not what it should be (no PEM, a key that is not the certificate's)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = self.min_version
        if self.max_version is not None:
            ctx.maximum_version = self.max_version
        # A key under a passphrase is refused, not prompted for: no terminal is asked (the toolkit reads
        # none either), and an exporter started by a kubelet has none.
        load = lambda: ctx.load_cert_chain(self.cert_file, self.key_file, password=_no_passphrase)  # noqa: E731
        _load(load, "cert_file/key_file", self.cert_file)
        ctx.verify_mode = self.client_auth
        if self.client_ca_file is not None:
            ca = self.client_ca_file
            _load(lambda: ctx.load_verify_locations(cafile=ca), "client_ca_file", ca)
        return ctx


def _no_passphrase() -> bytes:
    raise WebConfigError("tls_server_config.key_file: the key is under a passphrase (give it unencrypted)")


def _load(fn: Any, what: str, path: str) -> None:
    try:
        fn()
    except ssl.SSLError as err:  # an OSError too: before the generic branch
        raise WebConfigError(f"tls_server_config.{what}: cannot be loaded ({err.reason or 'not PEM'})") from None
    except OSError as err:
        raise HostError(f"cannot read tls_server_config.{what}: {err.strerror}", path=path) from None


@dataclass
class BasicAuth:
    """Users and their bcrypt hashes; ``check(header)`` says whether an Authorization header is one of them."""

    users: dict[str, bytes]
    _dummy: bytes = b""
    _gate: threading.BoundedSemaphore = field(default_factory=lambda: threading.BoundedSemaphore(MAX_VERIFYING))

    def __post_init__(self) -> None:
        import bcrypt

        # An unknown user costs one bcrypt too, at the same cost: the time taken says nothing about who exists.
        cost = max(int(h.split(b"$")[2]) for h in self.users.values())
        self._dummy = bcrypt.hashpw(b"smgshm", bcrypt.gensalt(rounds=cost))

    def check(self, header: str | None, timeout_s: float) -> bool | None:
        """True for a known user with their password, False otherwise; None when the verifiers were
        all busy for ``timeout_s`` (the caller answers 503, not 401: the password was not judged)."""
        import bcrypt

        user, password = _basic_credentials(header)
        hashed = self.users.get(user, self._dummy) if user is not None else self._dummy
        if not self._gate.acquire(timeout=timeout_s):
            return None
        try:
            ok = bcrypt.checkpw(password, hashed)  # constant-time compare of the hashes
        except ValueError:  # a password longer than bcrypt's 72 bytes
            ok = False
        finally:
            self._gate.release()
        return ok and user is not None and user in self.users


def _basic_credentials(header: str | None) -> tuple[str | None, bytes]:
    """(user, password) of an ``Authorization: Basic`` header; (None, b"") when there is none."""
    if not header:
        return None, b""
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None, b""
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None, b""
    user, sep, password = raw.partition(b":")
    if not sep:
        return None, b""
    return user.decode("utf-8", "replace"), password


@dataclass(frozen=True)
class WebConfig:
    tls: TlsConfig | None = None
    auth: BasicAuth | None = None

    @property
    def guarded(self) -> bool:
        """Whether a reader of the exposition must prove who it is (a password or a verified certificate)."""
        return self.auth is not None or (self.tls is not None and self.tls.client_auth == ssl.CERT_REQUIRED)


def load_web_config(path: str) -> WebConfig:
    """Read and check a web config file (see the module). Every TLS file is loaded here, once, so a
    mistake stops the start rather than every handshake."""
    try:
        with open(path, "rb") as f:
            text = f.read(1 << 20)
    except OSError as err:
        raise HostError(f"cannot read --web-config: {err.strerror}", path=path) from None
    doc = _yaml(text)
    if doc is None:
        return WebConfig()
    if not isinstance(doc, dict):
        raise WebConfigError("the web config is not a mapping of tls_server_config and basic_auth_users")
    _refuse_keys("", doc, frozenset({"tls_server_config", "basic_auth_users"}))
    tls = _tls(doc["tls_server_config"]) if doc.get("tls_server_config") is not None else None
    auth = _users(doc["basic_auth_users"]) if doc.get("basic_auth_users") else None
    if tls is not None:
        tls.context()  # loads every file now
    return WebConfig(tls, auth)


def _yaml(text: bytes) -> Any:
    # PyYAML ships no type hints: imported as a module of unknown type, kept to safe_load.
    yaml = importlib.import_module("yaml")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise WebConfigError(f"the web config is not valid YAML{where}") from None  # no snippet: it may hold a hash


def _refuse_keys(where: str, doc: dict[Any, Any], allowed: frozenset[str]) -> None:
    for key in doc:
        if key in allowed:
            continue
        name = f"{where}{key}" if isinstance(key, str) else f"{where}{key!r}"
        if key in TOOLKIT_ONLY:
            raise WebConfigError(f"{name}: not supported by smgshm (it serves {', '.join(sorted(allowed))})")
        raise WebConfigError(f"{name}: unknown key (known: {', '.join(sorted(allowed))})")


def _tls(doc: Any) -> TlsConfig:
    if not isinstance(doc, dict):
        raise WebConfigError("tls_server_config: not a mapping")
    _refuse_keys("tls_server_config.", doc, TLS_KEYS)
    for key, value in doc.items():
        if not isinstance(value, str) or not value:
            raise WebConfigError(f"tls_server_config.{key}: not a non-empty string")
    if "cert_file" not in doc or "key_file" not in doc:
        raise WebConfigError("tls_server_config: needs both cert_file and key_file")
    auth_type = doc.get("client_auth_type", "NoClientCert")
    if auth_type not in CLIENT_AUTH:
        raise WebConfigError(
            f"tls_server_config.client_auth_type: {auth_type!r} is not served (one of {', '.join(CLIENT_AUTH)})"
        )
    mode = CLIENT_AUTH[auth_type]
    ca = doc.get("client_ca_file")
    if mode != ssl.CERT_NONE and ca is None:
        raise WebConfigError(f"tls_server_config.client_auth_type {auth_type} needs client_ca_file")
    if mode == ssl.CERT_NONE and ca is not None:
        raise WebConfigError("tls_server_config.client_ca_file: set client_auth_type to RequireAndVerifyClientCert")
    versions = {}
    for key in ("min_version", "max_version"):
        if key in doc:
            if doc[key] not in TLS_VERSIONS:
                raise WebConfigError(f"tls_server_config.{key}: {doc[key]!r} is not one of {', '.join(TLS_VERSIONS)}")
            versions[key] = TLS_VERSIONS[doc[key]]
    return TlsConfig(
        doc["cert_file"],
        doc["key_file"],
        ca,
        mode,
        versions.get("min_version", ssl.TLSVersion.TLSv1_2),
        versions.get("max_version"),
    )


def _users(doc: Any) -> BasicAuth:
    if not isinstance(doc, dict):
        raise WebConfigError("basic_auth_users: not a mapping of user to bcrypt hash")
    users: dict[str, bytes] = {}
    for user, hashed in doc.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise WebConfigError(f"basic_auth_users: the user {user!r} is not a name (a string without ':')")
        if not isinstance(hashed, str) or not _is_bcrypt(hashed):
            raise WebConfigError(f"basic_auth_users.{user}: not a bcrypt hash ($2a$, $2b$ or $2y$)")
        users[user] = hashed.encode()
    return BasicAuth(users)


def _is_bcrypt(hashed: str) -> bool:
    """A hash bcrypt can check: its shape, then bcrypt's own parse (which says nothing of the password)."""
    import bcrypt

    parts = hashed.split("$")
    if len(parts) != 4 or parts[1] not in ("2a", "2b", "2y") or not parts[2].isdigit() or len(parts[3]) != 53:
        return False
    try:
        bcrypt.checkpw(b"", hashed.encode())  # raises on a malformed salt; a hash's cost is paid once here
    except ValueError:
        return False
    return True


__all__ = ["REALM", "BasicAuth", "TlsConfig", "WebConfig", "WebConfigError", "load_web_config"]
