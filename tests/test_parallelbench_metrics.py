"""ParallelBench metrics: hand-made predictions, malformed outputs, strict vs lenient parsing; AUP (ALGORITHMS.md
section 11) on hand-computed points, and its place in the sweep summary."""

import importlib.util
import math

import pytest
from conftest import SHARED_DATA  # noqa: E402

from dlm_decode.parallelbench import metrics
from dlm_decode.parallelbench.aup import aup, aup_table, weight
from dlm_decode.parallelbench.metrics import (
    MetricUnavailable,
    latin_square_score,
    list_match_score,
    list_random_insert_score,
    list_random_remove_score,
    list_random_replace_score,
    list_shuffle_score,
    parse_list,
    parse_sudoku,
    score_sample,
    sudoku_score,
    text_metrics_available,
)
from dlm_decode.parallelbench.sweep import format_sweep
from dlm_decode.parallelbench.tasks import answer_text, list_tasks, load_task

DATA_DIR = SHARED_DATA
needs_data = pytest.mark.skipif(
    not DATA_DIR.is_dir(), reason=f"official ParallelBench test data not found at {DATA_DIR}"
)

BOTH = {"score": 1.0, "score_strict": 1.0}
NONE = {"score": 0.0, "score_strict": 0.0}
LENIENT_ONLY = {"score": 1.0, "score_strict": 0.0}


# ------------------------------------------------------------------------------------ parse_list


@pytest.mark.parametrize(
    ("text", "lenient", "strict"),
    [
        ('["A", "B"]', ["A", "B"], ["A", "B"]),
        ('Sure! The list is ["A", "B"]. Done.', ["A", "B"], ["A", "B"]),
        ('first ["X"] then ["A", "B"]', ["A", "B"], ["A", "B"]),  # last "[" wins
        ('["A B", "C-D"]', ["A B", "C-D"], ["A B", "C-D"]),
        ('["A","B"]', ["A", "B"], None),  # strict needs ", " separators
        ("['A', 'B']", ["'A'", "'B'"], None),  # single quotes are not stripped
        ("[A, B]", ["A", "B"], None),
        ("A, B", ["A", "B"], None),  # no brackets: lenient reads a bare comma list
        ('["A", "B"', ["A", "B"], None),  # unclosed
        ('"A", "B"]', ["A", "B"], None),  # unopened
        ('["A", "B""]', ["A", "B"], None),  # stray quote
        ('["A", , "B"]', ["A", "B"], None),  # empty items dropped leniently
        ("[]", [], None),
        ("", [], None),
        ("no list here", ["no list here"], None),
        ('["A"]', ["A"], ["A"]),
        ('["  A  ", "B"]', ["A", "B"], ["  A  ", "B"]),
        ('[\n"A",\n"B"\n]', ['\n"A', '\n"B"\n'], None),  # newlines are not stripped
    ],
)
def test_parse_list(text, lenient, strict):
    assert parse_list(text) == lenient
    assert parse_list(text, strict=True) == strict


def test_parse_list_passes_lists_through_and_tolerates_none():
    assert parse_list(["A", "B"], strict=True) == ["A", "B"]
    assert parse_list(None) == []
    assert parse_list(None, strict=True) is None


# ------------------------------------------------------------------------------ list_match_score

ABC = '["Ann Lee", "Bob Day", "Cy Fox"]'


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        (ABC, BOTH),
        ("Here is the final list: " + ABC + "\nThanks!", BOTH),  # text around the list is allowed
        ("Ann Lee, Bob Day, Cy Fox", LENIENT_ONLY),
        ('["Ann Lee","Bob Day","Cy Fox"]', LENIENT_ONLY),
        ("[Ann Lee, Bob Day, Cy Fox]", LENIENT_ONLY),
        ('["Ann Lee", "Bob Day", "Cy Fox"', LENIENT_ONLY),
        ('["Bob Day", "Ann Lee", "Cy Fox"]', NONE),
        ('["Ann Lee", "Bob Day"]', NONE),
        ('["Ann Lee", "Bob Day", "Cy Fox", "Cy Fox"]', NONE),
        ("['Ann Lee', 'Bob Day', 'Cy Fox']", NONE),
        ('[\n  "Ann Lee",\n  "Bob Day",\n  "Cy Fox"\n]', NONE),
        (ABC + ' and also ["Ann Lee"]', NONE),  # the last list is the answer
        ("", NONE),
        ("[]", NONE),
        ("[[[", NONE),
        ("]]]", NONE),
        (None, NONE),
    ],
)
def test_list_match(prediction, expected):
    sample = {"answer": ABC}
    assert score_sample("list_match_score", prediction, sample) == expected
    assert score_sample("waiting_line/copy", prediction, sample) == expected
    assert list_match_score(prediction, ABC) == expected["score"]
    assert list_match_score(prediction, ABC, strict=True) == expected["score_strict"]


# ------------------------------------------------------------------------------------- shuffle

SHUFFLE = {"input": ["A", "B", "C"], "example": '["B", "A", "C"]'}


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        ('["B", "A", "C"]', BOTH),
        ('["C", "B", "A"]', BOTH),
        ("[C, A, B]", LENIENT_ONLY),
        ('["A", "B", "C"]', NONE),  # same order is not a shuffle
        ('["A", "A", "B"]', NONE),
        ('["B", "A"]', NONE),
        ('["B", "A", "C", "D"]', NONE),
        ('["B", "A", "D"]', NONE),
        ("", NONE),
    ],
)
def test_shuffle(prediction, expected):
    assert score_sample("waiting_line/shuffle", prediction, {"answer": SHUFFLE}) == expected


def test_shuffle_of_a_single_item_never_scores():
    answer = {"input": ["A"], "example": '["A"]'}
    assert list_shuffle_score('["A"]', answer) == 0.0
    assert list_shuffle_score('["A"]', answer, strict=True) == 0.0


# ------------------------------------------------------------------------------ random insert

INSERT = {"input": ["A", "B", "C"], "word": "N", "example": '["A", "N", "B", "C"]'}


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        ('["N", "A", "B", "C"]', BOTH),
        ('["A", "N", "B", "C"]', BOTH),
        ('["A", "B", "N", "C"]', BOTH),
        ('["A", "B", "C", "N"]', BOTH),
        ("[A, B, N, C]", LENIENT_ONLY),
        ('["A", "B", "C"]', NONE),  # nobody inserted
        ('["A", "N", "C"]', NONE),  # replaced instead of inserted
        ('["N", "A", "N", "B", "C"]', NONE),  # inserted twice
        ('["N", "B", "A", "C"]', NONE),  # order changed
        ('["A", "X", "B", "C"]', NONE),  # wrong person
        ('["A", "N", "B", "C", "D"]', NONE),
        ("", NONE),
        ("[", NONE),
    ],
)
def test_random_insert(prediction, expected):
    assert score_sample("waiting_line/insert_random", prediction, {"answer": INSERT}) == expected


def test_random_insert_without_word_checks_one_extra_item():
    answer = {"input": ["A", "B", "C"], "word": None}
    assert list_random_insert_score('["A", "Z", "B", "C"]', answer) == 1.0
    assert list_random_insert_score('["A", "B", "C"]', answer) == 0.0
    assert list_random_insert_score('["A", "Z", "Y", "B", "C"]', answer) == 0.0


# ------------------------------------------------------------------------------ random remove

REMOVE = {"input": ["A", "B", "C", "D"], "example": '["A", "C", "D"]'}


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        ('["B", "C", "D"]', BOTH),
        ('["A", "C", "D"]', BOTH),
        ('["A", "B", "D"]', BOTH),
        ('["A", "B", "C"]', BOTH),
        ("[A, B, C]", LENIENT_ONLY),
        ('["A", "B", "C", "D"]', NONE),  # nobody removed
        ('["A", "B"]', NONE),  # two removed
        ('["C", "A", "D"]', NONE),  # order changed
        ('["A", "X", "D"]', NONE),  # removed and replaced
        ('["A", "A", "D"]', NONE),
        ("", NONE),
    ],
)
def test_random_remove(prediction, expected):
    assert score_sample("waiting_line/remove_random", prediction, {"answer": REMOVE}) == expected


def test_random_remove_of_a_repeated_name_is_not_recognised():
    # official quirk: the removed person is found by set difference, which is empty here
    answer = {"input": ["A", "B", "A"]}
    assert list_random_remove_score('["B", "A"]', answer) == 0.0
    assert list_random_remove_score('["A", "A"]', answer) == 1.0


# ----------------------------------------------------------------------------- random replace

REPLACE = {"input": ["A", "B", "C"], "word": "N", "example": '["A", "N", "C"]'}


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        ('["N", "B", "C"]', BOTH),
        ('["A", "N", "C"]', BOTH),
        ('["A", "B", "N"]', BOTH),
        ("[A, N, C]", LENIENT_ONLY),
        ('["A", "B", "C"]', NONE),  # nobody replaced
        ('["A", "B", "C", "N"]', NONE),  # appended
        ('["N", "N", "C"]', NONE),  # two replaced
        ('["N", "C", "B"]', NONE),  # replaced and reordered
        ('["A", "X", "C"]', NONE),  # wrong person
        ('["A", "N"]', NONE),
        ("", NONE),
    ],
)
def test_random_replace(prediction, expected):
    assert score_sample("waiting_line/replace_random", prediction, {"answer": REPLACE}) == expected


def test_random_replace_without_word_counts_changed_positions():
    answer = {"input": ["A", "B", "C"]}
    assert list_random_replace_score('["A", "Z", "C"]', answer) == 1.0
    assert list_random_replace_score('["Z", "Y", "C"]', answer) == 0.0
    assert list_random_replace_score('["A", "B", "C"]', answer) == 0.0


# ------------------------------------------------------------------------------- latin square

LATIN = {"symbols": ["H", "4", "C", "A"], "example": "H,4,A,C\n4,C,H,A\nC,A,4,H\nA,H,C,4"}


@pytest.mark.parametrize(
    ("prediction", "score"),
    [
        ("H,4,A,C\n4,C,H,A\nC,A,4,H\nA,H,C,4", 1.0),
        ("H,4,C,A\n4,C,A,H\nC,A,H,4\nA,H,4,C", 1.0),  # any Latin square counts
        ("H, 4, C, A\n4, C, A, H\nC, A, H, 4\nA, H, 4, C\n", 1.0),
        ("Here you go:\n```csv\nH,4,C,A\n4,C,A,H\nC,A,H,4\nA,H,4,C\n```", 1.0),  # other lines skipped
        ("H,4,C,A\n4,C,A,H\nC,A,H,4\nA,H,4,C\nH,4,C,A", 1.0),  # extra rows after the square ignored
        ("H,4,C,A\nH,4,C,A\nC,A,H,4\nA,H,4,C", 0.0),  # repeated row -> repeated columns
        ("H,4,C,A\n4,C,A,H\nC,A,H,4", 0.0),  # three rows
        ("H,4,C,A\n4,C,A,H\nC,A,H,4\nA,H,4,X", 0.0),  # wrong symbol
        ("h,4,c,a\n4,c,a,h\nc,a,h,4\na,h,4,c", 0.0),  # case matters
        ("H4CA\n4CAH\nCAH4\nAH4C", 0.0),  # not CSV
        ("H;4;C;A\n4;C;A;H\nC;A;H;4\nA;H;4;C", 0.0),
        ("", 0.0),
        ("\n\n", 0.0),
    ],
)
def test_latin_square(prediction, score):
    sample = {"answer": LATIN}
    assert score_sample("puzzle/latin_square_n4", prediction, sample) == {
        "score": score,
        "score_strict": score,
    }
    assert latin_square_score(prediction, LATIN) == score


def test_latin_square_first_row_constraint():
    answer = {**LATIN, "first_row": ["H", "4", "C", "A"]}
    assert latin_square_score("H,4,C,A\n4,C,A,H\nC,A,H,4\nA,H,4,C", answer) == 1.0
    assert latin_square_score("4,C,A,H\nH,4,C,A\nC,A,H,4\nA,H,4,C", answer) == 0.0


# ------------------------------------------------------------------------------------- sudoku

SOLUTION = "1342\n2431\n4123\n3214"


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        (SOLUTION, BOTH),
        ("\n" + SOLUTION + "\n\n", BOTH),
        ("1 3 4 2\n2 4 3 1\n4 1 2 3\n3 2 1 4", LENIENT_ONLY),
        ("1,3,4,2\n2,4,3,1\n4,1,2,3\n3,2,1,4", LENIENT_ONLY),
        ("Output:\n" + SOLUTION, LENIENT_ONLY),
        ("1342\n\n2431\n4123\n3214", BOTH),  # blank lines are skipped in both modes
        ("1342\n2431\n4123\n3241", NONE),  # wrong cells
        ("1342\n2431\n4123", NONE),  # three rows
        ("1342\n2431\n4123\n3214\n1342", NONE),  # five rows
        ("1342\n2431\n4123\n32a4", NONE),  # non-digit: row has three digits
        ("1342\n2031\n4123\n3214", NONE),  # a blank left as 0
        ("13422431\n41233214", NONE),
        ("2413\n3124\n1342\n4231", NONE),  # a valid sudoku, but not this puzzle's solution
        ("", NONE),
        ("abcd\nefgh\nijkl\nmnop", NONE),
        (None, NONE),
    ],
)
def test_sudoku(prediction, expected):
    sample = {"answer": SOLUTION}
    assert score_sample("puzzle/sudoku_n4_12", prediction, sample) == expected
    assert sudoku_score(prediction, SOLUTION) == expected["score"]
    assert sudoku_score(prediction, SOLUTION, strict=True) == expected["score_strict"]


def test_parse_sudoku():
    assert parse_sudoku(SOLUTION) == [[1, 3, 4, 2], [2, 4, 3, 1], [4, 1, 2, 3], [3, 2, 1, 4]]
    assert parse_sudoku("row 1342\n2431\n4123\n3214", strict=True) is None
    assert parse_sudoku("1342\n2431\n4123\n3214x", strict=True) is None
    assert parse_sudoku("1342\n2431\n4123\n3214x") == parse_sudoku(SOLUTION)


# ----------------------------------------------------------------------------------- dispatch


def test_score_sample_accepts_metric_task_or_config():
    sample = {"answer": INSERT}
    prediction = '["A", "B", "N", "C"]'
    by_metric = score_sample("list_random_insert_score", prediction, sample)
    by_task = score_sample("waiting_line/insert_random", prediction, sample)
    by_config = score_sample({"name": "whatever/x", "metric": "list_random_insert_score"}, prediction, sample)
    assert by_metric == by_task == by_config == BOTH
    with pytest.raises(ValueError):
        score_sample("no_such_metric", prediction, sample)
    with pytest.raises(ValueError):
        score_sample({"name": "x/y", "metric": "bogus_score"}, prediction, sample)


def test_text_tasks_raise_metric_unavailable():
    sample = {"input": {"words": "dog, park"}, "answer": {"words": ["dog", "park"]}}
    for name in ("words_to_sentence/easy", "sentence_to_words_score", "paraphrase_score", "summary_score"):
        with pytest.raises(MetricUnavailable, match="official ParallelBench scorer"):
            score_sample(name, "The dog ran to the park.", sample)
    expected = all(importlib.util.find_spec(m) is not None for m in metrics._TEXT_SCORER_MODULES)
    assert text_metrics_available() is expected


def test_text_metrics_unavailable_without_scorer_packages(monkeypatch):
    monkeypatch.setattr(metrics.importlib.util, "find_spec", lambda name: None)
    assert text_metrics_available() is False
    with pytest.raises(MetricUnavailable, match="language_tool_python"):
        score_sample("words_to_sentence/easy", "A dog.", {"answer": {"words": ["dog"]}})


def test_garbage_never_raises():
    garbage = [
        "",
        "[",
        "]",
        "][",
        '"',
        '", "',
        "[,,,]",
        "\x00\n\t",
        "[" * 50,
        "١٢٣٤\n" * 4,
        "🙂, 🙂",
        None,
        12,
    ]
    samples = {
        "waiting_line/copy": {"answer": ABC},
        "waiting_line/shuffle": {"answer": SHUFFLE},
        "waiting_line/insert_random": {"answer": INSERT},
        "waiting_line/remove_random": {"answer": REMOVE},
        "waiting_line/replace_random": {"answer": REPLACE},
        "puzzle/latin_square_n4": {"answer": LATIN},
        "puzzle/sudoku_n4_12": {"answer": SOLUTION},
    }
    for name, sample in samples.items():
        for text in garbage:
            result = score_sample(name, text, sample)
            assert result == NONE, (name, text)


# ------------------------------------------------------------------------------ official data


@needs_data
def test_official_reference_answers_score_one():
    for name in list_tasks(DATA_DIR):
        if name.startswith("words_to_sentence"):
            continue
        task = load_task(DATA_DIR, name)
        for sample in task.samples:
            assert score_sample(name, answer_text(sample["answer"]), sample) == BOTH, name
            assert score_sample(task.config, answer_text(sample["answer"]), sample) == BOTH, name
            for example in sample["input"]["icl_examples"]:
                assert score_sample(name, answer_text(example["answer"]), example) == BOTH, name


@needs_data
def test_official_inputs_echoed_back_fail_the_changing_tasks():
    for op in ("shuffle", "insert_random", "remove_random", "replace_random"):
        task = load_task(DATA_DIR, f"waiting_line/{op}")
        for sample in task.samples:
            assert score_sample(task.name, sample["input"]["context"], sample) == NONE
    task = load_task(DATA_DIR, "puzzle/sudoku_n4_12")
    for sample in task.samples:
        assert score_sample(task.name, sample["input"]["sudoku"], sample) == NONE


# AUP (aup.py)


def test_weight_is_one_at_the_best_accuracy_and_discounts_below_it():
    assert weight(80.0, 80.0) == 1.0
    assert weight(90.0, 80.0) == 1.0  # capped at 1
    assert weight(40.0, 80.0) == pytest.approx(math.exp(-1.5))
    assert weight(0.0, 0.0) == 1.0


def test_single_point_is_rho_times_accuracy():
    assert aup([(1.0, 80.0)], 80.0) == pytest.approx(80.0)
    assert aup([(2.5, 60.0)], 100.0) == pytest.approx(150.0)


def test_trapezoid_with_weights_and_the_five_point_cut():
    # sorted by rho: (1, 80), (2, 78), (3, 76), (4, 70); y_1 = 80, so (4, 70) is below 75 and left out
    pts = [(3.0, 76.0), (1.0, 80.0), (4.0, 70.0), (2.0, 78.0)]
    w78, w76 = math.exp(-3 * (1 - 78 / 80)), math.exp(-3 * (1 - 76 / 80))
    want = 1 * 80 + 0.5 * (2 - 1) * (78 * w78 + 80 * 1.0) + 0.5 * (3 - 2) * (76 * w76 + 78 * w78)
    assert aup(pts, 80.0) == pytest.approx(want)
    assert want == pytest.approx(80 + 76.18 + 68.89, abs=0.01)  # 225.07, worked by hand
    # a better y_max elsewhere on the task discounts every point of this method
    assert aup(pts, 100.0) < aup(pts, 80.0)


def test_empty_points_are_an_error():
    with pytest.raises(ValueError, match="at least one"):
        aup([], 1.0)


def _row(task, method, score, tps, sampler="threshold"):
    return {
        "task": task,
        "method": method,
        "score": score,
        "tokens_per_step": tps,
        "config": {"sampler": sampler},
    }


def test_table_per_method_and_task_uses_the_task_best_over_methods_and_skips_the_oracle():
    rows = [
        _row("a", "top-k b32", 90.0, 1.0),
        _row("a", "top-k b32", 60.0, 2.0),  # 30 below y_1: cut
        _row("a", "threshold b32", 100.0, 1.5),  # the task's best: y_max = 100 for both methods
        _row("a", "threshold b32", 98.0, 3.0),
        _row("b", "threshold b32", 50.0, 2.0),
        _row("a", "oracle b32", 100.0, 20.0, sampler="oracle"),
    ]
    got = aup_table(rows)
    assert set(got) == {"top-k b32", "threshold b32"}
    assert got["top-k b32"]["a"] == pytest.approx(90.0)
    w98 = math.exp(-3 * 0.02)
    assert got["threshold b32"]["a"] == pytest.approx(150.0 + 0.5 * 1.5 * (98 * w98 + 100))
    assert got["threshold b32"]["b"] == pytest.approx(100.0)
    assert got["threshold b32"]["mean"] == pytest.approx((got["threshold b32"]["a"] + 100.0) / 2)


def test_sweep_summary_prints_the_aup_table():
    rows = [
        {
            **_row("a", "top-k b32", 90.0, 1.0),
            "config_id": "c1",
            "label": "top-k k=1",
            "score_strict": 90.0,
            "n": 4,
            "gen_length": 32,
            "seconds": 1.0,
        },
        {
            **_row("a", "top-k b32", 88.0, 2.0),
            "config_id": "c2",
            "label": "top-k k=2",
            "score_strict": 88.0,
            "n": 4,
            "gen_length": 32,
            "seconds": 1.0,
        },
    ]
    text = format_sweep(rows)
    want = 90.0 + 0.5 * (88 * math.exp(-3 * (1 - 88 / 90)) + 90)
    assert "AUP" in text and f"{want:.1f}" in text
