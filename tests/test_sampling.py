"""The sampler's penalties and truncations, on hand-made logits."""

import numpy as np

from swapmoe.runtime.sampling import Sampler, Sampling


def test_greedy_takes_the_best():
    assert Sampler(Sampling())(np.array([0.1, 3.0, 2.9]), [0, 0]) == 1


def test_penalties_as_llama_cpp_applies_them():
    """Within the last repeat_last_n tokens: repeat divides positive logits and multiplies negative
    ones; presence subtracts once per token seen, frequency once per occurrence."""
    logits = np.array([2.0, 1.9, -1.0, 1.5])
    history = [0, 0, 2]
    assert Sampler(Sampling(repeat_penalty=1.1))(logits, history) == 1  # 2.0 / 1.1 < 1.9
    assert Sampler(Sampling(presence_penalty=0.05))(logits, history) == 0  # 1.95 > 1.9
    assert Sampler(Sampling(frequency_penalty=0.06))(logits, history) == 1  # 2.0 - 2 * 0.06 < 1.9
    assert Sampler(Sampling(frequency_penalty=0.6, repeat_last_n=1))(logits, history) == 0  # token 0 out of window
    probe = logits.copy()
    Sampler(Sampling(repeat_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25))(probe, history)
    assert np.array_equal(probe, logits)  # the caller's logits are not changed


def test_truncations_keep_the_likely_tokens():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    seen = {Sampler(Sampling(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0, seed=s))(logits, []) for s in range(50)}
    assert seen == {0, 1}
    seen = {Sampler(Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2, seed=s))(logits, []) for s in range(50)}
    assert seen == {0, 1, 2}  # 0.05 < 0.2 x 0.5
