"""A tool's secret values in its artifacts: masked in paths and in text, refused in binary.

Artifacts reach people (downloads, listings, the dashboard) and webhooks (their paths), so
they pass the tool's redactor (``runyard.registry.redact``) like its logs and result do. A path is
masked byte for byte. Content that is UTF-8 text is masked as it streams, each occurrence of
a value becoming ``***``, which keeps it UTF-8. Binary content cannot be masked without
corrupting it: a file that is not UTF-8 and holds a value is refused (``invalid_artifact``),
and the run's whole set with it. Files without a value are kept as they are.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator

from runyard.artifacts.rules import ArtifactRefused, Tally, show_path
from runyard.domain.states import ErrorCode
from runyard.registry.redact import Redactor, StreamRedactor


def mask_path(redactor: Redactor, path: str) -> str:
    """``path`` with the secret values in it masked; bytes that are not UTF-8 stay as they
    were (the rules refuse such a path, and show it masked)."""
    if not redactor.active:
        return path
    try:
        raw = path.encode("utf-8", errors="surrogateescape")
        errors = "surrogateescape"
    except UnicodeEncodeError:
        raw = path.encode("utf-8", errors="surrogatepass")
        errors = "surrogatepass"
    return redactor.mask(raw).decode("utf-8", errors=errors)


def masked_content(
    redactor: Redactor, path: str, pieces: Iterable[bytes], tally: Tally
) -> Iterator[bytes]:
    """The pieces of the file shown as ``path``, masked as they stream. Raises
    ``ArtifactRefused`` once the file is known to be binary and to hold a value, and when
    masking (a value shorter than the mask) grows the files past the size limit."""
    if not redactor.active:
        yield from pieces
        return
    stream = StreamRedactor(redactor)
    decoder = codecs.getincrementaldecoder("utf-8")()
    text = True
    grown = 0
    for piece in pieces:
        if text:
            text = _still_text(decoder, piece)
        out = stream.feed(piece)
        _refuse_binary_secret(stream.found, text, path)
        grown += len(out) - len(piece)
        tally.grow(grown)
        yield out
    if text:
        text = _still_text(decoder, b"", final=True)
    out = stream.finish()
    _refuse_binary_secret(stream.found, text, path)
    tally.grow(grown + len(out), settled=True)
    yield out


def _still_text(decoder: codecs.IncrementalDecoder, piece: bytes, *, final: bool = False) -> bool:
    try:
        decoder.decode(piece, final)
    except UnicodeDecodeError:
        return False
    return True


def _refuse_binary_secret(found: bool, text: bool, path: str) -> None:
    if found and not text:
        raise ArtifactRefused(
            ErrorCode.INVALID_ARTIFACT,
            f"artifact refused: {show_path(path)} is not UTF-8 text and holds a secret value, "
            "which cannot be masked in it",
        )
