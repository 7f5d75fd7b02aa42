"""ParallelBench generator: official reproduction, determinism, format, name rule, valid answers."""

import collections
import itertools
import json
import math
import random

import pytest
from conftest import SHARED_DATA  # noqa: E402

from dlm_decode.parallelbench.generator import (
    WAITING_LINE_OPS,
    full_names,
    generate_task,
    is_valid_sudoku_solution,
    list_to_str,
    load_names,
    random_answer,
    sample_key,
    sudoku_solutions,
    valid_answers,
)
from dlm_decode.parallelbench.metrics import parse_list, score_sample
from dlm_decode.parallelbench.tasks import answer_text, build_messages, load_task

DATA_DIR = SHARED_DATA
needs_data = pytest.mark.skipif(
    not DATA_DIR.is_dir(), reason=f"official ParallelBench test data not found at {DATA_DIR}"
)
BOTH = {"score": 1.0, "score_strict": 1.0}

# Small stand-ins for the official configs, used where the official data is not needed.
FIRST = ["Ann", "Bob", "Cy", "Dee", "Eve", "Fay", "Gus", "Hal", "Ivy", "Jo"]
LAST = ["Lee", "Day", "Fox", "Hill", "Moss", "Park", "Reed", "Shaw", "Todd", "Vance"]
NAMES = [FIRST, LAST]


def wl_config(op, **extra):
    action, _, mode = op.partition("_")
    config = {
        "icl_example_count": 1,
        "min_length": 3,
        "max_length": 6,
        "num_samples": 100,
        "samples_per_length": 25,
        "prompt": "Do {context}",
        "seed": 1234,
        "type": action,
    }
    if mode:
        config["random_index"] = mode == "random"
    config.update(extra)
    return config


LATIN_CONFIG = {"icl_example_count": 1, "num_samples": 100, "samples_per_length": 100, "size": 4, "seed": 99}


def key_tree(value):
    """The nested key structure of a sample (types of leaves ignored except dict/list nesting)."""
    if isinstance(value, dict):
        return {k: key_tree(v) for k, v in value.items()}
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return [key_tree(value[0])]
    return None


def official(name):
    return load_task(DATA_DIR, name)


@pytest.fixture(scope="module")
def official_names():
    return load_names(DATA_DIR / "first_last_names.yaml")


# --------------------------------------------------------------------------- official reproduction


@needs_data
@pytest.mark.parametrize("op", WAITING_LINE_OPS)
def test_official_seed_reproduces_the_waiting_line_files(op, official_names):
    task = official(f"waiting_line/{op}")
    generated = generate_task(task.name, task.config, official_names)
    assert generated == task.samples
    lines = (DATA_DIR / f"{task.name}.jsonl").read_text().splitlines()
    assert [json.dumps(s, separators=(",", ":")) for s in generated] == lines


@needs_data
def test_official_seed_reproduces_the_latin_square_file():
    task = official("puzzle/latin_square_n4")
    generated = generate_task(task.name, task.config)
    assert generated == task.samples
    lines = (DATA_DIR / "puzzle/latin_square_n4.jsonl").read_text().splitlines()
    assert [json.dumps(s, separators=(",", ":")) for s in generated] == lines


@needs_data
def test_official_files_follow_the_name_rule():
    for op in WAITING_LINE_OPS:
        for sample in official(f"waiting_line/{op}").samples:
            for item in [sample, *sample["input"]["icl_examples"]]:
                people = parse_list(item["input"]["context"])
                assert len({p.split(" ")[0] for p in people}) == len(people)
                assert len({p.split(" ")[1] for p in people}) == len(people)


# ------------------------------------------------------------------------------- waiting line


def check_waiting_line_sample(op, sample, with_examples=True):
    people = parse_list(sample["input"]["context"], strict=True)
    assert people is not None and 3 <= len(people) <= 6
    assert sample["metadata"]["length"] == len(people)
    firsts = [p.split(" ")[0] for p in people]
    lasts = [p.split(" ")[1] for p in people]
    assert len(set(firsts)) == len(people) and len(set(lasts)) == len(people)
    if with_examples:
        assert len(sample["input"]["icl_examples"]) == 1
    reference = answer_text(sample["answer"])
    if "output_format" in sample:
        assert sample["output_format"] == list_to_str(["[MASK]"] * len(parse_list(reference)))
    assert op in ("copy", "reverse", "sort", "shuffle", "remove_index", "remove_random") or (
        sample["input"]["word"] not in people
    )
    if op.endswith("_index"):
        index = sample["input"]["index"]
        assert sample["metadata"]["index"] == index
        assert 0 <= index <= len(people) - (0 if op == "insert_index" else 1)
    elif op.endswith("_random"):
        assert sample["metadata"]["index"] is None
        assert sample["answer"]["input"] == people
    if op == "sort":
        assert parse_list(reference) == sorted(people)
    if op == "reverse":
        assert parse_list(reference) == people[::-1]
    assert score_sample(f"waiting_line/{op}", reference, sample) == BOTH


@pytest.mark.parametrize("op", WAITING_LINE_OPS)
def test_waiting_line_format_lengths_and_reference_answers(op):
    name = f"waiting_line/{op}"
    samples = generate_task(name, wl_config(op), NAMES, seed=7)
    assert len(samples) == 100
    assert [s["metadata"]["length"] for s in samples] == [3] * 25 + [4] * 25 + [5] * 25 + [6] * 25
    for sample in samples:
        check_waiting_line_sample(op, sample)
        check_waiting_line_sample(op, sample["input"]["icl_examples"][0], with_examples=False)
        messages = build_messages({"prompt": "Do {context}"}, sample)
        assert [m["role"] for m in messages] == ["user", "assistant", "user"]


@needs_data
@pytest.mark.parametrize("op", WAITING_LINE_OPS)
def test_new_seed_matches_the_official_schema(op, official_names):
    task = official(f"waiting_line/{op}")
    generated = generate_task(task.name, task.config, official_names, seed=2024)
    assert len(generated) == len(task.samples)
    assert {json.dumps(key_tree(s)) for s in generated} == {json.dumps(key_tree(task.samples[0]))}
    lengths = collections.Counter(s["metadata"]["length"] for s in generated)
    assert lengths == collections.Counter(s["metadata"]["length"] for s in task.samples)
    official_keys = {sample_key(s) for s in task.samples}
    assert not official_keys & {sample_key(s) for s in generated}
    for sample in generated:
        check_waiting_line_sample(op, sample)
        assert build_messages(task.config, sample)[-1]["content"].startswith(
            "You are managing a waiting line at a customer service desk.\n"
        )


def test_determinism_and_seed_dependence():
    config = wl_config("replace_random")
    a = generate_task("waiting_line/replace_random", config, NAMES, seed=5)
    b = generate_task("waiting_line/replace_random", config, NAMES, seed=5)
    c = generate_task("waiting_line/replace_random", config, NAMES, seed=6)
    assert a == b
    assert a != c
    # the config's seed is the default
    assert generate_task("waiting_line/replace_random", config, NAMES) == generate_task(
        "waiting_line/replace_random", config, NAMES, seed=config["seed"]
    )
    latin = generate_task("puzzle/latin_square_n4", LATIN_CONFIG, seed=3)
    assert latin == generate_task("puzzle/latin_square_n4", LATIN_CONFIG, seed=3)
    assert latin != generate_task("puzzle/latin_square_n4", LATIN_CONFIG, seed=4)
    sudoku = generate_task("puzzle/sudoku_n4_12", {}, n=20, seed=3)
    assert sudoku == generate_task("puzzle/sudoku_n4_12", {}, n=20, seed=3)
    assert sudoku != generate_task("puzzle/sudoku_n4_12", {}, n=20, seed=4)


def test_any_sample_count_is_split_over_lengths():
    samples = generate_task("waiting_line/copy", wl_config("copy"), NAMES, n=10, seed=1)
    assert [s["metadata"]["length"] for s in samples] == [3, 3, 3, 4, 4, 4, 5, 5, 6, 6]
    assert all(len(s["input"]["icl_examples"]) == 1 for s in samples)
    no_buckets = wl_config("copy", samples_per_length=0, icl_example_count=0)
    samples = generate_task("waiting_line/copy", no_buckets, NAMES, n=40, seed=1)
    assert len(samples) == 40
    assert "icl_examples" not in samples[0]["input"]
    assert len({s["metadata"]["length"] for s in samples}) > 1
    assert generate_task("waiting_line/copy", wl_config("copy"), NAMES, n=0, seed=1) == []


def test_exclude_and_unique():
    config = wl_config("reverse", min_length=3, max_length=3, icl_example_count=0)
    tiny = [["Ann", "Bob", "Cy"], ["Lee", "Day", "Fox"]]
    # 3! orders of first names x 3! assignments of last names = 36 possible lists
    everything = generate_task("waiting_line/reverse", config, tiny, n=36, seed=0, unique=True)
    assert len({sample_key(s) for s in everything}) == 36
    with pytest.raises(ValueError, match="could not draw"):
        generate_task("waiting_line/reverse", config, tiny, n=37, seed=0, unique=True)
    first = generate_task("waiting_line/reverse", config, tiny, n=10, seed=0, unique=True)
    rest = generate_task(
        "waiting_line/reverse",
        config,
        tiny,
        n=26,
        seed=1,
        unique=True,
        exclude={sample_key(s) for s in first},
    )
    assert len({sample_key(s) for s in first + rest}) == 36


@needs_data
def test_exclude_keeps_official_samples_out(official_names):
    task = official("waiting_line/copy")
    keys = {sample_key(s) for s in task.samples}
    generated = generate_task(task.name, task.config, official_names, exclude=keys)
    assert len(generated) == 100
    assert not keys & {sample_key(s) for s in generated}


def test_sample_key():
    sample = {"input": {"context": '["A B"]', "index": 0, "icl_examples": [{"input": {}}]}, "answer": "x"}
    same_input = {"input": {"index": 0, "context": '["A B"]'}, "answer": "y"}
    other_index = {"input": {"context": '["A B"]', "index": 1}}
    assert sample_key(sample) == sample_key(same_input)
    assert sample_key(sample) != sample_key(other_index)
    assert len({sample_key(sample), sample_key(same_input), sample_key(other_index)}) == 2


def test_full_names_is_the_official_pool():
    assert full_names([["A", "B"], ["X", "Y", "X"]]) == ["A X", "A Y", "A X", "B X", "B Y", "B X"]
    with pytest.raises(ValueError):
        full_names([["A"]])


def test_argument_errors():
    with pytest.raises(ValueError, match="names"):
        generate_task("waiting_line/copy", wl_config("copy"))
    with pytest.raises(ValueError, match="seed"):
        generate_task("puzzle/sudoku_n4_12", {})
    with pytest.raises(ValueError):
        generate_task("waiting_line/rotate", wl_config("copy"), NAMES)
    with pytest.raises(ValueError):
        generate_task("words_to_sentence/easy", {"seed": 1})
    with pytest.raises(ValueError, match="at least two"):  # a one-person line cannot be reordered
        generate_task("waiting_line/shuffle", wl_config("shuffle", min_length=1, max_length=1), NAMES)


# ------------------------------------------------------------------------------ random answers


@pytest.mark.parametrize("op", WAITING_LINE_OPS)
def test_random_answers_are_valid_and_diverse(op):
    name = f"waiting_line/{op}"
    samples = generate_task(name, wl_config(op), NAMES, n=40, seed=11)
    rng = random.Random(0)
    for sample in samples:
        draws = {random_answer(name, sample, rng) for _ in range(30)}
        for text in draws:
            assert score_sample(name, text, sample) == BOTH
        if op in ("copy", "reverse", "sort") or op.endswith("_index"):
            assert draws == {sample["answer"]}
        else:  # every valid answer of a 3..6 list is reachable; 30 draws find several
            assert len(draws) >= 2


@needs_data
def test_random_answers_on_official_samples():
    rng = random.Random(1)
    for name in ("waiting_line/shuffle", "waiting_line/insert_random", "puzzle/latin_square_n4"):
        for sample in official(name).samples:
            assert score_sample(name, random_answer(name, sample, rng), sample) == BOTH


def test_random_answer_errors():
    with pytest.raises(ValueError):
        random_answer("waiting_line/shuffle", {"answer": {"input": ["A"], "example": '["A"]'}}, random.Random(0))
    with pytest.raises(ValueError):
        random_answer("words_to_sentence/easy", {"answer": {"words": ["dog"]}}, random.Random(0))


# ------------------------------------------------------------------------------- latin square


def test_latin_square_samples():
    samples = generate_task("puzzle/latin_square_n4", LATIN_CONFIG, seed=5)
    assert len(samples) == 100
    alphabet = set("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
    for sample in samples:
        symbols = sample["answer"]["symbols"]
        assert len(set(symbols)) == 4 and set(symbols) <= alphabet
        assert sample["input"] == {
            "size": 4,
            "symbols": "[" + ", ".join(symbols) + "]",
            "icl_examples": sample["input"]["icl_examples"],
        }
        assert sample["metadata"] == {"length": 4}
        assert score_sample("puzzle/latin_square_n4", sample["answer"]["example"], sample) == BOTH
        example = sample["input"]["icl_examples"][0]
        assert score_sample("puzzle/latin_square_n4", example["answer"]["example"], example) == BOTH


def test_random_latin_squares_cover_all_576():
    sample = {"answer": {"symbols": ["H", "4", "C", "A"]}}
    rng = random.Random(0)
    squares = collections.Counter(random_answer("puzzle/latin_square_n4", sample, rng) for _ in range(6000))
    assert len(squares) == 576  # every 4x4 Latin square over the symbols
    assert max(squares.values()) < 30  # roughly uniform (mean 10.4)
    for text in list(squares)[:50]:
        assert score_sample("puzzle/latin_square_n4", text, sample) == BOTH
    big = {"answer": {"symbols": list("ABCDEF")}}
    for _ in range(5):
        assert score_sample("puzzle/latin_square_n6", random_answer("puzzle/latin_square_n6", big, rng), big) == BOTH


# ------------------------------------------------------------------------------------- sudoku


def check_sudoku(sample):
    puzzle, solution = sample["input"]["sudoku"], sample["answer"]
    assert len(puzzle.split("\n")) == 4 and all(len(row) == 4 for row in puzzle.split("\n"))
    assert puzzle.count("0") == 4
    assert is_valid_sudoku_solution(solution)
    assert all(p in ("0", s) for p, s in zip(puzzle, solution, strict=True))
    solutions = sudoku_solutions(puzzle)
    assert len(solutions) == 1
    assert "\n".join("".join(map(str, row)) for row in solutions[0]) == solution
    assert score_sample("puzzle/sudoku_n4_12", solution, sample) == BOTH


def test_sudoku_samples():
    samples = generate_task("puzzle/sudoku_n4_12", {}, seed=0)
    assert len(samples) == 108
    assert len({s["input"]["sudoku"] for s in samples}) == 108
    assert len({s["answer"] for s in samples}) == 108
    puzzles = {s["input"]["sudoku"]: s["answer"] for s in samples}
    for sample in samples:
        check_sudoku(sample)
        assert sample["metadata"] == {"length": 12}
        (example,) = sample["input"]["icl_examples"]
        assert example["input"]["sudoku"] != sample["input"]["sudoku"]
        assert puzzles[example["input"]["sudoku"]] == example["answer"]  # another puzzle of the set
        assert random_answer("puzzle/sudoku_n4_12", sample, random.Random(0)) == sample["answer"]
    one = generate_task("puzzle/sudoku_n4_12", {}, n=1, seed=0)
    assert len(one) == 1 and one[0]["input"]["icl_examples"][0]["input"]["sudoku"] != one[0]["input"]["sudoku"]
    harder = generate_task("puzzle/sudoku_n4_8", {}, n=5, seed=0)
    assert all(s["input"]["sudoku"].count("0") == 8 and s["metadata"] == {"length": 8} for s in harder)
    assert all(len(sudoku_solutions(s["input"]["sudoku"])) == 1 for s in harder)


@needs_data
def test_sudoku_matches_the_official_format():
    task = official("puzzle/sudoku_n4_12")
    for sample in task.samples:
        check_sudoku(sample)  # the official puzzles follow the same rules
    generated = generate_task(task.name, task.config, seed=123)
    assert len(generated) == len(task.samples) == 108
    assert {json.dumps(key_tree(s)) for s in generated} == {json.dumps(key_tree(task.samples[0]))}
    official_keys = {sample_key(s) for s in task.samples}
    held_out = generate_task(task.name, task.config, seed=123, n=500, exclude=official_keys)
    assert not official_keys & {sample_key(s) for s in held_out}
    assert len({sample_key(s) for s in held_out}) == 500
    for sample in generated:
        assert build_messages(task.config, sample)[-1]["content"].endswith(
            "\n\nInput:\n" + sample["input"]["sudoku"] + "\nOutput:\n"
        )


@pytest.mark.parametrize("op", ["shuffle", "insert_random", "remove_random", "replace_random", "copy", "sort"])
def test_valid_answers_are_exactly_the_answers_the_scorer_accepts(op):
    name = f"waiting_line/{op}"
    rng = random.Random(5)
    for sample in generate_task(name, wl_config(op), NAMES, n=12, seed=23):
        listed = valid_answers(name, sample)
        people = list(sample["answer"]["input"]) if isinstance(sample["answer"], dict) else None
        word = sample["answer"].get("word") if people else None
        # every list of the right people the task could write: orders of the line, each slot or place of the word
        pool = people + ([word] if word else []) if people else []
        sizes = {len(people) - 1, len(people), len(people) + 1} if people else set()
        candidates = (
            {list_to_str(list(c)) for k in sizes for c in itertools.permutations(pool, k) if k > 0}
            if people
            else {sample["answer"]}
        )
        accepted = {t for t in candidates if score_sample(name, t, sample) == BOTH}
        assert set(listed) == accepted and len(listed) == len(set(listed))
        assert all(random_answer(name, sample, rng) in listed for _ in range(10))
        if op == "shuffle":
            assert len(listed) == math.factorial(len(people)) - 1 and list_to_str(people) not in listed
        if op == "replace_random":
            assert len(listed) == len(set(people))


def test_valid_answers_refuses_puzzles_and_text():
    with pytest.raises(ValueError, match="waiting-line answers only"):
        valid_answers("puzzle/latin_square_n4", {"answer": {"symbols": ["A", "B"]}})
