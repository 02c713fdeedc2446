"""Answer normalisation, exact match and F1: SQuAD / HotpotQA semantics, Unicode-aware."""

from __future__ import annotations

import pytest

from uniagent_tools_search.qa import (
    as_aliases,
    exact_match,
    normalize_answer,
    score_answer,
    token_f1,
)


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        # articles (whole words only)
        ("The Beatles", "beatles"),
        ("a dog and an apple", "dog and apple"),
        ("Theatre Anthem", "theatre anthem"),
        # punctuation, ASCII and Unicode
        ("Washington, D.C.", "washington dc"),
        ("“Paris”", "paris"),
        ("Rock–paper—scissors…", "rockpaperscissors"),
        ("«Le Monde»", "le monde"),
        ("¿Qué? ¡Sí!", "que si"),
        ("8,848.86 m", "884886 m"),
        # white space and case
        ("  New\tYork \n City ", "new york city"),
        ("İSTANBUL", "istanbul"),
        # Unicode: compatibility forms and accents
        ("Ｔｏｋｙｏ", "tokyo"),
        ("ﬁnal", "final"),
        ("Brasília", "brasilia"),
        ("Zoë Saldaña", "zoe saldana"),
        ("Straße", "strasse"),
        ("", ""),
    ],
)
def test_normalisation_table(raw: str, normalized: str) -> None:
    assert normalize_answer(raw) == normalized


def test_accents_can_be_kept() -> None:
    assert normalize_answer("Brasília", fold_accents=False) == "brasília"
    assert exact_match("Brasilia", "Brasília", fold_accents=False) == 0.0
    assert exact_match("Brasilia", "Brasília") == 1.0


@pytest.mark.parametrize(
    ("prediction", "gold", "em", "f1"),
    [
        ("the Eiffel Tower", "Eiffel Tower", 1.0, 1.0),
        ("Eiffel Tower in Paris", "Eiffel Tower", 0.0, 2 * (2 / 4) * 1 / (2 / 4 + 1)),
        ("Tower", "Eiffel Tower", 0.0, 2 * 1 * 0.5 / 1.5),
        ("London", "Paris", 0.0, 0.0),
        ("yes", "no", 0.0, 0.0),
        ("no", "no", 1.0, 1.0),
        ("yes it is", "yes", 0.0, 0.0),  # HotpotQA: yes/no/noanswer match whole or not at all
        ("the", "a", 1.0, 1.0),  # both normalise to nothing
        ("Paris", "", 0.0, 0.0),
    ],
)
def test_exact_match_and_f1(prediction: str, gold: str, em: float, f1: float) -> None:
    assert exact_match(prediction, gold) == em
    assert token_f1(prediction, gold) == pytest.approx(f1)


def test_hotpotqa_gives_no_partial_credit_for_yes_or_no() -> None:
    assert token_f1("no", "no way") == 0.0
    assert token_f1("yes", "yes sir") == 0.0


def test_the_best_alias_counts() -> None:
    score = score_answer("NYC", ["New York City", "NYC", "New York"])
    assert (score.exact_match, score.f1, score.best_em_alias) == (1.0, 1.0, "NYC")
    partial = score_answer("New York State", ["New York City", "New York"])
    assert partial.exact_match == 0.0
    assert partial.best_f1_alias == "New York"
    assert partial.f1 == pytest.approx(0.8)


@pytest.mark.parametrize(
    ("value", "aliases"),
    [
        ("Paris", ["Paris"]),
        (["Paris", "City of Light"], ["Paris", "City of Light"]),
        (1636, ["1636"]),
        ([8848.86, "8,848.86 m"], ["8848.86", "8,848.86 m"]),
    ],
)
def test_gold_answers_come_as_a_string_or_a_list(value: object, aliases: list[str]) -> None:
    assert as_aliases(value) == aliases


@pytest.mark.parametrize("value", [None, [], True, [None], {"a": 1}])
def test_unusable_gold_answers_are_rejected(value: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        as_aliases(value)
