"""The tokenizer's parsed ranks come from a per-user cache that counts exactly as tiktoken does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.models import modelmap, tokenizer

TEXT = "def f(x):\n    return x ** 2  # ünïcödé ✓ 😀\n\t\n" + "lorem ipsum " * 50 + "<|endoftext|> 12345678"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(tokenizer.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _folder() -> Path | None:
    folder = modelmap._litellm_file(modelmap._TOKENIZERS)
    if folder is not None:
        os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)
    return folder


def _constructions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from tiktoken_ext import openai_public

    made: list[str] = []
    real = openai_public.ENCODING_CONSTRUCTORS[tokenizer.ENCODING]

    def counted() -> dict[str, object]:
        made.append(tokenizer.ENCODING)
        kwargs: dict[str, object] = real()
        return kwargs

    monkeypatch.setitem(openai_public.ENCODING_CONSTRUCTORS, tokenizer.ENCODING, counted)
    return made


def test_the_cached_encoding_counts_as_tiktoken_and_is_made_once(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tiktoken

    folder = _folder()
    made = _constructions(monkeypatch)
    first = tokenizer.encoding(folder)
    second = tokenizer.encoding(folder)
    assert made == [tokenizer.ENCODING]  # the second came from the cache
    reference = tiktoken.get_encoding(tokenizer.ENCODING)
    for enc in (first, second):
        assert enc.encode(TEXT, disallowed_special=()) == reference.encode(TEXT, disallowed_special=())
        assert enc.n_vocab == reference.n_vocab and enc.special_tokens_set == reference.special_tokens_set
    assert len(list((cache / "tiktoken").iterdir())) == 1


def test_a_damaged_cache_file_is_made_again(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _folder()
    tokenizer.encoding(folder)
    (path,) = (cache / "tiktoken").iterdir()
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    made = _constructions(monkeypatch)
    assert tokenizer.encoding(folder).encode("hello world") == [15339, 1917]
    assert made == [tokenizer.ENCODING] and path.read_bytes() != bytes(raw)  # rebuilt and rewritten


def test_an_unwritable_cache_is_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv(tokenizer.CACHE_ENV, str(blocker / "cache"))
    assert tokenizer.encoding(_folder()).encode("hello world") == [15339, 1917]


def test_the_cache_dir_follows_the_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(tokenizer.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tokenizer.cache_dir() == tmp_path / "xdg" / "lunasol"
    monkeypatch.setenv(tokenizer.CACHE_ENV, str(tmp_path / "mine"))
    assert tokenizer.cache_dir() == tmp_path / "mine"
