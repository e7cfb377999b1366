"""IFEval instruction checkers: one passing and one failing response per instruction type."""

import pytest

from rlvr.utils.errors import RewardError
from rlvr.reward.scorers.ifeval import INSTRUCTIONS, compute_score, count_sentences, count_words, evaluate

EN = "The quick brown fox jumps over the lazy dog while the farmer watches from the old wooden barn"

# instruction id -> (kwargs, passing response, failing response)
CASES = {
    "keywords:existence": ({"keywords": ["apple", "river"]}, "An Apple fell into the river.", "An apple fell into the sea."),
    "keywords:frequency": ({"keyword": "cat", "frequency": 3, "relation": "at least"}, "cat Cat CAT", "cat cat category"),
    "keywords:forbidden_words": ({"forbidden_words": ["bad", "evil"]}, "A badge is fine.", "That is Evil."),
    "keywords:letter_frequency": ({"letter": "z", "let_frequency": 2, "let_relation": "less than"}, "zebra", "Zizz"),
    "language:response_language": ({"language": "de"}, "Das ist ein schöner Tag und wir gehen heute im Park spazieren.", EN),
    "length_constraints:number_sentences": ({"num_sentences": 3, "relation": "less than"}, "One. Dr. Who is two!", "A. B? C! D."),
    "length_constraints:number_paragraphs": ({"num_paragraphs": 2}, "First part.\n***\nSecond part.", "One.\n***\n\n***\nTwo."),
    "length_constraints:number_words": ({"num_words": 5, "relation": "at least"}, "one two three four five", "one two, three-four"),
    "length_constraints:nth_paragraph_first_word": (
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "because"},
        "Intro text.\n\n\"Because it works.", "Intro text.\n\nSince it works."),
    "detectable_content:number_placeholders": ({"num_placeholders": 2}, "Meet at [place] on [date].", "Meet at [place] on []."),
    "detectable_content:postscript": ({"postscript_marker": "P.S."}, "Hello.\n\nP.S. see you", "Hello. PS see you"),
    "detectable_format:number_bullet_lists": ({"num_bullets": 2}, "* one\n- two\n**bold** text", "* one\n* two\n* three"),
    "detectable_format:constrained_response": ({}, "My answer is maybe.", "My answer is probably."),
    "detectable_format:number_highlighted_sections": ({"num_highlights": 2}, "*a* and **b**", "*a* and ** **"),
    "detectable_format:multiple_sections": (
        {"section_spliter": "SECTION", "num_sections": 2}, "SECTION 1\nfoo\nSECTION 2\nbar", "SECTION 1\nfoo\nPart 2\nbar"),
    "detectable_format:json_format": ({}, '```json\n{"a": [1, 2]}\n```', '{"a": [1, 2]'),
    "detectable_format:title": ({}, "<<My Poem>>\nroses", "<< >>\nroses"),
    "combination:two_responses": ({}, "First answer.\n******\nSecond answer.", "Same.\n******\nSame."),
    "combination:repeat_prompt": (
        {"prompt_to_repeat": "Write a poem."}, "write a poem. Here it is.", "Here is a poem: Write a poem."),
    "startend:end_checker": ({"end_phrase": "Any other questions?"}, "Done. any other questions?\"", "Any other questions? Bye."),
    "startend:quotation": ({}, '"Wrapped in quotes"', '"Only opening quote'),
    "change_case:capital_word_frequency": (
        {"capital_frequency": 2, "capital_relation": "less than"}, "Only ONE capital word", "TWO CAPITAL words"),
    "change_case:english_capital": ({}, EN.upper(), EN.upper()[:-1] + "g"),
    "change_case:english_lowercase": ({}, EN.lower(), EN),
    "punctuation:no_comma": ({}, "No commas here.", "Well, a comma."),
}


def test_every_instruction_type_has_a_case():
    assert sorted(CASES) == INSTRUCTIONS.names()
    assert len(CASES) == 25


@pytest.mark.parametrize("instruction_id", sorted(CASES))
def test_instruction_passes_and_fails(instruction_id):
    kwargs, good, bad = CASES[instruction_id]
    result = evaluate(good, [instruction_id], [kwargs])
    assert result.strict == [True], f"passing case rejected: {good!r}"
    assert evaluate(bad, [instruction_id], [kwargs]).strict == [False], f"failing case accepted: {bad!r}"


def test_counting_helpers():
    assert count_words("Hello, world! It's 3.5 o'clock") == 8  # Hello world It s 3 5 o clock
    assert count_sentences("Mr. Smith left. Did he? Yes! e.g. he did") == 4
    assert count_sentences("") == 0


def test_loose_accepts_a_chatty_first_line_and_markdown():
    ground_truth = {"instruction_id_list": ["startend:quotation", "punctuation:no_comma"], "kwargs": [{}, {}]}
    response = 'Sure, here it is:\n"**All done** now"'
    result = evaluate(response, ground_truth["instruction_id_list"], ground_truth["kwargs"])
    assert result.strict == [False, False] and result.loose == [True, True]
    assert (result.prompt_strict, result.prompt_loose, result.instruction_strict, result.instruction_loose) == (
        False, True, 0.0, 1.0)


def test_compute_score_modes_and_none_kwargs():
    truth = {
        "instruction_id_list": ["punctuation:no_comma", "keywords:existence", "detectable_format:title"],
        "kwargs": [{"keywords": None}, {"keywords": ["sun"], "num_words": None}, {}],
    }
    response = "<<Sun>> The sun rises, slowly."
    assert compute_score(response, truth) == pytest.approx(2 / 3)
    assert compute_score(response, truth, reward_mode="all") == 0.0
    assert compute_score("<<Sun>> The sun rises slowly.", truth, reward_mode="all") == 1.0
    assert compute_score("", truth) == 0.0


def test_bad_samples_raise_clear_errors():
    with pytest.raises(RewardError, match="unsupported instruction.*valid names"):
        evaluate("x", ["keywords:nonexistent"], [{}])
    with pytest.raises(RewardError, match="bad kwargs"):
        evaluate("x", ["keywords:existence"], [{"words": ["a"]}])
    with pytest.raises(RewardError, match="one kwargs dict per instruction"):
        evaluate("x", ["punctuation:no_comma"], [])
    with pytest.raises(RewardError, match="'instruction_id_list'"):
        compute_score("x", {"ids": []})
