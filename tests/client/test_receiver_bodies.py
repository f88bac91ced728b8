"""What the receiver's adapters read of a request before anything checks
its signature: no more than a wake can be (anyone can post to a receiver)."""
import asyncio
import io

from switchboard_client import WakeReceiver
from switchboard_client.receiver import MAX_BODY_BYTES


def receiver() -> WakeReceiver:
    return WakeReceiver(keys=lambda: {}, issuer="https://switchboard.example")


def wsgi(content_length: str, body: bytes = b"") -> tuple[str, io.BytesIO]:
    answered, stream = [], io.BytesIO(body)
    receiver().wsgi({"REQUEST_METHOD": "POST", "CONTENT_LENGTH": content_length, "wsgi.input": stream},
                    lambda status, headers: answered.append(status))
    return answered[0], stream


def asgi(chunks: list[bytes]) -> tuple[int, int]:
    """The status, and how many chunks the adapter read, of a body sent in `chunks`."""
    sent, read = [], [0]

    async def receive():
        read[0] += 1
        return {"type": "http.request", "body": chunks[read[0] - 1], "more_body": read[0] < len(chunks)}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "headers": []}
    asyncio.run(receiver().asgi(scope, receive, send))
    return sent[0]["status"], read[0]


def test_a_body_larger_than_a_wake_is_413_and_read_no_further():
    # WSGI: refused on its declared length, before reading
    status, stream = wsgi(str(MAX_BODY_BYTES + 1), b"x" * (MAX_BODY_BYTES + 1))
    assert status.startswith("413") and stream.tell() == 0
    # ASGI: reading stops once the body is past the limit
    chunk = b"x" * (64 * 1024)
    status, read = asgi([chunk] * 100)
    assert status == 413 and read == MAX_BODY_BYTES // len(chunk) + 1


def test_a_content_length_that_is_not_a_number_is_400():
    for value in ("abc", "-5", "1e3", "١٢"):
        assert wsgi(value)[0].startswith("400"), value


def test_a_body_within_the_limit_reaches_the_signature_check():
    assert wsgi("2", b"{}")[0].startswith("401")  # no signature headers: refused by the check, not by size
    assert asgi([b"{", b"}"]) == (401, 2)
