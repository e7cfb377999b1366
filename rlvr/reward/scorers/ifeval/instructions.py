"""Checkers of the IFEval instruction types (Zhou et al., 2023, "Instruction-Following Evaluation for
Large Language Models", arXiv:2311.07911).

Each checker is ``check(response: str, **kwargs) -> bool`` and is registered under its IFEval id
(``"keywords:existence"``, ...) with the keyword arguments of IFEval's data files. Comparisons
``relation`` / ``let_relation`` / ``capital_relation`` are ``"less than"`` (count < N) or
``"at least"`` (count >= N). Words are ``\\w+`` runs; keywords match case-insensitively on word
boundaries.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from langdetect import DetectorFactory, LangDetectException, detect

from rlvr.utils.registry import Registry

INSTRUCTIONS: Registry[Callable[..., bool]] = Registry("IFEval instruction", object_paths=False)
DetectorFactory.seed = 0  # langdetect is randomised; fix it so the reward is deterministic

_RELATIONS = ("less than", "at least")
_ABBREVIATIONS = re.compile(r"\b(?:Mr|Mrs|Ms|Dr|Prof|Sr|Jr|St|vs|etc|e\.g|i\.e|Inc|Ltd|Co)\.", re.IGNORECASE)


def _compare(count: int, relation: str, target: int) -> bool:
    if relation == "less than":
        return count < int(target)
    if relation == "at least":
        return count >= int(target)
    raise ValueError(f"relation must be one of {_RELATIONS}, got {relation!r}")


def _count_word(response: str, word: str) -> int:
    return len(re.findall(rf"(?<!\w){re.escape(word.strip())}(?!\w)", response, flags=re.IGNORECASE))


def count_words(text: str) -> int:
    """Number of ``\\w+`` runs."""
    return len(re.findall(r"\w+", text))


def count_sentences(text: str) -> int:
    """Sentences end with ``.``, ``!`` or ``?`` followed by white space or the end (abbreviations and
    decimals such as ``Dr.`` or ``3.5`` do not end a sentence); a trailing fragment counts as one."""
    masked = _ABBREVIATIONS.sub(lambda m: m.group(0).replace(".", "_"), text)
    parts = re.split(r"(?<=[.!?])[\"')\]]*\s+", masked.strip())
    return len([p for p in parts if re.search(r"\w", p)])


def _detect_language(text: str) -> str | None:
    try:
        return detect(text)
    except LangDetectException:
        return None


# ---------------------------------------------------------------- keywords
@INSTRUCTIONS.register("keywords:existence")
def keywords_existence(response: str, keywords: list[str]) -> bool:
    """Every keyword appears at least once."""
    return all(_count_word(response, k) > 0 for k in keywords)


@INSTRUCTIONS.register("keywords:frequency")
def keywords_frequency(response: str, keyword: str, frequency: int, relation: str) -> bool:
    """``keyword`` appears ``relation`` ``frequency`` times."""
    return _compare(_count_word(response, keyword), relation, frequency)


@INSTRUCTIONS.register("keywords:forbidden_words")
def keywords_forbidden_words(response: str, forbidden_words: list[str]) -> bool:
    """None of the forbidden words appears."""
    return all(_count_word(response, w) == 0 for w in forbidden_words)


@INSTRUCTIONS.register("keywords:letter_frequency")
def keywords_letter_frequency(response: str, letter: str, let_frequency: int, let_relation: str) -> bool:
    """The letter (case-insensitive) appears ``let_relation`` ``let_frequency`` times."""
    return _compare(response.lower().count(letter.lower()), let_relation, let_frequency)


# ---------------------------------------------------------------- language
@INSTRUCTIONS.register("language:response_language")
def response_language(response: str, language: str) -> bool:
    """langdetect's language of the response is ``language`` (ISO 639-1); undetectable text passes."""
    detected = _detect_language(response)
    return detected is None or detected == language


# ---------------------------------------------------------------- length constraints
@INSTRUCTIONS.register("length_constraints:number_sentences")
def number_sentences(response: str, num_sentences: int, relation: str) -> bool:
    """The number of sentences is ``relation`` ``num_sentences``."""
    return _compare(count_sentences(response), relation, num_sentences)


@INSTRUCTIONS.register("length_constraints:number_paragraphs")
def number_paragraphs(response: str, num_paragraphs: int) -> bool:
    """Exactly ``num_paragraphs`` non-empty paragraphs separated by the markdown divider ``***``."""
    parts = re.split(r"\s?\*\*\*\s?", response)
    inner = parts[1:-1]
    if any(not p.strip() for p in inner):
        return False
    return len([p for p in parts if p.strip()]) == int(num_paragraphs)


@INSTRUCTIONS.register("length_constraints:number_words")
def number_words(response: str, num_words: int, relation: str) -> bool:
    """The number of words is ``relation`` ``num_words``."""
    return _compare(count_words(response), relation, num_words)


@INSTRUCTIONS.register("length_constraints:nth_paragraph_first_word")
def nth_paragraph_first_word(response: str, num_paragraphs: int, nth_paragraph: int, first_word: str) -> bool:
    """Exactly ``num_paragraphs`` paragraphs (separated by blank lines) and paragraph ``nth_paragraph``
    (1-based) starts with ``first_word`` (case-insensitive, leading quotes/punctuation ignored)."""
    paragraphs = [p for p in re.split(r"\n\s*\n", response) if p.strip()]
    if len(paragraphs) != int(num_paragraphs) or not 1 <= int(nth_paragraph) <= len(paragraphs):
        return False
    words = re.findall(r"\w+", paragraphs[int(nth_paragraph) - 1])
    return bool(words) and words[0].lower() == first_word.strip().lower()


# ---------------------------------------------------------------- detectable content
@INSTRUCTIONS.register("detectable_content:number_placeholders")
def number_placeholders(response: str, num_placeholders: int) -> bool:
    """At least ``num_placeholders`` square-bracket placeholders such as ``[address]``."""
    return len(re.findall(r"\[[^\[\]\n]+\]", response)) >= int(num_placeholders)


@INSTRUCTIONS.register("detectable_content:postscript")
def postscript(response: str, postscript_marker: str) -> bool:
    """A line starting with the postscript marker (``P.S.``, ``P.P.S`` or a custom one) followed by text."""
    marker = postscript_marker.strip().lower()
    if marker in ("p.s.", "p.s"):
        pattern = r"^\s*p\.\s?s\.?\s*\S"
    elif marker in ("p.p.s", "p.p.s."):
        pattern = r"^\s*p\.\s?p\.\s?s\.?\s*\S"
    else:
        pattern = rf"^\s*{re.escape(marker)}\s*\S"
    return re.search(pattern, response.lower(), flags=re.MULTILINE) is not None


# ---------------------------------------------------------------- detectable format
@INSTRUCTIONS.register("detectable_format:number_bullet_lists")
def number_bullet_lists(response: str, num_bullets: int) -> bool:
    """Exactly ``num_bullets`` markdown bullet lines (``* item`` or ``- item``)."""
    stars = re.findall(r"^\s*\*(?!\*)\s+\S", response, flags=re.MULTILINE)
    dashes = re.findall(r"^\s*-\s+\S", response, flags=re.MULTILINE)
    return len(stars) + len(dashes) == int(num_bullets)


@INSTRUCTIONS.register("detectable_format:constrained_response")
def constrained_response(response: str) -> bool:
    """The response contains one of "My answer is yes.", "My answer is no.", "My answer is maybe."."""
    return any(option in response for option in ("My answer is yes.", "My answer is no.", "My answer is maybe."))


@INSTRUCTIONS.register("detectable_format:number_highlighted_sections")
def number_highlighted_sections(response: str, num_highlights: int) -> bool:
    """At least ``num_highlights`` markdown highlights ``*text*`` or ``**text**`` with non-blank text."""
    single = [h for h in re.findall(r"(?<!\*)\*([^\n*]+)\*(?!\*)", response) if h.strip()]
    double = [h for h in re.findall(r"\*\*([^\n*]+)\*\*", response) if h.strip()]
    return len(single) + len(double) >= int(num_highlights)


@INSTRUCTIONS.register("detectable_format:multiple_sections")
def multiple_sections(response: str, section_spliter: str, num_sections: int) -> bool:
    """At least ``num_sections`` sections headed ``<section_spliter> <number>`` (e.g. "SECTION 1")."""
    headers = re.findall(rf"(?:^|\s){re.escape(section_spliter.strip())}\s?\d+", response)
    return len(headers) >= int(num_sections)


@INSTRUCTIONS.register("detectable_format:json_format")
def json_format(response: str) -> bool:
    """The whole response (optionally inside a ```json fence) parses as JSON."""
    text = re.sub(r"^```(?:json|JSON|Json)?\s*|\s*```$", "", response.strip())
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@INSTRUCTIONS.register("detectable_format:title")
def title(response: str) -> bool:
    """A title in double angular brackets, ``<<like this>>``, with non-blank text."""
    return any(t.strip() for t in re.findall(r"<<([^\n]+?)>>", response))


# ---------------------------------------------------------------- combination
@INSTRUCTIONS.register("combination:two_responses")
def two_responses(response: str) -> bool:
    """Exactly two different non-empty responses separated by six asterisks ``******``."""
    parts = response.split("******")
    if len(parts) != 2:
        return False
    first, second = (p.strip() for p in parts)
    return bool(first) and bool(second) and first != second


@INSTRUCTIONS.register("combination:repeat_prompt")
def repeat_prompt(response: str, prompt_to_repeat: str) -> bool:
    """The response starts with ``prompt_to_repeat`` verbatim (case-insensitive)."""
    return response.strip().lower().startswith(prompt_to_repeat.strip().lower())


# ---------------------------------------------------------------- start / end
@INSTRUCTIONS.register("startend:end_checker")
def end_checker(response: str, end_phrase: str) -> bool:
    """The response ends with ``end_phrase`` (case-insensitive; surrounding quotes ignored)."""
    return response.strip().strip('"').strip().lower().endswith(end_phrase.strip().lower())


@INSTRUCTIONS.register("startend:quotation")
def quotation(response: str) -> bool:
    """The whole response is wrapped in double quotation marks."""
    text = response.strip()
    return len(text) > 1 and text[0] == '"' and text[-1] == '"'


# ---------------------------------------------------------------- change case
@INSTRUCTIONS.register("change_case:capital_word_frequency")
def capital_word_frequency(response: str, capital_frequency: int, capital_relation: str) -> bool:
    """The number of all-capital words (``\\w+`` runs with ``isupper()``) is ``capital_relation`` N."""
    capitals = [w for w in re.findall(r"\w+", response) if w.isupper()]
    return _compare(len(capitals), capital_relation, capital_frequency)


@INSTRUCTIONS.register("change_case:english_capital")
def english_capital(response: str) -> bool:
    """The response is English and entirely in capital letters."""
    return response.isupper() and _detect_language(response) in ("en", None)


@INSTRUCTIONS.register("change_case:english_lowercase")
def english_lowercase(response: str) -> bool:
    """The response is English and entirely in lowercase letters."""
    return response.islower() and _detect_language(response) in ("en", None)


# ---------------------------------------------------------------- punctuation
@INSTRUCTIONS.register("punctuation:no_comma")
def no_comma(response: str) -> bool:
    """The response contains no comma."""
    return "," not in response
