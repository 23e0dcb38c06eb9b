import json

import pandas as pd
import pytest

from uph.errors import CorpusError
from uph.lm.data.corpus import load_shakespeare_roles, parse_play, read_corpus_file, tokenize_users
from uph.lm.data.models import byte_tokenizer
from uph.splits import temporal_split

PLAY = """HAMLET, PRINCE OF DENMARK

PERSONS REPRESENTED.

Hamlet, Son to the former King.
Horatio, Friend to Hamlet.
Rosencrantz, Courtier.
Guildenstern, Courtier.

SCENE. Elsinore.

ACT I.

Scene I. Elsinore. A platform.

[Enter Hamlet and Horatio.]

Ham.
Who's there? [Aside.] Speak!

Hor.
Friends to this ground.
[Exit.]

Hamlet.
Good night,
sweet friend.

Ros. and Guil.
My lord!
"""


def test_parse_play_attributes_roles_and_drops_stage_directions():
    speeches = parse_play(PLAY)
    assert list(speeches["role"]) == ["Hamlet", "Horatio", "Hamlet"]  # 'Ham.' and 'Hamlet.' are one role
    assert list(speeches["text"]) == ["Who's there? Speak!", "Friends to this ground.", "Good night,\nsweet friend."]
    assert not speeches["text"].str.contains(r"\[|Courtier|Elsinore").any()  # no directions, persons, headers


def test_real_play_roles():
    roles = load_shakespeare_roles(["hamlet", "lear"]).set_index("user_id")
    assert {"hamlet/Hamlet", "hamlet/Horatio", "lear/Lear", "lear/Edmund", "lear/Cor", "lear/Cornwall"} <= set(
        roles.index
    )
    hamlet = roles.loc["hamlet/Hamlet", "text"]
    assert hamlet.startswith("A little more than kin, and less than kind!")
    assert "To be, or not to be" in hamlet and "[" not in hamlet
    assert "Claudius, King of Denmark" not in "".join(roles["text"])  # persons list is not speech
    assert len(roles.loc["hamlet/Hamlet", "text"]) > 3 * len(roles.loc["hamlet/Horatio", "text"])


def test_unknown_play_is_named():
    with pytest.raises(CorpusError, match="corpus.plays.*'hamlett'"):
        load_shakespeare_roles(["hamlett"])


def test_temporal_split_keeps_a_gap():
    split = temporal_split(1000, 0.8, gap=64)
    assert (split.train_end, split.test_start, split.n_tokens) == (800, 864, 1000)


def test_tokenize_users_filters_and_keeps_largest():
    texts = pd.DataFrame({"user_id": ["a", "b", "c"], "text": ["x" * 500, "y" * 50, "z" * 900]})
    users = tokenize_users(texts, byte_tokenizer(), min_tokens=100, max_users=1, train_fraction=0.5, gap=10)
    assert list(users["user_id"]) == ["c"]
    row = users.iloc[0]
    assert (row.n_tokens, row.train_end, row.test_start) == (900, 450, 460)
    with pytest.raises(CorpusError, match="corpus.min_tokens=1000 .*largest has 900"):
        tokenize_users(texts, byte_tokenizer(), 1000, 1, 0.5, 10)
    capped = tokenize_users(texts, byte_tokenizer(), 100, 2, 0.5, 10, max_tokens=200)
    assert list(capped["user_id"]) == ["a", "c"]  # the largest users, then cut to their first 200 tokens
    assert list(capped["n_tokens_total"]) == [500, 900] and list(capped["n_tokens"]) == [200, 200]
    assert capped["tokens"][1] == byte_tokenizer()("z" * 200)["input_ids"]


def test_corpus_files(tmp_path):
    rows = [
        {"user_id": "u1", "text": "second", "order": 2},
        {"user_id": "u1", "text": "first", "order": 1},
        {"user_id": "u2", "text": "only"},
    ]
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows))
    df = read_corpus_file(jsonl).set_index("user_id")
    assert df.loc["u1", "text"] == "first\nsecond"
    pd.DataFrame(rows).drop(columns="user_id").to_parquet(tmp_path / "no_user.parquet")
    with pytest.raises(CorpusError, match="no 'user_id' column"):
        read_corpus_file(tmp_path / "no_user.parquet")
    with pytest.raises(CorpusError, match="'.*missing.jsonl' does not exist"):
        read_corpus_file(tmp_path / "missing.jsonl")
    (tmp_path / "bad.jsonl").write_bytes(b'{"user_id": "u", "text": "\xff\xfe"}\n')
    with pytest.raises(CorpusError, match="bad.jsonl' is not UTF-8"):
        read_corpus_file(tmp_path / "bad.jsonl")
    (tmp_path / "broken.jsonl").write_text('{"user_id": "u", "text": \n')
    with pytest.raises(CorpusError, match="broken.jsonl' cannot be read"):
        read_corpus_file(tmp_path / "broken.jsonl")


def _jsonl(tmp_path, *lines) -> str:
    path = tmp_path / "users.jsonl"
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


@pytest.mark.parametrize(
    "lines, message",
    [
        (
            ['{"user_id": "a", "text": "x"}', "[1, 2]"],
            'line 2 is a JSON list, not an object; write one object per line: {"user_id": ..., "text": ...}',
        ),
        (
            ['{"user_id": 1, "text": "x"}', '{"user_id": "1", "text": "y"}'],
            "user ids 1 (row 1) and '1' (row 2) are both '1'; write every user_id as a string",
        ),
        (
            ['{"user_id": "a", "text": "x", "order": "10"}', '{"user_id": "a", "text": "y", "order": "ten"}'],
            "row 2: order 'ten' is not a number; rows of a user are sorted by it",
        ),
    ],
    ids=["line-not-an-object", "ids-1-and-string-1", "order-not-a-number"],
)
def test_corpus_rows_that_cannot_be_read_as_meant_are_refused_naming_the_line_or_rows(tmp_path, lines, message):
    path = _jsonl(tmp_path, *lines)
    with pytest.raises(CorpusError) as error:
        read_corpus_file(path)
    assert str(error.value) in (f"corpus file '{path}' {message}", f"corpus file '{path}': {message}")


def test_order_and_timestamps_written_as_text_sort_as_numbers_and_dates(tmp_path):
    path = _jsonl(
        tmp_path,
        '{"user_id": "a", "text": "ten", "order": "10"}',
        '{"user_id": "a", "text": "nine", "order": 9}',
        '{"user_id": "a", "text": "two", "order": "2"}',
    )
    assert read_corpus_file(path)["text"].tolist() == ["two\nnine\nten"]  # as text, "10" < "2" < 9 would not sort
    path = _jsonl(
        tmp_path,
        '{"user_id": "a", "text": "late", "timestamp": "2024-02-01T00:00:00Z"}',
        '{"user_id": "a", "text": "early", "timestamp": "2024-01-05T10:00:00+00:00"}',
    )
    assert read_corpus_file(path)["text"].tolist() == ["early\nlate"]


def test_lone_surrogates_are_replaced_with_a_warning_naming_the_line(tmp_path, caplog):
    """JSON's \\ud800 with no partner is valid JSON but no Unicode text (UTF-8, parquet and the tokenizer
    refuse it): it becomes U+FFFD, with a warning naming the file, line and field; a pair is one character."""
    path = _jsonl(
        tmp_path,
        '{"user_id": "a", "text": "pair \\ud83d\\ude00 ok"}',
        '{"user_id": "b\\udfff", "text": "lone \\ud800 here"}',
    )
    with caplog.at_level("WARNING"):
        corpus = read_corpus_file(path)
    assert corpus["text"].tolist() == ["pair \U0001f600 ok", "lone \ufffd here"]
    assert corpus["user_id"].tolist() == ["a", "b\ufffd"]
    assert [record.getMessage() for record in caplog.records] == [
        f"corpus file '{path}' line 2: {key} holds a lone UTF-16 surrogate (\\ud800 to \\udfff), not text; "
        "replaced with U+FFFD"
        for key in ("user_id", "text")
    ]
    corpus.to_parquet(tmp_path / "users.parquet")  # now UTF-8 text
