"""The derandomized fuzz suite (support/fuzz_support.py's profile) over issue 37's new
decoders: the column's flag-mesh hello, the catalog's tag lines and the preemption notices.

Each is fed what a peer, a file or a metadata server could send: arbitrary bytes and texts,
and well-formed inputs with one field wrong. A hello is accepted only when it is the exact one
the job's token makes, or refused with ``Refused`` naming what is wrong; a tags file yields
only the records it holds, skipping any other line; a notice answer is always a ``Reading``,
never an exception.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.fuzz_support import DEEP, FUZZ

from replicaft.checkpoint.catalog_files import USER_TAGS_FILE, user_tags
from replicaft.column.flag_handshake import HELLO, MAGIC, Refused, check_hello, hello_mac
from replicaft.persistence.preemption import Reading, read_answer

TOKEN = "job-secret"


def hello(quorum: int, sender: int, receiver: int, *, answer: bool = False, token: str | None = TOKEN) -> bytes:
    return HELLO.pack(MAGIC, quorum, sender, hello_mac(token, quorum, sender, receiver, answer))


@FUZZ
@given(st.binary(min_size=HELLO.size, max_size=HELLO.size))
def test_arbitrary_hello_bytes_are_refused_with_the_reason(data: bytes) -> None:
    with pytest.raises(Refused):
        check_hello(data, TOKEN, 7, 0, answer=False, expected=range(1, 4))


@FUZZ
@given(
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**32 - 1),
    st.booleans(),
    st.sampled_from(["magic", "quorum", "rank", "mac", "token", "direction", None]),
)
def test_a_hello_with_one_field_wrong_is_refused_and_only_the_right_one_accepted(
    quorum: int, sender: int, answer: bool, wrong: str | None
) -> None:
    receiver = 0
    expected = range(1, 2**32)
    sender = max(sender, 1)
    data = bytearray(hello(quorum, sender, receiver, answer=answer))
    if wrong == "magic":
        data[0] ^= 0xFF
    elif wrong == "quorum":
        data = bytearray(hello(quorum ^ 1, sender, receiver, answer=answer))
    elif wrong == "rank":
        data = bytearray(hello(quorum, 0, receiver, answer=answer))
    elif wrong == "mac":
        data[-1] ^= 0x01
    elif wrong == "token":
        data = bytearray(hello(quorum, sender, receiver, answer=answer, token="another-secret"))
    elif wrong == "direction":
        data = bytearray(hello(quorum, sender, receiver, answer=not answer))
    if wrong is None:
        assert check_hello(bytes(data), TOKEN, quorum, receiver, answer=answer, expected=expected) == sender
    else:
        with pytest.raises(Refused):
            check_hello(bytes(data), TOKEN, quorum, receiver, answer=answer, expected=expected)


tag_records = st.fixed_dictionaries(
    {"name": st.text(max_size=40), "tags": st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=4)}
)
junk_lines = st.one_of(
    st.text(max_size=200).filter(lambda s: "\n" not in s and "\r" not in s),
    st.just("[" * DEEP + "]" * DEEP),
    st.just('{"name": "x"}'),
    st.just('{"name": "x", "tags": [1, 2]}'),
    st.just('{"name": "x", "tags": ' + "[" * DEEP + "]" * DEEP + "}"),
)


@FUZZ
@given(st.lists(st.one_of(tag_records.map(lambda r: ("record", r)), junk_lines.map(lambda j: ("junk", j))), max_size=8))
def test_a_tags_file_yields_its_records_and_skips_every_other_line(lines: list[tuple[str, object]]) -> None:
    with tempfile.TemporaryDirectory() as d:  # one per example: hypothesis runs many in one test
        directory = Path(d)
        text = "\n".join(json.dumps(v) if kind == "record" else str(v) for kind, v in lines)
        (directory / USER_TAGS_FILE).write_text(text + "\n", encoding="utf-8")
        got = list(user_tags(directory))
    assert all(isinstance(name, str) and all(isinstance(v, str) for v in tags.values()) for name, tags in got)
    wanted = iter(got)  # every record comes out, in order (a junk line may happen to be a record too)
    assert all(any(g == (r["name"], r["tags"]) for g in wanted) for kind, r in lines if kind == "record"), got


@FUZZ
@given(st.sampled_from(["gce", "aws", "http", "file"]), st.integers(100, 599), st.text(max_size=300))
def test_every_notice_answer_is_a_reading_never_an_exception(kind: str, status: int, body: str) -> None:
    reading = read_answer(kind, status, body)  # type: ignore[arg-type]
    assert isinstance(reading, Reading) and isinstance(reading.reason, str) and len(reading.reason) < 400
    if not reading.understood:
        assert not reading.notice
