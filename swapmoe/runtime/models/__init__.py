"""One file per architecture; ARCHITECTURES maps `general.architecture` to its model class."""

from __future__ import annotations

from swapmoe.runtime.models.deepseek2 import DeepSeek2
from swapmoe.runtime.models.deepseek4 import DeepSeek4
from swapmoe.runtime.models.gpt_oss import GptOss
from swapmoe.runtime.models.laguna import Laguna
from swapmoe.runtime.models.llama import Llama
from swapmoe.runtime.models.minimax_m2 import MiniMaxM2
from swapmoe.runtime.models.olmoe import OLMoE
from swapmoe.runtime.models.qwen2moe import Qwen2MoE
from swapmoe.runtime.models.qwen3moe import Qwen3MoE
from swapmoe.runtime.models.qwen3next import Qwen3Next
from swapmoe.runtime.models.qwen35moe import Qwen35MoE

ARCHITECTURES = {
    "qwen3moe": Qwen3MoE,
    "qwen2moe": Qwen2MoE,
    "olmoe": OLMoE,
    "llama": Llama,
    "deepseek2": DeepSeek2,
    "deepseek4": DeepSeek4,
    "minimax-m2": MiniMaxM2,
    "gpt-oss": GptOss,
    "qwen35moe": Qwen35MoE,
    "qwen3next": Qwen3Next,
    "laguna": Laguna,
}
