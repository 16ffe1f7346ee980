"""The metrics-topic contract v1: one codec for every reader and writer of the topic."""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import cramjam
import lz4.frame
import zstandard
from google.protobuf import json_format
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData

from kcm_common.message_bound import MAX_MESSAGES, builds_more_than
from kcm_common.names import ATTRIBUTE_HEADERS

CONTENT_TYPE_PROTOBUF = "application/x-protobuf"
CONTENT_TYPE_JSON = "application/json"
ENCODINGS: tuple[str, ...] = ("none", "gzip", "snappy", "lz4", "zstd")
COMPRESSION_IDS: dict[int, str] = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
DEFAULT_MAX_DECOMPRESSED_BYTES = 16 * 1024 * 1024

# Objects an OTLP/JSON value may hold (a real client's 1 MiB push has tens of thousands), as many arrays, and values
# (counted by the commas between them: an object holds several).
MAX_JSON_OBJECTS = 200_000
MAX_JSON_VALUES = 5 * MAX_JSON_OBJECTS

CONTENT_TYPE_HEADER = "content-type"
CONTENT_ENCODING_HEADER = "content-encoding"

DECODE_REASONS: tuple[str, ...] = (
    "unknown-encoding",
    "decompress-failed",
    "too-large",
    "invalid-protobuf",
    "invalid-json",
    "empty",
    "unknown-content-type",
)

_GZIP_WBITS = 16 + zlib.MAX_WBITS
_GZIP_MAGIC = b"\x1f\x8b"
LZ4_MAGIC = b"\x04\x22\x4d\x18"
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE = 16
# zstd allocates the window a frame header asks for before producing output; streaming
# compressors ask for up to 8 MiB even for tiny payloads, so allow that much and no more.
_ZSTD_MIN_WINDOW = 8 * 1024 * 1024
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_FEED_BYTES = 4096  # input slice per call for codecs whose output is bounded per call
_ZSTD_FEED_BYTES = 64  # zstd's output per call is unbounded: 64 bytes of RLE blocks expand to about 2 MiB at most
# OTLP/JSON writes trace and span ids as hex, where proto3 JSON would use base64 (id size in bytes).
_OTLP_HEX_IDS = {"traceId": 16, "trace_id": 16, "spanId": 8, "span_id": 8}
# What may precede a headerless JSON value: JSON's whitespace and a byte order mark. "\n" is also protobuf's first
# tag byte, so a value starting with it that does not parse as JSON is tried as protobuf.
_JSON_LEADING_SPACE = b" \t\r\n"
_UTF8_BOM = b"\xef\xbb\xbf"


class DecodeError(ValueError):
    """A record that does not follow the contract; `reason` is one of DECODE_REASONS."""

    def __init__(self, reason: str, message: str | None = None) -> None:
        if reason not in DECODE_REASONS:
            raise ValueError(f"unknown decode reason {reason!r}")
        super().__init__(message or reason)
        self.reason = reason

    def __reduce__(self) -> tuple[type[DecodeError], tuple[str, str]]:
        # Keeps the reason when the error crosses a process boundary (Spark workers pickle errors).
        return DecodeError, (self.reason, str(self))


@dataclass(frozen=True)
class DecodedRecord:
    """One metrics-topic record: the OTLP metrics and the resource attributes its headers carry."""

    metrics: MetricsData
    attributes: dict[str, str]


def decode(
    value: bytes | None,
    headers: Iterable[tuple[str, bytes | str | None]] | None = None,
    *,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> DecodedRecord:
    """Decode a record value and headers; raises only DecodeError.

    Note: an empty MetricsData serialises to b"", which decodes as reason "empty".
    """
    if not value:
        raise DecodeError("empty", "record has no value; expected an OTLP MetricsData payload")
    fields = _header_values(headers)
    content_type = _media_type(fields.get(CONTENT_TYPE_HEADER, ""))
    if content_type not in ("", CONTENT_TYPE_PROTOBUF, CONTENT_TYPE_JSON):
        raise DecodeError(
            "unknown-content-type",
            f"unknown content-type {fields[CONTENT_TYPE_HEADER]!r}; "
            f"expected {CONTENT_TYPE_PROTOBUF} or {CONTENT_TYPE_JSON}",
        )
    payload = decompress(value, fields.get(CONTENT_ENCODING_HEADER) or "none", max_decompressed_bytes)
    if not payload:
        raise DecodeError("empty", "record value decompresses to nothing; expected OTLP MetricsData")
    if not content_type:
        # Plain OTLP topics (e.g. the Collector's Kafka exporter, or a file produced with kcat) carry no headers.
        metrics = _sniffed(payload)
    else:
        metrics = _parse_json(payload) if content_type == CONTENT_TYPE_JSON else _parse_protobuf(payload)
    return DecodedRecord(metrics=metrics, attributes=_attributes(fields))


def header_attributes(headers: Iterable[tuple[str, bytes | str | None]] | None) -> dict[str, str]:
    """The resource attributes a record's contract headers carry, without its payload (which may not decode): who
    sent it, as far as the headers say."""
    return _attributes(_header_values(headers))


def _attributes(fields: Mapping[str, str]) -> dict[str, str]:
    return {name: fields[name] for name in ATTRIBUTE_HEADERS if name in fields}


def may_be_json(payload: bytes) -> bool:
    """Whether a headerless value is to be tried as OTLP/JSON: it starts with `{` after whitespace and a BOM."""
    return payload.removeprefix(_UTF8_BOM).lstrip(_JSON_LEADING_SPACE).startswith(b"{")


def _sniffed(payload: bytes) -> MetricsData:
    """A headerless value: OTLP/JSON when it looks like a JSON object, else protobuf. One starting with "\n" (field
    1's tag in protobuf) may be either: tried as protobuf when it is no JSON, and reported as protobuf if neither."""
    if not may_be_json(payload):
        return _parse_protobuf(payload)
    try:
        return _parse_json(payload)
    except DecodeError:
        if not payload.startswith(b"\n"):
            raise
    return _parse_protobuf(payload)


def encode(
    metrics: MetricsData | bytes,
    *,
    attributes: Mapping[str, str] | None = None,
    content_type: str = CONTENT_TYPE_PROTOBUF,
    content_encoding: str = "none",
) -> tuple[bytes, list[tuple[str, bytes]]]:
    """Build a record (value, headers) for a Kafka producer; raises ValueError on bad arguments.

    `metrics` may be an already serialised MetricsData (as a broker receives it), written as protobuf unchanged.
    """
    attributes = attributes or {}
    unknown = [key for key in attributes if key not in ATTRIBUTE_HEADERS]
    if unknown:
        expected = ", ".join(ATTRIBUTE_HEADERS)
        raise ValueError(f"attribute {unknown[0]!r} is not a contract header; expected one of {expected}")
    if isinstance(metrics, bytes):
        if content_type != CONTENT_TYPE_PROTOBUF:
            raise ValueError("serialised MetricsData bytes can only be written as " + CONTENT_TYPE_PROTOBUF)
        payload = metrics
    elif content_type == CONTENT_TYPE_PROTOBUF:
        payload = metrics.SerializeToString()
    elif content_type == CONTENT_TYPE_JSON:
        payload = _to_otlp_json(metrics)
    else:
        raise ValueError(
            f"unknown content-type {content_type!r}; expected {CONTENT_TYPE_PROTOBUF} or {CONTENT_TYPE_JSON}"
        )
    value = compress(payload, content_encoding)
    headers = [
        (CONTENT_TYPE_HEADER, content_type.encode()),
        (CONTENT_ENCODING_HEADER, content_encoding.encode()),
    ]
    headers += [
        (name, _header_text(attributes[name]).encode()) for name in ATTRIBUTE_HEADERS if name in attributes
    ]
    return value, headers


def _header_values(headers: Iterable[tuple[str, bytes | str | None]] | None) -> dict[str, str]:
    # Kafka allows repeated and null headers: the last non-null value of a name wins.
    fields: dict[str, str] = {}
    for name, raw in headers or ():
        if raw is None:
            continue
        fields[name] = raw if isinstance(raw, str) else bytes(raw).decode("utf-8", errors="replace")
    return fields


def _header_text(value: object) -> str:
    # The contract spells booleans "true"/"false"; str(True) would not.
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _media_type(header: str) -> str:
    return header.split(";", 1)[0].strip().lower()


def check_message_count(payload: bytes) -> None:
    """Raise DecodeError("too-large") when parsing `payload` as MetricsData would build more than MAX_MESSAGES."""
    if builds_more_than(payload):
        raise DecodeError("too-large", f"parsing the value would build more than {MAX_MESSAGES:,} protobuf messages")


def _parse_protobuf(payload: bytes) -> MetricsData:
    check_message_count(payload)
    metrics = MetricsData()
    try:
        metrics.ParseFromString(payload)
    # Beyond protobuf's DecodeError, hostile input can trip recursion or value errors in the parser.
    except Exception as err:
        raise DecodeError("invalid-protobuf", f"value is not an OTLP MetricsData protobuf: {err}") from err
    return metrics


def _parse_json(payload: bytes) -> MetricsData:
    # Counted before parsing: protobuf's JSON reading is pure Python, and 16 MiB of `{}` (a 1.6 KB zstd record) is
    # 5 million points to build, a minute and gigabytes later; `[[]],` repeated, millions of lists before protobuf
    # sees any. A brace inside a string counts too: a bound, not a parse.
    for mark, limit, what in ((b"{", MAX_JSON_OBJECTS, "objects"), (b"[", MAX_JSON_OBJECTS, "arrays"),
                              (b",", MAX_JSON_VALUES, "values")):
        if payload.count(mark) > limit:
            raise DecodeError("too-large", f"OTLP/JSON value holds more than {limit:,} {what}")
    try:
        document = json.loads(payload.decode("utf-8-sig"))
        if not isinstance(document, dict):
            raise ValueError("top level must be a JSON object")
        _rewrite_ids(document, _hex_id_to_base64)
        # The OTLP spec requires receivers to ignore fields they do not know.
        return json_format.ParseDict(document, MetricsData(), ignore_unknown_fields=True)
    # Bad UTF-8, bad JSON, deep nesting and schema mismatches all mean the same thing to the caller.
    except Exception as err:
        raise DecodeError("invalid-json", f"value is not OTLP/JSON MetricsData: {err}") from err


def _to_otlp_json(metrics: MetricsData) -> bytes:
    # OTLP/JSON differs from proto3 JSON: enums as integers, trace and span ids as hex.
    document = json_format.MessageToDict(metrics, use_integers_for_enums=True)
    _rewrite_ids(document, _base64_id_to_hex)
    return json.dumps(document, separators=(",", ":")).encode()


def _rewrite_ids(node: Any, convert: Callable[[str, int], str]) -> None:
    if isinstance(node, dict):
        for key, item in node.items():
            if key in _OTLP_HEX_IDS and isinstance(item, str):
                node[key] = convert(item, _OTLP_HEX_IDS[key])
            else:
                _rewrite_ids(item, convert)
    elif isinstance(node, list):
        for item in node:
            _rewrite_ids(item, convert)


def _hex_id_to_base64(text: str, size: int) -> str:
    # Valid base64 of an id is never exactly 2*size hex digits, so proto3 JSON ids pass through.
    if len(text) != 2 * size:
        return text
    try:
        return base64.b64encode(bytes.fromhex(text)).decode()
    except ValueError:
        return text


def _base64_id_to_hex(text: str, size: int) -> str:
    try:
        return base64.b64decode(text, validate=True).hex()
    except binascii.Error:
        return text


def compress(data: bytes, encoding: str) -> bytes:
    """Compress `data` with a contract encoding (snappy raw block, lz4 frame)."""
    match encoding:
        case "none":
            return bytes(data)
        case "gzip":
            compressor = zlib.compressobj(wbits=_GZIP_WBITS)
            return compressor.compress(data) + compressor.flush()
        case "snappy":
            return bytes(cramjam.snappy.compress_raw(data))
        case "lz4":
            return lz4.frame.compress(data)
        case "zstd":
            return zstandard.ZstdCompressor().compress(data)
    raise ValueError(f"unknown content-encoding {encoding!r}; expected one of {', '.join(ENCODINGS)}")


def decompress(data: bytes, encoding: str, max_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES) -> bytes:
    """Undo `compress`, never producing more than `max_bytes`; raises only DecodeError."""
    name = encoding.strip().lower()
    if name not in ENCODINGS:
        raise DecodeError(
            "unknown-encoding",
            f"unknown content-encoding {encoding!r}; expected one of {', '.join(ENCODINGS)}",
        )
    if name == "none":
        _check_size(len(data), max_bytes)
        return bytes(data)
    try:
        match name:
            case "gzip":
                return _gunzip(data, max_bytes)
            case "snappy":
                return _unsnappy(data, max_bytes)
            case "lz4":
                return _unlz4(data, max_bytes)
            case _:
                return _unzstd(data, max_bytes)
    except DecodeError:
        raise
    # Codecs raise their own error types (zlib.error, RuntimeError, ZstdError, ...) on bad input.
    except Exception as err:
        raise DecodeError("decompress-failed", f"{name} payload is corrupt: {err}") from err


def _check_size(size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise DecodeError(
            "too-large",
            f"decompressed payload exceeds the {max_bytes}-byte limit; raise the limit if this is legitimate",
        )


def _truncated(name: str) -> DecodeError:
    return DecodeError("decompress-failed", f"{name} payload is truncated")


def _trailing(name: str) -> DecodeError:
    return DecodeError("decompress-failed", f"{name} payload has trailing bytes after its last frame")


def _gunzip(data: bytes, max_bytes: int) -> bytes:
    # A gzip stream may hold several members back to back (RFC 1952); any other trailing data fails.
    def member(view: memoryview, out: bytearray) -> int:
        decoder = zlib.decompressobj(wbits=_GZIP_WBITS)
        position = 0
        while not decoder.eof:
            chunk = view[position:position + _FEED_BYTES]
            if not chunk:
                raise _truncated("gzip")
            position += len(chunk)
            pending: bytes | memoryview = chunk
            while pending:
                out += decoder.decompress(pending, max_bytes + 1 - len(out))
                _check_size(len(out), max_bytes)
                pending = decoder.unconsumed_tail
        return position - len(decoder.unused_data)

    return _concatenated(data, "gzip", _GZIP_MAGIC, member)


def _unsnappy(data: bytes, max_bytes: int) -> bytes:
    if data.startswith(_XERIAL_MAGIC):
        return _unxerial(data, max_bytes)
    return _unsnappy_block(data, max_bytes)


def _unsnappy_block(data: bytes, max_bytes: int) -> bytes:
    # The raw block format starts with the uncompressed length, so reject before allocating.
    size, shift = 0, 0
    for byte in data[:5]:
        size |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    else:
        raise DecodeError("decompress-failed", "snappy payload has no valid length preamble")
    _check_size(size, max_bytes)
    out = bytes(cramjam.snappy.decompress_raw(data))
    if len(out) != size:
        raise _truncated("snappy")
    return out


def _unxerial(data: bytes, max_bytes: int) -> bytes:
    # Java clients (Kafka's SnappyOutputStream) frame raw blocks as xerial-snappy: a 16-byte header, then
    # blocks each prefixed with a big-endian 4-byte length. A broker's receiver sees it after decompression,
    # but the sandbox decompresses pushes itself.
    out = bytearray()
    position = _XERIAL_HEADER_SIZE
    while position < len(data):
        if position + 4 > len(data):
            raise _truncated("snappy")
        size = int.from_bytes(data[position:position + 4], "big")
        position += 4
        if position + size > len(data):
            raise _truncated("snappy")
        out += _unsnappy_block(data[position:position + size], max_bytes - len(out))
        position += size
    return bytes(out)


def _unlz4(data: bytes, max_bytes: int) -> bytes:
    # Concatenated lz4 frames are one valid stream; each frame needs its own decompressor.
    def frame(view: memoryview, out: bytearray) -> int:
        decoder = lz4.frame.LZ4FrameDecompressor()
        position = 0
        while not decoder.eof:
            chunk = b""
            if decoder.needs_input:
                chunk = view[position:position + _FEED_BYTES]
                if not chunk:
                    raise _truncated("lz4")
                position += len(chunk)
            out += decoder.decompress(chunk, max_length=max_bytes + 1 - len(out))
            _check_size(len(out), max_bytes)
        return position - len(decoder.unused_data or b"")

    return _concatenated(data, "lz4", LZ4_MAGIC, frame)


def _unzstd(data: bytes, max_bytes: int) -> bytes:
    if not data:
        raise _truncated("zstd")
    decompressor = zstandard.ZstdDecompressor(max_window_size=max(max_bytes, _ZSTD_MIN_WINDOW))

    def frame(view: memoryview, out: bytearray) -> int:
        decoder = decompressor.decompressobj()
        position = 0
        while not decoder.eof:
            # Small feeds bound what one call can expand to (zstd's decompressobj has no output limit).
            chunk = view[position:position + _ZSTD_FEED_BYTES]
            if not chunk:
                raise _truncated("zstd")
            position += len(chunk)
            out += decoder.decompress(chunk)
            _check_size(len(out), max_bytes)
        return position - len(decoder.unused_data)

    return _concatenated(data, "zstd", _ZSTD_MAGIC, frame)


def _concatenated(data: bytes, name: str, magic: bytes, one_frame: Callable[[memoryview, bytearray], int]) -> bytes:
    """Decode back-to-back frames; `one_frame` decodes the frame a view starts with and says how long it was.

    Each frame is fed in small slices of one memoryview, so leftovers are never copied and the work stays
    linear in the input however many (empty) frames it holds.
    """
    view = memoryview(data)
    out = bytearray()
    position = 0
    while True:
        position += one_frame(view[position:], out)
        if position >= len(view):
            return bytes(out)
        if bytes(view[position:position + len(magic)]) != magic:
            raise _trailing(name)
