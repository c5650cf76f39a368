#!/usr/bin/env python3
"""Record llama.cpp's tokenization of a test corpus, for tests/test_tokenizer.py (CI has no llama.cpp).

    python tools/make_tokenizer_fixtures.py            # write tests/data/tokenizer/*
    python tools/make_tokenizer_fixtures.py --check    # compare swapmoe with llama.cpp live, write nothing
    python tools/make_tokenizer_fixtures.py --check --random 2000   # ... on 2000 more random strings
    python tools/make_tokenizer_fixtures.py --chat-cases   # only (re)write the "cases" of templates.json.zst

Run with swapmoe's venv. llama.cpp is reached through llama-cpp-python in another Python
(--llama-python, default ~/.cache/swapmoe-ref/venv/bin/python, whose libllama is the reference
build); this file is also that Python's worker (--worker), so it imports only the standard
library at the top.

It writes, under tests/data/tokenizer/:
  corpus.json          the test strings (llama.cpp's own vocab test inputs, hand-written cases
                       and seeded random strings)
  expected.json.zst    per configuration: llama.cpp's ids of every string tokenized two ways
                       (add_special + no parse_special; no add_special + parse_special), the text
                       it detokenizes the second back to, and per vocabulary BOS/EOS, add_bos/eos,
                       end-of-generation ids, token attributes and a hash of every token's piece
  vocab/*.gguf.zst     the vocab-only GGUFs the configurations use, zstd-compressed
  templates.json.zst   the chat templates of llama.cpp's models/templates/ and, for each, the
                       prompt ids llama.cpp's chat layer (llama-completion --jinja) makes of a
                       system + user message with a synthetic model's vocabulary; and "cases":
                       conversations (thinking on/off, tool calls with `tools`, multi-turn
                       reasoning, no/empty/later system messages, ...: CHAT_CASES) through the
                       templates of CASE_TEMPLATES (Qwen3.5's, poolside Laguna's), each with the
                       text the template renders to as Hugging Face transformers'
                       apply_chat_template renders it (plain jinja2, set up here independently
                       of swapmoe; or the template's error) and the text llama.cpp's chat layer
                       (common_chat_templates_apply, through a small C++ driver built against
                       the reference build) makes of the same conversation; "case_check" says
                       for which cases transformers itself (run in --hf-python, default
                       /tmp/hfvenv/bin/python, if there) renders another text than jinja2 here
A configuration is a vocabulary from llama.cpp's models/ folder, possibly with its
tokenizer.ggml.pre replaced, which runs another pre-tokenizer's rules over a real vocabulary
(for the pre-tokenizers that have no vocab-only GGUF there).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "data" / "tokenizer"
REF = Path.home() / ".cache" / "swapmoe-ref"

# name -> (vocab file stem in llama.cpp's models/, tokenizer.ggml.pre override or None)
CONFIGS: dict[str, tuple[str, str | None]] = {
    "llama-spm": ("llama-spm", None),
    "phi-3": ("phi-3", None),
    "baichuan": ("baichuan", None),
    "llama-bpe": ("llama-bpe", None),
    "qwen2": ("qwen2", None),
    "qwen35": ("qwen35", None),
    "deepseek-llm": ("deepseek-llm", None),
    "deepseek-coder": ("deepseek-coder", None),
    "gpt-2": ("gpt-2", None),
    "falcon": ("falcon", None),
    "starcoder": ("starcoder", None),
    "refact": ("refact", None),
    "mpt": ("mpt", None),
    "command-r": ("command-r", None),
    "gpt-neox": ("gpt-neox", None),  # no tokenizer.ggml.pre: llama.cpp's "default"
    "aquila": ("aquila", None),  # no tokenizer.ggml.pre: llama.cpp's "default"
    "gemma-4": ("gemma-4", None),  # tokenizer model "gemma4": SentencePiece-style BPE
    # pre-tokenizers without a vocab-only GGUF in llama.cpp: their rules on the qwen2 vocabulary
    "deepseek-v3@qwen2": ("qwen2", "deepseek-v3"),
    "gpt-4o@qwen2": ("qwen2", "gpt-4o"),
    "minimax-m2@qwen2": ("qwen2", "minimax-m2"),
    "olmo@qwen2": ("qwen2", "olmo"),
    "default@qwen2": ("qwen2", "default"),
    "glm4@qwen2": ("qwen2", "glm4"),
    "tekken@qwen2": ("qwen2", "tekken"),
    "bailingmoe@qwen2": ("qwen2", "bailingmoe"),
    "seed-coder@qwen2": ("qwen2", "seed-coder"),
    "afmoe@qwen2": ("qwen2", "afmoe"),
    "laguna@qwen2": ("qwen2", "laguna"),
    "exaone-moe@qwen2": ("qwen2", "exaone-moe"),
    "minicpm5@qwen2": ("qwen2", "minicpm5"),
    "poro-chat@qwen2": ("qwen2", "poro-chat"),
    "viking@qwen2": ("qwen2", "viking"),
    "dbrx@qwen2": ("qwen2", "dbrx"),
    "hunyuan@llama-bpe": ("llama-bpe", "hunyuan"),
    "kimi-k2@qwen2": ("qwen2", "kimi-k2"),
    "jais-2@qwen2": ("qwen2", "jais-2"),
    "ufakzeka@qwen2": ("qwen2", "ufakzeka"),
    "spark2_5@qwen2": ("qwen2", "spark2_5"),
    "youtu@qwen2": ("qwen2", "youtu"),
    "tiny_aya@qwen2": ("qwen2", "tiny_aya"),
    # Sarvam's SentencePiece-style BPE, on Gemma 4's vocabulary read as a "gpt2" model
    "sarvam-moe@gemma-4": ("gemma-4", "sarvam-moe"),
}
MODEL_OVERRIDES = {"sarvam-moe@gemma-4": "gpt2"}  # tokenizer.ggml.model to set as well

HAND_WRITTEN = [
    # code
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    '#include <stdio.h>\nint main(void) { printf("%d\\n", 42); return 0; }',
    "const x = async () => { await fetch('/api?q=1&r=2'); };",
    '<div class="main"><p>Hello &amp; welcome</p></div>',
    '{"name": "swapmoe", "version": "0.1.0", "tags": ["moe", "gguf"], "ok": true}',
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "    if x:\n        y = [i**2 for i in range(10)]  # squares\n",
    "fn main() -> Result<(), Box<dyn Error>> { let v: Vec<u8> = vec![1, 2, 3]; Ok(()) }",
    "$ ls -la /usr/local/bin | grep -E '^-rwx' && echo \"done\" >> log.txt 2>&1",
    "x_1 = foo.bar_baz(**kwargs); __init__; _private; CONSTANT_NAME = 0xFF",
    "camelCaseIdentifier getHTTPResponseCode XMLHttpRequest iPhone McDonald's",
    "a+=b; c-=d; e*=f; g/=h; i%=j; k<<=1; l>>=2; m&&n || !o; p != q == r",
    "`backticks` ~tilde~ ^caret^ |pipe| \\backslash\\ @at #hash $dollar %percent",
    "\\begin{equation} E = mc^2 \\quad \\int_0^\\infty e^{-x^2} dx = \\frac{\\sqrt{\\pi}}{2} \\end{equation}",
    "https://example.com/path/to/page?query=value&other=123#fragment",
    "user.name+tag@example.co.uk, +1 (555) 123-4567",
    "# Title\n\n- item one\n- item two\n\n```python\nprint('hi')\n```\n",
    "| a | b |\n|---|---|\n| 1 | 2 |",
    # digits
    "0",
    "7",
    "42",
    "123",
    "1234",
    "12345",
    "123456",
    "1234567",
    "12345678901234567890",
    "3.14159 2.71828 -1e-10 6.022e23 1,234,567.89 1.000.000,00",
    "The year 2024 had 366 days; 10/10/2010 at 10:10:10.",
    "٠١٢٣٤٥٦٧٨٩ ۰۱۲۳ ０１２３４５ ①②③ Ⅻ ½ ¾ ² ³",
    "v1.2.3-rc.4+build.567 0b1010 0o777 0xDEADbeef 1_000_000",
    # contractions and apostrophes
    "I'm sure you're right, they've said we'll see, it's John's and I'd go.",
    "DON'T SHOUT, I'M HERE. WE'LL GO. THEY'RE OUT. YOU'VE WON. HE'D KNOW. IT'S FINE.",
    "Don'T mIx'Ll CaSe'S 're 've 'm 'll 'd 's 't",
    "'tis the season, y'all, rock 'n' roll, o'clock, ' quote ' and '' double",
    "It’s a curly apostrophe ‘quoted’ “double” — dash – en-dash … ellipsis",
    "l'homme qu'il aime, c'est l'été",
    # whitespace
    "a  b   c    d     e      f",
    "   leading spaces",
    "trailing spaces   ",
    "\tTab\tseparated\tvalues\t",
    "line1\nline2\r\nline3\rline4\n\n\nline7",
    " \n \n  \n\t\n",
    "\n",
    "\r\n",
    "\n\n\n\n",
    " ",
    "  ",
    "\t\t",
    " \t \t ",
    "word\u00a0nbsp\u2003em\u3000ideographic\u2009thin\u202fnarrow\u205fmedium",
    "line\u2028separator\u2029paragraph\u0085nextline\u000bvt\u000cff",
    "\u001cfile\u001dgroup\u001erecord\u001funit",
    " " * 100,
    "x" + " " * 37 + "y",
    "\n" * 20 + "end",
    "    \n        \n            code",
    # multilingual
    "Äpfel, Öl und Übermut: Größe, Maß, Straße — ÄÖÜ äöü ß ẞ",
    "Él está aquí; ¿qué pasa? ¡Olé! Ñandú, pingüino, acción.",
    "Façade, naïve, coöperate, café crème brûlée, Œuvre, æsthetic",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "ПРИВЕТмир CamelКейс ΑΒΓδεζ ÄpfelÜber ÉCOLEécole",
    "Γειά σου Κόσμε! Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "你好，世界！我们今天学习大规模混合专家模型。",
    "日本語のテキスト：ひらがな、カタカナ、漢字を含む。ｶﾀｶﾅ半角",
    "한국어 텍스트입니다. 안녕하세요! ㄱㄴㄷ ㅏㅑㅓ",
    "مرحبا بالعالم! هذا نص عربي مع أرقام ١٢٣.",
    "שלום עולם! זהו טקסט בעברית.",
    "नमस्ते दुनिया! यह हिंदी पाठ है। क्षत्रिय ज्ञान",
    "বাংলা ভাষা, தமிழ் மொழி, తెలుగు, ಕನ್ನಡ, മലയാളം",
    "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "Tiếng Việt có dấu: Hà Nội, Sài Gòn, người, được, những",
    "Türkçe: İstanbul'da ılık bir gün; ĞÜŞİÖÇ ğüşıöç",
    "Ελληνικά με τόνους: ά έ ή ί ό ύ ώ ΐ ΰ",
    "ქართული ენა, Հայերեն լեզու, ᐃᓄᒃᑎᑐᑦ, ᏣᎳᎩ",
    "e\u0301 a\u0300 o\u0308 n\u0303 combining: Zalgo z\u0336\u0335a\u0337l\u0338g\u0334o",
    "\u1e9b\u0323 \u212b \u2126 \u212a \ufb01 \ufb03 \u2460 \u33a1 decomposing forms",
    "mixed 中文English混合text日本語with한국어 and русский",
    # emoji and symbols
    "I ❤️ 🦙 and 🚀🌕! 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇺🇸🇯🇵 🧑‍💻",
    "😀😃😄😁😆😅😂🤣🥲☺️😊😇🙂🙃😉😌😍🥰😘",
    "∑∫∂√∞≈≠≤≥±×÷ →←↑↓⇒⇔ ∀∃∈∉⊂⊃∪∩ ℕℤℚℝℂ",
    "©®™ §¶ †‡ •·° €£¥₹₽₿ ¢ ‰ ‱ ′″",
    "♠♣♥♦ ★☆ ✓✗ ☐☑ ♪♫ ☀☁☂ ⚡⚽ ♻ ⌘⌥⇧ ⏎",
    "═══╗║╚══ ┌─┐│└─┘ ▀▄█▌▐░▒▓ ■□▲△",
    "🫠🫡🫢🫣🫤🫥 🛜 🩵🩷 🪭🪮🪯 🫎🫏",  # emoji of Unicode 14-15
    # new in Unicode 15 / 15.1, unassigned, private use, controls
    "\u0cf3\u0ece \u2ffc\u2ffd \u31ef \U00011f04\U00011f05\U00011f34 \U0001e4d0\U0001e4ec\U0001e4f0",
    "\U00031350\U00031351 \U0002ebf0\U0002ebf1 \U0001d2c0\U0001d2c1 \U00013441\U00013447",
    "\u0378\u0379 \U0002fffe \U000e0080 unassigned \U0010fffd",
    "\ue000\ue001\uf8ff private \U000f0000",
    "\u0000nul \u0007bell \u001b[31mred\u001b[0m \u007fdel \u0080\u009f",
    "    \x1c\x9f|] \x01\x07; {]\x80\x1f <\x1b~. \x0e\xa3 \x10\u00e9t\u00e9",  # bytes some vocabularies lack
    "\u200b zero\u200dwidth\u200cjoiner\ufeffbom\u2060wj \u00ad soft\u00adhyphen",
    "\u202eRTL override\u202c \u200fmark\u200e",
    # punctuation runs
    'Hello!!! What??? Wait... Really?!?! (yes) [no] {maybe} <tag> "quote"',
    "---===+++***###@@@!!!???...,,,;;;:::",
    "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!",
    "a.b,c;d:e!f?g(h)i[j]k{l}m<n>o/p\\q|r`s~t@u#v$w%x^y&z*",
    "。、「」『』【】〈〉《》・…！？（）：；，",
    "Hello , world . How are you ? Fine ! Yes , it ' s ok . I ' m here .",
    " 's 'm 're 've 'll 'd 't ' ' ,",
    # repetition
    "a" * 200,
    "ab" * 100,
    "🦙" * 30,
    "Hello world " * 20,
    "The quick brown fox jumps over the lazy dog. " * 5,
    # long mixed paragraph
    (
        "Mixture-of-Experts models route each token to k of N experts; a 1T-parameter model may "
        "activate only 32B per token. On a CPU with an NVMe SSD, experts are paged in on demand:\n"
        "  * hot experts stay in RAM (LRU cache),\n  * cold ones are read with O_DIRECT at 3.5 GB/s.\n"
        "Результат: 2–5 токенов/с. 结果：每秒2到5个词元。"
    ),
]

SPECIAL_STRINGS = [
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|> user <|im_end|>",
    "<|endoftext|>",
    "text<|endoftext|>more text",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>",
    "<|reserved_special_token_5|> <|finetune_right_pad_id|>",
    "<s>[INST] Hello [/INST] Hi</s>",
    "<s> <s>  </s>",
    "<unk> <pad> <mask>",
    "<|user|>\nQuestion?<|end|>\n<|assistant|>\nAnswer<|end|>",
    "<|user|>  spaced   <|end|>  \n  <|assistant|>",
    "<｜begin▁of▁sentence｜>User: hi<｜end▁of▁sentence｜>",
    "<｜fim▁begin｜>def f():<｜fim▁hole｜>\n<｜fim▁end｜>",
    "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
    "<|start|>assistant<|channel|>final<|message|>Hi<|return|>",
    "<think>\nreasoning\n</think>\n\nanswer",
    '<tool_call>\n{"name": "f"}\n</tool_call>',
    "<|im_start|><|im_start|><|im_end|><|im_end|>",
    "<|im_end",
    "<|im_start|>",
    "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|USER_TOKEN|>hello<|END_OF_TURN_TOKEN|>",
    "<|endoftext|><|endoftext|>",
    "[CLS] [SEP] [MASK] [PAD]",
    "<fim_prefix>x<fim_suffix>y<fim_middle>",
    "ends with special <|endoftext|>",
    # poolside Laguna's chat formats (XS.2 / XS-2.1 and S-2.1): tags between newlines, or run together
    (
        "〈|EOS|〉<system>\n\nYou are helpful.\n</system>\n<user>\nWeather in 東京?\r\n</user>\n<assistant>\n<think>\n"
        "One call.\n</think>\nLet me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
        "<arg_value>東京</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>\n</assistant>\n"
        '<tool_response>\n{"temp": [18, 20]}\n</tool_response>\n<assistant>\n</think>'
    ),
    (
        "〈|EOS|〉<system>You are helpful.</system>\n<user>What's 17*23?</user>\n<assistant><think>17·20=340"
        '</think>391.<tool_call>calc<arg_key>expr</arg_key><arg_value>"17*23"</arg_value></tool_call></assistant>\n'
        "<assistant><think>"
    ),
]

# code point pools for random strings
POOLS = [
    "abcdefghijklmnopqrstuvwxyz",
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789",
    " ",
    "  \t\n\r",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "äöüßéèêàçñøåæœÄÖÜÉÈÊÀÇÑØÅÆŒ",
    "αβγδεζηθικλμνξοπρστυφχψωΑΒΓΔΕΖΗΘ",
    "абвгдежзийклмнопрстуфхцчшщъыьэюяАБВГД",
    "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生",
    "あいうえおかきくけこアイウエオカキクケコ",
    "가나다라마바사아자차카타파하한국어",
    "कखगघङचछजझञटठडढणतथदधनपफबभमयरलवशषसह\u093e\u093f\u0940\u0941\u094d",
    "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
    "\u0300\u0301\u0302\u0303\u0308\u0327\u0336",
    "😀🦙🚀❤️👍🏽🇺🇸👨‍👩‍👧",
    "\u00a0\u2003\u3000\u2028\u0085\u200b\ufeff",
    "٠١٢٣٤٥٦٧٨٩０１２３①½",
    "∑∫√∞≈≠≤≥→⇒∀∃€£¥©®™•…—–“”‘’",
    "\u0cf3\U00011f04\U0001e4d0\U00031350\u2ffc\U0001fa75\u0378\ue000\U000e0080",
    "\u0001\u0007\u001b\u007f\u0080\u009f\u001c\u001f",
]


def random_strings(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        pools = rng.sample(POOLS, rng.randint(1, 4))
        length = rng.choice([1, 2, 3, 5, 8, 13, 21, 40, 80])
        out.append("".join(rng.choice(rng.choice(pools)) for _ in range(length)))
    return out


def llama_cpp_test_inputs(models: Path) -> list[str]:
    """The inputs of llama.cpp's own vocab tests (models/ggml-vocab-*.gguf.inp), deduplicated."""
    seen: dict[str, None] = {}
    for path in sorted(models.glob("ggml-vocab-*.gguf.inp")):
        raw = path.read_text(encoding="utf-8")
        for text in raw.split("\n__ggml_vocab_test__\n"):
            seen.setdefault(text.removesuffix("\n__ggml_vocab_test__"), None)
    return list(seen)


def corpus(models: Path, n_random: int = 70, seed: int = 0) -> list[str]:
    strings = llama_cpp_test_inputs(models) + HAND_WRITTEN + SPECIAL_STRINGS + random_strings(n_random, seed)
    return list(dict.fromkeys(strings))


# --- GGUF patching -------------------------------------------------------------------------
def with_pre(src: Path, pre: str, dst: Path, model: str | None = None) -> None:
    """Copy a vocab-only GGUF with tokenizer.ggml.pre set to `pre` (added if missing) and
    maybe tokenizer.ggml.model set to `model`."""
    data = src.read_bytes()
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    if n_tensors:
        raise SystemExit(f"{src}: has tensors; only vocab-only files can be patched")
    pos, kept = 24, []
    for _ in range(n_kv):
        start = pos
        (key_len,) = struct.unpack_from("<Q", data, pos)
        key = data[pos + 8 : pos + 8 + key_len].decode()
        pos = _skip_value(data, pos + 8 + key_len + 4, struct.unpack_from("<I", data, pos + 8 + key_len)[0])
        if key != "tokenizer.ggml.pre" and not (model and key == "tokenizer.ggml.model"):
            kept.append(data[start:pos])
    for key, value in (("tokenizer.ggml.pre", pre), ("tokenizer.ggml.model", model)):
        if value:
            kept.append(struct.pack("<Q", len(key)) + key.encode() + struct.pack("<IQ", 8, len(value)) + value.encode())
    dst.write_bytes(data[:4] + struct.pack("<IQQ", version, 0, len(kept)) + b"".join(kept))


def _skip_value(data: bytes, pos: int, value_type: int) -> int:
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    if value_type == 8:
        return pos + 8 + struct.unpack_from("<Q", data, pos)[0]
    if value_type == 9:
        item_type, count = struct.unpack_from("<IQ", data, pos)
        pos += 12
        if item_type in sizes:
            return pos + count * sizes[item_type]
        for _ in range(count):
            pos = _skip_value(data, pos, item_type)
        return pos
    return pos + sizes[value_type]


# --- llama.cpp worker (runs in llama-cpp-python's venv) ------------------------------------
def worker() -> None:
    """Reads {"vocab": path, "texts": [...]} lines, answers with llama.cpp's results."""
    import ctypes

    import llama_cpp as L

    quiet = L.llama_log_callback(lambda level, text, user: None)
    L.llama_backend_init()
    L.llama_log_set(quiet, ctypes.c_void_p(0))
    for line in sys.stdin:
        job = json.loads(line)
        params = L.llama_model_default_params()
        params.vocab_only = True
        model = L.llama_model_load_from_file(job["vocab"].encode(), params)
        if not model:
            print(json.dumps({"error": f"llama.cpp cannot load {job['vocab']}"}), flush=True)
            continue
        vocab = L.llama_model_get_vocab(model)
        n_vocab = L.llama_vocab_n_tokens(vocab)

        def tokenize(text: str, add_special: bool, parse_special: bool) -> list[int]:
            raw = text.encode("utf-8")
            size = len(raw) + 16
            while True:
                buf = (L.llama_token * size)()
                n = L.llama_tokenize(vocab, raw, len(raw), buf, size, add_special, parse_special)
                if n >= 0:
                    return list(buf[:n])
                size = -n

        def detokenize(ids: list[int]) -> str:
            arr = (L.llama_token * max(len(ids), 1))(*ids)
            size = 64 + 8 * len(ids)
            while True:
                buf = ctypes.create_string_buffer(size)
                n = L.llama_detokenize(vocab, arr, len(ids), buf, size, False, True)
                if n >= 0:
                    return buf.raw[:n].decode("utf-8", "surrogateescape")
                size = -n

        def piece(token: int, special: bool) -> bytes:
            buf = ctypes.create_string_buffer(256)
            n = L.llama_token_to_piece(vocab, token, buf, 256, 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = L.llama_token_to_piece(vocab, token, buf, -n, 0, special)
            return buf.raw[:n]

        pieces = hashlib.sha256()
        for token in range(n_vocab):
            for special in (True, False):
                p = piece(token, special)
                pieces.update(struct.pack("<I", len(p)) + p)
        bos, eos = L.llama_vocab_bos(vocab), L.llama_vocab_eos(vocab)
        result = {
            "n_vocab": n_vocab,
            "bos": None if bos < 0 else bos,
            "eos": None if eos < 0 else eos,
            "add_bos": bool(L.llama_vocab_get_add_bos(vocab)),
            "add_eos": bool(L.llama_vocab_get_add_eos(vocab)),
            "eog": [t for t in range(n_vocab) if L.llama_vocab_is_eog(vocab, t)],
            "attrs": {
                str(t): int(L.llama_vocab_get_attr(vocab, t))
                for t in range(n_vocab)
                if int(L.llama_vocab_get_attr(vocab, t)) != 4
            },
            "pieces_sha256": pieces.hexdigest(),
            "ids_plain": [],
            "ids_special": [],
            "detok_special": [],
        }
        for text in job["texts"]:
            ids = tokenize(text, True, False)
            special_ids = tokenize(text, False, True)
            result["ids_plain"].append(ids)
            result["ids_special"].append(special_ids)
            detok = detokenize(special_ids)
            result["detok_special"].append(None if detok == text else detok)
        L.llama_model_free(model)
        print(json.dumps(result), flush=True)


class LlamaCpp:
    def __init__(self, python: str):
        self.proc = subprocess.Popen(
            [python, __file__, "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="surrogateescape",
        )

    def run(self, vocab: Path, texts: list[str]) -> dict:
        self.proc.stdin.write(json.dumps({"vocab": str(vocab), "texts": texts}) + "\n")
        self.proc.stdin.flush()
        result = json.loads(self.proc.stdout.readline())
        if "error" in result:
            raise SystemExit(result["error"])
        return result

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


# --- chat templates ----------------------------------------------------------------------------
TEMPLATE_SYSTEM = "You are helpful."
TEMPLATE_USER = "Hello! What's 2+2? 你好"


def llama_cpp_chat_prompts(binary: Path, templates: Path, model: Path) -> dict[str, dict]:
    """{template name: {"source", "ids"}}: the prompt llama.cpp makes with each template, as
    token ids of `model`'s vocabulary, read from llama-completion's --verbose-prompt listing."""
    import re

    out = {}
    for path in sorted(templates.glob("*.jinja")):
        command = [
            str(binary),
            "-m",
            str(model),
            "--jinja",
            "--chat-template-file",
            str(path),
            "-sys",
            TEMPLATE_SYSTEM,
            "-p",
            TEMPLATE_USER,
            "-cnv",
            "-st",
            "-n",
            "1",
            "--verbose-prompt",
            "-t",
            "1",
        ]
        for _ in range(3):  # llama-completion now and then exits before listing the prompt
            run = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace")
            ids = [int(m) for m in re.findall(r"^\S+ I +(\d+) -> '", run.stderr, re.M)]
            if ids:
                out[path.name] = {"source": path.read_text(encoding="utf-8"), "ids": ids}
                break
        else:
            print(f"  llama.cpp renders no prompt with {path.name}; left out")
    return out


# --- chat template cases: Hugging Face's rendering as the reference -----------------------------
CASE_TEMPLATES = [
    "Qwen3.5-4B.jinja",  # the Qwen3.5 family's template (the MoE models' too)
    # poolside's Laguna MoE models: XS.2 (and XS-2.1, thinking off by default), S-2.1 (thinking on)
    "poolside-Laguna-XS.2.jinja",
    "poolside-Laguna-XS-2.1.jinja",
    "poolside-Laguna-S-2.1.jinja",
]
CASE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather forecast for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Paris or 東京"},
                    "days": {"type": "integer", "description": "Number of days"},
                    "fields": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["city"],
            },
        },
    }
]
_SYSTEM_USER = [{"role": "system", "content": TEMPLATE_SYSTEM}, {"role": "user", "content": TEMPLATE_USER}]
_TOOL_TURNS = [
    {"role": "system", "content": TEMPLATE_SYSTEM},
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "What's the weather in Paris and in 東京 for the next 2 days?"},
    {
        "role": "assistant",
        "content": "Let me check both cities.",
        "reasoning_content": "Two cities: two calls.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "arguments": {"city": "Paris", "days": 2, "fields": ["temp", "wind"]},
                },
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "東京", "days": 2}},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": [18, 20], "wind": "light"}'},
    {"role": "tool", "tool_call_id": "call_2", "content": "晴れ, 25°C"},
]
_REASONING_TURNS = [
    {"role": "system", "content": TEMPLATE_SYSTEM},
    {"role": "user", "content": "What is 17 * 23?"},
    {"role": "assistant", "content": "17 × 23 = 391.", "reasoning_content": "17·20 = 340, 17·3 = 51: 391."},
    {"role": "user", "content": "And 391 / 17?"},
]
_ANSWER = {"role": "assistant", "content": "391 / 17 = 23.", "reasoning_content": "The inverse: 23."}
# the reasoning written into the content, as some clients send it back
_THINK_IN_CONTENT = [
    *_REASONING_TURNS[:2],
    {"role": "assistant", "content": "<think>\n17·20 = 340, 17·3 = 51: 391.\n</think>\n\n17 × 23 = 391."},
    _REASONING_TURNS[3],
]
# name -> (messages, tools, add_generation_prompt, template variables). Tool-call arguments are
# dicts, as transformers expects them (it passes an OpenAI-style JSON string through unchanged).
# The cases after the first three follow the branches of the Laguna templates (a default system
# message, an empty one that opts out of it, earlier turns' reasoning kept or dropped
# (preserve_thinking), <think> in the content, later system messages); a template may raise
# on a case (Qwen3.5's on a system message after the first): then the error is recorded.
CHAT_CASES: dict[str, tuple[list[dict], list[dict] | None, bool, dict]] = {
    "thinking": (_SYSTEM_USER, None, True, {"enable_thinking": True}),
    "no-thinking": (_SYSTEM_USER, None, True, {"enable_thinking": False}),
    "tool-call": (_TOOL_TURNS, CASE_TOOLS, True, {"enable_thinking": True}),
    "tool-call-no-thinking": (_TOOL_TURNS, CASE_TOOLS, True, {"enable_thinking": False}),
    "no-system": (_SYSTEM_USER[1:], None, True, {"enable_thinking": True}),
    "no-system-tools": (_SYSTEM_USER[1:], CASE_TOOLS, True, {"enable_thinking": False}),
    "empty-system": ([{"role": "system", "content": ""}, _SYSTEM_USER[1]], None, True, {"enable_thinking": False}),
    "multi-turn": (_REASONING_TURNS, None, True, {"enable_thinking": True}),
    "multi-turn-no-thinking": (_REASONING_TURNS, None, True, {"enable_thinking": False}),
    "preserve-thinking": (_REASONING_TURNS, None, True, {"enable_thinking": False, "preserve_thinking": True}),
    "think-in-content": (_THINK_IN_CONTENT, None, True, {"enable_thinking": True}),
    "no-generation-prompt": ([*_REASONING_TURNS, _ANSWER], None, False, {"enable_thinking": True}),
    "later-system": (
        [*_REASONING_TURNS[:3], {"role": "system", "content": "Answer briefly."}, _REASONING_TURNS[3]],
        None,
        True,
        {"enable_thinking": True},
    ),
}


def hf_render(
    source: str,
    messages: list[dict],
    tools: list[dict] | None = None,
    documents=None,
    add_generation_prompt: bool = False,
    **kwargs,
) -> str:
    """`source` rendered as transformers' apply_chat_template(tokenize=False) renders it
    (utils/chat_template_utils.py): an ImmutableSandboxedEnvironment with trim_blocks and
    lstrip_blocks, the loop-controls extension and `{% generation %}` blocks; a tojson filter
    with ensure_ascii=False, raise_exception and strftime_now; messages, tools and documents
    (None when not given), add_generation_prompt and the other keyword arguments."""
    from datetime import datetime

    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class AssistantTracker(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_generation"), [], [], body).set_lineno(lineno)

        def _generation(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source).render(
        messages=messages, tools=tools, documents=documents, add_generation_prompt=add_generation_prompt, **kwargs
    )


# Reads one JSON job a line: {"template", "messages" (OpenAI format), "tools", "add_generation_prompt",
# "enable_thinking", "kwargs"}; answers {"prompt"} or {"error"}: llama.cpp's chat layer as its
# server uses it (common_chat_msgs_parse_oaicompat, common_chat_templates_apply).
CHAT_DRIVER = r"""
#include "chat.h"
#include <iostream>
#include <string>

int main() {
    std::string line;
    while (std::getline(std::cin, line)) {
        common_json out = common_json::object();
        try {
            auto job = common_json::parse(line);
            auto tmpls = common_chat_templates_init(nullptr, job.at("template").get<std::string>(), "", "");
            common_chat_templates_inputs inputs;
            inputs.messages = common_chat_msgs_parse_oaicompat(job.at("messages"));
            if (job.contains("tools")) {
                inputs.tools = common_chat_tools_parse_oaicompat(job.at("tools"));
            }
            inputs.add_generation_prompt = job.at("add_generation_prompt").get<bool>();
            inputs.enable_thinking = job.at("enable_thinking").get<bool>();
            for (const auto & [key, value] : job.at("kwargs").items()) {
                inputs.chat_template_kwargs[key] = value.dump();
            }
            out["prompt"] = common_chat_templates_apply(tmpls.get(), inputs).prompt;
        } catch (const std::exception & e) {
            out["error"] = std::string(e.what());
        }
        std::cout << out.dump() << std::endl;
    }
}
"""


def openai_messages(messages: list[dict]) -> list[dict]:
    """`messages` with tool-call arguments as JSON strings, as OpenAI's API sends them."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [
                {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": json.dumps(c["function"]["arguments"], ensure_ascii=False),
                    },
                }
                for c in m["tool_calls"]
            ]
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


def llama_cpp_chat_renders(src: Path, bin_dir: Path, jobs: list[dict], tmp: Path) -> list[str | None]:
    """llama.cpp's prompt for each job (None where it raises), from CHAT_DRIVER compiled against
    the llama.cpp source `src` and the shared libraries of its build in `bin_dir`."""
    (tmp / "chat_driver.cpp").write_text(CHAT_DRIVER)
    exe = tmp / "chat_driver"
    build = subprocess.run(
        [
            "g++",
            "-std=c++17",
            "-O1",
            f"-I{src / 'common'}",
            f"-I{src / 'include'}",
            f"-I{src / 'ggml' / 'include'}",
            f"-I{src / 'vendor'}",
            str(tmp / "chat_driver.cpp"),
            "-o",
            str(exe),
            f"-L{bin_dir}",
            "-lllama-common",
            "-lllama",
            "-lggml",
            "-lggml-base",
            f"-Wl,-rpath,{bin_dir}",
        ],
        capture_output=True,
        text=True,
    )
    if build.returncode:
        print(f"  cannot build the llama.cpp chat driver; llama.cpp's renders left out:\n{build.stderr[-2000:]}")
        return [None] * len(jobs)
    lines = "".join(json.dumps(job, ensure_ascii=False) + "\n" for job in jobs)
    run = subprocess.run([str(exe)], input=lines, capture_output=True, text=True, encoding="utf-8")
    out = []
    for job, line in zip(jobs, run.stdout.splitlines()):
        answer = json.loads(line)
        if "error" in answer:
            print(f"  llama.cpp raises for {job['name']}: {answer['error']}")
        out.append(answer.get("prompt"))
    return out + [None] * (len(jobs) - len(out))


def hf_worker() -> None:
    """Reads {"source", "messages", "tools", "add_generation_prompt", "variables"} lines, answers
    {"text"} or {"error"}, and "version": transformers' own apply_chat_template steps
    (_normalize_chat_messages, render_jinja_template), in a Python that has transformers."""
    import transformers
    from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

    for line in sys.stdin:
        job = json.loads(line)
        try:
            rendered, _ = render_jinja_template(
                conversations=[_normalize_chat_messages(job["messages"])],
                tools=job["tools"],
                chat_template=job["source"],
                add_generation_prompt=job["add_generation_prompt"],
                **job["variables"],
            )
            answer = {"text": rendered[0]}
        except Exception as e:  # noqa: BLE001 - reported to the caller, who compares
            answer = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps({**answer, "version": transformers.__version__}, ensure_ascii=False), flush=True)


def transformers_renders(python: str, jobs: list[dict]) -> tuple[str | None, list[dict]]:
    """(transformers' version, its answer to each job) from hf_worker in `python`; (None, [])
    when that Python cannot run it."""
    if not Path(python).exists():
        print(f"  {python} not found: the rendering is not checked against transformers itself")
        return None, []
    lines = "".join(json.dumps(job, ensure_ascii=False) + "\n" for job in jobs)
    run = subprocess.run(
        [python, __file__, "--hf-worker"], input=lines, capture_output=True, text=True, encoding="utf-8"
    )
    answers = [json.loads(line) for line in run.stdout.splitlines()]
    if run.returncode or len(answers) != len(jobs):
        print(f"  transformers' renderer failed in {python}; not checked against it:\n{run.stderr[-2000:]}")
        return None, []
    return answers[0]["version"], answers


def chat_cases(models: Path, bin_dir: Path, hf_python: str) -> tuple[dict[str, str], dict[str, dict], dict]:
    """({template name: source}, {case name: case}, check) for every CASE_TEMPLATES x CHAT_CASES:
    the conversation, the text transformers renders ("text"; None where the template raises, with
    the message in "error") and llama.cpp's ("llama_cpp", from the same conversation with
    OpenAI-style JSON-string arguments; None where it raises or cannot be had). `check` says
    which cases transformers itself (run in `hf_python`) renders otherwise than hf_render."""
    import jinja2

    sources = {name: (models / "templates" / name).read_text(encoding="utf-8") for name in CASE_TEMPLATES}
    cases, jobs, hf_jobs = {}, [], []
    for template, source in sources.items():
        for case, (messages, tools, add_generation_prompt, variables) in CHAT_CASES.items():
            name = f"{Path(template).stem}:{case}"
            try:
                text, error = (
                    hf_render(source, messages, tools=tools, add_generation_prompt=add_generation_prompt, **variables),
                    None,
                )
            except jinja2.TemplateError as e:
                text, error = None, str(e)
            cases[name] = {
                "template": template,
                "messages": messages,
                "tools": tools,
                "add_generation_prompt": add_generation_prompt,
                "variables": variables,
                "text": text,
            }
            if error is not None:
                cases[name]["error"] = error
                print(f"  the template raises for {name}: {error}")
            job = {
                "name": name,
                "template": source,
                "messages": openai_messages(messages),
                "add_generation_prompt": add_generation_prompt,
                "enable_thinking": variables.get("enable_thinking", True),
                "kwargs": variables,
            }
            if tools:
                job["tools"] = tools
            jobs.append(job)
            hf_jobs.append(
                {
                    "source": source,
                    "messages": messages,
                    "tools": tools,
                    "add_generation_prompt": add_generation_prompt,
                    "variables": variables,
                }
            )
    with tempfile.TemporaryDirectory() as tmp:
        renders = llama_cpp_chat_renders(models.parent, bin_dir, jobs, Path(tmp))
    for case, render in zip(cases.values(), renders):
        case["llama_cpp"] = render
    differ = [
        name
        for name, case in cases.items()
        if case["llama_cpp"] != case["text"] and (case["llama_cpp"] is not None or case["text"] is None)
    ]
    missing = [name for name, case in cases.items() if case["llama_cpp"] is None and case["text"] is not None]
    print(
        f"chat cases: {len(cases)} rendered as transformers does ({sum(c['text'] is None for c in cases.values())} "
        f"raise); llama.cpp's text differs for {differ or 'none'}"
        f"{f', is missing for {missing}' if missing else ''}"
    )

    version, answers = transformers_renders(hf_python, hf_jobs)
    check = {"transformers": version, "differ": []}
    for (name, case), answer in zip(cases.items(), answers):
        same = answer.get("text") == case["text"] and (
            case["text"] is not None or case["error"] in answer.get("error", "")
        )
        if not same:
            check["differ"].append(name)
    if version:
        print(f"chat cases: transformers {version}'s apply_chat_template differs for {check['differ'] or 'none'}")
    return sources, cases, check


def compare_chat_cases(sources: dict[str, str], cases: dict[str, dict]) -> list[str]:
    """The cases whose text swapmoe's ChatTemplate renders differently (dict or JSON-string arguments)."""
    import swapmoe
    from swapmoe.runtime.chat import ChatTemplate
    from swapmoe.runtime.tokenizer import Tokenizer

    differ = []
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "m.gguf"
        swapmoe.synth(model, progress=False)
        tok = Tokenizer.from_gguf(model)
        for name, case in cases.items():
            template = ChatTemplate(tok, sources[case["template"]])
            extra = {"tools": case["tools"]} if case["tools"] else {}
            want = case["text"] if case["text"] is not None else case["error"]
            for messages in (case["messages"], openai_messages(case["messages"])):
                try:
                    ours = template.render(messages, case["add_generation_prompt"], **extra, **case["variables"])
                except swapmoe.SwapmoeError as e:
                    ours = str(e)
                if ours != want:
                    differ.append(name)
                    break
    print(f"chat cases: swapmoe's text differs for {differ or 'none'}")
    return differ


# --- comparison ------------------------------------------------------------------------------
def pieces_sha256(tok) -> str:
    """Hash of every token's piece, with and without special, as the worker hashes llama.cpp's."""
    pieces = hashlib.sha256()
    for token in range(tok.n_vocab):
        for special in (True, False):
            piece = tok.token_bytes(token, special)
            pieces.update(struct.pack("<I", len(piece)) + piece)
    return pieces.hexdigest()


def compare(tok, texts: list[str], expected: dict) -> dict[str, int]:
    """Mismatch counts of swapmoe's tokenizer against llama.cpp's results (as tests do)."""
    counts = {"strings": len(texts), "ids_plain": 0, "ids_special": 0, "decode": 0, "vocab": 0}
    for i, text in enumerate(texts):
        if tok.encode(text, add_special=True, parse_special=False) != expected["ids_plain"][i]:
            counts["ids_plain"] += 1
        if tok.encode(text, add_special=False, parse_special=True) != expected["ids_special"][i]:
            counts["ids_special"] += 1
        want = expected["detok_special"][i]
        if tok.decode(expected["ids_special"][i], special=True) != (text if want is None else want):
            counts["decode"] += 1
    vocab_facts = {
        "bos": tok.bos_id,
        "eos": tok.eos_id,
        "add_bos": tok.add_bos,
        "add_eos": tok.add_eos,
        "eog": tok.eot_ids,
        "pieces_sha256": pieces_sha256(tok),
        "attrs": {str(t): a for t, a in enumerate(tok.attrs) if a != 4},
    }
    counts["vocab"] = sum(vocab_facts[k] != expected[k] for k in vocab_facts)
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=Path, default=REF / "src" / "models", help="llama.cpp's models/ folder")
    ap.add_argument("--llama-python", default=str(REF / "venv" / "bin" / "python"))
    ap.add_argument("--llama-completion", type=Path, default=REF / "llama-build" / "bin" / "llama-completion")
    ap.add_argument("--check", action="store_true", help="compare with llama.cpp live; write nothing")
    ap.add_argument("--random", type=int, default=0, help="with --check: this many more random strings")
    ap.add_argument("--only", nargs="*", help="configurations to run (default all)")
    ap.add_argument(
        "--chat-cases",
        action="store_true",
        help='only the chat template cases: (re)write the "cases" of templates.json.zst, keep the rest',
    )
    ap.add_argument(
        "--hf-python",
        default="/tmp/hfvenv/bin/python",
        help="a Python with transformers, to check the chat cases' rendering against it (optional)",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hf-worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker()
    if a.hf_worker:
        return hf_worker()

    import zstandard

    from swapmoe.gguf_file import open_gguf
    from swapmoe.runtime.tokenizer import Tokenizer

    case_sources, cases, case_check = chat_cases(a.models, a.llama_completion.parent, a.hf_python)
    compare_chat_cases(case_sources, cases)
    if a.chat_cases:
        if not a.check:
            target = OUT / "templates.json.zst"
            blob = json.loads(zstandard.ZstdDecompressor().decompress(target.read_bytes()))
            blob.update(case_sources=case_sources, cases=cases, case_check=case_check)
            blob = json.dumps(blob, ensure_ascii=False).encode()
            target.write_bytes(zstandard.ZstdCompressor(level=19).compress(blob))
            print(f"wrote {target}")
        return

    texts = corpus(a.models)
    if a.check and a.random:
        texts += random_strings(a.random, seed=12345)
    llama = LlamaCpp(a.llama_python)
    expected_all, totals = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (stem, pre) in CONFIGS.items():
            if a.only and name not in a.only:
                continue
            vocab = a.models / f"ggml-vocab-{stem}.gguf"
            if pre:
                patched = Path(tmp) / f"{name}.gguf"
                with_pre(vocab, pre, patched, MODEL_OVERRIDES.get(name))
                vocab = patched
            expected = llama.run(vocab, texts)
            counts = compare(Tokenizer(open_gguf(vocab).metadata(), name), texts, expected)
            totals[name] = counts
            print(f"{name:22s} {counts}", flush=True)
            expected_all[name] = {"vocab": stem, "pre": pre, "model": MODEL_OVERRIDES.get(name), **expected}
    llama.close()
    bad = {name: c for name, c in totals.items() if any(v for k, v in c.items() if k != "strings")}
    print(f"{len(totals)} configurations x {len(texts)} strings; mismatches in: {bad or 'none'}")

    import datetime

    import swapmoe
    from swapmoe.runtime.chat import apply_chat_template

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "m.gguf"
        swapmoe.synth(model, progress=False)
        today = datetime.date.today().isoformat()
        prompts = llama_cpp_chat_prompts(a.llama_completion, a.models / "templates", model)
        tok = Tokenizer.from_gguf(model)
        messages = [{"role": "system", "content": TEMPLATE_SYSTEM}, {"role": "user", "content": TEMPLATE_USER}]
        differ = []
        for name, prompt in prompts.items():
            try:
                ours = tok.encode(apply_chat_template(tok, messages, template=prompt["source"]))
            except swapmoe.SwapmoeError as e:
                ours = str(e)
            if ours != prompt["ids"]:
                differ.append(name)
        print(f"chat templates: {len(prompts)} rendered by llama.cpp; prompts differ for {differ or 'none'}")
    if a.check:
        return

    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "vocab").mkdir(exist_ok=True)
    (OUT / "corpus.json").write_text(json.dumps(texts, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    blob = json.dumps(expected_all, separators=(",", ":")).encode()
    (OUT / "expected.json.zst").write_bytes(zstandard.ZstdCompressor(level=19).compress(blob))
    blob = json.dumps(
        {
            "date": today,
            "system": TEMPLATE_SYSTEM,
            "user": TEMPLATE_USER,
            "templates": prompts,
            "differ": differ,
            "case_sources": case_sources,
            "cases": cases,
            "case_check": case_check,
        },
        ensure_ascii=False,
    ).encode()
    (OUT / "templates.json.zst").write_bytes(zstandard.ZstdCompressor(level=19).compress(blob))
    for stem in sorted({stem for name, (stem, _) in CONFIGS.items() if name in expected_all}):
        target = OUT / "vocab" / f"ggml-vocab-{stem}.gguf.zst"
        if not target.exists():
            data = (a.models / f"ggml-vocab-{stem}.gguf").read_bytes()
            target.write_bytes(zstandard.ZstdCompressor(level=19, threads=-1).compress(data))
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"wrote {OUT} ({total / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
