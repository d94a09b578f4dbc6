"""Encryption at rest, the parts without storage: key providers and the sealed format.

A session's entries are sealed with AES-256-GCM under a *data key* (DEK) of its own; the DEK
is stored only *wrapped* by a *key-encryption key* (KEK) that the operator holds, through a
``KeyProvider``: a local keyring file (``LocalKeyFile``) or a KMS (``AwsKmsProvider``). Where
the wrapped DEKs live, how they rotate and are cached, is ``store/protocol/keys.py``; what is sealed
and what is not, and the threat model, docs/encryption.md.

**Sealed object** (a segment body, a base, a segment in Redis's recent-segments cache)::

    MAGIC (7 bytes: "\\x00ssenc1") | DEK version (uint32, big-endian) | nonce (12) | AES-GCM(ct + tag)

A plaintext object is JSONL and starts with ``{``; a NUL never starts one (the strict decoder
refuses NUL), so the first bytes tell the two apart without metadata, and a reader without
the key meets a typed error, never a parse error. The associated data binds the ciphertext
to its session, incarnation and DEK version (``aad``), so an object copied into another
session, or another life of the same one, does not authenticate there.

Imports of ``cryptography`` are lazy: a store without encryption does not need the extra
(``pip install sessionstore[encryption]``).
"""

from __future__ import annotations

import base64
import json
import os
import struct
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from store.errors import BackendUnavailableError, DecryptionError, InvalidInputError, KeyUnavailableError

#: The first bytes of every sealed object.
MAGIC = b"\x00ssenc1"
#: Recorded in the header of an encrypted session (``Header.encryption``).
SCHEME = "aes-256-gcm/1"
DEK_BYTES = 32
NONCE_BYTES = 12
_VERSION = struct.Struct(">I")
_PREFIX = len(MAGIC) + _VERSION.size


def is_sealed(data: bytes) -> bool:
    """True if ``data`` is a sealed object (it starts with ``MAGIC``)."""
    return data[: len(MAGIC)] == MAGIC


def sealed_version(key: str, data: bytes) -> int:
    """The DEK version a sealed object names."""
    if len(data) < _PREFIX + NONCE_BYTES + 16:
        raise DecryptionError(key, "sealed object too short")
    return int(_VERSION.unpack_from(data, len(MAGIC))[0])


def aad(session_id: str, incarnation: str, version: int) -> bytes:
    """What a ciphertext is bound to: its session, incarnation and DEK version."""
    return b"sessionstore/1\x00%s\x00%s\x00%d" % (session_id.encode(), incarnation.encode(), version)


def _aesgcm(key: bytes) -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:  # pragma: no cover - the extra is missing
        raise KeyUnavailableError(
            "encryption needs the 'cryptography' package (pip install sessionstore[encryption])"
        ) from exc
    return AESGCM(key)


@dataclass(frozen=True, slots=True)
class DataKey:
    """An unwrapped DEK of one session incarnation, ready to seal and open."""

    session_id: str
    incarnation: str
    version: int
    cipher: Any  # cryptography's AESGCM

    @classmethod
    def of(cls, session_id: str, incarnation: str, version: int, key: bytes) -> DataKey:
        if len(key) != DEK_BYTES:
            raise KeyUnavailableError(f"data key v{version} of {session_id!r} is not 32 bytes")
        return cls(session_id, incarnation, version, _aesgcm(key))

    def seal(self, plaintext: bytes) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        ct = self.cipher.encrypt(nonce, plaintext, aad(self.session_id, self.incarnation, self.version))
        return b"".join((MAGIC, _VERSION.pack(self.version), nonce, ct))

    def open(self, key: str, data: bytes) -> bytes:
        """The plaintext of a sealed object; ``DecryptionError`` if it does not authenticate."""
        if sealed_version(key, data) != self.version:
            raise DecryptionError(key, "sealed under another data key version")
        nonce = data[_PREFIX : _PREFIX + NONCE_BYTES]
        try:
            return bytes(
                self.cipher.decrypt(
                    nonce, data[_PREFIX + NONCE_BYTES :], aad(self.session_id, self.incarnation, self.version)
                )
            )
        except Exception as exc:  # cryptography's InvalidTag
            if type(exc).__name__ != "InvalidTag":
                raise
            raise DecryptionError(
                key, "ciphertext does not authenticate (altered, moved from another session, or another key)"
            ) from None


def no_keys_open(key: str, data: bytes) -> bytes:
    """What opens objects for code given no data keys: a sealed object is refused, typed."""
    if is_sealed(data):
        raise KeyUnavailableError(f"object {key!r} is encrypted and no data keys were given to read it")
    return data


# --- key providers ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WrappedKey:
    """A DEK as stored: wrapped by the KEK ``kek_id`` of the provider named ``provider``."""

    provider: str
    kek_id: str
    blob: bytes


class KeyProvider(ABC):
    """Wraps and unwraps data keys with key-encryption keys the operator holds.

    ``context`` (session id and incarnation) is bound to every wrap: a wrapped key copied
    into another session's record does not unwrap there. Contract for implementers:

    - ``wrap`` and ``generate`` use the *newest* KEK; ``unwrap`` accepts any KEK the
      provider still holds (``WrappedKey.kek_id`` names it), so KEKs rotate without
      rewriting anything already stored.
    - A KEK the provider does not hold, or one that does not unwrap the blob (the wrong key
      file), is ``KeyUnavailableError``; a transient failure of a remote provider is
      ``BackendUnavailableError`` (retried by the store's policy). Never return other bytes.
    - Thread-safe: one provider serves every thread of a store.
    """

    #: Recorded in key records, to tell which provider wrapped a key.
    name: str = "abstract"

    @abstractmethod
    def wrap(self, dek: bytes, context: Mapping[str, str]) -> WrappedKey:
        """``dek`` wrapped by the newest KEK."""

    @abstractmethod
    def unwrap(self, wrapped: WrappedKey, context: Mapping[str, str]) -> bytes:
        """The DEK ``wrapped`` holds, or ``KeyUnavailableError``."""

    def generate(self, context: Mapping[str, str]) -> tuple[bytes, WrappedKey]:
        """A fresh random DEK and its wrapped form (a KMS makes both in one call)."""
        dek = os.urandom(DEK_BYTES)
        return dek, self.wrap(dek, context)


def _context_aad(context: Mapping[str, str]) -> bytes:
    return json.dumps(dict(context), sort_keys=True, separators=(",", ":")).encode()


class LocalKeyFile(KeyProvider):
    """KEKs from a keyring file the operator keeps (mode 0600), newest last::

        {"keys": [{"id": "k-20260101-1a2b", "key": "<base64 of 32 bytes>"}, ...]}

    Make one with ``create_keyring``, add a KEK with ``rotate_keyring`` (or
    ``python -m store.formats.crypto create|rotate PATH``). The file is read at construction and
    again when a wrapped key names a KEK this process has not seen (another process rotated
    the file). Old KEKs must stay in the file while records wrapped by them exist.
    """

    name = "local"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._keys: dict[str, bytes] = {}
        self._newest = ""
        self._load()

    def _load(self) -> None:
        keys, newest = read_keyring(self.path)
        with self._lock:
            self._keys, self._newest = keys, newest

    @property
    def newest_id(self) -> str:
        return self._newest

    def _kek(self, kek_id: str) -> bytes:
        key = self._keys.get(kek_id)
        if key is None:
            self._load()
            key = self._keys.get(kek_id)
        if key is None:
            raise KeyUnavailableError(f"KEK {kek_id!r} is not in the keyring {str(self.path)!r}")
        return key

    def wrap(self, dek: bytes, context: Mapping[str, str]) -> WrappedKey:
        kek_id = self._newest
        nonce = os.urandom(NONCE_BYTES)
        blob = nonce + _aesgcm(self._kek(kek_id)).encrypt(nonce, dek, _context_aad(context))
        return WrappedKey(self.name, kek_id, blob)

    def unwrap(self, wrapped: WrappedKey, context: Mapping[str, str]) -> bytes:
        kek = self._kek(wrapped.kek_id)
        try:
            return bytes(
                _aesgcm(kek).decrypt(wrapped.blob[:NONCE_BYTES], wrapped.blob[NONCE_BYTES:], _context_aad(context))
            )
        except Exception as exc:
            if type(exc).__name__ != "InvalidTag":
                raise
            raise KeyUnavailableError(
                f"KEK {wrapped.kek_id!r} of {str(self.path)!r} does not unwrap this data key "
                "(a different key under the same id, or a record of another session)"
            ) from None


def read_keyring(path: str | os.PathLike[str]) -> tuple[dict[str, bytes], str]:
    """The KEKs of a keyring file by id, and the newest one's id."""
    try:
        raw = json.loads(Path(path).read_bytes())
    except FileNotFoundError:
        raise KeyUnavailableError(f"keyring file {str(path)!r} not found") from None
    except (OSError, ValueError) as exc:
        raise KeyUnavailableError(f"keyring file {str(path)!r} unreadable: {exc}") from None
    entries = raw.get("keys") if isinstance(raw, dict) else None
    if not isinstance(entries, list) or not entries:
        raise KeyUnavailableError(f"keyring file {str(path)!r} holds no keys")
    keys: dict[str, bytes] = {}
    for item in entries:
        try:
            key = base64.b64decode(item["key"], validate=True)
            kid = str(item["id"])
        except (KeyError, TypeError, ValueError):
            raise KeyUnavailableError(f"keyring file {str(path)!r}: malformed entry") from None
        if len(key) != DEK_BYTES:
            raise KeyUnavailableError(f"keyring file {str(path)!r}: key {kid!r} is not 32 bytes")
        keys[kid] = key
    return keys, str(entries[-1]["id"])


def _write_keyring(path: Path, entries: list[dict[str, str]]) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"keys": entries}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _new_entry() -> dict[str, str]:
    return {"id": f"k-{uuid.uuid4().hex[:12]}", "key": base64.b64encode(os.urandom(DEK_BYTES)).decode()}


def create_keyring(path: str | os.PathLike[str]) -> str:
    """Create a keyring file with one new KEK (refused if the file exists); its id."""
    p = Path(path)
    if p.exists():
        raise InvalidInputError(f"keyring file {str(p)!r} exists; rotate it instead")
    entry = _new_entry()
    _write_keyring(p, [entry])
    return entry["id"]


def rotate_keyring(path: str | os.PathLike[str]) -> str:
    """Add a new KEK to a keyring file (newest last; old ones kept to unwrap); its id."""
    p = Path(path)
    read_keyring(p)
    entries = json.loads(p.read_bytes())["keys"]
    entry = _new_entry()
    _write_keyring(p, [*entries, entry])
    return entry["id"]


class AwsKmsProvider(KeyProvider):
    """KEKs in AWS KMS (or anything speaking its API): ``GenerateDataKey`` makes a DEK,
    ``Decrypt`` unwraps one, with the session and incarnation as the encryption context.

    ``key_id``: the KMS key (id, ARN or ``alias/...``) new data keys are made under. Rotate
    the KEK by KMS's own key rotation (same id, nothing to change here), or by pointing
    ``key_id`` at a new key: ``Decrypt`` finds the key of an old blob by itself, as long as
    the old key is enabled. Credentials come from boto3's default chain.
    """

    name = "kms"

    def __init__(
        self,
        key_id: str,
        *,
        region: str | None = None,
        endpoint_url: str | None = None,
        client: Any = None,
    ) -> None:
        self.key_id = key_id
        if client is None:
            import boto3
            from botocore.config import Config

            client = boto3.client(
                "kms", region_name=region, endpoint_url=endpoint_url,
                config=Config(retries={"total_max_attempts": 1}, connect_timeout=5, read_timeout=10),
            )
        self._client = client

    def _call(self, op: str, **kwargs: Any) -> dict[str, Any]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return dict(getattr(self._client, op)(**kwargs))
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if status >= 500 or code in ("ThrottlingException", "KMSInternalException", "DependencyTimeoutException"):
                raise BackendUnavailableError(f"KMS {op}: {code}") from exc
            raise KeyUnavailableError(f"KMS {op} refused: {code} {exc}") from exc
        except BotoCoreError as exc:
            raise BackendUnavailableError(f"KMS {op}: {exc}") from exc

    def generate(self, context: Mapping[str, str]) -> tuple[bytes, WrappedKey]:
        res = self._call("generate_data_key", KeyId=self.key_id, KeySpec="AES_256", EncryptionContext=dict(context))
        return bytes(res["Plaintext"]), WrappedKey(self.name, str(res["KeyId"]), bytes(res["CiphertextBlob"]))

    def wrap(self, dek: bytes, context: Mapping[str, str]) -> WrappedKey:
        res = self._call("encrypt", KeyId=self.key_id, Plaintext=dek, EncryptionContext=dict(context))
        return WrappedKey(self.name, str(res["KeyId"]), bytes(res["CiphertextBlob"]))

    def unwrap(self, wrapped: WrappedKey, context: Mapping[str, str]) -> bytes:
        res = self._call("decrypt", CiphertextBlob=wrapped.blob, EncryptionContext=dict(context))
        return bytes(res["Plaintext"])


def key_provider_from_url(url: str) -> KeyProvider:
    """A provider from one URL (what the CLI's ``SESSIONSTORE_KEYS`` holds):

    - ``file:///etc/sessionstore/keyring.json`` (or a plain path): ``LocalKeyFile``;
    - ``kms://<key id or alias/...>?region=...&endpoint=...``: ``AwsKmsProvider``.
    """
    import urllib.parse

    if url.startswith("kms://"):
        parsed = urllib.parse.urlsplit(url)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        key_id = urllib.parse.unquote(parsed.netloc + parsed.path)
        if not key_id:
            raise InvalidInputError(f"no KMS key in {url!r}")
        return AwsKmsProvider(key_id, region=query.get("region"), endpoint_url=query.get("endpoint"))
    if url.startswith("file://"):
        return LocalKeyFile(urllib.parse.unquote(urllib.parse.urlsplit(url).path))
    if "://" in url:
        raise InvalidInputError(f"unknown key provider URL {url!r} (file:// or kms://)")
    return LocalKeyFile(url)


def main(argv: list[str] | None = None) -> int:
    """``python -m store.formats.crypto create|rotate PATH``: make a keyring file, or add a KEK."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("create", "rotate"):
        print("usage: python -m store.formats.crypto create|rotate KEYRING_PATH", file=sys.stderr)
        return 2
    kid = create_keyring(args[1]) if args[0] == "create" else rotate_keyring(args[1])
    print(kid)
    return 0


__all__ = [
    "MAGIC",
    "SCHEME",
    "AwsKmsProvider",
    "DataKey",
    "KeyProvider",
    "LocalKeyFile",
    "WrappedKey",
    "aad",
    "create_keyring",
    "is_sealed",
    "key_provider_from_url",
    "no_keys_open",
    "read_keyring",
    "rotate_keyring",
    "sealed_version",
]

if __name__ == "__main__":
    raise SystemExit(main())
