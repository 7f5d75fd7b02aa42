"""ParallelBench task loading and chat construction, checked against the official test files."""

import re

import pytest
from conftest import SHARED_DATA  # noqa: E402

from dlm_decode.parallelbench.generator import WAITING_LINE_OPS
from dlm_decode.parallelbench.tasks import (
    Task,
    answer_text,
    build_messages,
    is_deterministic,
    list_tasks,
    load_task,
    max_new_tokens,
    metric_name,
    task_kind,
)

DATA_DIR = SHARED_DATA
needs_data = pytest.mark.skipif(
    not DATA_DIR.is_dir(), reason=f"official ParallelBench test data not found at {DATA_DIR}"
)

WAITING_LINE = list(WAITING_LINE_OPS)
WORDS = [
    f"{level}{suffix}"
    for level in ("easy", "medium", "hard")
    for suffix in ("", "_n1", *(f"_n{i}" for i in range(3, 8)))
]
ALL_TASKS = sorted(
    [f"waiting_line/{op}" for op in WAITING_LINE]
    + ["puzzle/latin_square_n4", "puzzle/sudoku_n4_12"]
    + [f"words_to_sentence/{w}" for w in WORDS]
)


@needs_data
def test_list_tasks_matches_the_official_files():
    names = list_tasks(DATA_DIR)
    assert names == ALL_TASKS
    assert len(names) == 33
    # the sudoku config's own "name" field (puzzle/sudoku_4x4_4) is not used
    assert "puzzle/sudoku_4x4_4" not in names


@needs_data
@pytest.mark.parametrize("name", ALL_TASKS)
def test_load_every_official_task(name):
    task = load_task(DATA_DIR, name)
    assert isinstance(task, Task)
    assert task.name == name
    assert len(task.samples) == (108 if name == "puzzle/sudoku_n4_12" else 100)
    assert "{" in task.config["prompt"]
    assert task.config["metric"] == metric_name(name)
    for sample in task.samples:
        assert set(sample) >= {"input", "answer"}
        messages = build_messages(task.config, sample)
        expected_turns = 1 if name.startswith("words_to_sentence") else 3
        assert len(messages) == expected_turns
        assert [m["role"] for m in messages] == ["user", "assistant", "user"][:expected_turns]
        for message in messages:
            assert message["content"]
            assert "\\n" not in message["content"]
            assert re.search(r"\{\w+\}", message["content"]) is None  # no unfilled placeholder


@needs_data
def test_load_task_limit_and_errors(tmp_path):
    assert len(load_task(DATA_DIR, "waiting_line/copy", limit=7).samples) == 7
    assert load_task(DATA_DIR, "waiting_line/copy", limit=0).samples == []
    with pytest.raises(KeyError) as err:
        load_task(DATA_DIR, "waiting_line/nope")
    assert "waiting_line/nope" in str(err.value)
    assert "waiting_line/copy" in str(err.value)  # lists the valid names
    # the config's name for the sudoku file is not a valid task name
    with pytest.raises(KeyError):
        load_task(DATA_DIR, "puzzle/sudoku_4x4_4")
    with pytest.raises(FileNotFoundError, match="not found"):
        load_task(tmp_path / "missing", "waiting_line/copy")
    with pytest.raises(FileNotFoundError):
        list_tasks(tmp_path / "missing")
    assert list_tasks(tmp_path) == []


def test_config_key_without_jsonl_is_not_listed(tmp_path):
    group = tmp_path / "waiting_line"
    group.mkdir()
    (group / "task_config.yaml").write_text(
        "waiting_line/copy:\n  prompt: 'Copy {context}'\n  metric: list_match_score\n"
        "waiting_line/reverse:\n  prompt: 'Reverse {context}'\n  metric: list_match_score\n"
    )
    (group / "copy.jsonl").write_text('{"input": {"context": "[\\"A\\"]"}, "answer": "[\\"A\\"]"}\n\n')
    assert list_tasks(tmp_path) == ["waiting_line/copy"]
    task = load_task(tmp_path, "waiting_line/copy")
    assert task.samples == [{"input": {"context": '["A"]'}, "answer": '["A"]'}]
    assert build_messages(task.config, task.samples[0]) == [{"role": "user", "content": 'Copy ["A"]'}]


@needs_data
def test_build_messages_waiting_line_copy_exact_text():
    task = load_task(DATA_DIR, "waiting_line/copy", limit=1)
    messages = build_messages(task.config, task.samples[0])
    head = "You are managing a waiting line at a customer service desk.\n"
    ask = "You need to record the following people in the order they arrived:\n"
    tail = "\nPlease copy the list exactly and provide only the final list.\n"
    example = '["Michelle Edwards", "Anna Diaz", "Sarah Griffin", "Kevin Porter", "Keith Wilson"]'
    question = '["Billy Ramos", "Alan Wells", "Grace Wright"]'
    assert messages == [
        {"role": "user", "content": head + ask + example + tail},
        {"role": "assistant", "content": example},
        {"role": "user", "content": head + ask + question + tail},
    ]
    assert task.messages(0) == messages


@needs_data
def test_build_messages_uses_the_example_text_of_dict_answers():
    task = load_task(DATA_DIR, "waiting_line/insert_random", limit=1)
    messages = build_messages(task.config, task.samples[0])
    assert messages[1] == {
        "role": "assistant",
        "content": '["Bruce Bryant", "Michelle Mills", "Sarah Johnston", "Christopher Hall", "George Robertson"]',
    }
    assert messages[0]["content"] == (
        "You are managing a waiting line at a customer service desk.\n"
        'A new person "Sarah Johnston" is inserted into the line at a random position:\n'
        '["Bruce Bryant", "Michelle Mills", "Christopher Hall", "George Robertson"]\n'
        "Please put the new person in the random position and provide only the final list.\n"
    )
    assert messages[2]["content"].startswith(
        "You are managing a waiting line at a customer service desk.\n"
        'A new person "Justin McDonald" is inserted into the line at a random position:\n'
        '["Johnny Sullivan", "Ryan Baker", "Juan Wilson"]\n'
    )


@needs_data
def test_build_messages_index_prompt():
    task = load_task(DATA_DIR, "waiting_line/remove_index", limit=1)
    messages = build_messages(task.config, task.samples[0])
    assert "The person at position 2 has left the waiting line:\n" in messages[0]["content"]
    assert messages[1]["content"] == '["George Tucker", "Richard Castro", "Joseph Russell", "Matthew Gray"]'
    assert messages[2]["content"].endswith(
        '["Sarah Robertson", "Maria Mitchell", "Donald Hughes"]\n'
        "Please remove the person at the specified position and provide only the final list.\n"
    )


@needs_data
def test_build_messages_sudoku_turns_literal_backslash_n_into_newlines():
    task = load_task(DATA_DIR, "puzzle/sudoku_n4_12", limit=1)
    assert "\\n" in task.config["prompt"]  # stored with literal escapes
    messages = build_messages(task.config, task.samples[0])
    rules = (
        "Fill the positions where the values are 0 in a 4x4 grid with digits 1-4 so that each column, "
        "each row, and each of the four 2x2 subgrids that compose the grid contains all of the digits "
        "from 1 to 4."
    )
    assert messages == [
        {"role": "user", "content": rules + "\n\nInput:\n1342\n4003\n2104\n3420\nOutput:\n"},
        {"role": "assistant", "content": "1342\n4213\n2134\n3421"},
        {"role": "user", "content": rules + "\n\nInput:\n0042\n2031\n4023\n3214\nOutput:\n"},
    ]


@needs_data
def test_build_messages_latin_square_and_words_to_sentence():
    task = load_task(DATA_DIR, "puzzle/latin_square_n4", limit=1)
    messages = build_messages(task.config, task.samples[0])
    assert messages == [
        {
            "role": "user",
            "content": "Generate a Latin square of size 4 with the symbols [A, K, B, 7]. "
            "Only output the final result as CSV.",
        },
        {"role": "assistant", "content": "7,K,B,A\nB,A,K,7\nK,7,A,B\nA,B,7,K"},
        {
            "role": "user",
            "content": "Generate a Latin square of size 4 with the symbols [H, 4, C, A]. "
            "Only output the final result as CSV.",
        },
    ]
    task = load_task(DATA_DIR, "words_to_sentence/easy", limit=1)
    assert build_messages(task.config, task.samples[0]) == [
        {
            "role": "user",
            "content": "Construct a single, coherent sentence using the words dog, park, ball, and throw.",
        }
    ]


def test_answer_text():
    assert answer_text('["A"]') == '["A"]'
    assert answer_text({"input": ["A"], "example": '["A"]'}) == '["A"]'
    with pytest.raises(ValueError):
        answer_text({"words": ["dog"]})


def test_kinds_budgets_and_determinism():
    for op in WAITING_LINE:
        name = f"waiting_line/{op}"
        assert task_kind(name) == "waiting_line"
        assert max_new_tokens(name) == 32
    assert task_kind("puzzle/latin_square_n4") == "puzzle"
    assert task_kind("puzzles/sudoku_n4_12") == "puzzle"
    assert task_kind("words_to_sentence/hard_n5") == "text"
    assert task_kind("paraphrase_summarize/samsum") == "text"
    assert task_kind("waiting_line_n15/copy") == "waiting_line"
    assert max_new_tokens("puzzle/sudoku_n4_12") == 64
    assert max_new_tokens("puzzle/latin_square_n4") == 64
    assert max_new_tokens("words_to_sentence/easy") == 64
    assert max_new_tokens({"name": "puzzle/sudoku_4x4_4", "metric": "sudoku_score"}) == 64
    assert max_new_tokens({"name": "waiting_line/copy"}) == 32
    with pytest.raises(ValueError):
        task_kind("mystery/task")

    deterministic = {"copy", "reverse", "sort", "insert_index", "remove_index", "replace_index"}
    for op in WAITING_LINE:
        assert is_deterministic(f"waiting_line/{op}") is (op in deterministic)
    assert is_deterministic("puzzle/sudoku_n4_12") is True
    assert is_deterministic("puzzle/latin_square_n4") is False
    assert is_deterministic("words_to_sentence/easy") is False


def test_metric_names():
    assert metric_name("waiting_line/copy") == "list_match_score"
    assert metric_name("waiting_line/replace_index") == "list_match_score"
    assert metric_name("waiting_line/shuffle") == "list_shuffle_score"
    assert metric_name("waiting_line/insert_random") == "list_random_insert_score"
    assert metric_name("waiting_line/remove_random") == "list_random_remove_score"
    assert metric_name("waiting_line/replace_random") == "list_random_replace_score"
    assert metric_name("puzzle/latin_square_n4") == "latin_square_score"
    assert metric_name("puzzle/sudoku_n4_12") == "sudoku_score"
    assert metric_name("words_to_sentence/medium_n3") == "sentence_to_words_score"
    assert metric_name({"name": "x/y", "metric": "sudoku_score"}) == "sudoku_score"
