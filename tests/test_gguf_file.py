import re
import struct

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T, GGUFReader, GGUFValueType as V, Keys

import swapmoe
from swapmoe.errors import SwapmoeError
from swapmoe.gguf_file import TensorKind, classify, open_gguf


@pytest.mark.parametrize(
    "name, kind, layer, projection, part",
    [
        ("blk.3.ffn_gate_exps.weight", TensorKind.ROUTED_EXPERT, 3, "gate", "weight"),
        ("blk.0.ffn_gate_up_exps.weight", TensorKind.ROUTED_EXPERT, 0, "gate_up", "weight"),
        ("blk.12.ffn_down_exps.bias", TensorKind.ROUTED_EXPERT, 12, "down", "bias"),
        ("blk.1.ffn_up_exps.scale", TensorKind.ROUTED_EXPERT, 1, "up", "scale"),
        ("blk.1.ffn_up_shexp.weight", TensorKind.SHARED_EXPERT, 1, None, None),
        ("blk.1.ffn_down_shexp.weight", TensorKind.SHARED_EXPERT, 1, None, None),
        ("blk.2.ffn_gate_inp.weight", TensorKind.ROUTER, 2, None, None),
        ("blk.2.ffn_gate_inp.bias", TensorKind.ROUTER, 2, None, None),
        ("blk.2.ffn_gate_inp_shexp.weight", TensorKind.ROUTER, 2, None, None),
        ("blk.5.exp_probs_b.bias", TensorKind.ROUTER, 5, None, None),
        ("blk.0.ffn_gate_tid2eid.weight", TensorKind.HASH_TABLE, 0, None, None),
        ("blk.0.ffn_gate.weight", TensorKind.OTHER, 0, None, None),
        ("blk.4.attn_q.weight", TensorKind.OTHER, 4, None, None),
        ("token_embd.weight", TensorKind.OTHER, None, None, None),
    ],
)
def test_classify(name, kind, layer, projection, part):
    c = classify(name)
    assert (c.kind, c.layer, c.projection, c.part) == (kind, layer, projection, part)


def test_tensor_table_matches_gguf_reader(synth_model):
    path = synth_model(arch="qwen3moe", type="Q4_K")
    g = open_gguf(path)
    reader = GGUFReader(path)
    assert [t.name for t in reader.tensors] == list(g.tensors)
    for rt in reader.tensors:
        t = g.tensors[rt.name]
        assert (t.offset, t.nbytes, t.ggml_type, t.ne) == (rt.data_offset, rt.n_bytes, rt.tensor_type, tuple(rt.shape))
        assert np.array_equal(g.raw(rt.name), np.asarray(rt.data).reshape(-1).view(np.uint8))
    assert g.arch == "qwen3moe" and g.arch_get(Keys.LLM.EXPERT_COUNT) == 8
    shard = g.shards[0]
    assert shard.kv_span[0] == 24 and shard.kv_span[1] <= shard.tensor_info_span[0] <= shard.tensor_info_span[1]
    assert shard.tensor_info_span[1] <= shard.data_offset < shard.tensor_info_span[1] + shard.alignment
    experts = g.tensors_of_kind(TensorKind.ROUTED_EXPERT)
    assert {t.cls.projection for t in experts} == {"gate", "up", "down"}
    assert all(t.n_experts == 8 and t.expert_nbytes * 8 == t.nbytes for t in experts)


def test_metadata_matches_gguf_reader(synth_model):
    path = synth_model(arch="gpt-oss")
    g = open_gguf(path)
    fields = {key: f for key, f in GGUFReader(path).fields.items() if not key.startswith("GGUF.")}
    assert g.keys() == list(fields) and g.metadata() == {key: f.contents() for key, f in fields.items()}
    for key, f in fields.items():
        assert type(g.get(key)) is type(f.contents()), key
    assert g.kv_spans() == [(key, f.offset, f.offset + sum(p.nbytes for p in f.parts)) for key, f in fields.items()]
    tokens = g.get("tokenizer.ggml.tokens")
    tokens.append("changed")  # get() hands out a new list each time
    assert g.get("tokenizer.ggml.tokens") == tokens[:-1]


def _string(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def _gguf(kvs=(), tensors=(), data_size=0, version=3) -> bytes:
    """A GGUF built by hand: kvs are (key, value type, value bytes); tensors (name, ne, ggml type, offset)."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    out += b"".join(_string(key.encode()) + struct.pack("<I", value_type) + value for key, value_type, value in kvs)
    for name, ne, ggml_type, offset in tensors:
        out += _string(name.encode()) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, ggml_type, offset)
    return out.ljust(-(-len(out) // 32) * 32, b"\0") + bytes(data_size)


def test_metadata_values(tmp_path):
    tokens = [b"a", "\u2581b".encode(), b"\xff\xfe"]  # the last is not UTF-8: kept byte for byte
    path = tmp_path / "m.gguf"
    path.write_bytes(
        _gguf(
            [
                ("tokenizer.ggml.tokens", V.ARRAY, struct.pack("<IQ", V.STRING, 3) + b"".join(map(_string, tokens))),
                ("tokenizer.ggml.scores", V.ARRAY, struct.pack("<IQ3f", V.FLOAT32, 3, 0.5, -1.0, 0.1)),
                ("general.architecture", V.STRING, _string(b"test")),
                ("general.name", V.STRING, _string(b"x")),
                ("big", V.INT64, struct.pack("<q", -(2**40))),
                ("flag", V.BOOL, b"\x01"),
            ],
            [("t", (4, 2), T.F32, 0)],
            data_size=32,
        )
    )
    g = open_gguf(path)
    assert [t.encode("utf-8", "surrogateescape") for t in g.get("tokenizer.ggml.tokens")] == tokens
    assert g.get("tokenizer.ggml.scores") == [0.5, -1.0, float(np.float32(0.1))]
    assert (g.get("general.name"), g.get("big"), g.get("flag"), g.get("absent", 7)) == ("x", -(2**40), True, 7)
    assert g.array("t").shape == (2, 4) and not g.raw("t").flags.writeable


@pytest.mark.parametrize(
    "kvs, tensors, data_size, version, message",
    [
        ([], [], 0, 1, "GGUF version 1 is not supported"),
        ([], [], 0, 3 << 24, "big-endian GGUF files are not supported"),
        ([("general.alignment", V.UINT32, struct.pack("<I", 48))], [], 0, 3, "non-zero power of two"),
        ([("general.alignment", V.UINT32, struct.pack("<I", 0))], [], 0, 3, "non-zero power of two"),
        ([("general.alignment", V.UINT64, struct.pack("<Q", 64))], [], 0, 3, "general.alignment must be a uint32"),
        ([("a", V.UINT8, b"\1"), ("a", V.UINT8, b"\2")], [], 0, 3, "metadata key a appears twice"),
        ([("split.count", V.UINT16, struct.pack("<H", 2))], [], 0, 3, "metadata says 2 shards but 1 were found"),
        ([("a", V.ARRAY, struct.pack("<IQ", V.STRING, 10**12))], [], 0, 3, "corrupt or truncated GGUF header"),
        ([("a", V.ARRAY, struct.pack("<IQ", V.ARRAY, 0))], [], 0, 3, "corrupt or truncated GGUF header"),
        ([("a", 13, b"")], [], 0, 3, "corrupt or truncated GGUF header"),
        ([], [("t", (4,), T.F32, 0), ("t", (4,), T.F32, 16)], 32, 3, "tensor t appears twice"),
        ([], [("t", (4,), 99, 0)], 32, 3, "tensor t has unknown ggml type 99"),
        ([], [("t", (16, 2), T.Q4_0, 0)], 32, 3, "row of 16 is not a whole number of Q4_0 blocks of 32"),
        ([], [("t", (4, 4), T.F32, 0)], 32, 3, r"truncated: tensor t needs bytes up to 160 but the file has 128 bytes"),
        ([], [("t", (1, 1, 1, 1, 1), T.F32, 0)], 32, 3, "corrupt or truncated GGUF header"),
    ],
)
def test_damaged_headers_are_refused(tmp_path, kvs, tensors, data_size, version, message):
    path = tmp_path / "m.gguf"
    path.write_bytes(_gguf(kvs, tensors, data_size, version))
    with pytest.raises(SwapmoeError, match=r"m\.gguf: .*" + message):
        open_gguf(path)


def test_split_shards_are_one_model(tmp_path, synth_model):
    first = swapmoe.synth(tmp_path / "m.gguf", shards=3, progress=False)
    assert first.name == "m-00001-of-00003.gguf"
    g = open_gguf(first)
    whole = open_gguf(synth_model())
    assert len(g.shards) == 3 and list(g.tensors) == list(whole.tensors)
    for name in whole.tensors:
        assert np.array_equal(g.raw(name), whole.raw(name))
    assert g.get("tokenizer.ggml.tokens") == whole.get("tokenizer.ggml.tokens")


def test_missing_shard_is_named(tmp_path):
    first = swapmoe.synth(tmp_path / "m.gguf", shards=3, progress=False)
    (tmp_path / "m-00002-of-00003.gguf").unlink()
    with pytest.raises(SwapmoeError, match=r"m-00002-of-00003\.gguf: missing shard 2 of 3"):
        open_gguf(first)
    with pytest.raises(SwapmoeError, match="give the first shard"):
        open_gguf(tmp_path / "m-00003-of-00003.gguf")


def test_not_a_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(SwapmoeError, match=r"x\.gguf: not a GGUF file"):
        open_gguf(p)
    with pytest.raises(SwapmoeError, match="no such file"):
        open_gguf(tmp_path / "absent.gguf")


def test_truncated_data_is_reported(tmp_path, synth_model):
    path = tmp_path / "m.gguf"
    data = synth_model().read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(SwapmoeError, match=r"m\.gguf: truncated: tensor .* needs bytes up to"):
        open_gguf(path)


@pytest.mark.parametrize("keep", [30, 2000, 9000])
def test_truncated_header_is_reported(tmp_path, synth_model, keep):
    path = tmp_path / "m.gguf"
    path.write_bytes(synth_model().read_bytes()[:keep])
    with pytest.raises(SwapmoeError, match=r"m\.gguf: (corrupt or truncated GGUF header|truncated)"):
        open_gguf(path)


def test_a_damaged_string_length_is_refused_before_any_copy(tmp_path, monkeypatch):
    """A string of a token array that claims more than a metadata string may hold (the bytes
    behind it are in the file): one line naming the file, no copy of the rest of the file."""
    from swapmoe import gguf_file

    data = bytearray(open(swapmoe.default_model_path(), "rb").read())
    key = b"tokenizer.ggml.tokens"
    first_length = data.index(key) + len(key) + 4 + 4 + 8  # value type, item type, count
    data[first_length : first_length + 8] = np.uint64(5000).tobytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    monkeypatch.setattr(gguf_file, "_MAX_STRING", 1000)
    with pytest.raises(SwapmoeError, match=f"{bad}: corrupt or truncated GGUF header.*claims 5,000 bytes"):
        gguf_file.open_gguf(bad)


@pytest.mark.parametrize(
    "tensors, message",
    [
        ([("t", (4, 0), T.F32, 0)], "tensor t has a dimension of 0"),
        (
            [("t", (4,), T.F32, 0), ("u", (4,), T.F32, 8)],
            "tensor u starts at byte 8 of the data section, not a multiple of general.alignment 32",
        ),
        ([("t", (16,), T.F32, 0), ("u", (4,), T.F32, 32)], "tensors t and u overlap"),
    ],
)
def test_tensors_that_cannot_be_laid_out_are_refused(tmp_path, tensors, message):
    path = tmp_path / "m.gguf"
    path.write_bytes(_gguf([("general.architecture", V.STRING, _string(b"test"))], tensors, data_size=128))
    with pytest.raises(SwapmoeError, match=r"m\.gguf: " + message):
        open_gguf(path)


# A one-layer MoE of zeros, its metadata changed per case: (key, value type, value), or a tensor's new shape.
_MOE_KEYS = {
    "block_count": 1,
    "embedding_length": 32,
    "expert_count": 4,
    "expert_used_count": 2,
    "expert_feed_forward_length": 16,
    "attention.head_count": 2,
    "attention.head_count_kv": 1,
    "attention.key_length": 16,
    "attention.value_length": 16,
}
_MOE_TENSORS = {
    "token_embd.weight": (8, 32),
    "output_norm.weight": (32,),
    "blk.0.attn_norm.weight": (32,),
    "blk.0.attn_q.weight": (32, 32),
    "blk.0.attn_k.weight": (16, 32),
    "blk.0.attn_v.weight": (16, 32),
    "blk.0.attn_output.weight": (32, 32),
    "blk.0.ffn_norm.weight": (32,),
    "blk.0.ffn_gate_inp.weight": (4, 32),
    "blk.0.ffn_gate_exps.weight": (4, 16, 32),
    "blk.0.ffn_up_exps.weight": (4, 16, 32),
    "blk.0.ffn_down_exps.weight": (4, 32, 16),
}


def _moe(path, keys: dict, shapes: dict, tokens: int = 8):
    w = gguf.GGUFWriter(path, "qwen3moe")
    w.add_token_list([f"t{i}" for i in range(tokens)])
    for key, value in {**_MOE_KEYS, **keys}.items():
        if value is not None:
            (w.add_float32 if isinstance(value, float) else w.add_uint32)(f"qwen3moe.{key}", value)
    for name, shape in {**_MOE_TENSORS, **shapes}.items():
        if shape is not None:
            w.add_tensor(name, np.zeros(shape, np.float32))  # numpy shape: ggml ne reversed
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize(
    "keys, shapes, tokens, message",
    [
        ({}, {}, 8, None),
        ({}, {name: None for name in _MOE_TENSORS}, 8, None),  # no tensors: a vocab-only file
        (
            {"expert_count": 0},
            {},
            8,
            "tensor blk.0.ffn_gate_exps.weight has ne[2] = 4, but qwen3moe.expert_count gives 0",
        ),
        ({"expert_count": None}, {}, 8, "no qwen3moe.expert_count key, but the file has routed expert tensors"),
        ({"expert_used_count": 0}, {}, 8, "qwen3moe.expert_used_count is 0; it must be 1..4 (qwen3moe.expert_count)"),
        ({"expert_used_count": 5}, {}, 8, "qwen3moe.expert_used_count is 5; it must be 1..4 (qwen3moe.expert_count)"),
        ({"attention.head_count": 0}, {}, 8, "layer 0 has attention tensors but qwen3moe.attention.head_count is 0"),
        (
            {"attention.head_count_kv": 2},
            {},
            8,
            "tensor blk.0.attn_k.weight has ne[1] = 16, but qwen3moe.attention."
            "head_count_kv 2 x key_length 16 gives 32",
        ),
        ({"attention.key_length": 0}, {}, 8, "qwen3moe.attention.key_length is 0"),
        (
            {"rope.dimension_count": 10**6},
            {},
            8,
            "qwen3moe.rope.dimension_count is 1000000; it must be an even number of 2..16 (the length of a head)",
        ),
        ({"block_count": 0}, {}, 8, "qwen3moe.block_count is 0, but the file has tensors for 1 layers"),
        ({"block_count": 1.0}, {}, 8, "qwen3moe.block_count must be a whole number, not 1.0"),
        (
            {"embedding_length": 31},
            {},
            8,
            "tensor token_embd.weight has ne[0] = 32, but qwen3moe.embedding_length gives 31",
        ),
        (
            {"expert_feed_forward_length": 8},
            {},
            8,
            "tensor blk.0.ffn_gate_exps.weight has ne[1] = 16, but qwen3moe.expert_feed_forward_length gives 8",
        ),
        ({}, {}, 7, "tensor token_embd.weight has ne[1] = 8, but the vocabulary of 7 tokens gives 7"),
        (
            {},
            {"blk.0.ffn_up_exps.weight": None},
            8,
            "layer 0 has routed expert tensors but no blk.0.ffn_up_exps.weight",
        ),
        (
            {},
            {"blk.0.attn_output.weight": (32, 16)},
            8,
            "tensor blk.0.attn_output.weight has ne[0] = 16, but "
            "qwen3moe.attention.head_count 2 x value length 16 gives 32",
        ),
        ({}, {"blk.3.attn_norm.weight": (32,)}, 8, "qwen3moe.block_count is 1, but the file has tensors for 4 layers"),
    ],
)
def test_metadata_that_contradicts_the_tensors_is_refused(tmp_path, keys, shapes, tokens, message):
    path = _moe(tmp_path / "m.gguf", keys, shapes, tokens)
    if message is None:
        open_gguf(path)
        return
    with pytest.raises(SwapmoeError, match=f"^{re.escape(str(path))}: {re.escape(message)}$"):
        open_gguf(path)


def test_overrides_are_checked_like_the_file(tmp_path):
    g = open_gguf(_moe(tmp_path / "m.gguf", {}, {}))
    with pytest.raises(SwapmoeError, match="expert_used_count is 9; it must be 1..4"):
        g.override({"qwen3moe.expert_used_count": 9})
