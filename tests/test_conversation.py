"""Model.generate_ids with a Conversation: the caches kept between calls, cut back to the prefix a
new prompt shares where they can be, and only the rest of the prompt processed."""
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
    assert m.stats.cached_tokens == 2 and conv.tokens[:len(branch)] == branch
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
