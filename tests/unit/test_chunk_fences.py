"""A code block longer than one chunk: every piece renders as code, and what follows the block as prose."""

from __future__ import annotations

import re

import marko
import pytest

from rag_worker.ingest.chunk import Chunker, balance_fences
from rag_worker.ingest.convert import Converter

CODE = [f"def f{i}(x):\n    return x * {i} + compute_something_long(x, {i})" for i in range(60)]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from rag_worker.settings import packaged_embedding_model

    return AutoTokenizer.from_pretrained(packaged_embedding_model(), local_files_only=True)


def code_and_prose(markdown: str) -> tuple[str, str]:
    """(text inside code blocks, text outside them) of the HTML a Markdown renderer makes of `markdown`."""
    html = marko.convert(markdown)
    code = "".join(re.findall(r"<pre><code[^>]*>(.*?)</code></pre>", html, flags=re.S))
    prose = re.sub(r"<pre><code[^>]*>.*?</code></pre>", "", html, flags=re.S)
    return code, prose


def test_every_piece_of_a_split_code_block_renders_as_code(tokenizer, tmp_path):
    source = tmp_path / "guide.md"
    source.write_text(
        "# Guide\n\nIntro text here.\n\n```python\n" + "\n".join(CODE) + "\n```\n\nAfter the code.\n",
        encoding="utf-8",
    )
    chunks = Chunker(tokenizer, 256).chunk(Converter().convert(source).document)
    assert len(chunks) >= 3  # the block really was split
    rendered = [code_and_prose(c.text) for c in chunks]
    for chunk, (_, prose) in zip(chunks, rendered, strict=True):
        # no code line is read as prose, and no chunk leaves a block open for whatever is shown after it
        assert "compute_something_long" not in prose, chunk.text
        assert balance_fences(chunk.text, None)[1] is None
    everything = "".join(code for code, _ in rendered)
    for line in "\n".join(CODE).splitlines():
        assert line in everything.splitlines()  # every line, its indentation included, inside a code block
    assert "After the code." in rendered[-1][1] and "After the code." not in everything
    assert "Intro text here." in rendered[0][1]


def test_a_block_reopens_with_its_fence_and_info_string():
    text, state = balance_fences("intro\n````python\nx = 1\n```\nstill code", None)
    assert state == "````python"  # a shorter run inside a longer fence does not close it
    assert text.endswith("still code\n````")
    text, state = balance_fences("y = 2\n````\nprose again", state)
    assert text.startswith("````python\ny = 2") and state is None
    assert balance_fences("~~~\ncode", None) == ("~~~\ncode\n~~~", "~~~")


def test_lines_that_only_look_like_fences_change_nothing():
    plain = "a ```js`` inline run\n```not`a fence\n    ```indented four spaces is code, not a fence"
    assert balance_fences(plain, None) == (plain, None)
