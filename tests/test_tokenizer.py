"""The tokenizer gives llama.cpp's token ids: checked against llama.cpp's own results, recorded
by tools/make_tokenizer_fixtures.py (llama.cpp is not needed here)."""

from __future__ import annotations

import hashlib
import json
import struct
from functools import lru_cache
from pathlib import Path

import pytest

from swapmoe.errors import SwapmoeError
from swapmoe.gguf_file import open_gguf
from swapmoe.runtime.tokenizer import _RULES, Tokenizer, _WordSplitter

from conftest import DATA, read_zst

CORPUS: list[str] = json.loads((DATA / "tokenizer" / "corpus.json").read_text(encoding="utf-8"))
EXPECTED: dict[str, dict] = json.loads(read_zst(DATA / "tokenizer" / "expected.json.zst"))


@lru_cache(maxsize=2)
def _metadata(path: Path) -> dict:
    return open_gguf(path).metadata()


@lru_cache(maxsize=3)
def _tokenizer(vocab_dir: Path, config: str) -> Tokenizer:
    """The tokenizer of a configuration: a vocabulary, maybe with another pre-tokenizer's rules."""
    expected = EXPECTED[config]
    path = vocab_dir / f"ggml-vocab-{expected['vocab']}.gguf"
    metadata = dict(_metadata(path))
    if expected["pre"]:
        metadata["tokenizer.ggml.pre"] = expected["pre"]
    if expected["model"]:
        metadata["tokenizer.ggml.model"] = expected["model"]
    return Tokenizer(metadata, config)


def pieces_sha256(tok: Tokenizer) -> str:
    """Every token's piece, with and without special, hashed as the fixture tool hashes llama.cpp's."""
    pieces = hashlib.sha256()
    for token in range(tok.n_vocab):
        for special in (True, False):
            piece = tok.token_bytes(token, special)
            pieces.update(struct.pack("<I", len(piece)) + piece)
    return pieces.hexdigest()


def test_corpus_is_large_and_varied():
    assert len(CORPUS) >= 200
    assert any("<|im_start|>" in s for s in CORPUS) and any("🦙" in s for s in CORPUS)
    assert any(any(ord(c) > 0x10000 for c in s) for s in CORPUS)


# The tokenizers of the MoE families swapmoe runs are checked on every test run, the others
# (and pre-tokenizers sharing rules with a checked one) with -m slow: building a tokenizer for a
# big vocabulary takes half a second. tools/make_tokenizer_fixtures.py --check runs them all.
EVERY_RUN = {
    "llama-spm",
    "llama-bpe",
    "qwen2",
    "qwen35",
    "deepseek-llm",
    "deepseek-coder",
    "gpt-2",
    "gemma-4",
    "deepseek-v3@qwen2",
    "gpt-4o@qwen2",
    "glm4@qwen2",
    "bailingmoe@qwen2",
    "afmoe@qwen2",
    "laguna@qwen2",
    "exaone-moe@qwen2",
    "kimi-k2@qwen2",
    "tiny_aya@qwen2",
}
# configurations sharing a vocabulary run one after the other: each file is read once
CONFIGS = [
    pytest.param(config, marks=() if config in EVERY_RUN else pytest.mark.slow)
    for config in sorted(EXPECTED, key=lambda config: (EXPECTED[config]["vocab"], config))
]


def test_every_run_configurations_exist():
    assert EVERY_RUN <= set(EXPECTED)


@pytest.mark.parametrize("config", CONFIGS)
def test_matches_llama_cpp(vocab_dir, config):
    """Ids of every corpus string (two ways), its detokenization, special ids, BOS/EOS rules and
    end-of-generation set, and for the vocabularies as they are: attributes, every token's piece."""
    tok = _tokenizer(vocab_dir, config)
    expected = EXPECTED[config]
    wrong_plain = [
        s
        for s, ids in zip(CORPUS, expected["ids_plain"])
        if tok.encode(s, add_special=True, parse_special=False) != ids
    ]
    wrong_special = [
        s
        for s, ids in zip(CORPUS, expected["ids_special"])
        if tok.encode(s, add_special=False, parse_special=True) != ids
    ]
    assert not wrong_plain, f"{len(wrong_plain)} strings differ, first {wrong_plain[0]!r}"
    assert not wrong_special, f"{len(wrong_special)} strings differ, first {wrong_special[0]!r}"

    round_trips = 0
    for text, ids, detok in zip(CORPUS, expected["ids_special"], expected["detok_special"]):
        assert tok.decode(ids, special=True) == (text if detok is None else detok), repr(text)
        if detok is None:  # llama.cpp gives the text back: so do we, from our own ids
            assert tok.decode(tok.encode(text, add_special=False)) == text
            round_trips += 1
    assert round_trips > len(CORPUS) // 2

    # special ids and BOS/EOS rules (whose defaults depend on the pre-tokenizer, e.g. Laguna's: no BOS)
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (
        expected["bos"],
        expected["eos"],
        expected["add_bos"],
        expected["add_eos"],
    )
    assert tok.eot_ids == expected["eog"]
    if expected["pre"]:  # the vocabulary's own facts are checked with its own configuration
        return
    assert tok.n_vocab == expected["n_vocab"]
    assert {str(t): a for t, a in enumerate(tok.attrs) if a != 4} == expected["attrs"]
    assert pieces_sha256(tok) == expected["pieces_sha256"]


def test_laguna_splits_lines_first():
    """Laguna's rules (llama.cpp's LLAMA_VOCAB_PRE_TYPE_LAGUNA): runs of newlines and of other
    characters first, then Qwen2's rules inside each; so, unlike Qwen2, "\\r\\n", "!!!\\n", "}\\n"
    and "  \\n" are cut before the newline."""
    text = "x = 1  \r\n\ty\n\nDON'T 12345 東京!!!\n}\n"
    assert _WordSplitter(_RULES["laguna"])(text) == [
        "x",
        " =",
        " ",
        "1",
        "  \r",
        "\n",
        "\ty",
        "\n\n",
        "DON",
        "'T",
        " ",
        "1",
        "2",
        "3",
        "4",
        "5",
        " 東京",
        "!!!",
        "\n",
        "}",
        "\n",
    ]
    assert _WordSplitter(_RULES["qwen2"])(text)[4:6] == ["  \r\n", "\ty"]


def test_laguna_case_exercises_both_passes():
    """On the same vocabulary llama.cpp's Laguna ids differ from its Qwen2 ids for the strings
    where the newline pass matters: test_matches_llama_cpp[laguna@qwen2] does see its effect."""
    laguna, qwen2 = EXPECTED["laguna@qwen2"], EXPECTED["qwen2"]
    differ = [s for s, a, b in zip(CORPUS, laguna["ids_special"], qwen2["ids_special"]) if a != b]
    assert len(differ) >= 20
    for needle in ("\r\n", "}\n", "  \n", "〈|EOS|〉<system>\n", "<assistant><think>"):
        assert any(needle in s for s in differ), needle
    for needle in ("12345678901234567890", "DON'T", "Don'T", "你好", "한국어", "\n\n\n"):  # the Qwen2 pass's cases
        assert any(needle in s for s in CORPUS), needle


def test_add_special_and_parse_special(vocab_dir):
    tok = _tokenizer(vocab_dir, "llama-bpe")  # adds BOS <|begin_of_text|>
    text = "<|start_header_id|>user<|end_header_id|>"
    with_special = tok.encode(text)
    assert with_special[0] == tok.bos_id and with_special[1] == tok.token_ids["<|start_header_id|>"]
    plain = tok.encode(text, add_special=False, parse_special=False)
    assert tok.token_ids["<|start_header_id|>"] not in plain and tok.bos_id not in plain
    assert tok.decode(plain) == text


def test_end_of_generation_ids(vocab_dir):
    qwen = _tokenizer(vocab_dir, "qwen2")
    assert {qwen.token_ids["<|im_end|>"], qwen.token_ids["<|endoftext|>"]} <= set(qwen.eot_ids)
    llama = _tokenizer(vocab_dir, "llama-bpe")
    assert {llama.token_ids["<|eot_id|>"], llama.token_ids["<|end_of_text|>"]} <= set(llama.eot_ids)


@pytest.mark.parametrize(
    "config, text",
    [
        ("llama-spm", "Grüße 🦙 你好!"),  # SentencePiece byte fallback: <0xF0><0x9F><0xA6><0x99>
        ("gpt-2", "Grüße 🦙 你好!"),  # byte-level BPE: tokens holding parts of a character
        ("qwen2", "emoji 👨‍👩‍👧‍👦 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢"),
    ],
)
def test_stream_decoder_yields_whole_characters(vocab_dir, config, text):
    tok = _tokenizer(vocab_dir, config)
    ids = tok.encode(text, add_special=False)
    assert not all(_is_utf8(tok.token_bytes(i)) for i in ids), "the text should have tokens that split a character"
    stream = tok.decoder()
    pieces = [stream.push(i) for i in ids]
    pieces.append(stream.flush())
    # the stream keeps SentencePiece's leading space (it continues a prompt); decode() drops it
    assert "".join(pieces) == b"".join(tok.token_bytes(i) for i in ids).decode()
    assert tok.decode(ids).lstrip(" ") == "".join(pieces).lstrip(" ")
    assert all("\ufffd" not in piece for piece in pieces)
    assert "" in pieces  # held back while a character was incomplete


def _is_utf8(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_stream_decoder_flushes_an_incomplete_character(vocab_dir):
    tok = _tokenizer(vocab_dir, "llama-spm")
    first_byte = tok.token_ids["<0xF0>"]
    stream = tok.decoder()
    assert stream.push(first_byte) == ""
    assert stream.flush() == "\ufffd"


def test_stream_decoder_hides_control_tokens_unless_special(vocab_dir):
    tok = _tokenizer(vocab_dir, "qwen2")
    ids = tok.encode("<|im_start|>assistant\nHi<|im_end|>", add_special=False)
    assert "".join(map(tok.decoder().push, ids)) == "assistant\nHi"
    assert "".join(map(tok.decoder(special=True).push, ids)) == "<|im_start|>assistant\nHi<|im_end|>"


def test_synthetic_model_tokenizer(synth_model):
    tok = Tokenizer.from_gguf(synth_model())
    text = "<|im_start|>user\nThe quick brown fox, ünïcödé 🦙!<|im_end|>\n"
    ids = tok.encode(text)
    assert ids[0] == tok.token_ids["<|im_start|>"] and ids[-2] == tok.token_ids["<|im_end|>"]
    assert tok.decode(ids) == text
    assert {tok.token_ids["<|im_end|>"], tok.token_ids["<|endoftext|>"]} <= set(tok.eot_ids)
    assert tok.eos_id == tok.token_ids["<|endoftext|>"] and not tok.add_bos


def test_unsupported_tokenizers_name_the_file(vocab_dir):
    metadata = dict(_metadata(vocab_dir / "ggml-vocab-qwen2.gguf"))
    with pytest.raises(SwapmoeError, match="x.gguf: pre-tokenizer 'no-such-pre'"):
        Tokenizer({**metadata, "tokenizer.ggml.pre": "no-such-pre"}, "x.gguf")
    with pytest.raises(SwapmoeError, match="x.gguf: tokenizer model 'bert' is not supported"):
        Tokenizer({**metadata, "tokenizer.ggml.model": "bert"}, "x.gguf")


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    with pytest.raises(SwapmoeError, match="notes.txt: not a GGUF file"):
        Tokenizer.from_gguf(path)
    with pytest.raises(SwapmoeError, match="no such file"):
        Tokenizer.from_gguf(tmp_path / "missing.gguf")


def test_truncated_gguf(vocab_dir, tmp_path):
    path = tmp_path / "cut.gguf"
    path.write_bytes((vocab_dir / "ggml-vocab-gpt-2.gguf").read_bytes()[:100_000])
    with pytest.raises(SwapmoeError, match="cut.gguf: corrupt or truncated GGUF header"):
        Tokenizer.from_gguf(path)
