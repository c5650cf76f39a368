"""Text <-> token ids from a GGUF's own vocabulary, giving exactly llama.cpp's token ids.

`Tokenizer.from_gguf(path)` reads the `tokenizer.*` metadata and follows llama.cpp's
llama-vocab.cpp / unicode.cpp step by step:

1. Special tokens (control, user-defined and unknown tokens) are cut out of the text first,
   longest first, as `tokenizer_st_partition` does (control tokens only with parse_special).
2. BPE vocabularies (`tokenizer.ggml.model == "gpt2"`): each remaining piece is split into
   words by the pre-tokenizer named by `tokenizer.ggml.pre`. llama.cpp's hand-written
   splitters (gpt-2, llama3, qwen2, qwen35, ...) are ported line by line; its std::regex
   rules are run with Python's `re` on the same "collapsed" text llama.cpp matches (every
   non-ASCII code point replaced by one byte standing for its Unicode category), so
   llama.cpp's quirks (e.g. no upper/lower case outside ASCII in `\\p{Lu}`) carry over.
   The words' bytes are then merged by the `tokenizers` library's BPE, which applies merges
   in the same order as llama.cpp (lowest rank first, leftmost first).
3. SentencePiece vocabularies (`"llama"`): llama.cpp's score-driven merge loop, implemented
   here (the `tokenizers` models do not merge by token score), with `<0xXX>` byte fallback.

Decoding follows `llama_token_to_piece` / `llama_detokenize`; `decoder()` streams text that
only ever contains whole UTF-8 characters. See docs/tokenizer.md for what was checked.
"""

from __future__ import annotations

import codecs
import heapq
import os
import re
import unicodedata
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from swapmoe.errors import SwapmoeError
from swapmoe.gguf_file import GGUFFile, open_gguf

# --------------------------------------------------------------------------------------
# Unicode classes, as llama.cpp's unicode-data.cpp has them
# --------------------------------------------------------------------------------------
# One bit per category group (llama.cpp's unicode_cpt_flags). Every code point has exactly
# one category bit (unassigned ones UNDEFINED), so flags are 0 only past the end of a word.
UNDEFINED, NUMBER, LETTER, SEPARATOR, MARK, PUNCTUATION, SYMBOL, CONTROL = 1, 2, 4, 8, 16, 32, 64, 128
WHITESPACE = 256
_CATEGORY_FLAGS = {
    "Cn": UNDEFINED,
    "Cc": CONTROL,
    "Cf": CONTROL,
    "Co": CONTROL,
    "Cs": CONTROL,
    "Ll": LETTER,
    "Lm": LETTER,
    "Lo": LETTER,
    "Lt": LETTER,
    "Lu": LETTER,
    "Mc": MARK,
    "Me": MARK,
    "Mn": MARK,
    "Nd": NUMBER,
    "Nl": NUMBER,
    "No": NUMBER,
    "Pc": PUNCTUATION,
    "Pd": PUNCTUATION,
    "Pe": PUNCTUATION,
    "Pf": PUNCTUATION,
    "Pi": PUNCTUATION,
    "Po": PUNCTUATION,
    "Ps": PUNCTUATION,
    "Sc": SYMBOL,
    "Sk": SYMBOL,
    "Sm": SYMBOL,
    "So": SYMBOL,
    "Zl": SEPARATOR,
    "Zp": SEPARATOR,
    "Zs": SEPARATOR,
}
# llama.cpp's whitespace set (\s); unlike str.isspace() it leaves out U+001C..U+001F.
_WHITESPACE = frozenset(
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
    "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
# llama.cpp's tables are Unicode 15.1; Python 3.11's unicodedata is 14.0. These are the code
# points assigned in between (first, last, flag), so that both agree whatever Python runs.
_ASSIGNED_AFTER_UNICODE_14 = (
    (0x0CF3, 0x0CF3, MARK),
    (0x0ECE, 0x0ECE, MARK),
    (0x2FFC, 0x2FFF, SYMBOL),
    (0x31EF, 0x31EF, SYMBOL),
    (0x10EFD, 0x10EFF, MARK),
    (0x1123F, 0x11240, LETTER),
    (0x11241, 0x11241, MARK),
    (0x11B00, 0x11B09, PUNCTUATION),
    (0x11F00, 0x11F01, MARK),
    (0x11F02, 0x11F02, LETTER),
    (0x11F03, 0x11F03, MARK),
    (0x11F04, 0x11F10, LETTER),
    (0x11F12, 0x11F33, LETTER),
    (0x11F34, 0x11F3A, MARK),
    (0x11F3E, 0x11F42, MARK),
    (0x11F43, 0x11F4F, PUNCTUATION),
    (0x11F50, 0x11F59, NUMBER),
    (0x1342F, 0x1342F, LETTER),
    (0x13439, 0x1343F, CONTROL),
    (0x13440, 0x13440, MARK),
    (0x13441, 0x13446, LETTER),
    (0x13447, 0x13455, MARK),
    (0x1B132, 0x1B132, LETTER),
    (0x1B155, 0x1B155, LETTER),
    (0x1D2C0, 0x1D2D3, NUMBER),
    (0x1DF25, 0x1DF2A, LETTER),
    (0x1E030, 0x1E06D, LETTER),
    (0x1E08F, 0x1E08F, MARK),
    (0x1E4D0, 0x1E4EB, LETTER),
    (0x1E4EC, 0x1E4EF, MARK),
    (0x1E4F0, 0x1E4F9, NUMBER),
    (0x1F6DC, 0x1F6DC, SYMBOL),
    (0x1F774, 0x1F776, SYMBOL),
    (0x1F77B, 0x1F77F, SYMBOL),
    (0x1F7D9, 0x1F7D9, SYMBOL),
    (0x1FA75, 0x1FA77, SYMBOL),
    (0x1FA87, 0x1FA88, SYMBOL),
    (0x1FAAD, 0x1FAAF, SYMBOL),
    (0x1FABB, 0x1FABD, SYMBOL),
    (0x1FABF, 0x1FABF, SYMBOL),
    (0x1FACE, 0x1FACF, SYMBOL),
    (0x1FADA, 0x1FADB, SYMBOL),
    (0x1FAE8, 0x1FAE8, SYMBOL),
    (0x1FAF7, 0x1FAF8, SYMBOL),
    (0x2B739, 0x2B739, LETTER),
    (0x31350, 0x323AF, LETTER),
    (0x2EBF0, 0x2EE5D, LETTER),
)


class _CharFlags(dict):
    """char -> llama.cpp flags, filled on first use (a text touches few distinct characters)."""

    def __missing__(self, char: str) -> int:
        code = ord(char)
        flags = _CATEGORY_FLAGS[unicodedata.category(char)]
        for first, last, newer_flag in _ASSIGNED_AFTER_UNICODE_14:
            if first <= code <= last:
                flags = newer_flag
        if char in _WHITESPACE:
            flags |= WHITESPACE
        self[char] = flags
        return flags


_CHAR_FLAGS = _CharFlags()

# llama.cpp matches its std::regex rules against a "collapsed" copy of the text: ASCII stays,
# other whitespace becomes \v, and every other code point one byte naming its category.
# In the rules each \p{..} becomes that byte plus the ASCII members of the category.
_COLLAPSED_CATEGORY = {NUMBER: "\xd1", LETTER: "\xd2", PUNCTUATION: "\xd3", MARK: "\xd4", SYMBOL: "\xd5"}
_COLLAPSED_OTHER = "\xd0"
_CATEGORY_PATTERNS = {
    "\\p{N}": ("\xd1", "0-9"),
    "\\p{L}": ("\xd2", "A-Za-z"),
    "\\p{Lu}": ("\xd2", "A-Za-z"),
    "\\p{Ll}": ("\xd2", "A-Za-z"),
    "\\p{Lt}": ("\xd2", "A-Za-z"),
    "\\p{Lm}": ("\xd2", "A-Za-z"),
    "\\p{Lo}": ("\xd2", "A-Za-z"),
    "\\p{P}": ("\xd3", "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"),
    "\\p{M}": ("\xd4", ""),
    "\\p{S}": ("\xd5", "\\$\\+<->^`\\|\\~"),
}


class _CollapsedChars(dict):
    """Code point -> its collapsed character, for str.translate."""

    def __missing__(self, code: int) -> str:
        char = chr(code)
        flags = _CHAR_FLAGS[char]
        if code < 128:
            collapsed = char
        elif flags & WHITESPACE:
            collapsed = "\v"
        else:
            collapsed = _COLLAPSED_CATEGORY.get(flags & 0xFF, _COLLAPSED_OTHER)
        self[code] = collapsed
        return collapsed


class _WideChars(dict):
    """Code point -> itself, except non-ASCII whitespace -> \\v: llama.cpp's std::wregex input."""

    def __missing__(self, code: int) -> str:
        char = chr(code)
        wide = "\v" if code >= 128 and _CHAR_FLAGS[char] & WHITESPACE else char
        self[code] = wide
        return wide


_COLLAPSED_CHARS = _CollapsedChars()
_WIDE_CHARS = _WideChars()


def _collapse_pattern(pattern: str) -> str:
    """llama.cpp's rewrite of a rule with \\p{..} classes for the collapsed text (unicode.cpp)."""
    out = []
    inside_brackets = False
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "[" and (i == 0 or pattern[i - 1] != "\\"):
            inside_brackets = True
        elif inside_brackets and char == "]" and pattern[i - 1] != "\\":
            inside_brackets = False
        elif pattern.startswith("\\p{", i) and i + 3 < len(pattern):
            close = pattern.find("}", i + 3)
            category = pattern[i : close + 1] if close != -1 and close <= i + 10 else None
            if category in _CATEGORY_PATTERNS:
                byte, ascii_members = _CATEGORY_PATTERNS[category]
                out.append(byte + ascii_members if inside_brackets else f"[{byte}{ascii_members}]")
                i = close + 1
                continue
        out.append(char)
        i += 1
    return "".join(out)


# --------------------------------------------------------------------------------------
# Pre-tokenizers: text -> words, as llama.cpp's unicode_regex_split
# --------------------------------------------------------------------------------------
# A split step refines a list of (start, end) code point spans of `text`.
Spans = list[tuple[int, int]]


class _WordSpans:
    """Collects the words one splitter finds in one span (llama.cpp's `_add_token`)."""

    __slots__ = ("out", "prev_end")

    def __init__(self, out: Spans, start: int):
        self.out, self.prev_end = out, start

    def add(self, end: int) -> int:
        length = end - self.prev_end
        if length > 0:
            self.out.append((self.prev_end, end))
        self.prev_end = end
        return length


def _ascii_lower(char: str) -> str:
    # llama.cpp lowercases with unicode_tolower; only ASCII letters lowercase to s/t/m/d/r/e/v/l.
    return char.lower() if char < "\x80" else char


def _contraction_end(text: str, pos: int, end: int) -> int:
    """End of a contraction ('s 't 're 've 'm 'll 'd, any case) starting at pos, or 0."""
    if text[pos] == "'" and pos + 1 < end:
        after = _ascii_lower(text[pos + 1])
        if after in "stmd":
            return pos + 2
        if pos + 2 < end and after + _ascii_lower(text[pos + 2]) in ("re", "ve", "ll"):
            return pos + 3
    return 0


def _split_gpt2(text: str, flags: list[int], spans: Spans) -> Spans:
    """'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)
    (llama.cpp's unicode_regex_split_custom_gpt2, case-sensitive contractions)."""
    out: Spans = []
    for start, end in spans:

        def flag(p: int) -> int:
            return flags[p] if p < end else 0

        words = _WordSpans(out, start)
        pos = start
        while pos < end:
            char, char_flags = text[pos], flags[pos]
            if char == "'" and pos + 1 < end:
                after = text[pos + 1]
                if after in "stmd":
                    pos += words.add(pos + 2)
                    continue
                if pos + 2 < end and after + text[pos + 2] in ("re", "ve", "ll"):
                    pos += words.add(pos + 3)
                    continue
            flags2 = flag(pos + 1) if char == " " else char_flags
            if flags2 & LETTER:
                pos += char == " "
                while flags2 & LETTER:
                    pos += 1
                    flags2 = flag(pos)
                words.add(pos)
                continue
            if flags2 & NUMBER:
                pos += char == " "
                while flags2 & NUMBER:
                    pos += 1
                    flags2 = flag(pos)
                words.add(pos)
                continue
            if flags2 and not flags2 & (WHITESPACE | LETTER | NUMBER):
                pos += char == " "
                while flags2 and not flags2 & (WHITESPACE | LETTER | NUMBER):
                    pos += 1
                    flags2 = flag(pos)
                words.add(pos)
                continue
            n_spaces = 0
            while flag(pos + n_spaces) & WHITESPACE:
                n_spaces += 1
            if n_spaces > 1 and pos + n_spaces < end:  # \s+(?!\S): leave the last space to the next word
                pos += n_spaces - 1
            else:
                pos += max(n_spaces, 1)
            words.add(pos)
    return out


def _split_llama3_like(text: str, flags: list[int], spans: Spans, max_digits: int, with_marks: bool) -> Spans:
    """(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,max_digits}|
    ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+ -- llama.cpp's custom splitters for
    llama3 (max_digits 3), qwen2 (1) and qwen35 (1, letters take combining marks, \\p{M})."""
    word_class = LETTER | MARK if with_marks else LETTER
    not_symbol = WHITESPACE | NUMBER | word_class
    out: Spans = []
    for start, end in spans:

        def flag(p: int) -> int:
            return flags[p] if p < end else 0

        words = _WordSpans(out, start)
        pos = start
        while pos < end:
            char, char_flags = text[pos], flags[pos]
            contraction_end = _contraction_end(text, pos, end)
            if contraction_end:
                pos += words.add(contraction_end)
                continue
            # [^\r\n\p{L}\p{N}]?\p{L}+
            if (
                char not in "\r\n"
                and not char_flags & NUMBER
                and (char_flags & word_class or flag(pos + 1) & word_class)
            ):
                pos += 1
                while flag(pos) & word_class:
                    pos += 1
                words.add(pos)
                continue
            # \p{N}{1,max_digits}
            if char_flags & NUMBER:
                if max_digits == 1:
                    pos += 1
                else:
                    first = pos
                    while flag(pos) & NUMBER:
                        pos += 1
                        if pos - first >= max_digits:
                            words.add(pos)
                            first = pos
                words.add(pos)
                continue
            #  ?[^\s\p{L}\p{N}]+[\r\n]*
            flags2 = flag(pos + 1) if char == " " else char_flags
            if not flags2 & not_symbol:
                pos += char == " "
                while flags2 and not flags2 & not_symbol:
                    pos += 1
                    flags2 = flag(pos)
                while pos < end and text[pos] in "\r\n":
                    pos += 1
                words.add(pos)
                continue
            n_spaces = 0
            newline_end = 0
            while flag(pos + n_spaces) & WHITESPACE:
                if text[pos + n_spaces] in "\r\n":
                    newline_end = pos + n_spaces + 1
                n_spaces += 1
            if newline_end:  # \s*[\r\n]+
                pos = newline_end
            elif n_spaces > 1 and pos + n_spaces < end:  # \s+(?!\S)
                pos += n_spaces - 1
            else:  # \s+, or a lone character nothing matched
                pos += max(n_spaces, 1)
            words.add(pos)
    return out


def _is_han(char: str) -> bool:
    """llama.cpp's unicode_cpt_is_han: the CJK ideograph blocks."""
    code = ord(char)
    return (
        0x4E00 <= code <= 0x9FFF
        or 0x3400 <= code <= 0x4DBF
        or 0x20000 <= code <= 0x2EBEF
        or 0xF900 <= code <= 0xFAFF
        or 0x2F800 <= code <= 0x2FA1F
    )


def _split_kimi_k2(text: str, flags: list[int], spans: Spans) -> Spans:
    """Kimi-K2's rules (llama.cpp's unicode_regex_split_custom_kimi_k2): runs of Han characters,
    letter words without Han (upper/lower case not told apart) with an optional contraction,
    \\p{N}{1,3}, then as llama3."""
    out: Spans = []
    for start, end in spans:

        def flag(p: int) -> int:
            return flags[p] if p < end else 0

        def letter(p: int) -> bool:
            return p < end and bool(flags[p] & LETTER) and not _is_han(text[p])

        words = _WordSpans(out, start)
        pos = start
        while pos < end:
            char, char_flags = text[pos], flags[pos]
            if _is_han(char):
                while pos < end and _is_han(text[pos]):
                    pos += 1
                words.add(pos)
                continue
            may_lead = char not in "\r\n" and not char_flags & (LETTER | NUMBER)
            if letter(pos) or (may_lead and letter(pos + 1)):
                pos += may_lead
                has_letters = False
                while letter(pos):
                    has_letters = True
                    pos += 1
                if has_letters or (not may_lead and letter(pos)):
                    if not has_letters:
                        pos += 1
                    while letter(pos):
                        pos += 1
                    if pos < end:
                        pos = _contraction_end(text, pos, end) or pos
                    words.add(pos)
                    continue
                pos -= may_lead
            if char_flags & NUMBER:
                first = pos
                while flag(pos) & NUMBER:
                    pos += 1
                    if pos - first >= 3:
                        words.add(pos)
                        first = pos
                words.add(pos)
                continue
            flags2 = flag(pos + 1) if char == " " else char_flags
            if flags2 and not flags2 & (WHITESPACE | LETTER | NUMBER):
                pos += char == " "
                while flags2 and not flags2 & (WHITESPACE | LETTER | NUMBER):
                    pos += 1
                    flags2 = flag(pos)
                while pos < end and text[pos] in "\r\n":
                    pos += 1
                words.add(pos)
                continue
            n_spaces = 0
            newline_end = 0
            while flag(pos + n_spaces) & WHITESPACE:
                if text[pos + n_spaces] in "\r\n":
                    newline_end = pos + n_spaces + 1
                n_spaces += 1
            if newline_end:
                pos = newline_end
            elif n_spaces > 1 and pos + n_spaces < end:
                pos += n_spaces - 1
            else:
                pos += max(n_spaces, 1)
            words.add(pos)
    return out


def _split_newlines(text: str, flags: list[int], spans: Spans) -> Spans:
    """[^\\n]+|[\\n]+"""
    out: Spans = []
    for start, end in spans:
        out.extend(m.span() for m in _NEWLINE_RUNS.finditer(text, start, end))
    return out


_NEWLINE_RUNS = re.compile(r"[^\n]+|\n+")


def _split_digit_groups(text: str, flags: list[int], spans: Spans) -> Spans:
    """Digit runs cut into groups of three from the right (llama.cpp's AFMoE digit splitter)."""
    out: Spans = []
    for start, end in spans:
        words = _WordSpans(out, start)
        pos = start
        while pos < end:
            if flags[pos] & NUMBER:
                digits_start = pos
                while pos < end and flags[pos] & NUMBER:
                    pos += 1
                cut = digits_start + (pos - digits_start) % 3
                if cut > digits_start:  # llama.cpp glues any text before the digits to this group
                    words.add(cut)
                while cut < pos:
                    cut += 3
                    words.add(cut)
            else:
                pos += 1
        words.add(end)
    return out


class _RegexSplit:
    """One of llama.cpp's std::regex rules. Matches and the text between them become words.

    Rules with \\p{..} classes run on the collapsed text (llama.cpp's std::regex); the others
    on the text with non-ASCII whitespace turned into \\v (its std::wregex). ASCII mode gives
    the C locale's \\s, \\d and \\w that std::regex uses.
    """

    def __init__(self, pattern: str):
        self.collapsed = any(category in pattern for category in _CATEGORY_PATTERNS)
        self.regex = re.compile(_collapse_pattern(pattern) if self.collapsed else pattern, re.ASCII)

    def __call__(self, text: str, flags: list[int], spans: Spans, subjects: dict[str, str]) -> Spans:
        kind = "collapsed" if self.collapsed else "wide"
        if kind not in subjects:
            subjects[kind] = text.translate(_COLLAPSED_CHARS if self.collapsed else _WIDE_CHARS)
        subject = subjects[kind]
        out: Spans = []
        for start, end in spans:
            previous = start
            for match in self.regex.finditer(subject, start, end):
                if match.start() > previous:
                    out.append((previous, match.start()))
                out.append(match.span())
                previous = match.end()
            if previous < end:
                out.append((previous, end))
        return out


# llama.cpp's rules, written as in llama-vocab.cpp (its custom splitters are picked by
# comparing the rule text, as llama.cpp does).
_GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)|\\s+"
)
_QWEN2 = (
    _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)|\\s+"
)
_QWEN35 = (
    _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_NEWLINES = "[^\\n]+|[\\n]+"
_DIGIT_GROUPS = "\\p{AFMoE_digits}"
_KIMI_K2 = "\\p{Han}+"
_TINY_AYA_DIGITS = "\\d{1,3}(?=(?:\\d{3})*\\b)"  # llama.cpp runs its AFMoE digit splitter for it
# words of capitals then small letters, as tokenizer.json writes them (in the collapsed text all
# non-ASCII letters are one class, so llama.cpp does not tell their case apart)
_CASED_WORDS = (
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" + _CONTRACTIONS + "?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" + _CONTRACTIONS + "?"
)
_STARCODER = ["\\p{N}", _GPT2]
# Rules with non-ASCII characters are written with escapes: the characters must stay
# exactly as in llama-vocab.cpp (an editor that normalises Unicode would change some).
_DEEPSEEK_LETTERS = (
    "\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-"
    "\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
    "\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59"
    "\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3"
    "\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d"
    "\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-"
    "\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787"
    "\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f"
    "\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943]+"
)
_CJK_HANGUL = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_CJK_KANA = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_YOUTU_CJK = (
    "[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c"
    "\u3001-\u303f\ufe30-\ufe4f]+|[\u3105-\u312f]+|[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
)
_PORO = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
_DEEPSEEK_V3 = [
    "\\p{N}{1,3}",
    _CJK_KANA,
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]
_GPT4O = [
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" + _CONTRACTIONS + "?"
    "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
]
_RULES: dict[str, list[str]] = {
    "default": ["[\\p{P}\\$\\+<=>\\^~\\|]+", _GPT2, "\\p{N}+", "[0-9][0-9][0-9]"],
    "llama3": [_LLAMA3],
    "deepseek-llm": [
        "[\r\n]",
        _DEEPSEEK_LETTERS,
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        "\\s+$",
        _CJK_HANGUL,
        "\\p{N}+",
    ],
    "deepseek-v3": _DEEPSEEK_V3,
    "deepseek-coder": ["[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", _CJK_HANGUL, "\\p{N}"],
    "falcon": ["[\\p{P}\\$\\+<=>\\^~\\|`]+", _GPT2, "[0-9][0-9][0-9]"],
    "starcoder": _STARCODER,
    "gpt2": [_GPT2],
    "qwen2": [_QWEN2],
    "qwen35": [_QWEN35],
    "poro": [_PORO],
    "viking": [_PORO, "\\p{N}"],
    "tekken": [
        "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+"
        "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*"
        "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ],
    "gpt-4o": _GPT4O,
    "bailingmoe": [
        "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
        "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
    ],
    "seed-coder": [
        _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+"
        "|\\s+(?!\\S)|\\s+",
    ],
    "afmoe": [
        _DIGIT_GROUPS,
        "[\u4e00-\u9fff\u3400-\u4dbf\u8c48-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f\u2f00-\u2fdf"
        "\u0e40-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f\ua9e0-\ua9ff\uac00-\ud7af\u1100-\u11ff]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
        "| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ],
    "laguna": [_NEWLINES, _QWEN2],
    "kimi-k2": [_KIMI_K2],
    "newlines": [_NEWLINES],
    "jais-2": [
        _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"
        "|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)"
        "|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",
    ],
    "ufakzeka": ["[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"],
    "spark2_5": [
        "\\p{N}{1,3}",
        _CJK_KANA,
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
        "| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
        "\\p{N}",
    ],
    "youtu": [
        _YOUTU_CJK,
        _CASED_WORDS + "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ],
    "tiny_aya": [
        _TINY_AYA_DIGITS,
        _CASED_WORDS + "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ],
    "exaone-moe": [
        _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}"
        "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
    ],
    "minicpm5": [
        "\\p{N}{1,3}",
        _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"
        "|\\s+(?!\\S)|\\s+",
    ],
}


@dataclass(frozen=True)
class _PreTokenizer:
    """What llama.cpp does for one `tokenizer.ggml.pre` value."""

    rules: str  # key of _RULES
    ignore_merges: bool = False  # a word that is a whole token is not merged
    clean_spaces: bool = True  # the detokenizer removes the space of " ," " ." " 's" etc.
    add_bos: bool = False  # default of tokenizer.ggml.add_bos_token
    bos_is_null: bool = False  # no default BOS id
    # Gemma 4, Sarvam: spaces become U+2581 and words are merged as UTF-8 text (not GPT-2 byte
    # characters) with <0xXX> byte fallback
    sentencepiece_style: bool = False
    # Gemma 4 only: a newline run that is a token stays whole, and BOS is always added
    gemma4: bool = False


# tokenizer.ggml.pre -> behaviour, from llama_vocab::impl::load.
_P = _PreTokenizer
PRE_TOKENIZERS: dict[str, _PreTokenizer] = {
    "default": _P("default"),
    **{
        name: _P("llama3", ignore_merges=True, add_bos=True)
        for name in (
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        )
    },
    "dbrx": _P("llama3"),
    "smaug-bpe": _P("llama3"),
    "chatglm-bpe": _P("llama3", bos_is_null=True),
    "glm4": _P("llama3", ignore_merges=True, bos_is_null=True),
    "glm5": _P("llama3", ignore_merges=True, bos_is_null=True),
    "deepseek-llm": _P("deepseek-llm", clean_spaces=False),
    "deepseek-coder": _P("deepseek-coder", clean_spaces=False),
    **{name: _P("deepseek-v3", clean_spaces=False) for name in ("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4")},
    "falcon": _P("falcon"),
    **{name: _P("starcoder") for name in ("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2")},
    **{name: _P("starcoder", clean_spaces=False) for name in ("command-r", "smollm")},
    **{
        name: _P("gpt2")
        for name in (
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "mpt",
            "olmo",
            "jais",
            "exaone4",
        )
    },
    **{name: _P("gpt2", clean_spaces=False) for name in ("trillion", "granite-docling")},
    **{
        name: _P("qwen2", clean_spaces=False)
        for name in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open", "grok-2")
    },
    "stablelm2": _P("qwen2"),
    "megrez": _P("qwen2"),
    "qwen35": _P("qwen35", clean_spaces=False),
    "poro-chat": _P("poro", clean_spaces=False),
    "bloom": _P("poro"),
    "gpt3-finnish": _P("poro"),
    "viking": _P("viking", clean_spaces=False),
    "tekken": _P("tekken", ignore_merges=True, clean_spaces=False, add_bos=True),
    **{name: _P("gpt-4o", clean_spaces=False) for name in ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2")},
    **{name: _P("bailingmoe", clean_spaces=False) for name in ("bailingmoe", "bailingmoe2", "llada-moe")},
    "seed-coder": _P("seed-coder", clean_spaces=False),
    "afmoe": _P("afmoe", clean_spaces=False),
    "laguna": _P("laguna", clean_spaces=False),
    "exaone-moe": _P("exaone-moe"),
    "minicpm5": _P("minicpm5", ignore_merges=True),
    "kimi-k2": _P("kimi-k2", clean_spaces=False),
    "gemma4": _P("newlines", sentencepiece_style=True, gemma4=True),
    "sarvam-moe": _P("newlines", clean_spaces=False, sentencepiece_style=True),
    "jais-2": _P("jais-2"),
    "ufakzeka": _P("ufakzeka", clean_spaces=False),
    "spark2_5": _P("spark2_5", clean_spaces=False),
    "youtu": _P("youtu", ignore_merges=True, clean_spaces=False),
    "tiny_aya": _P("tiny_aya", clean_spaces=False),
    "cohere2moe": _P("tiny_aya", clean_spaces=False),
}
del _P

_CUSTOM_SPLITTERS = {
    _GPT2: _split_gpt2,
    _LLAMA3: lambda text, flags, spans: _split_llama3_like(text, flags, spans, max_digits=3, with_marks=False),
    _QWEN2: lambda text, flags, spans: _split_llama3_like(text, flags, spans, max_digits=1, with_marks=False),
    _QWEN35: lambda text, flags, spans: _split_llama3_like(text, flags, spans, max_digits=1, with_marks=True),
    _NEWLINES: _split_newlines,
    _DIGIT_GROUPS: _split_digit_groups,
    _KIMI_K2: _split_kimi_k2,
    _TINY_AYA_DIGITS: _split_digit_groups,
}


class _WordSplitter:
    """Splits text into words by a list of llama.cpp rules, each refining the words of the last."""

    def __init__(self, rules: list[str]):
        self.steps = []
        for rule in rules:
            custom = _CUSTOM_SPLITTERS.get(rule)
            if custom is not None:
                self.steps.append(lambda text, flags, spans, subjects, custom=custom: custom(text, flags, spans))
            else:
                self.steps.append(_RegexSplit(rule))

    def __call__(self, text: str) -> list[str]:
        flags = list(map(_CHAR_FLAGS.__getitem__, text))
        spans: Spans = [(0, len(text))]
        subjects: dict[str, str] = {}  # the collapsed / wide copies of text, made once
        for step in self.steps:
            spans = step(text, flags, spans, subjects)
        return [text[start:end] for start, end in spans]


# --------------------------------------------------------------------------------------
# Vocabulary models
# --------------------------------------------------------------------------------------
def _bytes_to_unicode() -> list[str]:
    """GPT-2's reversible byte -> printable character map of byte-level BPE vocabularies."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in chars:
            chars[byte] = chr(256 + extra)
            extra += 1
    return [chars[byte] for byte in range(256)]


_BYTE_TO_CHAR = _bytes_to_unicode()  # indexable by the ordinals of a latin-1 string: a str.translate table
_CHAR_TO_BYTE = {char: byte for byte, char in enumerate(_BYTE_TO_CHAR)}


class _BpeModel:
    """BPE over words: merges by rank (the `tokenizers` library does the merging). Byte-level
    vocabularies spell each word's UTF-8 bytes with GPT-2's byte characters first; the others
    (Gemma 4) merge the text itself and fall back to <0xXX> byte tokens."""

    def __init__(
        self,
        vocab: dict[str, int],
        merges: list[str],
        ignore_merges: bool,
        byte_level: bool,
        newline_runs_whole: bool,
        source: str,
    ):
        from tokenizers import Tokenizer as HfTokenizer
        from tokenizers.models import BPE

        self.vocab, self.byte_level, self.newline_runs_whole = vocab, byte_level, newline_runs_whole
        # byte characters some vocabularies lack (Falcon: some control bytes)
        self.unknown_chars = frozenset(char for char in _BYTE_TO_CHAR if byte_level and char not in vocab)
        pairs = []
        for merge in merges:
            cut = merge.find(" ", 1)  # as llama.cpp: the first space after the first character
            if cut != -1:
                pairs.append((merge[:cut], merge[cut + 1 :]))
        if len(set(merges)) < len(merges):  # a repeated merge keeps its first rank, as in llama.cpp
            pairs = list(dict.fromkeys(pairs))
        try:
            self.hf = HfTokenizer(BPE(vocab, pairs, ignore_merges=ignore_merges, byte_fallback=not byte_level))
        except Exception as e:  # tokenizers reports merges of unknown tokens, invalid text, ...
            raise SwapmoeError(f"{source}: cannot build the BPE vocabulary ({e})") from None

    def tokenize(self, words: list[str]) -> list[int]:
        pieces: list[str | int] = []  # words to merge, and token ids taken as they are
        for word in words:
            if self.byte_level:
                word = word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_BYTE_TO_CHAR)
                if self.unknown_chars and not self.unknown_chars.isdisjoint(word):
                    pieces += self._around_unknown_chars(word)
                    continue
            elif self.newline_runs_whole and not word.strip("\n") and word in self.vocab:
                # Gemma 4: a run of newlines that is a token is taken whole (llama.cpp PR 21343)
                pieces.append(self.vocab[word])
                continue
            pieces.append(word)
        ids: list[int] = []
        batch: list[str] = []
        for piece in pieces:  # merge the words between fixed ids in one call
            if isinstance(piece, str):
                batch.append(piece)
            else:
                ids += self._merge(batch)
                ids.append(piece)
                batch = []
        return ids + self._merge(batch)

    def _around_unknown_chars(self, word: str) -> list[str | int]:
        """A character missing from the vocabulary never merges, so the text on either side is
        merged apart; llama.cpp then looks up each byte of its UTF-8 spelling as a token."""
        pieces: list[str | int] = []
        start = 0
        for i, char in enumerate(word):
            if char in self.unknown_chars:
                if i > start:
                    pieces.append(word[start:i])
                for byte in char.encode("utf-8"):
                    token_id = self.vocab.get(bytes([byte]).decode("utf-8", "surrogateescape"))
                    if token_id is not None:
                        pieces.append(token_id)
                start = i + 1
        if start < len(word):
            pieces.append(word[start:])
        return pieces

    def _merge(self, words: list[str]) -> list[int]:
        if not words:
            return []
        return self.hf.encode(words, is_pretokenized=True, add_special_tokens=False).ids


class _SpmModel:
    """llama.cpp's SentencePiece tokenizer (llm_tokenizer_spm): starting from single characters,
    repeatedly merge the adjacent pair whose concatenation is the vocabulary token with the
    highest score (leftmost on ties); characters left over become <0xXX> byte tokens."""

    def __init__(self, token_ids: dict[str, int], scores: list[float], source: str):
        self.token_ids, self.scores, self.source = token_ids, scores, source

    def byte_token(self, byte: int) -> int:
        token_id = self.token_ids.get(f"<0x{byte:02X}>")
        if token_id is None:  # llama.cpp then tries the byte itself as a token
            token_id = self.token_ids.get(bytes([byte]).decode("utf-8", "surrogateescape"))
        if token_id is None:
            raise SwapmoeError(f"{self.source}: the vocabulary has no token for byte 0x{byte:02X}")
        return token_id

    def tokenize(self, text: str) -> list[int]:
        n = len(text)
        if not n:
            return []
        # symbol i covers text[start[i]:start[i] + size[i]]; merged-away symbols have size 0
        start = list(range(n))
        size = [1] * n
        prev = list(range(-1, n - 1))
        next_ = [*range(1, n), -1]
        queue: list[tuple[float, int, int, int]] = []

        def push_pair(left: int, right: int) -> None:
            if left == -1 or right == -1:
                return
            merged_size = size[left] + size[right]
            token_id = self.token_ids.get(text[start[left] : start[left] + merged_size])
            if token_id is not None:
                heapq.heappush(queue, (-self.scores[token_id], left, right, merged_size))

        for i in range(1, n):
            push_pair(i - 1, i)
        while queue:
            _, left, right, merged_size = heapq.heappop(queue)
            if not size[left] or not size[right] or size[left] + size[right] != merged_size:
                continue  # one side changed since this pair was queued
            size[left] = merged_size
            size[right] = 0
            next_[left] = next_[right]
            if next_[right] >= 0:
                prev[next_[right]] = left
            push_pair(prev[left], left)
            push_pair(left, next_[left])

        ids = []
        i = 0
        while i != -1:
            piece = text[start[i] : start[i] + size[i]]
            token_id = self.token_ids.get(piece)
            if token_id is not None:
                ids.append(token_id)
            else:
                ids.extend(self.byte_token(byte) for byte in piece.encode("utf-8", "surrogatepass"))
            i = next_[i]
        return ids


# --------------------------------------------------------------------------------------
# Token attributes and special tokens (llama_vocab::impl::load)
# --------------------------------------------------------------------------------------
# llama_token_attr bits
ATTR_UNKNOWN, ATTR_UNUSED, ATTR_NORMAL, ATTR_CONTROL, ATTR_USER_DEFINED, ATTR_BYTE = 1, 2, 4, 8, 16, 32
ATTR_LSTRIP, ATTR_RSTRIP = 128, 256
# tokenizer.ggml.token_type values -> attributes
_TOKEN_TYPE_ATTRS = {
    0: 0,
    1: ATTR_NORMAL,
    2: ATTR_UNKNOWN,
    3: ATTR_CONTROL,
    4: ATTR_USER_DEFINED,
    5: ATTR_UNUSED,
    6: ATTR_BYTE,
}
_SPECIAL_ATTRS = ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN  # cut out of the text before splitting
_HIDDEN_ATTRS = ATTR_CONTROL | ATTR_UNKNOWN  # decoded to "" unless special=True

# Special-token ids: metadata key and llama.cpp's lookup by text when the key is absent.
_SPECIAL_ID_KEYS = [
    ("bos", "bos_token_id"),
    ("eos", "eos_token_id"),
    ("eot", "eot_token_id"),
    ("eom", "eom_token_id"),
    ("unk", "unknown_token_id"),
    ("sep", "seperator_token_id"),
    ("pad", "padding_token_id"),
    ("mask", "mask_token_id"),
    ("fim_pre", "fim_pre_token_id"),
    ("fim_suf", "fim_suf_token_id"),
    ("fim_mid", "fim_mid_token_id"),
    ("fim_pad", "fim_pad_token_id"),
    ("fim_rep", "fim_rep_token_id"),
    ("fim_sep", "fim_sep_token_id"),
    ("fim_pre", "prefix_token_id"),
    ("fim_suf", "suffix_token_id"),
    ("fim_mid", "middle_token_id"),  # deprecated
]
_SPECIAL_ID_TEXTS = {
    "eot": (
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|end_of_text|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "<｜end▁of▁sentence｜>",
        "<end_of_utterance>",
    ),
    "eom": ("<|eom_id|>",),
    "fim_pre": (
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ),
    "fim_suf": (
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ),
    "fim_mid": (
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
# Tokens that end generation, recognised by text (llama.cpp issue 9606).
_END_OF_GENERATION_TEXTS = frozenset(
    (
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<|flush|>",
        "<|calls|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "</s>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "[EOS]",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<eos>",
        "<turn|>",
        "<|tool_response>",
        "<｜end▁of▁sentence｜>",
        "[e~[",
    )
)
_C_SPACES = " \t\n\v\f\r"  # isspace() in the C locale: what lstrip/rstrip special tokens eat


class Tokenizer:
    """A GGUF's tokenizer. `Tokenizer.from_gguf(path)`; `encode`, `decode`, `decoder()`."""

    def __init__(self, metadata: dict[str, Any], source: str = "<metadata>"):
        """Build from GGUF metadata (as GGUFFile.metadata() gives it); `source` names it in errors."""
        self.source = source
        model = metadata.get("tokenizer.ggml.model")
        tokens = metadata.get("tokenizer.ggml.tokens")
        if model not in ("gpt2", "llama", "gemma4"):
            raise SwapmoeError(
                f"{source}: tokenizer model {model!r} is not supported "
                "(supported: 'gpt2' byte-level BPE, 'llama' SentencePiece, 'gemma4' BPE)"
            )
        if not tokens:
            raise SwapmoeError(f"{source}: no tokenizer.ggml.tokens in the metadata")
        self.is_spm = model == "llama"
        if "" in tokens:  # llama.cpp names empty tokens so that they stay distinct
            tokens = [text or f"[EMPTY_{token_id}]" for token_id, text in enumerate(tokens)]
        self.tokens: list[str] = tokens
        self.n_vocab = len(tokens)
        self.token_ids = {text: token_id for token_id, text in enumerate(tokens)}
        self.chat_template: str | None = metadata.get("tokenizer.chat_template")

        ids: dict[str, int | None] = dict.fromkeys(name for name, _ in _SPECIAL_ID_KEYS)
        if self.is_spm:
            self.pre = None
            ids.update(bos=1, eos=2, unk=0)
            self.add_bos, self.clean_spaces, self.add_space_prefix = True, False, True
        else:
            pre_name = "gemma4" if model == "gemma4" else metadata.get("tokenizer.ggml.pre") or "default"
            self.pre = PRE_TOKENIZERS.get(pre_name)
            if self.pre is None:
                raise SwapmoeError(
                    f"{source}: pre-tokenizer {pre_name!r} (tokenizer.ggml.pre) is not supported; "
                    f"supported: {', '.join(sorted(PRE_TOKENIZERS))}"
                )
            if model == "gpt2":  # llama.cpp's default ids; gemma4 has none
                ids.update(bos=None if self.pre.bos_is_null else 11, eos=11)
            self.add_bos = self.pre.add_bos
            self.clean_spaces, self.add_space_prefix = self.pre.clean_spaces, False
        self.add_eos = False
        self.add_space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", self.add_space_prefix))

        self.attrs = self._token_attributes(metadata)
        for name, key in _SPECIAL_ID_KEYS:
            if ids[name] is not None and ids[name] >= self.n_vocab:
                ids[name] = None
            value = metadata.get(f"tokenizer.ggml.{key}")
            if value is not None and 0 <= int(value) < self.n_vocab:
                ids[name] = int(value)
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", self.add_bos))
        if self.pre and self.pre.gemma4:
            self.add_bos = True  # llama.cpp overrides Gemma 4's add_bos_token = false (PR 21500)
        self.add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", self.add_eos))
        self._find_special_tokens(ids)
        self.bos_id: int | None = ids["bos"]
        self.eos_id: int | None = ids["eos"]
        if self.add_bos and self.bos_id is None:
            raise SwapmoeError(f"{source}: the tokenizer adds a BOS token but has no BOS token id")
        if self.add_eos and self.eos_id is None:
            raise SwapmoeError(f"{source}: the tokenizer adds an EOS token but has no EOS token id")

        # the special tokens cut out of the text, longest (in bytes) first
        special = [i for i, attr in enumerate(self.attrs) if attr & _SPECIAL_ATTRS]
        self._set_strip_attributes(metadata, special)
        special.sort(key=lambda i: -len(tokens[i].encode("utf-8", "surrogateescape")))
        self._special_tokens = [(tokens[i], i, self.attrs[i]) for i in special]

        if self.is_spm:
            scores = metadata.get("tokenizer.ggml.scores")
            scores = [0.0] * self.n_vocab if scores is None else np.asarray(scores, dtype=np.float64).tolist()
            self._spm = _SpmModel(self.token_ids, scores, source)
        else:
            self._split_words = _WordSplitter(_RULES[self.pre.rules])
            self._merges = metadata.get("tokenizer.ggml.merges") or []
        self._pieces: dict[tuple[int, bool], bytes] = {}

    @cached_property
    def _bpe(self) -> _BpeModel:
        # built on first use: it is most of the loading time, and not needed to decode or to
        # read the chat template and special tokens
        return _BpeModel(
            self.token_ids,
            self._merges,
            self.pre.ignore_merges,
            not self.pre.sentencepiece_style,
            self.pre.gemma4,
            self.source,
        )

    @classmethod
    def from_gguf(cls, gguf: str | os.PathLike | GGUFFile) -> "Tokenizer":
        """The tokenizer of a GGUF model or vocab-only GGUF (of a split model: its first shard's
        metadata), given its path or the already open GGUFFile."""
        g = gguf if isinstance(gguf, GGUFFile) else open_gguf(gguf)
        return cls(g.metadata(), str(g.path))

    # --- loading -----------------------------------------------------------------------
    def _token_attributes(self, metadata: dict[str, Any]) -> list[int]:
        token_types = metadata.get("tokenizer.ggml.token_type")
        if token_types is None:
            return [ATTR_NORMAL] * self.n_vocab
        if len(token_types) < self.n_vocab:
            raise SwapmoeError(f"{self.source}: {len(token_types)} token types for {self.n_vocab} tokens")
        return [_TOKEN_TYPE_ATTRS.get(t, 0) for t in np.asarray(token_types[: self.n_vocab]).tolist()]

    def _make_control(self, token_id: int) -> None:
        # llama.cpp marks tokens it recognises as special by text as control tokens
        self.attrs[token_id] |= ATTR_CONTROL

    def _find_special_tokens(self, ids: dict[str, int | None]) -> None:
        """llama.cpp's detection of EOT/EOM/FIM tokens by text and of the end-of-generation set.
        (llama.cpp scans a hash map; where several texts of one kind exist, the lowest id wins here.)"""
        for name, texts in _SPECIAL_ID_TEXTS.items():
            if ids[name] is None:
                found = [self.token_ids[text] for text in texts if text in self.token_ids]
                if found:
                    ids[name] = min(found)
                    self._make_control(ids[name])
        for token_id, attr in enumerate(self.attrs):
            if attr & ATTR_CONTROL and "unused" in self.tokens[token_id]:
                self.attrs[token_id] |= ATTR_UNUSED

        end_ids = {ids[name] for name in ("fim_pad", "fim_rep", "fim_sep") if ids[name] is not None}
        for text in _END_OF_GENERATION_TEXTS & self.token_ids.keys():
            end_ids.add(self.token_ids[text])
            self._make_control(self.token_ids[text])
        for text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):  # gpt-oss: always rendered
            if text in self.token_ids:
                self.attrs[self.token_ids[text]] = ATTR_USER_DEFINED
        end_ids.update(ids[name] for name in ("eos", "eot", "eom") if ids[name] is not None)

        end_texts = {self.tokens[i] for i in end_ids}
        harmony = {"<|return|>", "<|call|>"} <= end_texts or {"<|calls|>", "<|flush|>"} <= end_texts
        if "<|end|>" in end_texts and harmony:
            # gpt-oss (harmony) and solar-open: <|end|> ends a message, not the generation
            end_id = self.token_ids["<|end|>"]
            end_ids.discard(end_id)
            self.attrs[end_id] = ATTR_USER_DEFINED
        if "</s>" in end_texts and end_texts & {"<|tool_response>", "<|plamo:eos|>"}:
            s_id = self.token_ids["</s>"]
            end_ids.discard(s_id)
            self.attrs[s_id] = ATTR_NORMAL
        self.eot_ids: list[int] = sorted(end_ids)

    def _set_strip_attributes(self, metadata: dict[str, Any], special: list[int]) -> None:
        """Phi-3 special tokens swallow the whitespace after them (llama.cpp, by model name)."""
        name = str(metadata.get("general.name", "")).lower()
        if "phi-3" in name or "phi3" in name:
            for token_id in special:
                self.attrs[token_id] |= ATTR_RSTRIP
            for text, rstrip in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
                if text in self.token_ids:
                    token_id = self.token_ids[text]
                    self.attrs[token_id] = (
                        self.attrs[token_id] | ATTR_RSTRIP if rstrip else self.attrs[token_id] & ~ATTR_RSTRIP
                    )

    # --- encoding ----------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text`, exactly as llama_tokenize. add_special: add BOS/EOS as the model
        asks (tokenizer.ggml.add_bos_token / add_eos_token); parse_special: turn the text of
        control tokens (e.g. "<|im_start|>") into those tokens (user-defined tokens always are)."""
        ids: list[int] = []
        if add_special and self.add_bos:
            ids.append(self.bos_id)
        after_special = True  # SentencePiece adds its space prefix at the start and after special tokens
        for fragment in self._split_special_tokens(text, parse_special) if text else ():
            if isinstance(fragment, int):
                ids.append(fragment)
                after_special = True
            elif self.is_spm:
                if self.add_space_prefix and after_special:
                    fragment = " " + fragment
                ids.extend(self._spm.tokenize(fragment.replace(" ", "\u2581")))
                after_special = False
            else:
                if self.pre.sentencepiece_style:
                    fragment = fragment.replace(" ", "\u2581")
                ids.extend(self._bpe.tokenize(self._split_words(fragment)))
        if add_special and self.add_eos:
            ids.append(self.eos_id)
        return ids

    def _split_special_tokens(self, text: str, parse_special: bool) -> list[str | int]:
        """Text pieces and special token ids, as llama.cpp's tokenizer_st_partition."""
        fragments: list[str | int] = [text]
        for token_text, token_id, attr in self._special_tokens:
            if (not parse_special and attr & _HIDDEN_ATTRS) or token_text not in text:
                continue
            split: list[str | int] = []
            for fragment in fragments:
                if isinstance(fragment, int) or token_text not in fragment:
                    split.append(fragment)
                    continue
                base = 0
                while (match := fragment.find(token_text, base)) != -1:
                    left = fragment[base:match]
                    if attr & ATTR_LSTRIP:
                        left = left.rstrip(_C_SPACES)
                    if left:
                        split.append(left)
                    split.append(token_id)
                    base = match + len(token_text)
                    if attr & ATTR_RSTRIP:
                        while base < len(fragment) and fragment[base] in _C_SPACES:
                            base += 1
                if base < len(fragment):
                    split.append(fragment[base:])
            fragments = split
        return fragments

    # --- decoding ----------------------------------------------------------------------
    def token_bytes(self, token_id: int, special: bool = True) -> bytes:
        """The bytes a token stands for (llama_token_to_piece). Control and unknown tokens are
        empty unless special; a piece may be part of a UTF-8 character."""
        key = (token_id, special)
        piece = self._pieces.get(key)
        if piece is None:
            if not 0 <= token_id < self.n_vocab:
                raise SwapmoeError(f"token id {token_id} is out of range 0..{self.n_vocab - 1}")
            attr, text = self.attrs[token_id], self.tokens[token_id]
            if attr & _HIDDEN_ATTRS and not special:
                piece = b""
            elif attr & _SPECIAL_ATTRS:
                piece = text.encode("utf-8", "surrogateescape")
            elif attr & ATTR_NORMAL:
                if self.is_spm or self.pre.sentencepiece_style:
                    piece = text.replace("\u2581", " ").encode("utf-8", "surrogateescape")
                else:
                    piece = _byte_level_decode(text)
            elif attr & ATTR_BYTE:
                piece = bytes([int(text[3:5], 16)])
            else:  # unused / undefined tokens
                piece = b""
            self._pieces[key] = piece
        return piece

    def decode(self, ids, special: bool = True) -> str:
        """Text of token ids, as llama_detokenize (special: show control tokens' text). As
        llama.cpp, drops the space prefix of the first token and, for the BPE vocabularies that
        ask for it, cleans up spaces before punctuation ("Hello ," -> "Hello,")."""
        text = bytearray()
        for position, token_id in enumerate(ids):
            piece = self.token_bytes(int(token_id), special)
            if position == 0 and self.add_space_prefix and piece.startswith(b" "):
                piece = piece[1:]
            text += piece
        if self.clean_spaces:
            text = _clean_up_spaces(text)
        return text.decode("utf-8", "replace")

    def decoder(self, special: bool = False) -> "StreamDecoder":
        """A streaming decoder for generated tokens: push(id) -> new text (whole UTF-8 characters
        only), flush() at the end. Control tokens are hidden unless special, as in llama.cpp's output."""
        return StreamDecoder(self, special)

    def __repr__(self) -> str:
        kind = "SentencePiece" if self.is_spm else f"BPE, pre-tokenizer {self.pre.rules}"
        return f"Tokenizer({self.source}: {self.n_vocab} tokens, {kind})"


class StreamDecoder:
    """Turns generated token ids into text as they come, holding back the bytes of a UTF-8
    character split across tokens until it is complete."""

    def __init__(self, tokenizer: Tokenizer, special: bool = False):
        self.tokenizer, self.special = tokenizer, special
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self.tokenizer.token_bytes(int(token_id), self.special))

    def flush(self) -> str:
        """Whatever is held back (an incomplete character becomes U+FFFD)."""
        return self._utf8.decode(b"", final=True)


def _byte_level_decode(text: str) -> bytes:
    """A byte-level BPE token's bytes; characters outside GPT-2's byte map are spelt out as
    llama.cpp does ("[UNK_BYTE_0x..]")."""
    out = bytearray()
    for char in text:
        byte = _CHAR_TO_BYTE.get(char)
        if byte is not None:
            out.append(byte)
        else:
            utf8 = char.encode("utf-8", "surrogateescape")
            out += b"[UNK_BYTE_0x" + utf8.hex().encode() + text.encode("utf-8", "surrogateescape") + b"]"
    return bytes(out)


def _clean_up_spaces(text: bytearray) -> bytearray:
    """llama_detokenize's clean_spaces passes, ported as written (in place, on bytes)."""
    space, quote = ord(" "), ord("'")
    # 1: " ?", " !", " .", " ," lose the space
    total1 = len(text)
    total = 1 if total1 else 0
    for i in range(1, total1):
        x = text[i]
        if text[i - 1] == space and x in b"?!.,":
            total -= 1
        text[total] = x
        total += 1
    # 2: a lone apostrophe between spaces loses both spaces
    total2 = total
    total = 1 if total2 else 0
    i = 1
    while i < total2:
        x = text[i]
        if x == quote and i + 1 < total2 and text[i - 1] == space and text[i + 1] == space:
            total -= 1
            i += 1
            text[i] = 0
        text[total] = x
        total += 1
        i += 1
    # 3: " 's", " 'm", " 're", " 've" lose the space
    total3 = total
    total = 1 if total3 else 0
    for i in range(1, total3):
        x = text[i]
        if text[i - 1] == space and x == quote and i + 1 < total3:
            x1 = text[i + 1]
            if x1 in b"sm":
                total -= 1
            elif x1 not in b"td" and i + 2 < total3 and bytes((x1, text[i + 2])) in (b"re", b"ve"):
                total -= 1
        text[total] = x
        total += 1
    return text[:total]
