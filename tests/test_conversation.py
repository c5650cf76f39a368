"""Model.generate_ids with a Conversation: the caches kept between calls, cut back to the prefix a
new prompt shares where they can be, and only the rest of the prompt processed; and override_kv."""

import numpy as np

import swapmoe
from swapmoe.runtime.model import Conversation


def test_kv_caches_are_cut_back_to_the_shared_prefix():
    m = swapmoe.load(swapmoe.default_model_path())
    conv = Conversation()
    prompt = m.tokenize("def main():")
    out = list(m.generate_ids(prompt, 6, conversation=conv, temperature=0))
    assert conv.tokens == prompt + out[:-1] and m.stats.cached_tokens == 0
    follow = prompt + out + m.tokenize("\n# next", add_special=False)
    list(m.generate_ids(follow, 3, conversation=conv, temperature=0))
    assert m.stats.cached_tokens == len(prompt) + len(out) - 1
    assert m.stats.prompt_tokens == len(follow) - m.stats.cached_tokens
    branch = prompt[:2] + m.tokenize(" other", add_special=False)
    list(m.generate_ids(branch, 2, conversation=conv, temperature=0))
    assert m.stats.cached_tokens == 2 and conv.tokens[: len(branch)] == branch
    list(m.generate_ids(branch, 2, conversation=conv, temperature=0))
    assert m.stats.cached_tokens == len(branch) - 1  # the same prompt: its last token is processed again


def test_recurrent_caches_are_reused_only_when_extended(synth_model):
    m = swapmoe.load(synth_model(preset="tiny-qwen35moe", seed=1))
    conv = Conversation()
    prompt = list(range(10, 30))
    out = list(m.generate_ids(prompt, 4, conversation=conv, temperature=0, ignore_eos=True))
    list(m.generate_ids(prompt + out + [40, 41], 2, conversation=conv, temperature=0, ignore_eos=True))
    assert m.stats.cached_tokens == len(prompt) + len(out) - 1  # extends what the state has seen
    list(m.generate_ids(prompt[:5] + [50, 51], 2, conversation=conv, temperature=0, ignore_eos=True))
    assert m.stats.cached_tokens == 0  # a DeltaNet state cannot go back to token 5


def test_recurrent_state_restarts_from_the_last_prompts_end(synth_model):
    """The next turn of a chat whose template re-renders the reply differently (a thinking
    model's reasoning dropped) goes back to the checkpoint at the end of the previous prompt, and
    generates what a fresh run generates."""
    m = swapmoe.load(synth_model(preset="tiny-qwen35moe", seed=1))
    conv = Conversation()
    prompt = list(range(10, 30))
    list(m.generate_ids(prompt, 6, conversation=conv, temperature=0, ignore_eos=True))
    assert conv.checkpoint[0] == len(prompt)
    turn = prompt + [7, 8, 9] + [40, 41]  # not the reply the caches hold
    again = list(m.generate_ids(turn, 5, conversation=conv, temperature=0, ignore_eos=True))
    assert m.stats.cached_tokens == len(prompt) and m.stats.prompt_tokens == 5
    last = m.step_logits
    assert again == list(m.generate_ids(turn, 5, temperature=0, ignore_eos=True))
    assert np.array_equal(last, m.step_logits)


def test_override_kv_routes_to_more_experts():
    import pytest

    from swapmoe.errors import SwapmoeError
    from swapmoe.runtime.model import parse_overrides

    path = swapmoe.default_model_path()
    base = swapmoe.load(path)
    wide = swapmoe.load(path, override_kv=["qwen3moe.expert_used_count=int:4"])
    assert (base.hparams.n_expert_used, wide.hparams.n_expert_used) == (2, 4)
    prompt = base.tokenize("def main():")
    base.logits(prompt)
    asked = base.stats.requests
    wide.logits(prompt)
    assert wide.stats.requests > asked  # more experts per token and layer were asked for
    assert parse_overrides(["a=int:3", "b=float:0.5", "c=bool:true", "d=str:x=y"]) == {
        "a": 3,
        "b": 0.5,
        "c": True,
        "d": "x=y",
    }
    for bad in (["a=int:x"], ["a:int=3"], ["a=bool:yes"], ["=int:3"]):
        with pytest.raises(SwapmoeError, match="KEY=TYPE:VALUE"):
            parse_overrides(bad)
    with pytest.raises(SwapmoeError, match="must be 1..16"):
        swapmoe.load(path, override_kv={"qwen3moe.expert_used_count": 0})
    with pytest.raises(SwapmoeError, match="int in the file"):
        swapmoe.load(path, override_kv={"qwen3moe.expert_used_count": "four"})
