"""Bad data files get one line naming the file, line and column (issue 17); null never becomes "None"."""

import json

import pytest

from rlx.data.tasks import file_rows
from rlx.errors import UserError

COLUMNS = {"prompt": "prompt", "answer": "answer"}


def _rows(n):
    return "".join(json.dumps({"prompt": f"{i} + 1 =", "answer": str(i + 1)}) + "\n" for i in range(n))


@pytest.mark.parametrize("content,needle", [
    (b"", "holds no rows"),
    (b"\n\n", "holds no rows"),
    (_rows(3).encode() + b'{"prompt": "caf\xe9", "answer": "1"}\n', "data.jsonl:4:16: byte 0xe9 is not UTF-8"),
    (_rows(2).encode() + b"[1, 2]\n", "data.jsonl:3:1: a JSON list, not an object"),
    (_rows(2).encode() + b'{"prompt": "x", "answer": }\n', "data.jsonl:3:"),
    (_rows(2).encode() + b'\n{"prompt": null, "answer": "1"}\n', "data.jsonl:4: column 'prompt' is null"),
    (_rows(2).encode() + b'{"prompt": "x", "answer": null}\n', "data.jsonl:3: column 'answer' is null"),
    (_rows(3).encode(), "3 distinct prompts cannot give data.eval_size=5"),
])
def test_bad_data_file_is_one_line_naming_file_line_and_column(tmp_path, content, needle):
    path = tmp_path / "data.jsonl"
    path.write_bytes(content)
    with pytest.raises(UserError) as info:
        file_rows(str(path), None, 5, COLUMNS, 0)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_good_file_still_loads(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text(_rows(10))
    train, held_out = file_rows(str(path), None, 3, COLUMNS, 0)
    assert len(train) == 7 and len(held_out) == 3 and all(r["answer"] != "None" for r in train)


@pytest.mark.parametrize("reader", ["training", "preferences", "benchmark"])
def test_one_reader_gives_training_pairs_and_benchmarks_the_same_errors(tmp_path, reader):
    """Training data, preference pairs and benchmark files go through rlx/data/readers.py (issue 15)."""
    from rlx.data.preferences import read_table
    from rlx.evaluation.benchmarks import _read_records

    read = {"training": lambda p: file_rows(p, None, 1, COLUMNS, 0), "preferences": read_table,
            "benchmark": lambda p: _read_records(p, "get it")}[reader]
    path = tmp_path / "data.jsonl"
    path.write_bytes(_rows(3).encode() + b'{"prompt": "caf\xe9", "answer": "1"}\n')
    with pytest.raises(UserError, match="data.jsonl:4:16: byte 0xe9 is not UTF-8"):
        read(str(path))
    path.write_bytes(_rows(2).encode() + b"[1, 2]\n")
    with pytest.raises(UserError, match="data.jsonl:3:1: a JSON list, not an object"):
        read(str(path))


def test_json_lists_and_gzipped_jsonl_are_read(tmp_path):
    import gzip

    from rlx.data.readers import read_records

    rows = [{"prompt": f"{i} + 1 =", "answer": str(i + 1)} for i in range(3)]
    (tmp_path / "a.json").write_text(json.dumps(rows))
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(_rows(3).encode()))
    assert [r for _, r in read_records(str(tmp_path / "a.json"), "x")] == rows
    assert [r for _, r in read_records(str(tmp_path / "b.jsonl.gz"), "x")] == rows
    (tmp_path / "c.json").write_text("[1]")
    with pytest.raises(UserError, match="item 0 is a JSON int"):
        read_records(str(tmp_path / "c.json"), "x")


def test_windows_files_and_raw_unicode_line_separators_are_read(tmp_path):
    """A byte-order mark, CRLF line ends, and characters that str.splitlines() treats as line breaks but JSON strings
    may hold raw (U+2028, U+0085, \x1c): the rows arrive whole."""
    from rlx.data.readers import read_records

    rows = [{"prompt": "a\u2028b", "answer": "1"}, {"prompt": "c\x85d\x1ce", "answer": "2"}]
    text = "".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in rows)
    (tmp_path / "win.jsonl").write_bytes(b"\xef\xbb\xbf" + text.encode())
    (tmp_path / "win.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(rows, ensure_ascii=False).encode())
    assert [r for _, r in read_records(str(tmp_path / "win.jsonl"), "x")] == rows
    assert [r for _, r in read_records(str(tmp_path / "win.json"), "x")] == rows
    assert [where for where, _ in read_records(str(tmp_path / "win.jsonl"), "x")][1].endswith("win.jsonl:2")
