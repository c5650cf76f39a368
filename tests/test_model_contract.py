"""The architecture contract of models/base.py: mistakes in an architecture file fail when the
model loads, with a message that names what is wrong."""

import pytest

import swapmoe
from swapmoe.errors import SwapmoeError
from swapmoe.runtime.models.qwen3moe import Qwen3MoE

from conftest import open_model


def load(cls):
    return open_model(swapmoe.default_model_path(), cls)


def test_the_tiny_model_loads_as_its_architecture():
    model = load(Qwen3MoE)
    assert len(model.blocks) == model.hp.n_layer


def test_a_misnamed_tensor_fails_at_load_naming_it():
    class Misnamed(Qwen3MoE):
        def load_block(self, i):
            return self.w.block(i, self.w.attention(i, qk_norm=True), self.w.moe(i), ffn_norm="ffn_nrom")

    with pytest.raises(SwapmoeError, match=r"missing tensor blk\.0\.ffn_nrom\.weight"):
        load(Misnamed)


def test_a_block_that_is_not_a_record_fails_at_load():
    class Untyped(Qwen3MoE):
        def load_block(self, i):
            return {"router": self.w.matrix(f"blk.{i}.ffn_gate_inp.weight")}

    with pytest.raises(TypeError, match=r"Untyped\.load_block\(0\) returned dict, not a Block"):
        load(Untyped)


def test_an_architecture_without_rope_fails_at_load():
    class NoRope(Qwen3MoE):
        def setup(self):
            pass

    with pytest.raises(TypeError, match=r"NoRope\.setup\(\) must set self\.rope"):
        load(NoRope)
